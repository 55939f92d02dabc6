"""SILO-BENCH execution engine: synchronous rounds, lagged visibility, XML tool calls (the authors'
`src/engine.py`, jwyjohn/acl26-silo-bench; arXiv 2603.01045 App. A).

Round r (1-based) of a case with N agents:

1. ``protocol.begin_round(r)`` (SFS snapshots the store: reads in round r see the state of round r-1).
2. Every agent that has not submitted gets ONE call with its full chat history. The calls of a round may
   run concurrently (asyncio); their tool calls are then applied **in agent order**. Because nothing sent or
   written in round r is visible before r+1 (arXiv 2603.01045 App. A.5), this is equivalent to the authors'
   sequential loop; for SFS same-key writes the higher agent index wins (as in their loop).
3. The reply's tool calls are executed in order, stopping after the first turn-ending tool (``wait`` /
   ``submit_result``). Results go back as ONE user message of ``<tool_result>`` blocks. A reply with no
   parseable tool call gets a corrective message (tool name ``system``).
4. Stop when every agent has submitted or r = ``max_rounds`` (default 100). Non-submitters answer None;
   submitted agents are never called again and cost no further tokens (as in their `run_round`).

Token accounting: the agent's reported usage when it returns one, else the engine's token counter on
the text: input = all messages in the agent's context (kept as a running sum, so nothing is
re-tokenised), output = the reply. The default counter ``"regex"`` counts words, numbers and single
punctuation marks (``\\w+|[^\\w\\s]``): exact, deterministic, fast, and close in scale to a BPE
tokenizer on this kind of text; ``"chars"``, ``"hf:<preset or tokenizer dir>"`` (a real tokenizer's
counts, `hf_token_counter`; ``posttrain silo run --token-counter``) and any ``str -> int`` callable can
be used instead.

Deviation from the authors' workspace layout (`rounds/round-NNNNNN/agent-NNN/...` directories): state lives
in memory; the per-round transcript is one JSONL file (one row per active agent per round: reply, parsed
calls, tool results, tokens) and the per-case ``results.json`` follows their `evaluate`. A per-round
directory tree of JSON files is too slow at N = 100.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from posttrain.utils.errors import InvalidValueError
from posttrain.utils.io import atomic_write_json, atomic_write_text
from posttrain.utils.registry import Registry
from posttrain_lab.benchmarks.silo.agents.base import Agent, AgentReply, Seat, reply_as
from posttrain_lab.benchmarks.silo.parsing import ToolCall, format_tool_results, parse_tool_calls
from posttrain_lab.benchmarks.silo.prompts import (
    CORRECTIVE_MESSAGE,
    PLANNING_NOTE,
    PROMPT_SETS,
    SCAFFOLDS,
    SCRATCHPAD_NOTE,
    reminder_note,
    system_prompt,
    user_prompt,
)
from posttrain_lab.benchmarks.silo.protocols import Broadcast, Protocol, canonical_protocol, make_protocol

TokenCounter = Callable[[str], int]
token_counters: Registry[TokenCounter] = Registry("token counter")
_TOKEN_RE = re.compile(r"[\w\x80-\U0010ffff]+|[^\w\s\x80-\U0010ffff]", re.ASCII)
_LONG_TEXT = 2048


def _byte_classes() -> np.ndarray:
    cls = np.full(256, 2, dtype=np.int8)  # 2: punctuation / other
    for b in range(256):
        c = chr(b)
        if b >= 0x80 or (c.isascii() and (c.isalnum() or c == "_")):
            cls[b] = 1  # word byte (any non-ASCII byte counts as a word character)
        elif c in " \t\n\r\f\v":
            cls[b] = 0
    return cls


_BYTE_CLASS = _byte_classes()
_TASK_RE = re.compile(r"^(I{1,3}-\d{2})")


@token_counters.register("regex")
def regex_token_count(text: str) -> int:
    """Maximal runs of word characters plus single other non-space characters.

    Word characters: ASCII letters, digits, ``_`` and every non-ASCII character; space: ASCII
    whitespace. On ASCII text this is ``len(re.findall(r"\\w+|[^\\w\\s]", text))``. Long texts
    (tool results with thousands of data values at N = 100) are counted with a vectorised pass over
    the UTF-8 bytes (same definition, tested equal), about 20x faster than the regex.
    """
    if len(text) < _LONG_TEXT:
        return len(_TOKEN_RE.findall(text))
    cls = _BYTE_CLASS[np.frombuffer(text.encode("utf-8", "surrogatepass"), dtype=np.uint8)]
    word = cls == 1
    runs = int(word[0]) + int(np.count_nonzero(word[1:] & ~word[:-1]))
    return runs + int(np.count_nonzero(cls == 2))


@token_counters.register("chars")
def char_token_count(text: str) -> int:
    """One token per character (what a character-level tokenizer would count)."""
    return len(text)


def hf_token_counter(tokenizer: Any) -> TokenCounter:
    """A counter backed by a Hugging Face tokenizer (no special tokens)."""

    def count(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    return count


def load_tokenizer(spec: str) -> Any:
    """The tokenizer of a model preset (`posttrain.models.list_presets`: the character tokenizer) or
    of a local model / tokenizer directory (`transformers.AutoTokenizer`, local files only)."""
    from posttrain.models.presets import list_presets
    from posttrain.models.tokenizer import build_char_tokenizer

    if spec in list_presets():
        return build_char_tokenizer()
    path = Path(spec)
    if not path.is_dir():
        raise InvalidValueError(
            f"token counter 'hf:{spec}': {spec!r} is neither a model preset ({', '.join(list_presets())}) "
            "nor a local tokenizer directory"
        )
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError) as e:
        raise InvalidValueError(
            f"token counter 'hf:{spec}': cannot load a tokenizer from {path} ({e})"
        ) from None


def resolve_token_counter(spec: str | TokenCounter) -> TokenCounter:
    """A token counter from its name in `token_counters` (``regex``, ``chars``), ``hf:<preset or
    tokenizer dir>`` (`hf_token_counter` over `load_tokenizer`), or a ``str -> int`` callable."""
    if callable(spec):
        return spec
    if not isinstance(spec, str):
        raise InvalidValueError(f"token_counter must be a name or a str -> int callable, got {spec!r}")
    kind, sep, arg = spec.partition(":")
    if sep and kind == "hf":
        return hf_token_counter(load_tokenizer(arg))
    return token_counters.get(spec)


@dataclass
class EngineConfig:
    """Engine options. `max_rounds` is R_max (arXiv 2603.01045 §3: 100)."""

    max_rounds: int = 100
    prompt_set: str = "code"
    token_counter: str | TokenCounter = "regex"  # regex | chars | hf:<preset or tokenizer dir> | callable
    max_calls_per_turn: int | None = None  # None: no cap (authors); a cap answers the rest with an error
    # arXiv 2603.01045 App. H ablation (our texts, proposed): any of "planning", "reminder", "scratchpad"
    scaffolds: tuple[str, ...] = ()
    scoring: str = "default"  # posttrain_lab.benchmarks.silo.scoring.SCORINGS: "default" | "paper"

    def __post_init__(self) -> None:
        if self.prompt_set not in PROMPT_SETS:
            raise InvalidValueError(
                f"unknown prompt_set {self.prompt_set!r}; known: {', '.join(PROMPT_SETS)}"
            )
        bad = [s for s in self.scaffolds if s not in SCAFFOLDS]
        if bad:
            raise InvalidValueError(f"unknown scaffold(s) {bad}; known: {', '.join(SCAFFOLDS)}")
        from posttrain_lab.benchmarks.silo.scoring import SCORINGS

        if not isinstance(self.scoring, str):
            raise InvalidValueError(
                f"scoring must be a scoring mode name ({', '.join(SCORINGS.names())}), got {self.scoring!r}"
            )
        self.scoring = SCORINGS.canonical(self.scoring.strip().lower())
        counter = resolve_token_counter(self.token_counter)  # unknown names fail here, not per case
        if isinstance(self.token_counter, str) and self.token_counter.startswith("hf:"):
            self.token_counter = counter  # a tokenizer is loaded once per config, not once per case
        if self.max_rounds < 1:
            raise InvalidValueError(f"max_rounds must be >= 1, got {self.max_rounds}")
        if self.max_calls_per_turn is not None and self.max_calls_per_turn < 1:
            raise InvalidValueError(f"max_calls_per_turn must be >= 1 or None, got {self.max_calls_per_turn}")


def case_task_id(case: dict[str, Any]) -> str:
    """The task id of a case (``task_id`` key, else the prefix of ``case_id`` like ``I-01_n5``)."""
    tid = case.get("task_id")
    if isinstance(tid, str) and tid:
        return tid
    m = _TASK_RE.match(str(case.get("case_id", "")))
    if m is None:
        raise InvalidValueError(
            f"case {case.get('case_id')!r}: cannot tell the task id (no task_id, case_id not like 'I-01')"
        )
    return m.group(1)


@dataclass
class CaseResult:
    """Everything measured on one case; `results_json()` is the authors' results.json layout (their
    `evaluate`) plus our fields."""

    case_id: str
    task_id: str
    level: int
    protocol: str
    num_agents: int
    agent: str
    max_rounds: int
    rounds_executed: int
    expected: list[Any]
    answers: list[Any]
    submit_rounds: list[int | None]
    correct: list[bool]
    metrics: dict[str, float]
    success: bool
    input_tokens: int
    output_tokens: int
    sent: list[int]
    received: list[int]
    failure_modes: dict[str, Any]
    leaders: list[int]
    wall_s: float
    agent_s: float
    agent_rounds: int
    transcript: list[dict[str, Any]] = field(default_factory=list, repr=False)
    scoring: str = "default"  # the scoring mode of `metrics`, `correct`, `success` (benchmarks.silo.scoring)
    message_counts: dict[str, int] = field(
        default_factory=dict
    )  # m of D per variant: code, paper, bp_weighted

    @property
    def engine_s(self) -> float:
        return max(0.0, self.wall_s - self.agent_s)

    def results_json(self) -> dict[str, Any]:
        return {
            "evaluated_at": datetime.now(timezone.utc).isoformat(),
            "case_id": self.case_id,
            "task_id": self.task_id,
            "level": self.level,
            "protocol": self.protocol,
            "num_agents": self.num_agents,
            "agent": self.agent,
            "ground_truth": self.expected,
            "submissions": [
                {"agent_id": i, "answer": a, "correct": c, "round": r}
                for i, (a, c, r) in enumerate(
                    zip(self.answers, self.correct, self.submit_rounds, strict=True)
                )
            ],
            "scoring": self.scoring,
            "metrics": self.metrics,
            "success": self.success,
            "rounds_executed": self.rounds_executed,
            "max_rounds": self.max_rounds,
            "tokens": {"input": self.input_tokens, "output": self.output_tokens},
            "communication": {
                "sent": self.sent,
                "received": self.received,
                "emergent_leaders": self.leaders,
                "messages": self.message_counts,
            },
            "failure_modes": self.failure_modes,
            "timing": {
                "wall_s": self.wall_s,
                "agent_s": self.agent_s,
                "engine_s": self.engine_s,
                "agent_rounds": self.agent_rounds,
            },
        }

    def row(self) -> dict[str, Any]:
        """One flat results.jsonl / CSV row."""
        m = self.metrics
        return {
            "case_id": self.case_id,
            "task_id": self.task_id,
            "level": self.level,
            "protocol": self.protocol,
            "num_agents": self.num_agents,
            "agent": self.agent,
            "S": m["S_success_rate"],
            "P": m["P_partial_correctness"],
            "C_code": m["C_code"],
            "C_paper": m["C_paper"],
            "D_code": m["D_code"],
            "D_paper": m["D_paper"],
            "success": self.success,
            "scoring": self.scoring,
            "rounds": self.rounds_executed,
            "submitted": sum(r is not None for r in self.submit_rounds),
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "premature_submission": self.failure_modes["premature_submission"],
            "consensus_failure": self.failure_modes["consensus_failure"],
            "computation_error": self.failure_modes["computation_error"],
            "emergent_leaders": len(self.leaders),
            "wall_s": round(self.wall_s, 4),
            "agent_s": round(self.agent_s, 4),
            "agent_rounds": self.agent_rounds,
        }

    def save(self, case_dir: str | Path) -> None:
        """``results.json`` (atomic) and ``transcript.jsonl`` into `case_dir`."""
        case_dir = Path(case_dir)
        case_dir.mkdir(parents=True, exist_ok=True)
        lines = "".join(json.dumps(t, default=str) + "\n" for t in self.transcript)
        atomic_write_text(case_dir / "transcript.jsonl", lines)
        atomic_write_json(case_dir / "results.json", self.results_json())


def _usage_tokens(usage: Any, key: str) -> int | None:
    if not isinstance(usage, dict):
        return None
    v = usage.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        return None
    return v


class SiloEngine:
    """Runs one case under one protocol with the given agent(s).

    ``agents`` is one `Agent` for every seat or a sequence of N agents (seat i uses ``agents[i]``);
    None for a case driven step by step from outside (`start`, `CaseRun`).
    """

    def __init__(
        self,
        case: dict[str, Any],
        protocol: str,
        agents: Agent | Sequence[Agent] | None,
        config: EngineConfig | None = None,
        agent_name: str | None = None,
    ) -> None:
        self.case = case
        self.cfg = config or EngineConfig()
        configs = case.get("agent_configs")
        if not isinstance(configs, list) or not configs:
            raise InvalidValueError(f"case {case.get('case_id')!r}: 'agent_configs' must be a non-empty list")
        self.n = len(configs)
        self.protocol_name = canonical_protocol(protocol)
        self.task_id = case_task_id(case)
        expected = (case.get("expected_output") or {}).get("per_agent_values")
        if not isinstance(expected, list) or len(expected) != self.n:
            raise InvalidValueError(
                f"case {case.get('case_id')!r}: expected_output.per_agent_values must be a list of "
                f"{self.n} values (one per agent)"
            )
        self.expected = expected
        if agents is None:  # driven step by step (`start`), replies from outside (an RL policy)
            seats = []
        elif isinstance(agents, Agent):
            seats = [agents] * self.n
        else:
            seats = list(agents)
            if len(seats) != self.n:
                raise InvalidValueError(f"got {len(seats)} agents for a case with {self.n} agents")
        self.agent_name = agent_name or (getattr(seats[0], "name", "agent") if seats else "policy")
        case_id = str(case.get("case_id", self.task_id))
        self.agents = seats
        self.seats = [Seat(case_id, self.task_id, i, self.n) for i in range(self.n)]
        self.count = resolve_token_counter(self.cfg.token_counter)

    def start(self) -> CaseRun:
        """The case's step-wise state (:class:`CaseRun`): what ``run`` drives with the agents' replies,
        and what an RL environment drives with the policy's (``posttrain_lab.benchmarks.silo.env``)."""
        return CaseRun(self)

    async def run(self, transcript_path: str | Path | None = None) -> CaseResult:
        """Run the case to completion; optionally stream the transcript to `transcript_path` (JSONL)."""
        if not self.agents:
            raise InvalidValueError("SiloEngine.run needs agents; without them drive start() step by step")
        t_start = time.perf_counter()
        state = self.start()
        tfile = open(transcript_path, "w", encoding="utf-8") if transcript_path else None  # noqa: SIM115
        try:
            while not state.finished:
                active = state.begin_round()
                t0 = time.perf_counter()
                replies = await asyncio.gather(
                    *(reply_as(self.agents[i], self.seats[i], state.messages(i)) for i in active)
                )
                state.agent_s += time.perf_counter() - t0
                for i, rep in zip(active, replies, strict=True):
                    text = rep.text if isinstance(rep, AgentReply) and isinstance(rep.text, str) else ""
                    rec = state.apply(i, text, rep.usage if isinstance(rep, AgentReply) else None)
                    if tfile is not None:
                        tfile.write(json.dumps(rec, default=str) + "\n")
                state.end_round()
                if tfile is not None:
                    tfile.flush()
        finally:
            if tfile is not None:
                tfile.close()
        return state.result(wall_s=time.perf_counter() - t_start)

    def _execute_turn(
        self, proto: Protocol, i: int, r: int, calls: Sequence[ToolCall]
    ) -> tuple[list[tuple[str, Any]], tuple[Any] | None]:
        """Execute agent i's tool calls of round r in order, stopping after the first turn-ending one (the
        authors' `run_round`). Returns the ``(tool, result)`` pairs and ``(answer,)`` when it submitted,
        else None. The agent has not submitted before (submitted agents are not called), so a submit always
        counts.
        """
        cap = self.cfg.max_calls_per_turn
        if not calls:
            return [("system", {"error": CORRECTIVE_MESSAGE})], None
        results: list[tuple[str, Any]] = []
        for k, call in enumerate(calls):
            if cap is not None and k >= cap:
                msg = f"tool-call limit of {cap} per turn reached; {len(calls) - k} calls not executed"
                results.append(("system", {"error": msg}))
                break
            if call.name == "wait":
                results.append(("wait", {"status": "waiting"}))
                break
            if call.name == "submit_result":
                if "answer" not in call.params:
                    results.append(
                        ("submit_result", {"success": False, "error": "Missing parameter: answer"})
                    )
                    continue
                results.append(("submit_result", {"status": "submitted"}))
                return results, (call.params["answer"],)
            results.append((call.name, proto.execute(i, r, call)))
        return results, None


