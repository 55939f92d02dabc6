"""Episodes: what the trainer gets back from acting, single-turn or multi-turn.

The RL loop never calls ``engine.generate`` itself; it asks an :class:`EpisodeRunner` for episodes.
:class:`SingleTurnRunner` (default) formats each prompt, samples ``n_i`` completions with the engine
and decodes them; rewards then come from a :class:`posttrain.rollout.reward_source.RewardSource`.

A multi-turn runner (e.g. an agent talking to a user simulator, as in DuCA's dual-horizon credit
assignment) returns the same :class:`Episodes`: ``batch.completion_ids`` holds the whole conversation
after the prompt — policy turns AND the environment's tokens between them, in order — with
``completion_mask`` 1 on all of them (the policy attends to the environment's replies) and
``action_mask`` 1 only on the policy's tokens (only those carry loss and metrics);
:meth:`RolloutBatch.from_token_lists` builds such a batch from per-row lists. The runner may add
its own ``rewards`` (session rewards) and ``advantage_inputs``: per-row tensors such as
``turn_index`` (N, T) or ``turn_rewards`` (N, K) that the loop passes to the advantage estimator as
keyword arguments. They follow their rows through :meth:`Episodes.select` and
:meth:`Episodes.concat` (group filtering, replay).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from posttrain.rollout.base import RolloutBatch, RolloutEngine, SamplingParams
from posttrain.utils.errors import InvalidValueError


class PromptFormatter:
    """Prompt text -> token ids, identical in rollout, SFT and evaluation.

    template: a ``str.format`` template with one field ``{prompt}`` (the USER text); chat: wrap the
    formatted text as one user message with the tokenizer's chat template
    (``add_generation_prompt=True``), as instruction-tuned checkpoints (Qwen3) expect.
    assistant_prefix: text that opens the ASSISTANT turn, after the generation prompt (e.g. ASRR's
    No-Thinking prefix ``<think>…</think>``, arXiv:2505.15400 Fig. 4): the model continues after it,
    so it is part of the prompt ids (never trained on, never in the completion). When the chat
    template's generation prompt already ends with the prefix's opening tag (R1-Distill templates end
    with ``<think>\n``), that tag is not repeated. Without ``chat`` it is appended to the text.
    """

    def __init__(
        self, tokenizer: Any, *, template: str = "{prompt}", chat: bool = False, assistant_prefix: str = ""
    ) -> None:
        if "{prompt}" not in template:
            raise InvalidValueError(f"prompt template must contain '{{prompt}}', got {template!r}")
        self.tokenizer = tokenizer
        self.template = template
        self.chat = chat
        self.assistant_prefix = assistant_prefix

    def text(self, prompt: str) -> str:
        """The user text (template applied; no chat template, no assistant prefix)."""
        return self.template.replace("{prompt}", prompt)

    def full_text(self, prompt: str) -> str:
        """Everything the model sees before its completion, as text: the chat-wrapped user turn and
        generation prompt (with ``chat``), then the assistant prefix."""
        if not self._is_chat(prompt):
            return self.text(prompt) + self.assistant_prefix
        head = self.tokenizer.apply_chat_template(
            self._turns(prompt), add_generation_prompt=True, tokenize=False
        )
        return head + _dedupe_opening_tag(head, self.assistant_prefix)

    def _is_chat(self, prompt: Any) -> bool:
        """A conversation (``tasks.ChatPrompt``) always goes through the chat template."""
        return self.chat or bool(getattr(prompt, "messages", None))

    def _turns(self, prompt: Any) -> list[dict[str, str]]:
        """The chat turns: the prompt's own messages, or one user turn; the template applies to the last."""
        messages = getattr(prompt, "messages", None)
        turns = [{"role": r, "content": c} for r, c in messages or [("user", prompt)]]
        turns[-1]["content"] = self.text(turns[-1]["content"])
        return turns

    def encode(self, prompt: str) -> list[int]:
        if self._is_chat(prompt) and self.assistant_prefix:
            return [int(i) for i in self.tokenizer.encode(self.full_text(prompt), add_special_tokens=False)]
        if self._is_chat(prompt):
            ids = self.tokenizer.apply_chat_template(
                self._turns(prompt), add_generation_prompt=True, tokenize=True
            )
            if isinstance(ids, dict) or hasattr(ids, "input_ids"):
                ids = ids["input_ids"]
            return [int(i) for i in ids]
        return [
            int(i)
            for i in self.tokenizer.encode(
                self.text(prompt) + self.assistant_prefix, add_special_tokens=False
            )
        ]

    def encode_completion(self, completion: str) -> list[int]:
        """Completion text -> ids followed by EOS (the SFT target)."""
        ids = [int(i) for i in self.tokenizer.encode(completion, add_special_tokens=False)]
        eos = self.tokenizer.eos_token_id
        return [*ids, int(eos)] if eos is not None else ids


def _dedupe_opening_tag(head: str, prefix: str) -> str:
    """``prefix`` without its leading tag (e.g. ``<think>``) when ``head`` already ends with that tag."""
    stripped = prefix.lstrip()
    if stripped.startswith("<") and ">" in stripped:
        tag = stripped[: stripped.index(">") + 1]
        if head.rstrip().endswith(tag):
            return stripped[len(tag) :].lstrip("\n")
    return prefix


