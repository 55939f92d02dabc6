"""`posttrain bench rl-step`: one RL step of posttrain vs TRL's `GRPOTrainer` vs the compute floor.

Four implementations run the SAME step in ONE process, interleaved round by round (warm-up rounds
first, then `repeats` measured rounds), and the median wall time of each is compared:

- **posttrain**: `posttrain.train.RLTrainer(config, model=..., tokenizer=...).step()` - generate ->
  reward -> advantage -> one optimizer step, the real training call path.
- **TRL**: `trl.GRPOTrainer.train()` with a callback that times every optimizer step (`on_step_begin` ->
  `on_step_end`) and runs the other implementations between TRL steps, outside TRL's timed window.
- **floor**: Hugging Face `model.generate` of the same batch (prompts x completions, left-padded
  prompts, KV cache, exactly `new_tokens` new tokens) whose tokens are drawn at temperature 1 by the
  cheapest exact sampler available, posttrain's inverse-CDF draw (`posttrain.rollout.hf._draw`, the one
  posttrain's engine uses) in a logits processor; plus one forward (logits only for the completion
  positions), a policy-gradient surrogate loss, backward, gradient clipping and one `torch.optim.AdamW`
  step. No reward, no advantage, no bookkeeping: the model compute a GRPO step cannot avoid. The target
  (`TARGET_POSTTRAIN_OVER_FLOOR`) is judged against this floor.
- **plain HF**: the floor with `model.generate(do_sample=True)`, i.e. HF's own sampler
  (`torch.multinomial`), everything else identical: what a plain-HF loop costs, reported beside it.

All four start from copies of the same weights and tokenizer, see the same prompts (the first
`num_prompts` examples of the `arithmetic` task's train split), use fp32, lr equal, no KL (beta = 0), one
optimizer step per batch, `num_generations` = group size, and suppress EOS (`min_new_tokens =
max_new_tokens`), so each completion has exactly `new_tokens` tokens on every side (checked and reported).

FLOP limit (a lower bound on the step time on this machine; counting convention of Kaplan et al. 2020,
"Scaling Laws for Neural Language Models", Sec. 2.1, with causal attention counted exactly): for each
sequence with prompt length p and n new tokens, the model must process x = p + n - 1 positions (the last
sampled token is never fed back) and produce n next-token distributions:

    F_fwd(seq) = 2 * N_body * x              # every nn.Linear of the blocks, once per position
               + 2 * N_head * n              # LM head, only where a next-token distribution is needed
               + 2 * L * d_attn * x * (x+1)  # QK^T and AV: 4 * L * d_attn * t for the query at position t
    F_step     = sum over the B = prompts x completions sequences of
                 F_fwd (generation, KV cache)  +  F_fwd (training forward)  +  2 * F_fwd (backward)

N_body = weights of all `nn.Linear` modules except the LM head, N_head = vocab x hidden, L = layers,
d_attn = heads x head_dim. Embedding look-ups, norms, activations, softmax and the optimizer update
are O(params + tokens x hidden), not matmuls, and are left out (a lower bound stays a lower bound).
`flop_limit_s = F_step / R`, where R is this machine's fp32 matmul rate measured in the same run: a
timed `torch.matmul` of two `matmul_size` x `matmul_size` fp32 matrices (2 n^3 FLOPs), a few per round,
median over the run.
"""

from __future__ import annotations

import contextlib
import copy
import os
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from posttrain.models.precision import cpu_capability
from posttrain.utils.errors import InvalidValueError, PosttrainRuntimeError

#: posttrain's step must take at most this multiple of the floor (the issue's target).
TARGET_POSTTRAIN_OVER_FLOOR = 1.05
#: Real-model targets (issue: speed on a real model): posttrain at least 2x faster than TRL, and within
#: 1.5x of the FLOP limit at the measured bf16 matmul rate.
TARGET_POSTTRAIN_OVER_TRL = 0.5
TARGET_POSTTRAIN_OVER_BF16_LIMIT = 1.5

SIDES = ("posttrain", "trl", "floor", "plain_hf")

#: A run whose ratio of medians and paired ratio differ by more than this is flagged as noisy.
NOISY_GAP = 0.05


@dataclass(frozen=True)
class RLStepPreset:
    """One benchmark configuration: model preset, batch shape (prompts x completions) and new tokens."""

    name: str
    model: str  # a `posttrain.models` preset or a local HF model directory
    num_prompts: int
    group_size: int  # completions per prompt (TRL's `num_generations`)
    new_tokens: int  # every completion is exactly this long (EOS suppressed)
    lr: float = 1e-5
    grad_clip: float = 1.0
    temperature: float = 1.0
    precision: str = "fp32"  # model.precision of every side: fp32, bf16 autocast (TRL: bf16=True), or
    # auto (bf16 where the CPU has AVX512-BF16/AMX, else fp32: resolved here, printed with the report)
    engine: str = "hf"  # posttrain's rollout engine (rollout.engine): hf, fast or vllm

    def __post_init__(self) -> None:
        from posttrain.models.precision import check_precision, resolve_precision

        try:
            check_precision(self.precision, allow_auto=True)
        except ValueError as e:
            raise InvalidValueError(f"rl-step preset {self.name!r}: {e}") from None
        object.__setattr__(self, "precision", resolve_precision(self.precision, "cpu")[0])
        if self.engine not in ("hf", "fast", "vllm"):
            raise InvalidValueError(
                f"rl-step preset {self.name!r}: engine must be hf, fast or vllm (vLLM installed: its CPU "
                f"build in .venv-vllm, make test-vllm), got {self.engine!r}"
            )
        for key in ("num_prompts", "group_size", "new_tokens"):
            value = getattr(self, key)
            if not isinstance(value, int) or value < 1:
                raise InvalidValueError(
                    f"rl-step preset {self.name!r}: {key} must be an integer >= 1, got {value!r}"
                )
        if self.group_size < 2:
            raise InvalidValueError(
                f"rl-step preset {self.name!r}: group_size must be >= 2 (a GRPO group needs a baseline), "
                f"got {self.group_size}"
            )
        if not self.lr > 0:
            raise InvalidValueError(f"rl-step preset {self.name!r}: lr must be > 0, got {self.lr!r}")
        if not self.temperature > 0:
            raise InvalidValueError(
                f"rl-step preset {self.name!r}: temperature must be > 0, got {self.temperature!r}"
            )

    @property
    def batch_size(self) -> int:
        """Sequences per step: prompts x completions."""
        return self.num_prompts * self.group_size


