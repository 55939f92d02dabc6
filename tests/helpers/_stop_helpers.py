"""Stop a ``posttrain`` command that is blocked in a hanging tool or reward, and time it (issue 55 item 4).

:func:`start` runs one of :data:`CASES` as a subprocess in its own session (so a SIGINT to its process
group is what Ctrl-C at a terminal sends) and returns once the hang is entered (the marker file of
``_hang_helpers``); :func:`stop` sends the signal and measures the time to exit, and which of the
processes it had started are still alive afterwards. Used by tests/cli/test_cli_stop.py; run as a
script, it prints the table of docs/troubleshooting.md::

    python tests/helpers/_stop_helpers.py [--repeat 3] [case ...]
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HELPERS = Path(__file__).resolve().parent
TOOL_CFG = str(ROOT / "src" / "posttrain" / "configs" / "tool-calling.yaml")
HANG_REWARD = "reward.name=_hang_helpers:HangingReward"
RL_SMALL = [
    "model.name=tiny",
    "rollout.group_size=2",
    "rollout.prompts_per_step=2",
    "eval.at_start=false",
    "eval.at_end=false",
    "checkpoint.every=1",
    "threads=1",
    "steps=5",
    "--no-progress",
]
ARITH = 'task.params={digits: 1, ops: "+", n_train: 40, n_heldout: 10}'
ARITH_JSON = '{"digits": 1, "ops": "+", "n_train": 40, "n_heldout": 10}'

TOOL_RL = [
    "rl",
    "--config",
    TOOL_CFG,
    *RL_SMALL,
    "rollout.max_new_tokens=120",
    "micro_batch_size=4",
    "rollout.engine.name=_hang_helpers:calls_hang",
    "rollout.runner.params.tools=[_hang_helpers:hang]",
    "rollout.runner.params.tool_timeout_s=600",
    "out_dir={run}",
]
REWARD_RL = ["rl", *RL_SMALL, ARITH, "rollout.max_new_tokens=3", HANG_REWARD, "out_dir={run}"]
REWARD_POOL = ["reward.num_workers=1", "reward.timeout_s=600"]
SILO = ["silo", "run", "--agent", "openai", "--base-url", "http://127.0.0.1:{port}/v1", "--model", "m"]
EVAL = [
    "eval",
    "--model",
    "tiny",
    "--task",
    "arithmetic",
    "--task-params",
    ARITH_JSON,
    "--n",
    "4",
    "threads=1",
]

#: case -> (the command's arguments after ``posttrain``, with ``{run}`` for the run folder; whether the
#: hang waits for the first checkpoint so there is a run to resume).
CASES: dict[str, tuple[list[str], bool]] = {
    "tool": (TOOL_RL, True),
    "reward-pool": ([*REWARD_RL, *REWARD_POOL], True),
    "reward-inline": ([*REWARD_RL, "reward.num_workers=0"], True),
    "eval": ([*EVAL, "--max-new-tokens", "3", HANG_REWARD, *REWARD_POOL], False),
    "async-reward": ([*REWARD_RL, *REWARD_POOL, "rollout.max_staleness=1"], True),
    "async-tool": ([*TOOL_RL, "rollout.max_staleness=1"], True),
    # a SILO-BENCH sweep whose OpenAI-compatible server accepts the request and never answers
    "silo": (
        [
            *SILO,
            "--protocols",
            "p2p",
            "--agents",
            "2",
            "--tasks",
            "I-01",
            "--timeout",
            "600",
            "--out",
            "{run}",
        ],
        False,
    ),
}


def _silent_server(marker: Path) -> int:
    """A port that accepts HTTP connections and never answers; the first connection writes ``marker``."""
    import socket
    import threading

    srv = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def serve() -> None:
        while True:
            conn, _ = srv.accept()
            held.append(conn)
            marker.write_text("connected")

    threading.Thread(target=serve, daemon=True).start()
    return srv.getsockname()[1]


@dataclass
class Blocked:
    """A command blocked in its hang: the process, its folder, the processes it had started then."""

    case: str
    proc: subprocess.Popen[bytes]
    folder: Path
    descendants: list[Proc] = field(default_factory=list)

    @property
    def run(self) -> Path:
        return self.folder / "run"

    def stderr(self) -> str:
        return (self.folder / "stderr").read_text(errors="replace")

    def wait_blocked(self, timeout_s: float = 150.0) -> None:
        """Wait until the command is in its hang (the marker file), then note the processes it runs."""
        until = time.monotonic() + timeout_s
        while not (self.folder / "hanging").exists():
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"{self.case}: exited ({self.proc.returncode}) before it hung:\n{self.stderr()[-3000:]}"
                )
            if time.monotonic() > until:
                kill(self)
                raise AssertionError(
                    f"{self.case}: not blocked after {timeout_s:g} s:\n{self.stderr()[-3000:]}"
                )
            time.sleep(0.1)
        time.sleep(0.5)  # the other calls of the round reach their hang too
        self.descendants = descendants(self.proc.pid)


@dataclass
class Stopped:
    seconds: float
    returncode: int | None  # None: still running after the bound (then killed)
    stderr: str
    leftovers: list[str]  # processes it had started that are still alive


def start(case: str, folder: Path, *, wait: bool = True) -> Blocked:
    """Start ``case`` in ``folder``; with ``wait``, return once it is blocked in its hang."""
    args, after_checkpoint = CASES[case]
    folder.mkdir(parents=True, exist_ok=True)
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:  # a background job of a shell: the command
        signal.signal(signal.SIGINT, signal.default_int_handler)  # would inherit it and ignore Ctrl-C
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HELPERS), env.get("PYTHONPATH", "")) if p)
    env["POSTTRAIN_HANG_MARKER"] = str(folder / "hanging")
    env["POSTTRAIN_HANG_AFTER"] = str(folder / "run" / "checkpoints" / "latest") if after_checkpoint else ""
    cmd = [sys.executable, "-c", "from posttrain.cli import main; main()"]
    port = _silent_server(folder / "hanging") if any("{port}" in a for a in args) else 0
    cmd += [a.replace("{run}", str(folder / "run")).replace("{port}", str(port)) for a in args]
    with open(folder / "stdout", "wb") as out, open(folder / "stderr", "wb") as err:
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env, start_new_session=True
        )
    b = Blocked(case, proc, folder)
    if wait:
        b.wait_blocked()
    return b


def stop(b: Blocked, sig: int, *, bound_s: float = 60.0) -> Stopped:
    """Send ``sig`` (SIGINT to the process group, as Ctrl-C at a terminal; SIGTERM to the process, as
    ``kill`` and schedulers), return the time until it exited (killed at ``bound_s``)."""
    t0 = time.monotonic()
    if sig == signal.SIGINT:
        os.killpg(b.proc.pid, sig)
    else:
        os.kill(b.proc.pid, sig)
    try:
        rc: int | None = b.proc.wait(bound_s)
    except subprocess.TimeoutExpired:
        rc = None
    seconds = time.monotonic() - t0
    if rc is None:
        kill(b)
    return Stopped(seconds, rc, b.stderr(), _leftovers(b.descendants))


@dataclass(frozen=True)
class Proc:
    """A process by id and start time (so a reused id is not mistaken for it): read from /proc."""

    pid: int
    started: int

    def alive(self) -> bool:
        st = _stat(self.pid)
        return st is not None and st[2] == self.started and st[0] != "Z"

    def describe(self) -> str:
        try:
            cmd = Path(f"/proc/{self.pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            cmd = "?"
        return f"{self.pid} {cmd[:120]}"

    def kill(self) -> None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent id, start time) of ``pid``, or None when it is gone."""
    try:
        data = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    rest = data[data.rindex(")") + 2 :].split()
    return rest[0], int(rest[1]), int(rest[19])


