"""Trainer assembly: every part a trainer runs with, built once, complete, in dependency order.

A trainer's constructor calls one builder and keeps what it returns; nothing is built half and
patched later. :func:`build_rl_parts` builds an :class:`RLParts` in this order (each step needs
only what is above it):

1. the process: torch threads, seeds, device (joining the torchrun group);
2. the task and its training split (checked before any model loads), the checkpoint to resume;
3. the policy (model adapter, LoRA adapters) and its tokenizer;
4. the reward function, the reward source that scores it, the reward-failure monitor;
5. the compute precision (``model.precision`` resolved for the loaded model's device and printed,
   once per run), the run's :class:`~posttrain.rollout.RolloutSpec`, the prompt formatter, the
   training prompts bounded by the context, the rollout engine and episode runner built from the spec
   (synchronous runs; asynchronous ones build theirs in the generation workers);
6. the policy loss, the advantage estimator, the reference policy, the adapter that runs forwards
   with gradient (DDP / FSDP2), the optimizer (after FSDP2 shards the parameters);
7. the hooks (sampler, controllers, replay buffer, group filter: bound to the run's
   :class:`~posttrain.hooks.RunInfo`; shapers), the group source (the local runner, or with
   ``rollout.max_staleness`` > 0 the generation workers of :mod:`posttrain.train.async_rollout`), the
   :class:`~posttrain.train.collector.RolloutCollector` that runs the hooks over it with the reward
   source, the weight transport (:mod:`posttrain.train.weight_sync`), the importance-weight providers;
8. config checks that need the parts (batch splits, multi-process limits).

:func:`build_sft_parts` does the same for supervised fine-tuning (:class:`SFTParts`). Each part may be
passed in as an object instead of being built from the config (``task=``, ``reward=``, ``runner=``,
``sampler=`` ...); the order of every random draw is the one the trainers always had, so runs are
bitwise what they were.
"""

from __future__ import annotations

import copy
import random
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import torch

from posttrain.algos import get_advantage, get_policy_loss
from posttrain.hooks import (
    CONTROLLERS,
    GROUP_FILTERS,
    GROUP_SHAPERS,
    REPLAY_BUFFERS,
    SAMPLERS,
    Controller,
    GroupFilter,
    GroupRewardShaper,
    PromptSampler,
    ReplayBuffer,
    RunInfo,
)
from posttrain.models import CausalLMAdapter, ModelAdapter, load_adapter, pick_device
from posttrain.models.lora import AdapterDisabledLM, is_lora, prepare_model
from posttrain.models.precision import model_precision
from posttrain.rewards import get_reward
from posttrain.rewards.callables import as_reward_fn
from posttrain.rewards.failures import RewardFailureMonitor
from posttrain.rollout import (
    EpisodeRunner,
    PromptFormatter,
    RewardSource,
    RewardSourceContext,
    RolloutEngine,
    RolloutSpec,
    build_reward_source,
)
from posttrain.tasks import get_task
from posttrain.tasks.inputs import as_task
from posttrain.train import dist
from posttrain.train.checkpoint import resolve_checkpoint
from posttrain.train.collector import GroupSource, LocalSource, RolloutCollector
from posttrain.train.config import RLConfig, TaskConfig
from posttrain.train.correction import BehaviourWeights, ImportanceWeights, ReplayWeights
from posttrain.train.lengths import (
    bound_examples,
    bound_prompts,
    check_splits,
    model_context,
    prebound_rows,
)
from posttrain.train.optim import build_adamw
from posttrain.train.sft_data import SFTDataError, SFTExample, encode_rows, iter_rows, read_sft_file
from posttrain.train.weight_sync import WeightSync, choose_weight_sync
from posttrain.utils.data import EpochShuffler
from posttrain.utils.errors import InvalidTypeError, InvalidValueError, PosttrainWarning

if TYPE_CHECKING:
    from posttrain.train.config import SFTConfig


