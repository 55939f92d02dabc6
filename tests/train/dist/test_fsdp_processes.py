"""FSDP2 (``distributed.strategy=fsdp``: ``fully_shard`` per decoder layer + root) on CPU with gloo,
launched by ``torchrun`` (``python -m torch.distributed.run``); one-process references in this process.

* A two-process FSDP2 RL run, SIGKILLed right after its first checkpoint and resumed with two
  processes, trains like ONE process on the same global batch (``_launch.py``'s prompt-seeded engine):
  equal weights (float tolerance) after each step and equal global metrics. Gradient clipping is
  active at step 1 (grad norm ≈ 3.1 > 2), so the clip sees the global norm of the sharded gradients.
  Every rank holds about half of the parameters (they are sharded, not replicated).
* The FSDP2 checkpoint holds the same files as a one-process checkpoint (the same keys in
  ``model.safetensors``, ``optimizer.safetensors`` and ``optimizer.json``) and one process resumes it
  to the same weights (a checkpoint does not depend on the strategy or the world size).
* Two-process FSDP2 SFT gives the one-process weights, loss and grad norm.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).parent))  # the helpers next to this file (_procs, _launch)
from _procs import COMPARED, assert_sft_runs_match, in_process, launch, max_diff, steps

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore::posttrain.train.rl.DegenerateSettingWarning"),
]

STEPS = 2
# grad_clip 2: the step-1 gradient (norm ≈ 3.10) is clipped, the step-2 one (≈ 1.98) is not
# eval at the end: rank 0 alone generates, inside dist.full_params (no collective in the forwards)
COMMON = [
    f"steps={STEPS}",
    "checkpoint.every=1",
    "distributed.strategy=fsdp",
    "optimizer.grad_clip=2.0",
    "eval.at_end=true",
    "eval.n=6",
]


def ckpt(run: Path, step: int) -> Path:
    return run / "checkpoints" / f"step_{step:06d}"


def weights_at(run: Path, step: int):
    return load_file(str(ckpt(run, step) / "model" / "model.safetensors"))


def assert_sharded(out: Path, nproc: int = 2) -> None:
    parts = [json.loads(Path(f"{out}.rank{r}.json").read_text()) for r in range(nproc)]
    total = parts[0]["total"]
    assert sum(p["local"] for p in parts) == total  # every element held by exactly one rank
    assert all(p["local"] < 0.6 * total for p in parts), parts


def assert_metrics_match(one: list[dict], other: list[dict]) -> None:
    assert [m["step"] for m in other] == [m["step"] for m in one]
    for a, b in zip(one, other, strict=True):
        for k in COMPARED:
            assert b[k] == pytest.approx(a[k], rel=1e-4, abs=1e-6), (b["step"], k, a[k], b[k])


def evals(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [
        {k: v for k, v in r.items() if k != "wall_s" and "time" not in k and "per_s" not in k}
        for r in rows
        if r["kind"] == "eval"
    ]


def test_fsdp_killed_run_resumes_and_trains_like_one_process(tmp_path):
    one = tmp_path / "one"
    in_process("rl", str(one), COMMON)
    m1 = steps(one)
    assert m1[0]["grad_norm"] > 2.0 > m1[1]["grad_norm"]  # clipping active at step 1 only

    killed = tmp_path / "killed"
    res = launch(2, killed, *COMMON, "--kill-after-save", "1", "--report-shards", check=False)
    assert res.returncode != 0  # SIGKILLed, not a clean exit
    assert (killed / "checkpoints" / "latest").read_text().strip() == "step_000001"
    assert_sharded(killed)
    assert max_diff(weights_at(one, 1), weights_at(killed, 1)) < 1e-5
    assert_metrics_match(m1[:1], steps(killed))
    # the same files as one process: HF safetensors model, index-numbered optimizer state
    for name in ("optimizer.safetensors",):
        a, b = load_file(str(ckpt(one, 1) / name)), load_file(str(ckpt(killed, 1) / name))
        assert a.keys() == b.keys() and max_diff(a, b) < 1e-5
    groups = [json.loads((ckpt(r, 1) / "optimizer.json").read_text()) for r in (one, killed)]
    assert groups[0] == groups[1]
    shrunk = tmp_path / "shrunk"
    shutil.copytree(killed, shrunk)

    launch(2, killed, *COMMON, "--resume")  # FSDP2 loads the full checkpoint and shards it
    assert max_diff(weights_at(one, STEPS), weights_at(killed, STEPS)) < 1e-5
    assert_metrics_match(m1, steps(killed))
    assert len(evals(one)) == 1 and evals(killed) == evals(one)

    in_process("rl", str(shrunk), COMMON, resume=True)  # the FSDP2 checkpoint, resumed by one process
    assert max_diff(weights_at(one, STEPS), weights_at(shrunk, STEPS)) < 1e-5
    assert_metrics_match(m1, steps(shrunk))


def test_fsdp_sft_two_processes_train_like_one(tmp_path):
    launch(2, tmp_path / "two", "--sft", "--strategy", "fsdp", "--report-shards")
    assert_sharded(tmp_path / "two")
    in_process("sft", str(tmp_path / "one"))
    assert_sft_runs_match(tmp_path / "one", tmp_path / "two")
