"""Held-out evaluation: greedy pass@1 and sampled pass@k.

pass@k uses the unbiased estimator of Chen et al. 2021 (Codex, arXiv 2107.03374, Eq. 1): with n
samples of which c are correct,

    pass@k = 1 − C(n − c, k) / C(n, k) = 1 − Π_{i = n−c+1}^{n} (1 − k / i)

averaged over problems (the product form is the numerically stable one from the paper's code).

:func:`run_eval` evaluates with any episode runner (over any engine) and reward source, the same
registry-built components training uses (``rollout.engine``, ``rollout.runner``, ``reward.source``);
:func:`evaluate` builds them for a bare model. ``posttrain eval`` resolves a run folder to its model,
checkpoint step and saved settings (:func:`locate_model`, :func:`evaluate_cli_settings`,
:func:`evaluate_run`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from posttrain.hooks import GROUP_SHAPERS, Hook, hook_metrics
from posttrain.rollout.base import SamplingParams
from posttrain.rollout.episodes import EpisodeRunner, PromptFormatter
from posttrain.rollout.reward_source import RewardSource
from posttrain.rollout.spec import RolloutSpec
from posttrain.train.config import EVAL_MAX_BATCH_SIZE
from posttrain.utils.errors import InvalidValueError
from posttrain.utils.registry import Registry, any_callable

#: Evaluation harnesses a run can score itself with (``eval.harness.name``): ``fn(model adapter, tasks,
#: limit, **params) -> {task: {metric: value}}``. lm-evaluation-harness registers as ``lm-eval`` through
#: the ``posttrain.eval_harnesses`` entry point (``posttrain.integrations.lm_eval:run_harness``).
EVAL_HARNESSES: Registry[Any] = Registry("evaluation harness", group="posttrain.eval_harnesses")
EVAL_HARNESSES.accept(
    any_callable, "a function (model adapter, tasks, limit, **params) -> {task: {metric: value}}"
)

EVAL_SEED = 1234
"""Seed of the evaluation engine's sampling generator (pass@k samples)."""
WARN_TRUNCATED = 0.5
"""Warn when at least this fraction of greedy completions hit ``max_new_tokens``."""


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one problem with n samples, c correct (Chen et al. 2021)."""
    if not 0 <= c <= n:
        raise InvalidValueError(f"pass_at_k: need 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise InvalidValueError(f"pass_at_k: need 1 <= k <= n, got k={k}, n={n}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def run_eval(
    runner: EpisodeRunner,
    examples: list[Any],
    reward_source: RewardSource,
    *,
    max_new_tokens: int = 16,
    success_threshold: float = 1.0,
    k: int = 1,
    samples: int = 1,
    temperature: float = 1.0,
    report: Any = None,
    metric_hooks: Sequence[Hook | None] = (),
) -> dict[str, Any]:
    """Greedy pass@1 (``accuracy``), mean reward, length and truncated fraction on ``examples`` with
    any episode ``runner`` (over any engine) and ``reward_source``; with ``k > 1`` also ``pass@k`` from
    ``samples`` completions per example at ``temperature``. Episodes the runner scored itself
    (``Episodes.rewards``) are not sent to the reward source. ``report(examples, texts) -> dict``
    (a task's ``eval_report``, e.g. IFBench's accuracies) adds ``result["report"]`` from the greedy
    completions; each of ``metric_hooks`` adds its ``eval_metrics`` of the greedy episodes (ASRR's
    ``continue_thinking``; :func:`posttrain.hooks.hook_metrics`)."""
    if not examples:
        raise InvalidValueError("evaluate: no examples")
    if k > 1 and samples < k:
        raise InvalidValueError(f"evaluate: pass@{k} needs samples >= {k}, got {samples}")
    t0 = time.perf_counter()
    greedy = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens, logprobs=False)
    eps = runner.run(examples, [1] * len(examples), greedy)
    rewards, timeouts, errors, failures = _rewards(eps, reward_source)
    correct = rewards >= success_threshold
    out: dict[str, Any] = {
        "n": len(examples),
        "accuracy": float(correct.mean()),
        "reward_mean": float(rewards.mean()),
        "length_mean": float(eps.batch.action_lengths.float().mean()),
        "truncated": float(eps.batch.truncated.float().mean()),
        "max_new_tokens": max_new_tokens,
        "reward_timeouts": timeouts,
        "reward_errors": errors,
        **({"reward_failures": failures} if failures else {}),
        **runner.eval_metrics(eps),
    }
    if k > 1:
        params = SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens, logprobs=False)
        seps = runner.run(examples, [samples] * len(examples), params)
        s = _rewards(seps, reward_source)[0] >= success_threshold
        per_group = np.zeros(len(examples), dtype=int)
        np.add.at(per_group, seps.batch.group_ids.numpy(), s.astype(int))
        out[f"pass@{k}"] = float(np.mean([pass_at_k(samples, int(c), k) for c in per_group]))
        out["sampled_accuracy"] = float(s.mean())
    out.update(hook_metrics(metric_hooks, eps, kind="eval", reserved=out))  # the hooks' own numbers
    if report is not None:
        out["report"] = report(list(eps.examples), list(eps.texts))
    out["wall_s"] = time.perf_counter() - t0
    out["samples"] = [
        {"prompt": e.prompt, "completion": t, "answer": e.answer}
        for e, t in zip(eps.examples[:5], eps.texts[:5], strict=True)
    ]
    return out


def _rewards(eps: Any, reward_source: RewardSource) -> tuple[np.ndarray, int, int, dict[str, str]]:
    if eps.rewards is not None:  # the runner's environment scored its own episodes
        return np.asarray(eps.rewards, dtype=float), 0, 0, {}
    scored = reward_source.score(eps.texts, eps.examples)
    if len(scored.rewards) != len(eps):
        raise InvalidValueError(
            f"reward source returned {len(scored.rewards)} rewards for {len(eps)} completions"
        )
    return np.asarray(scored.rewards, dtype=float), scored.timeouts, scored.errors, scored.failures


def reward_failure_warning(result: dict[str, Any]) -> str | None:
    """A warning when some greedy completions' rewards failed (raised, timed out, NaN / inf: scored 0,
    so the accuracy counts them as wrong), with the first failure of each kind; None otherwise."""
    errors, timeouts = int(result.get("reward_errors", 0)), int(result.get("reward_timeouts", 0))
    if not errors + timeouts:
        return None
    first = "\n".join(f"  {k}: {v.rstrip()}" for k, v in (result.get("reward_failures") or {}).items())
    return (
        f"{errors + timeouts} of {result['n']} rewards failed ({errors} errors, {timeouts} timeouts) and "
        f"scored 0: the accuracy counts them as wrong, so it does not measure the model"
        + (f"; first failure of each kind:\n{first}" if first else "")
    )


def truncation_warning(result: dict[str, Any], *, option: str = "max_new_tokens") -> str | None:
    """A warning when most greedy completions were cut off at ``max_new_tokens`` (their rewards then
    mostly measure the length cap, not the model); None otherwise."""
    frac = float(result.get("truncated", 0.0))
    if frac < WARN_TRUNCATED:
        return None
    return (
        f"{frac:.0%} of greedy completions hit {option}={result.get('max_new_tokens')}; cut-off answers "
        "score as wrong, so this accuracy mostly measures the length cap: raise it"
    )


def eval_runner(
    model: Any,
    tokenizer: Any,
    formatter: PromptFormatter,
    *,
    max_batch_size: int | None,
    engine: str = "hf",
    engine_params: dict[str, Any] | None = None,
    runner: str = "single-turn",
    runner_params: dict[str, Any] | None = None,
    precision: str = "fp32",
    seed: int = EVAL_SEED,
) -> EpisodeRunner:
    """The engine and episode runner an evaluation generates with, built by a
    :class:`~posttrain.rollout.RolloutSpec` like training's (``rollout.engine``, ``rollout.runner``) but
    with their own sampling generator seeded with ``seed``, so evaluating never perturbs a training
    run's RNG streams. ``max_batch_size`` is the evaluation batch cap (``EvalConfig.batch_cap``; None =
    no limit)."""
    spec = RolloutSpec(
        engine=engine,
        engine_params=engine_params or {},
        runner=runner,
        runner_params=runner_params or {},
        precision=precision,
        max_batch_size=max_batch_size,
    )
    return spec.build(model, tokenizer, seed=seed, formatter=formatter).runner


def config_eval_runner(
    cfg: Any,
    model: Any,
    tokenizer: Any,
    formatter: PromptFormatter,
    *,
    runner_params: dict[str, Any] | None = None,
    precision: str | None = None,
) -> EpisodeRunner:
    """:func:`eval_runner` as a run config sets it (``RLTrainer.eval_runner`` and the drivers that
    evaluate arms of a config): the run's :class:`~posttrain.rollout.RolloutSpec`
    (``RLConfig.rollout_spec``) with the evaluation batch cap ``eval.batch_cap(rollout.max_batch_size)``
    (``runner_params`` replaces the runner's parameters, e.g. without tools), at ``precision`` (the
    trainer's resolved one; None: ``model.precision`` resolved for ``model``, quietly)."""
    if precision is None:
        precision = config_precision(cfg, model)
    spec = cfg.rollout_spec(precision).replace(max_batch_size=cfg.eval.batch_cap(cfg.rollout.max_batch_size))
    if runner_params is not None:
        spec = spec.replace(runner_params=runner_params)
    return spec.build(model, tokenizer, seed=EVAL_SEED, formatter=formatter).runner


def config_precision(cfg: Any, model: Any) -> str:
    """``model.precision`` of ``cfg`` resolved for ``model``'s device and weight dtype (no note printed)."""
    from posttrain.models.precision import model_precision

    return model_precision(cfg.model.precision, model)[0]


def evaluate(
    model: Any,
    tokenizer: Any,
    examples: list[Any],
    reward_source: RewardSource,
    *,
    formatter: PromptFormatter | None = None,
    engine: str = "hf",
    engine_params: dict[str, Any] | None = None,
    runner: str = "single-turn",
    max_new_tokens: int = 16,
    success_threshold: float = 1.0,
    k: int = 1,
    samples: int = 1,
    temperature: float = 1.0,
    batch_size: int | None = EVAL_MAX_BATCH_SIZE,
    seed: int = EVAL_SEED,
    report: Any = None,
    precision: str = "fp32",
) -> dict[str, Any]:
    """:func:`run_eval` with an ``engine`` (its ``engine_params``) and episode ``runner`` built by
    :func:`eval_runner` (default: Hugging Face ``generate`` and single-turn episodes, at most
    ``batch_size`` sequences per generate call) over ``model``, generating in ``precision`` ("fp32" or
    "bf16" autocast, ``model.precision``)."""
    formatter = formatter or PromptFormatter(tokenizer)
    run = eval_runner(
        model,
        tokenizer,
        formatter,
        max_batch_size=batch_size,
        engine=engine,
        engine_params=engine_params,
        runner=runner,
        seed=seed,
        precision=precision,
    )
    return run_eval(
        run,
        examples,
        reward_source,
        max_new_tokens=max_new_tokens,
        success_threshold=success_threshold,
        k=k,
        samples=samples,
        temperature=temperature,
        report=report,
    )


# --------------------------------------------------------------------------- `posttrain eval`
@dataclass(frozen=True)
class ModelLocation:
    """What ``posttrain eval --model X`` resolved to: the model directory or preset to load, the run
    folder it belongs to (None for a preset or a bare model directory), the checkpoint and its step,
    and the run's saved settings (its config, as a dict; None when there is none)."""

    given: str
    path: str
    run_dir: str | None = None
    checkpoint: str | None = None
    step: int | None = None
    settings: dict[str, Any] | None = None
    settings_from: str | None = None

    def record(self) -> dict[str, Any]:
        """The JSON record of what was evaluated."""
        return {
            "given": self.given,
            "path": self.path,
            "run_dir": self.run_dir,
            "checkpoint": self.checkpoint,
            "step": self.step,
            "settings_from": self.settings_from,
        }


def locate_model(model: str) -> ModelLocation:
    """Resolve ``--model``: a preset name or Hugging Face model directory is used as is; an SFT run
    folder (``model/``) or an RL run folder / checkpoints folder / ``step_*`` checkpoint gives its
    model plus the run's saved config (``config.yaml``, else the checkpoint's trainer state)."""
    from posttrain.train.checkpoint import read_trainer_state, resolve_checkpoint
    from posttrain.utils.config import load_yaml

    p = Path(model)
    if not p.is_dir() or (p / "config.json").exists():
        return ModelLocation(given=model, path=model)
    rl = p / "rl"
    if (
        not (p / "checkpoints").is_dir()
        and not (p / "model").is_dir()
        and any((rl / d).is_dir() for d in ("model", "checkpoints"))
    ):
        p = (
            p / "rl"
        )  # a demo folder (runs/demo): its RL policy, as `posttrain plot runs/demo` plots its RL run
    if (p / "model" / "config.json").exists() and not (p / "trainer_state.json").exists():  # SFT run
        settings, source = _saved_settings(p / "config.yaml", load_yaml)
        return ModelLocation(model, str(p / "model"), str(p), settings=settings, settings_from=source)
    ckpt = resolve_checkpoint(p)
    state = read_trainer_state(ckpt)  # CheckpointError (a ValueError) names the file
    run_dir = ckpt.parent.parent
    settings, source = _saved_settings(run_dir / "config.yaml", load_yaml)
    if settings is None and isinstance(state.get("config"), dict):
        settings, source = state["config"], str(ckpt / "trainer_state.json")
    return ModelLocation(
        model,
        str(ckpt / "model"),
        str(run_dir),
        checkpoint=str(ckpt),
        step=state["step"],
        settings=settings,
        settings_from=source,
    )


def _saved_settings(path: Path, load_yaml: Any) -> tuple[dict[str, Any] | None, str | None]:
    if not path.is_file():
        return None, None
    return load_yaml(path), str(path)


def _eval_metric_shapers(hooks: Any) -> list[dict[str, Any]]:
    """The saved ``hooks.shapers`` entries whose shaper reports evaluation metrics (overrides
    ``Hook.eval_metrics``, e.g. ASRR's ``continue_thinking``): ``posttrain eval`` reports them as the
    run's own evaluations did. A shaper that no longer resolves, or reports none, is left out (an
    evaluation never shapes rewards, and an unrelated shaper's config checks, such as DAPO's
    ``max_length == rollout.max_new_tokens``, must not refuse ``--max-new-tokens``)."""
    specs = hooks.get("shapers") if isinstance(hooks, dict) else None
    out = []
    for spec in specs if isinstance(specs, list) else []:
        try:
            cls = GROUP_SHAPERS.get(spec["name"])
        except (KeyError, TypeError, ValueError):
            continue
        if cls.eval_metrics is not Hook.eval_metrics:
            out.append(spec)
    return out


# Sections of a saved config that say how the model was prompted, scored and sampled.
_EVAL_SECTIONS = ("model", "task", "reward", "rollout", "eval", "seed", "threads")


def _eval_base(saved: dict[str, Any]) -> dict[str, Any]:
    """The RL-config subset of a saved run config (RL or SFT) that evaluation uses, with the shapers
    that report evaluation metrics (:func:`_eval_metric_shapers`)."""
    base = {k: saved[k] for k in _EVAL_SECTIONS if k in saved}
    if isinstance(base.get("task"), dict):  # a run saved before 0.2.0 (its markers: ASRR's params now)
        base["task"] = {k: v for k, v in base["task"].items() if k != "continue_thinking_markers"}
    shapers = _eval_metric_shapers(saved.get("hooks"))
    if shapers:
        base["hooks"] = {"shapers": shapers}
    if "rollout" not in saved and isinstance(saved.get("max_new_tokens"), int):  # an SFT config
        base["rollout"] = {"max_new_tokens": saved["max_new_tokens"]}
    if isinstance(base.get("model"), dict):
        base["model"] = {k: v for k, v in base["model"].items() if k in ("dtype", "device")}
    if isinstance(base.get("eval"), dict):
        base["eval"] = {
            k: v for k, v in base["eval"].items() if k in ("k", "samples", "temperature", "max_batch_size")
        }
    return base


def _user_settings(config: str | Path | None, overrides: list[str]) -> tuple[dict[str, Any], dict[str, str]]:
    """What the user set: the ``--config`` YAML merged with the ``key=value`` overrides, as a tree,
    and, per dotted leaf key, where it was set (for messages)."""
    from posttrain.train.run_dir import flatten
    from posttrain.utils.config import load_yaml, parse_override, set_dotted

    tree: dict[str, Any] = {}
    origin: dict[str, str] = {}
    if config is not None:
        tree = load_yaml(config)
        origin = {k: f"--config {config}" for k in flatten(tree)}
    for ov in overrides:
        key, value = parse_override(ov)
        set_dotted(tree, key, value)
        one: dict[str, Any] = {}
        set_dotted(one, key, value)
        origin.update({k: f"the override {ov!r}" for k in flatten(one)})
    return tree, origin


def evaluate_cli_settings(
    loc: ModelLocation,
    config: str | Path | None,
    overrides: list[str],
    *,
    n: int | None = None,
    task: str | None = None,
    task_params: dict[str, Any] | None = None,
    k: int | None = None,
    samples: int | None = None,
    temperature: float | None = None,
    max_new_tokens: int | None = None,
) -> Any:
    """The :class:`~posttrain.train.config.RLConfig` an evaluation runs with: defaults <- the run's saved
    settings <- ``config`` YAML <- ``overrides`` <- the command-line options.

    Every key the user sets (``config``, ``overrides``, an option) is honoured or refused, never
    replaced: a task other than the run's (``--task``, or ``task.name`` in the config or an override)
    drops only the *run's* task params and reward (the new task's default reward is used unless the
    user names one); ``--task`` and a ``task.name`` the user set that disagree are refused, as is an
    option that contradicts a ``key=value`` override (``--n 50`` with ``eval.n=20``). The command line
    (``posttrain eval``) passes an option that differs from the ``--config`` file's value as an override,
    so the option, the user's latest word, wins over the file. ``--task-params`` is merged into the
    task params. ``n`` defaults to the user's ``eval.n``, else 100."""
    from posttrain.tasks import TASKS
    from posttrain.train.config import RLConfig, TaskConfig
    from posttrain.train.run_dir import flatten
    from posttrain.utils.config import ConfigError, build_config

    user, origin = _user_settings(config, overrides)

    def set_by_user(key: str) -> str | None:
        """Where the user set ``key`` (or a key under it), None when they did not."""
        return next((o for k, o in origin.items() if k == key or k.startswith(key + ".")), None)

    base = _eval_base(loc.settings) if loc.settings else {}
    base_task = (base.get("task") or {}).get("name") or TaskConfig().name
    user_task = user["task"].get("name") if isinstance(user.get("task"), dict) else None
    if task is not None and user_task is not None and user_task != task:
        raise InvalidValueError(
            f"--task {task} and task.name={user_task} (set by {set_by_user('task.name')}) disagree; "
            "give the task once"
        )
    chosen = task or user_task or base_task
    if chosen != base_task:
        # the run's task params and reward belong to its own task; what the user set is kept
        run_task = {k: v for k, v in (base.get("task") or {}).items() if k not in ("name", "params")}
        base["task"] = {**run_task, "name": chosen}
        if isinstance(base.get("reward"), dict):
            base["reward"] = {k: v for k, v in base["reward"].items() if k not in ("name", "params")}
        # chat tasks (instructions, ifbench, word_problems) are prompted through the chat template
        if getattr(TASKS.get(chosen), "chat", False) and not set_by_user("task.chat_template"):
            base["task"]["chat_template"] = True
        # the run's completion length was its task's; the new task's own, where it has one
        task_len = getattr(TASKS.get(chosen), "max_new_tokens", None)
        if task_len and max_new_tokens is None and not set_by_user("rollout.max_new_tokens"):
            rollout = {**(base.get("rollout") or {}), "max_new_tokens": task_len}
            rollout["min_new_tokens"] = min(rollout.get("min_new_tokens", 0) or 0, task_len)
            base["rollout"] = rollout
    if task_params is not None:
        flat = flatten(user)
        for name, value in task_params.items():
            key = f"task.params.{name}"
            if key in flat and flat[key] != value:
                raise InvalidValueError(
                    f"--task-params {name}={value!r} contradicts {key}={flat[key]!r} (set by "
                    f"{set_by_user(key)}); give one of them"
                )
        task_section = base.setdefault("task", {})
        task_section["params"] = {**(task_section.get("params") or {}), **task_params}
    # the model evaluated (its context bounds rollout.max_new_tokens at config time)
    base["model"] = {**(base.get("model") or {}), "name": loc.path}
    try:
        cfg = build_config(RLConfig, config, overrides, base=base)
    except ConfigError as e:
        if loc.settings_from:
            raise ConfigError(f"{e}\n  (run settings read from {loc.settings_from})") from None
        raise
    tree = cfg.model_dump(mode="json")

    def option_over(flag: str, key: str, value: Any, section: dict[str, Any], name: str) -> None:
        """An option's value for ``key``, refused where the user set ``key`` to something else."""
        where = set_by_user(key)
        if where is not None and section.get(name) != value:
            raise InvalidValueError(
                f"{flag} {value} contradicts {key}={section.get(name)!r} (set by {where}); give one of them"
            )
        section[name] = value

    if max_new_tokens is not None:
        option_over(
            "--max-new-tokens", "rollout.max_new_tokens", max_new_tokens, tree["rollout"], "max_new_tokens"
        )
        if not set_by_user("rollout.min_new_tokens"):
            tree["rollout"]["min_new_tokens"] = min(tree["rollout"]["min_new_tokens"], max_new_tokens)
    ev = tree["eval"]
    if n is None:
        n = ev["n"] if set_by_user("eval.n") else 100
    option_over("--n", "eval.n", n, ev, "n")
    for key, value in (("k", k), ("samples", samples), ("temperature", temperature)):
        if value is not None:
            option_over(f"--{key}", f"eval.{key}", value, ev, key)
    if ev["k"] > 1 and ev["samples"] < ev["k"]:
        raise InvalidValueError(f"--k {ev['k']} needs --samples >= {ev['k']} (got {ev['samples']})")
    return build_config(RLConfig, None, [], base=tree)


def evaluate_run(loc: ModelLocation, cfg: Any) -> dict[str, Any]:
    """Load the model at ``loc`` and evaluate it with the engine, runner, reward source, task, prompt
    template and generation settings of ``cfg``; the result records what was evaluated and how."""
    from posttrain.models import load_model_and_tokenizer, pick_device
    from posttrain.rewards import get_reward
    from posttrain.rollout.registry import RewardSourceContext, build_reward_source
    from posttrain.tasks import get_task
    from posttrain.train.lengths import bound_prompts, model_context

    task = get_task(cfg.task.name, **cfg.task.params)
    heldout = task.split("heldout")
    if not heldout:
        raise InvalidValueError(f"task {cfg.task.name!r} has no held-out examples to evaluate")
    device = pick_device() if cfg.model.device == "auto" else cfg.model.device
    if cfg.threads:  # the run's torch CPU threads (tiny models run several times faster with 1)
        import torch

        torch.set_num_threads(cfg.threads)
    model, tok = load_model_and_tokenizer(loc.path, dtype=cfg.model.dtype, device=device, seed=cfg.seed)
    reward_name = cfg.reward.name or task.default_reward
    reward_fn = get_reward(reward_name, **cfg.reward.params)
    formatter = PromptFormatter(
        tok,
        template=cfg.task.prompt_template,
        chat=cfg.task.chat_template,
        assistant_prefix=cfg.task.assistant_prefix,
    )
    # prompts that leave no room for max_new_tokens in the context: refused (or skipped with
    # rollout.overlong_prompts=skip) before generating, as `posttrain rl` does
    examples, _ = bound_prompts(
        heldout[: cfg.eval.n],
        formatter.encode,
        context=model_context(model),
        max_new_tokens=cfg.rollout.max_new_tokens,
        policy=cfg.rollout.overlong_prompts,
        where=f"task {cfg.task.name!r}: held-out split",
    )
    # the trainer's evaluation runner (RLTrainer.eval_runner): engine, runner, batch cap and precision
    precision = config_precision(cfg, model)
    runner = config_eval_runner(cfg, model, tok, formatter, precision=precision)
    source = build_reward_source(
        cfg.reward.source.name,
        cfg.reward.source.params,
        RewardSourceContext(
            reward_fn,
            task,
            tok,
            num_workers=cfg.reward.num_workers,
            timeout_s=cfg.reward.timeout_s,
            seed=cfg.seed,
        ),
    )
    try:
        res = run_eval(
            runner,
            examples,
            source,
            max_new_tokens=cfg.rollout.max_new_tokens,
            success_threshold=cfg.reward.success_threshold,
            k=cfg.eval.k,
            samples=cfg.eval.samples,
            temperature=cfg.eval.temperature,
            report=getattr(task, "eval_report", None),
            metric_hooks=[GROUP_SHAPERS.get(s.name)(**s.params) for s in cfg.hooks.shapers],
        )
    finally:
        source.close()
    res["n_requested"] = cfg.eval.n
    res["model"] = loc.record()
    res["settings"] = {
        "task": cfg.task.name,
        "task_params": dict(cfg.task.params),
        "prompt_template": cfg.task.prompt_template,
        "chat_template": cfg.task.chat_template,
        "assistant_prefix": cfg.task.assistant_prefix,
        "reward": reward_name,
        "reward_params": dict(cfg.reward.params),
        "max_new_tokens": cfg.rollout.max_new_tokens,
        "k": cfg.eval.k,
        "samples": cfg.eval.samples,
        "temperature": cfg.eval.temperature,
        "engine": cfg.rollout.engine.model_dump(mode="json"),
        "runner": cfg.rollout.runner.model_dump(mode="json"),
        "precision": precision,
        "reward_source": cfg.reward.source.model_dump(mode="json"),
    }
    return res


@contextlib.contextmanager
def preserved_rng() -> Any:
    """Every global random stream (torch CPU and CUDA, numpy, ``random``) as it was before the block:
    an external harness that seeds them (lm-eval's ``simple_evaluate`` does) leaves a training run's
    streams untouched."""
    import random

    state = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=range(torch.cuda.device_count()) if torch.cuda.is_available() else []):
        try:
            yield
        finally:
            random.setstate(state[0])
            np.random.set_state(state[1])


def harness_metrics(harness: Any, lm: Any, *, precision: str, engine: Any = None) -> dict[str, float]:
    """``eval.harness``'s scores of the adapter ``lm`` (its model as it is now) as flat metrics
    ``harness/<task>/<metric>`` (numbers only; lm-eval's ``N/A`` standard errors are left out), the run's
    random streams untouched. ``precision`` and ``engine`` (the run's (name, params)) reach lm-eval's
    model unless ``params.model_args`` sets them."""
    fn = EVAL_HARNESSES.get(harness.name)
    params = dict(harness.params)
    model_args = {"precision": precision, **dict(params.pop("model_args", {}) or {})}
    if engine is not None:
        model_args.setdefault("engine", engine[0])
        model_args.setdefault("engine_params", dict(engine[1]))
    limit = harness.limit
    if limit is not None and limit >= 1:
        limit = int(limit)  # documents per task; below 1 a fraction of them
    with preserved_rng():
        res = fn(lm, list(harness.tasks), limit, model_args=model_args, **params)
    out: dict[str, float] = {}
    for task, metrics in res.items():
        for key, value in metrics.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                out[f"harness/{task}/{key.replace(',none', '')}"] = float(value)
    return out