class DegenerateSettingWarning(PosttrainWarning, RuntimeWarning):
    """Training runs but learns little or nothing (truncation, zero-variance groups, bad splits)."""


class StepWarnings:
    """The trainer's :class:`DegenerateSettingWarning`\\s: rank 0 warns for all ranks, each ``key`` at
    most once per ``every`` steps unless ``force``. One object per trainer, shared by the parts that
    warn (the collector, the batch-split check, the step's metrics)."""

    def __init__(self) -> None:
        self.last: dict[str, int] = {}

    def __call__(self, key: str, msg: str, *, step: int, force: bool = False, every: int = 10) -> None:
        if not dist.is_main():
            return
        last = self.last.get(key)
        if not force and last is not None and step - last < every:
            return
        self.last[key] = step
        warnings.warn(msg, DegenerateSettingWarning, stacklevel=3)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def setup_process(threads: int | None, seed: int, device: str, *, pick: bool = False) -> Any:
    """torch's CPU threads (when set), every RNG seeded, the device (``pick``: ``"auto"`` becomes cuda
    when available, else cpu); under torchrun the process group is joined and each rank gets its
    device."""
    if threads:
        torch.set_num_threads(threads)
    seed_everything(seed)
    return dist.setup(pick_device() if pick and device == "auto" else device)


# ------------------------------------------------------------------------------------------ RL
@dataclass
class RLParts:
    """Everything an :class:`~posttrain.train.rl.RLTrainer` runs with.

    ``lm`` is the policy's model adapter (``lm.model``, ``lm.tokenizer``); ``ref_lm`` the frozen
    reference (None without a KL term or a loss input that needs it); ``train_lm`` the adapter the
    forwards with gradient go through (``lm`` itself in one process). ``precision`` is what the run
    computes in (``model.precision`` resolved, and why); ``spec`` how its rollout is built; ``engine``
    the trainer's own engine (None under asynchronous rollout: the workers hold theirs);
    ``weight_sync`` publishes the weights once per step. The collector holds the sampler, replay
    buffer, group filter (None: one round), group source and reward source;
    ``owns_reward_source`` says whether the trainer built (and closes) it. ``checkpoint`` is the
    checkpoint to restore once the trainer exists (``resume=True``), else None."""

    cfg: RLConfig
    device: Any
    precision: str
    precision_reason: str
    task: Any
    train_examples: list[Any]
    checkpoint: Path | None
    lm: ModelAdapter
    ref_lm: ModelAdapter | None
    train_lm: Any
    spec: RolloutSpec
    formatter: PromptFormatter
    engine: RolloutEngine | None
    weight_sync: WeightSync
    reward_fn: Callable[[str, Any], float]
    owns_reward_source: bool
    reward_failures: RewardFailureMonitor
    collector: RolloutCollector
    controllers: list[Controller]
    shapers: list[GroupRewardShaper]
    shaper_names: list[str]
    loss_fn: Any
    adv_fn: Any
    optimizer: torch.optim.Optimizer
    is_weights: list[ImportanceWeights]
    warn: StepWarnings


