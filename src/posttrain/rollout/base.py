"""The rollout engine interface: prompts in, token-level completions out.

An engine turns tokenised prompts into groups of sampled completions. The trainer only sees
:class:`RolloutEngine` and :class:`RolloutBatch`, so a vLLM / SGLang engine can replace the default
:class:`posttrain.rollout.hf.HFEngine` by implementing one method (``generate``).

Sampling log-probs (``RolloutBatch.logprobs``) are of the distribution actually sampled from:
``log softmax(z / T)`` restricted to the top-p nucleus (renormalised), with EOS masked while
``min_new_tokens`` / ``suppress_eos`` forbid it. With ``top_p = 1`` and no EOS suppression this equals
the training-side ``sequence_logprobs(..., temperature=T)``, so on-policy ratios start at exactly 1.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field, replace

import torch

FINISH_STOP = "stop"
FINISH_LENGTH = "length"


@dataclass(frozen=True)
class SamplingParams:
    """How to sample completions.

    temperature: softmax temperature T (0 = greedy argmax); top_p: nucleus mass (1 = off);
    max_new_tokens: completion length cap; min_new_tokens: EOS forbidden before this many tokens;
    suppress_eos: EOS never sampled (benchmarks that need a fixed number of new tokens);
    seed: seeds the engine's own sampling generator when set (None = keep the engine's stream);
    logprobs: record the per-token sampling log-probs (costs one log-softmax per decode step).
    """

    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 64
    min_new_tokens: int = 0
    suppress_eos: bool = False
    seed: int | None = None
    logprobs: bool = True

    def __post_init__(self) -> None:
        if not (self.temperature >= 0 and math.isfinite(self.temperature)):
            raise ValueError(
                f"SamplingParams.temperature must be a finite number >= 0, got {self.temperature}"
            )
        if not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"SamplingParams.max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not 0 <= self.min_new_tokens <= self.max_new_tokens:
            raise ValueError(
                f"SamplingParams.min_new_tokens must be in [0, max_new_tokens={self.max_new_tokens}], "
                f"got {self.min_new_tokens}"
            )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def with_(self, **changes) -> SamplingParams:
        return replace(self, **changes)


def pad_left(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token lists to one (N, P) LongTensor plus its 0/1 attention mask."""
    width = max((len(s) for s in seqs), default=0)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        if s:
            ids[i, width - len(s) :] = torch.tensor(s, dtype=torch.long)
            mask[i, width - len(s) :] = 1
    return ids, mask