def cat_row_inputs(
    parts: list[Mapping[str, torch.Tensor]], widths: list[int], *, where: str = "advantage_inputs"
) -> dict[str, torch.Tensor]:
    """Concatenate per-row tensors of several row sets along dim 0.

    ``widths[j]`` is the completion width (T) of part j. A tensor whose dim 1 equals its part's width
    is per-token and is right-padded with 0 to the widest part; any other tensor is concatenated as is
    (its trailing dims must agree). Every part must carry the same keys.
    """
    if not parts or not any(parts):
        return {}
    keys = set(parts[0])
    for j, p in enumerate(parts):
        if set(p) != keys:
            raise InvalidValueError(
                f"{where}: part {j} has keys {sorted(p)} but part 0 has {sorted(keys)}; every merged "
                "set of episodes must carry the same advantage inputs"
            )
    width = max(widths)
    out = {}
    for k in sorted(keys):
        vals = [p[k] for p in parts]
        per_token = all(v.dim() >= 2 and v.shape[1] == w for v, w in zip(vals, widths, strict=True))
        if per_token:
            vals = [
                torch.cat([v, v.new_zeros((v.shape[0], width - v.shape[1], *v.shape[2:]))], dim=1)
                for v in vals
            ]
        if len({tuple(v.shape[1:]) for v in vals}) > 1:
            shapes = ", ".join(str(tuple(v.shape)) for v in vals)
            raise InvalidValueError(
                f"{where}[{k!r}]: cannot stack shapes {shapes}: a per-token input must have the completion "
                f"width {widths} of its part in dim 1, any other input the same trailing shape"
            )
        out[k] = torch.cat(vals)
    return out


@dataclass
class Episodes:
    """N trajectories. ``examples[i]`` is the example sequence i answers (one per sequence);
    ``texts[i]`` its decoded completion; ``rewards`` (N,) when the environment already scored it
    (else None: the loop asks the reward source); ``advantage_inputs`` extra keyword arguments for the
    advantage estimator, each a tensor with one row per sequence ((N,), (N, T) per completion token,
    or (N, ...)); ``replayed`` (N,) bool marks trajectories injected by a replay buffer; ``row_stats``
    per-row counts the runner reports as step metrics (:meth:`EpisodeRunner.step_metrics`, e.g. tool
    calls per conversation), each an (N,) tensor."""

    batch: RolloutBatch
    texts: list[str]
    examples: list[Any]
    rewards: torch.Tensor | None = None
    advantage_inputs: dict[str, Any] = field(default_factory=dict)
    replayed: torch.Tensor | None = None
    row_stats: dict[str, torch.Tensor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.batch)
        if len(self.texts) != n or len(self.examples) != n:
            raise InvalidValueError(
                f"Episodes: {n} sequences but {len(self.texts)} texts / {len(self.examples)} examples"
            )
        if self.replayed is None:
            self.replayed = torch.zeros(n, dtype=torch.bool)
        if self.rewards is not None and tuple(self.rewards.shape) != (n,):
            raise InvalidValueError(
                f"Episodes: rewards must have shape ({n},), got {tuple(self.rewards.shape)}"
            )
        for k, v in self.advantage_inputs.items():
            if not isinstance(v, torch.Tensor) or v.dim() == 0 or v.shape[0] != n:
                got = f"shape {tuple(v.shape)}" if isinstance(v, torch.Tensor) else type(v).__name__
                raise InvalidValueError(
                    f"Episodes: advantage_inputs[{k!r}] must be a tensor with one row per sequence "
                    f"({n} rows), got {got}"
                )
        for k, v in self.row_stats.items():
            if not isinstance(v, torch.Tensor) or tuple(v.shape) != (n,):
                got = f"shape {tuple(v.shape)}" if isinstance(v, torch.Tensor) else type(v).__name__
                raise InvalidValueError(f"Episodes: row_stats[{k!r}] must be a ({n},) tensor, got {got}")

    def __len__(self) -> int:
        return len(self.batch)

    def select(self, rows: torch.Tensor | list[int]) -> Episodes:
        """The episodes at ``rows`` (in that order), every per-row field included."""
        idx = torch.as_tensor(rows, dtype=torch.long)
        ids = idx.tolist()
        return Episodes(
            batch=self.batch.select(idx),
            texts=[self.texts[i] for i in ids],
            examples=[self.examples[i] for i in ids],
            rewards=None if self.rewards is None else self.rewards[idx],
            advantage_inputs={k: v[idx] for k, v in self.advantage_inputs.items()},
            replayed=self.replayed[idx],
            row_stats={k: v[idx] for k, v in self.row_stats.items()},
        )

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
        adv_inputs = cat_row_inputs(
            [p.advantage_inputs for p in parts],
            [p.batch.completion_ids.shape[1] for p in parts],
            where="Episodes.concat: advantage_inputs",
        )
        return Episodes(
            batch=RolloutBatch.concat(batches),
            texts=[t for p in parts for t in p.texts],
            examples=[e for p in parts for e in p.examples],
            rewards=rewards,
            advantage_inputs=adv_inputs,
            replayed=torch.cat([p.replayed for p in parts]),
            row_stats=cat_row_inputs(
                [p.row_stats for p in parts], [0] * len(parts), where="Episodes.concat: row_stats"
            ),
        )


class EpisodeRunner(ABC):
    """Produces episodes for a list of examples with ``n_per_prompt[i]`` trajectories each."""

    @abstractmethod
    def run(self, examples: list[Any], n_per_prompt: list[int], params: SamplingParams) -> Episodes: ...

    def eval_metrics(self, episodes: Episodes) -> dict[str, Any]:
        """Extra evaluation results for ``episodes`` (this runner's last ``run``), merged into the
        output of :func:`posttrain.train.evaluate.run_eval` (a multi-turn runner reports e.g. its
        environment's conversion rate and transcripts). Default: none."""
        return {}

    def step_metrics(self, episodes: Episodes) -> dict[str, float]:
        """Numbers the RL loop logs at every step for the step's ``episodes`` (after filtering; read
        from their ``row_stats``, so they follow the rows), e.g. ``tool_call_rate``. Default: none."""
        return {}


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