#: The issue's presets: tiny = 16 prompts x 8 completions x 8 new tokens on the tiny model,
#: small = 8 x 8 x 32 on the small model.
PRESETS: dict[str, RLStepPreset] = {
    "tiny": RLStepPreset("tiny", model="tiny", num_prompts=16, group_size=8, new_tokens=8),
    "small": RLStepPreset("small", model="small", num_prompts=8, group_size=8, new_tokens=32),
    # the built-in real model (SmolLM2-135M, `posttrain models prepare smollm2-135m`): the issue's
    # 8 prompts x 4 completions x 32 tokens, every side in the CPU's native precision (bf16 autocast
    # with AVX512-BF16/AMX, else fp32), posttrain on the fast engine
    "smol": RLStepPreset(
        "smol",
        model="smollm2-135m",
        num_prompts=8,
        group_size=4,
        new_tokens=32,
        precision="auto",
        engine="fast",
    ),
}


def get_preset(name: str) -> RLStepPreset:
    if name not in PRESETS:
        raise InvalidValueError(f"unknown rl-step preset {name!r}; known: {', '.join(sorted(PRESETS))}")
    return PRESETS[name]


# --------------------------------------------------------------------------------------------------
# FLOP count and machine matmul rate
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelShape:
    """What the FLOP count needs to know about a causal LM."""

    body_params: int  # weights of every nn.Linear applied once per position, LM head excluded
    head_params: int  # LM head weight (vocab x hidden)
    num_layers: int
    attn_width: int  # num_attention_heads * head_dim (query width of QK^T and of AV)

    @classmethod
    def from_model(cls, model: Any) -> ModelShape:
        import torch

        head = model.get_output_embeddings()
        if head is None or getattr(head, "weight", None) is None:
            raise InvalidValueError(
                f"{type(model).__name__} has no output embedding (LM head); cannot count FLOPs"
            )
        body = sum(
            m.weight.numel()
            for m in model.modules()
            if isinstance(m, torch.nn.Linear) and m is not head and m.weight is not head.weight
        )
        cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        heads = int(cfg.num_attention_heads)
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        return cls(
            body_params=int(body),
            head_params=int(head.weight.numel()),
            num_layers=int(cfg.num_hidden_layers),
            attn_width=int(heads * head_dim),
        )


def forward_flops(shape: ModelShape, prompt_len: int, new_tokens: int) -> int:
    """Matmul FLOPs of one causal-LM forward that scores `new_tokens` tokens after a `prompt_len` prompt.

    x = prompt_len + new_tokens - 1 positions are processed:
    2*N_body*x + 2*N_head*new_tokens + 2*L*d_attn*x*(x+1)  (module docstring; Kaplan et al. 2020 Sec. 2.1).
    The same count holds for generating those tokens with a KV cache (each position is processed once,
    the query at position t attends to t keys).
    """
    if prompt_len < 1 or new_tokens < 1:
        raise InvalidValueError(f"prompt_len and new_tokens must be >= 1, got {prompt_len}, {new_tokens}")
    x = prompt_len + new_tokens - 1
    return (
        2 * shape.body_params * x
        + 2 * shape.head_params * new_tokens
        + 2 * shape.num_layers * shape.attn_width * x * (x + 1)
    )


def step_flops(
    shape: ModelShape, prompt_lens: Sequence[int], group_size: int, new_tokens: int
) -> dict[str, int]:
    """FLOPs of one RL step: generation + training forward + backward (2x forward) of every sequence.

    `prompt_lens` are the unpadded token counts of the prompts; each prompt has `group_size` completions.
    """
    fwd = group_size * sum(forward_flops(shape, p, new_tokens) for p in prompt_lens)
    return {"generation": fwd, "train_forward": fwd, "train_backward": 2 * fwd, "total": 4 * fwd}


def time_matmul(size: int, *, repeats: int = 3, dtype: Any = None) -> list[float]:
    """Wall seconds of `repeats` `torch.matmul`s of two (size x size) matrices (after one untimed), in
    `dtype` (default fp32)."""
    import torch

    from posttrain_lab.benchmarks.perf.common import time_fn

    dtype = dtype or torch.float32
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(size, size, generator=gen).to(dtype)
    b = torch.randn(size, size, generator=gen).to(dtype)
    out = torch.empty(size, size, dtype=dtype)
    return time_fn(lambda: torch.matmul(a, b, out=out), repeats=repeats, warmup=1)["wall_s"]


def matmul_gflops(size: int, seconds: float) -> float:
    """GFLOP/s of one (size x size) @ (size x size) matmul that took `seconds`: 2 * size^3 FLOPs."""
    return 2.0 * size**3 / seconds / 1e9


# --------------------------------------------------------------------------------------------------
# The implementations
# --------------------------------------------------------------------------------------------------


def _tokenize_prompts(tokenizer: Any, prompts: Sequence[str]) -> list[list[int]]:
    """Prompt token ids exactly as TRL's GRPOTrainer makes them (`processing_class(text=prompts)`)."""
    return [list(ids) for ids in tokenizer(text=list(prompts))["input_ids"]]


