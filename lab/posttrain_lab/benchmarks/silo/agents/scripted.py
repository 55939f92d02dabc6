"""Scripted reference agents: solve every SILO-BENCH task through each protocol with the tools alone.

They are ordinary `Agent`s: each reply is real XML tool-call text that goes through the engine's parser,
and all the data they use comes from their chat context (the system prompt: own ID, N, the protocol's
tools; the case's user prompt: the agent's shard; the ``<tool_result>`` messages: what the tools
returned). Which task they play is told by the engine from the case's ``case_id`` (`current_seat`);
a bare `ScriptedAgent()` used outside an engine recognises the task from the ``**Task: ...**`` title. They never see ``expected_output``: once an agent holds all N shards it calls
`posttrain_lab.benchmarks.silo.solve(task_id, shards, prompt)`, the library's independent ground truth.

Strategies (round numbers are the earliest possible under the one-round visibility lag):

* **P2P star**: agents 1..N-1 send their shard to agent 0 (round 1); agent 0 receives them (round 2),
  computes all per-agent values, sends agent j its value and submits its own (round 3); the others
  receive (round 4) and submit (round 5). 2(N-1) messages, D = 2/N.
* **BP**: everyone broadcasts its shard (round 1), receives all (round 2), computes and submits
  (round 3). N broadcasts, D = 1/(N-1).
* **SFS**: everyone writes ``shard/{i}`` (round 1), reads the others' keys (round 2), computes and
  submits (round 3). N keys written, D_code = 1/(N-1); N(N-1) reads, D_paper = 1.

* **N = 1 oracle** (`posttrain_lab.benchmarks.silo.oracle`): the only agent holds the whole input (merged, or listed
  shard by shard); it computes and submits in round 1, with no tool call besides ``submit_result``.

Message payloads are JSON (``<`` escaped as ``\\u003c`` so data can never close an XML tag).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from posttrain.utils.errors import PosttrainError
from posttrain.utils.registry import Registry
from posttrain_lab.benchmarks.silo.agents.base import Agent, AgentReply, current_seat
from posttrain_lab.benchmarks.silo.parsing import (
    LiteralError,
    format_tool_call,
    parse_data_literal,
    parse_tool_results,
)

_ID_RE = re.compile(r"agent ID is:\s*(\d+)")
_MAXID_RE = re.compile(r"IDs 0 to (\d+)")
_TITLE_RE = re.compile(r"\*\*Task:\s*(.+?)\*\*")
_DATA_HEAD_RE = re.compile(r"^\*\*Your (?:Local )?Data[^\n]*\*\*\s*$", re.MULTILINE)


class ScriptError(PosttrainError, RuntimeError):
    """The scripted agent could not read what it needs from its context (names the missing piece)."""


@lru_cache(maxsize=1)
def task_titles() -> dict[str, str]:
    """``**Task: <title>**`` of every task -> task id, read from tiny generated cases (cached)."""
    from posttrain_lab.benchmarks.silo import TASK_IDS, generate_case

    out: dict[str, str] = {}
    for tid in TASK_IDS:
        prompt = generate_case(tid, 2, seed=0)["agent_configs"][0]["user_prompt"]
        m = _TITLE_RE.search(prompt)
        if m is None:
            raise ScriptError(f"task {tid}: its prompt has no '**Task: ...**' title line")
        title = m.group(1).strip()
        if title in out:
            raise ScriptError(f"tasks {out[title]} and {tid} share the title {title!r}")
        out[title] = tid
    return out


def read_task(prompt: str, task_id: str | None = None) -> tuple[str, Any]:
    """(task_id, own shard) from the user prompt. The task is `task_id` when given (the engine passes
    the case's id, `current_seat`), else it is recognised from the ``**Task: ...**`` title."""
    if task_id is None:
        m = _TITLE_RE.search(prompt)
        if m is None:
            raise ScriptError("no '**Task: ...**' title in the user prompt")
        title = m.group(1).strip()
        task_id = task_titles().get(title)
        if task_id is None:
            raise ScriptError(f"unknown task title {title!r}")
    return task_id, extract_shard(prompt)


def extract_shard(prompt: str) -> Any:
    """The agent's shard from the ``**Your Data...**`` section of its prompt.

    The first non-empty line after the heading holds the shard, either alone or after a label
    (``You (Agent 1) hold: [...]``, ``String segment: abc``): a line starting with ``[``/``{``/``(`` is
    read from its start, else from after the first ``": "``. A bracketed value is read as JSON (our
    case files) or as a Python literal (the authors' files print shards with ``str()``: single quotes,
    tuples, integer dict keys) by `parse_data_literal`, which evaluates nothing; text after it, like
    ``(each edge is tuple (u, v))``, is ignored. Anything else is the verbatim string shard.
    """
    m = _DATA_HEAD_RE.search(prompt)
    if m is None:
        raise ScriptError("no '**Your Data...**' section in the user prompt")
    line = next((ln.strip() for ln in prompt[m.end() :].splitlines() if ln.strip()), "")
    if not line or line.startswith("**"):
        raise ScriptError("the '**Your Data...**' section of the user prompt is empty")
    text = line if line[:1] in ("[", "{", "(") else line.partition(": ")[2].strip()
    if text[:1] in ("[", "{", "(", '"'):
        try:
            return parse_data_literal(text)
        except LiteralError as e:
            raise ScriptError(f"shard {text[:60]!r} is neither JSON nor a Python literal ({e})") from e
    return text


ANSWER_STYLES: Registry[Callable[[Any], str]] = Registry("scripted answer style")


@ANSWER_STYLES.register("json")
def _json_answer(value: Any) -> str:
    """The answer as JSON (the default: what both scoring modes read)."""
    return json.dumps(value)


@ANSWER_STYLES.register("python")
def _python_answer(value: Any) -> str:
    """The answer in Python notation, ``str(value)``, as the authors' task texts print data (single
    quotes, ``True``): a container holding strings is then no JSON and stays a string."""
    return str(value)


@ANSWER_STYLES.register("int-bools")
def _int_bools_answer(value: Any) -> str:
    """JSON with booleans written as 1 / 0 (I-04): right under Python ``==``, not under the default."""

    def conv(v: Any) -> Any:
        if isinstance(v, bool):
            return int(v)
        if isinstance(v, list):
            return [conv(x) for x in v]
        if isinstance(v, dict):
            return {k: conv(x) for k, x in v.items()}
        return v

    return json.dumps(conv(value))


def _payload(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":")).replace("<", "\\u003c")


