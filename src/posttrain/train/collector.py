"""The collector: it owns one RL step's rollout, so that :mod:`posttrain.train.rl` holds the loop only.

A :class:`RolloutCollector` turns (step, sampling params) into the step's episodes and a handle on
their rewards, through the hook slots in the order :mod:`posttrain.hooks.base` fixes:

    sampler.plan -> replay.mix + replay.draw (once per step) -> source.draw -> score
    -> [group_filter.decide -> more rounds] -> (episodes, reward handle, rounds)

Where the groups come from is a :class:`GroupSource`: :class:`LocalSource` runs the episode runner in
this process on the plan the collector hands it (synchronous RL); the generation workers of
asynchronous rollout (:class:`posttrain.train.async_rollout.WorkerSource`) plan at dispatch time, ahead
of the trainer, and return groups within the staleness bound. The sampler, the replay buffer, the
filter rounds with their fallback, scoring (the reward source, or the environment's own rewards) and
the merge of the kept groups' scores exist once, here, whichever source draws. The collector is built
complete, from parts built before it (:func:`posttrain.train.builder.build_rl_parts`); its components
are reached as ``trainer.collector.sampler`` etc. (``trainer.collector.runner = ...`` swaps the local
source's runner). Importance weights are in :mod:`posttrain.train.correction`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Protocol

import torch

from posttrain.hooks import (
    GroupFilter,
    GroupOutcome,
    NoReplay,
    PromptPlan,
    PromptSampler,
    ReplayBuffer,
    Trajectory,
)
from posttrain.rollout import (
    EpisodeRunner,
    Episodes,
    PromptFormatter,
    RewardSource,
    RolloutBatch,
    SamplingParams,
    ScoredBatch,
)
from posttrain.rollout.episodes import cat_row_inputs
from posttrain.rollout.reward_source import RewardHandle, _Ready
from posttrain.train import dist
from posttrain.utils.errors import InvalidValueError

#: ``plan(n) -> (plan, replayed)``: the prompts of a round and the replayed trajectories of each group.
Planner = Callable[[int], tuple[PromptPlan, list[list[Trajectory]]]]
#: ``score(episodes) -> handle``: rewards submitted (or the environment's own, ready).
Scorer = Callable[[Episodes], RewardHandle]


class GroupSource(Protocol):
    """Where a step's groups come from. ``draw(step, n, params, plan, score)`` returns ``n`` groups
    (fewer only when the plan had fewer prompts): their prompt plan, their episodes (group ids index the
    plan) and the handle on their rewards; a source calls ``plan(k)`` for the prompts it generates (when it generates them) and
    ``score(episodes)`` on what it generated. ``supports_replay``: whether replayed trajectories can join
    its groups. ``kept(n)``: the collector trained on ``n`` of the groups drawn this step (the filter's
    verdict). ``step_metrics(episodes)``: the episode runner's own numbers about the trained episodes. ``metrics``, ``state_dict`` / ``load_state_dict`` and ``close`` as the collector's."""

    supports_replay: bool

    def draw(
        self, step: int, n: int, params: SamplingParams, plan: Planner, score: Scorer
    ) -> tuple[PromptPlan, Episodes, RewardHandle]: ...

    def kept(self, n: int) -> None: ...

    def step_metrics(self, episodes: Episodes) -> dict[str, float]: ...

    def metrics(self) -> dict[str, float]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


def score_episodes(reward_source: RewardSource, episodes: Episodes) -> RewardHandle:
    """The handle on ``episodes``' rewards: the environment's own when the runner scored them, else
    submitted to ``reward_source`` (scored in the background)."""
    if episodes.rewards is not None:
        return _Ready(ScoredBatch(rewards=[float(r) for r in episodes.rewards]))
    return reward_source.submit(episodes.texts, episodes.examples)


def merge_scored(parts: list[tuple[ScoredBatch, list[int]]], *, count: list[bool] | None = None) -> ScoredBatch:
    """One :class:`ScoredBatch` of the rows ``rows`` of each scored batch, in order: rewards and the
    components every part has; failure counts and messages of the parts whose ``count`` is True (all
    by default: a batch's failures are counted once, by the first step that uses any of its rows)."""
    count = [True] * len(parts) if count is None else count
    common = set.intersection(*(set(s.components) for s, _ in parts)) if parts else set()
    counted = [s for (s, _), c in zip(parts, count, strict=True) if c]
    return ScoredBatch(
        rewards=[s.rewards[i] for s, rows in parts for i in rows],
        timeouts=sum(s.timeouts for s in counted),
        errors=sum(s.errors for s in counted),
        components={k: [s.components[k][i] for s, rows in parts for i in rows] for k in sorted(common)},
        failures={k: v for s in reversed(counted) for k, v in s.failures.items()},
    )


class LocalSource:
    """Groups generated in this process by ``runner`` on the collector's plan, replayed trajectories
    merged into their groups (rebuilt as rows with ``formatter``, its tokenizer and ``pad_token_id``)."""

    supports_replay = True

    def __init__(self, runner: EpisodeRunner, formatter: PromptFormatter, pad_token_id: int) -> None:
        self.runner, self.formatter, self.pad_token_id = runner, formatter, pad_token_id

    def draw(
        self, step: int, n: int, params: SamplingParams, plan: Planner, score: Scorer
    ) -> tuple[PromptPlan, Episodes, RewardHandle]:
        p, replayed = plan(n)
        episodes = self._episodes_for(p, replayed, params)
        return p, episodes, score(episodes)

    def kept(self, n: int) -> None:
        """Nothing to account for: a synchronous round leaves nothing generated and unconsumed."""

    def step_metrics(self, episodes: Episodes) -> dict[str, float]:
        """The runner's own numbers about the step's episodes (tool calls, multi-agent metrics)."""
        return self.runner.step_metrics(episodes)

    def metrics(self) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("pending"):
            raise InvalidValueError(
                f"--resume: the checkpoint was written by asynchronous rollout and holds {len(state['pending'])} "
                "groups that were dispatched but not yet trained on; a synchronous run "
                "(rollout.max_staleness=0) cannot generate them, so resuming would silently drop their prompts. "
                "Resume with the checkpoint's rollout.max_staleness"
            )

    def close(self) -> None:
        """Nothing started here."""

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
            pad_token_id=self.pad_token_id,
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
        texts = self.formatter.tokenizer.batch_decode(comps, skip_special_tokens=True)
        examples = [ex for _, ex, _ in rows]
        ones = torch.ones(len(rows), dtype=torch.bool)
        return Episodes(batch, list(texts), examples, advantage_inputs=adv_inputs, replayed=ones)

class RolloutCollector:
    """Owns a step's rollout: ``sampler``, ``replay``, ``group_filter`` (None = one round, rewards
    still being scored when :meth:`collect` returns), the group ``source``, ``reward_source``;
    ``warn(key, msg, step=, force=)`` reports a degenerate step. Every component is given when it is
    built."""

    def __init__(
        self,
        *,
        source: GroupSource,
        sampler: PromptSampler,
        replay: ReplayBuffer,
        group_filter: GroupFilter | None,
        reward_source: RewardSource,
        prompts_per_step: int,
        group_size: int,
        success_threshold: float,
        warn: Callable[..., None],
    ) -> None:
        if not source.supports_replay and not isinstance(replay, NoReplay):
            raise InvalidValueError(
                f"hooks.replay {type(replay).__name__}: the group source {type(source).__name__} cannot merge "
                "replayed trajectories into its groups (asynchronous rollout); use rollout.max_staleness=0"
            )
        self.source, self.sampler, self.replay, self.group_filter = source, sampler, replay, group_filter
        self.reward_source = reward_source
        self.prompts_per_step = prompts_per_step
        self.group_size = group_size
        self.success_threshold = success_threshold
        self.warn = warn

    @property
    def runner(self) -> EpisodeRunner:
        """The local source's episode runner (settable: tests and recipes wrap it)."""
        if not isinstance(self.source, LocalSource):
            raise AttributeError(f"the group source {type(self.source).__name__} has no local runner")
        return self.source.runner

    @runner.setter
    def runner(self, runner: EpisodeRunner) -> None:
        if not isinstance(self.source, LocalSource):
            raise AttributeError(f"the group source {type(self.source).__name__} has no local runner")
        self.source.runner = runner

    def collect(self, step: int, params: SamplingParams) -> tuple[Episodes, RewardHandle, int]:
        """Sample the step's episodes.

        Contract (``posttrain.hooks.base``): the replay buffer's ``mix`` and ``draw`` run exactly once
        per step, on the first round's plan, before any rollout. Without a group filter: that one
        round, rewards still being scored. With one (DAPO dynamic sampling, arXiv:2503.14476): rounds
        of ``ceil(need · oversample)`` groups until ``rollout.prompts_per_step`` groups are kept or the
        filter's ``max_rounds`` is reached; the sampler's ``observe_round`` sees each round's groups
        before the filter decides; later rounds are fresh samples only; rewards are known when this
        returns."""
        filt = self.group_filter
        need, kept, rounds = self.prompts_per_step, [], 0
        if filt is not None:
            filt.start_step(step, need)
        last: tuple[Episodes, ScoredBatch] | None = None
        while True:
            rounds += 1
            n_prompts = need if filt is None else math.ceil(need * filt.oversample)
            plan = self._planner(step, first=rounds == 1)
            drawn, episodes, handle = self.source.draw(step, n_prompts, params, plan, self._score)
            if filt is None:
                self.source.kept(_n_groups(episodes))
                return episodes, handle, rounds
            filt.start_round(drawn)
            res = handle.result()
            last = (episodes, res)
            raw = torch.tensor(res.rewards, dtype=torch.float32)
            outcomes = self.outcomes(episodes, raw)
            self.sampler.observe_round(outcomes, step)
            decisions = filt.decide(outcomes, need)
            gids = torch.unique(episodes.batch.group_ids)
            keep_ids = gids[torch.tensor([d.keep for d in decisions], dtype=torch.bool)]
            rows = torch.isin(episodes.batch.group_ids, keep_ids).nonzero().flatten()
            self.source.kept(len(keep_ids))
            if len(rows):
                kept.append((episodes.select(rows), (res, rows.tolist())))
                need -= len(keep_ids)
            if need <= 0 or rounds >= filt.max_rounds:
                break
        if not kept:  # nothing informative: train on the last round (zero advantages)
            self.warn(
                "no_groups_kept",
                "the group filter kept no group in any round; training on the last round",
                step=step,
                force=True,
            )
            kept = [(last[0], (last[1], list(range(len(last[1].rewards)))))]
        merged = Episodes.concat([e for e, _ in kept])
        return merged, _Ready(merge_scored([s for _, s in kept])), rounds

    def _planner(self, step: int, *, first: bool) -> Planner:
        """``plan(n)``: the sampler's ``n`` prompts of this step (every rank keeps its block,
        :func:`dist.shard_plan`); on the step's first round the replay buffer mixes into the plan and
        draws its trajectories, once per step, before any rollout."""

        def plan(n: int) -> tuple[PromptPlan, list[list[Trajectory]]]:
            p = dist.shard_plan(self.sampler.plan(step, n, self.group_size))
            if first:
                p = self.replay.mix(p, step)
                return p, self.replay.draw(p, step)
            return p, [[] for _ in p.examples]

        return plan

    def _score(self, episodes: Episodes) -> RewardHandle:
        return score_episodes(self.reward_source, episodes)

    def metrics(self) -> dict[str, float]:
        """The source's own numbers about the latest step (asynchronous rollout: staleness, queue depth,
        utilisation; none for the local source)."""
        return self.source.metrics()

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint must hold beyond the hooks' states: the source's (asynchronous rollout: the
        groups dispatched and not yet trained on; nothing for the local source)."""
        return self.source.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        self.source.load_state_dict(state)

    def close(self) -> None:
        """Release what the source started (generation workers when asynchronous)."""
        self.source.close()

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


def _n_groups(episodes: Episodes) -> int:
    return len(torch.unique(episodes.batch.group_ids))


def _select_scored(res: ScoredBatch, rows: list[int]) -> ScoredBatch:
    return ScoredBatch(
        rewards=[res.rewards[i] for i in rows],
        timeouts=res.timeouts,
        errors=res.errors,
        components={k: [vals[i] for i in rows] for k, vals in res.components.items()},
        failures=res.failures,
    )