class _DrawSampler:
    """A `LogitsProcessor` that samples the next token with posttrain's exact inverse-CDF draw
    (`posttrain.rollout.hf._draw`, the one `HFEngine` uses) at `temperature` and returns a one-hot score
    row, which `generate`'s greedy selection copies. No log-prob recording, no top-p: the cheapest exact
    sampler available to the floor."""

    def __init__(self, temperature: float, generator: Any) -> None:
        from posttrain.rollout.hf import _draw

        self.temperature = temperature
        self.generator = generator
        self._draw = _draw

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import torch

        probs = torch.softmax(scores.float() / self.temperature, dim=-1)
        tok = self._draw(probs, self.generator)
        return torch.full_like(scores, float("-inf")).scatter_(1, tok, 0.0)


#: The floor's samplers: `draw` = posttrain's inverse-CDF draw (the floor), `multinomial` = HF
#: `generate(do_sample=True)`, i.e. `torch.multinomial` (the "plain HF" reference).
FLOOR_SAMPLERS = {"draw": "floor", "multinomial": "plain_hf"}


class FloorStep:
    """The compute floor of one RL step (see the module docstring).

    `sampler="draw"` (the floor): `model.generate` whose tokens are drawn by posttrain's inverse-CDF
    sampler in a logits processor. `sampler="multinomial"` ("plain HF"): `model.generate(do_sample=True)`,
    which samples with `torch.multinomial`. Everything else is identical.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        prompts: Sequence[str],
        preset: RLStepPreset,
        *,
        sampler: str = "draw",
        seed: int = 0,
    ) -> None:
        import torch
        from transformers import GenerationConfig, LogitsProcessorList

        from posttrain.rollout import pad_left

        if sampler not in FLOOR_SAMPLERS:
            raise InvalidValueError(
                f"FloorStep: unknown sampler {sampler!r}; known: {', '.join(FLOOR_SAMPLERS)}"
            )
        self.name = FLOOR_SAMPLERS[sampler]
        self.sampler = sampler
        self.model, self.preset = model, preset
        pad = tokenizer.pad_token_id
        ids, mask = pad_left(_tokenize_prompts(tokenizer, prompts), pad)
        # G completions per prompt, grouped like TRL's RepeatSampler: [p0]*G + [p1]*G + ...
        self.input_ids = ids.repeat_interleave(preset.group_size, dim=0)
        self.attention_mask = mask.repeat_interleave(preset.group_size, dim=0)
        eos = tokenizer.eos_token_id
        common = {
            "max_new_tokens": preset.new_tokens,
            "min_new_tokens": preset.new_tokens,  # EOS suppressed until exactly new_tokens tokens exist
            "eos_token_id": eos,
            "pad_token_id": pad,
            "use_cache": True,
        }
        self.logits_processor = LogitsProcessorList()
        if sampler == "multinomial":
            self.generation_config = GenerationConfig(
                do_sample=True, temperature=preset.temperature, top_p=1.0, top_k=0, **common
            )
        else:
            # greedy selection of the one-hot row the draw returns; HF's min-new-tokens processor
            # (EOS masking) runs before the custom one
            self.generation_config = GenerationConfig(do_sample=False, num_beams=1, **common)
            generator = torch.Generator().manual_seed(seed)
            self.logits_processor.append(_DrawSampler(preset.temperature, generator))
        # A fixed +-1 per-sequence weight stands in for the advantage: same compute, no reward pass.
        sign = torch.ones(preset.batch_size)
        sign[1::2] = -1.0
        self.weights = sign
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=preset.lr, weight_decay=0.0)
        self.completion_lengths: list[int] = []

    def step(self) -> dict[str, float]:
        import torch

        from posttrain.models.precision import precision_autocast

        n = self.preset.new_tokens
        self.model.eval()
        amp = precision_autocast("cpu", self.preset.precision)
        with torch.no_grad(), amp:
            seq = self.model.generate(
                input_ids=self.input_ids,
                attention_mask=self.attention_mask,
                generation_config=self.generation_config,
                logits_processor=self.logits_processor,
            )
        completion = seq[:, self.input_ids.shape[1] :]
        self.completion_lengths.extend([int(completion.shape[1])] * completion.shape[0])
        self.model.train()
        full_mask = torch.cat([self.attention_mask, torch.ones_like(completion)], dim=1)
        position_ids = (full_mask.cumsum(-1) - 1).clamp(min=0)
        # logits only at the n positions that predict the completion tokens
        with precision_autocast("cpu", self.preset.precision):
            logits = self.model(
                input_ids=seq[:, :-1],
                attention_mask=full_mask[:, :-1],
                position_ids=position_ids[:, :-1],
                logits_to_keep=n,
                use_cache=False,
            ).logits
        logp = logits.float().log_softmax(-1).gather(-1, completion.unsqueeze(-1)).squeeze(-1)
        loss = -(self.weights[:, None] * logp).mean()
        loss.backward()
        if self.preset.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.preset.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return {"loss": float(loss.detach())}


class _TRLRewardAdapter:
    """TRL reward-function signature around a posttrain `fn(completion, example) -> float`.

    Also records the generated completion lengths, so the bench can check that EOS was suppressed.
    """

    def __init__(self, reward_fn: Callable[[str, Any], float], examples: Sequence[Any]) -> None:
        self._fn = reward_fn
        self._by_id = {ex.id: ex for ex in examples}
        self.__name__ = str(getattr(reward_fn, "name", type(reward_fn).__name__))
        self.completion_lengths: list[int] = []

    def __call__(
        self,
        prompts: list[Any],
        completions: list[str],
        completion_ids: list[list[int]],
        example_id: list[str],
        **_: Any,
    ) -> list[float]:
        self.completion_lengths.extend(len(c) for c in completion_ids)
        return [float(self._fn(c, self._by_id[i])) for c, i in zip(completions, example_id, strict=True)]


def trl_versions() -> dict[str, str] | None:
    """Versions of trl / accelerate / datasets, or None when TRL cannot be imported."""
    try:
        import accelerate
        import datasets
        import trl
    except ImportError:
        return None
    return {"trl": trl.__version__, "accelerate": accelerate.__version__, "datasets": datasets.__version__}


class TRLRun:
    """TRL's GRPOTrainer, configured like the other sides, driven by `trainer.train()`."""

    name = "trl"

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        examples: Sequence[Any],
        reward_fn: Callable[[str, Any], float],
        preset: RLStepPreset,
        *,
        total_steps: int,
        seed: int,
        output_dir: str,
    ) -> None:
        from datasets import Dataset
        from transformers import ProgressCallback
        from transformers.trainer_callback import PrinterCallback
        from transformers.utils import logging as hf_logging
        from trl import GRPOConfig, GRPOTrainer

        self.reward = _TRLRewardAdapter(reward_fn, examples)
        dataset = Dataset.from_list([{"prompt": ex.prompt, "example_id": ex.id} for ex in examples])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # transformers v6 deprecations inside TRL
            args = GRPOConfig(
                output_dir=output_dir,
                use_cpu=True,
                bf16=preset.precision == "bf16",  # the preset's precision on every side (TRL's default: bf16)
                fp16=False,
                activation_checkpointing=False,  # TRL defaults to recomputing activations; the others do not
                seed=seed,
                max_steps=total_steps,
                per_device_train_batch_size=preset.batch_size,  # counted in completions
                gradient_accumulation_steps=1,
                num_generations=preset.group_size,
                num_iterations=1,  # one optimizer step per batch: no old-logprob forward
                max_completion_length=preset.new_tokens,
                generation_kwargs={"min_new_tokens": preset.new_tokens},  # EOS suppressed
                temperature=preset.temperature,
                top_p=1.0,
                top_k=0,
                beta=0.0,  # no KL, no reference model
                learning_rate=preset.lr,
                lr_scheduler_type="constant",
                warmup_steps=0,
                weight_decay=0.0,
                max_grad_norm=preset.grad_clip,
                shuffle_dataset=False,
                use_vllm=False,
                logging_strategy="no",
                save_strategy="no",
                eval_strategy="no",
                report_to=[],
                log_completions=False,
                disable_tqdm=True,
                dataloader_num_workers=0,
                remove_unused_columns=False,
            )
            verbosity = hf_logging.get_verbosity()
            hf_logging.set_verbosity_error()
            try:
                self.trainer = GRPOTrainer(
                    model=model,
                    reward_funcs=[self.reward],
                    args=args,
                    train_dataset=dataset,
                    processing_class=tokenizer,
                )
            finally:
                hf_logging.set_verbosity(verbosity)
        for cb in (PrinterCallback, ProgressCallback):
            self.trainer.remove_callback(cb)
        if any(getattr(m, "gradient_checkpointing", False) for m in self.trainer.model.modules()):
            raise PosttrainRuntimeError(
                "TRL enabled activation checkpointing; the comparison would not be like for like"
            )

    def run(self, after_step: Callable[[int, float], None]) -> None:
        """`trainer.train()`; after TRL's i-th optimizer step, `after_step(i, seconds_of_that_step)`."""
        from posttrain_lab.benchmarks.perf.common import train_timed

        train_timed(self.trainer, after_step)


