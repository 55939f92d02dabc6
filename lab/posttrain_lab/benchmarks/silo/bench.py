"""`posttrain bench silo`: the SILO-BENCH grid with scripted reference agents, timed.

Runs every (task, N, protocol) case of the grid through the real engine and parser with
`ScriptedAgent`s (no files written) and reports:

* wall time of the whole grid and per N,
* peak resident memory of the process (``resource.getrusage(RUSAGE_SELF).ru_maxrss``),
* engine overhead per agent-round: (case wall time - time inside ``agent.reply``) summed over cases,
  divided by the number of agent-rounds (one agent answering in one round),
* success: the fraction of cases with S = 1 (the scripted agents should reach 1.0).

Default grid: 30 tasks x N in {2, 5, 10, 20, 50, 100} x {p2p, bp, sfs} = 540 cases (target: < 10 min on
2 CPU cores, N = 100 included).
"""

from __future__ import annotations

import asyncio
import platform
import resource
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

DEFAULT_COUNTS = (2, 5, 10, 20, 50, 100)
DEFAULT_PROTOCOLS = ("p2p", "bp", "sfs")


def peak_rss_mb() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r / (1024 * 1024) if sys.platform == "darwin" else r / 1024  # bytes on macOS, KiB on Linux


def run_silo_bench(
    tasks: Sequence[str] | None = None,
    agent_counts: Sequence[int] = DEFAULT_COUNTS,
    protocols: Sequence[str] = DEFAULT_PROTOCOLS,
    seed: int = 42,
    max_rounds: int = 100,
    on_case: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Run the grid; returns the measurements as a JSON-able dict."""
    from posttrain_lab.benchmarks.silo import TASK_IDS, generate_case
    from posttrain_lab.benchmarks.silo.agents import ScriptedAgent
    from posttrain_lab.benchmarks.silo.engine import EngineConfig, SiloEngine
    from posttrain_lab.benchmarks.silo.protocols import canonical_protocol

    tasks = list(tasks) if tasks else list(TASK_IDS)
    protos = [canonical_protocol(p) for p in protocols]
    agent = ScriptedAgent()
    cfg = EngineConfig(max_rounds=max_rounds)
    per_n: dict[int, dict[str, float]] = {}
    failures: list[str] = []
    totals = {"cases": 0, "success": 0, "wall_s": 0.0, "agent_s": 0.0, "agent_rounds": 0, "gen_s": 0.0}
    t_all = time.perf_counter()
    for n in agent_counts:
        pn = {"cases": 0, "success": 0, "wall_s": 0.0, "engine_s": 0.0, "agent_rounds": 0, "gen_s": 0.0}
        for task_id in tasks:
            t0 = time.perf_counter()
            case = generate_case(task_id, n, seed)
            pn["gen_s"] += time.perf_counter() - t0
            for proto in protos:
                res = asyncio.run(SiloEngine(case, proto, agent, cfg).run())
                pn["cases"] += 1
                pn["success"] += res.success
                pn["wall_s"] += res.wall_s
                pn["engine_s"] += res.engine_s
                pn["agent_rounds"] += res.agent_rounds
                totals["agent_s"] += res.agent_s
                if not res.success:
                    failures.append(f"{task_id} N={n} {proto}")
                if on_case is not None:
                    on_case({"task_id": task_id, "n": n, "protocol": proto, "success": res.success})
        per_n[n] = {
            **pn,
            "engine_us_per_agent_round": 1e6 * pn["engine_s"] / max(1, pn["agent_rounds"]),
        }
        for k in ("cases", "success", "wall_s", "agent_rounds", "gen_s"):
            totals[k] += pn[k]
    wall = time.perf_counter() - t_all
    engine_s = sum(p["engine_s"] for p in per_n.values())
    return {
        "grid": {"tasks": len(tasks), "agent_counts": list(agent_counts), "protocols": protos, "seed": seed},
        "cases": totals["cases"],
        "success_rate": totals["success"] / max(1, totals["cases"]),
        "failed_cases": failures,
        "wall_s": wall,
        "case_wall_s": totals["wall_s"],
        "generate_s": totals["gen_s"],
        "agent_s": totals["agent_s"],
        "engine_s": engine_s,
        "agent_rounds": totals["agent_rounds"],
        "engine_us_per_agent_round": 1e6 * engine_s / max(1, totals["agent_rounds"]),
        "peak_rss_mb": peak_rss_mb(),
        "per_n": {str(k): v for k, v in per_n.items()},
        "machine": {"python": platform.python_version(), "platform": platform.platform()},
    }
