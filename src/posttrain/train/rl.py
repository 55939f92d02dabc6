"""The RL loop: one file, read top to bottom.

One call of :meth:`RLTrainer.step` does

1. **plan + rollout** — the :class:`~posttrain.sampling.PromptSampler` picks prompts and a completion
   budget per prompt (groups may differ in size); a :class:`~posttrain.sampling.ReplayBuffer` may
   supply stored trajectories for some group slots; the :class:`~posttrain.rollout.EpisodeRunner`
   samples the rest at the controller-set temperature τ. Rewards are *submitted* to the
   :class:`~posttrain.rollout.RewardSource` right away (a worker pool scores them in the background).
2. **forward passes that do not need rewards** — old log-probs (only when updates are off-policy:
   ``ppo_epochs > 1`` or ``minibatches > 1``), reference log-probs (only when ``kl.coef > 0``) and the
   first micro-batch's policy forward run while the rewards are being scored.
3. **rewards → group shaping → advantages** — raw rewards R_i, correctness c_i = [R_i ≥ threshold];
   a :class:`~posttrain.sampling.GroupRewardShaper` maps them to R'_i seeing whole groups; the
   advantage estimator gives A_i from R' and the group ids (e.g. GRPO: (R'_i − μ_g)/(σ_g + ε)).
4. **updates** — for each epoch and minibatch, gradients are accumulated over micro-batches of

       L = L_pg(logp, old_logp, A; is_weights) + β · agg(KL(logp ‖ ref_logp)) − λ_H · agg(H)

   where every term is aggregated with the minibatch's GLOBAL token / sequence counts, so the summed
   micro-batch gradients equal the gradient of one big batch (spec ``rl-objectives.md`` §4, §5).
   With a single on-policy update, ``old_logp = logp.detach()`` (ratio 1, no extra forward). Then
   the global grad norm is clipped and AdamW steps with the scheduled learning rate.
5. **metrics + hooks** — reward / accuracy / zero-variance groups / lengths / truncation / entropy /
   clip fractions / KL / grad norm / throughput / time split; controllers update their knobs (e.g.
   the temperature used for BOTH the next rollout and the training log-probs, E3); sampler and
   replay buffer observe the scored groups.

:meth:`RLTrainer.train` wraps steps with logging (JSONL always, TensorBoard / W&B optional),
evaluation, checkpoints and resume. Distributed concerns live in :mod:`posttrain.train.dist`.
"""

from __future__ import annotations

import copy
import math
import random
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from posttrain.algos import agg_loss, get_advantage, get_policy_loss, group_stats, kl_penalty
from posttrain.models import load_model_and_tokenizer, pick_device, sequence_logprobs
from posttrain.rollout import (
    EpisodeRunner,
    Episodes,
    FunctionRewardSource,
    HFEngine,
    PromptFormatter,
    RewardSource,
    RolloutBatch,
    SamplingParams,
    ScoredBatch,
    SingleTurnRunner,
)
from posttrain.rollout.reward_source import RewardHandle, _Ready
from posttrain.sampling import (
    CONTROLLERS,
    GROUP_SHAPERS,
    REPLAY_BUFFERS,
    SAMPLERS,
    GroupOutcome,
    Knobs,
    PromptPlan,
    Trajectory,
)
from posttrain.train import dist
from posttrain.train.checkpoint import load_checkpoint, resolve_checkpoint, save_checkpoint
from posttrain.train.config import RLConfig
from posttrain.train.logger import MetricsLogger
from posttrain.train.optim import build_adamw, lr_at, set_lr

WARN_TRUNCATED = 0.9
WARN_ZERO_VAR = 0.9


class DegenerateSettingWarning(RuntimeWarning):
    """Training runs but learns little or nothing (truncation, zero-variance groups, bad splits)."""


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


@dataclass
class _Scored:
    """Rewards of a step's episodes once known."""

    raw: torch.Tensor  # (N,) raw rewards
    correct: torch.Tensor  # (N,) bool
    shaped: torch.Tensor  # (N,) rewards the advantage sees
    advantages: torch.Tensor  # (N,) or (N, T)
    timeouts: int = 0
    errors: int = 0
    components: dict[str, list[float]] = field(default_factory=dict)


