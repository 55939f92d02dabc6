"""The lab's commands, added to the `posttrain` CLI through the ``posttrain.cli`` entry point (importing
this package registers them): `posttrain demo`, `posttrain rm`, `posttrain silo`, `posttrain cit`,
`posttrain analyze`, `posttrain scpg` and the `posttrain bench` benchmarks."""

from posttrain_lab.cli import analyze as _analyze  # noqa: F401
from posttrain_lab.cli import bench_ablation as _bench_ablation  # noqa: F401
from posttrain_lab.cli import bench_dpo as _bench_dpo  # noqa: F401
from posttrain_lab.cli import bench_generate as _bench_generate  # noqa: F401
from posttrain_lab.cli import bench_losses as _bench_losses  # noqa: F401
from posttrain_lab.cli import bench_preference as _bench_preference  # noqa: F401
from posttrain_lab.cli import bench_reward_pool as _bench_reward_pool  # noqa: F401
from posttrain_lab.cli import bench_rl as _bench_rl  # noqa: F401
from posttrain_lab.cli import cit as _cit  # noqa: F401
from posttrain_lab.cli import demo as _demo  # noqa: F401
from posttrain_lab.cli import demo_smol as _demo_smol  # noqa: F401
from posttrain_lab.cli import demo_tiny as _demo_tiny  # noqa: F401
from posttrain_lab.cli import demo_tools as _demo_tools  # noqa: F401
from posttrain_lab.cli import rm as _rm  # noqa: F401
from posttrain_lab.cli import scpg as _scpg  # noqa: F401
from posttrain_lab.cli import silo as _silo  # noqa: F401
