"""Tool use in a multi-turn conversation, as a layer in front of the environment: :class:`ToolUse`.

An agent turn that contains tool calls (parsed in the conversation's call format: the chat template's
``hermes`` / ``llama3``, else posttrain's ``fallback``; :mod:`posttrain.tools.calls`) never reaches the
environment: each call runs (a registered tool, or ``package.module:function``; every call under its
deadline, :mod:`posttrain.tools.deadline`), a malformed call, an unknown tool, a bad argument or a call
past its deadline comes back as a tool error (never a crash), and the results are appended as tool
turns (environment tokens: attended, never trained on) while the agent goes on in the same turn. A
conversation makes at most ``max_calls`` calls; once they are spent, a turn with calls goes to the
environment as the agent's message, unexecuted.

The calls of every conversation of a round run together (``workers`` threads; a tool in a worker
process of its own is cut at its deadline there). Ctrl-C or SIGTERM while they run cancels them all
(:func:`posttrain.tools.cancel_calls`) and ends the round at once, never after the tools' deadlines. Each conversation counts its calls, the valid ones
(well-formed, a known tool, arguments accepted, the tool did not raise) and the ones cut at their
deadline: the runner's ``row_stats`` ``tool_calls`` / ``tool_valid_calls`` / ``tool_timeouts``.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the tools load only when a runner uses them (importing rollout stays light)
    from posttrain.tools import Tool, ToolResult
    from posttrain.tools.calls import MalformedCall, ToolCall

    Call = ToolCall | MalformedCall


class ToolUse:
    """The tools of a conversation (module docstring): ``tools`` (names, paths or mappings with their
    own ``timeout_s`` / ``sandbox``), ``timeout_s`` / ``sandbox`` (every tool's defaults), the chat
    template (None: plain) that decides the call format ``tool_format`` (``auto``: the template's),
    ``max_calls`` per conversation, ``workers`` calls at once."""

    def __init__(
        self,
        tools: list[Any],
        *,
        chat_template: str | None,
        tool_format: str = "auto",
        max_calls: int = 4,
        workers: int = 4,
        timeout_s: float | None = None,
        sandbox: str | None = None,
    ) -> None:
        from posttrain.tools import get_tool
        from posttrain.tools.calls import detect_call_format, get_call_format

        self.tools: dict[str, Tool] = {}
        for spec in tools:
            t = get_tool(spec, timeout_s=timeout_s, sandbox=sandbox)
            self.tools[t.name] = t
        self.schemas = [t.schema for t in self.tools.values()]
        self.format = detect_call_format(chat_template) if tool_format == "auto" else tool_format
        self.parse = get_call_format(self.format)
        self.native = self.format in ("hermes", "llama3")  # the chat template renders them
        self.max_calls, self.workers = max_calls, workers

    def calls(self, text: str, spent: int) -> list[Call]:
        """The calls of an agent turn, or none when the conversation's budget is spent (``spent`` made)."""
        return self.parse(text) if self.max_calls - spent > 0 else []

    def instructions(self) -> str:
        """What the system message says about the tools when the template does not render them."""
        from posttrain.tools.calls import fallback_instructions

        return fallback_instructions(self.schemas)

    def run(self, calls: list[list[Call]], spent: list[int]) -> list[list[tuple[str, ToolResult]]]:
        """Every conversation's calls of this round, within its budget (``spent`` calls made so far), all
        at once: (tool name, result) per call; a call over the budget answers that it is spent."""
        jobs: list[tuple[int, Call | None]] = []
        for j, cs in enumerate(calls):
            budget = self.max_calls - spent[j]
            jobs += [(j, c if k < budget else None) for k, c in enumerate(cs)]
        out: list[list[tuple[str, ToolResult]]] = [[] for _ in calls]
        if not jobs:
            return out
        from posttrain.tools import ToolResult

        over = ("", ToolResult(f"error: tool call budget of {self.max_calls} spent; answer now", False))
        pool = ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="posttrain-tool-use")
        futures = [
            pool.submit(lambda job: over if job[1] is None else self._run(job[1]), job) for job in jobs
        ]
        try:
            done = [f.result() for f in futures]
        except BaseException as e:
            if isinstance(e, Exception):  # a bug in a call: the others end by their deadlines
                pool.shutdown(wait=True)
            else:  # Ctrl-C, SIGTERM (as the CLI raises it): never wait for a hanging tool
                _abandon(pool, futures)
            raise
        pool.shutdown(wait=True)
        for (j, _), res in zip(jobs, done, strict=True):
            out[j].append(res)
        return out

    def _run(self, call: Call) -> tuple[str, ToolResult]:
        from posttrain.tools import ToolResult
        from posttrain.tools.calls import MalformedCall

        if isinstance(call, MalformedCall):
            return "", ToolResult(f"error: malformed tool call: {call.error}", False)
        tool = self.tools.get(call.name)
        if tool is None:
            known = ", ".join(sorted(self.tools))
            return call.name, ToolResult(f"error: unknown tool {call.name!r}; tools: {known}", False)
        res = tool.invoke(call.arguments)
        if res.ok:
            return call.name, res
        return call.name, ToolResult(f"error: {res.text}", False, timed_out=res.timed_out)

    @staticmethod
    def messages(text: str, calls: list[Call], results: list[tuple[str, ToolResult]]) -> list[dict[str, Any]]:
        """The transcript of a turn with calls: the agent's message with its calls, then the results."""
        agent = {
            "role": "assistant",
            "content": text,
            "tool_calls": [
                {"name": c.name, "arguments": c.arguments}
                if hasattr(c, "name")  # a ToolCall; a MalformedCall has raw text and the reason
                else {"malformed": c.raw, "error": c.error}
                for c in calls
            ],
        }
        return [agent, *({"role": "tool", "name": n, "content": r.text, "ok": r.ok} for n, r in results)]


#: How long a stopping run waits for the tool threads of a round once their calls are cancelled.
STOP_WAIT_S = 5.0


def _abandon(pool: ThreadPoolExecutor, futures: list[Future[Any]]) -> None:
    """The round is interrupted: calls not started never start, every running call is cancelled
    (:func:`posttrain.tools.cancel_calls` kills its worker or sandbox, or stops waiting for its
    thread) and the threads are waited for at most :data:`STOP_WAIT_S` (a call that started a worker
    after the first cancel is cancelled on the next pass), never for a tool's own deadline. The
    executor is shut down without waiting: a thread still busy then is not joined here (it is at
    interpreter exit, by which time its call has been cancelled)."""
    import time

    from posttrain.tools import cancel_calls

    pool.shutdown(wait=False, cancel_futures=True)
    until = time.monotonic() + STOP_WAIT_S
    while True:
        cancel_calls()
        _, running = wait(futures, timeout=0.05)
        if not running or time.monotonic() > until:
            return