class RLTrainer:
    """GRPO-family RL trainer. ``RLTrainer(config).train()`` runs a full experiment;
    ``RLTrainer(config, model, tokenizer).step()`` does exactly one step (used by ``posttrain bench``).

    Hooks are built from ``config.hooks`` via the registries in :mod:`posttrain.sampling`; a custom
    ``runner`` (multi-turn episodes) or ``reward_source`` (a judge model) can be passed in directly.
    """

    def __init__(
        self,
        config: RLConfig,
        model: Any = None,
        tokenizer: Any = None,
        *,
        resume: bool = False,
        reward_source: RewardSource | None = None,
        runner: EpisodeRunner | None = None,
    ) -> None:
        self.cfg = cfg = config
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        seed_everything(cfg.seed)
        self.run_dir = Path(cfg.out_dir)
        self.device = pick_device() if cfg.model.device == "auto" else cfg.model.device
        ckpt = resolve_checkpoint(self.run_dir) if resume else None
        if model is None:
            spec = str(ckpt / "model") if ckpt is not None else cfg.model.name
            model, tokenizer = load_model_and_tokenizer(
                spec, dtype=cfg.model.dtype, device=self.device, seed=cfg.seed
            )
        elif tokenizer is None:
            raise ValueError("RLTrainer: pass the tokenizer together with the model")
        elif ckpt is not None:
            raise ValueError(
                "RLTrainer: resume=True loads the model from the checkpoint; do not pass a model"
            )
        self.model, self.tokenizer = model, tokenizer
        self.device = next(model.parameters()).device
        self.model.train()
        if cfg.model.gradient_checkpointing:
            self.model.gradient_checkpointing_enable()

        from posttrain.rewards import get_reward
        from posttrain.tasks import get_task

        self.task = get_task(cfg.task.name, **cfg.task.params)
        self.train_examples = self.task.split("train")
        self.reward_fn = get_reward(cfg.reward.name or self.task.default_reward, **cfg.reward.params)
        self._own_reward_source = reward_source is None
        self.reward_source = reward_source or FunctionRewardSource(
            self.reward_fn, num_workers=cfg.reward.num_workers, timeout_s=cfg.reward.timeout_s
        )
        self.formatter = PromptFormatter(
            tokenizer, template=cfg.task.prompt_template, chat=cfg.task.chat_template
        )
        self.engine = HFEngine(model, tokenizer, seed=cfg.seed + 1, max_batch_size=cfg.rollout.max_batch_size)
        self.runner = runner or SingleTurnRunner(self.engine, self.formatter)

        self.loss_fn = get_policy_loss(cfg.objective.name)
        self.adv_fn = get_advantage(cfg.advantage.name)
        self.ref_model = None
        if cfg.kl.coef > 0:  # the reference is the INITIAL policy, never a resumed one
            if ckpt is None:
                self.ref_model = copy.deepcopy(model)
            else:
                self.ref_model, _ = load_model_and_tokenizer(
                    cfg.model.name, dtype=cfg.model.dtype, device=str(self.device), seed=cfg.seed
                )
            self.ref_model.eval().requires_grad_(False)
        self.optimizer = build_adamw(model, cfg.optimizer)

        h = cfg.hooks
        self.sampler = SAMPLERS.get(h.sampler.name)(self.train_examples, seed=cfg.seed, **h.sampler.params)
        self.controllers = [CONTROLLERS.get(c.name)(**c.params) for c in h.controllers]
        self.replay = REPLAY_BUFFERS.get(h.replay.name)(**h.replay.params)
        self.shaper = GROUP_SHAPERS.get(h.shaper.name)(**h.shaper.params)
        self.knobs = Knobs(temperature=cfg.rollout.temperature)
        self.step_idx = 0
        self._checkpointed_step = -1  # step of the checkpoint on disk that matches the weights
        self._last_warned: dict[str, int] = {}
        self._check_settings()
        if ckpt is not None:
            self._restore(ckpt)

    # ------------------------------------------------------------------------------------- one step
    def step(self) -> dict[str, float]:
        """One full RL step (rollout, rewards, advantages, updates); returns its metrics."""
        cfg = self.cfg
        t_start = time.perf_counter()
        for c in self.controllers:
            c.apply(self.knobs, self.step_idx)
        lr = lr_at(
            self.step_idx,
            lr=cfg.optimizer.lr,
            total_steps=max(1, cfg.steps),
            schedule=cfg.optimizer.schedule,
            warmup_steps=cfg.optimizer.warmup_steps,
            min_lr_ratio=cfg.optimizer.min_lr_ratio,
        )
        set_lr(self.optimizer, lr)
        tau = self.knobs.temperature
        params = SamplingParams(
            temperature=tau,
            top_p=cfg.rollout.top_p,
            max_new_tokens=cfg.rollout.max_new_tokens,
            min_new_tokens=cfg.rollout.min_new_tokens,
            suppress_eos=cfg.rollout.suppress_eos,
        )

        # 1. plan + rollout; rewards submitted (or already known when the sampler filters groups)
        t0 = time.perf_counter()
        episodes, handle, rounds = self._rollout(params)
        t_gen = time.perf_counter() - t0
        batch = episodes.batch.to(self.device)
        input_ids, attn, resp = batch.model_inputs()
        mask = batch.completion_mask.float()
        n = len(batch)
        minibatches = [mb for mb in torch.arange(n).tensor_split(min(cfg.minibatches, n)) if len(mb)]
        micro = cfg.micro_batch_size or n
        p_width = batch.prompt_ids.shape[1]

        def forward(model: Any, rows: torch.Tensor, grad: bool) -> tuple[torch.Tensor, torch.Tensor]:
            """(logp, entropy) (len(rows), T) of the completion tokens at temperature τ."""
            with torch.set_grad_enabled(grad):
                lp, ent = sequence_logprobs(
                    model,
                    input_ids[rows],
                    attn[rows],
                    response_mask=resp[rows],
                    temperature=tau,
                    chunk_size=cfg.logprob_chunk_size,
                )
            return lp[:, p_width:], ent[:, p_width:]

        def no_grad_logp(model: Any) -> torch.Tensor:
            return torch.cat([forward(model, rows, False)[0] for rows in torch.arange(n).split(micro)])

        # 2. forward passes that do not need rewards (overlap with reward scoring)
        t0 = time.perf_counter()
        old_logp = no_grad_logp(self.model) if cfg.off_policy else None
        ref_logp = no_grad_logp(self.ref_model) if self.ref_model is not None else None
        micro_splits = [mb.split(micro) for mb in minibatches]
        first_rows = micro_splits[0][0]
        pending = forward(self.model, first_rows, True)
        t_fwd_overlap = time.perf_counter() - t0

        # 3. rewards -> group shaping -> advantages
        t0 = time.perf_counter()
        scored = self._score(episodes, handle)
        t_reward_wait = time.perf_counter() - t0
        adv = scored.advantages.to(self.device)
        is_w_all = None
        if bool(episodes.replayed.any()):
            is_w_all = (episodes.replayed.to(self.device), batch.logprobs)

        # 4. updates
        t0 = time.perf_counter()
        sums: dict[str, float] = {}
        counts: dict[str, int] = {}
        grad_norms = []
        scale = cfg.objective.scale or float(cfg.rollout.max_new_tokens)
        for epoch in range(cfg.ppo_epochs):
            for mb, splits in zip(minibatches, micro_splits, strict=True):
                self.optimizer.zero_grad(set_to_none=True)
                g_tokens = dist.global_sum(mask[mb].sum())
                g_seqs = dist.global_sum((mask[mb].sum(1) > 0).sum().float())
                for rows in splits:
                    if pending is not None and epoch == 0 and rows is first_rows:
                        logp, ent = pending
                        pending = None
                    else:
                        logp, ent = forward(self.model, rows, True)
                    m = mask[rows]
                    old = logp.detach() if old_logp is None else old_logp[rows]
                    is_weights = None
                    if is_w_all is not None:
                        replayed, past = is_w_all
                        w = self.replay.is_weights(logp.detach(), past[rows], m)
                        is_weights = torch.where(replayed[rows, None], w, torch.ones_like(w))
                    loss, lm = self.loss_fn(
                        logp,
                        old,
                        adv[rows],
                        m,
                        agg=cfg.objective.agg,
                        is_weights=is_weights,
                        global_tokens=g_tokens,
                        global_seqs=g_seqs,
                        scale=scale,
                        **cfg.objective.params,
                    )
                    agg = cfg.objective.agg or self.loss_fn.default_agg
                    terms = {"pg_loss": loss.detach()}
                    if ref_logp is not None:
                        kl_tok = kl_penalty(logp, ref_logp[rows], cfg.kl.kind)
                        kl = agg_loss(kl_tok, m, agg, scale=scale, global_tokens=g_tokens, global_seqs=g_seqs)
                        loss = loss + cfg.kl.coef * kl
                        terms["kl_loss"] = kl.detach()
                    if cfg.entropy_coef:
                        ent_term = agg_loss(
                            ent, m, agg, scale=scale, global_tokens=g_tokens, global_seqs=g_seqs
                        )
                        loss = loss - cfg.entropy_coef * ent_term
                    loss.backward()
                    # loss terms are already shares of the minibatch total; metrics are token-weighted means
                    w_tok = float(m.sum())
                    for k, v in terms.items():
                        sums[k] = sums.get(k, 0.0) + float(v)
                    for k, v in lm.items():
                        sums[k] = sums.get(k, 0.0) + float(v) * w_tok
                        counts[k] = counts.get(k, 0) + w_tok
                    ent_sum = float((ent.detach() * m).sum())
                    sums["entropy"] = sums.get("entropy", 0.0) + ent_sum
                    counts["entropy"] = counts.get("entropy", 0) + w_tok
                    if ref_logp is not None:
                        sums["kl"] = sums.get("kl", 0.0) + float(((logp.detach() - ref_logp[rows]) * m).sum())
                        counts["kl"] = counts.get("kl", 0) + w_tok
                    if batch.logprobs is not None and epoch == 0:
                        diff = ((logp.detach() - batch.logprobs[rows]).abs() * m).sum()
                        sums["rollout_logp_diff"] = sums.get("rollout_logp_diff", 0.0) + float(diff)
                        counts["rollout_logp_diff"] = counts.get("rollout_logp_diff", 0) + w_tok
                grad_norms.append(self._clip_and_step())
        t_update = time.perf_counter() - t0
        self.engine.sync_weights(self.model)

        # 5. metrics + hooks
        n_updates = cfg.ppo_epochs * len(minibatches)
        metrics = self._batch_metrics(episodes, scored)
        for k, v in sums.items():
            metrics[k] = v / counts[k] if k in counts else v / n_updates
        wall = time.perf_counter() - t_start
        gen_tokens = float(batch.completion_mask.sum())
        metrics.update(
            step=self.step_idx + 1,
            lr=lr,
            temperature=tau,
            grad_norm=float(np.mean(grad_norms)),
            grad_norm_max=float(np.max(grad_norms)),
            sampling_rounds=rounds,
            replayed=int(episodes.replayed.sum()),
            time_generation=t_gen,
            time_forward_overlap=t_fwd_overlap,
            time_reward_wait=t_reward_wait,
            time_update=t_update,
            time_step=wall,
            tokens_per_s=gen_tokens / max(wall, 1e-9),
        )
        outcomes = self._outcomes(episodes, scored.raw)
        self.sampler.observe(outcomes, self.step_idx)
        self.replay.observe(episodes, scored.shaped, scored.correct, self.step_idx)
        for c in self.controllers:
            for k, v in c.update(metrics, self.step_idx).items():
                metrics[f"controller/{k}"] = v
        self._warn_degenerate(metrics)
        self.step_idx += 1
        return metrics

    # --------------------------------------------------------------------------------- rollout side
    def _rollout(self, params: SamplingParams) -> tuple[Episodes, RewardHandle, int]:
        """Sample episodes. Without group filtering: one round, rewards still being scored. With it
        (DAPO dynamic sampling): rounds until enough groups are kept, rewards already known."""
        cfg = self.cfg
        need, kept_parts, kept_scores, rounds = cfg.rollout.prompts_per_step, [], [], 0
        last: tuple[Episodes, ScoredBatch] | None = None
        while True:
            rounds += 1
            plan = self.sampler.plan(self.step_idx, need, cfg.rollout.group_size)
            episodes = self._episodes_for(plan, params)
            if episodes.rewards is not None:  # the environment scored its own episodes
                handle = _Ready(ScoredBatch(rewards=[float(r) for r in episodes.rewards]))
            else:
                handle = self.reward_source.submit(episodes.texts, episodes.examples)
            if not self.sampler.filters_groups:
                return episodes, handle, rounds
            res = handle.result()
            last = (episodes, res)
            raw = torch.tensor(res.rewards, dtype=torch.float32)
            outcomes = self._outcomes(episodes, raw)
            keep = self.sampler.keep_groups(outcomes)
            gids = torch.unique(episodes.batch.group_ids)
            keep_ids = gids[torch.tensor(keep, dtype=torch.bool)]
            rows = torch.isin(episodes.batch.group_ids, keep_ids).nonzero().flatten()
            if len(rows):
                kept_parts.append(_select_episodes(episodes, rows))
                kept_scores.append(_select_scored(res, rows.tolist()))
                need -= len(keep_ids)
            if need <= 0 or rounds >= self.sampler.max_rounds:
                break
        if not kept_parts:  # nothing informative: train on the last round (zero advantages)
            self._warn(
                "no_groups_kept", "sampler kept no group in any round; training on the last round", force=True
            )
            kept_parts, kept_scores = [last[0]], [last[1]]
        merged = Episodes.concat(kept_parts)
        common = set.intersection(*(set(s.components) for s in kept_scores))
        scores = ScoredBatch(
            rewards=[r for s in kept_scores for r in s.rewards],
            timeouts=sum(s.timeouts for s in kept_scores),
            errors=sum(s.errors for s in kept_scores),
            components={k: [v for s in kept_scores for v in s.components[k]] for k in sorted(common)},
        )
        return merged, _Ready(scores), rounds

    def _episodes_for(self, plan: PromptPlan, params: SamplingParams) -> Episodes:
        """Fresh episodes for the plan, plus replayed trajectories merged into the same groups."""
        replayed = self.replay.draw(plan, self.step_idx)
        if len(replayed) != len(plan.examples):
            raise ValueError(f"replay buffer returned {len(replayed)} lists for {len(plan.examples)} prompts")
        fresh = [n - len(r) for n, r in zip(plan.n_per_prompt, replayed, strict=True)]
        if any(f < 0 for f in fresh):
            raise ValueError("replay buffer returned more trajectories than a group's size")
        parts = []
        if sum(fresh):
            parts.append(self.runner.run(plan.examples, fresh, params))
        if any(replayed):
            parts.append(self._replayed_episodes(plan, replayed))
        if len(parts) == 1:
            return parts[0]
        a, b = parts  # same group numbering (plan index): concatenate without renumbering
        if a.rewards is not None or a.advantage_inputs:
            raise ValueError(
                "hooks.replay: replayed trajectories cannot join episodes that the episode runner scored "
                "itself (rewards / advantage_inputs); use a replay buffer only with runners whose "
                "episodes are scored by the reward source"
            )
        return Episodes(
            batch=RolloutBatch.concat([a.batch, b.batch]),
            texts=a.texts + b.texts,
            examples=a.examples + b.examples,
            replayed=torch.cat([a.replayed, b.replayed]),
        )

    def _replayed_episodes(self, plan: PromptPlan, replayed: list[list[Trajectory]]) -> Episodes:
        from posttrain.rollout import pad_left

        pad = self.engine.pad_token_id
        prompts, comps, lps, gids, reasons, examples = [], [], [], [], [], []
        for g, (ex, trajs) in enumerate(zip(plan.examples, replayed, strict=True)):
            ids = self.formatter.encode(ex.prompt)
            for tr in trajs:
                prompts.append(ids)
                comps.append(tr.completion_ids)
                lps.append(tr.logp_past)
                gids.append(g)
                reasons.append(tr.finish_reason)
                examples.append(ex)
        p_ids, p_mask = pad_left(prompts, pad)
        t = max(len(c) for c in comps)
        c_ids = torch.full((len(comps), t), pad, dtype=torch.long)
        c_mask = torch.zeros((len(comps), t), dtype=torch.long)
        c_lp = torch.zeros((len(comps), t))
        for i, (c, lp) in enumerate(zip(comps, lps, strict=True)):
            c_ids[i, : len(c)] = torch.tensor(c, dtype=torch.long)
            c_mask[i, : len(c)] = 1
            c_lp[i, : len(c)] = torch.tensor(lp)
        batch = RolloutBatch(p_ids, p_mask, c_ids, c_mask, c_lp, reasons, torch.tensor(gids), pad)
        texts = self.tokenizer.batch_decode(comps, skip_special_tokens=True)
        return Episodes(batch, list(texts), examples, replayed=torch.ones(len(comps), dtype=torch.bool))

    def _score(self, episodes: Episodes, handle: RewardHandle) -> _Scored:
        res = handle.result()
        raw = torch.tensor(res.rewards, dtype=torch.float32)
        if raw.shape[0] != len(episodes):
            raise ValueError(f"reward source returned {raw.shape[0]} rewards for {len(episodes)} completions")
        correct = raw >= self.cfg.reward.success_threshold
        b = episodes.batch
        shaped = self.shaper.shape(
            raw.clone(), b.group_ids, correct=correct, lengths=b.lengths.cpu(), truncated=b.truncated
        )
        adv = self.adv_fn(shaped, b.group_ids, **self.cfg.advantage.params, **episodes.advantage_inputs)
        return _Scored(raw, correct, shaped, adv, res.timeouts, res.errors, res.components)

    # ----------------------------------------------------------------------------------- internals
    def _clip_and_step(self) -> float:
        params = [p for p in self.model.parameters() if p.grad is not None]
        max_norm = self.cfg.optimizer.grad_clip if self.cfg.optimizer.grad_clip > 0 else math.inf
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True)
        self.optimizer.step()
        return float(norm)

    def _outcomes(self, episodes: Episodes, raw: torch.Tensor) -> list[GroupOutcome]:
        correct = raw >= self.cfg.reward.success_threshold
        gids = episodes.batch.group_ids
        lengths = episodes.batch.lengths.cpu()
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

    def _batch_metrics(self, episodes: Episodes, scored: _Scored) -> dict[str, float]:
        b = episodes.batch
        lengths = b.lengths.float().cpu()
        gids = b.group_ids
        uniq, inv = torch.unique(gids, return_inverse=True)
        g = len(uniq)
        r = scored.shaped.double()
        cnt, mean, _ = group_stats(r, inv, g)
        spread = torch.zeros(g, dtype=torch.float64).index_add_(0, inv, (r - mean[inv]).abs())
        zero_var = ((spread < 1e-12) | (cnt < 2)).double().mean()
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
        for k, vals in (scored.components or {}).items():
            if vals:
                out[f"reward/{k}"] = float(np.mean(vals))
        return out

    def _check_settings(self) -> None:
        cfg = self.cfg
        n = cfg.rollout.prompts_per_step * cfg.rollout.group_size
        if cfg.rollout.group_size == 1 and cfg.advantage.name in ("grpo", "dr_grpo", "rloo"):
            self._warn(
                "group1",
                f"rollout.group_size=1 with advantage {cfg.advantage.name!r}: every group is a singleton, "
                "so there is no group baseline (A = raw reward); use group_size >= 2",
                force=True,
            )
        if n % cfg.minibatches:
            self._warn(
                "split",
                f"batch of {n} sequences is not divisible by minibatches={cfg.minibatches}; "
                "minibatches will differ in size",
                force=True,
            )
        elif (n // cfg.minibatches) % cfg.rollout.group_size:
            self._warn(
                "split_groups",
                f"minibatch size {n // cfg.minibatches} is not a multiple of rollout.group_size="
                f"{cfg.rollout.group_size}; groups are split across optimizer steps",
                force=True,
            )
        if cfg.micro_batch_size and (n // cfg.minibatches) % cfg.micro_batch_size:
            self._warn(
                "micro",
                f"minibatch size {n // cfg.minibatches} is not divisible by micro_batch_size="
                f"{cfg.micro_batch_size}; the last micro-batch is smaller (gradients are still exact)",
                force=True,
            )

    def _warn_degenerate(self, m: dict[str, float]) -> None:
        if m["truncated_frac"] >= WARN_TRUNCATED:
            self._warn(
                "truncated",
                f"step {self.step_idx + 1}: {m['truncated_frac']:.0%} of completions hit rollout.max_new_tokens="
                f"{self.cfg.rollout.max_new_tokens}; rewards of cut-off answers are mostly noise — raise it",
            )
        if m["zero_var_frac"] >= WARN_ZERO_VAR:
            self._warn(
                "zero_var",
                f"step {self.step_idx + 1}: {m['zero_var_frac']:.0%} of groups have identical rewards and give "
                "no gradient; the task is too easy/hard for the policy (raise group_size, change "
                "temperature, or use a filtering sampler)",
            )

    def _warn(self, key: str, msg: str, *, force: bool = False, every: int = 10) -> None:
        last = self._last_warned.get(key)
        if not force and last is not None and self.step_idx - last < every:
            return
        self._last_warned[key] = self.step_idx
        warnings.warn(msg, DegenerateSettingWarning, stacklevel=3)

    # ------------------------------------------------------------------------------ checkpointing
    def save(self) -> Path:
        state = {
            "config": self.cfg.model_dump(mode="json"),
            "sampler": self.sampler.state_dict(),
            "controllers": [c.state_dict() for c in self.controllers],
            "replay": self.replay.state_dict(),
            "knobs": {"temperature": self.knobs.temperature, "extra": self.knobs.extra},
        }
        extra = {f"engine.{k}": v for k, v in self.engine.state_dict().items()}
        path = save_checkpoint(
            self.run_dir / "checkpoints",
            self.step_idx,
            model=self.model,
            tokenizer=self.tokenizer,
            optimizer=self.optimizer,
            trainer_state=state,
            extra_tensors=extra,
            keep=self.cfg.checkpoint.keep,
        )
        self._checkpointed_step = self.step_idx
        return path

    def _restore(self, ckpt: Path) -> None:
        state = load_checkpoint(ckpt, optimizer=self.optimizer)
        self.step_idx = int(state["step"])
        self._checkpointed_step = self.step_idx
        self.sampler.load_state_dict(state["sampler"])
        for c, s in zip(self.controllers, state["controllers"], strict=True):
            c.load_state_dict(s)
        self.replay.load_state_dict(state["replay"])
        self.knobs = Knobs(temperature=state["knobs"]["temperature"], extra=state["knobs"]["extra"])
        ext = state["extra_tensors"]
        self.engine.load_state_dict(
            {k[len("engine.") :]: v for k, v in ext.items() if k.startswith("engine.")}
        )

    # ------------------------------------------------------------------------------- evaluation
    def evaluate(self) -> dict[str, Any]:
        from posttrain.train.evaluate import evaluate

        e = self.cfg.eval
        heldout = self.task.split("heldout")[: e.n]
        return evaluate(
            self.model,
            self.tokenizer,
            heldout,
            self.reward_source,
            formatter=self.formatter,
            max_new_tokens=self.cfg.rollout.max_new_tokens,
            success_threshold=self.cfg.reward.success_threshold,
            k=e.k,
            samples=e.samples,
            temperature=e.temperature,
            batch_size=self.cfg.rollout.max_batch_size or 512,
        )

    # ---------------------------------------------------------------------------------- full run
    def train(
        self, *, progress: bool | None = None, overwrite: bool = False, allow_config_change: bool = False
    ) -> dict[str, Any]:
        """Run ``config.steps`` steps (from the resumed step), with logging, eval and checkpoints.
        Returns a summary (first/last eval, last metrics, wall time).

        A fresh run refuses an ``out_dir`` that holds a previous run unless ``overwrite`` (which deletes
        its run files); a resumed run refuses config changes that break it unless
        ``allow_config_change`` (see :mod:`posttrain.train.run_dir`)."""
        from posttrain.train.run_dir import start_run
        from posttrain.utils.progress import progress_bar

        cfg = self.cfg
        self.resume_info = start_run(
            self.run_dir,
            cfg.model_dump(mode="json"),
            step=self.step_idx,
            overwrite=overwrite,
            allow_config_change=allow_config_change,
            defaults=type(cfg)().model_dump(mode="json"),
        )
        logger = MetricsLogger(
            self.run_dir,
            tensorboard=cfg.logging.tensorboard,
            wandb=cfg.logging.wandb,
            wandb_project=cfg.logging.wandb_project,
            config=cfg.model_dump(mode="json"),
            truncate_after=self.step_idx,
        )
        t0 = time.perf_counter()
        summary: dict[str, Any] = {"start_step": self.step_idx}
        show = cfg.logging.progress if progress is None else progress
        try:
            if self.step_idx == 0 and cfg.eval.at_start:
                ev = self.evaluate()
                logger.log_eval(0, ev)
                summary["eval_start"] = _strip(ev)
            last: dict[str, float] = {}
            with progress_bar(
                "rl", total=cfg.steps, enabled=show, completed=self.step_idx, log_every=cfg.logging.every
            ) as bar:
                while self.step_idx < cfg.steps:
                    last = self.step()
                    logger.log_step(last)
                    bar.advance(reward=last["reward_mean"], acc=last["accuracy"], len=last["length_mean"])
                    s = self.step_idx
                    if cfg.eval.every and s % cfg.eval.every == 0 and s < cfg.steps:
                        logger.log_eval(s, self.evaluate())
                    if cfg.checkpoint.every and s % cfg.checkpoint.every == 0:
                        self.save()
            if cfg.eval.at_end and cfg.steps > summary["start_step"]:
                ev = self.evaluate()
                logger.log_eval(self.step_idx, ev)
                summary["eval_end"] = _strip(ev)
            if cfg.checkpoint.final and self._checkpointed_step != self.step_idx:
                self.save()
        finally:
            logger.close()
        summary.update(steps=self.step_idx, wall_s=time.perf_counter() - t0, last=last)
        return summary

    def close(self) -> None:
        if self._own_reward_source:
            self.reward_source.close()

    def __enter__(self) -> RLTrainer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _strip(ev: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in ev.items() if k != "samples"}


def _select_episodes(ep: Episodes, rows: torch.Tensor) -> Episodes:
    idx = rows.tolist()
    return Episodes(
        batch=ep.batch.select(rows),
        texts=[ep.texts[i] for i in idx],
        examples=[ep.examples[i] for i in idx],
        rewards=None if ep.rewards is None else ep.rewards[rows],
        replayed=ep.replayed[rows],
    )


def _select_scored(res: ScoredBatch, rows: list[int]) -> ScoredBatch:
    return ScoredBatch(
        rewards=[res.rewards[i] for i in rows],
        timeouts=res.timeouts,
        errors=res.errors,
        components={k: [vals[i] for i in rows] for k, vals in res.components.items()},
    )
