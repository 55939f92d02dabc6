"""The RL loop: one file, read top to bottom.

:meth:`RLTrainer.step` runs five phases, each a method a reader can find and a test can call:

1. :meth:`~RLTrainer.rollout` (**plan + rollout**) — controllers set the knobs (temperature τ); the
   :class:`~posttrain.hooks.PromptSampler` picks prompts and a completion budget per prompt (groups
   may differ in size); a :class:`~posttrain.hooks.ReplayBuffer` may supply stored trajectories for
   some group slots; the :class:`~posttrain.rollout.EpisodeRunner` samples the rest at τ. Rewards are
   *submitted* to the :class:`~posttrain.rollout.RewardSource` right away (a worker pool scores them in
   the background). Returns a :class:`StepRollout`: the episodes and the model inputs, with two masks —
   ``attention_mask`` (every real token: prompt, policy AND environment tokens of a multi-turn episode)
   and ``actions`` (the policy's own tokens: the only ones with loss and metrics).
2. :meth:`~RLTrainer.forward_without_rewards` — old log-probs (only when updates are off-policy:
   ``ppo_epochs > 1`` or ``minibatches > 1``), reference log-probs (only when a reference is used) and
   the first micro-batch's policy forward run while the rewards are being scored.
3. :meth:`~RLTrainer.score` (**rewards → group shaping → advantages**) — raw rewards R_i, correctness
   c_i = [R_i ≥ threshold]; a :class:`~posttrain.hooks.GroupRewardShaper` maps them to R'_i seeing
   whole groups; the advantage estimator gives A_i from R', the group ids and the runner's
   ``advantage_inputs`` (e.g. GRPO: (R'_i − μ_g)/(σ_g + ε)).
4. :meth:`~RLTrainer.update` — for each epoch and minibatch, gradients are accumulated over
   micro-batches of

       L = L_pg(logp, old_logp, A; is_weights, inputs) + β · agg(KL(logp ‖ ref_logp)) − λ_H · agg(H)

   over action tokens, where every term is aggregated with the minibatch's GLOBAL token / sequence
   counts, so the summed micro-batch gradients equal the gradient of one big batch (docs/objectives.md,
   aggregation). ``inputs`` are the extra per-token tensors the loss declared at registration
   (``PolicyLoss.inputs``: entropy, reference or rollout log-probs), computed by
   ``_LOSS_INPUTS`` — no code per loss here. With a single on-policy update,
   ``old_logp = logp.detach()`` (ratio 1, no extra forward). Then the global grad norm is clipped and
   AdamW steps with the scheduled learning rate.
5. :meth:`~RLTrainer.report` (**metrics + hooks**) — reward / accuracy / zero-variance groups / lengths
   / truncation / entropy / clip fractions / KL / grad norm / throughput / time split, all over action
   tokens, plus ``entropy_pre_update`` (no-grad entropy of the sampling policy at τ), the sampler's,
   filter's and replay buffer's ``sampler/*``, ``filter/*``, ``replay/*`` numbers and every hook's own
   ``step_metrics`` (a method's metric comes from its hook: the loop names no method); controllers
   update their knobs (e.g. the temperature used for BOTH the next rollout and the training
   log-probs); sampler and replay buffer observe the scored groups.
   Per-micro-batch metric sums live in one helper, :class:`MetricSums`.

The trainer's parts are built by :func:`posttrain.train.builder.build_rl_parts`, complete and in
dependency order, before the first step. :meth:`RLTrainer.train` runs the steps through :class:`~posttrain.train.loop.RunLoop`, the run loop
SFT shares: logging (JSONL always, TensorBoard / W&B optional), evaluation and checkpoint schedules,
resume. Distributed concerns live in :mod:`posttrain.train.dist`.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from posttrain.algos import agg_loss, group_stats, kl_clamped, kl_penalty
from posttrain.algos.kl import KL_ESTIMATORS
from posttrain.hooks import (
    Controller,
    GroupFilter,
    GroupRewardShaper,
    Knobs,
    PromptSampler,
    ReplayBuffer,
    hook_metrics,
)
from posttrain.models import ModelAdapter, precision_autocast
from posttrain.rollout import EpisodeRunner, Episodes, RewardSource, RolloutBatch, SamplingParams
from posttrain.rollout.reward_source import RewardHandle
from posttrain.train import dist
from posttrain.train.builder import DegenerateSettingWarning, build_rl_parts
from posttrain.train.config import RLConfig
from posttrain.train.correction import combine_weights
from posttrain.train.loop import LoopSpec, RunLoop, RunLoopTrainer
from posttrain.train.optim import clip_and_step, scheduled_lr, set_lr
from posttrain.utils.errors import InvalidValueError

__all__ = [
    "DegenerateSettingWarning",
    "MetricSums",
    "RLTrainer",
    "StepForwards",
    "StepRollout",
    "StepScores",
    "StepUpdate",
    "step_rollouts",
    "train_to_end",
]

WARN_TRUNCATED = 0.9
WARN_ZERO_VAR = 0.9


def step_rollouts(row: dict[str, Any]) -> float:
    """Completions generated in one logged step (a ``metrics.jsonl`` step row): with dynamic sampling
    the extra rounds count (the group filter's ``filter/rollouts_generated``; logs written before 0.2.0,
    when a sampler could own the filter, hold it as ``sampler/rollouts_generated``); otherwise the
    batch (``num_sequences``)."""
    for key in ("filter/rollouts_generated", "sampler/rollouts_generated"):
        if key in row:
            return float(row[key])
    return float(row["num_sequences"])


# ------------------------------------------------------------------------------- what phases pass on
@dataclass
class StepRollout:
    """Phase 1: the step's episodes, their reward handle and the model inputs built from them.

    ``input_ids`` / ``attention_mask`` / ``score_mask`` are (N, P + T) (prompt then completion);
    ``actions`` (N, T) float is 1 on the policy's tokens (loss, KL, entropy and every metric use it);
    environment tokens of a multi-turn episode are in ``attention_mask`` but not in ``actions``.
    ``minibatches[j]`` are the row indices of minibatch j, ``micro_batches[j]`` their micro-batches.
    """

    episodes: Episodes
    handle: RewardHandle
    rounds: int
    temperature: float
    batch: RolloutBatch  # on the training device
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    score_mask: torch.Tensor
    actions: torch.Tensor
    minibatches: list[torch.Tensor]
    micro_batches: list[tuple[torch.Tensor, ...]]
    seconds: float

    @property
    def prompt_width(self) -> int:
        return self.batch.prompt_ids.shape[1]


@dataclass
class StepForwards:
    """Phase 2: (N, T) old / reference log-probs (None when not needed) and ``first``, the (logp,
    entropy) with gradient of the first micro-batch, computed early and consumed by :meth:`update`.
    ``old_entropy``: (N, T) no-grad entropy at τ from the old-log-prob forward (off-policy only)."""

    old_logp: torch.Tensor | None
    ref_logp: torch.Tensor | None
    first: tuple[torch.Tensor, torch.Tensor] | None
    seconds: float
    old_entropy: torch.Tensor | None = None


@dataclass
class StepScores:
    """Phase 3: rewards of the step's episodes once known."""

    raw: torch.Tensor  # (N,) raw rewards
    correct: torch.Tensor  # (N,) bool
    shaped: torch.Tensor  # (N,) rewards the advantage sees
    advantages: torch.Tensor  # (N,) or (N, T)
    timeouts: int = 0
    errors: int = 0
    components: dict[str, list[float]] = field(default_factory=dict)
    seconds: float = 0.0
    shaping: dict[str, float] = field(default_factory=dict)  # mean |change| each shaper made, in order