class CaseRun:
    """One case being played, round by round (the body of the authors' `run_round` loop): ``while not
    finished: active = begin_round(); apply(i, reply) for i in active (in agent order); end_round()``,
    then ``result()``. `SiloEngine.run` drives it with agents; an RL environment drives it with a
    policy's sampled replies, so both produce the same contexts, transcript and scores."""

    def __init__(self, engine: SiloEngine) -> None:
        self.engine = engine
        n, cfg = engine.n, engine.cfg
        self.proto = make_protocol(engine.protocol_name, n)
        self.contexts: list[list[dict[str, str]]] = []
        self.ctx_tokens: list[int] = []
        for i, ac in enumerate(engine.case["agent_configs"]):
            sys_msg = system_prompt(engine.protocol_name, i, n, cfg.prompt_set)
            up = ac.get("user_prompt") if isinstance(ac, dict) else None
            if not isinstance(up, str):
                raise InvalidValueError(
                    f"case {engine.case.get('case_id')!r}: agent_configs[{i}].user_prompt must be a string"
                )
            usr = user_prompt(up, cfg.prompt_set)
            if "scratchpad" in cfg.scaffolds:
                usr += "\n\n" + SCRATCHPAD_NOTE
            if "planning" in cfg.scaffolds:
                usr += "\n\n" + PLANNING_NOTE
            self.contexts.append([{"role": "system", "content": sys_msg}, {"role": "user", "content": usr}])
            self.ctx_tokens.append(engine.count(sys_msg) + engine.count(usr))
        self.submitted = [False] * n
        self.answers: list[Any] = [None] * n
        self.submit_round: list[int | None] = [None] * n
        self.in_total = self.out_total = 0
        self.agent_s = 0.0
        self.agent_rounds = 0
        self.transcript: list[dict[str, Any]] = []
        self.round = 0
        self.finished = False
        self._active: list[int] = []

    def messages(self, i: int) -> list[dict[str, str]]:
        """Agent i's chat context (a copy): what it is called with this round."""
        return list(self.contexts[i])

    def begin_round(self) -> list[int]:
        """Start the next round; the seats that act in it (those that have not submitted), in order."""
        if self.finished:
            raise InvalidValueError(f"case {self.engine.case.get('case_id')!r} is finished")
        self.round += 1
        self.proto.begin_round(self.round)
        active = [i for i in range(self.engine.n) if not self.submitted[i]]
        if "reminder" in self.engine.cfg.scaffolds:  # appended to the last (user) message: roles alternate
            note = "\n\n" + reminder_note(self.engine.protocol_name)
            note_tokens = self.engine.count(note)
            for i in active:
                last = self.contexts[i][-1]
                self.contexts[i][-1] = {**last, "content": last["content"] + note}
                self.ctx_tokens[i] += note_tokens
        self.agent_rounds += len(active)
        self._active = active
        return active

    def apply(self, i: int, text: str, usage: Any = None) -> dict[str, Any]:
        """Agent i's reply of this round: its tool calls run, the results become its next user message.
        Replies of a round are applied in agent order. Returns the transcript record."""
        if i not in self._active:
            raise InvalidValueError(f"agent {i} does not act in round {self.round} (active: {self._active})")
        eng = self.engine
        out_count = eng.count(text)
        in_tok = _usage_tokens(usage, "prompt_tokens")
        out_tok = _usage_tokens(usage, "completion_tokens")
        in_tok = self.ctx_tokens[i] if in_tok is None else in_tok
        out_tok = out_count if out_tok is None else out_tok
        self.in_total += in_tok
        self.out_total += out_tok
        self.contexts[i].append({"role": "assistant", "content": text})
        self.ctx_tokens[i] += out_count
        calls = parse_tool_calls(text)
        results, answer = eng._execute_turn(self.proto, i, self.round, calls)
        if answer is not None:
            self.submitted[i], self.answers[i], self.submit_round[i] = True, answer[0], self.round
        msg = format_tool_results(results)
        self.contexts[i].append({"role": "user", "content": msg})
        self.ctx_tokens[i] += eng.count(msg)
        rec = {
            "round": self.round,
            "agent_id": i,
            "reply": text,
            "calls": [c.to_json() for c in calls],
            "results": [{"tool": nme, "result": res} for nme, res in results],
            "input_tokens": in_tok,
            "output_tokens": out_tok,
            "submitted": self.submitted[i],
        }
        self.transcript.append(rec)
        return rec

    def end_round(self) -> None:
        """Close the round (the protocol's end of round); the case is finished when every agent has
        submitted or ``max_rounds`` is reached."""
        self.proto.end_round(self.round)
        self._active = []
        self.finished = all(self.submitted) or self.round >= self.engine.cfg.max_rounds

    def result(self, wall_s: float = 0.0) -> CaseResult:
        """The case's scores (the engine's scoring mode), failure modes and transcript."""
        from posttrain_lab.benchmarks.silo import metrics
        from posttrain_lab.benchmarks.silo import task_level as _task_level
        from posttrain_lab.benchmarks.silo.failures import analyze_failures
        from posttrain_lab.benchmarks.silo.scoring import CaseScoreInput, get_scoring

        eng, proto, n = self.engine, self.proto, self.engine.n
        level = _task_level(eng.task_id)
        scoring = get_scoring(eng.cfg.scoring)
        counts = {"code": proto.message_count(), "paper": proto.paper_message_count()}
        if isinstance(proto, Broadcast):
            counts["bp_weighted"] = proto.recipient_weighted_count()
        score_in = CaseScoreInput(
            task_id=eng.task_id,
            level=level,
            num_agents=n,
            expected=eng.expected,
            answers=self.answers,
            submitted=self.submitted,
            input_tokens=self.in_total,
            output_tokens=self.out_total,
            rounds_executed=self.round,
            max_rounds=eng.cfg.max_rounds,
            messages_code=counts["code"],
            messages_paper=counts["paper"],
            messages_bp_weighted=counts.get("bp_weighted"),
        )
        correct = scoring.correct_list(score_in)
        met = scoring.score(score_in)
        fm = analyze_failures(
            self.transcript,
            protocol=eng.protocol_name,
            task_id=eng.task_id,
            num_agents=n,
            answers=self.answers,
            submit_rounds=self.submit_round,
            correct=correct,
        )
        return CaseResult(
            case_id=str(eng.case.get("case_id", f"{eng.task_id}_n{n}")),
            task_id=eng.task_id,
            level=level,
            protocol=eng.protocol_name,
            num_agents=n,
            agent=eng.agent_name,
            max_rounds=eng.cfg.max_rounds,
            rounds_executed=self.round,
            expected=eng.expected,
            answers=self.answers,
            submit_rounds=self.submit_round,
            correct=correct,
            metrics=met,
            success=met["S_success_rate"] == 1.0,
            scoring=scoring.name,
            message_counts=counts,
            input_tokens=self.in_total,
            output_tokens=self.out_total,
            sent=list(proto.sent),
            received=list(proto.received),
            failure_modes=fm,
            leaders=metrics.emergent_leaders(list(proto.received)),
            wall_s=wall_s,
            agent_s=self.agent_s,
            agent_rounds=self.agent_rounds,
            transcript=self.transcript,
        )


def run_case(
    case: dict[str, Any],
    protocol: str,
    agents: Agent | Sequence[Agent],
    config: EngineConfig | None = None,
    transcript_path: str | Path | None = None,
    agent_name: str | None = None,
) -> CaseResult:
    """Synchronous convenience wrapper around `SiloEngine.run`."""
    return asyncio.run(SiloEngine(case, protocol, agents, config, agent_name).run(transcript_path))