def build_rl_parts(
    cfg: RLConfig,
    *,
    model: Any = None,
    tokenizer: Any = None,
    resume: bool = False,
    task: Any = None,
    reward: Callable[..., Any] | str | None = None,
    reward_source: RewardSource | None = None,
    runner: EpisodeRunner | None = None,
    sampler: PromptSampler | None = None,
    group_filter: GroupFilter | None = None,
    replay: ReplayBuffer | None = None,
    shapers: list[GroupRewardShaper] | None = None,
    controllers: list[Controller] | None = None,
) -> RLParts:
    """The parts of an RL run (module docstring for the order); each keyword object replaces the part
    the config names (``model`` needs its ``tokenizer``)."""
    # objects are checked before anything loads: a TRL-style task (rows, a datasets.Dataset, a list
    # of Example) or reward (completions, **kwargs) is adapted, anything else refused in one line
    if reward is not None:
        reward = as_reward_fn(reward, where="RLTrainer(reward=...)")
    if cfg.rollout.max_staleness > 0:  # generation workers on Ray: its absence is said before a model loads
        import_async_rollout()
    device = setup_process(cfg.threads, cfg.seed, cfg.model.device, pick=True)
    task = (
        as_task(task, where="RLTrainer(task=...)")
        if task is not None
        else get_task(cfg.task.name, **cfg.task.params)
    )
    needs_heldout = cfg.eval.at_start or cfg.eval.at_end or cfg.eval.every > 0
    train_examples = check_splits(task, needs_heldout=needs_heldout, eval_n=cfg.eval.n)
    ckpt = resolve_checkpoint(Path(cfg.out_dir)) if resume else None
    lm = load_policy(cfg, model, tokenizer, ckpt, device)
    device = next(lm.model.parameters()).device
    precision, why = resolve_run_precision(cfg, lm)
    reward_fn, source, owns_source = build_reward(cfg, task, lm.tokenizer, reward, reward_source)
    failures = RewardFailureMonitor(cfg.reward.max_failed_frac)  # shown once, counted
    spec = cfg.rollout_spec(precision)
    formatter = spec.formatter(lm.tokenizer)
    train_examples = bound_train_prompts(cfg, train_examples, formatter, lm)
    engine, runner = build_rollout(cfg, spec, lm, formatter, runner)  # asynchronous: None (the workers')
    loss_fn, adv_fn = get_policy_loss(cfg.objective.name), get_advantage(cfg.advantage.name)
    needs_ref = cfg.kl.coef > 0 or "ref_logp" in loss_fn.inputs
    ref_lm = reference_policy(cfg, lm, ckpt, device) if needs_ref else None
    # forwards with gradient go through this: the adapter itself, or one over DDP / FSDP2 around the
    # model; FSDP2 shards the parameters in place, so the optimizer is built after it
    train_lm = dist.wrap_adapter(
        lm, batch_size=cfg.rollout.prompts_per_step, strategy=cfg.distributed.strategy
    )
    optimizer = build_adamw(lm.model, cfg.optimizer)
    run = run_info(cfg, lm, formatter, task)
    hooks = build_hooks(cfg, train_examples, run, sampler, controllers, replay, group_filter)
    warn = StepWarnings()
    group_source, weight_sync = build_group_source(
        cfg, spec, lm, train_examples, hooks, (engine, runner, formatter)
    )
    collector = build_collector(cfg, hooks, group_source, source, warn)
    is_weights = importance_weights(cfg, collector)
    shaper_list, shaper_names = build_shapers(cfg, shapers)
    warn_batch_split(cfg, warn)
    dist.check_rl_hooks(
        cfg.rollout.prompts_per_step,
        collector.sampler,
        collector.replay,
        engine=engine,
        model=lm.model,
        group_filter=collector.group_filter,
    )
    return RLParts(
        cfg=cfg,
        device=device,
        precision=precision,
        precision_reason=why,
        task=task,
        train_examples=train_examples,
        checkpoint=ckpt,
        lm=lm,
        ref_lm=ref_lm,
        train_lm=train_lm,
        spec=spec,
        formatter=formatter,
        engine=engine,
        weight_sync=weight_sync,
        reward_fn=reward_fn,
        owns_reward_source=owns_source,
        reward_failures=failures,
        collector=collector,
        controllers=hooks.controllers,
        shapers=shaper_list,
        shaper_names=shaper_names,
        loss_fn=loss_fn,
        adv_fn=adv_fn,
        optimizer=optimizer,
        is_weights=is_weights,
        warn=warn,
    )