@dataclass
class StepUpdate:
    """Phase 4: the learning rate used, per-update metrics (loss terms, token means), grad norms."""

    lr: float
    metrics: dict[str, float]
    grad_norms: list[float]
    seconds: float


class MetricSums:
    """Metric bookkeeping over micro-batches.

    ``mean(key, total, weight)``: a weighted mean (e.g. a token sum and the token count);
    ``share(key, value)``: a loss term that is already this micro-batch's share of its minibatch's
    total, so shares add up to the minibatch value and are averaged over the optimizer updates.
    """

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.weights: dict[str, float] = {}

    def mean(self, key: str, total: float, weight: float) -> None:
        self.sums[key] = self.sums.get(key, 0.0) + total
        self.weights[key] = self.weights.get(key, 0) + weight

    def share(self, key: str, value: float) -> None:
        self.sums[key] = self.sums.get(key, 0.0) + value

    def all_reduce(self) -> None:
        """Sum sums and weights over the ranks (distributed training; nothing in one process)."""
        self.sums, self.weights = dist.sum_dicts(self.sums), dist.sum_dicts(self.weights)

    def result(self, n_updates: int) -> dict[str, float]:
        return {k: v / self.weights[k] if k in self.weights else v / n_updates for k, v in self.sums.items()}


@dataclass
class _Micro:
    """One micro-batch inside :meth:`RLTrainer.update`: what a declared loss input is computed from."""

    rows: torch.Tensor
    logp: torch.Tensor  # (n, T), with grad
    entropy: torch.Tensor  # (n, T), with grad
    rollout: StepRollout
    forwards: StepForwards


def _rollout_logp(mb: _Micro) -> torch.Tensor:
    lp = mb.rollout.batch.logprobs
    if lp is None:  # refused at rollout time; kept as a guard for custom phase orderings
        raise InvalidValueError(
            "loss input 'rollout_logp': the rollout engine recorded no sampling log-probs"
        )
    return lp[mb.rows]


#: How the trainer computes each per-token input a policy loss may declare
#: (``posttrain.algos.policy_losses.LOSS_INPUTS``; a test checks both name the same inputs).
_LOSS_INPUTS: dict[str, Callable[[_Micro], torch.Tensor]] = {
    "entropy": lambda mb: mb.entropy,
    "ref_logp": lambda mb: mb.forwards.ref_logp[mb.rows],
    "rollout_logp": _rollout_logp,
}


