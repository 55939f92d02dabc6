"""The collector: it owns one RL step's rollout, so that :mod:`posttrain.train.rl` holds the loop only.

A :class:`RolloutCollector` turns (step, sampling params) into the step's episodes and a handle on
their rewards, through the hook slots in the order :mod:`posttrain.hooks.base` fixes:

    sampler.plan -> replay.mix + replay.draw (once per step) -> runner.run -> reward_source.submit
    -> [group_filter.decide -> more rounds] -> (episodes, reward handle, rounds)

and :class:`ImportanceWeights` providers give the per-token weights a policy loss multiplies in
(replayed rows: the buffer's ``is_weights``; fresh rows: the engine's sampler/trainer-mismatch
correction). The collector is built complete, from parts built before it
(:func:`posttrain.train.builder.build_rl_parts`); its components are reached as
``trainer.collector.sampler`` etc. (``trainer.collector.runner = ...`` swaps the runner).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Protocol

import torch

from posttrain.hooks import GroupFilter, GroupOutcome, PromptPlan, PromptSampler, ReplayBuffer, Trajectory
from posttrain.rollout import (
    EpisodeRunner,
    Episodes,
    PromptFormatter,
    RewardSource,
    RolloutBatch,
    RolloutEngine,
    SamplingParams,
    ScoredBatch,
)
from posttrain.rollout.episodes import cat_row_inputs
from posttrain.rollout.reward_source import RewardHandle, _Ready
from posttrain.train import dist
from posttrain.utils.errors import InvalidValueError


class RolloutCollector:
    """Owns a step's rollout: ``sampler``, ``replay``, ``group_filter`` (None = one round, rewards
    still being scored when :meth:`collect` returns), ``runner``, ``reward_source``; ``engine``,
    ``formatter`` and ``tokenizer`` rebuild replayed trajectories as rows; ``warn(key, msg, step=,
    force=)`` reports a degenerate step. Every component is given when it is built."""

    def __init__(
        self,
        *,
        sampler: PromptSampler,
        replay: ReplayBuffer,
        group_filter: GroupFilter | None,
        runner: EpisodeRunner,
        reward_source: RewardSource,
        formatter: PromptFormatter,
        tokenizer: Any,
        engine: RolloutEngine,
        prompts_per_step: int,
        group_size: int,
        success_threshold: float,
        warn: Callable[..., None],
    ) -> None:
        self.sampler, self.replay, self.group_filter = sampler, replay, group_filter
        self.runner, self.reward_source = runner, reward_source
        self.formatter, self.tokenizer, self.engine = formatter, tokenizer, engine
        self.prompts_per_step = prompts_per_step
        self.group_size = group_size
        self.success_threshold = success_threshold
        self.warn = warn

    def collect(self, step: int, params: SamplingParams) -> tuple[Episodes, RewardHandle, int]:
        """Sample the step's episodes.

        Contract (``posttrain.hooks.base``): the replay buffer's ``mix`` and ``draw`` run exactly once
        per step, on the first round's plan, before any rollout. Without a group filter: that one
        round, rewards still being scored. With one (DAPO dynamic sampling, arXiv:2503.14476): rounds
        until ``rollout.prompts_per_step`` groups are kept or the filter's ``max_rounds`` is reached;
        the sampler's ``observe_round`` sees each round's groups before the filter decides; later
        rounds are fresh samples only; rewards are known when this returns."""
        filt = self.group_filter
        need, kept_parts, kept_scores, rounds = self.prompts_per_step, [], [], 0
        if filt is not None:
            filt.start_step(step, need)
        last: tuple[Episodes, ScoredBatch] | None = None
        while True:
            rounds += 1
            n_prompts = need if filt is None else math.ceil(need * filt.oversample)
            # every rank plans the global batch and keeps its block of prompts (dist.shard_plan)
            plan = dist.shard_plan(self.sampler.plan(step, n_prompts, self.group_size))
            if rounds == 1:  # replay: once per step, before any rollout
                plan = self.replay.mix(plan, step)
                replayed = self.replay.draw(plan, step)
            else:
                replayed = [[] for _ in plan.examples]
            if filt is not None:
                filt.start_round(plan)
            episodes = self._episodes_for(plan, replayed, params)
            if episodes.rewards is not None:  # the environment scored its own episodes
                handle = _Ready(ScoredBatch(rewards=[float(r) for r in episodes.rewards]))
            else:
                handle = self.reward_source.submit(episodes.texts, episodes.examples)
            if filt is None:
                return episodes, handle, rounds
            res = handle.result()
            last = (episodes, res)
            raw = torch.tensor(res.rewards, dtype=torch.float32)
            outcomes = self.outcomes(episodes, raw)
            self.sampler.observe_round(outcomes, step)
            decisions = filt.decide(outcomes, need)
            gids = torch.unique(episodes.batch.group_ids)
            keep_ids = gids[torch.tensor([d.keep for d in decisions], dtype=torch.bool)]
            rows = torch.isin(episodes.batch.group_ids, keep_ids).nonzero().flatten()
            if len(rows):
                kept_parts.append(episodes.select(rows))
                kept_scores.append(_select_scored(res, rows.tolist()))
                need -= len(keep_ids)
            if need <= 0 or rounds >= filt.max_rounds:
                break
        if not kept_parts:  # nothing informative: train on the last round (zero advantages)
            self.warn(
                "no_groups_kept",
                "the group filter kept no group in any round; training on the last round",
                step=step,
                force=True,
            )
            kept_parts, kept_scores = [last[0]], [last[1]]
        merged = Episodes.concat(kept_parts)
        common = set.intersection(*(set(s.components) for s in kept_scores))
        scores = ScoredBatch(
            rewards=[r for s in kept_scores for r in s.rewards],
            timeouts=sum(s.timeouts for s in kept_scores),
            errors=sum(s.errors for s in kept_scores),
            components={k: [v for s in kept_scores for v in s.components[k]] for k in sorted(common)},
            failures={k: v for s in reversed(kept_scores) for k, v in s.failures.items()},
        )
        return merged, _Ready(scores), rounds

    def _episodes_for(
        self, plan: PromptPlan, replayed: list[list[Trajectory]], params: SamplingParams
    ) -> Episodes:
        """Fresh episodes for the plan, plus the replayed trajectories merged into the same groups."""
        if len(replayed) != len(plan.examples):
            raise InvalidValueError(
                f"replay buffer returned {len(replayed)} lists for {len(plan.examples)} prompts"
            )
        fresh = [n - len(r) for n, r in zip(plan.n_per_prompt, replayed, strict=True)]
        if any(f < 0 for f in fresh):
            raise InvalidValueError("replay buffer returned more trajectories than a group's size")
        if not any(replayed):
            return self.runner.run(plan.examples, fresh, params)
        new = self.runner.run(plan.examples, fresh, params) if sum(fresh) else None
        past = self._replayed_episodes(plan, replayed)
        if new is None:
            return past
        if new.rewards is not None:
            raise InvalidValueError(
                "hooks.replay: replayed trajectories cannot join episodes that the episode runner scored "
                "itself (rewards); use a replay buffer only with runners whose episodes are scored by the "
                "reward source"
            )
        # same group numbering (plan index): concatenate without renumbering
        widths = [new.batch.completion_ids.shape[1], past.batch.completion_ids.shape[1]]
        return Episodes(
            batch=RolloutBatch.concat([new.batch, past.batch]),
            texts=new.texts + past.texts,
            examples=new.examples + past.examples,
            advantage_inputs=cat_row_inputs(
                [new.advantage_inputs, past.advantage_inputs], widths, where="hooks.replay: advantage_inputs"
            ),
            replayed=torch.cat([new.replayed, past.replayed]),
        )

    def _replayed_episodes(self, plan: PromptPlan, replayed: list[list[Trajectory]]) -> Episodes:
        rows = [
            (g, ex, tr)
            for g, (ex, trajs) in enumerate(zip(plan.examples, replayed, strict=True))
            for tr in trajs
        ]
        comps = [tr.completion_ids for _, _, tr in rows]
        with_env = any(tr.action_mask is not None for _, _, tr in rows)
        batch = RolloutBatch.from_token_lists(
            [self.formatter.encode(ex.prompt) for _, ex, _ in rows],
            comps,
            pad_token_id=self.engine.pad_token_id,
            group_ids=[g for g, _, _ in rows],
            finish_reasons=[tr.finish_reason for _, _, tr in rows],
            actions=[tr.action_mask or [1] * len(tr.completion_ids) for _, _, tr in rows]
            if with_env
            else None,
            logprobs=[tr.logp_past for _, _, tr in rows],
        )
        adv_inputs = cat_row_inputs(
            [{k: torch.tensor(v)[None] for k, v in tr.advantage_inputs.items()} for _, _, tr in rows],
            [len(c) for c in comps],
            where="hooks.replay: Trajectory.advantage_inputs",
        )
        texts = self.tokenizer.batch_decode(comps, skip_special_tokens=True)
        examples = [ex for _, ex, _ in rows]
        ones = torch.ones(len(rows), dtype=torch.bool)
        return Episodes(batch, list(texts), examples, advantage_inputs=adv_inputs, replayed=ones)

    def metrics(self) -> dict[str, float]:
        """The collector's own numbers about the latest step (none here; asynchronous rollout:
        staleness, queue depth, utilisation, :mod:`posttrain.train.async_rollout`)."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint must hold beyond the hooks' states (nothing here: a synchronous step
        leaves nothing generated and unconsumed)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""

    def close(self) -> None:
        """Release what the collector started (nothing here; generation workers when asynchronous)."""

    def outcomes(self, episodes: Episodes, raw: torch.Tensor) -> list[GroupOutcome]:
        """One :class:`GroupOutcome` per group of ``episodes`` (raw rewards, correctness, lengths)."""
        correct = raw >= self.success_threshold
        gids = episodes.batch.group_ids
        lengths = episodes.batch.action_lengths.cpu()
        out = []
        for g in torch.unique(gids).tolist():
            rows = (gids == g).nonzero().flatten().tolist()
            out.append(
                GroupOutcome(
                    example=episodes.examples[rows[0]],
                    rewards=[float(raw[i]) for i in rows],
                    correct=[bool(correct[i]) for i in rows],
                    lengths=[int(lengths[i]) for i in rows],
                )
            )
        return out


