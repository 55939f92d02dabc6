"""Typed configuration of an RL run (YAML + ``dotted.key=value`` overrides, validated by pydantic).

Registry-backed strings (objective, advantage, KL kind, hooks, engine, runner, reward source, task,
reward) are checked against the live registries, so an error names the key and the accepted values,
e.g.::

    config error: objective.name: Value error, unknown value 'dgpoo' (did you mean 'dgpo'?);
    accepted: cispo, dapo, dgpo, gspo, maspo, ppo, sapo, or 'package.module:Name'

Each of them also accepts a plug-in ``package.module:Name``: the module is imported while the config
is validated, so a missing module or attribute is reported before any model is loaded. The params of
objectives, advantages, hooks, engines, runners, reward sources, tasks and rewards are checked
against what the named target accepts, also at config time.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, field_validator, model_validator

from posttrain.models.logprobs import DEFAULT_CHUNK_SIZE
from posttrain.train.sft_data import DataFields
from posttrain.utils.config import StrictModel, check_choice
from posttrain.utils.errors import InvalidValueError, PosttrainWarning

if TYPE_CHECKING:
    from posttrain.rollout.spec import RolloutSpec


class ComponentSpec(StrictModel):
    """A registry-selected component: ``name`` (registered key or ``package.module:Name``) and the
    keyword ``params`` its constructor / factory receives."""

    name: str
    params: dict[str, Any] = Field(default_factory=dict)


HookSpec = ComponentSpec  # the hooks' spec (same shape)


def default_component_name(v: Any, default: str) -> Any:
    """``x.params=...`` alone (no ``x.name``) keeps the default component: fill in its name."""
    if isinstance(v, dict) and "name" not in v:
        return {"name": default, **v}
    return v


def check_component_spec(
    v: ComponentSpec, registry: Any, *, skip_positional: int = 0, reserved: tuple[str, ...] = ()
) -> ComponentSpec:
    """Name known or importable, params accepted by the target's signature (else ValueError)."""
    from posttrain.utils.registry import check_params

    try:
        registry.check(v.name)
    except ValueError as e:
        raise InvalidValueError(f"name: {e}") from None
    try:
        check_params(
            registry.kind,
            v.name,
            registry.get(v.name),
            v.params,
            skip_positional=skip_positional,
            reserved=reserved,
        )
    except ValueError as e:
        raise InvalidValueError(f"params: {e}") from None
    return v


def _registry_name(value: str, registry: Any) -> str:
    """A registry key/alias or an importable ``package.module:Name`` (ValueError otherwise; pydantic
    puts the key in front of the message)."""
    return registry.check(value)


#: Config keys removed in 0.2.0 -> what replaces them. A config that still sets one fails with a
#: ConfigError naming both (:func:`refuse_removed`), instead of an "unknown key" without the way out.
REMOVED_KEYS: dict[str, str] = {
    "hooks.shaper": "hooks.shapers, a list applied in order: hooks.shapers=[{name: ..., params: {...}}]",
    "task.continue_thinking_markers": (
        "the params of the shaper that reports Continue-Thinking, "
        "hooks.shapers=[{name: asrr, params: {markers: [...]}}]"
    ),
}
#: Registered names removed in 0.2.0, as (config key, name) -> what replaces them.
REMOVED_NAMES: dict[tuple[str, str], str] = {
    ("hooks.sampler", "dapo"): (
        "DAPO's dynamic sampling is a group filter: keep hooks.sampler.name=uniform (the default) and set "
        "hooks.filter={name: dynamic-sampling, params: {max_rounds: ..., oversample: ...}}"
    ),
}


def refuse_removed(section: str, data: Any) -> Any:
    """``data`` (the raw values of config section ``section``) unchanged, or an InvalidValueError when
    it uses a key of :data:`REMOVED_KEYS` or a name of :data:`REMOVED_NAMES`, naming the replacement."""
    if not isinstance(data, dict):
        return data
    for key, instead in REMOVED_KEYS.items():
        where, _, field = key.rpartition(".")
        if where == section and field in data:
            raise InvalidValueError(f"{key} was removed in 0.2.0; use {instead}")
    for (key, name), instead in REMOVED_NAMES.items():
        where, _, field = key.rpartition(".")
        spec = data.get(field) if where == section else None
        given = spec.get("name") if isinstance(spec, dict) else getattr(spec, "name", None)
        if given == name:
            raise InvalidValueError(f"{key}.name {name!r} was removed in 0.2.0; {instead}")
    return data


#: The attention and MLP projections of Llama / Qwen2 / Qwen3 / Mistral decoder layers.
DEFAULT_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class LoRAConfig(StrictModel):
    """``model.lora``: set it (e.g. ``model.lora.rank=16``) to train LoRA adapters instead of every weight."""

    rank: int = Field(16, ge=1)
    """r, the rank of each low-rank update B A."""
    alpha: float = Field(32.0, gt=0)
    """The update is scaled by alpha / rank (peft's ``lora_alpha``)."""
    dropout: float = Field(0.0, ge=0, lt=1)
    """Dropout on the adapter's input (peft's ``lora_dropout``); 0 keeps on-policy ratios exactly 1."""
    target_modules: list[str] = Field(default_factory=lambda: list(DEFAULT_TARGET_MODULES))
    """Names (last path component) of the linear layers that get adapters; the default is every
    attention and MLP projection of a Llama / Qwen decoder layer."""

    @field_validator("target_modules")
    @classmethod
    def _non_empty(cls, v: list[str]) -> list[str]:
        if not v:
            raise InvalidValueError("must name at least one module (e.g. q_proj, v_proj)")
        return v