def load_policy(cfg: Any, model: Any, tokenizer: Any, ckpt: Path | None, device: Any) -> ModelAdapter:
    """The policy's model adapter: loaded by ``model.adapter`` from ``model.name`` (or the resumed
    checkpoint), or a passed causal LM with its tokenizer; its model in train mode, prepared for
    ``model.lora`` (adapters added, or a resumed LoRA checkpoint kept as loaded) and with gradient
    checkpointing when configured. The adapter is handed on only once it holds the prepared model."""
    if model is None:
        spec = str(ckpt / "model") if ckpt is not None else cfg.model.name
        lm = load_adapter(spec, kind=cfg.model.adapter, dtype=cfg.model.dtype, device=device, seed=cfg.seed)
    elif tokenizer is None:
        raise InvalidValueError("RLTrainer: pass the tokenizer together with the model")
    elif ckpt is not None:
        raise InvalidValueError(
            "RLTrainer: resume=True loads the model from the checkpoint; do not pass a model"
        )
    else:
        lm = CausalLMAdapter(model, tokenizer)
    lm.model = prepare_model(lm.model, cfg.model, seed=cfg.seed, resumed=ckpt is not None)  # models/lora.py
    lm.model.train()
    if cfg.model.gradient_checkpointing:
        lm.model.gradient_checkpointing_enable()
    return lm


def reference_policy(cfg: RLConfig, lm: ModelAdapter, ckpt: Path | None, device: Any) -> ModelAdapter:
    """The frozen reference: the INITIAL policy, never a resumed one. LoRA: the same module with its
    adapters disabled (no second copy); otherwise a copy of the policy, or (resumed) the configured
    model loaded again."""
    if is_lora(lm.model):
        return AdapterDisabledLM(lm)
    if ckpt is None:
        ref = CausalLMAdapter(copy.deepcopy(lm.model), lm.tokenizer)
    else:
        ref = load_adapter(
            cfg.model.name, kind=cfg.model.adapter, dtype=cfg.model.dtype, device=str(device), seed=cfg.seed
        )
    ref.model.eval().requires_grad_(False)
    return ref


def build_reward(
    cfg: RLConfig, task: Any, tokenizer: Any, reward: Any, reward_source: RewardSource | None
) -> tuple[Callable[[str, Any], float], RewardSource, bool]:
    """(the reward function, the reward source that scores it, whether the trainer built the source
    and so closes it). The function is a passed callable, else ``reward.name`` or the task's default
    reward; a callable that cannot be pickled (a lambda or a local class of an importable module) is scored
    in this process (0 workers). A passed ``reward_source`` is used as it is."""
    workers = cfg.reward.num_workers
    if reward is None:
        reward = get_reward(cfg.reward.name or task.default_reward, **cfg.reward.params)
    else:
        reward = as_reward_fn(reward, where="RLTrainer(reward=...)")
        if workers and not _picklable(reward):
            workers = 0
    if reward_source is not None:
        return reward, reward_source, False
    ctx = RewardSourceContext(
        reward,
        task,
        tokenizer,
        num_workers=workers,
        timeout_s=cfg.reward.timeout_s,
        seed=dist.rank_seed(cfg.seed),
    )
    return reward, build_reward_source(cfg.reward.source.name, cfg.reward.source.params, ctx), True


def resolve_run_precision(cfg: Any, lm: ModelAdapter) -> tuple[str, str]:
    """What the run computes in (``model.precision`` resolved for the device the model was loaded on
    and the dtype its weights are stored in) and why, printed once per run (rank 0)."""
    return model_precision(cfg.model.precision, lm.model, quiet=not dist.is_main())