def bench_task(preset: RLStepPreset, *, seed: int = 0) -> tuple[dict[str, Any], list[Any], Any]:
    """(task params, the prompts' examples, reward fn) shared by all the implementations.

    The `arithmetic` task (2-digit addition, plain format) with `n_train = num_prompts`, so posttrain's
    prompt sampler (an epoch-wise pass over the train split), TRL's dataset and the floor all use exactly
    these prompts every step; the task's default reward (`exact_match`) scores posttrain's and TRL's
    completions.
    """
    from posttrain.rewards import get_reward
    from posttrain.tasks import get_task

    params: dict[str, Any] = {"digits": 2, "n_train": preset.num_prompts, "n_heldout": 8, "seed": seed}
    task = get_task("arithmetic", **params)
    examples = list(task.split("train"))
    if len(examples) != preset.num_prompts:
        raise PosttrainRuntimeError(
            f"arithmetic task gave {len(examples)} train prompts, expected {preset.num_prompts}"
        )
    return params, examples, get_reward(task.default_reward)


def posttrain_config(
    preset: RLStepPreset, task_params: dict[str, Any], *, seed: int, steps: int, out_dir: str
) -> Any:
    """posttrain's `RLConfig` for the bench: the same batch, sampling, lr and clipping as the other
    other sides; GRPO advantage, PPO-clip loss with token-mean aggregation (TRL's default `loss_type="dapo"`),
    one on-policy update per batch, no KL, no entropy bonus, no eval/checkpoint/progress output.
    The reward pool keeps posttrain's defaults (worker processes), as a user's run would."""
    from posttrain.train.config import RLConfig

    n = preset.new_tokens
    return RLConfig.model_validate(
        {
            "model": {
                "name": preset.model,
                "dtype": "float32",
                "device": "cpu",
                "precision": preset.precision,
            },
            "task": {"name": "arithmetic", "params": task_params},
            "rollout": {
                "temperature": preset.temperature,
                "top_p": 1.0,
                "max_new_tokens": n,
                "min_new_tokens": n,  # EOS suppressed, as on the other sides
                "group_size": preset.group_size,
                "prompts_per_step": preset.num_prompts,
                "engine": {"name": preset.engine},
            },
            "objective": {"name": "ppo"},
            "advantage": {"name": "grpo"},
            "optimizer": {
                "lr": preset.lr,
                "weight_decay": 0.0,
                "grad_clip": preset.grad_clip,
                "schedule": "constant",
                "warmup_steps": 0,
            },
            "kl": {"coef": 0.0},
            "entropy_coef": 0.0,
            "minibatches": 1,
            "ppo_epochs": 1,
            "steps": steps,
            "seed": seed,
            "out_dir": out_dir,
            "eval": {"at_start": False, "at_end": False},
            "logging": {"progress": False},
            "checkpoint": {"every": 0, "final": False},
        }
    )


