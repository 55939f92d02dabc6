"""Helpers of the multi-process tests: launch ``_launch.py`` under torchrun, read runs, run the
one-process references in the test process."""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[3]
LAUNCH = Path(__file__).with_name("_launch.py")
# metrics that must agree between one process and two (times and throughput are per-machine)
COMPARED = (
    "reward_mean",
    "reward_std",
    "accuracy",
    "zero_var_frac",
    "length_mean",
    "length_max",
    "num_sequences",
    "num_groups",
    "advantage_abs_mean",
    "pg_loss",
    "kl_loss",
    "entropy",
    "kl",
    "grad_norm",
    "rollout_logp_diff",
)


def _free_port() -> int:
    """A port that binds now, below Linux's ephemeral range (32768+), so that the outgoing connections
    of other processes cannot take it while torchrun starts."""
    rng = random.Random()
    for _ in range(100):
        port = rng.randrange(20000, 32000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 20000-32000")


def launch(nproc: int, out: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT / "lab")]), "OMP_NUM_THREADS": "1"}
    for _ in range(3):  # a port taken between the check and torchrun's bind: retry on another one
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nproc_per_node={nproc}",
            "--master_addr=127.0.0.1",
            f"--master_port={_free_port()}",
            str(LAUNCH),
            str(out),
            *args,
        ]
        res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
        if "address already in use" not in (res.stderr + res.stdout).lower():
            break
    if check and res.returncode != 0:
        raise AssertionError(f"torchrun exited {res.returncode}:\n{res.stdout[-3000:]}\n{res.stderr[-6000:]}")
    return res


def weights(run: Path) -> dict[str, torch.Tensor]:
    ckpt = run / "checkpoints" / (run / "checkpoints" / "latest").read_text().strip()
    return load_file(str(ckpt / "model" / "model.safetensors"))


def steps(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["kind"] == "step"]


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


def in_process(fn, *args, **kwargs) -> None:
    """Run a ``_launch`` function in this process (the one-process reference, without torchrun)."""
    sys.path.insert(0, str(LAUNCH.parent))
    try:
        import _launch

        getattr(_launch, fn)(*args, **kwargs)
    finally:
        sys.path.remove(str(LAUNCH.parent))


def assert_sft_runs_match(one: Path, two: Path) -> None:
    """A one-process and a two-process SFT run of the same global batches: same final weights, same
    per-step token counts, grad norms and (global-batch) losses, logged by rank 0 alone."""
    import pytest

    load = lambda run: load_file(str(run / "model" / "model.safetensors"))  # noqa: E731
    assert max_diff(load(one), load(two)) < 1e-5
    m1, m2 = steps(one), steps(two)
    assert len(m2) == 2  # rank 0 alone logged
    for a, b in zip(m1, m2, strict=True):
        assert b["tokens"] == a["tokens"] and b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-5)
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-6)  # the global batch's loss, summed over ranks