class RLTrainer(RunLoopTrainer):
    """GRPO-family RL trainer. ``RLTrainer(config).train()`` runs a full experiment;
    ``RLTrainer(config, model, tokenizer).step()`` does exactly one step (used by ``posttrain bench``).

    Its parts are built by :func:`~posttrain.train.builder.build_rl_parts` (complete, in dependency
    order) and kept as plain attributes: ``model``, ``tokenizer``, ``lm`` (the policy's model
    adapter), ``ref_lm``, ``train_lm``, ``formatter``, ``engine``, ``optimizer``, ``task``,
    ``controllers``, ``shapers``, and ``collector``, which runs the step's rollout with the
    ``sampler``, ``replay`` buffer, ``group_filter``, ``runner`` and ``reward_source``
    (``trainer.collector.sampler`` ...). Hooks come from ``config.hooks`` via the registries in
    :mod:`posttrain.hooks`; engine, episode runner and reward source from ``rollout.engine``,
    ``rollout.runner`` and ``reward.source`` via :mod:`posttrain.rollout.registry`.

    Programmatic use: every component can also be passed in as an object, which then replaces the
    configured name — ``task`` (a :class:`~posttrain.tasks.Task`; TRL-style inputs too: a list of
    row dicts, a list of :class:`~posttrain.Example`, a ``datasets.Dataset`` / ``DatasetDict``, see
    :mod:`posttrain.tasks.inputs`), ``reward`` (any callable ``(completion, example) -> float``, a TRL
    reward function ``(completions, **kwargs) -> list[float]`` (:mod:`posttrain.rewards.callables`)
    or a reward name; one that cannot be pickled, e.g. a lambda or a function defined in a notebook,
    is scored in this process; anything else is refused before a model loads), ``reward_source``, ``runner``, ``sampler``,
    ``group_filter``, ``replay``, ``shapers`` (a list, applied in order) and ``controllers``.
    ``config`` defaults to ``RLConfig()``; a dict is validated as one.
    """

    def __init__(
        self,
        config: RLConfig | dict[str, Any] | None = None,
        model: Any = None,
        tokenizer: Any = None,
        *,
        resume: bool = False,
        reward_source: RewardSource | None = None,
        runner: EpisodeRunner | None = None,
        task: Any = None,
        reward: Callable[..., Any] | str | None = None,
        sampler: PromptSampler | None = None,
        group_filter: GroupFilter | None = None,
        replay: ReplayBuffer | None = None,
        shapers: list[GroupRewardShaper] | None = None,
        controllers: list[Controller] | None = None,
    ) -> None:
        cfg = config if isinstance(config, RLConfig) else RLConfig.model_validate(config or {})
        objects = dict(task=task, reward=reward, reward_source=reward_source, runner=runner, sampler=sampler)
        objects.update(group_filter=group_filter, replay=replay, shapers=shapers, controllers=controllers)
        p = build_rl_parts(cfg, model=model, tokenizer=tokenizer, resume=resume, **objects)
        self.cfg, self.run_dir, self.device = cfg, Path(cfg.out_dir), p.device
        self.precision, self.precision_reason, self.spec = p.precision, p.precision_reason, p.spec
        self.task, self.train_examples, self.reward_fn = p.task, p.train_examples, p.reward_fn
        self.lm, self.ref_lm, self.train_lm = p.lm, p.ref_lm, p.train_lm
        self.model, self.tokenizer = p.lm.model, p.lm.tokenizer  # everything that scores tokens uses lm
        self.formatter, self.engine, self.collector = p.formatter, p.engine, p.collector
        self.weight_sync = p.weight_sync
        self.loss_fn, self.adv_fn, self.optimizer = p.loss_fn, p.adv_fn, p.optimizer
        self.controllers, self.shapers, self.shaper_names = p.controllers, p.shapers, p.shaper_names
        self.is_weights, self.reward_failures, self.warn = p.is_weights, p.reward_failures, p.warn
        self._owns_reward_source = p.owns_reward_source
        self.knobs = Knobs(temperature=cfg.rollout.temperature)
        self.step_idx = 0
        self.loop = RunLoop(self)  # run loop, checkpoints and resume, shared with SFT (train/loop.py)
        if p.checkpoint is not None:
            self.loop.restore(p.checkpoint, self._restore_state)

    # ------------------------------------------------------------------------------------- one step
    def step(self) -> dict[str, float]:
        """One full RL step (the five phases of the module docstring); returns its metrics."""
        t_start = time.perf_counter()
        with dist.full_params(self.model):  # FSDP2: generate with gathered weights (no-op otherwise)
            ro = self.rollout()  # 1. plan + rollout; rewards submitted
        fw = self.forward_without_rewards(ro)  # 2. overlaps with reward scoring
        scores = self.score(ro)  # 3. rewards -> group shaping -> advantages
        upd = self.update(ro, fw, scores)  # 4. optimizer updates
        self.last_scored = (ro, scores)  # what samples.jsonl shows (train/samples.py)
        return self.report(ro, fw, scores, upd, t_start=t_start)  # 5. metrics + hooks

    # ------------------------------------------------------------------------- 1. plan + rollout
    def rollout(self) -> StepRollout:
        """Controllers set the knobs; sample the step's episodes (rewards submitted, or already known
        when a group filter is active); build the model inputs and the micro-batch split."""
        cfg = self.cfg
        t0 = time.perf_counter()
        for c in self.controllers:
            c.apply(self.knobs, self.step_idx)
        tau = self.knobs.temperature
        params = SamplingParams(
            temperature=tau,
            top_p=cfg.rollout.top_p,
            max_new_tokens=cfg.rollout.max_new_tokens,
            min_new_tokens=cfg.rollout.min_new_tokens,
            suppress_eos=cfg.rollout.suppress_eos,
        )
        # the generators sample from this step's policy version (one publication per step)
        self.weight_sync.publish(self.model, self.step_idx)
        with precision_autocast(self.device, self.precision):  # model.precision bf16: autocast
            episodes, handle, rounds = self.collector.collect(self.step_idx, params)
        self._check_logprobs(episodes)
        batch = episodes.batch.to(self.device)
        input_ids, attn, score_mask = batch.model_inputs()
        n = len(batch)
        minibatches = [mb for mb in torch.arange(n).tensor_split(min(cfg.minibatches, n)) if len(mb)]
        micro = cfg.micro_batch_size or n
        # distributed: every rank needs as many backward passes (DDP all-reduces in each); no-op in one process
        micro_batches = dist.align_micro_batches([mb.split(micro) for mb in minibatches])
        return StepRollout(
            episodes=episodes,
            handle=handle,
            rounds=rounds,
            temperature=tau,
            batch=batch,
            input_ids=input_ids,
            attention_mask=attn,
            score_mask=score_mask,
            actions=batch.action_mask.float(),
            minibatches=minibatches,
            micro_batches=micro_batches,
            seconds=time.perf_counter() - t0,
        )

    def hooks(self) -> list[Any]:
        """Every hook object of the run (sampler, filter, replay buffer, shapers, controllers)."""
        c = self.collector
        return [c.sampler, c.group_filter, c.replay, *self.shapers, *self.controllers]

    def _check_logprobs(self, episodes: Episodes) -> None:
        """Refuse a batch without sampling log-probs when a hook or the loss needs them."""
        if episodes.batch.logprobs is not None:
            return
        needs = {
            f"hooks.replay {self.cfg.hooks.replay.name!r} (needs_logprobs)": self.collector.replay.needs_logprobs,
            "replayed trajectories (importance weights)": bool(episodes.replayed.any()),
            f"objective {self.cfg.objective.name!r} (input 'rollout_logp')": "rollout_logp"
            in self.loss_fn.inputs,
        }
        who = [k for k, v in needs.items() if v]
        if who:
            raise InvalidValueError(
                f"the episodes carry no sampling log-probs (RolloutBatch.logprobs is None), but {', '.join(who)} "
                "need them; use an engine that records them (SamplingParams.logprobs)"
            )

    # ---------------------------------------------------------------- 2. forwards without rewards
    def _policy_forward(
        self, lm: ModelAdapter, ro: StepRollout, rows: torch.Tensor, grad: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(logp, entropy) (len(rows), T) over the completion positions at temperature τ; 0 except on
        action tokens (environment tokens are attended to, not scored)."""
        with torch.set_grad_enabled(grad), precision_autocast(self.device, self.precision):
            lp, ent = lm.logprobs(
                ro.input_ids[rows],
                ro.attention_mask[rows],
                ro.score_mask[rows],
                temperature=ro.temperature,
                chunk_size=self.cfg.logprob_chunk_size,
            )
        p = ro.prompt_width
        return lp[:, p:], ent[:, p:]

    def forward_without_rewards(self, ro: StepRollout) -> StepForwards:
        """Old log-probs (off-policy updates only), reference log-probs (with a reference model) and the
        first micro-batch's policy forward: everything that does not wait for rewards."""
        t0 = time.perf_counter()
        micro = self.cfg.micro_batch_size or len(ro.batch)
        chunks = torch.arange(len(ro.batch)).split(micro)

        def no_grad_forward(lm: ModelAdapter) -> tuple[torch.Tensor, torch.Tensor]:
            parts = [self._policy_forward(lm, ro, rows, False) for rows in chunks]
            return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])

        with dist.full_params(self.model):
            old_logp, old_ent = no_grad_forward(self.lm) if self.cfg.off_policy else (None, None)
        ref_logp = no_grad_forward(self.ref_lm)[0] if self.ref_lm is not None else None
        first = self._policy_forward(self.train_lm, ro, ro.micro_batches[0][0], True)
        return StepForwards(old_logp, ref_logp, first, time.perf_counter() - t0, old_ent)

    # ------------------------------------------------------------ 3. rewards -> shaping -> advantages
    def score(self, ro: StepRollout) -> StepScores:
        """Wait for the rewards; shape them per group; compute the advantages."""
        t0 = time.perf_counter()
        episodes = ro.episodes
        res = ro.handle.result()
        self.reward_failures.check(res, f"step {self.step_idx + 1}")  # shows / counts / stops on failures
        raw = torch.tensor(res.rewards, dtype=torch.float32)
        if raw.shape[0] != len(episodes):
            raise InvalidValueError(
                f"reward source returned {raw.shape[0]} rewards for {len(episodes)} completions"
            )
        correct = raw >= self.cfg.reward.success_threshold
        b = episodes.batch
        shaped, changes = raw.clone(), {}
        for i, (name, shaper) in enumerate(zip(self.shaper_names, self.shapers, strict=True)):
            before = shaped
            shaped = shaper.shape(
                before.clone(),
                b.group_ids,
                correct=correct,
                lengths=b.action_lengths.cpu(),
                truncated=b.truncated,
            )
            changes[f"shaping/{i}_{name}_abs_change"] = float((shaped - before).abs().mean())
        inputs = dict(episodes.advantage_inputs)
        if "token_counts" in self.adv_fn.defaults:  # token-weighted whitening (REINFORCE++, verl)
            inputs.setdefault("token_counts", b.action_lengths.cpu())
        adv = self.adv_fn(shaped, b.group_ids, **self.cfg.advantage.params, **inputs)
        wait = time.perf_counter() - t0
        return StepScores(raw, correct, shaped, adv, res.timeouts, res.errors, res.components, wait, changes)

    # ------------------------------------------------------------------------------------ 4. update
    def update(self, ro: StepRollout, fw: StepForwards, scores: StepScores) -> StepUpdate:
        """For each epoch and minibatch: accumulate gradients over micro-batches, clip, AdamW step."""
        cfg = self.cfg
        t0 = time.perf_counter()
        lr = scheduled_lr(cfg.optimizer, self.step_idx, cfg.steps)
        set_lr(self.optimizer, lr)
        adv = scores.advantages.to(self.device)
        mask = ro.actions
        sums = MetricSums()
        grad_norms = []
        first_rows = ro.micro_batches[0][0]
        for epoch in range(cfg.ppo_epochs):
            for mb, splits in zip(ro.minibatches, ro.micro_batches, strict=True):
                self.optimizer.zero_grad(set_to_none=True)
                g_tokens = dist.global_sum(mask[mb].sum())
                g_seqs = dist.global_sum((mask[mb].sum(1) > 0).sum().float())
                for rows in splits:
                    if fw.first is not None and epoch == 0 and rows is first_rows:
                        (logp, ent), fw.first = fw.first, None
                    else:
                        logp, ent = self._policy_forward(self.train_lm, ro, rows, True)
                    micro = _Micro(rows, logp, ent, ro, fw)
                    self._micro_step(micro, adv[rows], g_tokens, g_seqs, sums, first_epoch=epoch == 0)
                grad_norms.append(clip_and_step(self.model, self.optimizer, cfg.optimizer.grad_clip))
        seconds = time.perf_counter() - t0
        n_updates = cfg.ppo_epochs * len(ro.minibatches)
        sums.all_reduce()  # distributed: the ranks' shares and token sums add up (no-op in one process)
        return StepUpdate(lr, sums.result(n_updates), grad_norms, seconds)

    def _micro_step(
        self,
        mb: _Micro,
        adv: torch.Tensor,
        g_tokens: torch.Tensor,
        g_seqs: torch.Tensor,
        sums: MetricSums,
        *,
        first_epoch: bool,
    ) -> None:
        """Loss of one micro-batch (its share of the minibatch total), backward, metric sums."""
        cfg = self.cfg
        rows, logp, ent, ro, fw = mb.rows, mb.logp, mb.entropy, mb.rollout, mb.forwards
        m = ro.actions[rows]
        old = logp.detach() if fw.old_logp is None else fw.old_logp[rows]
        # per-token importance weights: the product of the providers' (replay, engine mismatch, ...)
        is_weights = combine_weights([p(rows, logp, old, m, ro.episodes, ro.batch) for p in self.is_weights])
        scale = cfg.objective.scale or float(cfg.rollout.max_new_tokens)
        agg = cfg.objective.agg or self.loss_fn.default_agg
        norm = {"scale": scale, "global_tokens": g_tokens, "global_seqs": g_seqs}
        loss, lm = self.loss_fn(
            logp,
            old,
            adv,
            m,
            agg=cfg.objective.agg,
            is_weights=is_weights,
            inputs={k: _LOSS_INPUTS[k](mb) for k in self.loss_fn.inputs},
            **norm,
            **cfg.objective.params,
        )
        terms = {"pg_loss": loss.detach()}
        ref = fw.ref_logp[rows] if fw.ref_logp is not None else None
        if ref is not None and cfg.kl.coef > 0:
            kl = agg_loss(kl_penalty(logp, ref, cfg.kl.kind), m, agg, **norm)
            loss = loss + cfg.kl.coef * kl
            terms["kl_loss"] = kl.detach()
        if cfg.entropy_coef:
            loss = loss - cfg.entropy_coef * agg_loss(ent, m, agg, **norm)
        dist.backward(loss)  # loss.backward(); times the world size under DDP (it averages gradients)
        # loss terms are already shares of the minibatch total; metrics are token-weighted means
        w_tok = float(m.sum())
        for k, v in terms.items():
            sums.share(k, float(v))
        for k, v in lm.items():
            sums.mean(k, float(v) * w_tok, w_tok)
        sums.mean("entropy", float((ent.detach() * m).sum()), w_tok)
        if ref is not None:
            sums.mean("kl", float(((logp.detach() - ref) * m).sum()), w_tok)
            if cfg.kl.kind in KL_ESTIMATORS and KL_ESTIMATORS.canonical(cfg.kl.kind) == "k3":
                # tokens where k3's clamps zero the KL gradient (kl_clamped)
                sums.mean("kl_clamped_frac", float((kl_clamped(logp, ref) * m).sum()), w_tok)
        if ro.batch.logprobs is not None and first_epoch:
            delta = logp.detach() - ro.batch.logprobs[rows]
            sums.mean("rollout_logp_diff", float((delta.abs() * m).sum()), w_tok)
            # what the first update's ratio would be with the sampler's log-probs as the old policy
            # (exp(train - rollout); 1 when the rollout and the training forward agree)
            sums.mean("rollout_ratio_mean", float((delta.exp() * m).sum()), w_tok)

    # ----------------------------------------------------------------------------- 5. metrics + hooks
    def report(
        self, ro: StepRollout, fw: StepForwards, scores: StepScores, upd: StepUpdate, *, t_start: float
    ) -> dict[str, float]:
        """The step's metrics; controllers, sampler and replay buffer see them; the step counter moves."""
        metrics = self._batch_metrics(ro.episodes, scores)
        metrics.update(upd.metrics)
        wall = time.perf_counter() - t_start
        gen_tokens = float(ro.actions.sum())
        metrics.update(
            step=self.step_idx + 1,
            lr=upd.lr,
            temperature=ro.temperature,
            grad_norm=float(np.mean(upd.grad_norms)),
            grad_norm_max=float(np.max(upd.grad_norms)),
            sampling_rounds=ro.rounds,
            replayed=int(ro.episodes.replayed.sum()),
            time_generation=ro.seconds,
            time_forward_overlap=fw.seconds,
            time_reward_wait=scores.seconds,
            time_update=upd.seconds,
            time_step=wall,
            tokens_per_s=gen_tokens / max(wall, 1e-9),
        )
        # entropy of the policy that sampled, at τ, without gradient (for controllers that target an
        # entropy): on-policy the update's forwards all precede its single optimizer step, so it is that
        if fw.old_entropy is not None:
            metrics["entropy_pre_update"] = float(
                (fw.old_entropy * ro.actions).sum() / ro.actions.sum().clamp(min=1)
            )
        else:
            metrics["entropy_pre_update"] = metrics["entropy"]
        c = self.collector
        metrics.update({f"sampler/{k}": v for k, v in c.sampler.metrics().items()})
        if c.group_filter is not None:
            metrics.update({f"filter/{k}": v for k, v in c.group_filter.metrics().items()})
        metrics.update({f"replay/{k}": v for k, v in c.replay.metrics().items()})
        metrics.update(scores.shaping)
        metrics.update(c.source.step_metrics(ro.episodes))  # the runner's own (tool calls, ...)
        metrics.update(c.metrics())  # the collector's own (asynchronous: staleness, queue, utilisation)
        # the hooks' own numbers (Hook.step_metrics): a method's metric comes from its hook, not the loop
        metrics.update(hook_metrics(self.hooks(), ro.episodes, kind="step", reserved=metrics))
        # distributed: the global batch's metrics and outcomes, so every rank's hooks see the same
        metrics = dist.reduce_metrics(
            metrics,
            weights={
                "advantage_numel": float(scores.advantages.numel()),
                "action_tokens": float(ro.actions.sum()),
            },
            global_keys=upd.metrics,
        )
        outcomes = dist.gather_list(c.outcomes(ro.episodes, scores.raw))
        c.sampler.observe(outcomes, self.step_idx)
        c.replay.observe(ro.episodes, scores.shaped, scores.correct, self.step_idx)
        for c in self.controllers:
            for k, v in c.update(metrics, self.step_idx).items():
                metrics[f"controller/{k}"] = v
        self._warn_degenerate(metrics)
        self.step_idx += 1
        return metrics

    # ----------------------------------------------------------------------------------- internals
    def _batch_metrics(self, episodes: Episodes, scored: StepScores) -> dict[str, float]:
        b = episodes.batch
        lengths = b.action_lengths.float().cpu()
        gids = b.group_ids
        uniq, inv = torch.unique(gids, return_inverse=True)
        g = len(uniq)
        r = scored.shaped.double()
        cnt, _, _ = group_stats(r, inv, g)
        # groups where nothing the estimator normalises varies (the estimator's own rule, e.g. one that
        # also normalises turn rewards)
        ai = episodes.advantage_inputs or {}
        zero_var = self.adv_fn.zero_variance_groups(scored.shaped.cpu(), gids.cpu(), **ai).double().mean()
        out = {
            "reward_mean": float(scored.raw.mean()),
            "reward_std": float(scored.raw.std()) if len(scored.raw) > 1 else 0.0,
            "reward_shaped_mean": float(scored.shaped.mean()),
            "accuracy": float(scored.correct.float().mean()),
            "zero_var_frac": float(zero_var),
            "length_mean": float(lengths.mean()),
            "length_max": float(lengths.max()),
            "truncated_frac": float(b.truncated.float().mean()),
            "num_sequences": float(len(b)),
            "num_groups": float(g),
            "group_size_min": float(cnt.min()),
            "group_size_max": float(cnt.max()),
            "advantage_abs_mean": float(scored.advantages.abs().float().mean()),
            "reward_timeouts": float(scored.timeouts),
            "reward_errors": float(scored.errors),
        }
        # groups whose rewards the shapers changed (a length or overlong penalty fired)
        changed = torch.zeros(g, dtype=torch.float64).index_add_(
            0, inv, ((scored.shaped.double() - scored.raw.double()).abs() > 1e-12).double()
        )
        out["shaped_groups_frac"] = float((changed > 0).double().mean())
        for k, vals in (scored.components or {}).items():
            if vals:
                out[f"reward/{k}"] = float(np.mean(vals))
        return out

    def _warn_degenerate(self, m: dict[str, float]) -> None:
        if m["truncated_frac"] >= WARN_TRUNCATED:
            self.warn(
                "truncated",
                f"step {self.step_idx + 1}: {m['truncated_frac']:.0%} of completions hit rollout.max_new_tokens="
                f"{self.cfg.rollout.max_new_tokens}; rewards of cut-off answers are mostly noise — raise it",
                step=self.step_idx,
            )
        if m["zero_var_frac"] >= WARN_ZERO_VAR:
            failed = int(m["reward_errors"] + m["reward_timeouts"])
            why = (
                f"{failed} of {int(m['num_sequences'])} rewards failed and scored 0 (see the reward failure "
                "printed above)"
                if failed
                else "the task is too easy/hard for the policy (raise group_size, change temperature, or use "
                "a group filter: hooks.filter)"
            )
            self.warn(
                "zero_var",
                f"step {self.step_idx + 1}: {m['zero_var_frac']:.0%} of groups have identical rewards and give "
                f"no gradient; {why}",
                step=self.step_idx,
            )

    # ------------------------------------------------------------------------------ checkpointing
    def save(self) -> Path:
        """Checkpoint of the current step (:meth:`RunLoop.save_checkpoint`) with the hooks' states,
        the knobs and the rollout engine's sampling generator."""
        sampler, replay, filt = self.collector.sampler, self.collector.replay, self.collector.group_filter
        state = {
            "sampler": sampler.state_dict(),
            "controllers": [c.state_dict() for c in self.controllers],
            "replay": replay.state_dict(),
            "filter": filt.state_dict() if filt is not None else {},
            "knobs": {"temperature": self.knobs.temperature},
        }
        collector = self.collector.state_dict()  # asynchronous: the groups dispatched, not consumed
        if collector:
            state["collector"] = collector
        engine_state = self.engine.state_dict() if self.engine is not None else {}
        extra = {f"engine.{k}": v for k, v in engine_state.items()}
        dist.add_rank_states(state, extra)  # distributed: every rank's sampling RNG (nothing in one process)
        return self.loop.save_checkpoint(state, extra)

    def _restore_state(self, state: dict[str, Any]) -> None:
        """The hooks' states, the knobs and the engine's generator from a checkpoint's trainer state."""
        self.collector.sampler.load_state_dict(state["sampler"])
        for c, s in zip(self.controllers, state["controllers"], strict=True):
            c.load_state_dict(s)
        self.collector.replay.load_state_dict(state["replay"])
        filt = self.collector.group_filter
        if filt is not None and state.get("filter"):  # checkpoints written before 0.2 have none
            filt.load_state_dict(state["filter"])
        self.knobs = Knobs(temperature=state["knobs"]["temperature"])
        if "collector" in state:
            self.collector.load_state_dict(state["collector"])
        ext = dist.restore_rank_state(state)  # this rank's RNG and extra tensors (rank 0: the saved ones)
        if self.engine is not None:
            self.engine.load_state_dict(
                {k[len("engine.") :]: v for k, v in ext.items() if k.startswith("engine.")}
            )

    # ------------------------------------------------------------------------------- evaluation
    def eval_runner(self) -> EpisodeRunner:
        """The episode runner every evaluation of this trainer's policy generates with (held-out
        accuracy, ``evaluate_event_detection``, the ablation bench's verdicts): the configured engine and
        runner, the evaluation seed and batch cap (``eval.max_batch_size``, :meth:`EvalConfig.batch_cap`)
        and the run's compute precision."""
        from posttrain.train.evaluate import config_eval_runner

        return config_eval_runner(
            self.cfg, self.model, self.tokenizer, self.formatter, precision=self.precision
        )

    def evaluate(self) -> dict[str, Any]:
        """Held-out accuracy (and pass@k) of the current policy, with an engine and runner built from
        the same config entries as training but their own seed, so the training RNG is untouched."""
        from posttrain.train.evaluate import run_eval

        cfg, e = self.cfg, self.cfg.eval
        runner = self.eval_runner()
        with dist.full_params(self.model):  # the eval engine generates in model.precision itself
            # FSDP2: rank 0 alone generates with gathered weights
            result = dist.on_main(  # rank 0 evaluates; every rank gets the result
                lambda: run_eval(
                    runner,
                    self.task.split("heldout")[: e.n],
                    self.collector.reward_source,
                    max_new_tokens=cfg.rollout.max_new_tokens,
                    success_threshold=cfg.reward.success_threshold,
                    k=e.k,
                    samples=e.samples,
                    temperature=e.temperature,
                    metric_hooks=self.hooks(),
                )
            )
        self._check_eval_rewards(result)
        h = e.harness
        if h is not None and (self.step_idx % h.every == 0 or self.step_idx == cfg.steps):
            from posttrain.train.evaluate import harness_metrics

            engine = (self.spec.engine, self.spec.engine_params)
            with dist.full_params(self.model):
                result.update(
                    dist.on_main(lambda: harness_metrics(h, self.lm, precision=self.precision, engine=engine))
                )
        for hook in self.hooks():  # curricula read the held-out accuracy
            observe_eval = getattr(hook, "observe_eval", None)
            if observe_eval is not None:
                observe_eval(result, self.step_idx)
        return result

    def _check_eval_rewards(self, result: dict[str, Any]) -> None:
        """Held-out rewards that failed (raised, hung, NaN) are scored 0, so the accuracy would count a
        broken reward as a wrong model: say so on stderr as ``posttrain eval`` does, and stop the run, as
        a training batch does, when more than ``reward.max_failed_frac`` of them failed."""
        from posttrain.rewards.failures import RewardFailureError
        from posttrain.train.evaluate import reward_failure_warning

        warning = reward_failure_warning(result)
        if warning is None:
            return
        print(f"warning: evaluation at step {self.step_idx}: {warning}", file=sys.stderr, flush=True)
        failed = int(result.get("reward_errors", 0)) + int(result.get("reward_timeouts", 0))
        if failed > self.cfg.reward.max_failed_frac * max(int(result.get("n", 0)), 1):
            raise RewardFailureError(
                f"evaluation at step {self.step_idx}: {failed} of {result.get('n')} held-out rewards failed, "
                f"more than reward.max_failed_frac={self.cfg.reward.max_failed_frac:g}; the held-out accuracy "
                "would not measure the model. Fix the reward (its first failure is above), or raise "
                "reward.max_failed_frac (1 = never stop)"
            )

    # ---------------------------------------------------------------------------------- full run
    def train(
        self, *, progress: bool | None = None, overwrite: bool = False, allow_config_change: bool = False
    ) -> dict[str, Any]:
        """Run ``config.steps`` steps (from the resumed step) through the shared run loop
        (:class:`~posttrain.train.loop.RunLoop`: logging, eval, checkpoints). Returns a summary
        (``eval_start`` / ``eval_end``, ``last`` metrics, ``wall_s``).

        A fresh run refuses an ``out_dir`` that holds a previous run unless ``overwrite`` (which deletes
        its run files); a resumed run refuses config changes that break it unless
        ``allow_config_change`` (see :mod:`posttrain.train.run_dir`)."""
        cfg = self.cfg
        log = cfg.logging
        spec = LoopSpec(
            name="rl",
            step=self.step,
            evaluate=self.evaluate,
            save=self.save,
            live={"reward": "reward_mean", "acc": "accuracy", "len": "length_mean"},
            progress=log.progress if progress is None else progress,
            log_every=log.every,
            logging={"tensorboard": log.tensorboard, "wandb": log.wandb, "wandb_project": log.wandb_project},
            samples=lambda logger: logger.log_samples(
                self.step_idx, getattr(self, "last_scored", None), every=log.samples_every
            ),
            release=self.collector.close,  # asynchronous: workers stop before the lock is released
        )
        return self.loop.run(spec, overwrite=overwrite, allow_config_change=allow_config_change)

    def close(self) -> None:
        self.collector.close()  # asynchronous: the generation workers
        self.weight_sync.close()
        if self.engine is not None:
            self.engine.close()
        if self._owns_reward_source:
            self.collector.reward_source.close()
        dist.teardown()  # leaves the process group only if setup() joined it


