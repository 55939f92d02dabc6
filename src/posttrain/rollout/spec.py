"""One description of how rollout is built: :class:`RolloutSpec`.

A run's rollout is an engine (``rollout.engine``: HF, the fast CPU engine, vLLM or a plug-in), an episode
runner over it (``rollout.runner``: single-turn, multi-turn or a plug-in) and the prompt formatter they
share (the task's template, chat template and assistant prefix), generating in the run's compute
precision with at most ``max_batch_size`` sequences per call. :class:`RolloutSpec` holds exactly that, is
picklable (names and parameters, no model), and :meth:`RolloutSpec.build` turns it into a
:class:`Rollout` around a model. The trainer, the evaluator (its own seed and batch cap:
:meth:`RolloutSpec.replace`) and every generation worker of asynchronous rollout build their rollout with
it; nothing else builds an engine or a runner from a config, so the three cannot drift apart.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from posttrain.models.precision import check_precision
from posttrain.rollout.base import RolloutEngine
from posttrain.rollout.episodes import EpisodeRunner, PromptFormatter
from posttrain.rollout.registry import EngineContext, RunnerContext, build_engine, build_runner


@dataclass(frozen=True)
class Rollout:
    """A built rollout: the ``engine``, the episode ``runner`` over it and the prompt ``formatter``."""

    engine: RolloutEngine
    runner: EpisodeRunner
    formatter: PromptFormatter


@dataclass(frozen=True)
class RolloutSpec:
    """How to build rollout around a model (module docstring).

    ``engine`` / ``engine_params``: a name of ``posttrain.rollout.ENGINES`` (or ``package.module:Name``)
    and its parameters; ``runner`` / ``runner_params`` likewise for ``posttrain.rollout.RUNNERS``;
    ``template``, ``chat`` and ``assistant_prefix`` configure the :class:`PromptFormatter`
    (``task.prompt_template``, ``task.chat_template``, ``task.assistant_prefix``); ``precision`` is the
    resolved compute precision (fp32 or bf16: resolve ``auto`` before, where the model is built);
    ``max_batch_size`` caps the sequences per generate call (None: no cap)."""

    engine: Any = "hf"
    engine_params: Mapping[str, Any] = field(default_factory=dict)
    runner: Any = "single-turn"
    runner_params: Mapping[str, Any] = field(default_factory=dict)
    template: str = "{prompt}"
    chat: bool = False
    assistant_prefix: str = ""
    precision: str = "fp32"
    max_batch_size: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "precision", check_precision(self.precision))
        object.__setattr__(self, "engine_params", dict(self.engine_params or {}))
        object.__setattr__(self, "runner_params", dict(self.runner_params or {}))

    def replace(self, **changes: Any) -> RolloutSpec:
        """A copy with ``changes`` (e.g. the evaluator's batch cap, a runner without tools)."""
        return dataclasses.replace(self, **changes)

    def formatter(self, tokenizer: Any) -> PromptFormatter:
        """Prompt text -> token ids with this spec's template, chat template and assistant prefix: the
        one formatter rollout, SFT and evaluation share."""
        return PromptFormatter(
            tokenizer, template=self.template, chat=self.chat, assistant_prefix=self.assistant_prefix
        )

    def build(
        self,
        model: Any,
        tokenizer: Any,
        *,
        seed: int,
        runner_seed: int | None = None,
        runner: EpisodeRunner | None = None,
        formatter: PromptFormatter | None = None,
    ) -> Rollout:
        """The engine (its sampling generator seeded with ``seed``) over ``model``, the runner over it
        (``runner_seed``, default ``seed``, for the runner's own randomness; or the passed ``runner``)
        and the formatter (or the passed ``formatter``)."""
        formatter = formatter or self.formatter(tokenizer)
        ctx = EngineContext(
            model, tokenizer, seed=seed, max_batch_size=self.max_batch_size, precision=self.precision
        )
        engine = build_engine(self.engine, self.engine_params, ctx)
        if runner is None:
            run_ctx = RunnerContext(engine, formatter, tokenizer, seed=seed if runner_seed is None else runner_seed)
            runner = build_runner(self.runner, self.runner_params, run_ctx)
        return Rollout(engine, runner, formatter)
