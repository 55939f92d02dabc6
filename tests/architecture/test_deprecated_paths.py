"""Old import paths (before the core / recipes / benchmarks / studies layout) work for one release,
warn, and give the very same module objects; old config paths still load."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from posttrain._compat import new_name

ROOT = Path(__file__).parents[2]

OLD_NEW = [
    ("posttrain.sampling.e3", "posttrain.recipes.e3.hooks"),
    ("posttrain.sampling.dapo", "posttrain.recipes.dapo.hooks"),
    ("posttrain.sampling.asrr", "posttrain.recipes.asrr.hooks"),
    ("posttrain.sampling.nexgrpo", "posttrain.recipes.nexgrpo.replay"),
    ("posttrain.sampling.aparl", "posttrain.recipes.aparl.sampler"),
    ("posttrain.sampling.hooks", "posttrain.hooks.base"),
    ("posttrain.envs.duca_demo", "posttrain.recipes.duca.demo"),
    ("posttrain.rm", "posttrain.recipes.patarm"),
    ("posttrain.rm.judge", "posttrain.recipes.patarm.judge"),
    ("posttrain.silo.engine", "posttrain.benchmarks.silo.engine"),
    ("posttrain.silo.agents.openai_client", "posttrain.clients.openai_chat"),
    ("posttrain.bench.rl_step", "posttrain.benchmarks.perf.rl_step"),
    ("posttrain.bench.ablation", "posttrain.benchmarks.ablation"),
    ("posttrain.cit.kpig", "posttrain.studies.cit.kpig"),
    ("posttrain.analysis.metrics", "posttrain.studies.analysis.metrics"),
    ("posttrain.scpg.trees", "posttrain.studies.scpg.trees"),
]


@pytest.mark.parametrize(("old", "new"), OLD_NEW)
def test_old_module_path_warns_and_is_the_new_module(old, new):
    assert new_name(old) == new
    code = (
        "import importlib, warnings\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always')\n"
        f"    old = importlib.import_module({old!r})\n"
        f"new = importlib.import_module({new!r})\n"
        "assert old is new, (old, new)\n"
        f"assert new.__spec__.name == {new!r}, new.__spec__.name\n"
        f"assert any(issubclass(x.category, DeprecationWarning) and {new!r} in str(x.message) for x in w), "
        "[str(x.message) for x in w]\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_old_sampling_package_reexports_everything():
    with pytest.warns(DeprecationWarning):
        sampling = importlib.import_module("posttrain.sampling")
    from posttrain.hooks import PromptSampler
    from posttrain.recipes.e3.hooks import E3Sampler

    assert sampling.E3Sampler is E3Sampler and sampling.PromptSampler is PromptSampler
    for name in sampling.__all__:
        assert hasattr(sampling, name), name


def test_old_from_import_of_a_moved_name_works():
    code = "from posttrain.sampling.dapo import DAPOSampler\nfrom posttrain.rm import judge\nprint('ok')"
    out = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", code], capture_output=True, text=True, cwd=ROOT
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_moved_eval_workflow_name_warns():
    from posttrain.tasks import dialogue_events
    from posttrain.train.event_eval import evaluate_event_detection

    with pytest.warns(DeprecationWarning, match="posttrain.train.event_eval"):
        assert dialogue_events.evaluate_event_detection is evaluate_event_detection


def test_old_config_path_loads_the_moved_file_with_a_warning():
    from posttrain.train.config import load_rl_config

    old = ROOT / "src" / "posttrain" / "configs" / "e3.yaml"
    new = ROOT / "src" / "posttrain" / "recipes" / "e3" / "e3.yaml"
    assert not old.exists() and new.exists()
    with pytest.warns(DeprecationWarning, match="recipes/e3/e3.yaml"):
        cfg = load_rl_config(old, [])
    assert cfg == load_rl_config(new, [])


def test_cli_rl_runs_with_an_old_config_path(tmp_path):
    """``posttrain rl --config src/posttrain/configs/dapo.yaml`` (moved to recipes/dapo/) still trains."""
    import warnings

    from typer.testing import CliRunner

    from posttrain.cli import app

    old = ROOT / "src" / "posttrain" / "configs" / "dapo.yaml"
    args = [
        "rl",
        "--config",
        str(old),
        "model.name=tiny",
        "model.device=cpu",
        'task.params={digits: 1, ops: "+", n_train: 8, n_heldout: 4}',
        "reward.num_workers=0",
        "rollout.prompts_per_step=2",
        "rollout.group_size=2",
        "rollout.max_new_tokens=3",
        "hooks.shaper.params.max_length=3",  # the overlong penalty follows the length limit
        "hooks.shaper.params.buffer=1",
        "hooks.sampler.params.max_rounds=1",
        "steps=1",
        "eval.at_start=false",
        "eval.at_end=false",
        "threads=1",
        f"out_dir={tmp_path / 'run'}",
        "--no-progress",
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = CliRunner().invoke(app, args, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert '"steps": 1' in res.output