def build_rollout(
    cfg: RLConfig,
    spec: RolloutSpec,
    lm: ModelAdapter,
    formatter: PromptFormatter,
    runner: EpisodeRunner | None,
) -> tuple[RolloutEngine | None, EpisodeRunner | None]:
    """The trainer's rollout engine (sampling seed ``seed + 1``) and the episode runner over it (or the
    passed one), built from the run's ``spec``; under asynchronous rollout none (the generation workers
    build theirs from the same spec)."""
    if cfg.rollout.max_staleness > 0:
        if runner is not None:
            raise InvalidValueError(
                "RLTrainer(runner=...) with rollout.max_staleness > 0: the generation workers build their "
                "runner from rollout.runner (a runner object cannot be sent to them); name it in the config"
            )
        return None, None
    built = spec.build(
        lm.model,
        lm.tokenizer,
        seed=dist.rank_seed(cfg.seed + 1),
        runner_seed=dist.rank_seed(cfg.seed),
        runner=runner,
        formatter=formatter,
    )
    return built.engine, built.runner


def bound_train_prompts(
    cfg: RLConfig, examples: list[Any], formatter: PromptFormatter, lm: ModelAdapter
) -> list[Any]:
    """The training examples whose prompts leave ``rollout.max_new_tokens`` in the model's context
    (``rollout.overlong_prompts``: an error naming the row, or skip it)."""
    kept, _ = bound_prompts(
        examples,
        formatter.encode,
        context=model_context(lm.model),
        max_new_tokens=cfg.rollout.max_new_tokens,
        policy=cfg.rollout.overlong_prompts,
        where=f"task {cfg.task.name!r}: train split",
    )
    return kept


def run_info(cfg: RLConfig, lm: ModelAdapter, formatter: PromptFormatter, task: Any) -> RunInfo:
    """What the hooks may know about the run (given once through ``bind``)."""
    return RunInfo(
        vocab_size=int(lm.model.get_output_embeddings().weight.shape[0]),
        total_steps=cfg.steps,
        policy=lm,
        encode_prompt=formatter.encode,
        chunk_size=cfg.logprob_chunk_size,
        task=task,
    )


def build_collector(
    cfg: RLConfig, hooks: RLHooks, source: GroupSource, reward_source: RewardSource, warn: StepWarnings
) -> RolloutCollector:
    """The step's rollout, complete: the sampler, replay buffer and group filter of ``hooks`` over the
    group ``source``, scored by ``reward_source``."""
    return RolloutCollector(
        source=source,
        sampler=hooks.sampler,
        replay=hooks.replay,
        group_filter=hooks.group_filter,
        reward_source=reward_source,
        prompts_per_step=cfg.rollout.prompts_per_step,
        group_size=cfg.rollout.group_size,
        success_threshold=cfg.reward.success_threshold,
        warn=warn,
    )


def import_async_rollout() -> Any:
    """:mod:`posttrain.train.async_rollout` once Ray is known to be installed (a one-line error
    naming the extra otherwise): Ray is imported only when ``rollout.max_staleness`` > 0."""
    from posttrain.train import async_rollout

    async_rollout.require_ray()
    return async_rollout


def build_group_source(
    cfg: RLConfig,
    spec: RolloutSpec,
    lm: ModelAdapter,
    train_examples: list[Any],
    hooks: RLHooks,
    local: tuple[RolloutEngine | None, EpisodeRunner | None, PromptFormatter],
) -> tuple[GroupSource, WeightSync]:
    """Where the step's groups come from and how the weights reach it: the ``local`` (engine, runner,
    formatter) of the trainer (weights shared, or reloaded by an engine with its own copy), or with
    ``rollout.max_staleness`` > 0 generation workers reading the object store."""
    engine, runner, formatter = local
    if cfg.rollout.max_staleness == 0:
        assert engine is not None and runner is not None
        return LocalSource(runner, formatter, engine.pad_token_id), choose_weight_sync(engine)
    if dist.world_size() > 1:
        raise InvalidValueError(
            f"rollout.max_staleness={cfg.rollout.max_staleness}: asynchronous rollout runs in one trainer "
            "process; under torchrun use rollout.max_staleness=0"
        )
    over = hooks.group_filter.oversample if hooks.group_filter is not None else 1.0
    return import_async_rollout().worker_source(
        cfg.rollout,
        spec,
        lm.model,
        lm.tokenizer,
        train_examples,
        seed=cfg.seed,
        oversample=over,
        lora=is_lora(lm.model),
    )