def _load(content: Any) -> Any:
    if isinstance(content, str):
        try:
            return json.loads(content)
        except ValueError:
            return None
    return content


class ScriptedAgent(Agent):
    """Reference policy; one instance serves every seat (it is stateless, like an LLM endpoint)."""

    name = "scripted"

    answer_style = "json"

    def __init__(self, answer_style: str = "json") -> None:
        self.answer_style = ANSWER_STYLES.canonical(answer_style)
        if self.answer_style != "json":
            self.name = f"scripted:{self.answer_style}"

    def write_answer(self, value: Any) -> str:
        """The ``answer`` parameter text of submit_result in this agent's `ANSWER_STYLES` style."""
        return ANSWER_STYLES.get(self.answer_style)(value)

    async def reply(self, messages: list[dict[str, str]]) -> AgentReply:
        return AgentReply(self.decide(messages))

    # -------------------------------------------------------------------------------------------------
    def decide(self, messages: list[dict[str, str]]) -> str:
        system, user = messages[0]["content"], messages[1]["content"]
        mi, mm = _ID_RE.search(system), _MAXID_RE.search(system)
        if mi is None or mm is None:
            raise ScriptError("system prompt does not state the agent ID and 'IDs 0 to N-1'")
        me, n = int(mi.group(1)), int(mm.group(1)) + 1
        if "**send_message**" in system:
            proto = "p2p"
        elif "**broadcast_message**" in system:
            proto = "bp"
        elif "**write_file**" in system:
            proto = "sfs"
        else:
            raise ScriptError("cannot tell the protocol from the system prompt's tool list")
        seat = current_seat()  # set by the engine: the task from the case's case_id
        task_id, shard = read_task(user, seat.task_id if seat is not None else None)
        if n == 1:  # N = 1 oracle baseline (benchmarks.silo.oracle): the whole input is here; answer now
            from posttrain_lab.benchmarks.silo import solve
            from posttrain_lab.benchmarks.silo.oracle import read_oracle_input

            held = read_oracle_input(user) or [shard]
            return format_tool_call("submit_result", answer=self.write_answer(solve(task_id, held, user)[0]))
        round_ = 1 + sum(1 for m in messages if m["role"] == "assistant")
        results = [
            res for m in messages[2:] if m["role"] == "user" for res in parse_tool_results(m["content"])
        ]
        shards: dict[int, Any] = {me: shard}
        value: list[Any] = []
        for tool, res in results:
            if not isinstance(res, dict):
                continue
            if tool == "receive_messages":
                for msg in res.get("messages") or []:
                    body = _load(msg.get("content"))
                    if isinstance(body, dict) and body.get("kind") == "shard":
                        shards[int(body["agent"])] = body["shard"]
                    elif isinstance(body, dict) and body.get("kind") == "value":
                        value = [body["value"]]
            elif tool == "read_file" and res.get("success"):
                body = _load(res.get("content"))
                if isinstance(body, dict) and body.get("kind") == "shard":
                    shards[int(body["agent"])] = body["shard"]
        mine = {"kind": "shard", "agent": me, "shard": shard}

        def compute() -> list[Any]:
            from posttrain_lab.benchmarks.silo import solve

            return solve(task_id, [shards[j] for j in range(n)], user)

        submit = lambda v: format_tool_call("submit_result", answer=self.write_answer(v))  # noqa: E731
        wait = format_tool_call("wait")
        if proto == "p2p":
            if me != 0:
                if value:
                    return submit(value[0])
                calls = (
                    [format_tool_call("send_message", target_id=0, content=_payload(mine))]
                    if round_ == 1
                    else []
                )
                return "\n".join([*calls, format_tool_call("receive_messages"), wait])
            if len(shards) == n:
                values = compute()
                sends = [
                    format_tool_call(
                        "send_message", target_id=j, content=_payload({"kind": "value", "value": values[j]})
                    )
                    for j in range(1, n)
                ]
                return "\n".join([*sends, submit(values[0])])
            return "\n".join([format_tool_call("receive_messages"), wait])
        if len(shards) == n:
            return submit(compute()[me])
        if proto == "bp":
            calls = [format_tool_call("broadcast_message", content=_payload(mine))] if round_ == 1 else []
            return "\n".join([*calls, format_tool_call("receive_messages"), wait])
        # sfs
        if round_ == 1:
            return "\n".join(
                [format_tool_call("write_file", path=f"shard/{me}", content=_payload(mine)), wait]
            )
        reads = [format_tool_call("read_file", path=f"shard/{j}") for j in range(n) if j not in shards]
        return "\n".join([*reads, wait])
