"""Grid sweeps over tasks x N x protocols x agents x seeds, resumable, with results as JSONL + CSV.

Layout of an output directory::

    DIR/results.jsonl          one row per finished case (flat metrics; see `CaseResult.row`)
    DIR/results.csv            the same rows as CSV (rewritten atomically after every case)
    DIR/errors.jsonl           cases that raised (e.g. an LLM endpoint after its retry cap); retried next run
    DIR/cases/<agent>/<protocol>/<TASK>_n<N>_s<seed>/{results.json, transcript.jsonl}   (save_cases)

Resume: a case is identified by (task_id, num_agents, protocol, agent, seed) and, for the N = 1 oracle
baseline (``oracle=True``, `posttrain_lab.benchmarks.silo.oracle`), the N = k it is the oracle of (``oracle_of``). A rerun reads
``results.jsonl`` and skips every key already there; a torn last line (a killed writer) is cut off
first so the file stays valid JSONL. Rows are appended with fsync, one per finished case, so a kill loses
at most the cases in flight; an interrupted sweep (Ctrl-C, SIGTERM) also leaves ``results.csv`` of the
finished ones. ``posttrain silo run --resume`` continues it.

Progress: one line per finished case (which case, its outcome, done/total, elapsed, ETA) on stderr when
it is not a terminal, a bar that names the last case on one; the first line says where results go.

Concurrency: up to ``concurrency`` cases run at once on one asyncio loop (useful with LLM endpoints,
whose own client semaphore bounds requests; scripted agents are CPU-bound and gain nothing).
"""

from __future__ import annotations

import asyncio
import csv
import io
import json
import re
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from posttrain.utils.errors import InvalidValueError
from posttrain.utils.io import append_jsonl, atomic_write_bytes, atomic_write_text, read_jsonl
from posttrain.utils.progress import progress_bar
from posttrain_lab.benchmarks.silo.agents.base import Agent
from posttrain_lab.benchmarks.silo.engine import EngineConfig, SiloEngine, case_task_id
from posttrain_lab.benchmarks.silo.protocols import canonical_protocol

CSV_COLUMNS = (
    "task_id",
    "level",
    "protocol",
    "num_agents",
    "oracle_of",
    "agent",
    "seed",
    "S",
    "P",
    "C_code",
    "C_paper",
    "D_code",
    "D_paper",
    "success",
    "scoring",
    "rounds",
    "submitted",
    "input_tokens",
    "output_tokens",
    "premature_submission",
    "consensus_failure",
    "computation_error",
    "emergent_leaders",
    "wall_s",
    "agent_s",
    "agent_rounds",
    "case_id",
)


def case_key(
    task_id: str, num_agents: int, protocol: str, agent: str, seed: int, oracle_of: int | None = None
) -> str:
    """Resume key of one case; an oracle row (num_agents = 1) also carries the k it is the oracle of,
    so the oracles of N = 2 and N = 5 (different global inputs) are different cases."""
    key = f"{task_id}|{int(num_agents)}|{protocol}|{agent}|{int(seed)}"
    return key if oracle_of is None else f"{key}|oracle{int(oracle_of)}"


def row_scoring(row: dict[str, Any]) -> str:
    """The scoring mode of a results.jsonl row (rows written before scoring modes existed: default)."""
    return str(row.get("scoring") or "default")


def case_dir_name(row: dict[str, Any]) -> Path:
    """Where `run_sweep` saved a row's ``results.json`` and ``transcript.jsonl``, relative to the run
    directory: ``cases/<agent>/<protocol>/<TASK>_n<N>_s<seed>`` (oracles ``<TASK>_n1_oracle<k>_s<seed>``)."""
    task, seed = row["task_id"], int(row["seed"])
    k = row.get("oracle_of")
    name = (
        f"{task}_n1_oracle{int(k)}_s{seed}" if k is not None else f"{task}_n{int(row['num_agents'])}_s{seed}"
    )
    return Path("cases") / _slug(str(row["agent"])) / str(row["protocol"]) / name


