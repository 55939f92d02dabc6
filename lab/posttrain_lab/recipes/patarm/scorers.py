"""Reward models named on the command line: ``hf:<model>``, ``endpoint:<base_url>#<model>``, ``bt:<dir>``.

* ``hf:<model>`` — a generative judge in process (checkpoint / run folder / hub directory / preset);
* ``endpoint:<base_url>#<model>`` — a generative judge behind an OpenAI-compatible server (API key from
  the environment variable named by ``api_key_env``);
* ``bt:<dir-or-preset>`` — a Bradley-Terry scalar model (:mod:`posttrain_lab.recipes.patarm.bt`).

Each gives a pointwise ``score(pairs, side)``; generative judges also give pairwise verdicts.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from posttrain.utils.errors import PosttrainError
from posttrain_lab.recipes.patarm.data import PreferencePair
from posttrain_lab.recipes.patarm.prompts import DEFAULT_SCALE, pairwise_prompt, parse_preference


class ScorerSpecError(PosttrainError, ValueError):
    """A reward-model spec that is not ``hf:…``, ``endpoint:…#…`` or ``bt:…``."""


@dataclass
class Scorer:
    name: str
    kind: str  # "judge" | "bt"
    obj: Any  # JudgeRewardSource or BTRewardModel

    def score(self, items: list[tuple[str, str, str]]) -> list[float | None]:
        """One score (or None) per (task type, question, response): a judge's mean of its samples, or
        the BT model's scalar."""
        if self.kind == "bt":
            return self.obj.score([q for _, q, _ in items], [r for _, _, r in items])  # type: ignore[no-any-return]
        out: list[float | None] = []
        for j in self.obj.judge_scores(items):
            vals = [v for v in j.scores if v is not None]
            out.append(sum(vals) / len(vals) if vals else None)
        return out

    def pointwise(self, pairs: list[PreferencePair], side: str) -> list[float | None]:
        return self.score(
            [(p.task_type, p.prompt, p.chosen if side == "chosen" else p.rejected) for p in pairs]
        )

    def pairwise(
        self, items: list[tuple[PreferencePair, bool]], *, rubric_style: str = "full"
    ) -> list[str | None]:
        if self.kind != "judge":
            raise ScorerSpecError(f"{self.name}: pairwise mode needs a generative judge (hf: or endpoint:)")
        prompts = []
        for p, chosen_first in items:
            a, b = (p.chosen, p.rejected) if chosen_first else (p.rejected, p.chosen)
            prompts.append(pairwise_prompt(p.prompt, a, b, p.task_type, rubric_style=rubric_style))  # type: ignore[arg-type]
        texts = self.obj.judge.generate(prompts)
        return [parse_preference(t) for t in texts]


def build_scorer(
    spec: str,
    *,
    rubric_style: str = "full",
    samples: int = 1,
    temperature: float = 0.0,
    max_new_tokens: int = 256,
    chat_template: bool = False,
    enable_thinking: bool | None = None,
    api_key_env: str | None = None,
    timeout_s: float = 120.0,
    max_retries: int = 1,
    device: str = "auto",
    scale: tuple[float, float] = DEFAULT_SCALE,
    seed: int = 0,
) -> Scorer:
    kind, sep, rest = spec.partition(":")
    if not sep or not rest:
        raise ScorerSpecError(
            f"reward model {spec!r}: expected hf:<model>, endpoint:<base_url>#<model> or bt:<dir-or-preset>"
        )
    if kind == "bt":
        from posttrain.models import pick_device
        from posttrain_lab.recipes.patarm.bt import BTRewardModel, load_bt_model

        dev = pick_device() if device == "auto" else device
        model, tok = load_bt_model(rest, device=dev, seed=seed)
        return Scorer(spec, "bt", BTRewardModel(model, tok, chat_template=chat_template))
    from posttrain_lab.recipes.patarm.judge import EndpointJudge, HFJudge, JudgeRewardSource

    if kind == "hf":
        judge: Any = HFJudge(
            rest,
            chat_template=chat_template,
            enable_thinking=enable_thinking,
            temperature=temperature,
            max_new_tokens=max_new_tokens,
            device=device,
            seed=seed,
        )
    elif kind == "endpoint":
        url, hash_, model_name = rest.rpartition("#")
        if not hash_ or not url or not model_name:
            raise ScorerSpecError(f"reward model {spec!r}: expected endpoint:<base_url>#<model>")
        judge = EndpointJudge(
            url,
            model_name,
            api_key_env=api_key_env,
            temperature=temperature,
            max_tokens=max_new_tokens,
            timeout_s=timeout_s,
            max_retries=max_retries,
        )
    else:
        raise ScorerSpecError(f"reward model {spec!r}: unknown kind {kind!r}; accepted: hf, endpoint, bt")
    random.seed(seed)
    src = JudgeRewardSource(
        judge,
        samples=samples,
        scale=scale,
        rubric_style=rubric_style,
        timeout_s=None if kind == "hf" else timeout_s * (max_retries + 2),
        max_retries=0 if kind == "hf" else max_retries,
        cache_size=0,
        batch_size=64,
    )
    return Scorer(spec, "judge", src)