def train_to_end(
    cfg: RLConfig,
    *,
    model: Any = None,
    tokenizer: Any = None,
    progress: bool | None = None,
    label: str = "RL",
    after: Callable[[RLTrainer], Any] | None = None,
) -> tuple[dict[str, Any], Any]:
    """One arm of a driver that runs many (demos, experiments): train ``cfg`` (its seed, model and
    ``out_dir`` set by the caller) to its last step, without evaluations, and write the policy to
    ``<out_dir>/model``. A run folder with a checkpoint continues from it (a killed arm resumes); one
    left by a run killed before its first checkpoint is cleared and started again. Checkpoints every
    ``cfg.checkpoint.every`` steps (4 when 0), only the last kept, and at the end. ``model`` /
    ``tokenizer``: the starting policy of a fresh run (default: ``cfg.model.name``). ``after(trainer)``
    runs before the trainer closes (e.g. an evaluation with the trained weights in hand). Prints one
    line ``{label}: RL N steps [(resumed)]``. Returns (the run's summary, ``after``'s result)."""
    from posttrain.models.saving import save_model_dir
    from posttrain.train.run_dir import prepare_run_dir

    cfg = cfg.model_copy(deep=True)
    cfg.eval.at_start = cfg.eval.at_end = False
    cfg.checkpoint.final, cfg.checkpoint.keep = True, 1
    cfg.checkpoint.every = cfg.checkpoint.every or 4
    out = Path(cfg.out_dir)
    resumed = (out / "checkpoints" / "latest").is_file()
    print(f"{label}: RL {cfg.steps} steps" + (" (resumed)" if resumed else ""), flush=True)
    if resumed:
        trainer = RLTrainer(cfg, resume=True)
    else:
        prepare_run_dir(out, overwrite=True)  # stopped before its first checkpoint: start again
        trainer = RLTrainer(cfg, model, tokenizer) if model is not None else RLTrainer(cfg)
    with trainer:
        summary = trainer.train(progress=progress)
        save_model_dir(trainer.model, trainer.tokenizer, out / "model")
        extra = after(trainer) if after is not None else None
    return summary, extra