class PosttrainStep:
    """posttrain's `RLTrainer.step()` on the bench configuration (the real training call path)."""

    name = "posttrain"

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        preset: RLStepPreset,
        task_params: dict[str, Any],
        *,
        seed: int,
        steps: int,
        out_dir: str,
    ) -> None:
        from posttrain.train.rl import RLTrainer

        self.config = posttrain_config(preset, task_params, seed=seed, steps=steps, out_dir=out_dir)
        self.trainer = RLTrainer(self.config, model=model, tokenizer=tokenizer)
        self.completion_lengths: list[int] = []
        self.metrics: list[dict[str, Any]] = []
        engine = self.trainer.engine
        generate = engine.generate

        def generate_and_record(*args: Any, **kwargs: Any) -> Any:
            batch = generate(*args, **kwargs)
            self.completion_lengths.extend(batch.lengths.tolist())
            return batch

        engine.generate = generate_and_record  # observe only: lengths of what the engine produced

    def step(self) -> dict[str, Any]:
        from posttrain.train.rl import DegenerateSettingWarning

        with warnings.catch_warnings():
            # a random-init model answers no arithmetic right and every completion runs to the cap:
            # the trainer's degenerate-setting warnings are expected here
            warnings.simplefilter("ignore", DegenerateSettingWarning)
            m = self.trainer.step()
        self.metrics.append(m)
        return m

    def close(self) -> None:
        self.trainer.close()


# --------------------------------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------------------------------


def _median(xs: Sequence[float]) -> float | None:
    return float(statistics.median(xs)) if xs else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b is not None and b > 0 else None


def summarize(
    step_times: dict[str, list[float]],
    *,
    flops_total: int,
    matmul_size: int,
    matmul_times: Sequence[float],
    target: float = TARGET_POSTTRAIN_OVER_FLOOR,
    matmul_times_bf16: Sequence[float] = (),
) -> dict[str, Any]:
    """Medians, the FLOP limit and every ratio, computed from the measured times only.

    `ratio_*` are ratios of medians (the target is judged on `ratio_posttrain_over_floor`);
    `paired_ratio_*` are medians of the per-round ratios, reported alongside as a noise check.
    """
    med = {side: _median(step_times.get(side, [])) for side in SIDES}
    mm_median = _median(matmul_times)
    gflops = matmul_gflops(matmul_size, mm_median) if mm_median else None
    flop_limit = flops_total / (gflops * 1e9) if gflops else None
    mm16 = _median(matmul_times_bf16)
    gflops16 = matmul_gflops(matmul_size, mm16) if mm16 else None
    flop_limit16 = flops_total / (gflops16 * 1e9) if gflops16 else None
    pt_floor = _ratio(med["posttrain"], med["floor"])

    def paired(a: str, b: str) -> float | None:
        """Median over rounds of a_i / b_i: the two steps of a round ran back to back under the same
        machine load, so this is steadier than the ratio of medians on a shared machine."""
        xs, ys = step_times.get(a, []), step_times.get(b, [])
        if not xs or len(xs) != len(ys):
            return None
        return _median([x / y for x, y in zip(xs, ys, strict=True) if y > 0])

    pairs = {
        "posttrain_over_floor": (pt_floor, paired("posttrain", "floor")),
        "posttrain_over_trl": (_ratio(med["posttrain"], med["trl"]), paired("posttrain", "trl")),
        "trl_over_floor": (_ratio(med["trl"], med["floor"]), paired("trl", "floor")),
        "posttrain_over_plain_hf": (
            _ratio(med["posttrain"], med["plain_hf"]),
            paired("posttrain", "plain_hf"),
        ),
        "floor_over_plain_hf": (_ratio(med["floor"], med["plain_hf"]), paired("floor", "plain_hf")),
    }
    gaps = [abs(r / q - 1.0) for r, q in pairs.values() if r is not None and q]
    return {
        "posttrain_median_step_s": med["posttrain"],
        "trl_median_step_s": med["trl"],
        "floor_s": med["floor"],
        "plain_hf_median_step_s": med["plain_hf"],
        "flop_limit_s": flop_limit,
        "matmul_gflops": gflops,
        "ratio_posttrain_over_floor": pt_floor,
        "ratio_posttrain_over_trl": _ratio(med["posttrain"], med["trl"]),
        "ratio_trl_over_floor": _ratio(med["trl"], med["floor"]),
        "ratio_posttrain_over_plain_hf": _ratio(med["posttrain"], med["plain_hf"]),
        "ratio_floor_over_plain_hf": _ratio(med["floor"], med["plain_hf"]),
        "ratio_floor_over_flop_limit": _ratio(med["floor"], flop_limit),
        "ratio_posttrain_over_flop_limit": _ratio(med["posttrain"], flop_limit),
        "ratio_trl_over_flop_limit": _ratio(med["trl"], flop_limit),
        "ratio_plain_hf_over_flop_limit": _ratio(med["plain_hf"], flop_limit),
        **{f"paired_ratio_{k}": q for k, (_, q) in pairs.items()},
        # largest relative gap between a ratio of medians and its paired ratio: > NOISY_GAP = noisy run
        "ratio_disagreement": max(gaps) if gaps else None,
        "target_posttrain_over_floor": target,
        "target_pass": None if pt_floor is None else bool(pt_floor <= target),
        # bf16 matmul rate and the FLOP limit at it (the real-model targets: posttrain <= 0.5 x TRL,
        # posttrain <= 1.5 x the bf16 limit)
        "matmul_gflops_bf16": gflops16,
        "flop_limit_bf16_s": flop_limit16,
        "ratio_posttrain_over_flop_limit_bf16": _ratio(med["posttrain"], flop_limit16),
        "ratio_trl_over_flop_limit_bf16": _ratio(med["trl"], flop_limit16),
        "ratio_floor_over_flop_limit_bf16": _ratio(med["floor"], flop_limit16),
        "target_posttrain_over_trl": TARGET_POSTTRAIN_OVER_TRL,
        "target_posttrain_over_flop_limit_bf16": TARGET_POSTTRAIN_OVER_BF16_LIMIT,
    }


