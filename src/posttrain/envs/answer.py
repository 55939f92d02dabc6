"""``answer``: a one-message environment that scores the agent's answer with a reward function.

The first observation is the example's prompt (the question); the agent answers in one message (with
tools, after as many tool calls as the runner allows: :mod:`posttrain.rollout.multiturn`), and the
session reward is ``reward(answer, example)`` for any registered reward (default ``last_number``).
This makes every single-turn task (``word_problems``, ``arithmetic``, a JSONL file) a multi-turn
episode, e.g. for tool use. Use it with ``rollout.runner.params.system: false``: the question is the
user's message, not repeated as a system message.
"""

from __future__ import annotations

from typing import Any

from posttrain.envs.base import Env, StepResult, register_env


@register_env("answer")
class AnswerEnv(Env):
    """One agent message, scored by ``reward`` (a registered reward name, with ``reward_params``).
    Criterion ``format`` is 0 (the runner marks a turn cut at the token cap as a violation)."""

    criteria = ("format",)
    max_turns = 1

    def __init__(self, reward: str = "last_number", reward_params: dict[str, Any] | None = None) -> None:
        from posttrain.rewards import get_reward  # on use: importing the environments stays light

        self.reward = get_reward(reward, **(reward_params or {}))
        self.example: Any = None
        self.answer: str | None = None
        self.score: float | None = None

    def reset(self, example: Any, seed: int) -> str:
        self.example, self.answer, self.score = example, None, None
        return str(example.prompt)

    def step(self, agent_text: str) -> StepResult:
        self.answer = agent_text
        self.score = float(self.reward(agent_text, self.example))
        return StepResult("", {"format": 0.0}, True, self.score)

    def summary(self) -> dict[str, Any]:
        return {"correct": self.score is not None and self.score >= 1.0}
