"""Multi-process RL training on CPU: ``torchrun`` (``python -m torch.distributed.run``) with gloo.

One-process references run in the test process itself (no torchrun), to keep the tests short.

* Two processes train on the same global batch as one process (the ``prompt-seeded`` engine of
  ``_launch.py`` samples a prompt's group identically on any rank): the weights agree within float
  tolerance and the logged metrics are the global batch's (sums, weighted means, pooled std), written
  once by rank 0.
* A two-process run killed (SIGKILL) right after its first checkpoint resumes with two processes to
  bitwise the weights and metrics of the uninterrupted run (every rank's sampling state is in the
  checkpoint), and with ONE process to the same weights within float tolerance (the checkpoint does
  not depend on the world size).
* Two-process SFT (each rank its block of every batch, the batch's global token count) gives the
  one-process weights and loss.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from posttrain.models import load_model_and_tokenizer

sys.path.insert(0, str(Path(__file__).parent))  # the helpers next to this file (_procs, _launch)
from _procs import COMPARED, assert_sft_runs_match, in_process, launch, max_diff, steps, weights

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore::posttrain.train.rl.DegenerateSettingWarning"),
]

STEPS = 2
COMMON = [f"steps={STEPS}", "checkpoint.every=1"]


@pytest.fixture(scope="module")
def two_procs(tmp_path_factory) -> Path:
    """An uninterrupted two-process run (shared by both tests)."""
    out = tmp_path_factory.mktemp("ddp") / "two"
    launch(2, out, *COMMON)
    return out


def test_two_processes_train_like_one_on_the_same_global_batch(two_procs, tmp_path):
    one = tmp_path / "one"
    in_process("rl", str(one), COMMON)
    w1, w2 = weights(one), weights(two_procs)
    model, _ = load_model_and_tokenizer("tiny", device="cpu", seed=0)  # the untrained weights
    assert max_diff(w1, {k: v.detach() for k, v in model.state_dict().items()}) > 1e-2
    assert max_diff(w1, w2) < 1e-5, max_diff(w1, w2)
    # rank 0 alone logged: one row per step, holding the GLOBAL batch's metrics
    m1, m2 = steps(one), steps(two_procs)
    assert [m["step"] for m in m2] == list(range(1, STEPS + 1))
    for a, b in zip(m1, m2, strict=True):
        assert b["num_sequences"] == 16 and b["num_groups"] == 4
        for k in COMPARED:
            assert b[k] == pytest.approx(a[k], rel=1e-4, abs=1e-6), (b["step"], k, a[k], b[k])
    assert any(m["reward_std"] > 0 for m in m1)  # the comparison covers a real gradient signal
    # checkpoints hold rank 1's sampling state next to rank 0's
    state = json.loads((two_procs / "checkpoints" / f"step_{STEPS:06d}" / "trainer_state.json").read_text())
    assert state["dist"]["world_size"] == 2 and set(state["dist"]["rng"]) == {"1"}


def test_killed_two_process_run_resumes(two_procs, tmp_path):
    killed = tmp_path / "killed"
    res = launch(2, killed, *COMMON, "--kill-after-save", "1", check=False)
    assert res.returncode != 0  # SIGKILLed, not a clean exit
    assert (killed / "checkpoints" / "latest").read_text().strip() == "step_000001"
    assert len(steps(killed)) == 1
    shrunk = tmp_path / "shrunk"
    shutil.copytree(killed, shrunk)

    launch(2, killed, *COMMON, "--resume")
    assert max_diff(weights(killed), weights(two_procs)) == 0.0  # bitwise: same world size
    strip = ("time_", "tokens_per_s")
    for a, b in zip(steps(killed), steps(two_procs), strict=True):
        assert {k: v for k, v in a.items() if not k.startswith(strip)} == {
            k: v for k, v in b.items() if not k.startswith(strip)
        }

    in_process("rl", str(shrunk), COMMON, resume=True)  # the same checkpoint, resumed by one process
    assert len(steps(shrunk)) == STEPS
    assert max_diff(weights(shrunk), weights(two_procs)) < 1e-5


def test_two_process_sft_trains_like_one(tmp_path):
    launch(2, tmp_path / "two", "--sft")
    in_process("sft", str(tmp_path / "one"))
    assert_sft_runs_match(tmp_path / "one", tmp_path / "two")
