"""Adversarial agents: replies built to break an engine. The engine must survive all of them and still
return a well-formed result (tests/silo/test_agents.py).

Kinds (`ADVERSARIAL_KINDS`):

* ``malformed``: unclosed / nested / truncated XML, tags in the wrong order, binary junk.
* ``unknown_tool``: calls tools that do not exist in the protocol (and other protocols' tools).
* ``bad_types``: wrong parameter types and missing parameters (target_id "abc", lists as paths, ...).
* ``out_of_range``: targets < 0, >= N, itself, huge integers, floats.
* ``flood``: hundreds of messages / broadcasts / writes per turn, with large contents.
* ``double_submit``: submits twice in one reply (the second is never executed).
* ``never_submit``: only waits, forever.
* ``after_submit``: tool calls placed after ``submit_result`` in the same reply.
* ``random``: a seeded mix of all the above, a different one each round.
"""

from __future__ import annotations

import random
import re

from posttrain.utils.errors import InvalidValueError
from posttrain_lab.benchmarks.silo.agents.base import Agent, AgentReply
from posttrain_lab.benchmarks.silo.parsing import format_tool_call

ADVERSARIAL_KINDS = (
    "malformed",
    "unknown_tool",
    "bad_types",
    "out_of_range",
    "flood",
    "double_submit",
    "never_submit",
    "after_submit",
    "random",
)
_ID_RE = re.compile(r"agent ID is:\s*(\d+)")
_MAXID_RE = re.compile(r"IDs 0 to (\d+)")


def _raw(tool: str, body: str) -> str:
    return f"<tool_call><tool>{tool}</tool><parameters>{body}</parameters></tool_call>"


class AdversarialAgent(Agent):
    def __init__(self, kind: str = "random", seed: int = 0, flood_size: int = 300) -> None:
        if kind not in ADVERSARIAL_KINDS:
            raise InvalidValueError(
                f"unknown adversarial kind {kind!r}; known: {', '.join(ADVERSARIAL_KINDS)}"
            )
        self.kind, self.seed, self.flood_size = kind, seed, flood_size
        self.name = f"adversarial-{kind}"

    async def reply(self, messages: list[dict[str, str]]) -> AgentReply:
        system = messages[0]["content"] if messages else ""
        mi, mm = _ID_RE.search(system), _MAXID_RE.search(system)
        me = int(mi.group(1)) if mi else 0
        n = int(mm.group(1)) + 1 if mm else 2
        rnd = sum(1 for m in messages if m.get("role") == "assistant") + 1
        rng = random.Random(f"{self.seed}/{me}/{rnd}")
        kind = self.kind
        if kind == "random":
            kind = rng.choice(ADVERSARIAL_KINDS[:-1])
        return AgentReply(getattr(self, f"_{kind}")(rng, me, n, rnd), usage=self._usage(rng))

    @staticmethod
    def _usage(rng: random.Random) -> dict | None:
        # also exercise broken usage reports: missing, negative, wrong types
        return rng.choice(
            [None, {"prompt_tokens": -5}, {"completion_tokens": "many"}, {"prompt_tokens": 3}, []]
        )

    def _malformed(self, rng: random.Random, me: int, n: int, rnd: int) -> str:
        options = [
            "<tool_call><tool>send_message</tool><parameters><target_id>1",
            "<tool_call><tool>wait</tool_call>",
            "<tool_call><parameters><x>1</x></parameters></tool_call>",
            "<tool_call><tool></tool></tool_call>",
            "<tool_call><tool>write_file</tool><parameters><path>a</content></path></parameters></tool_call>",
            "</tool_call><tool_call><tool_call><tool>broadcast_message</tool><parameters><content><content>x"
            "</content></parameters></tool_call>",
            "<tool_call>\x00\xff\ud7ff<tool>re\nceive_messages</tool></tool_call>",
            "<think><tool_call><tool>submit_result</tool><parameters><answer>1</answer></parameters></tool_call>",
            "",
            "I will now call the tool: submit_result(42)",
        ]
        return "\n".join(rng.sample(options, k=rng.randint(1, len(options))))

    def _unknown_tool(self, rng: random.Random, me: int, n: int, rnd: int) -> str:
        names = [
            "fly",
            "send_message",
            "broadcast_message",
            "write_file",
            "list_agents",
            "__init__",
            "execute",
        ]
        return "\n".join(format_tool_call(rng.choice(names), x=rng.randint(0, 9)) for _ in range(5))

    def _bad_types(self, rng: random.Random, me: int, n: int, rnd: int) -> str:
        return "\n".join(
            [
                _raw("send_message", "<target_id>abc</target_id><content>hi</content>"),
                _raw("send_message", '<target_id>[1, 2]</target_id><content>{"a": 1}</content>'),
                _raw("send_message", "<content>no target</content>"),
                _raw("broadcast_message", ""),
                _raw("read_file", "<path>[1,2]</path>"),
                _raw("read_file", ""),
                _raw("write_file", "<path>k</path>"),
                _raw("delete_file", "<path>never-written</path>"),
                _raw("list_files", "<prefix>123</prefix>"),
                _raw("submit_result", ""),
                _raw("wait", "<forever>true</forever>"),
            ]
        )

    def _out_of_range(self, rng: random.Random, me: int, n: int, rnd: int) -> str:
        targets = [-1, n, me, 10**30, 1.5, 2.0, "1e400", True]
        return (
            "\n".join(
                _raw("send_message", f"<target_id>{t}</target_id><content>x</content>") for t in targets
            )
            + "\n"
            + format_tool_call("wait")
        )

    def _flood(self, rng: random.Random, me: int, n: int, rnd: int) -> str:
        big = "x" * 2000
        calls = []
        for k in range(self.flood_size):
            calls.append(format_tool_call("send_message", target_id=(me + 1 + k) % n, content=big))
            calls.append(format_tool_call("broadcast_message", content=big))
            calls.append(format_tool_call("write_file", path=f"flood/{me}/{k % 7}", content=big))
            calls.append(format_tool_call("receive_messages"))
        return "\n".join(calls)

    def _double_submit(self, rng: random.Random, me: int, n: int, rnd: int) -> str:
        return format_tool_call("submit_result", answer=1) + format_tool_call("submit_result", answer=2)

    def _never_submit(self, rng: random.Random, me: int, n: int, rnd: int) -> str:
        return format_tool_call("wait")

    def _after_submit(self, rng: random.Random, me: int, n: int, rnd: int) -> str:
        return "\n".join(
            [
                format_tool_call("submit_result", answer="[1, 2"),
                format_tool_call("send_message", target_id=(me + 1) % n, content="late"),
                format_tool_call("write_file", path="late", content="late"),
                format_tool_call("broadcast_message", content="late"),
            ]
        )
