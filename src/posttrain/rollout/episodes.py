"""Episodes: what the trainer gets back from acting, single-turn or multi-turn.

The RL loop never calls ``engine.generate`` itself; it asks an :class:`EpisodeRunner` for episodes.
:class:`SingleTurnRunner` (default) formats each prompt, samples ``n_i`` completions with the engine
and decodes them; rewards then come from a :class:`posttrain.rollout.reward_source.RewardSource`.

A multi-turn runner (DuCA, spec ``rl-sampling-and-rewards.md`` §4: an agent talking to a user
simulator) returns the same :class:`Episodes` with the policy tokens of all turns in
``batch.completion_ids`` (environment tokens masked out of ``completion_mask``), its own
``rewards`` (session rewards) and ``advantage_inputs`` such as ``turn_index`` (N, T) and
``turn_rewards``; the loop passes ``advantage_inputs`` to the advantage estimator as keyword
arguments, so a ``duca`` estimator can combine turn and session horizons.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import torch

from posttrain.rollout.base import RolloutBatch, RolloutEngine, SamplingParams


class PromptFormatter:
    """Prompt text -> token ids, identical in rollout, SFT and evaluation.

    template: a ``str.format`` template with one field ``{prompt}`` (e.g. the ASRR No-Thinking prefix
    goes here); chat: wrap the formatted text as one user message with the tokenizer's chat template
    (``add_generation_prompt=True``), as instruction-tuned checkpoints (Qwen3) expect.
    """

    def __init__(self, tokenizer: Any, *, template: str = "{prompt}", chat: bool = False) -> None:
        if "{prompt}" not in template:
            raise ValueError(f"prompt template must contain '{{prompt}}', got {template!r}")
        self.tokenizer = tokenizer
        self.template = template
        self.chat = chat

    def text(self, prompt: str) -> str:
        return self.template.replace("{prompt}", prompt)

    def encode(self, prompt: str) -> list[int]:
        text = self.text(prompt)
        if self.chat:
            ids = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
            )
            if isinstance(ids, dict) or hasattr(ids, "input_ids"):
                ids = ids["input_ids"]
            return [int(i) for i in ids]
        return [int(i) for i in self.tokenizer.encode(text, add_special_tokens=False)]

    def encode_completion(self, completion: str) -> list[int]:
        """Completion text -> ids followed by EOS (the SFT target)."""
        ids = [int(i) for i in self.tokenizer.encode(completion, add_special_tokens=False)]
        eos = self.tokenizer.eos_token_id
        return [*ids, int(eos)] if eos is not None else ids


@dataclass
class Episodes:
    """N trajectories. ``examples[i]`` is the example sequence i answers (one per sequence);
    ``texts[i]`` its decoded completion; ``rewards`` (N,) when the environment already scored it
    (else None: the loop asks the reward source); ``advantage_inputs`` extra keyword arguments for the
    advantage estimator; ``replayed`` (N,) bool marks trajectories injected by a replay buffer."""

    batch: RolloutBatch
    texts: list[str]
    examples: list[Any]
    rewards: torch.Tensor | None = None
    advantage_inputs: dict[str, Any] = field(default_factory=dict)
    replayed: torch.Tensor | None = None

    def __post_init__(self) -> None:
        n = len(self.batch)
        if len(self.texts) != n or len(self.examples) != n:
            raise ValueError(
                f"Episodes: {n} sequences but {len(self.texts)} texts / {len(self.examples)} examples"
            )
        if self.replayed is None:
            self.replayed = torch.zeros(n, dtype=torch.bool)

    def __len__(self) -> int:
        return len(self.batch)

    @staticmethod
    def concat(parts: list[Episodes]) -> Episodes:
        """Merge episode sets, renumbering group ids so groups of different parts stay distinct."""
        if len(parts) == 1:
            return parts[0]
        batches, offset = [], 0
        for p in parts:
            b = p.batch.select(torch.arange(len(p.batch)))
            _, b.group_ids = torch.unique(b.group_ids, return_inverse=True)
            b.group_ids = b.group_ids + offset
            offset = int(b.group_ids.max()) + 1 if len(b) else offset
            batches.append(b)
        rewards = None
        if all(p.rewards is not None for p in parts):
            rewards = torch.cat([p.rewards for p in parts])
        adv_inputs: dict[str, Any] = {}
        if any(p.advantage_inputs for p in parts):
            raise ValueError("Episodes.concat: merging episodes that carry advantage_inputs is not supported")
        return Episodes(
            batch=RolloutBatch.concat(batches),
            texts=[t for p in parts for t in p.texts],
            examples=[e for p in parts for e in p.examples],
            rewards=rewards,
            advantage_inputs=adv_inputs,
            replayed=torch.cat([p.replayed for p in parts]),
        )


class EpisodeRunner(ABC):
    """Produces episodes for a list of examples with ``n_per_prompt[i]`` trajectories each."""

    @abstractmethod
    def run(self, examples: list[Any], n_per_prompt: list[int], params: SamplingParams) -> Episodes: ...


class SingleTurnRunner(EpisodeRunner):
    """One prompt -> one completion per trajectory (the standard RLVR setting)."""

    def __init__(self, engine: RolloutEngine, formatter: PromptFormatter) -> None:
        self.engine = engine
        self.formatter = formatter
        self._cache: dict[str, list[int]] = {}

    def encode(self, prompt: str) -> list[int]:
        ids = self._cache.get(prompt)
        if ids is None:
            ids = self._cache[prompt] = self.formatter.encode(prompt)
        return ids

    def run(self, examples: list[Any], n_per_prompt: list[int], params: SamplingParams) -> Episodes:
        prompt_ids = [self.encode(ex.prompt) for ex in examples]
        batch = self.engine.generate(prompt_ids, n_per_prompt, params)
        texts = self.formatter.tokenizer.batch_decode(batch.completion_lists(), skip_special_tokens=True)
        per_seq = [examples[g] for g in batch.group_ids.tolist()]
        return Episodes(batch=batch, texts=list(texts), examples=per_seq)
