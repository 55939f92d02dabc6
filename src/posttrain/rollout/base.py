"""The rollout engine interface: prompts in, token-level completions out.

An engine turns tokenised prompts into groups of sampled completions. The trainer only sees
:class:`RolloutEngine` and :class:`RolloutBatch`, so a vLLM / SGLang engine can replace the default
:class:`posttrain.rollout.hf.HFEngine` by implementing ``generate`` and ``pad_token_id``.

Two masks describe a completion (as verl's ``attention_mask`` / ``response_mask`` and TRL's
``completion_mask`` / ``tool_mask``):

* ``completion_mask`` — the tokens that EXIST: 1 on every real completion token (policy tokens AND
  environment tokens that a multi-turn runner put between turns), 0 on right padding. The model
  attends to these and position ids count them.
* ``action_mask`` — the tokens the POLICY produced: a subset of ``completion_mask``. Losses, KL,
  entropy, clip fractions and length metrics are taken over these only. ``None`` when constructing
  means "every completion token is an action" (single-turn sampling).

Sampling log-probs (``RolloutBatch.logprobs``) are of the distribution actually sampled from:
``log softmax(z / T)`` restricted to the top-p nucleus (renormalised), with EOS masked while
``min_new_tokens`` / ``suppress_eos`` forbid it. With ``top_p = 1`` and no EOS suppression this equals
the training-side ``sequence_logprobs(..., temperature=T)``, so on-policy ratios start at exactly 1.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from posttrain.utils.errors import InvalidValueError

FINISH_STOP = "stop"
FINISH_LENGTH = "length"


@dataclass(frozen=True)
class SamplingParams:
    """How to sample completions.

    temperature: softmax temperature T (0 = greedy argmax); top_p: nucleus mass (1 = off);
    max_new_tokens: completion length cap; min_new_tokens: EOS forbidden before this many tokens;
    suppress_eos: EOS never sampled (benchmarks that need a fixed number of new tokens);
    seed: seeds the engine's own sampling generator when set (None = keep the engine's stream);
    logprobs: record the per-token sampling log-probs (costs one log-softmax per decode step);
    cancel: an event (``threading.Event``) that stops generation at the next decode step once set
    (``posttrain serve`` sets it when the client disconnects); engines without support ignore it.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 64
    min_new_tokens: int = 0
    suppress_eos: bool = False
    seed: int | None = None
    logprobs: bool = True
    cancel: Any = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not (self.temperature >= 0 and math.isfinite(self.temperature)):
            raise InvalidValueError(
                f"SamplingParams.temperature must be a finite number >= 0, got {self.temperature}"
            )
        if not 0 < self.top_p <= 1:
            raise InvalidValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise InvalidValueError(f"SamplingParams.max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not 0 <= self.min_new_tokens <= self.max_new_tokens:
            raise InvalidValueError(
                f"SamplingParams.min_new_tokens must be in [0, max_new_tokens={self.max_new_tokens}], "
                f"got {self.min_new_tokens}"
            )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


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
    completion_ids (N, T) right-padded; completion_mask (N, T) 0/1: every real completion token
    (1 up to and including EOS; environment tokens of a multi-turn episode included);
    action_mask (N, T) 0/1: the policy's own tokens, a subset of ``completion_mask`` (defaults to
    ``completion_mask``); logprobs (N, T) float32 sampling log-probs of the action tokens (0 elsewhere)
    or None when not recorded; finish_reasons: "stop" (EOS sampled) or "length" (hit the length cap);
    group_ids (N,) long: sequences with the same id are completions of the same prompt.
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    logprobs: torch.Tensor | None
    finish_reasons: list[str]
    group_ids: torch.Tensor
    pad_token_id: int
    action_mask: torch.Tensor | None = None

    def __post_init__(self) -> None:
        n = self.completion_ids.shape[0]
        for name in ("prompt_ids", "prompt_mask", "completion_mask", "group_ids"):
            if getattr(self, name).shape[0] != n:
                raise InvalidValueError(
                    f"RolloutBatch.{name} has {getattr(self, name).shape[0]} rows, expected {n}"
                )
        if self.completion_mask.shape != self.completion_ids.shape:
            raise InvalidValueError("RolloutBatch.completion_mask must have the shape of completion_ids")
        if self.action_mask is None:
            self.action_mask = self.completion_mask
        elif self.action_mask is not self.completion_mask:
            if self.action_mask.shape != self.completion_ids.shape:
                raise InvalidValueError("RolloutBatch.action_mask must have the shape of completion_ids")
            outside = self.action_mask.bool() & ~self.completion_mask.bool()
            if bool(outside.any()):
                row, pos = (int(x) for x in outside.nonzero()[0])
                raise InvalidValueError(
                    f"RolloutBatch.action_mask marks row {row}, completion position {pos}, where "
                    "completion_mask is 0: actions must be real completion tokens"
                )
        if self.logprobs is not None and self.logprobs.shape != self.completion_ids.shape:
            raise InvalidValueError("RolloutBatch.logprobs must have the shape of completion_ids")
        if len(self.finish_reasons) != n:
            raise InvalidValueError(
                f"RolloutBatch.finish_reasons has {len(self.finish_reasons)} entries, expected {n}"
            )

    @classmethod
    def from_token_lists(
        cls,
        prompts: Sequence[Sequence[int]],
        completions: Sequence[Sequence[int]],
        *,
        pad_token_id: int,
        group_ids: Sequence[int],
        finish_reasons: Sequence[str],
        actions: Sequence[Sequence[bool | int]] | None = None,
        logprobs: Sequence[Sequence[float]] | None = None,
    ) -> RolloutBatch:
        """A batch from per-row token lists (what a multi-turn runner or a replay buffer holds).

        ``completions[i]`` is everything after the prompt (policy turns and environment tokens, in
        order); ``actions[i]`` (same length, default all 1) marks the policy's tokens; ``logprobs[i]``
        (same length) their sampling log-probs (environment positions are ignored and stored as 0).
        """
        n = len(completions)
        for name, rows in (
            ("prompts", prompts),
            ("group_ids", group_ids),
            ("finish_reasons", finish_reasons),
        ):
            if len(rows) != n:
                raise InvalidValueError(
                    f"RolloutBatch.from_token_lists: {len(rows)} {name} for {n} completions"
                )
        for name, rows in (("actions", actions), ("logprobs", logprobs)):
            if rows is None:
                continue
            if len(rows) != n:
                raise InvalidValueError(
                    f"RolloutBatch.from_token_lists: {len(rows)} {name} for {n} completions"
                )
            for i, (r, c) in enumerate(zip(rows, completions, strict=True)):
                if len(r) != len(c):
                    raise InvalidValueError(
                        f"RolloutBatch.from_token_lists: {name}[{i}] has {len(r)} entries for a "
                        f"completion of {len(c)} tokens"
                    )
        p_ids, p_mask = pad_left([list(p) for p in prompts], pad_token_id)
        t = max((len(c) for c in completions), default=0)
        c_ids = torch.full((n, t), pad_token_id, dtype=torch.long)
        c_mask = torch.zeros((n, t), dtype=torch.long)
        a_mask = None if actions is None else torch.zeros((n, t), dtype=torch.long)
        lps = None if logprobs is None else torch.zeros((n, t))
        for i, c in enumerate(completions):
            c_ids[i, : len(c)] = torch.tensor(list(c), dtype=torch.long)
            c_mask[i, : len(c)] = 1
            if a_mask is not None:
                a_mask[i, : len(c)] = torch.tensor([int(bool(a)) for a in actions[i]], dtype=torch.long)
            if lps is not None:
                lps[i, : len(c)] = torch.tensor(list(logprobs[i]), dtype=torch.float32)
        if lps is not None and a_mask is not None:
            lps = lps * a_mask
        return cls(
            prompt_ids=p_ids,
            prompt_mask=p_mask,
            completion_ids=c_ids,
            completion_mask=c_mask,
            logprobs=lps,
            finish_reasons=list(finish_reasons),
            group_ids=torch.tensor(list(group_ids), dtype=torch.long),
            pad_token_id=pad_token_id,
            action_mask=a_mask,
        )

    def __len__(self) -> int:
        return self.completion_ids.shape[0]

    @property
    def lengths(self) -> torch.Tensor:
        """Completion tokens per row (policy and environment tokens; the unpadded width)."""
        return self.completion_mask.sum(dim=1)

    @property
    def action_lengths(self) -> torch.Tensor:
        """Policy (action) tokens per row: what length metrics and length-based shaping count."""
        return self.action_mask.sum(dim=1)

    @property
    def truncated(self) -> torch.Tensor:
        return torch.tensor([r == FINISH_LENGTH for r in self.finish_reasons], dtype=torch.bool)

    def group_sizes(self) -> dict[int, int]:
        ids, counts = torch.unique(self.group_ids, return_counts=True)
        return dict(zip(ids.tolist(), counts.tolist(), strict=True))

    def completion_lists(self) -> list[list[int]]:
        """Completion token ids without padding (EOS included when sampled; environment tokens too)."""
        lens = self.lengths.tolist()
        return [row[:n] for row, n in zip(self.completion_ids.tolist(), lens, strict=True)]

    def model_inputs(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(input_ids, attention_mask, action_mask), each (N, P + T): the left-padded prompt followed by
        the completion. ``attention_mask`` is 1 on every real token (prompt, policy and environment
        tokens), so positions match generation; ``action_mask`` is 1 exactly on the policy's tokens (pass
        it as ``sequence_logprobs(..., response_mask=...)``). Slice ``[:, P:]`` of a per-position
        quantity to get it per completion token."""
        dtype = self.prompt_mask.dtype
        input_ids = torch.cat([self.prompt_ids, self.completion_ids], dim=1)
        attention_mask = torch.cat([self.prompt_mask, self.completion_mask.to(dtype)], dim=1)
        action_mask = torch.cat([torch.zeros_like(self.prompt_mask), self.action_mask.to(dtype)], dim=1)
        return input_ids, attention_mask, action_mask

    def _has_env_tokens(self) -> bool:
        return self.action_mask is not self.completion_mask

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
            action_mask=self.action_mask[idx] if self._has_env_tokens() else None,
        )

    def to(self, device: torch.device | str) -> RolloutBatch:
        return replace(
            self,
            prompt_ids=self.prompt_ids.to(device),
            prompt_mask=self.prompt_mask.to(device),
            completion_ids=self.completion_ids.to(device),
            completion_mask=self.completion_mask.to(device),
            logprobs=None if self.logprobs is None else self.logprobs.to(device),
            action_mask=self.action_mask.to(device) if self._has_env_tokens() else None,
        )

    @staticmethod
    def concat(batches: list[RolloutBatch]) -> RolloutBatch:
        """Stack batches (re-padding prompts on the left and completions on the right). Group ids are
        kept as given: callers that merge independent batches must make them disjoint first."""
        if not batches:
            raise InvalidValueError("RolloutBatch.concat needs at least one batch")
        if len(batches) == 1:
            return batches[0]
        pad = batches[0].pad_token_id
        p = max(b.prompt_ids.shape[1] for b in batches)
        t = max(b.completion_ids.shape[1] for b in batches)
        pids, pmask, cids, cmask, amask, lps = [], [], [], [], [], []
        with_lp = all(b.logprobs is not None for b in batches)
        with_env = any(b._has_env_tokens() for b in batches)
        for b in batches:
            i, m = _repad_left(b.prompt_ids, b.prompt_mask, p, pad)
            pids.append(i)
            pmask.append(m)
            cids.append(_repad_right(b.completion_ids, t, pad))
            cmask.append(_repad_right(b.completion_mask, t, 0))
            if with_env:
                amask.append(_repad_right(b.action_mask.to(b.completion_mask.dtype), t, 0))
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
            action_mask=torch.cat(amask) if with_env else None,
        )


def eos_and_pad(tokenizer: Any, eos_token_ids: list[int] | None, engine: str) -> tuple[list[int], int]:
    """An engine's stop ids (given, else the tokenizer's EOS) and its pad id (the tokenizer's pad,
    else the first stop id); ``engine`` names the caller in the error when there is neither."""
    if eos_token_ids is None:
        eos = tokenizer.eos_token_id
        eos_token_ids = [] if eos is None else [int(eos)]
    eos_ids = list(eos_token_ids)
    pad = tokenizer.pad_token_id
    if pad is None:
        if not eos_ids:
            raise InvalidValueError(f"{engine}: the tokenizer has neither a pad nor an EOS token")
        pad = eos_ids[0]
    return eos_ids, int(pad)


def check_generate_args(prompt_ids: list[list[int]], n_per_prompt: list[int]) -> None:
    """What every engine's ``generate`` refuses: mismatched lengths, an empty prompt, a negative count."""
    if len(prompt_ids) != len(n_per_prompt):
        raise InvalidValueError(f"generate: {len(prompt_ids)} prompts but {len(n_per_prompt)} group sizes")
    for i, (p, n) in enumerate(zip(prompt_ids, n_per_prompt, strict=True)):
        if not p:
            raise InvalidValueError(f"generate: prompt {i} is empty")
        if n < 0:
            raise InvalidValueError(f"generate: n_per_prompt[{i}] = {n} is negative")