#: posttrain's per-phase timers (``RLTrainer.report``), in step order. ``time_forward_overlap`` holds
#: the forwards that run while rewards are scored: old / reference log-probs when needed, and the first
#: micro-batch's policy forward (with grad) of the update; so the step's training FLOPs are split between
#: it and ``time_update`` and are judged on their sum (the ``training`` row).
PHASES: tuple[tuple[str, str], ...] = (
    ("generation", "time_generation"),
    ("forwards before rewards (old/ref log-probs, 1st micro-batch)", "time_forward_overlap"),
    ("reward wait", "time_reward_wait"),
    ("update (rest of forward + backward + AdamW)", "time_update"),
)


def phase_breakdown(
    metrics: Sequence[dict[str, Any]], flops: dict[str, int], gflops_rate: float | None
) -> list[dict[str, Any]]:
    """Where posttrain's step spends its time: the median of each phase timer over the measured steps and
    its share of the median step; ``other`` is the step time no timer covers (metrics, hooks, batch
    building). Two rows judge compute: ``generation`` (the generation FLOPs) and ``training`` (forwards
    before rewards + update, the train forward and backward FLOPs): achieved GFLOP/s and how many times
    the FLOP limit at the matmul rate ``gflops_rate`` each takes."""
    steps = [m for m in metrics if "time_step" in m]
    if not steps:
        return []
    step_med = _median([m["time_step"] for m in steps]) or 0.0

    def row(label: str, secs: list[float], flop: int = 0) -> dict[str, Any]:
        med = _median(secs) or 0.0
        limit = flop / (gflops_rate * 1e9) if flop and gflops_rate else None
        return {
            "phase": label,
            "median_s": med,
            "share": med / step_med if step_med > 0 else None,
            "gflop": flop / 1e9 if flop else None,
            "achieved_gflops": flop / 1e9 / med if flop and med > 0 else None,
            "x_limit": _ratio(med, limit),
        }

    timers = {key: [float(m.get(key, 0.0)) for m in steps] for _, key in PHASES}
    rows = [
        row(label, timers[key], flops.get("generation", 0) if key == "time_generation" else 0)
        for label, key in PHASES
    ]
    covered = [sum(timers[key][i] for _, key in PHASES) for i in range(len(steps))]
    rows.append(
        row(
            "other (metrics, hooks, batch building)",
            [m["time_step"] - c for m, c in zip(steps, covered, strict=True)],
        )
    )
    training = [f + u for f, u in zip(timers["time_forward_overlap"], timers["time_update"], strict=True)]
    rows.append(
        row(
            "training = forwards before rewards + update",
            training,
            flops.get("train_forward", 0) + flops.get("train_backward", 0),
        )
    )
    return rows