def _select_scored(res: ScoredBatch, rows: list[int]) -> ScoredBatch:
    return ScoredBatch(
        rewards=[res.rewards[i] for i in rows],
        timeouts=res.timeouts,
        errors=res.errors,
        components={k: [vals[i] for i in rows] for k, vals in res.components.items()},
        failures=res.failures,
    )


# ------------------------------------------------------------------------------ importance weights
class ImportanceWeights(Protocol):
    """A per-token importance-weight provider: ``(rows, logp, old_logp, mask, episodes, batch)`` ->
    (n, T) weights for those rows, or None when it has nothing to weigh in this micro-batch. The
    trainer multiplies the providers' weights and hands the product to the policy loss."""

    def __call__(
        self,
        rows: torch.Tensor,
        logp: torch.Tensor,
        old_logp: torch.Tensor,
        mask: torch.Tensor,
        episodes: Episodes,
        batch: RolloutBatch,
    ) -> torch.Tensor | None: ...


class ReplayWeights:
    """Replayed rows: the buffer's ``is_weights(old_logp, logp_past, mask)`` = π_old / π_past; fresh rows 1.

    The weight uses π_old (the policy that started this step), not the current π_θ: the policy loss
    already multiplies the PPO ratio π_θ / π_old, so the product is π_θ / π_past. With π_θ here the
    ratio would be counted twice from the second minibatch or epoch on (on-policy, one update,
    π_θ = π_old and both agree)."""

    def __init__(self, replay: Callable[[], ReplayBuffer]) -> None:
        self.replay = replay

    def __call__(self, rows, logp, old_logp, mask, episodes, batch):
        if not bool(episodes.replayed.any()):
            return None
        replayed = episodes.replayed.to(logp.device)[rows]
        w = self.replay().is_weights(old_logp.detach(), batch.logprobs[rows], mask)
        return torch.where(replayed[:, None], w, torch.ones_like(w))


class EngineMismatchWeights:
    """Fresh rows: the engine's sampler/trainer-mismatch correction (``rollout_is_weights``, e.g.
    truncated importance sampling, ``posttrain/rollout/vllm.py``); replayed rows 1 (they carry
    past-policy log-probs)."""

    def __init__(self, engine: Callable[[], RolloutEngine]) -> None:
        self.engine = engine

    def __call__(self, rows, logp, old_logp, mask, episodes, batch):
        if batch.logprobs is None:
            return None
        w = self.engine().rollout_is_weights(old_logp, batch.logprobs[rows], mask)
        if w is None:
            return None
        return torch.where(episodes.replayed.to(logp.device)[rows][:, None], torch.ones_like(w), w)


def combine_weights(parts: list[torch.Tensor | None]) -> torch.Tensor | None:
    """The product of the providers' weights (None when none applies)."""
    out = None
    for w in parts:
        if w is not None:
            out = w if out is None else out * w
    return out