class RolloutEngine(ABC):
    """Generates completions. Implementations: :class:`posttrain.rollout.hf.HFEngine` (default);
    a vLLM engine implements the same ``generate`` and ``pad_token_id``, plus ``sync_weights`` (push
    trainer weights) and ``state_dict`` / ``load_state_dict`` (sampling RNG, for exact resume).

    The batches an engine returns have every completion token as an action (``action_mask`` None);
    environment tokens enter only through an :class:`~posttrain.rollout.EpisodeRunner`. An engine
    that cannot record sampling log-probs returns ``logprobs=None`` even when asked; the trainer then
    refuses the hooks and losses that need them (``ReplayBuffer.needs_logprobs``, loss input
    ``rollout_logp``).

    ``shares_model``: True when the engine generates with the trainer's module itself (HF, fast), so
    nothing needs syncing after an update; an engine holding its own copy (vLLM) sets it False and
    implements ``sync_weights`` (:mod:`posttrain.train.weight_sync` calls it once per step).
    """

    shares_model: bool = True

    @property
    @abstractmethod
    def pad_token_id(self) -> int:
        """The id that pads prompts (left) and completions (right) in the batches this engine returns;
        the trainer pads batches it builds itself (replayed trajectories) with the same id."""

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

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release what the engine holds outside this object (vLLM's engine core and KV cache); the
        trainer's ``close`` calls it. No-op for in-process engines."""

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:  # noqa: B027 - optional hook
        """Restore what :meth:`state_dict` returned."""


class GeneratorStateMixin:
    """``state_dict`` / ``load_state_dict`` of an in-process engine whose only sampling state is its
    ``torch.Generator`` (``self.generator``): the HF and fast engines."""

    generator: torch.Generator

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        if "generator" in state:
            self.generator.set_state(state["generator"].cpu())