class ModelConfig(StrictModel):
    name: str = "tiny"
    """Preset name (``posttrain.models.list_presets()``), a local Hugging Face model directory, or a
    run folder (its latest checkpoint's model; an SFT run's ``model/``)."""
    dtype: str = "float32"
    precision: str = "auto"
    """Compute precision: "auto" (default: bf16 where the hardware has it natively — a CUDA GPU, a CPU
    with AVX512-BF16 or AMX — else fp32; resolved when the model is built, printed once per run and
    recorded in the run folder's ``run.json``; ``config.yaml`` keeps ``auto``), "fp32", or "bf16" = bf16 autocast for the rollout and the training
    forward/backward over fp32 master weights and AdamW state, log-softmax and losses in fp32
    (needs ``dtype: float32``; docs/precision.md). Same meaning on CPU and GPU."""
    device: str = "auto"
    """"auto" (cuda if available, else cpu), "cpu", "cuda", "cuda:1", "mps". The name is checked at
    config time; whether this machine has the device, when the model is loaded (and by the CLI before
    anything is loaded), so a GPU config still validates on a laptop."""
    gradient_checkpointing: bool = False
    adapter: str = "causal-lm"
    """Model adapter kind (``posttrain.models.ADAPTERS``: how trainers load, score and sample the model)
    or ``package.module:AdapterClass``; ``causal-lm`` is every decoder-only Hugging Face model."""
    lora: LoRAConfig | None = None
    """Train LoRA adapters (peft) instead of every weight: ``model.lora.rank=16`` (rank, alpha, dropout,
    target_modules); None = full fine-tuning. The KL reference is then the base model with the adapters
    disabled, checkpoints hold the adapter only (docs/lora.md)."""

    @field_validator("adapter")
    @classmethod
    def _adapter(cls, v: str) -> str:
        from posttrain.models import ADAPTERS

        return _registry_name(v, ADAPTERS)

    @field_validator("dtype")
    @classmethod
    def _dtype(cls, v: str) -> str:
        from posttrain.models.loading import DTYPE_NAMES

        check_choice("model.dtype", v.lower(), list(DTYPE_NAMES))
        return v

    @field_validator("device")
    @classmethod
    def _device(cls, v: str) -> str:
        from posttrain.models.loading import check_device

        return check_device(v, available=False)

    @field_validator("precision")
    @classmethod
    def _precision(cls, v: str) -> str:
        from posttrain.models.precision import check_precision

        return check_precision(v, allow_auto=True)

    @model_validator(mode="after")
    def _precision_needs_fp32_weights(self) -> ModelConfig:
        from posttrain.models.loading import DTYPE_NAMES

        if self.precision == "bf16" and DTYPE_NAMES[self.dtype.lower()] != "float32":
            raise InvalidValueError(
                f"model.precision 'bf16' keeps fp32 master weights and needs model.dtype float32, got "
                f"{self.dtype!r} (for pure bf16 weights set dtype bfloat16 and precision fp32)"
            )
        return self


class TaskConfig(StrictModel):
    name: str = "arithmetic"
    """Registered task (``posttrain.tasks.list_tasks()``) or ``package.module:TaskClass``."""
    params: dict[str, Any] = Field(default_factory=dict)
    prompt_template: str = "{prompt}"
    """Text around each prompt (e.g. an ASRR No-Thinking prefix); must contain ``{prompt}``."""
    chat_template: bool = False
    """Wrap prompts with the tokenizer's chat template (instruction-tuned checkpoints)."""
    assistant_prefix: str = ""
    """Text that opens the assistant turn, after the chat template's generation prompt (ASRR's
    No-Thinking prefix, arXiv:2505.15400 Fig. 4); the same in rollout, SFT and evaluation. General:
    any method or prompt format may open the turn (a metric about what follows it belongs to the
    method's hook, e.g. ``Hook.step_metrics``)."""

    @model_validator(mode="before")
    @classmethod
    def _removed(cls, data: Any) -> Any:
        return refuse_removed("task", data)

    @field_validator("prompt_template")
    @classmethod
    def _has_field(cls, v: str) -> str:
        if "{prompt}" not in v:
            raise InvalidValueError("must contain the field '{prompt}'")
        return v

    @field_validator("name")
    @classmethod
    def _known_task(cls, v: str) -> str:
        from posttrain.tasks import TASKS

        return _registry_name(v, TASKS)

    @model_validator(mode="after")
    def _task_params(self) -> TaskConfig:
        from posttrain.tasks import TASKS
        from posttrain.utils.registry import check_params

        try:
            check_params("task", self.name, TASKS.get(self.name), self.params)
        except ValueError as e:
            raise InvalidValueError(f"task.params: {e}") from None
        return self


class RewardConfig(StrictModel):
    name: str | None = None
    """Reward registry name or ``package.module:RewardClass``; None = the task's default reward."""
    params: dict[str, Any] = Field(default_factory=dict)
    source: ComponentSpec = ComponentSpec(name="function")
    """Who scores completions (``posttrain.rollout.REWARD_SOURCES``): ``function`` runs the reward
    above in a worker pool; a judge model or remote scorer plugs in here (``package.module:Name``)."""
    num_workers: int = Field(2, ge=0)
    """Reward worker processes (0 = score in-process, no timeout)."""
    timeout_s: float = Field(5.0, gt=0)
    max_failed_frac: float = Field(0.5, ge=0, le=1)
    """Stop the run when more than this share of one step's rewards failed (the reward raised, timed
    out or returned NaN / inf: those score 0); 1 = never stop. Failures are always counted
    (``reward_errors``, ``reward_timeouts``) and the first of each kind is printed with its traceback."""
    success_threshold: float = 1.0
    """A completion counts as correct (accuracy, pass@k) when its raw reward >= this."""

    @field_validator("name")
    @classmethod
    def _known(cls, v: str | None) -> str | None:
        if v is None:
            return v
        from posttrain.rewards import REWARDS

        return _registry_name(v, REWARDS)

    @field_validator("source", mode="before")
    @classmethod
    def _fill_name(cls, v: Any) -> Any:
        return default_component_name(v, cls.model_fields["source"].default.name)

    @field_validator("source")
    @classmethod
    def _known_source(cls, v: ComponentSpec) -> ComponentSpec:
        from posttrain.rollout.registry import REWARD_SOURCES

        return check_component_spec(v, REWARD_SOURCES, skip_positional=1)

    @model_validator(mode="after")
    def _reward_params(self) -> RewardConfig:
        if self.name is None:
            return self
        from posttrain.rewards import REWARDS
        from posttrain.utils.registry import check_params

        try:
            check_params("reward", self.name, REWARDS.get(self.name), self.params)
        except ValueError as e:
            raise InvalidValueError(f"reward.params: {e}") from None
        return self


