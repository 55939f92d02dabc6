"""Online preference pairs (online / on-policy DPO): :class:`OnlinePairs`, a
:class:`~posttrain.train.preference_data.PairSource` that samples its pairs from the CURRENT policy.

One round: the next ``prompts_per_step`` prompts of the task's train split (epoch-wise shuffled, as
SFT and offline pairs), ``group_size`` completions of each sampled by posttrain's rollout (an engine and
episode runner built by :class:`~posttrain.rollout.RolloutSpec`, nothing else), each completion scored by
a reward source (:func:`~posttrain.rollout.build_reward_source`: a verifier, the guarded instruction
reward ``instructions_guarded``, PaTaRM's judge through the ``judged`` source, a plug-in). Each group
gives one pair, its best completion (highest reward) as ``chosen`` and its worst (lowest) as
``rejected``; ties are broken by the sample's index in the group (the first of the equally best, the
first of the equally worst), so the pairs are a function of the samples and rewards alone. A group
whose rewards are all equal (max == min) has no preference and is skipped (counted). Rounds repeat
until the step has its ``n`` pairs or ``max_rounds`` rounds were sampled; a step may therefore train on
fewer pairs than ``batch_size`` (``pairs/n``), and pairs beyond ``n`` of the last round are dropped
(``pairs/dropped``).

This is the recipe of TRL's experimental online DPO (``OnlineDPOTrainer``: completions of the current
policy ranked by a reward model or judge) and of iterative / on-policy DPO with best-vs-worst pairs
(Xiong et al., arXiv:2312.16682; Dong et al., RLHF Workflow, arXiv:2405.07863, Sec. 3: the highest and
lowest reward of n samples per prompt). Unlike both, a group without a margin is skipped rather than
ranked arbitrarily.

The engine samples from the policy as it is at that step: HF and fast engines generate with the
trainer's own module (``engine.shares_model``); an engine that holds its own copy (vLLM) gets
``engine.sync_weights(model)`` before every round. Reference log-probs of the new pairs are computed by
the trainer (the initial policy). ``state_dict`` holds the prompt order's position and the engine's
sampling RNG, so a resumed run samples the same completions (bitwise resume).

Step metrics (:meth:`OnlinePairs.step_metrics`): ``pairs/n``, ``pairs/groups``, ``pairs/groups_kept``,
``pairs/groups_skipped_no_margin``, ``pairs/margin_mean`` (mean reward of chosen minus rejected),
``pairs/reward_mean`` (over every sampled completion), ``pairs/chosen_reward_mean``,
``pairs/rejected_reward_mean``, ``pairs/completions`` (generated this step), ``pairs/rounds``,
``pairs/dropped``, ``pairs/chosen_len_mean``, ``pairs/rejected_len_mean``, the reward source's failures
(``reward_errors``, ``reward_timeouts``) and the mean of each reward component as ``reward/<name>`` (as
RL logs them: e.g. ``reward/hacked`` of the guarded reward).
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
from typing import Any, Literal

import torch
from pydantic import Field, field_validator

from posttrain.train.config import (
    ComponentSpec,
    RewardConfig,
    TaskConfig,
    check_component_spec,
    default_component_name,
)
from posttrain.train.preference_data import EncodedPair
from posttrain.utils.config import StrictModel
from posttrain.utils.data import EpochShuffler
from posttrain.utils.errors import InvalidValueError, PosttrainRuntimeError

__all__ = ["OnlineConfig", "OnlinePairs", "best_vs_worst"]


class OnlineConfig(StrictModel):
    """``online`` section of :class:`~posttrain.train.preference.PreferenceConfig` (module docstring)."""

    enabled: bool = False
    """Train on pairs sampled from the current policy each step (``posttrain dpo online.enabled=true``)
    instead of a preference file (``data``)."""
    prompts_per_step: int = Field(8, ge=1)
    """Prompts sampled per round (one group, so at most one pair, each)."""
    group_size: int = 4
    """Completions sampled per prompt; the pair is the group's best and worst."""
    max_rounds: int = Field(1, ge=1)
    """Rounds of ``prompts_per_step`` prompts at most per step, until ``batch_size`` pairs have a margin."""
    temperature: float = Field(1.0, gt=0)
    top_p: float = Field(1.0, gt=0, le=1)
    max_new_tokens: int = Field(16, ge=1)
    max_batch_size: int | None = Field(None, ge=1)
    """Generate at most this many sequences at once (None = a round in one call)."""
    overlong_prompts: Literal["error", "skip"] = "error"
    """A prompt longer than the model's context minus ``max_new_tokens``: an error naming the row, or skip."""
    engine: ComponentSpec = ComponentSpec(name="hf")
    """Rollout engine (``posttrain.rollout.ENGINES``), as ``rollout.engine`` of an RL run."""
    runner: ComponentSpec = ComponentSpec(name="single-turn")
    """Episode runner (``posttrain.rollout.RUNNERS``); its episodes must be single-turn (no environment
    tokens between the policy's, which a pair's loss would train on)."""
    task: TaskConfig = TaskConfig()
    """Where the prompts come from (its train split) and its prompt format, as ``task`` of an RL run."""
    reward: RewardConfig = RewardConfig()
    """How completions are scored, as ``reward`` of an RL run (name, params, source, workers)."""

    @field_validator("group_size")
    @classmethod
    def _two_at_least(cls, v: int) -> int:
        if v < 2:
            raise InvalidValueError(
                f"must be >= 2, got {v}: a pair is the best and the worst completion of a prompt's group, so a "
                "group needs two completions at least (4 to 8 is usual)"
            )
        return v

    @field_validator("engine", "runner", mode="before")
    @classmethod
    def _fill_name(cls, v: Any, info: Any) -> Any:
        return default_component_name(v, cls.model_fields[info.field_name].default.name)

    @field_validator("engine", "runner")
    @classmethod
    def _known(cls, v: ComponentSpec, info: Any) -> ComponentSpec:
        from posttrain.rollout.registry import ENGINES, RUNNERS

        return check_component_spec(v, ENGINES if info.field_name == "engine" else RUNNERS, skip_positional=1)

    def rollout_spec(self, precision: str) -> Any:
        """The :class:`~posttrain.rollout.RolloutSpec` of this section: ``RLConfig.rollout_spec``'s own
        mapping, with this section as the run's ``rollout`` (same field names) and ``task``."""
        from types import SimpleNamespace

        from posttrain.train.config import RLConfig

        return RLConfig.rollout_spec(SimpleNamespace(task=self.task, rollout=self), precision)  # type: ignore[arg-type]

    def sampling(self) -> Any:
        from posttrain.rollout.base import SamplingParams

        return SamplingParams(
            temperature=self.temperature, top_p=self.top_p, max_new_tokens=self.max_new_tokens, logprobs=True
        )