def _repad_left(
    ids: torch.Tensor, mask: torch.Tensor, width: int, pad_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    extra = width - ids.shape[1]
    if extra == 0:
        return ids, mask
    return (
        torch.cat([ids.new_full((ids.shape[0], extra), pad_id), ids], dim=1),
        torch.cat([mask.new_zeros((mask.shape[0], extra)), mask], dim=1),
    )


def _repad_right(x: torch.Tensor, width: int, value: float | int) -> torch.Tensor:
    extra = width - x.shape[1]
    if extra == 0:
        return x
    return torch.cat([x, x.new_full((x.shape[0], extra), value)], dim=1)


@dataclass
class RolloutBatch:
    """N sampled sequences, grouped by prompt (groups may have different sizes).

    prompt_ids (N, P) left-padded with ``pad_token_id``, prompt_mask (N, P) 0/1;
    completion_ids (N, T) right-padded, completion_mask (N, T) 0/1 (1 up to and including EOS);
    logprobs (N, T) float32 sampling log-probs (0 on padding) or None when not requested;
    finish_reasons: "stop" (EOS sampled) or "length" (hit max_new_tokens); group_ids (N,) long:
    sequences with the same id are completions of the same prompt.
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    logprobs: torch.Tensor | None
    finish_reasons: list[str]
    group_ids: torch.Tensor
    pad_token_id: int
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = self.completion_ids.shape[0]
        for name in ("prompt_ids", "prompt_mask", "completion_mask", "group_ids"):
            if getattr(self, name).shape[0] != n:
                raise ValueError(f"RolloutBatch.{name} has {getattr(self, name).shape[0]} rows, expected {n}")
        if self.completion_mask.shape != self.completion_ids.shape:
            raise ValueError("RolloutBatch.completion_mask must have the shape of completion_ids")
        if self.logprobs is not None and self.logprobs.shape != self.completion_ids.shape:
            raise ValueError("RolloutBatch.logprobs must have the shape of completion_ids")
        if len(self.finish_reasons) != n:
            raise ValueError(
                f"RolloutBatch.finish_reasons has {len(self.finish_reasons)} entries, expected {n}"
            )

    def __len__(self) -> int:
        return self.completion_ids.shape[0]

    @property
    def lengths(self) -> torch.Tensor:
        return self.completion_mask.sum(dim=1)

    @property
    def truncated(self) -> torch.Tensor:
        return torch.tensor([r == FINISH_LENGTH for r in self.finish_reasons], dtype=torch.bool)

    def group_sizes(self) -> dict[int, int]:
        ids, counts = torch.unique(self.group_ids, return_counts=True)
        return dict(zip(ids.tolist(), counts.tolist(), strict=True))

    def completion_lists(self) -> list[list[int]]:
        """Completion token ids without padding (EOS included when sampled)."""
        lens = self.lengths.tolist()
        return [row[:n] for row, n in zip(self.completion_ids.tolist(), lens, strict=True)]

    def model_inputs(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(input_ids, attention_mask, response_mask), each (N, P + T): the left-padded prompt followed
        by the completion; ``response_mask`` is 1 exactly on completion tokens. Slice ``[:, P:]`` of a
        per-position quantity to get it per completion token."""
        input_ids = torch.cat([self.prompt_ids, self.completion_ids], dim=1)
        attention_mask = torch.cat([self.prompt_mask, self.completion_mask.to(self.prompt_mask.dtype)], dim=1)
        response_mask = torch.cat(
            [torch.zeros_like(self.prompt_mask), self.completion_mask.to(self.prompt_mask.dtype)], dim=1
        )
        return input_ids, attention_mask, response_mask

    def select(self, index: torch.Tensor | list[int]) -> RolloutBatch:
        idx = torch.as_tensor(index, dtype=torch.long)
        reasons = [self.finish_reasons[i] for i in idx.tolist()]
        return RolloutBatch(
            prompt_ids=self.prompt_ids[idx],
            prompt_mask=self.prompt_mask[idx],
            completion_ids=self.completion_ids[idx],
            completion_mask=self.completion_mask[idx],
            logprobs=None if self.logprobs is None else self.logprobs[idx],
            finish_reasons=reasons,
            group_ids=self.group_ids[idx],
            pad_token_id=self.pad_token_id,
            meta=dict(self.meta),
        )

    def to(self, device: torch.device | str) -> RolloutBatch:
        return replace(
            self,
            prompt_ids=self.prompt_ids.to(device),
            prompt_mask=self.prompt_mask.to(device),
            completion_ids=self.completion_ids.to(device),
            completion_mask=self.completion_mask.to(device),
            logprobs=None if self.logprobs is None else self.logprobs.to(device),
        )

    @staticmethod
    def concat(batches: list[RolloutBatch]) -> RolloutBatch:
        """Stack batches (re-padding prompts on the left and completions on the right). Group ids are
        kept as given: callers that merge independent batches must make them disjoint first."""
        if not batches:
            raise ValueError("RolloutBatch.concat needs at least one batch")
        if len(batches) == 1:
            return batches[0]
        pad = batches[0].pad_token_id
        p = max(b.prompt_ids.shape[1] for b in batches)
        t = max(b.completion_ids.shape[1] for b in batches)
        pids, pmask, cids, cmask, lps = [], [], [], [], []
        with_lp = all(b.logprobs is not None for b in batches)
        for b in batches:
            i, m = _repad_left(b.prompt_ids, b.prompt_mask, p, pad)
            pids.append(i)
            pmask.append(m)
            cids.append(_repad_right(b.completion_ids, t, pad))
            cmask.append(_repad_right(b.completion_mask, t, 0))
            if with_lp:
                lps.append(_repad_right(b.logprobs, t, 0.0))
        return RolloutBatch(
            prompt_ids=torch.cat(pids),
            prompt_mask=torch.cat(pmask),
            completion_ids=torch.cat(cids),
            completion_mask=torch.cat(cmask),
            logprobs=torch.cat(lps) if with_lp else None,
            finish_reasons=[r for b in batches for r in b.finish_reasons],
            group_ids=torch.cat([b.group_ids for b in batches]),
            pad_token_id=pad,
        )


class RolloutEngine(ABC):
    """Generates completions. Implementations: :class:`posttrain.rollout.hf.HFEngine` (default);
    a vLLM engine implements the same ``generate`` plus ``sync_weights`` (push trainer weights)."""

    @abstractmethod
    def generate(
        self, prompt_ids: list[list[int]], n_per_prompt: list[int], params: SamplingParams
    ) -> RolloutBatch:
        """Sample ``n_per_prompt[i]`` completions of ``prompt_ids[i]``; sequences of prompt i get
        group id i. Prompts with ``n_per_prompt[i] == 0`` produce no rows."""

    def sync_weights(self, model: torch.nn.Module) -> None:  # noqa: B027 - optional hook
        """Make the engine sample from ``model``'s current weights (no-op for in-process engines)."""

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Sampling RNG state, for exact resume."""
        return {}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:  # noqa: B027 - optional hook
        """Restore what :meth:`state_dict` returned."""
