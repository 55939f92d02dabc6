"""The three SILO-BENCH communication protocols behind one interface (arXiv 2603.01045 App. A; the authors'
`src/msg/tools.py`, `src/broadcast/tools.py`, `src/sfs/tools.py`, jwyjohn/acl26-silo-bench).

Every protocol keeps its state in memory (no per-round files) and obeys the round-boundary rule of arXiv
2603.01045 App. A.5: everything sent or written in round r becomes visible at round r+1.

| Protocol | tools | visibility | D numerator (code, their `_count_messages`) |
|---|---|---|---|
| P2P (`p2p`, alias `msg`) | send_message(target_id, content), receive_messages() | unread, rounds < r | messages sent |
| BP (`bp`, alias `broadcast`) | broadcast_message(content), receive_messages(), list_agents() | since last receive, rounds < r | broadcasts (optionally x (N-1)) |
| SFS (`sfs`) | list_files(prefix), read_file(path), write_file(path, content), delete_file(path) | state as of r-1 | keys with modified_at_round == r, per round |

Tool calls of one round are applied in agent order (then call order). P2P delivery is a deterministic
per-recipient FIFO ordered by (round, send sequence) — `[proposed]` (the paper, App. A.2, promises per-pair
order), replacing the authors' uuid-filename order. Parameters declared ``str`` (content, path, prefix) use
the call's raw text.

Each protocol also counts what every agent *received* (messages delivered / other agents' files successfully
read) for the emergent-leader analysis (arXiv 2603.01045 App. G.3) and, for SFS, the paper's density
numerator: successful reads of agent i's files by other agents (arXiv 2603.01045 §3.3).
"""

from __future__ import annotations

from typing import Any

from posttrain.utils.errors import InvalidValueError
from posttrain.utils.registry import Registry
from posttrain_lab.benchmarks.silo.parsing import ToolCall

COMMON_TOOLS = ("wait", "submit_result")  # both end the turn (the authors' `run_round`); the engine runs them

protocols: Registry[type[Protocol]] = Registry("SILO protocol")


def _err(msg: str) -> dict[str, Any]:
    return {"success": False, "error": msg}


def _str_param(call: ToolCall, key: str) -> str | None:
    if key in call.raw:
        return call.raw[key]
    return None