def importance_weights(cfg: RLConfig, collector: RolloutCollector) -> list[ImportanceWeights]:
    """The per-token importance-weight providers, multiplied: replayed rows (the buffer's weights), and
    on fresh rows the one correction over the behaviour policy μ, ``rollout.is_correction`` (engine
    mismatch and staleness alike: μ is the engine's own sampling log-probs)."""
    out: list[ImportanceWeights] = [ReplayWeights(lambda: collector.replay)]
    mode = cfg.rollout.correction_mode()
    if mode is not None:
        c = cfg.rollout.is_correction
        out.append(BehaviourWeights(mode, c.cap, c.floor))
    return out


def build_formatter(task_cfg: TaskConfig, tokenizer: Any) -> PromptFormatter:
    """Prompt text -> token ids with the task's template, chat template and assistant prefix: the one
    formatter rollout, SFT and evaluation share."""
    return RolloutSpec(
        template=task_cfg.prompt_template,
        chat=task_cfg.chat_template,
        assistant_prefix=task_cfg.assistant_prefix,
    ).formatter(tokenizer)


class RLHooks(NamedTuple):
    """The hooks :func:`build_hooks` builds (the shapers are :func:`build_shapers`')."""

    sampler: PromptSampler
    controllers: list[Controller]
    replay: ReplayBuffer
    group_filter: GroupFilter | None


#: Attributes of the sampler-owned group filter removed in 0.2.0 (a group filter is ``hooks.filter``).
REMOVED_SAMPLER_API = ("group_filter", "filters_groups", "keep_groups")


def build_hooks(
    cfg: RLConfig,
    train_examples: list[Any],
    run: RunInfo,
    sampler: PromptSampler | None,
    controllers: list[Controller] | None,
    replay: ReplayBuffer | None,
    group_filter: GroupFilter | None,
) -> RLHooks:
    """The sampler, controllers, replay buffer and group filter (None when it is inactive: one round),
    each the passed object or the one ``cfg.hooks`` names, bound to ``run``."""
    h = cfg.hooks
    sampler = sampler or SAMPLERS.get(h.sampler.name)(train_examples, seed=cfg.seed, **h.sampler.params)
    old = [a for a in REMOVED_SAMPLER_API if hasattr(sampler, a)]
    if old:
        raise InvalidTypeError(
            f"hooks.sampler {type(sampler).__name__} defines {', '.join(old)}: a sampler that filters "
            "groups itself was removed in 0.2.0; put the keep rule in a posttrain.hooks.GroupFilter and "
            "set it as hooks.filter (or pass group_filter=)"
        )
    if controllers is None:
        controllers = [CONTROLLERS.get(c.name)(**c.params) for c in h.controllers]
    controllers = list(controllers)
    for c in controllers:
        c.bind(run)
    replay = replay or REPLAY_BUFFERS.get(h.replay.name)(**h.replay.params)
    group_filter = group_filter or GROUP_FILTERS.get(h.filter.name)(**h.filter.params)
    active = group_filter if group_filter.active else None
    for hook in (sampler, replay, active):
        if hook is not None:
            hook.bind(run)
    return RLHooks(sampler, controllers, replay, active)


def build_shapers(
    cfg: RLConfig, shapers: list[GroupRewardShaper] | None
) -> tuple[list[GroupRewardShaper], list[str]]:
    """The group reward shapers in the order they apply, with the names their metrics carry
    (``shaping/<i>_<name>_abs_change``): the passed objects (named by class), else ``hooks.shapers``."""
    if shapers is not None:
        return list(shapers), [type(s).__name__ for s in shapers]
    specs = cfg.hooks.shapers
    return [GROUP_SHAPERS.get(s.name)(**s.params) for s in specs], [s.name for s in specs]


