"""Registry entries of :mod:`posttrain_lab.recipes.patarm` (imported by :mod:`posttrain.rollout.registry`).

* reward source ``judge`` — a pointwise generative judge (:class:`~posttrain_lab.recipes.patarm.judge.JudgeRewardSource`);
* reward source ``par`` — PAR rewards of judge rollouts (:class:`~posttrain_lab.recipes.patarm.par_rl.PARRewardSource`);
* episode runner ``par`` — n judgments of each side of a preference pair (:class:`~posttrain_lab.recipes.patarm.par_rl.PARRunner`);
The task ``preferences`` (:class:`~posttrain_lab.recipes.patarm.preference_task.PreferenceTask`) is registered by
:mod:`posttrain.tasks`.
"""

from __future__ import annotations

from typing import Any, Literal

from posttrain.rollout.registry import REWARD_SOURCES, RUNNERS, RewardSourceContext, RunnerContext
from posttrain.utils.errors import InvalidValueError
from posttrain_lab.recipes.patarm.prompts import DEFAULT_SCALE


@REWARD_SOURCES.register("judge")
def judge_reward_source(
    ctx: RewardSourceContext,
    *,
    judge: Literal["hf", "endpoint", "random"] = "hf",
    model: str | None = None,
    base_url: str | None = None,
    api_key_env: str | None = None,
    chat_template: bool = False,
    enable_thinking: bool | None = None,
    temperature: float = 0.0,
    max_new_tokens: int = 256,
    device: str = "auto",
    precision: str = "fp32",
    engine: str = "hf",
    concurrency: int = 8,
    samples: int = 1,
    scale: tuple[float, float] = DEFAULT_SCALE,
    rubric_style: Literal["full", "names", "none"] = "full",
    default_task_type: str = "chat",
    batch_size: int = 32,
    timeout_s: float = 120.0,
    max_retries: int = 1,
    retry_unparsable: bool = True,
    cache_size: int = 100_000,
    fallback: bool = True,
) -> Any:
    """A generative judge as the reward (proposed design: mean of ``samples`` scores, normalised to
    [0, 1] on ``scale``). ``judge``: ``hf`` (in-process ``model``: checkpoint / hub id / preset),
    ``endpoint`` (OpenAI-compatible ``base_url`` + ``model``; key from env var ``api_key_env``) or
    ``random`` (control). ``timeout_s`` / ``max_retries`` apply to each batched judge call.
    ``enable_thinking`` (hf judges with ``chat_template``) is passed to the chat template; a judgment
    cut off at ``max_new_tokens`` is never scored as a verdict. ``precision`` (hf): "fp32" or "bf16"
    (autocast, as ``model.precision``); ``engine`` (hf): the rollout engine that generates judgments."""
    from posttrain_lab.recipes.patarm.judge import EndpointJudge, HFJudge, JudgeRewardSource, RandomJudge

    if judge == "hf":
        if not model:
            raise InvalidValueError(
                "reward source 'judge' (judge=hf): set params.model (a checkpoint, hub id or preset)"
            )
        j: Any = HFJudge(
            model,
            chat_template=chat_template,
            enable_thinking=enable_thinking,
            temperature=temperature,
            max_new_tokens=max_new_tokens,
            device=device,
            precision=precision,
            engine=engine,
            seed=ctx.seed,
        )
    elif judge == "endpoint":
        if not base_url or not model:
            raise InvalidValueError(
                "reward source 'judge' (judge=endpoint): set params.base_url and params.model"
            )
        j = EndpointJudge(
            base_url,
            model,
            api_key_env=api_key_env,
            temperature=temperature,
            max_tokens=max_new_tokens,
            concurrency=concurrency,
            timeout_s=timeout_s,
            max_retries=max_retries,
        )
    elif judge == "random":
        j = RandomJudge(scale=scale, seed=ctx.seed)
    else:
        raise InvalidValueError(
            f"reward source 'judge': unknown judge {judge!r}; accepted: hf, endpoint, random"
        )
    return JudgeRewardSource(
        j,
        samples=samples,
        scale=scale,
        rubric_style=rubric_style,
        default_task_type=default_task_type,
        batch_size=batch_size,
        timeout_s=timeout_s,
        max_retries=max_retries,
        retry_unparsable=retry_unparsable,
        cache_size=cache_size,
        fallback=fallback,
    )


@REWARD_SOURCES.register("par")
def par_reward_source(
    ctx: RewardSourceContext,
    *,
    rule: Literal["antisymmetric", "indicator"] = "antisymmetric",
    graded: bool = False,
    alpha: float = 0.5,
    delta: float | None = None,
    format_penalty: float = 0.0,
    scale: tuple[float, float] = DEFAULT_SCALE,
    fallback: bool = True,
) -> Any:
    """PAR rewards of judge rollouts, per preference pair (proposed design: ``rule`` antisymmetric
    (+1 / −1 / 0) or indicator (1 / 0); graded option)."""
    from posttrain_lab.recipes.patarm.par_rl import PARRewardSource

    return PARRewardSource(
        rule=rule,
        graded=graded,
        alpha=alpha,
        delta=delta,
        format_penalty=format_penalty,
        scale=scale,
        fallback=fallback,
    )


@RUNNERS.register("par")
def par_runner(
    ctx: RunnerContext,
    *,
    rubric_style: Literal["full", "names", "none"] = "full",
    scale: tuple[float, float] = DEFAULT_SCALE,
    enable_thinking: bool | None = None,
) -> Any:
    """n judge rollouts for the chosen and n for the rejected response of each pair (two groups).
    ``enable_thinking`` is passed to the chat template (``task.chat_template: true``)."""
    from posttrain_lab.recipes.patarm.par_rl import PARRunner

    return PARRunner(
        ctx.engine, ctx.formatter, rubric_style=rubric_style, scale=scale, enable_thinking=enable_thinking
    )