def descendants(pid: int) -> list[Proc]:
    """Every live process below ``pid`` (children, their children, ...), whatever their session."""
    parent: dict[int, list[Proc]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit() and (st := _stat(int(d))) is not None and st[0] != "Z":
            parent.setdefault(st[1], []).append(Proc(int(d), st[2]))
    out, todo = [], [pid]
    while todo:
        for child in parent.get(todo.pop(), []):
            out.append(child)
            todo.append(child.pid)
    return out


def _leftovers(procs: list[Proc], grace_s: float = 5.0) -> list[str]:
    """Those of ``procs`` still alive after ``grace_s`` (a zombie is gone)."""
    until = time.monotonic() + grace_s
    while True:
        alive = [p.describe() for p in procs if p.alive()]
        if not alive or time.monotonic() > until:
            return alive
        time.sleep(0.1)


def kill(b: Blocked) -> None:
    """SIGKILL to the command and every process it started (a test that failed cleans up)."""
    procs = list(b.descendants)
    if b.proc.poll() is None:  # (once it is reaped its id may be another process's)
        procs += descendants(b.proc.pid)
        b.proc.kill()
    for p in procs:
        p.kill()
    b.proc.wait()


def main(argv: list[str]) -> None:
    import argparse
    import platform
    import tempfile

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cases", nargs="*", default=list(CASES))
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--signals", default="TERM,INT")
    a = ap.parse_args(argv)
    lines = Path("/proc/cpuinfo").read_text().splitlines()
    cpu = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), "")
    print(
        f"# {platform.node()}: {cpu or platform.processor()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        for case in a.cases:
            for name in a.signals.split(","):
                sig = getattr(signal, f"SIG{name}")
                times, codes, ok = [], set(), True
                for i in range(a.repeat):
                    b = start(case, Path(tmp) / f"{case}-{name}-{i}")
                    s = stop(b, sig)
                    kill(b)
                    times.append(s.seconds)
                    codes.add(s.returncode)
                    resumable = any(w in s.stderr for w in ("resume with: posttrain", "with --resume to run"))
                    resumable = resumable or case == "eval"
                    ok = ok and resumable and not s.leftovers and s.returncode not in (None, 0)
                print(
                    json.dumps(
                        {
                            "case": case,
                            "signal": f"SIG{name}",
                            "seconds": [round(t, 2) for t in times],
                            "exit": sorted(c for c in codes if c is not None) or None,
                            "clean": ok,
                        }
                    ),
                    flush=True,
                )


if __name__ == "__main__":
    main(sys.argv[1:])