def profile_step(side: PosttrainStep, *, top: int = 15) -> list[dict[str, Any]]:
    """One extra posttrain step under ``torch.profiler`` (CPU): the ``top`` operators by self CPU time,
    with calls, self seconds and their share of the profiled total."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        side.step()
    events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    total = sum(e.self_cpu_time_total for e in events) or 1.0
    events.sort(key=lambda e: e.self_cpu_time_total, reverse=True)
    return [
        {
            "op": e.key,
            "calls": int(e.count),
            "self_s": e.self_cpu_time_total / 1e6,
            "share": e.self_cpu_time_total / total,
        }
        for e in events[:top]
    ]


def run_rl_step_bench(
    preset: RLStepPreset,
    *,
    repeats: int = 5,
    warmup: int = 2,
    with_trl: bool = True,
    seed: int = 0,
    matmul_size: int = 2048,
    matmul_repeats: int = 3,
    threads: int | None = None,
    log: Callable[[str], None] | None = None,
    profile: bool = False,
) -> dict[str, Any]:
    """Run the implementations interleaved; return the JSON-able result.

    ``profile``: after the measured rounds, one more posttrain step under ``torch.profiler`` gives the
    top operators (``posttrain_profile``); the per-phase table (``posttrain_phases``) is always there.

    `threads` sets torch's intra-op thread count for the run (restored afterwards); None keeps it.
    On a machine shared with other jobs, `threads=1` gives far steadier ratios than oversubscribed
    cores (every side and the matmul rate use the same setting, so the ratios stay comparable).

    Round i (warm-up rounds first, then `repeats` measured ones): one TRL step (when TRL runs), then
    one posttrain, one floor and one plain-HF step (their order rotates between rounds), then, in measured
    rounds, `matmul_repeats` timed matmuls. Medians, ratios and the FLOP limit come from `summarize`.
    """
    import torch
    import transformers

    from posttrain.models import load_model_and_tokenizer

    if repeats < 1 or warmup < 0:
        raise InvalidValueError(
            f"repeats must be >= 1 and warmup >= 0, got repeats={repeats}, warmup={warmup}"
        )
    if threads is not None and threads < 1:
        raise InvalidValueError(f"threads must be >= 1, got {threads}")
    log = log or (lambda _msg: None)
    task_params, examples, reward_fn = bench_task(preset, seed=seed)
    base_model, base_tok = load_model_and_tokenizer(preset.model, dtype="float32", device="cpu", seed=seed)
    prompts = [ex.prompt for ex in examples]
    prompt_lens = [len(p) for p in _tokenize_prompts(base_tok, prompts)]
    shape = ModelShape.from_model(base_model)
    flops = step_flops(shape, prompt_lens, preset.group_size, preset.new_tokens)

    versions = trl_versions()
    trl_skipped = None
    if not with_trl:
        trl_skipped = "disabled (--no-trl)"
    elif versions is None:
        trl_skipped = 'trl is not installed (pip install -e "./lab[bench]")'

    total_rounds = warmup + repeats
    all_times: dict[str, list[float]] = {side: [] for side in SIDES}
    matmul_times: list[float] = []
    matmul_times_bf16: list[float] = []
    loads: list[float] = []
    load_start = os.getloadavg()
    threads_before = torch.get_num_threads()
    threads = threads or threads_before

    with contextlib.ExitStack() as stack:
        torch.set_num_threads(threads)
        stack.callback(torch.set_num_threads, threads_before)
        work_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="posttrain-bench-rl-step-"))
        floor = FloorStep(copy.deepcopy(base_model), base_tok, prompts, preset, sampler="draw", seed=seed)
        plain_hf = FloorStep(copy.deepcopy(base_model), base_tok, prompts, preset, sampler="multinomial")
        posttrain = PosttrainStep(
            copy.deepcopy(base_model),
            copy.deepcopy(base_tok),
            preset,
            task_params,
            seed=seed,
            steps=total_rounds + int(profile),
            out_dir=f"{work_dir}/posttrain",
        )
        stack.callback(posttrain.close)

        def timed(side: FloorStep | PosttrainStep) -> float:
            t0 = time.perf_counter()
            side.step()
            return time.perf_counter() - t0

        in_process: tuple[FloorStep | PosttrainStep, ...] = (posttrain, floor, plain_hf)

        def round_others(i: int) -> None:
            # rotate the order of the in-process steps so none always follows TRL or another one
            k = i % len(in_process)
            for side in in_process[k:] + in_process[:k]:
                all_times[side.name].append(timed(side))
            if i >= warmup:
                matmul_times.extend(time_matmul(matmul_size, repeats=matmul_repeats))
                if preset.precision == "bf16":  # its FLOP limit; on a CPU without native bf16 a
                    # 2048^2 bf16 matmul takes seconds each, for a rate an fp32 run never uses
                    matmul_times_bf16.extend(
                        time_matmul(matmul_size, repeats=matmul_repeats, dtype=torch.bfloat16)
                    )
            loads.append(os.getloadavg()[0])
            phase = "warm-up" if i < warmup else "measured"
            log(
                f"round {i + 1}/{total_rounds} ({phase}): "
                + ", ".join(f"{k} {v[-1]:.3f}s" for k, v in all_times.items() if len(v) > i)
            )

        trl_lengths: list[int] = []
        if trl_skipped is None:
            trl = TRLRun(
                copy.deepcopy(base_model),
                copy.deepcopy(base_tok),
                examples,
                reward_fn,
                preset,
                total_steps=total_rounds,
                seed=seed,
                output_dir=f"{work_dir}/trl",
            )

            def after_trl(i: int, dt: float) -> None:
                all_times["trl"].append(dt)
                round_others(i)

            trl.run(after_trl)
            trl_lengths = trl.reward.completion_lengths
        else:
            for i in range(total_rounds):
                round_others(i)
        top_ops = profile_step(posttrain) if profile else None

    measured = {side: times[warmup:] for side, times in all_times.items()}
    lengths = {
        "posttrain": posttrain.completion_lengths,
        "trl": trl_lengths,
        "floor": floor.completion_lengths,
        "plain_hf": plain_hf.completion_lengths,
    }
    result: dict[str, Any] = {
        "preset": preset.name,
        "config": asdict(preset) | {"batch_size": preset.batch_size, "cpu_capability": cpu_capability()},
        "repeats": repeats,
        "warmup": warmup,
        **summarize(
            measured,
            flops_total=flops["total"],
            matmul_size=matmul_size,
            matmul_times=matmul_times,
            matmul_times_bf16=matmul_times_bf16,
        ),
        "matmul_times_bf16_s": matmul_times_bf16,
        "loadavg_start": list(load_start),
        "loadavg_rounds": loads,
        "loadavg_end": list(os.getloadavg()),
        # posttrain's own mismatch metrics, median over the measured steps (docs/precision.md)
        "posttrain_rollout_logp_diff": _median(
            [m["rollout_logp_diff"] for m in posttrain.metrics[warmup:] if "rollout_logp_diff" in m]
        ),
        "posttrain_rollout_ratio_mean": _median(
            [m["rollout_ratio_mean"] for m in posttrain.metrics[warmup:] if "rollout_ratio_mean" in m]
        ),
        "trl_skipped_reason": trl_skipped,
        "posttrain_phases": None,  # filled below from the rates in the summary
        "posttrain_profile": top_ops,
        "step_times_s": measured,
        "warmup_times_s": {side: times[:warmup] for side, times in all_times.items()},
        "matmul_size": matmul_size,
        "matmul_times_s": matmul_times,
        "flops": flops,
        "model_shape": asdict(shape),
        "prompt_tokens": prompt_lens,
        "completion_tokens": {
            side: {"min": min(v), "max": max(v), "count": len(v)} if v else None
            for side, v in lengths.items()
        },
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            **(versions or {}),
        },
        "torch_threads": threads,
    }
    rate = result["matmul_gflops_bf16"] if preset.precision == "bf16" else result["matmul_gflops"]
    result["posttrain_phases"] = phase_breakdown(posttrain.metrics[warmup : warmup + repeats], flops, rate)
    _check_token_counts(result, preset.new_tokens)
    return result


def _check_token_counts(result: dict[str, Any], new_tokens: int) -> None:
    for side, stats in result["completion_tokens"].items():
        if stats is not None and (stats["min"] != new_tokens or stats["max"] != new_tokens):
            raise PosttrainRuntimeError(
                f"{side}: completions have {stats['min']}..{stats['max']} tokens, expected exactly "
                f"{new_tokens} (EOS suppression failed, the comparison would be unfair)"
            )


# --------------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------------


def report_rows(result: dict[str, Any]) -> list[list[Any]]:
    """Rows of the step-time table: side, median, min, max, x floor, x FLOP limit, tokens per completion."""
    floor, limit = result["floor_s"], result["flop_limit_s"]
    labels = {
        "posttrain": "posttrain",
        "trl": "TRL GRPO",
        "floor": "floor",
        "plain_hf": "plain HF",
    }
    medians = {
        "posttrain": result["posttrain_median_step_s"],
        "trl": result["trl_median_step_s"],
        "floor": floor,
        "plain_hf": result.get("plain_hf_median_step_s"),
    }
    rows: list[list[Any]] = []
    for side in SIDES:
        times = result["step_times_s"].get(side) or []
        if not times:
            rows.append([labels[side], "skipped", "", "", "", "", ""])
            continue
        tokens = result["completion_tokens"].get(side)
        rows.append(
            [
                labels[side],
                medians[side],
                min(times),
                max(times),
                _ratio(medians[side], floor),
                _ratio(medians[side], limit),
                "" if tokens is None else tokens["max"],
            ]
        )
    rows.append(["FLOP limit", limit, None, None, _ratio(limit, floor), 1.0, ""])
    return rows


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.4g}"


def print_report(result: dict[str, Any], console: Any = None) -> None:
    """Rich tables: step times side by side, then the ratios with the target's pass/fail."""
    from rich.console import Console

    from posttrain.utils.tables import print_table

    console = console or Console()
    cfg = result["config"]
    title = (
        f"rl-step '{result['preset']}': {cfg['num_prompts']} prompts x {cfg['group_size']} completions x "
        f"{cfg['new_tokens']} new tokens, model {cfg['model']}, median of {result['repeats']} "
        f"(after {result['warmup']} warm-up)"
    )
    cols = ["step", "median s", "min s", "max s", "x floor", "x limit", "tok/compl"]
    print_table(title, cols, report_rows(result), floatfmt=".3f", console=console)
    flops = result["flops"]
    console.print(
        f"FLOP limit: {flops['total'] / 1e9:.2f} GFLOP per step (generation {flops['generation'] / 1e9:.2f} "
        f"+ train fwd {flops['train_forward'] / 1e9:.2f} + bwd {flops['train_backward'] / 1e9:.2f}) / "
        f"{result['matmul_gflops']:.1f} GFLOP/s measured fp32 matmul ({result['matmul_size']}^2) "
        f"= {result['flop_limit_s']:.3f} s"
    )
    if result.get("flop_limit_bf16_s"):
        console.print(
            f"bf16 FLOP limit: {result['matmul_gflops_bf16']:.1f} GFLOP/s measured bf16 matmul = "
            f"{result['flop_limit_bf16_s']:.3f} s; posttrain = {result['ratio_posttrain_over_flop_limit_bf16']:.2f}x "
            f"it (target <= {result['target_posttrain_over_flop_limit_bf16']}), TRL = "
            + (
                f"{result['ratio_trl_over_flop_limit_bf16']:.2f}x"
                if result.get("ratio_trl_over_flop_limit_bf16")
                else "n/a"
            ),
            highlight=False,
        )
    cfgp = result["config"]
    console.print(
        f"CPU {cfgp.get('cpu_capability', '?')}, precision {cfgp.get('precision', 'fp32')}, posttrain engine {cfgp.get('engine', 'hf')}; posttrain "
        f"rollout_logp_diff {_fmt(result.get('posttrain_rollout_logp_diff'))}, rollout ratio mean "
        f"{_fmt(result.get('posttrain_rollout_ratio_mean'))}; posttrain / TRL target <= "
        f"{result.get('target_posttrain_over_trl')}; load average "
        f"{_fmt(result.get('loadavg_start', [None])[0])} at start, "
        f"{_fmt(result.get('loadavg_end', [None])[0])} at end",
        highlight=False,
    )
    target = result["target_posttrain_over_floor"]
    verdict = {True: "[green]PASS[/green]", False: "[red]FAIL[/red]", None: "n/a"}[result["target_pass"]]
    ratio_rows = [
        [
            "posttrain / floor",
            result["ratio_posttrain_over_floor"],
            result["paired_ratio_posttrain_over_floor"],
            f"<= {target:.2f}: {verdict}",
        ],
        [
            "posttrain / TRL",
            result["ratio_posttrain_over_trl"],
            result["paired_ratio_posttrain_over_trl"],
            "",
        ],
        ["TRL / floor", result["ratio_trl_over_floor"], result["paired_ratio_trl_over_floor"], ""],
        [
            "posttrain / plain HF",
            result.get("ratio_posttrain_over_plain_hf"),
            result.get("paired_ratio_posttrain_over_plain_hf"),
            "",
        ],
        [
            "floor / plain HF",
            result.get("ratio_floor_over_plain_hf"),
            result.get("paired_ratio_floor_over_plain_hf"),
            "",
        ],
        ["floor / FLOP limit", result["ratio_floor_over_flop_limit"], None, ""],
    ]
    print_table(
        "ratios: of medians (judged), and median of per-round ratios (paired)",
        ["ratio", "of medians", "paired", "target"],
        ratio_rows,
        console=console,
    )
    gap = result.get("ratio_disagreement")
    if gap is not None and gap > NOISY_GAP:
        console.print(
            f"[yellow]noisy run[/yellow]: ratios of medians and paired ratios differ by up to {gap:.0%}; "
            "the machine load changed during the run. Rerun with more --repeats or --threads 1."
        )
    phases = result.get("posttrain_phases") or []
    if phases:
        prec = result["config"].get("precision", "fp32")
        print_table(
            f"where posttrain's step goes (median over the measured steps; limit = the phase's FLOPs at "
            f"the measured {prec} matmul rate)",
            ["phase", "median s", "share", "GFLOP", "GFLOP/s", "x limit"],
            [
                [r["phase"], r["median_s"], r["share"], r["gflop"], r["achieved_gflops"], r["x_limit"]]
                for r in phases
            ],
            floatfmt=".3f",
            console=console,
        )
    ops = result.get("posttrain_profile") or []
    if ops:
        print_table(
            "torch.profiler, one posttrain step: top operators by self CPU time",
            ["operator", "calls", "self s", "share"],
            [[r["op"], r["calls"], r["self_s"], r["share"]] for r in ops],
            floatfmt=".3f",
            console=console,
        )
    if result.get("trl_skipped_reason"):
        # not markup: the reason names `./lab[bench]`, which rich would read as a style tag
        console.print(f"TRL skipped: {result['trl_skipped_reason']}", markup=False, highlight=False)