def warn_batch_split(cfg: RLConfig, warn: StepWarnings) -> None:
    """Warn when the step's batch does not split evenly into minibatches, groups or micro-batches."""
    n = cfg.rollout.prompts_per_step * cfg.rollout.group_size
    if n % cfg.minibatches:
        warn(
            "split",
            f"batch of {n} sequences is not divisible by minibatches={cfg.minibatches}; "
            "minibatches will differ in size",
            step=0,
            force=True,
        )
    elif (n // cfg.minibatches) % cfg.rollout.group_size:
        warn(
            "split_groups",
            f"minibatch size {n // cfg.minibatches} is not a multiple of rollout.group_size="
            f"{cfg.rollout.group_size}; groups are split across optimizer steps",
            step=0,
            force=True,
        )
    if cfg.micro_batch_size and (n // cfg.minibatches) % cfg.micro_batch_size:
        warn(
            "micro",
            f"minibatch size {n // cfg.minibatches} is not divisible by micro_batch_size="
            f"{cfg.micro_batch_size}; the last micro-batch is smaller (gradients are still exact)",
            step=0,
            force=True,
        )


def _picklable(obj: Any) -> bool:
    """True when ``obj`` can go to reward-pool worker processes (module-level classes and functions, and
    anything defined in ``__main__``, which the pool sends by value)."""
    from posttrain.rewards.pool import dumps_for_workers

    try:
        dumps_for_workers(obj)
    except Exception:
        return False
    return True


# ------------------------------------------------------------------------------------------ SFT
@dataclass
class SFTParts:
    """Everything an :class:`~posttrain.train.sft.SFTTrainer` runs with. ``task`` is the task when the
    training examples came from it (else None: it is loaded when first needed, for evaluation);
    ``eval_examples`` the encoded ``eval_data`` rows (None without); ``checkpoint`` the checkpoint to
    restore once the trainer exists."""

    device: Any
    precision: str
    precision_reason: str
    checkpoint: Path | None
    lm: ModelAdapter
    formatter: PromptFormatter
    task: Any
    examples: list[SFTExample]
    eval_examples: list[SFTExample] | None
    train_lm: Any
    optimizer: torch.optim.Optimizer
    shuffler: EpochShuffler


def build_sft_parts(
    cfg: SFTConfig,
    model: Any = None,
    tokenizer: Any = None,
    *,
    pairs: list[tuple[str, str]] | None = None,
    rows: list[Any] | None = None,
    resume: bool = False,
    adapter: ModelAdapter | None = None,
) -> SFTParts:
    """The parts of an SFT run: the process, the model adapter (loaded, a passed model and tokenizer,
    or a passed ``adapter``), the formatter, the training examples (``pairs``, ``rows``, ``data`` or
    the task's reference completions) and ``eval_data`` within ``max_length``, the adapter forwards
    with gradient go through, the optimizer and the data order."""
    device = setup_process(cfg.threads, cfg.seed, cfg.model.device)
    ckpt = resolve_checkpoint(Path(cfg.out_dir)) if resume else None
    if ckpt is not None and (model is not None or adapter is not None):
        raise InvalidValueError(
            "SFTTrainer: resume=True loads the model from the checkpoint; do not pass a model"
        )
    if adapter is not None and model is not None:
        raise InvalidValueError("SFTTrainer: pass either a model and tokenizer or an adapter, not both")
    if adapter is None and model is None:
        spec = str(ckpt / "model") if ckpt is not None else cfg.model.name
        adapter = load_adapter(
            spec, kind=cfg.model.adapter, dtype=cfg.model.dtype, device=device, seed=cfg.seed
        )
    elif adapter is None:
        adapter = CausalLMAdapter(model, tokenizer)
    # model.lora: adapters added (a resumed LoRA checkpoint is kept as loaded); models/lora.py
    adapter.model = prepare_model(adapter.model, cfg.model, seed=cfg.seed, resumed=ckpt is not None)
    if cfg.model.gradient_checkpointing:
        adapter.model.gradient_checkpointing_enable()
    precision, why = resolve_run_precision(cfg, adapter)
    formatter = build_formatter(cfg.task, adapter.tokenizer)
    task, parsed, source = sft_rows(cfg, pairs, rows)
    examples = bound_sft_rows(cfg, parsed, source, adapter, formatter)
    eval_examples = None
    if cfg.eval_data:
        eval_rows = read_sft_file(cfg.eval_data, cfg.data_fields)
        eval_examples = bound_sft_rows(cfg, eval_rows, cfg.eval_data, adapter, formatter)
    # distributed: forwards with gradient go through DDP / FSDP2 (dist.wrap_adapter); the adapter itself
    # in one process. FSDP2 shards the parameters in place, so the optimizer is built after it
    train_lm = dist.wrap_adapter(adapter, batch_size=cfg.batch_size, strategy=cfg.distributed.strategy)
    return SFTParts(
        device=adapter.device,
        precision=precision,
        precision_reason=why,
        checkpoint=ckpt,
        lm=adapter,
        formatter=formatter,
        task=task,
        examples=examples,
        eval_examples=eval_examples,
        train_lm=train_lm,
        optimizer=build_adamw(adapter.model, cfg.optimizer),
        shuffler=EpochShuffler(len(examples), seed=cfg.seed, order="stream"),
    )


def task_pairs(task: Any, *, style: str = "short", max_examples: int | None = None) -> list[tuple[str, str]]:
    """(prompt, reference completion) for the task's training split."""
    exs = task.split("train")[:max_examples]
    return [(ex.prompt, task.reference_completion(ex, style=style)) for ex in exs]


def sft_rows(cfg: SFTConfig, pairs: list | None, rows: list | None) -> tuple[Any, list[Any], str]:
    """(the task when the rows came from it else None, the parsed training rows, where they came
    from): ``pairs``, else ``rows``, else ``cfg.data``, else the task's reference completions; at most
    ``max_examples``."""
    task = None
    if pairs is not None and rows is not None:
        raise InvalidValueError("SFTTrainer: pass pairs or rows, not both")
    if pairs is not None:
        parsed, source = list(iter_rows(pairs, "pairs")), "pairs"
    elif rows is not None:
        parsed, source = list(iter_rows(rows, "rows", cfg.data_fields)), "rows"
    elif cfg.data:
        parsed, source = read_sft_file(cfg.data, cfg.data_fields), cfg.data
    else:
        source = f"task {cfg.task.name!r} (train split)"
        task = get_task(cfg.task.name, **cfg.task.params)
        task_rows = task_pairs(task, style=cfg.style, max_examples=cfg.max_examples)
        parsed = list(iter_rows(task_rows, f"task {cfg.task.name!r} train"))
    parsed = parsed[: cfg.max_examples]
    if not parsed:
        raise SFTDataError(f"{source}: no training examples")
    return task, parsed, str(source)


def bound_sft_rows(
    cfg: SFTConfig, parsed: list[Any], source: str, lm: ModelAdapter, formatter: PromptFormatter
) -> list[SFTExample]:
    """Encode rows within ``max_length`` (default: the model's context) as ``overlong`` says."""
    ctx = model_context(lm.model)
    if cfg.max_length and ctx and cfg.max_length > ctx:
        raise SFTDataError(f"max_length: {cfg.max_length} is longer than the model's context ({ctx} tokens)")
    limit = cfg.max_length or ctx
    parsed, report = prebound_rows(parsed, limit, cfg.overlong)
    examples, report = bound_examples(
        encode_rows(parsed, lm.tokenizer, formatter), limit, cfg.overlong, report
    )
    note = report.note(source, limit or 0)
    if note and dist.is_main():
        print(f"note: {note} (overlong={cfg.overlong})", file=sys.stderr, flush=True)
    if not examples:
        raise SFTDataError(f"{source}: no rows left within max_length={limit} tokens")
    return examples
