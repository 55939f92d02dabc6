"""RewardPool: ordering, timeouts, crashes, exceptions, async handles, in-process mode."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

# Worker processes unpickle reward objects by module path; pytest's importlib mode gives test
# modules names that child processes cannot import, so the scripted rewards live in a plain module
# on sys.path (the pool passes the parent's sys.path to its workers).
from _reward_pool_helpers import BadSetupReward, ScriptedReward
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.rewards import RewardPool, get_reward
from posttrain.tasks import Example

TIMEOUT = 0.5


def _ex(i: int) -> Example:
    return Example(id=str(i), prompt="p", answer="a")


def _batch(cmds: list[str]) -> tuple[list[str], list[Example]]:
    return cmds, [_ex(i) for i in range(len(cmds))]


@pytest.fixture(scope="module")
def pool():
    with RewardPool(ScriptedReward(), num_workers=2, timeout_s=TIMEOUT) as p:
        yield p


def test_order_preserved_across_workers(pool: RewardPool) -> None:
    cmds = [str(i) for i in range(300)]
    res = pool.score(*_batch(cmds))
    assert res.rewards == [float(i) for i in range(300)]
    assert (res.timeouts, res.errors) == (0, 0)
    assert res.statuses == ["ok"] * 300
    assert res.components is None


def test_exception_gives_zero_and_counts_error(pool: RewardPool) -> None:
    res = pool.score(*_batch(["1", "raise", "3", "nan", "exit"]))
    assert res.rewards == [1.0, 0.0, 3.0, 0.0, 0.0]
    assert (res.errors, res.timeouts) == (3, 0)
    assert res.statuses == ["ok", "error", "ok", "error", "error"]
    assert any("ValueError: scripted failure" in m for m in res.messages)
    assert any("not finite" in m for m in res.messages)


def test_timeout_kills_worker_and_pool_keeps_working(pool: RewardPool) -> None:
    restarts = pool.stats["restarts"]
    t0 = time.perf_counter()
    res = pool.score(*_batch(["1", "sleep", "3", "4"]))
    elapsed = time.perf_counter() - t0
    assert res.rewards == [1.0, 0.0, 3.0, 4.0]
    assert (res.timeouts, res.errors) == (1, 0)
    assert res.statuses[1] == "timeout"
    assert elapsed < 10 * TIMEOUT  # killed near the deadline, not after the 60 s sleep
    assert pool.stats["restarts"] == restarts + 1
    assert pool.score(*_batch(["7", "8"])).rewards == [7.0, 8.0]


@pytest.mark.parametrize("cmd", ["crash", "segv"])
def test_crashed_worker_counts_error_and_is_replaced(pool: RewardPool, cmd: str) -> None:
    cmds = [str(i) for i in range(40)]
    cmds[17] = cmd
    res = pool.score(*_batch(cmds))
    expected = [float(i) for i in range(40)]
    expected[17] = 0.0
    assert res.rewards == expected
    assert (res.errors, res.timeouts) == (1, 0)
    assert res.statuses[17] == "error"
    assert "exited with code" in res.messages[0]
    assert pool.score(*_batch(["5"])).rewards == [5.0]


def test_many_failures_in_one_batch(pool: RewardPool) -> None:
    cmds = [str(i) for i in range(60)]
    bad = {3: "sleep", 10: "crash", 11: "crash", 20: "raise", 41: "sleep", 59: "segv"}
    for i, c in bad.items():
        cmds[i] = c
    res = pool.score(*_batch(cmds))
    assert res.rewards == [0.0 if i in bad else float(i) for i in range(60)]
    assert res.timeouts == 2
    assert res.errors == 4


def test_submit_is_non_blocking_and_handles_resolve(pool: RewardPool) -> None:
    h_slow = pool.submit(*_batch(["sleep", "2"]))
    h_fast = pool.submit(*_batch(["3", "4"]))
    assert not h_slow.done()  # the sleeper needs TIMEOUT seconds
    assert h_fast.result(timeout=30).rewards == [3.0, 4.0]
    res = h_slow.result(timeout=30)
    assert res.rewards == [0.0, 2.0] and res.timeouts == 1
    assert h_slow.done()


def test_empty_batch_and_bad_arguments(pool: RewardPool) -> None:
    res = pool.score([], [])
    assert res.rewards == [] and res.errors == 0
    with pytest.raises(ValueError, match="2 completions but 1 examples"):
        pool.submit(["1", "2"], [_ex(0)])
    with pytest.raises(TypeError, match="completion 0 is int"):
        pool.submit([1], [_ex(0)])  # type: ignore[list-item]


@settings(max_examples=15, deadline=None)
@given(st.lists(st.integers(min_value=-1000, max_value=1000), max_size=70))
def test_pool_matches_in_process_scores(pool: RewardPool, values: list[int]) -> None:
    cmds = [str(v) for v in values]
    assert pool.score(*_batch(cmds)).rewards == [float(v) for v in values]


def test_in_process_mode_counts_errors_without_processes() -> None:
    with RewardPool(ScriptedReward(), num_workers=0) as p:
        res = p.score(*_batch(["1", "raise", "2"]))
    assert res.rewards == [1.0, 0.0, 2.0]
    assert res.errors == 1


def test_unpicklable_reward_is_rejected_at_construction() -> None:
    class Local(ScriptedReward):  # a local class cannot be pickled by reference
        pass

    with pytest.raises(TypeError, match="must be picklable"):
        RewardPool(Local(), num_workers=1)


def test_failing_setup_is_reported_at_construction() -> None:
    with pytest.raises(RuntimeError, match="cannot load verifier"):
        RewardPool(BadSetupReward(), num_workers=1, timeout_s=TIMEOUT)


def test_closed_pool_refuses_work() -> None:
    p = RewardPool(get_reward("exact_match"), num_workers=1, timeout_s=TIMEOUT)
    assert p.score(["46"], [Example("a", "12+34=", "46")]).rewards == [1.0]
    p.close()
    p.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        p.submit(["46"], [Example("a", "12+34=", "46")])


class _Unpicklable:
    def __reduce__(self):
        raise TypeError("this meta value cannot be pickled")


def test_unpicklable_example_fails_its_items_not_the_pool(pool: RewardPool) -> None:
    cmds = ["1", "2"]
    exs = [_ex(0), Example("bad", "p", "a", meta={"x": _Unpicklable()})]
    res = pool.score(cmds, exs)
    assert res.errors >= 1 and res.statuses[1] == "error"
    assert "could not send item" in res.messages[0]
    assert pool.score(*_batch(["3"])).rewards == [3.0]


def test_close_fails_pending_batches_instead_of_hanging() -> None:
    p = RewardPool(ScriptedReward(), num_workers=1, timeout_s=30.0)
    h = p.submit(*_batch(["sleep"]))
    time.sleep(0.2)
    t0 = time.perf_counter()
    p.close()
    assert time.perf_counter() - t0 < 15
    with pytest.raises(RuntimeError, match="pool closed"):
        h.result(timeout=5)


@pytest.mark.parametrize(
    ("task_name", "params"),
    [
        ("arithmetic", {"format": "plain"}),
        ("arithmetic", {"format": "scratchpad", "ops": "+-*", "digits": 3}),
        ("countdown", {}),
    ],
)
def test_end_to_end_task_default_reward_through_the_pool(task_name: str, params: dict) -> None:
    """The real call path: task -> reference completions -> default reward in worker processes."""
    from posttrain.tasks import get_task

    task = get_task(task_name, n_train=64, n_heldout=16, **params)
    exs = task.split("heldout") + task.split("train")
    good = [task.reference_completion(e, "long" if i % 2 else "short") for i, e in enumerate(exs)]
    bad = [g + "9" for g in good]  # corrupt the final answer / expression
    with RewardPool(get_reward(task.default_reward), num_workers=2, timeout_s=5.0) as p:
        h_good = p.submit(good, exs)
        h_bad = p.submit(bad, exs)
        r_good, r_bad = h_good.result(timeout=60), h_bad.result(timeout=60)
    assert r_good.rewards == [1.0] * len(exs)
    assert r_bad.rewards == [0.0] * len(exs)
    assert r_good.errors == r_good.timeouts == r_bad.errors == 0


def test_concurrent_batches_with_random_failures(pool: RewardPool) -> None:
    """Several batches in flight at once, sprinkled with hangs, crashes, segfaults and exceptions:
    every batch resolves, in order, with exactly the failures it contained."""
    import random

    rng = random.Random(1)
    kinds = [("crash", "error"), ("sleep", "timeout"), ("raise", "error"), ("segv", "error")]
    jobs = []
    for _ in range(6):
        cmds, statuses = [], []
        for i in range(rng.randint(0, 40)):
            r = rng.random()
            cmd, status = kinds[int(r * 100)] if r < 0.04 else (str(i), "ok")
            cmds.append(cmd)
            statuses.append(status)
        jobs.append((pool.submit(*_batch(cmds)), cmds, statuses))
    for handle, cmds, statuses in jobs:
        res = handle.result(timeout=120)
        assert res.statuses == statuses
        assert res.rewards == [float(c) if s == "ok" else 0.0 for c, s in zip(cmds, statuses, strict=True)]
        assert res.timeouts == statuses.count("timeout") and res.errors == statuses.count("error")
    assert sum(s != "ok" for _, _, st in jobs for s in st) >= 3  # the seed does exercise failures


def test_a_pool_left_open_at_exit_is_closed_before_its_workers_are_killed() -> None:
    """A pool its owner never closed is closed by an exit hook that runs before multiprocessing kills
    the children; before, the dispatcher saw its workers die at exit and spawned replacements
    ("reward worker 0 replaced: worker exited with code -15", "could not restart reward worker")."""
    import subprocess

    code = (
        # registered first, so it runs LAST at exit: the time a dispatcher had to see its workers die
        # (multiprocessing's own exit hook, registered later, kills them before this sleep)
        "import atexit, time; atexit.register(time.sleep, 1.5)\n"
        "from posttrain.rewards import RewardPool, get_reward\n"
        "from posttrain.tasks import Example\n"
        "p = RewardPool(get_reward('exact_match'), num_workers=1)\n"
        "print(p.score(['1'], [Example(id='a', prompt='q', answer='1')]).rewards)\n"
        "import time; time.sleep(0.5)\n"  # the pool is never closed
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "[1.0]" in r.stdout
    assert "replaced" not in r.stderr and "could not restart" not in r.stderr, r.stderr


_MAIN_SCRIPT = """
from posttrain.rewards import RewardPool
from posttrain.tasks import Example

