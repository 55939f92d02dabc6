"""Stopping always works (issue 55 item 4): SIGTERM and the first Ctrl-C end a `posttrain rl` blocked in a
tool that hangs or a reward that hangs (in a reward worker or in-process), and a `posttrain eval` blocked
in a reward that hangs, within STOP_BOUND_S, with a non-zero exit, the resume line, no process left
behind and the run folder's lock released. Each command is a real subprocess on the tiny preset; the
tool and the reward hang only once the first checkpoint is written (tests/helpers/_hang_helpers.py), so
the resume line names it. SIGTERM goes to the process (as `kill`, Slurm and Kubernetes send it), SIGINT
to its process group (as Ctrl-C at a terminal)."""

from __future__ import annotations

import signal

import pytest
from _stop_helpers import kill, start, stop

from posttrain.train.run_dir import LOCK_NAME

pytestmark = pytest.mark.slow

#: The bar of issue 55 (measured: 1.5-3.5 s on 2 busy cores; docs/troubleshooting.md).
STOP_BOUND_S = 30.0


def _stopped(case: str, sigs: list[signal.Signals], tmp_path):
    """Start ``case`` once per signal (at the same time: the two start-ups overlap), wait until each
    is blocked, stop each with its signal; check the exit and that no process was left behind."""
    runs = []
    try:
        for sig in sigs:
            runs.append(start(case, tmp_path / f"{case}-{sig.name}", wait=False))
        for b in runs:
            b.wait_blocked()
        out = []
        for b, sig in zip(runs, sigs, strict=True):
            s = stop(b, sig, bound_s=STOP_BOUND_S)
            print(f"{case}: {sig.name} to exit {s.seconds:.2f} s (exit {s.returncode})")
            assert s.returncode is not None, (
                f"{case}: still running {STOP_BOUND_S:g} s after {sig.name}:\n{s.stderr}"
            )
            assert s.returncode == (143 if sig == signal.SIGTERM else 130), s.stderr
            assert not s.leftovers, f"{case}: processes left behind after {sig.name}: {s.leftovers}"
            out.append((b, s))
        return out
    finally:  # whatever failed: nothing of it outlives the test
        for b in runs:
            kill(b)


@pytest.mark.parametrize("case", ["tool", "reward-pool"])
def test_a_run_blocked_in_a_hang_stops_with_the_resume_line(case, tmp_path):
    """The tool hangs in its worker process (tool_timeout_s=600), the reward in its pool worker
    (reward.timeout_s=600); only the signal can end the run: SIGTERM, and Ctrl-C in a second run."""
    for b, s in _stopped(case, [signal.SIGTERM, signal.SIGINT], tmp_path):
        assert "interrupted at step 1 of 5" in s.stderr, s.stderr
        assert ("SIGTERM received: " in s.stderr) == (b.folder.name.endswith("SIGTERM"))
        assert f"last checkpoint: {b.run / 'checkpoints' / 'step_000001'} (step 1)" in s.stderr
        assert "resume with: posttrain rl" in s.stderr and "--resume" in s.stderr
        assert (b.run / "checkpoints" / "step_000001" / "trainer_state.json").is_file()
        assert not (b.run / LOCK_NAME).exists(), "the run folder's lock was not released"


def test_sigterm_ends_a_run_blocked_in_an_in_process_reward(tmp_path):
    """reward.num_workers=0 scores in the trainer's main thread: no worker to kill, the signal itself
    interrupts the reward."""
    [(b, s)] = _stopped("reward-inline", [signal.SIGTERM], tmp_path)
    assert "resume with: posttrain rl" in s.stderr, s.stderr
    assert not (b.run / LOCK_NAME).exists()


def test_sigterm_ends_an_eval_blocked_in_a_hanging_reward(tmp_path):
    """`posttrain eval` had no SIGTERM handler: it died at once and left its reward worker hanging."""
    [(_, s)] = _stopped("eval", [signal.SIGTERM], tmp_path)
    assert "SIGTERM received: evaluation interrupted" in s.stderr, s.stderr


def test_sigterm_re_raised_by_a_library_as_a_plain_keyboardinterrupt_still_reads_sigterm(
    tmp_path, monkeypatch
):
    """Ray's `ray.get` (an async run waiting on its generation workers) catches the `Terminated` the
    SIGTERM handler raises and raises a KeyboardInterrupt of its own: the run still says SIGTERM and
    exits 143, not 130 as for Ctrl-C."""
    import os
    import time

    from _train_helpers import CLI_TINY
    from typer.testing import CliRunner

    from posttrain.cli import app
    from posttrain.train.rl import RLTrainer

    def train(self, **kwargs):
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(30)
        except KeyboardInterrupt:
            raise KeyboardInterrupt from None

    monkeypatch.setattr(RLTrainer, "train", train)
    res = CliRunner().invoke(
        app, ["rl", *CLI_TINY, "steps=1", f"out_dir={tmp_path / 'run'}", "--no-progress"]
    )
    assert res.exit_code == 143, res.output
    assert "SIGTERM received: interrupted at step 0 of 1" in res.output