def _int_param(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


class Protocol:
    """Base class: `execute` dispatches a parsed call of agent `agent_id` in round `round_`."""

    name: str = ""
    tools: tuple[str, ...] = ()

    def __init__(self, num_agents: int) -> None:
        if num_agents < 1:
            raise InvalidValueError(f"num_agents must be >= 1, got {num_agents}")
        self.n = num_agents
        self.received = [0] * num_agents  # data items delivered to agent i
        self.sent = [0] * num_agents  # messages / broadcasts / writes by agent i

    # lifecycle -------------------------------------------------------------------------------------
    def begin_round(self, round_: int) -> None:
        pass

    def end_round(self, round_: int) -> None:
        pass

    # tools -----------------------------------------------------------------------------------------
    def all_tools(self) -> tuple[str, ...]:
        return (*self.tools, *COMMON_TOOLS)

    def execute(self, agent_id: int, round_: int, call: ToolCall) -> dict[str, Any]:
        method = getattr(self, f"tool_{call.name}", None) if call.name in self.tools else None
        if method is None:
            return {
                "success": False,
                "error": f"Unknown tool: {call.name!r}. Available tools: {', '.join(self.all_tools())}",
            }
        return method(agent_id, round_, call)

    # metrics ---------------------------------------------------------------------------------------
    def message_count(self) -> int:
        """Code's D numerator (the authors' `_count_messages`)."""
        raise NotImplementedError

    def paper_message_count(self) -> int:
        """Paper's D numerator (arXiv 2603.01045 §3.3): messages sent; SFS: successful reads by others."""
        return self.message_count()


@protocols.register("p2p", aliases=("msg",))
class P2P(Protocol):
    """Point-to-point mailboxes (the authors' `src/msg/tools.py`; paper App. A.2)."""

    name = "p2p"
    tools = ("send_message", "receive_messages")

    def __init__(self, num_agents: int) -> None:
        super().__init__(num_agents)
        # per recipient: FIFO of (round, seq, sender, content); appended in (round, seq) order
        self.inbox: list[list[tuple[int, int, int, Any]]] = [[] for _ in range(num_agents)]
        self.seq = 0  # sends so far, over all agents (= the code's D numerator)

    def tool_send_message(self, agent_id: int, round_: int, call: ToolCall) -> dict[str, Any]:
        if "target_id" not in call.params:
            return _err("Missing parameter: target_id (int)")
        if "content" not in call.params:
            return _err("Missing parameter: content (str)")
        target = _int_param(call.params["target_id"])
        if target is None:
            return _err(f"Invalid target_id {call.raw.get('target_id')!r}: expected an integer agent ID")
        if not 0 <= target < self.n:
            return _err(f"Invalid target_id {target}: must be in [0, {self.n - 1}]")
        if target == agent_id:
            return _err("Cannot send a message to yourself")
        self.inbox[target].append((round_, self.seq, agent_id, _str_param(call, "content")))
        self.seq += 1
        self.sent[agent_id] += 1
        return {"success": True, "message": f"Message sent to agent {target}"}

    def tool_receive_messages(self, agent_id: int, round_: int, call: ToolCall) -> dict[str, Any]:
        box = self.inbox[agent_id]
        k = 0
        while k < len(box) and box[k][0] < round_:  # never the current round
            k += 1
        got, self.inbox[agent_id] = box[:k], box[k:]
        self.received[agent_id] += len(got)
        return {"messages": [{"from": s, "content": c, "timestamp": r} for r, _, s, c in got]}

    def message_count(self) -> int:
        return self.seq


@protocols.register("bp", aliases=("broadcast",))
class Broadcast(Protocol):
    """Broadcast to all (the authors' `src/broadcast/tools.py`)."""

    name = "bp"
    tools = ("broadcast_message", "receive_messages", "list_agents")

    def __init__(self, num_agents: int) -> None:
        super().__init__(num_agents)
        self.log: list[tuple[int, int, Any]] = []  # (round, sender, content), in (round, seq) order
        self.cursor = [0] * num_agents  # index into log of the first broadcast not yet delivered

    def tool_broadcast_message(self, agent_id: int, round_: int, call: ToolCall) -> dict[str, Any]:
        if "content" not in call.params:
            return _err("Missing parameter: content (str)")
        self.log.append((round_, agent_id, _str_param(call, "content")))
        self.sent[agent_id] += 1
        return {"success": True, "message": f"Broadcast sent to {self.n - 1} agents"}

    def tool_receive_messages(self, agent_id: int, round_: int, call: ToolCall) -> dict[str, Any]:
        # broadcasts not yet delivered to the caller from rounds <= r-1, not sent by the caller
        i = self.cursor[agent_id]
        out = []
        log = self.log
        while i < len(log) and log[i][0] < round_:
            r, s, c = log[i]
            if s != agent_id:
                out.append({"from": s, "content": c, "timestamp": r})
            i += 1
        self.cursor[agent_id] = i
        self.received[agent_id] += len(out)
        return {"messages": out}

    def tool_list_agents(self, agent_id: int, round_: int, call: ToolCall) -> dict[str, Any]:
        return {"agent_ids": list(range(self.n)), "total": self.n}

    def message_count(self) -> int:
        return len(self.log)

    def recipient_weighted_count(self) -> int:
        """Optional variant (ours; the authors count each broadcast once): each broadcast counts once per
        recipient, x (N-1)."""
        return len(self.log) * (self.n - 1)


@protocols.register("sfs")
class SharedFS(Protocol):
    """Shared key-value file system (the authors' `src/sfs/tools.py`). Reads see the store as of round
    r-1."""

    name = "sfs"
    tools = ("list_files", "read_file", "write_file", "delete_file")

    def __init__(self, num_agents: int) -> None:
        super().__init__(num_agents)
        self.store: dict[str, tuple[Any, int, int]] = {}  # path -> (content, modified_by, round)
        self.prev: dict[str, tuple[Any, int, int]] = {}
        self.keys_written_total = 0  # code D: keys with modified_at_round == r, summed over rounds
        self.reads_of = [0] * num_agents  # paper D: successful reads of agent i's files by others

    def begin_round(self, round_: int) -> None:
        self.prev = dict(self.store)  # entries are immutable tuples: a shallow copy is a snapshot

    def end_round(self, round_: int) -> None:
        self.keys_written_total += sum(1 for e in self.store.values() if e[2] == round_)

    def tool_list_files(self, agent_id: int, round_: int, call: ToolCall) -> dict[str, Any]:
        prefix = _str_param(call, "prefix") or ""
        files = [
            {"path": p, "modified_by": e[1], "modified_at_round": e[2]}
            for p, e in sorted(self.prev.items())
            if p.startswith(prefix)
        ]
        return {"files": files}

    def tool_read_file(self, agent_id: int, round_: int, call: ToolCall) -> dict[str, Any]:
        path = _str_param(call, "path")
        if path is None:
            return _err("Missing parameter: path (str)")
        entry = self.prev.get(path)
        if entry is None:
            return _err(f"Key not found: {path}")
        content, by, at = entry
        if by != agent_id:
            self.reads_of[by] += 1
            self.received[agent_id] += 1
        return {"success": True, "content": content, "metadata": {"modified_by": by, "modified_at_round": at}}

    def tool_write_file(self, agent_id: int, round_: int, call: ToolCall) -> dict[str, Any]:
        path = _str_param(call, "path")
        if path is None:
            return _err("Missing parameter: path (str)")
        if "content" not in call.params:
            return _err("Missing parameter: content (any)")
        self.store[path] = (call.params["content"], agent_id, round_)
        self.sent[agent_id] += 1
        return {"success": True, "message": f"Wrote {path}"}

    def tool_delete_file(self, agent_id: int, round_: int, call: ToolCall) -> dict[str, Any]:
        path = _str_param(call, "path")
        if path is None:
            return _err("Missing parameter: path (str)")
        if path not in self.store:
            return _err(f"Key not found: {path}")
        del self.store[path]
        return {"success": True, "message": f"Deleted {path}"}

    def message_count(self) -> int:
        return self.keys_written_total

    def paper_message_count(self) -> int:
        return sum(self.reads_of)


def make_protocol(name: str, num_agents: int) -> Protocol:
    return protocols.get(canonical_protocol(name))(num_agents)


def canonical_protocol(name: str) -> str:
    """The registered name of a protocol, case-insensitive (``P2P``, as reports print it, is ``p2p``;
    ``msg`` and ``broadcast`` are the authors' names of p2p and bp)."""
    return protocols.canonical(name.strip().lower() if isinstance(name, str) else name)