class Length:  # a reward class defined in __main__, no `if __name__ == "__main__":` guard
    def __call__(self, completion, example):
        return float(len(completion)) + example.meta["bonus"].value

class Bonus:  # an example value defined in __main__
    def __init__(self, value):
        self.value = value

with RewardPool(Length(), num_workers=2, timeout_s=30.0) as pool:
    res = pool.score(["a", "bb"], [Example(str(i), "p", "a", meta={"bonus": Bonus(i)}) for i in range(2)])
print(res.rewards, res.errors)
"""


def test_reward_defined_in_an_unguarded_main_script(tmp_path) -> None:
    """Workers do not re-run the parent's script (issue 41 item 12): a script without the __main__
    guard started itself again in each worker ('worker 0 exited during start'); a reward and an example
    value defined in __main__ go by value."""
    script = tmp_path / "score.py"
    script.write_text(_MAIN_SCRIPT, encoding="utf-8")
    out = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "[1.0, 3.0] 0"


def test_unclosed_pool_is_silent_at_interpreter_exit() -> None:
    """A pool nobody closed is collected at shutdown, when module globals may already be None: its
    ``__del__`` printed ``AttributeError: 'NoneType' object has no attribute 'suppress'``."""
    import subprocess
    import sys

    code = (
        "from posttrain.rewards import get_reward\n"
        "from posttrain.rollout.reward_source import FunctionRewardSource\n"
        "src = FunctionRewardSource(get_reward('exact_match'), num_workers=0)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "Exception ignored" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_close_kills_a_worker_stuck_in_a_reward_at_once() -> None:
    """A run stopped (Ctrl-C, SIGTERM) while a reward hangs closes its pool on the way out: the busy
    worker is killed at once, not after the 2 s an idle worker gets to leave (issue 55 item 4)."""
    p = RewardPool(ScriptedReward(), num_workers=1, timeout_s=600)
    try:
        handle = p.submit(*_batch(["sleep"]))
        until = time.monotonic() + 30
        while p._workers[0].heartbeat[0] < 0 and time.monotonic() < until:  # the item is running
            time.sleep(0.02)
        proc = p._workers[0].proc
        t0 = time.monotonic()
        p.close()
        took = time.monotonic() - t0
    finally:
        p.close()
    assert not proc.is_alive()
    assert took < 1.5, f"close() took {took:.2f} s with a worker stuck in its reward"
    with pytest.raises(Exception, match="pool closed"):
        handle.result(timeout=5)
