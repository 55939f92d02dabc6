"""One run per folder (issue 30, item 1): two real `posttrain rl` processes on one out_dir, a lock left
by a killed process, re-entrancy in one process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _train_helpers import CLI_TINY

from posttrain.train.run_dir import LOCK_NAME, RunDirBusy, end_run, lock_run_dir, start_run

POSTTRAIN = str(Path(sys.executable).with_name("posttrain"))
QUICK = [*CLI_TINY, "eval.at_start=false", "eval.at_end=false", "--no-progress"]


def _rl(run: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    return subprocess.Popen(
        [POSTTRAIN, "rl", *QUICK, f"out_dir={run}", "threads=1", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _wait_for_lock(run: Path, proc: subprocess.Popen, timeout: float = 120.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lock = run / LOCK_NAME
        if lock.is_file() and "pid=" in lock.read_text():
            return int(lock.read_text().split("pid=")[1].split()[0])
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    raise AssertionError("the first run never took the lock")


@pytest.mark.skipif(not Path(POSTTRAIN).exists(), reason="the posttrain console script is not installed")
def test_two_real_runs_on_one_folder_second_is_refused_naming_the_holder(tmp_path):
    run = tmp_path / "race"
    first = _rl(run, "steps=4", "seed=1", "checkpoint.every=1", "--overwrite")
    holder = _wait_for_lock(run, first)
    assert holder == first.pid
    second = _rl(run, "steps=4", "seed=2", "checkpoint.every=1", "--overwrite")
    _, err2 = second.communicate(timeout=300)
    _, err1 = first.communicate(timeout=300)
    assert first.returncode == 0, err1
    assert second.returncode == 2, err2
    assert f"is in use by another run (PID {first.pid}" in err2
    assert "Traceback" not in err2
    # the folder is the first run's, untouched by the second
    steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines() if '"step"' in x]
    assert steps == [1, 2, 3, 4]
    assert "seed: 1" in (run / "config.yaml").read_text()
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_000004"
    assert not (run / LOCK_NAME).exists()  # released at exit


@pytest.mark.skipif(not Path(POSTTRAIN).exists(), reason="the posttrain console script is not installed")
def test_lock_of_a_killed_run_is_stale_and_taken_over(tmp_path):
    run = tmp_path / "killed"
    first = _rl(run, "steps=200")
    pid = _wait_for_lock(run, first)
    os.kill(pid, signal.SIGKILL)
    first.communicate(timeout=60)
    assert f"pid={pid}" in (run / LOCK_NAME).read_text()  # the file stays behind ...
    with lock_run_dir(run):  # ... but its lock died with the process
        assert f"pid={os.getpid()}" in (run / LOCK_NAME).read_text()


def test_lock_is_exclusive_across_processes_and_reentrant_within_one(tmp_path):
    run = tmp_path / "r"
    code = (
        "import sys, time; from posttrain.train.run_dir import lock_run_dir\n"
        f"l = lock_run_dir({str(run)!r}); print('held', flush=True); sys.stdin.readline()\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout.readline().strip() == "held"
        with pytest.raises(RunDirBusy, match=f"PID {child.pid}"):
            lock_run_dir(run)
        with pytest.raises(RunDirBusy):  # a trainer's start_run is refused the same way
            start_run(run, {"seed": 0}, step=0)
        assert not (run / "config.yaml").exists()
    finally:
        child.communicate("\n", timeout=30)
    outer = lock_run_dir(run)
    start_run(run, {"seed": 0}, step=0)  # re-entrant: the CLI holds it, the trainer takes it again
    end_run(run)
    assert (run / LOCK_NAME).exists()  # still held by the outer reference
    outer.release()
    assert not (run / LOCK_NAME).exists()


def test_a_folder_created_only_for_the_lock_is_removed_again(tmp_path):
    run = tmp_path / "new"
    with lock_run_dir(run):
        assert run.is_dir()
    assert not run.exists()


def test_demo_smol_takes_the_run_folder_lock(tmp_path):
    """`posttrain demo smol` holds its folder's lock like `posttrain demo` (it did not before
    2026-12-02): a second demo into a folder another live process holds is refused before any work."""
    from typer.testing import CliRunner

    from posttrain.cli import app

    run = tmp_path / "smol"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from posttrain.train.run_dir import lock_run_dir; "
            f"lock_run_dir({str(run)!r}); print('held', flush=True); time.sleep(120)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        r = CliRunner().invoke(app, ["demo", "smol", "--out", str(run), "--no-ifbench"])
        assert r.exit_code == 2, r.output
        assert f"PID {holder.pid}" in r.output and "Traceback" not in r.output
    finally:
        holder.kill()
        holder.wait()