def row_key(row: dict[str, Any]) -> str:
    return case_key(
        row["task_id"], row["num_agents"], row["protocol"], row["agent"], row["seed"], row.get("oracle_of")
    )


def job_key(job: tuple) -> str:
    """`case_key` of a planned job ``(task_id, n, protocol, AgentSpec, seed, oracle)``: an oracle job of
    N = n runs with one agent."""
    task_id, n, proto, spec, seed, oracle = job
    return case_key(task_id, 1 if oracle else n, proto, spec.label, seed, n if oracle else None)


def repair_jsonl(path: Path) -> int:
    """Cut a torn (newline-less, unparsable) last line off `path`; returns the bytes removed."""
    if not path.exists():
        return 0
    data = path.read_bytes()
    if not data or data.endswith(b"\n"):
        return 0
    cut = data.rfind(b"\n") + 1
    tail = data[cut:]
    try:
        json.loads(tail)
        atomic_write_bytes(path, data + b"\n")  # complete row that only lacks its newline
        return 0
    except ValueError:
        atomic_write_bytes(path, data[:cut])
        return len(tail)


def load_rows(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a results.jsonl, first occurrence of each key kept (torn tail tolerated)."""
    path = Path(path)
    if not path.exists():
        return []
    seen: set[str] = set()
    rows = []
    for row in read_jsonl(path):
        try:
            k = row_key(row)
        except KeyError as e:
            raise InvalidValueError(f"{path}: a row lacks the key field {e}") from None
        if k not in seen:
            seen.add(k)
            rows.append(row)
    return rows


def write_csv(rows: Sequence[dict[str, Any]], path: str | Path) -> None:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(CSV_COLUMNS), extrasaction="ignore")
    w.writeheader()
    for r in rows:
        w.writerow(r)
    atomic_write_text(path, buf.getvalue())


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_") or "agent"


@dataclass
class AgentSpec:
    """A named agent population: ``make()`` returns one Agent shared by every seat of every case."""

    label: str
    make: Callable[[], Agent]
    _agent: Agent | None = field(default=None, repr=False)

    def get(self) -> Agent:
        if self._agent is None:
            self._agent = self.make()
        return self._agent


@dataclass
class SweepConfig:
    out_dir: Path
    tasks: list[str]
    agent_counts: list[int]
    protocols: list[str]
    seeds: list[int] = field(default_factory=lambda: [42])
    max_rounds: int = 100
    prompt_set: str = "code"
    concurrency: int = 1
    cases_dir: Path | None = None
    save_cases: bool = True
    progress: bool | None = None
    max_calls_per_turn: int | None = None
    scaffolds: tuple[str, ...] = ()
    oracle: bool = False  # also run the N = 1 oracle of every (task, N = k, seed), paired with each protocol
    scoring: str = "default"  # posttrain_lab.benchmarks.silo.scoring: "default" | "paper"
    token_counter: str = "regex"  # engine counter for agents without usage: regex | chars | hf:<tokenizer>


@dataclass
class SweepSummary:
    total: int
    skipped: int
    ran: int
    errors: int
    wall_s: float
    rows: list[dict[str, Any]]


class CaseSource:
    """Generated cases (per task, N, seed) or published files ``{TASK}_n{N}.json`` from a directory."""

    def __init__(self, cases_dir: Path | None) -> None:
        self.cases_dir = cases_dir
        self._cache: dict[tuple[str, int, int], dict[str, Any]] = {}

    def available(self, task_id: str, n: int) -> bool:
        return self.cases_dir is None or (self.cases_dir / f"{task_id}_n{n}.json").exists()

    def get(self, task_id: str, n: int, seed: int) -> dict[str, Any]:
        key = (task_id, n, seed)
        if key not in self._cache:
            from posttrain_lab.benchmarks.silo import generate_case, load_case

            if self.cases_dir is not None:
                case = load_case(self.cases_dir / f"{task_id}_n{n}.json")
                found = case_task_id(case)
                if found != task_id:
                    raise InvalidValueError(
                        f"{self.cases_dir}/{task_id}_n{n}.json holds task {found}, not {task_id}"
                    )
            else:
                case = generate_case(task_id, n, seed)
            self._cache.clear()  # cases are consumed grid-order; keep memory flat at N = 100
            self._cache[key] = case
        return self._cache[key]


class _OracleCache:
    """The oracle of the most recent (task, k, seed) source case (built once, shared by its protocols)."""

    def __init__(self) -> None:
        self._key: tuple[str, int, int] | None = None
        self._case: dict[str, Any] | None = None

    def get(self, task_id: str, n: int, seed: int, case: dict[str, Any]) -> dict[str, Any]:
        from posttrain_lab.benchmarks.silo.oracle import normalise_oracle, oracle_case

        if self._key != (task_id, n, seed) or self._case is None:
            self._case = normalise_oracle(oracle_case(case))
            self._key = (task_id, n, seed)
        return self._case


def plan(cfg: SweepConfig, agents: Sequence[AgentSpec], source: CaseSource) -> list[tuple]:
    """Jobs ``(task_id, n, protocol, AgentSpec, seed, oracle)`` in grid order; with ``cfg.oracle`` each
    multi-agent job is followed by its N = 1 oracle job (same task, k = n, protocol, agent, seed)."""
    protos = [canonical_protocol(p) for p in cfg.protocols]
    jobs = []
    for seed in cfg.seeds:
        for n in cfg.agent_counts:
            for task_id in cfg.tasks:
                if not source.available(task_id, n):
                    continue
                for proto in protos:
                    for spec in agents:
                        jobs.append((task_id, n, proto, spec, seed, False))
                        if cfg.oracle:
                            jobs.append((task_id, n, proto, spec, seed, True))
    return jobs


def _job_label(job: tuple) -> str:
    """``I-01 N=2 p2p scripted seed 42`` (an oracle job: ``N=1 (oracle of 2)``)."""
    task_id, n, proto, spec, seed, oracle = job
    size = f"N=1 (oracle of {n})" if oracle else f"N={n}"
    return f"{task_id} {size} {proto} {spec.label} seed {seed}"


async def run_sweep_async(cfg: SweepConfig, agents: Sequence[AgentSpec]) -> SweepSummary:
    ecfg = EngineConfig(  # bad options fail before anything is written
        max_rounds=cfg.max_rounds,
        prompt_set=cfg.prompt_set,
        max_calls_per_turn=cfg.max_calls_per_turn,
        scaffolds=tuple(cfg.scaffolds),
        scoring=cfg.scoring,
        token_counter=cfg.token_counter,
    )
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    results_path = out / "results.jsonl"
    repair_jsonl(results_path)
    repair_jsonl(out / "errors.jsonl")
    rows = load_rows(results_path)
    scored = sorted({row_scoring(r) for r in rows})
    if scored and scored != [ecfg.scoring]:
        raise InvalidValueError(
            f"{results_path} holds cases scored with --scoring {', '.join(scored)}; resume with "
            f"--scoring {scored[0]} (a report in the other mode: posttrain silo report {out} "
            f"--scoring {ecfg.scoring})"
        )
    done = {row_key(r) for r in rows}
    labels = [a.label for a in agents]
    if len(set(labels)) != len(labels):
        raise InvalidValueError(f"agent labels must be unique, got {labels}")
    source = CaseSource(Path(cfg.cases_dir) if cfg.cases_dir else None)
    jobs = plan(cfg, agents, source)
    todo = [j for j in jobs if job_key(j) not in done]
    skipped = len(jobs) - len(todo)
    sem = asyncio.Semaphore(max(1, cfg.concurrency))
    oracle_cases = _OracleCache()
    stats = {"ran": 0, "ok": 0, "errors": 0}
    t0 = time.perf_counter()

    with progress_bar("silo", total=len(jobs), completed=skipped, enabled=cfg.progress, log_every=1) as bar:
        bar.log(
            f"silo: {len(jobs)} cases, {skipped} already done, {len(todo)} to run; each finished case "
            f"is appended to {results_path}"
        )

        async def one(job: tuple) -> None:
            task_id, n, proto, spec, seed, oracle = job
            async with sem:
                try:
                    case = source.get(task_id, n, seed)
                    if oracle:
                        case = oracle_cases.get(task_id, n, seed, case)
                    engine = SiloEngine(case, proto, spec.get(), ecfg, agent_name=spec.label)
                    res = await engine.run()
                except Exception as e:  # one failing case must not kill the sweep; it is retried next run
                    stats["errors"] += 1
                    append_jsonl(
                        out / "errors.jsonl",
                        {
                            "key": job_key(job),
                            "error": f"{type(e).__name__}: {e}",
                            "traceback": traceback.format_exc(limit=5),
                            "at": datetime.now(timezone.utc).isoformat(),
                        },
                    )
                    bar.advance(case=f"{_job_label(job)} error", errors=stats["errors"])
                    return
                row = res.row()
                row["seed"] = seed
                row["oracle_of"] = n if oracle else None
                if cfg.save_cases:
                    res.save(out / case_dir_name(row))
                append_jsonl(results_path, row)
                rows.append(row)
                write_csv(rows, out / "results.csv")
                stats["ran"] += 1
                stats["ok"] += bool(row["success"])
                outcome = "success" if row["success"] else "failed"
                bar.advance(
                    case=f"{_job_label(job)} {outcome} ({row['rounds']} rounds, {row['wall_s']:.1f}s)",
                    sr=stats["ok"] / stats["ran"],
                    errors=stats["errors"],
                )

        try:
            await asyncio.gather(*(one(j) for j in todo))
        finally:  # interrupted too: the CSV holds every finished case
            write_csv(rows, out / "results.csv")
    return SweepSummary(
        total=len(jobs),
        skipped=skipped,
        ran=stats["ran"],
        errors=stats["errors"],
        wall_s=time.perf_counter() - t0,
        rows=rows,
    )


class SweepInterrupted(KeyboardInterrupt):
    """A sweep stopped by Ctrl-C or SIGTERM (``signal``: ``"SIGINT"`` or ``"SIGTERM"``) after the cases
    in flight were cancelled; every finished case is on disk."""

    def __init__(self, signal_name: str) -> None:
        super().__init__(signal_name)
        self.signal = signal_name


def run_sweep(cfg: SweepConfig, agents: Sequence[AgentSpec]) -> SweepSummary:
    """Synchronous entry point; closes the agents' connections at the end. Ctrl-C or SIGTERM (in the
    main thread) cancels the cases in flight and raises :class:`SweepInterrupted` once the results of
    the finished ones are written (not a traceback from inside the event loop)."""
    import signal
    import threading

    received: list[str] = []

    async def main() -> SweepSummary:
        loop, task = asyncio.get_running_loop(), asyncio.current_task()
        installed = []
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, lambda s=sig: (received.append(s.name), task.cancel()))
                installed.append(sig)
            except (ValueError, RuntimeError, NotImplementedError):  # not the main thread, or Windows
                pass
        try:
            return await run_sweep_async(cfg, agents)
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)
            for a in agents:
                if a._agent is not None:
                    await a._agent.aclose()

    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        return asyncio.run(main())
    except asyncio.CancelledError:
        if received:
            raise SweepInterrupted(received[0]) from None
        raise
    finally:  # the loop leaves the default handlers behind: put the caller's back
        if threading.current_thread() is threading.main_thread():
            for s, h in previous.items():
                if h is not None:
                    signal.signal(s, h)