#: ``rollout.is_correction.mode`` values: the truncated-IS modes of
#: :func:`posttrain.algos.importance.truncated_is_weights` (TRL's names), ``auto``, or None = no correction.
IS_CORRECTION_MODES = ("auto", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
#: what the engine parameters and the config section of the correction were called before it was one setting
_OLD_CORRECTION_KEYS = ("tis_mode", "tis_cap", "tis_min")


class ISCorrectionConfig(StrictModel):
    """``rollout.is_correction``: the one off-policy correction over the behaviour policy μ, the policy
    whose sampling log-probs a fresh row carries (docs/async.md). μ differs from π_old, the trainer's
    policy at the start of the step, when the engine computes other probabilities than the trainer
    (vLLM's kernels: the sampler/trainer mismatch) or when the group was generated by an older policy
    version (asynchronous rollout); either way every fresh token's loss is multiplied by a detached
    weight of ρ = π_old / μ, while the objective's own ratio π_θ / π_old and clip act on top (AReaL's
    decoupled PPO, arXiv:2505.24298 §5.2)."""

    mode: str | None = "auto"
    """``auto`` (default): ``token_truncate`` under asynchronous rollout (``max_staleness`` > 0), none
    synchronously (an in-process engine samples from π_old itself; set a mode for vLLM's mismatch).
    ``token_truncate``: w = min(ρ_t, cap), verl's truncated IS (Yao et al. 2025; verl ``rollout_is``).
    ``token_mask``: w = ρ_t inside [floor, cap], else 0, AReaL's masking of tokens whose weight exceeds
    its cap. ``sequence_truncate`` / ``sequence_mask``: the same with ρ_i = exp(Σ_t log ρ_t). None: no
    correction (an ablation; the gradient is then biased by the mismatch or the lag)."""
    cap: float = Field(2.0, gt=0)
    """C: weights above it are truncated (``*_truncate``) or masked to 0 (``*_mask``); 2 as in Yao et
    al. 2025 (TIS) and verl's ``rollout_is_threshold``."""
    floor: float | None = Field(None, ge=0)
    """Masked modes only: weights below it are masked too (None = no lower bound)."""

    @field_validator("mode")
    @classmethod
    def _mode(cls, v: str | None) -> str | None:
        if v is None or str(v).lower() in ("off", "none", "null"):
            return None
        return check_choice("rollout.is_correction.mode", v, list(IS_CORRECTION_MODES))

    @model_validator(mode="after")
    def _floor_below_cap(self) -> ISCorrectionConfig:
        if self.floor is not None and self.floor >= self.cap:
            raise InvalidValueError(f"floor ({self.floor}) must be below cap ({self.cap})")
        return self


class GeneratorsConfig(StrictModel):
    """``rollout.generators``: the generation workers of asynchronous rollout (used only when
    ``rollout.max_staleness`` > 0; docs/async.md). Each worker is a Ray actor holding a copy of the
    policy and the configured ``rollout.engine`` and ``rollout.runner``."""

    num: int = Field(1, ge=1)
    """Generation workers (Ray actors)."""
    threads: int = Field(1, ge=1)
    """torch intra-op threads of each worker (also the CPUs each actor reserves in Ray)."""
    num_gpus: float = Field(0.0, ge=0)
    """GPUs each worker reserves in Ray (0 = generate on CPU; > 0: the worker's model goes to cuda)."""
    prompts_per_call: int | None = Field(None, ge=1)
    """Prompts (groups) per generate call sent to one worker; None = ceil(prompts_per_step / num)."""
    max_restarts: int = Field(1, ge=0)
    """A worker whose process dies is replaced this many times (its unfinished groups are generated
    again); one more death stops the run with the error. An exception raised inside a worker (a bug)
    always stops the run with the worker's traceback."""
    ray_address: str | None = None
    """None: start a local Ray in this process (``num_cpus`` CPUs); ``auto`` or ``host:port``: join
    a running Ray cluster (``ray start --head`` / ``ray start --address=...`` on each node)."""
    num_cpus: int | None = Field(None, ge=1)
    """CPUs of the local Ray started when ``ray_address`` is None (None = ``num · threads``)."""


class RolloutConfig(StrictModel):
    temperature: float = Field(1.0, gt=0)
    top_p: float = Field(1.0, gt=0, le=1)
    max_new_tokens: int = Field(16, ge=1)
    min_new_tokens: int = Field(0, ge=0)
    suppress_eos: bool = False
    group_size: int = Field(8, ge=1)
    prompts_per_step: int = Field(16, ge=1)
    overlong_prompts: Literal["error", "skip"] = "error"
    """A training prompt longer than the model's context minus ``max_new_tokens``: an error naming
    the split and row (checked when the data loads), or ``skip`` it (counted and reported)."""
    max_batch_size: int | None = Field(None, ge=1)
    """Generate at most this many sequences at once (None = the whole step in one call)."""
    engine: ComponentSpec = ComponentSpec(name="hf")
    """Rollout engine factory (``posttrain.rollout.ENGINES``; ``package.module:Name`` for a plug-in)."""
    runner: ComponentSpec = ComponentSpec(name="single-turn")
    """Episode runner factory (``posttrain.rollout.RUNNERS``): single-turn, or a multi-turn plug-in."""
    max_staleness: int = Field(0, ge=0)
    """Asynchronous rollout (docs/async.md). 0 (default): synchronous, each step generates with the
    current policy (Ray is not imported). k > 0: generation workers (``rollout.generators``, Ray
    actors) generate groups ahead with the policy version of their dispatch, while the trainer trains;
    the trainer at version s consumes only groups generated by version >= s − k (older ones are
    dropped and their prompts generated again, counted as ``stale_dropped``), and corrects the policy
    lag with ``rollout.is_correction``. TRL's ``AsyncGRPOTrainer`` ``max_staleness``, prime-rl's
    ``max_off_policy_steps``, AReaL's η."""
    generators: GeneratorsConfig = GeneratorsConfig()
    """The generation workers (only with ``max_staleness`` > 0)."""
    is_correction: ISCorrectionConfig = ISCorrectionConfig()
    """The off-policy correction over the behaviour policy μ, whether μ differs from π_old by the
    engine's numerics (vLLM) or by staleness (``max_staleness`` > 0)."""

    @model_validator(mode="before")
    @classmethod
    def _renamed_correction(cls, data: Any) -> Any:
        """The correction was two settings before it was one: refuse the old names with the new one."""
        if not isinstance(data, dict):
            return data
        if "staleness_is" in data:
            raise InvalidValueError(
                "rollout.staleness_is was renamed rollout.is_correction (same keys: mode, cap, floor); it now "
                "also covers the engine's sampler/trainer mismatch"
            )
        engine = data.get("engine")
        params = engine.get("params") if isinstance(engine, dict) else getattr(engine, "params", None)
        old = [k for k in _OLD_CORRECTION_KEYS if isinstance(params, dict) and k in params]
        if old:
            raise InvalidValueError(
                f"rollout.engine.params.{old[0]}: the engine's truncated importance sampling is now the run's one "
                "correction, rollout.is_correction (mode, cap, floor: tis_mode -> mode, tis_cap -> cap, "
                "tis_min -> floor)"
            )
        return data

    def correction_mode(self) -> str | None:
        """``is_correction.mode`` with ``auto`` resolved: ``token_truncate`` when asynchronous, else none."""
        mode = self.is_correction.mode
        if mode == "auto":
            return "token_truncate" if self.max_staleness > 0 else None
        return mode

    @field_validator("engine", "runner", mode="before")
    @classmethod
    def _fill_name(cls, v: Any, info: Any) -> Any:
        return default_component_name(v, cls.model_fields[info.field_name].default.name)

    @field_validator("engine")
    @classmethod
    def _known_engine(cls, v: ComponentSpec) -> ComponentSpec:
        from posttrain.rollout.registry import ENGINES

        return check_component_spec(v, ENGINES, skip_positional=1)

    @field_validator("runner")
    @classmethod
    def _known_runner(cls, v: ComponentSpec) -> ComponentSpec:
        from posttrain.rollout.registry import RUNNERS

        return check_component_spec(v, RUNNERS, skip_positional=1)


class ObjectiveConfig(StrictModel):
    name: str = "ppo"
    params: dict[str, Any] = Field(default_factory=dict)
    """Loss hyper-parameters; accepted keys are the loss's ``policy_loss_defaults(name)``."""
    agg: str | None = None
    """Loss aggregation (None = the loss's default; see ``posttrain.algos.list_agg_modes()``)."""
    scale: float | None = Field(None, gt=0)
    """Constant of ``seq-mean-token-sum-norm`` (Dr.GRPO); None = rollout.max_new_tokens."""

    @field_validator("name")
    @classmethod
    def _known(cls, v: str) -> str:
        from posttrain.algos import POLICY_LOSSES

        return _registry_name(v, POLICY_LOSSES)

    @field_validator("agg")
    @classmethod
    def _known_agg(cls, v: str | None) -> str | None:
        if v is None:
            return v
        from posttrain.algos import list_agg_modes

        return check_choice("objective.agg", v, list_agg_modes())

    @model_validator(mode="after")
    def _params(self) -> ObjectiveConfig:
        """Names AND values of the loss parameters are checked here, at config time (with the loss's
        own range checks), not at the first training step."""
        from posttrain.algos import get_policy_loss, policy_loss_defaults

        accepted = policy_loss_defaults(self.name)
        unknown = sorted(set(self.params) - set(accepted))
        if unknown:
            raise InvalidValueError(
                f"objective.params: unknown key(s) {', '.join(unknown)} for objective {self.name!r}; "
                f"accepted: {', '.join(sorted(accepted)) or '(none)'}"
            )
        try:
            get_policy_loss(self.name)._validate(self.name, {**accepted, **self.params})
        except (TypeError, ValueError) as e:
            bad = [k for k in sorted(self.params) if f" {k} must" in str(e)]
            key = f"objective.params.{bad[0]}" if bad else "objective.params"
            raise InvalidValueError(f"{key}: {e} (defaults of {self.name!r}: {accepted})") from None
        return self

    @classmethod
    def prune_inherited(cls, data: dict[str, Any], cli_keys: set[str]) -> list[str]:
        """``objective.name=gspo`` on the command line over a YAML file written for PPO: the file's
        parameters that gspo does not take (``clip_c``) are dropped with a notice. Parameters given
        on the command line are kept (and checked strictly)."""
        params = data.get("params")
        if "name" not in cli_keys or "params" in cli_keys or not isinstance(params, dict):
            return []
        from posttrain.algos import POLICY_LOSSES, policy_loss_defaults

        name = data.get("name")
        if not isinstance(name, str) or name not in POLICY_LOSSES.names(include_aliases=True):
            return []  # the name validator reports it
        accepted = policy_loss_defaults(name)
        drop = [k for k in params if k not in accepted and f"params.{k}" not in cli_keys]
        if not drop:
            return []
        data["params"] = {k: v for k, v in params.items() if k not in drop}
        return [
            f"objective.params: dropped {', '.join(drop)} (from the config file): not parameters of "
            f"objective {name!r} given on the command line; its parameters: "
            f"{', '.join(sorted(accepted)) or '(none)'}"
        ]


class AdvantageConfig(StrictModel):
    name: str = "grpo"
    """Advantage estimator (``posttrain.algos.list_advantages()``) or ``package.module:fn``."""
    params: dict[str, Any] = Field(default_factory=dict)
    """Estimator hyper-parameters; accepted keys are ``advantage_defaults(name)``."""

    @field_validator("name")
    @classmethod
    def _known(cls, v: str) -> str:
        from posttrain.algos import ADVANTAGES

        return _registry_name(v, ADVANTAGES)

    @model_validator(mode="after")
    def _params(self) -> AdvantageConfig:
        from posttrain.algos import check_advantage_params

        try:
            check_advantage_params(self.name, self.params)
        except ValueError as e:
            raise InvalidValueError(f"advantage.params: {e}") from None
        return self


class OptimizerConfig(StrictModel):
    lr: float = Field(1e-5, gt=0)
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = Field(1e-8, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    grad_clip: float = Field(1.0, ge=0)
    """Max global grad norm (0 = no clipping; the norm is still logged)."""
    schedule: Literal["constant", "cosine"] = "constant"
    warmup_steps: int = Field(0, ge=0)
    min_lr_ratio: float = Field(0.0, ge=0, le=1)
    """Cosine floor as a fraction of lr."""


class KLConfig(StrictModel):
    coef: float = Field(0.0, ge=0)
    """KL-to-reference coefficient; 0 = no reference model is loaded at all."""
    kind: str = "k3"

    @field_validator("kind")
    @classmethod
    def _known(cls, v: str) -> str:
        from posttrain.algos import list_kl_estimators

        return check_choice("kl.kind", v, list_kl_estimators(include_aliases=True))


EVAL_MAX_BATCH_SIZE = 512
"""Default cap on the sequences one evaluation generate call holds (``EvalConfig.max_batch_size``)."""


class HarnessConfig(StrictModel):
    """``eval.harness``: an external evaluation harness's scores beside posttrain's own evaluation
    (docs/lm-eval.md). ``name``: a harness of ``posttrain.train.evaluate.EVAL_HARNESSES`` (``lm-eval``:
    lm-evaluation-harness, the ``lm-eval`` extra; or ``package.module:function``)."""

    name: str = "lm-eval"
    tasks: list[str] = Field(min_length=1)
    """The harness's task names (lm-eval: its tasks, or posttrain's offline ``posttrain_arithmetic``,
    ``posttrain_arithmetic_mc``; a task that needs the Hub is refused naming its dataset)."""
    every: int = Field(1, ge=1)
    """Run the harness at the evaluations whose step is a multiple of this (and at the start and end
    evaluations): posttrain's schedule (``eval.every``, ``at_start``, ``at_end``) decides when an
    evaluation happens, ``every`` thins it for the slower harness."""
    limit: float | None = Field(None, gt=0)
    """Documents per task (lm-eval's ``--limit``: an int, or a fraction below 1); None = all."""
    params: dict[str, Any] = Field(default_factory=dict)
    """Passed to the harness as keywords (lm-eval: ``include_path``, ``num_fewshot``,
    ``apply_chat_template``, ``bootstrap_iters``, ``model_args`` such as ``batch_size``)."""


class EvalConfig(StrictModel):
    every: int = Field(0, ge=0)
    """Evaluate on the held-out split every this many steps (0 = only at the end)."""
    n: int = Field(64, ge=1)
    """Held-out examples to evaluate (the first n)."""
    k: int = Field(1, ge=1)
    """pass@k from ``samples`` sampled completions per example (k = 1: greedy pass@1 only)."""
    samples: int = Field(1, ge=1)
    temperature: float = Field(1.0, gt=0)
    at_start: bool = True
    at_end: bool = True
    stop_at: float | None = Field(None, ge=0.0, le=1.0)
    """Early stopping: end the run at the first scheduled evaluation (``every``) whose greedy accuracy
    reaches this value; that evaluation is the run's final one and the final checkpoint is written at
    that step. A resumed run whose last logged evaluation reached it does not train on. None: all
    ``steps``. (posttrain's option; ``sft_warm_start(stop_at=...)`` uses it to stop a warm start at a
    target accuracy on a calibration set.)"""
    max_batch_size: int | None = Field(None, ge=1)
    """The evaluation batch cap: at most this many sequences per generate call (greedy pass@1 and the
    pass@k samples alike), in RL, SFT and ``posttrain eval``. None = the run's
    ``rollout.max_batch_size`` when it sets one (RL: the memory limit chosen for training generation
    holds for evaluation too), else ``EVAL_MAX_BATCH_SIZE`` (512). See :meth:`batch_cap`."""
    harness: HarnessConfig | None = None
    """An evaluation harness run beside posttrain's evaluation (RL runs); its metrics are logged as
    ``harness/<task>/<metric>`` in the evaluation's row. None: no harness."""

    @model_validator(mode="after")
    def _k_le_samples(self) -> EvalConfig:
        if self.k > 1 and self.samples < self.k:
            raise InvalidValueError(f"eval.samples ({self.samples}) must be >= eval.k ({self.k})")
        return self

    def batch_cap(self, rollout_cap: int | None = None) -> int:
        """Sequences per evaluation generate call: ``max_batch_size``, else ``rollout_cap`` (the run's
        ``rollout.max_batch_size``; SFT has none), else ``EVAL_MAX_BATCH_SIZE``."""
        return self.max_batch_size or rollout_cap or EVAL_MAX_BATCH_SIZE


class LoggingConfig(StrictModel):
    tensorboard: bool = False
    wandb: bool = False
    wandb_project: str = "posttrain"
    progress: bool | None = None
    """Rich progress bar (None = only when stderr is a terminal)."""
    every: int = Field(10, ge=0)
    """Without a progress bar (nohup, Slurm, a pipe): one plain log line every this many steps
    (step/total, reward, accuracy, mean length, elapsed, ETA); 0 = none."""
    samples_every: int = Field(10, ge=0)
    """Every this many steps, the step's prompts, completions, rewards, advantages and truncation flags
    go to ``samples.jsonl`` (and TensorBoard / W&B when on); ``posttrain samples RUN`` shows them.
    0 = never."""


class DistributedConfig(StrictModel):
    """Multi-process training under ``torchrun`` (ignored in one process); docs/distributed.md."""

    strategy: Literal["ddp", "fsdp"] = "ddp"
    """``ddp``: every rank holds the whole model and optimizer (DistributedDataParallel). ``fsdp``:
    FSDP2 (``torch.distributed.fsdp.fully_shard`` per decoder layer + root): parameters, gradients and
    AdamW state sharded over the ranks, all-gathered layer by layer for the training forward and
    backward, and whole for generation. Same results and checkpoint files either way."""


class CheckpointConfig(StrictModel):
    every: int = Field(0, ge=0)
    """Save every this many steps (0 = only at the end when ``final``)."""
    keep: int = Field(2, ge=1)
    final: bool = True


def _hook(registry_attr: str, v: ComponentSpec) -> ComponentSpec:
    """A hook's spec: its name is known, its param VALUES pass the class's own
    ``validate_params(params)`` (when it has one: so a removed param can say where it went), then its
    param names match the constructor."""
    import posttrain.hooks as hooks

    registry = getattr(hooks, registry_attr)
    try:
        registry.check(v.name)
    except ValueError as e:
        raise InvalidValueError(f"name: {e}") from None
    validate = getattr(registry.get(v.name), "validate_params", None)
    if callable(validate):
        try:
            validate(dict(v.params))
        except ValueError as e:
            raise InvalidValueError(f"params: {v.name}: {e}") from None
    if registry_attr == "SAMPLERS":  # the trainer passes the training examples and the run's seed
        return check_component_spec(v, registry, skip_positional=1, reserved=("seed",))
    return check_component_spec(v, registry)


class HooksConfig(StrictModel):
    """Loop hooks (``posttrain.hooks`` registries; ``package.module:Name`` for a plug-in). A hook's
    ``params`` are its constructor's keyword arguments (a sampler also receives the training examples
    and ``seed`` from the trainer). One key per slot; each hook also checks its params against the
    whole config (``Hook.validate_config``, see :meth:`RLConfig._hooks_fit_run`)."""

    sampler: ComponentSpec = ComponentSpec(name="uniform")
    """Which prompts, how many completions each (``posttrain.hooks.SAMPLERS``)."""
    filter: ComponentSpec = ComponentSpec(name="none")
    """Keep / drop groups once rewarded, sampling more rounds (``dynamic-sampling`` = DAPO's)."""
    controllers: list[ComponentSpec] = Field(default_factory=list)
    replay: ComponentSpec = ComponentSpec(name="none")
    """Stored trajectories mixed into the step's groups, once per step before any round."""
    shapers: list[ComponentSpec] = Field(default_factory=list)
    """Group reward shapers applied in list order (e.g. ASRR, then the DAPO overlong penalty)."""

    @model_validator(mode="before")
    @classmethod
    def _removed(cls, data: Any) -> Any:
        return refuse_removed("hooks", data)

    @field_validator("sampler", "filter", "replay", mode="before")
    @classmethod
    def _fill_name(cls, v: Any, info: Any) -> Any:
        return default_component_name(v, cls.model_fields[info.field_name].default.name)

    @field_validator("sampler")
    @classmethod
    def _s(cls, v: ComponentSpec) -> ComponentSpec:
        return _hook("SAMPLERS", v)

    @field_validator("controllers")
    @classmethod
    def _c(cls, v: list[ComponentSpec]) -> list[ComponentSpec]:
        return [_hook("CONTROLLERS", x) for x in v]

    @field_validator("replay")
    @classmethod
    def _r(cls, v: ComponentSpec) -> ComponentSpec:
        return _hook("REPLAY_BUFFERS", v)

    @field_validator("shapers")
    @classmethod
    def _gs(cls, v: list[ComponentSpec]) -> list[ComponentSpec]:
        return [_hook("GROUP_SHAPERS", x) for x in v]

    @field_validator("filter")
    @classmethod
    def _f(cls, v: ComponentSpec) -> ComponentSpec:
        return _hook("GROUP_FILTERS", v)

    def configured(self) -> list[tuple[str, str, ComponentSpec]]:
        """Every configured hook as (config key, registry name in :mod:`posttrain.hooks`, spec), in
        the order the slots act."""
        return [
            ("hooks.sampler", "SAMPLERS", self.sampler),
            ("hooks.filter", "GROUP_FILTERS", self.filter),
            ("hooks.replay", "REPLAY_BUFFERS", self.replay),
            *((f"hooks.shapers[{i}]", "GROUP_SHAPERS", s) for i, s in enumerate(self.shapers)),
            *((f"hooks.controllers[{i}]", "CONTROLLERS", c) for i, c in enumerate(self.controllers)),
        ]


class SingleUpdateWarning(PosttrainWarning):
    """A ratio-based objective with one on-policy update per step: its ratio mechanism never acts."""


class RLConfig(StrictModel):
    """One RL run. Every field has a default; a YAML file overrides some, ``key=value`` the rest."""

    model: ModelConfig = ModelConfig()
    task: TaskConfig = TaskConfig()
    reward: RewardConfig = RewardConfig()
    rollout: RolloutConfig = RolloutConfig()
    objective: ObjectiveConfig = ObjectiveConfig()
    advantage: AdvantageConfig = AdvantageConfig()
    optimizer: OptimizerConfig = OptimizerConfig()
    kl: KLConfig = KLConfig()
    entropy_coef: float = 0.0
    """Entropy bonus: loss −= entropy_coef · agg(entropy)."""
    minibatches: int = Field(1, ge=1)
    """Optimizer steps per rollout batch (per epoch); > 1 makes later updates off-policy."""
    ppo_epochs: int = Field(1, ge=1)
    micro_batch_size: int | None = Field(None, ge=1)
    """Sequences per forward/backward (gradient accumulation); None = a whole minibatch at once."""
    logprob_chunk_size: int = Field(1024, ge=1)
    threads: int | None = Field(None, ge=1)
    """torch intra-op CPU threads (None = torch's default). Tiny models on a busy CPU run several
    times faster with 1 thread (their ops are too small to amortise thread synchronisation)."""
    steps: int = Field(100, ge=0)
    seed: int = 0
    out_dir: str = "runs/rl"
    eval: EvalConfig = EvalConfig()
    logging: LoggingConfig = LoggingConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    hooks: HooksConfig = HooksConfig()
    distributed: DistributedConfig = DistributedConfig()

    def rollout_spec(self, precision: str) -> RolloutSpec:
        """How this run builds rollout (``rollout.engine``, ``rollout.runner``, the task's prompt format,
        ``rollout.max_batch_size``) at the compute ``precision`` resolved where the model was built: the
        one :class:`~posttrain.rollout.RolloutSpec` the trainer, its evaluator and every generation
        worker build from."""
        from posttrain.rollout.spec import RolloutSpec

        t, r = self.task, self.rollout
        return RolloutSpec(
            engine=r.engine.name,
            engine_params=r.engine.params,
            runner=r.runner.name,
            runner_params=r.runner.params,
            template=t.prompt_template,
            chat=t.chat_template,
            assistant_prefix=t.assistant_prefix,
            precision=precision,
            max_batch_size=r.max_batch_size,
        )

    @model_validator(mode="after")
    def _groups_of_one(self) -> RLConfig:
        """Group-relative advantages (GRPO, Dr.GRPO, RLOO) compare a completion with the others of its
        prompt: a group of one has no baseline (GRPO then trains on the raw reward, RLOO likewise)."""
        from posttrain.algos import ADVANTAGES

        est = ADVANTAGES.get(self.advantage.name)
        if self.rollout.group_size == 1 and getattr(est, "group_baseline", False):
            raise InvalidValueError(
                f"rollout.group_size: 1 with the group-relative advantage {self.advantage.name!r}: every group "
                "is a single completion, so there is no group baseline to compare it with; use "
                "rollout.group_size >= 2 (8 is usual), or an advantage with a batch baseline "
                "(advantage.name=reinforce_pp)"
            )
        return self

    @model_validator(mode="after")
    def _fits_context(self) -> RLConfig:
        """rollout.max_new_tokens must fit the model's context (read from the preset or config.json,
        no weights loaded); beyond it generation runs past the positions the model has."""
        if self.model.adapter != "causal-lm":
            return self
        from posttrain.models.loading import model_context_length

        ctx = model_context_length(self.model.name)
        if ctx is not None and self.rollout.max_new_tokens >= ctx:
            raise InvalidValueError(
                f"rollout.max_new_tokens: {self.rollout.max_new_tokens} does not fit the context of model "
                f"{self.model.name!r} ({ctx} tokens, prompt included); use at most {ctx - 1} (minus the "
                "longest prompt)"
            )
        return self

    @model_validator(mode="after")
    def _biased_rollout_logprobs(self) -> RLConfig:
        """Sampling settings that change the distribution the engine samples from: ``rollout.top_p < 1``
        (renormalised over the nucleus: the defect of TRL issue 6789), ``rollout.min_new_tokens > 0`` and
        ``rollout.suppress_eos`` (renormalised without EOS). The engine's log-probs are then not the
        trainer's full-vocabulary ones, so every use of rollout log-probs would be biased. Refused where
        they are used: replay importance weights, losses with the ``rollout_logp`` input, the engine's
        correction ``rollout.is_correction``."""
        r = self.rollout
        settings = [
            *([f"rollout.top_p={r.top_p} (renormalised over the nucleus)"] if r.top_p < 1.0 else []),
            *([f"rollout.min_new_tokens={r.min_new_tokens} (EOS masked)"] if r.min_new_tokens > 0 else []),
            *(["rollout.suppress_eos=true (EOS masked)"] if r.suppress_eos else []),
        ]
        if not settings:
            return self
        from posttrain.algos import get_policy_loss

        users = []
        if self.hooks.replay.name != "none":
            users.append(f"hooks.replay {self.hooks.replay.name!r} (importance weights π_old/π_past)")
        if "rollout_logp" in get_policy_loss(self.objective.name).inputs:
            users.append(f"objective {self.objective.name!r} (input rollout_logp)")
        if self.rollout.correction_mode() is not None:
            users.append(f"rollout.is_correction (mode {self.rollout.correction_mode()}: weights π_old/μ)")
        if users:
            raise InvalidValueError(
                f"{'; '.join(settings)}: the engine's sampling log-probs are then not the trainer's "
                f"full-vocabulary ones, so their ratio is biased; used by {'; '.join(users)}. Drop the "
                "sampling setting (rollout.top_p=1.0, rollout.min_new_tokens=0, rollout.suppress_eos=false) "
                "or those parts."
            )
        return self

    @model_validator(mode="after")
    def _async_fits(self) -> RLConfig:
        """What asynchronous rollout (``rollout.max_staleness`` > 0) cannot combine with yet."""
        r = self.rollout
        if r.max_staleness == 0:
            return self
        if self.hooks.replay.name != "none":
            raise InvalidValueError(
                f"rollout.max_staleness={r.max_staleness} with hooks.replay {self.hooks.replay.name!r}: a "
                "replay buffer mixes stored trajectories into a step's groups once per step, which "
                "asynchronous rollout (groups generated ahead by workers) does not support yet; use "
                "rollout.max_staleness=0 or hooks.replay.name=none"
            )
        return self

    @model_validator(mode="after")
    def _hooks_fit_run(self) -> RLConfig:
        """Every configured hook checks its params against the whole config
        (``Hook.validate_config``; e.g. DAPO's overlong penalty against ``rollout.max_new_tokens``):
        the library runs the check without knowing any hook's rule."""
        import posttrain.hooks as hooks

        for key, registry, spec in self.hooks.configured():
            try:
                getattr(hooks, registry).get(spec.name).validate_config(dict(spec.params), self)
            except ValueError as e:
                raise InvalidValueError(f"{key}.params.{e}") from None
        return self

    @model_validator(mode="after")
    def _warn_single_update(self) -> RLConfig:
        """Config-time warning: a ratio-based objective other than PPO/GRPO with ``minibatches=1`` and
        ``ppo_epochs=1`` has r ≡ 1 and gives PPO's gradient (DGPO, MASPO and PPO then coincide)."""
        from posttrain.algos import POLICY_LOSSES

        name = POLICY_LOSSES.canonical(self.objective.name)
        # declared where the loss is registered (register_policy_loss(..., ratio_mechanism=True))
        if POLICY_LOSSES.get(name).ratio_mechanism and not self.off_policy:
            warnings.warn(
                f"objective {name!r} with minibatches=1 and ppo_epochs=1: one on-policy update per "
                "step, so the ratio π_θ/π_old is 1 and the objective's clip/gate never acts (its "
                "gradient equals PPO/GRPO's). Set minibatches (the DGPO/MASPO authors' scripts do 4 "
                "updates per step, DAPO's recipe 16) or ppo_epochs > 1 to use it.",
                SingleUpdateWarning,
                stacklevel=2,
            )
        return self

    @property
    def off_policy(self) -> bool:
        """Whether any update uses data from an older policy (then old log-probs need a forward)."""
        return self.ppo_epochs > 1 or self.minibatches > 1


def load_rl_config(path: str | None = None, overrides: list[str] | None = None) -> RLConfig:
    from posttrain.utils.config import build_config

    return build_config(RLConfig, path, overrides)


# ------------------------------------------------------------------------------------------ SFT
_LEGACY_OPTIMIZER_KEYS = ("lr", "weight_decay", "warmup_steps", "schedule", "grad_clip")


class SFTOptimizerConfig(OptimizerConfig):
    """RL's ``OptimizerConfig`` with SFT's default learning rate (1e-3, the value SFT always had)."""

    lr: float = Field(1e-3, gt=0)


class SFTEvalConfig(EvalConfig):
    """RL's ``EvalConfig`` without the evaluation before the first step by default."""

    at_start: bool = False


class SFTConfig(StrictModel):
    model: ModelConfig = ModelConfig()
    task: TaskConfig = TaskConfig()
    """Source of reference completions (when ``data`` is None) and of the held-out evaluation."""
    data: str | None = None
    """Prompt/completion, text or messages rows (TRL's SFT formats; overrides the task's completions):
    a JSONL / JSON / parquet / arrow file or a ``datasets`` ``save_to_disk`` directory."""
    data_fields: DataFields = DataFields()
    """Column names in ``data`` / ``eval_data``, e.g. ``{prompt: question, completion: answer}``."""
    eval_data: str | None = None
    """JSONL file (same formats) whose token-mean loss is the held-out metric (``eval.*``)."""
    style: Literal["short", "long"] = "short"
    max_examples: int | None = Field(None, ge=1)
    max_length: int | None = Field(None, ge=2)
    """Longest training sequence in tokens (prompt + completion, text, or conversation); None = the
    model's context. Longer rows are handled by ``overlong``."""
    overlong: Literal["error", "truncate", "skip"] = "error"
    """A row longer than ``max_length``: an error naming its file and line, or keep its first
    ``max_length`` tokens, or leave it out (both counted and reported when the data loads)."""
    steps: int = Field(200, ge=0)
    schedule_steps: int | None = Field(None, ge=1)
    """Length of the lr schedule (cosine horizon) when it differs from ``steps`` (e.g. DSMT fine-tuning
    runs ``steps`` of a cosine over 1.2 × steps); None = ``steps``."""
    batch_size: int = Field(32, ge=1)
    micro_batch_size: int | None = Field(None, ge=1)
    """Sequences per forward/backward (gradient accumulation); None = the whole batch at once. The
    loss is normalised by the batch's total target-token count, so the gradient does not change."""
    optimizer: SFTOptimizerConfig = Field(default_factory=SFTOptimizerConfig)
    """lr, betas, eps, weight_decay, grad_clip, schedule, warmup_steps, min_lr_ratio (as in RL). The
    old top-level keys ``lr``, ``weight_decay``, ``warmup_steps``, ``schedule``, ``grad_clip`` are
    still accepted and moved here."""
    logprob_chunk_size: int = Field(DEFAULT_CHUNK_SIZE, ge=1)
    seed: int = 0
    threads: int | None = Field(None, ge=1)
    """torch intra-op CPU threads (None = torch's default); see ``RLConfig.threads``."""
    out_dir: str = "runs/sft"
    eval: SFTEvalConfig = Field(default_factory=SFTEvalConfig)
    """every, n, at_start (default False), at_end; held-out = the task or ``eval_data``."""
    max_new_tokens: int = Field(16, ge=1)
    """Generation length for the held-out evaluation."""
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    save: bool = True
    """Write the run folder (metrics.jsonl, config.yaml, checkpoints, model/); False writes nothing."""
    progress: bool | None = None
    distributed: DistributedConfig = Field(default_factory=DistributedConfig)
    """``strategy``: ``ddp`` or ``fsdp`` (FSDP2) under ``torchrun`` (docs/distributed.md)."""

    @model_validator(mode="before")
    @classmethod
    def _shared_sections(cls, data: Any) -> Any:
        """RL's ``OptimizerConfig`` / ``EvalConfig`` objects are accepted as they are (all their
        values); the old top-level optimizer keys are moved under ``optimizer``."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        for key, parent, own in (
            ("optimizer", OptimizerConfig, SFTOptimizerConfig),
            ("eval", EvalConfig, SFTEvalConfig),
        ):
            if isinstance(data.get(key), parent) and not isinstance(data[key], own):
                data[key] = data[key].model_dump()
        if not any(k in data for k in _LEGACY_OPTIMIZER_KEYS):
            return data
        opt = dict(data.get("optimizer") or {})
        for k in _LEGACY_OPTIMIZER_KEYS:
            if k in data:
                if k in opt:
                    raise InvalidValueError(
                        f"both {k} and optimizer.{k} are set; {k} is the old name, keep only optimizer.{k}"
                    )
                opt[k] = data.pop(k)
        data["optimizer"] = opt
        return data

    @model_validator(mode="after")
    def _heldout_exists(self) -> SFTConfig:
        if self.data is not None and self.eval_data is None and (self.eval.every or self.eval.at_start):
            raise InvalidValueError(
                "eval.every / eval.at_start need held-out data: training from `data`, set `eval_data` "
                "(a JSONL file in the same formats) or leave eval.every at 0"
            )
        return self
