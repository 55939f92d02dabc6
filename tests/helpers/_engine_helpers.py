"""A scripted rollout engine for runner and trainer tests: each context's reply is a function of its
decoded text."""

from __future__ import annotations

from collections.abc import Callable

from posttrain.rollout import RolloutBatch, RolloutEngine


class ScriptedEngine(RolloutEngine):
    """Replies ``reply(context_text)`` + EOS to every context (special tokens kept in the text), cut at
    ``max_new_tokens`` (finish reason ``length``), with log-prob ``logprob`` on every token; records
    every call's contexts and completions in ``calls``."""

    def __init__(self, tok, reply: Callable[[str], str], *, logprob: float = -0.5):
        self.tok, self.reply, self.logprob = tok, reply, logprob
        self.calls: list[tuple[list[list[int]], list[list[int]]]] = []

    @property
    def pad_token_id(self) -> int:
        return int(self.tok.pad_token_id)

    def generate(self, prompt_ids, n_per_prompt, params):
        comps, reasons = [], []
        for p in prompt_ids:
            text = self.reply(self.tok.decode(p, skip_special_tokens=False))
            ids = [*self.tok.encode(text, add_special_tokens=False), self.tok.eos_token_id]
            reasons.append("length" if len(ids) > params.max_new_tokens else "stop")
            comps.append(ids[: params.max_new_tokens])
        self.calls.append(([list(p) for p in prompt_ids], comps))
        return RolloutBatch.from_token_lists(
            prompt_ids,
            comps,
            pad_token_id=self.pad_token_id,
            group_ids=list(range(len(prompt_ids))),
            finish_reasons=reasons,
            logprobs=[[self.logprob] * len(c) for c in comps],
        )


def by_tool_round(script: list[str]) -> Callable[[str], str]:
    """A reply function: round r of a tool episode (r = tool results already in the context, counted
    by the ``\\n</tool_response>`` that closes each; the tool description names the tag too) says
    ``script[r]`` (the last entry once the script runs out)."""

    def reply(context: str) -> str:
        return script[min(context.count("\n</tool_response>"), len(script) - 1)]

    return reply