def best_vs_worst(rewards: list[float]) -> tuple[int, int] | None:
    """(index of the best, index of the worst) of one group's rewards, or None when they are all equal
    (no margin). Ties: the first of the equally best and the first of the equally worst."""
    hi, lo = max(rewards), min(rewards)
    if not hi > lo:
        return None
    return rewards.index(hi), rewards.index(lo)


def _tensors_to_text(state: dict[str, torch.Tensor]) -> str:
    buf = io.BytesIO()
    torch.save({k: v.cpu() for k, v in state.items()}, buf)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _text_to_tensors(text: str) -> dict[str, torch.Tensor]:
    return torch.load(io.BytesIO(base64.b64decode(text)), weights_only=True)


class OnlinePairs:
    """Best-vs-worst pairs of groups sampled from ``model`` each step (module docstring).

    ``rollout``: a built :class:`~posttrain.rollout.Rollout` (engine, runner, formatter) over the
    trainer's model; ``examples``: the prompts (task examples with ``prompt``); ``reward_source``: a
    :class:`~posttrain.rollout.RewardSource` (closed by :meth:`close` when ``owns_reward_source``);
    ``model``: the policy module (synced into an engine that holds its own copy)."""

    def __init__(
        self,
        rollout: Any,
        examples: list[Any],
        reward_source: Any,
        *,
        model: Any,
        group_size: int,
        prompts_per_step: int,
        sampling: Any,
        max_rounds: int = 1,
        seed: int = 0,
        describe: dict[str, Any] | None = None,
        owns_reward_source: bool = False,
        max_failed_frac: float = 1.0,
    ) -> None:
        from posttrain.rewards.failures import RewardFailureMonitor

        if not examples:
            raise InvalidValueError("OnlinePairs: no prompts to sample from")
        if group_size < 2:
            raise InvalidValueError(f"OnlinePairs: group_size must be >= 2, got {group_size}")
        self.engine, self.runner, self.formatter = rollout.engine, rollout.runner, rollout.formatter
        self.examples, self.reward_source, self.model = examples, reward_source, model
        self.group_size, self.prompts_per_step, self.max_rounds = group_size, prompts_per_step, max_rounds
        self.sampling = sampling
        self.owns_reward_source = owns_reward_source
        self.failures = RewardFailureMonitor(max_failed_frac)
        self.shuffler = EpochShuffler(len(examples), seed=seed, order="stream")
        self.rounds_done = 0
        self._metrics: dict[str, float] = {}
        h = hashlib.sha256(
            json.dumps(
                {
                    "online": describe or {},
                    "group_size": group_size,
                    "prompts_per_step": prompts_per_step,
                    "max_rounds": max_rounds,
                    "sampling": [sampling.temperature, sampling.top_p, sampling.max_new_tokens],
                },
                sort_keys=True,
                default=str,
            ).encode()
        )
        for ex in examples:
            h.update(json.dumps([ex.prompt, self.formatter.encode(ex.prompt)]).encode())
        self.fingerprint = "online:" + h.hexdigest()

    @classmethod
    def from_config(cls, online: OnlineConfig, lm: Any, *, precision: str, seed: int) -> OnlinePairs:
        """The source an ``online`` config section describes, over the policy ``lm`` (a model adapter):
        the task's train split (prompts that fit the context), the rollout its ``RolloutSpec`` builds
        (sampling seed ``seed + 1``, as RL's), the reward source of ``online.reward``."""
        from posttrain.rewards import get_reward
        from posttrain.rollout import RewardSourceContext, build_reward_source
        from posttrain.tasks import get_task
        from posttrain.train.lengths import bound_prompts, check_splits, model_context

        task = get_task(online.task.name, **online.task.params)
        examples = check_splits(task, needs_heldout=False)
        spec = online.rollout_spec(precision)
        rollout = spec.build(lm.model, lm.tokenizer, seed=seed + 1, runner_seed=seed)
        examples, _ = bound_prompts(
            examples,
            rollout.formatter.encode,
            context=model_context(lm.model),
            max_new_tokens=online.max_new_tokens,
            policy=online.overlong_prompts,
            where=f"online.task {online.task.name!r}: train split",
        )
        r = online.reward
        reward_fn = get_reward(r.name or task.default_reward, **r.params)
        ctx = RewardSourceContext(
            reward_fn, task, lm.tokenizer, num_workers=r.num_workers, timeout_s=r.timeout_s, seed=seed
        )
        source = build_reward_source(r.source.name, r.source.params, ctx)
        describe = online.model_dump(mode="json", exclude={"enabled", "max_batch_size"})
        return cls(
            rollout,
            examples,
            source,
            model=lm.model,
            group_size=online.group_size,
            prompts_per_step=online.prompts_per_step,
            sampling=online.sampling(),
            max_rounds=online.max_rounds,
            seed=seed,
            describe=describe,
            owns_reward_source=True,
            max_failed_frac=r.max_failed_frac,
        )

    # ---------------------------------------------------------------------------------- sampling
    def _round(self) -> tuple[list[EncodedPair], dict[str, Any]]:
        """One round: groups for the next ``prompts_per_step`` prompts, scored, best vs worst."""
        if not self.engine.shares_model:  # an engine with its own copy samples the current weights
            self.engine.sync_weights(self.model)
        exs = [self.examples[i] for i in self.shuffler.take(self.prompts_per_step)]
        eps = self.runner.run(exs, [self.group_size] * len(exs), self.sampling)
        batch = eps.batch
        if batch.action_mask is not batch.completion_mask and not torch.equal(
            batch.action_mask.bool(), batch.completion_mask.bool()
        ):
            raise PosttrainRuntimeError(
                "online pairs: the episode runner returned completions with environment tokens (multi-turn "
                "episodes); a pair's loss would train on them. Use online.runner.name=single-turn"
            )
        self.rounds_done += 1
        if eps.rewards is not None:
            rewards = [float(r) for r in eps.rewards.tolist()]
            components: dict[str, list[float]] = {}
            errors = timeouts = 0
        else:
            scored = self.reward_source.score(eps.texts, eps.examples)
            self.failures.check(scored, f"online pairs, round {self.rounds_done}")
            rewards, components = list(scored.rewards), scored.components
            errors, timeouts = scored.errors, scored.timeouts
        comps = batch.completion_lists()
        prompt_rows = [
            [int(t) for t, m in zip(ids, mask, strict=True) if m]
            for ids, mask in zip(batch.prompt_ids.tolist(), batch.prompt_mask.tolist(), strict=True)
        ]
        lp = batch.logprobs
        groups: dict[int, list[int]] = {}
        for row, g in enumerate(batch.group_ids.tolist()):
            groups.setdefault(g, []).append(row)
        pairs, skipped = [], 0
        for g in sorted(groups):
            rows = groups[g]
            pick = best_vs_worst([rewards[r] for r in rows])
            if pick is None:
                skipped += 1
                continue
            w, lose = rows[pick[0]], rows[pick[1]]
            ex = exs[g]
            meta = {
                "example_id": getattr(ex, "id", None),
                "chosen_reward": rewards[w],
                "rejected_reward": rewards[lose],
                "chosen_text": eps.texts[w],
                "rejected_text": eps.texts[lose],
            }
            if lp is not None:  # the engine's sampling log-probs (at online.temperature)
                meta["sample_logp_chosen"] = float(lp[w].sum())
                meta["sample_logp_rejected"] = float(lp[lose].sum())
            pairs.append(
                EncodedPair(
                    prompt_rows[w],
                    comps[w],
                    comps[lose],
                    f"online round {self.rounds_done}, prompt {getattr(ex, 'id', g)}",
                    meta=meta,
                )
            )
        stats = {
            "groups": len(groups),
            "skipped": skipped,
            "completions": len(batch),
            "rewards": rewards,
            "components": components,
            "errors": errors,
            "timeouts": timeouts,
        }
        return pairs, stats

    def next_pairs(self, n: int) -> list[EncodedPair]:
        """Up to ``n`` pairs: rounds until ``n`` pairs have a margin or ``max_rounds`` rounds were sampled."""
        pairs: list[EncodedPair] = []
        rounds: list[dict[str, Any]] = []
        while len(pairs) < n and len(rounds) < self.max_rounds:
            got, stats = self._round()
            pairs += got
            rounds.append(stats)
        kept, dropped = pairs[:n], max(0, len(pairs) - n)
        self._metrics = self._summarise(kept, rounds, dropped)
        return kept

    @staticmethod
    def _summarise(pairs: list[EncodedPair], rounds: list[dict[str, Any]], dropped: int) -> dict[str, float]:
        def mean(xs: list[float]) -> float:
            return float(sum(xs) / len(xs)) if xs else 0.0

        groups = sum(r["groups"] for r in rounds)
        skipped = sum(r["skipped"] for r in rounds)
        rewards = [x for r in rounds for x in r["rewards"]]
        out = {
            "pairs/n": float(len(pairs)),
            "pairs/groups": float(groups),
            "pairs/groups_kept": float(groups - skipped),
            "pairs/groups_skipped_no_margin": float(skipped),
            "pairs/margin_mean": mean([p.meta["chosen_reward"] - p.meta["rejected_reward"] for p in pairs]),
            "pairs/chosen_reward_mean": mean([p.meta["chosen_reward"] for p in pairs]),
            "pairs/rejected_reward_mean": mean([p.meta["rejected_reward"] for p in pairs]),
            "pairs/reward_mean": mean(rewards),
            "pairs/completions": float(sum(r["completions"] for r in rounds)),
            "pairs/rounds": float(len(rounds)),
            "pairs/dropped": float(dropped),
            "pairs/chosen_len_mean": mean([float(len(p.chosen_ids)) for p in pairs]),
            "pairs/rejected_len_mean": mean([float(len(p.rejected_ids)) for p in pairs]),
            "reward_errors": float(sum(r["errors"] for r in rounds)),
            "reward_timeouts": float(sum(r["timeouts"] for r in rounds)),
        }
        names = set.intersection(*(set(r["components"]) for r in rounds)) if rounds else set()
        for k in sorted(names):
            out[f"reward/{k}"] = mean([float(v) for r in rounds for v in r["components"][k]])
        return out

    def step_metrics(self) -> dict[str, float]:
        """The metrics of the last :meth:`next_pairs` (module docstring)."""
        return dict(self._metrics)

    # ------------------------------------------------------------------------------------ resume
    def state_dict(self) -> dict[str, Any]:
        return {
            "shuffler": self.shuffler.state_dict(),
            "rounds_done": self.rounds_done,
            "engine": _tensors_to_text(self.engine.state_dict()),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "engine" not in state:
            raise InvalidValueError(
                "online pairs: the checkpoint's pair source is not an online one (no sampling state); "
                "resume with the checkpoint's online.enabled setting"
            )
        self.shuffler.load_state_dict(state["shuffler"])
        self.rounds_done = int(state["rounds_done"])
        self.engine.load_state_dict(_text_to_tensors(state["engine"]))

    def close(self) -> None:
        try:
            if self.owns_reward_source:
                self.reward_source.close()
        finally:
            self.engine.close()
