"""vLLM rollout engine (``rollout.engine: {name: vllm}``), colocated with training on the same GPU.

WRITTEN FOR, NOT YET RUN ON, A GPU: this module follows vLLM's documented Python API (``LLM``,
``SamplingParams``, ``LLM.sleep`` / ``LLM.wake_up``, ``logprobs_mode``) and the colocated weight-sync
path TRL uses (``trl/generation/vllm_generation.py``: ``distributed_executor_backend=
"external_launcher"``, ``model_runner.model.load_weights``), but it has only been exercised on CPU
machines without vLLM (registration, parameter checks, the missing-extra error, the truncated-IS
math). Install with ``pip install -e ".[vllm]"``.

What it does:

* **Colocated**: one ``vllm.LLM`` in the trainer's process, on the trainer's GPU
  (``gpu_memory_utilization`` is vLLM's share of it). Engines built for the same policy module
  (training and evaluation) share one ``LLM``.
* **Weights synced after each update**: the trainer calls ``sync_weights(model)`` after every
  optimizer phase; the policy's ``state_dict`` (Hugging Face parameter names; a DDP/FSDP wrapper's
  ``.module`` is unwrapped) is loaded into vLLM's model with its own ``load_weights``, then the
  prefix cache is reset.
* **LoRA policies** (``model.lora``, a peft model): vLLM is built with ``enable_lora=True`` from the
  BASE weights (the frozen base, written once to a temporary directory with Hugging Face names), and
  ``sync_weights`` syncs the adapter only: it writes the adapter (peft's ``save_pretrained``, a few MB)
  to a fresh directory and generates with a new ``LoRARequest`` for it (vLLM's documented multi-LoRA
  API), so the base weights never move after start-up (after a level-2 sleep they are reloaded once
  from the trainer's frozen base). Written for a GPU like the rest of this module; not yet run.
* **Sleep / wake** (``sleep_level`` 1 or 2, default 2; 0 = never sleep): after generating, vLLM sleeps
  (level 1: weights copied to CPU, KV cache freed; level 2: both freed, as TRL's colocate mode, since
  the next ``sync_weights`` overwrites the weights anyway), returning the GPU memory to the trainer;
  ``sync_weights`` wakes the weights, and the next ``generate`` wakes the KV cache.
* ``max_batch_size`` becomes vLLM's ``max_num_seqs`` (vLLM schedules its own batches).
* **Per-token sampling log-probs**: ``SamplingParams(logprobs=0)`` with
  ``logprobs_mode="processed_logprobs"``, i.e. the log-prob of each sampled token under the
  distribution actually sampled from (after temperature and top-p), the same quantity
  :class:`~posttrain.rollout.HFEngine` records (0 for greedy decoding, as there).
* **Truncated importance sampling** (``tis_mode``): the correction for sampler/trainer mismatch,
  see :func:`truncated_is_weights`.

Sampling is seeded per prompt from the engine's own ``torch.Generator`` (``SamplingParams.seed``),
saved in checkpoints by ``state_dict``; vLLM's batched kernels are not bitwise deterministic across
batch compositions, so resumed runs match in distribution, not bit for bit.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import weakref
from typing import Any

import torch

from posttrain.models.lora import is_lora
from posttrain.rollout.base import (
    FINISH_LENGTH,
    FINISH_STOP,
    RolloutBatch,
    RolloutEngine,
    SamplingParams,
    check_generate_args,
    eos_and_pad,
)
from posttrain.utils.errors import InvalidValueError, PosttrainRuntimeError

#: ``tis_mode`` values: token- or sequence-level ratio, truncated (clamped at the cap) or masked (0
#: outside [tis_min, tis_cap]); the names are TRL's ``vllm_importance_sampling_mode`` values.
TIS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


def truncated_is_weights(
    trainer_logp: torch.Tensor,
    sampler_logp: torch.Tensor,
    mask: torch.Tensor,
    *,
    mode: str = "token_truncate",
    cap: float = 2.0,
    floor: float | None = None,
) -> torch.Tensor:
    """Importance weights correcting for the sampler's distribution differing from the trainer's.

    A fast inference engine (vLLM kernels, bf16, different reduction order) samples from μ while the
    trainer computes π_old for the same weights; the policy gradient needs tokens drawn from π_old.
    Truncated importance sampling (TIS; Yao et al. 2025, "Your Efficient RL Framework Secretly Brings
    You Off-Policy RL Training"; verl ``rollout_is``, TRL ``vllm_importance_sampling_correction``)
    multiplies each token's loss by

        token_truncate:     w_t = min(exp(log π_old_t − log μ_t), C)
        token_mask:         w_t = ρ_t if floor ≤ ρ_t ≤ C else 0,   ρ_t = exp(log π_old_t − log μ_t)
        sequence_truncate:  w_i = min(exp(Σ_t (log π_old_t − log μ_t)), C)   on every token of row i
        sequence_mask:      w_i = ρ_i if floor ≤ ρ_i ≤ C else 0

    with C = ``cap`` and floor = ``floor`` (masked modes only; None = no lower bound). Weights are
    detached, 1 at padding (``mask`` == 0), and computed from clamped log-ratios (±20) so they are
    always finite. ``trainer_logp`` is π_old (the trainer's log-probs at rollout time), not the
    current policy: the PPO ratio handles π_θ / π_old separately.
    """
    if mode not in TIS_MODES:
        raise InvalidValueError(f"tis_mode must be one of {', '.join(TIS_MODES)}, got {mode!r}")
    if not cap > 0:
        raise InvalidValueError(f"tis_cap must be > 0, got {cap!r}")
    if floor is not None and not 0 <= floor < cap:
        raise InvalidValueError(f"tis_min must be in [0, tis_cap={cap}), got {floor!r}")
    if trainer_logp.shape != sampler_logp.shape or mask.shape != trainer_logp.shape:
        raise InvalidValueError(
            f"truncated_is_weights: shapes differ: trainer {tuple(trainer_logp.shape)}, sampler "
            f"{tuple(sampler_logp.shape)}, mask {tuple(mask.shape)}"
        )
    valid = mask.bool()
    diff = torch.where(valid, trainer_logp.detach().float() - sampler_logp.detach().float(), 0.0)
    diff = torch.nan_to_num(diff, nan=0.0)
    if mode.startswith("sequence"):
        diff = diff.sum(dim=-1, keepdim=True).expand_as(diff)
    rho = torch.exp(diff.clamp(-20.0, 20.0))
    if mode.endswith("truncate"):
        w = rho.clamp(max=cap)
    else:
        keep = rho <= cap
        if floor is not None:
            keep &= rho >= floor
        w = torch.where(keep, rho, torch.zeros_like(rho))
    return torch.where(valid, w, torch.ones_like(w)).to(trainer_logp.dtype)


#: LoRA ranks vLLM accepts for ``max_lora_rank``.
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def vllm_lora_rank(rank: int) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that holds an adapter of rank ``rank``."""
    for r in VLLM_LORA_RANKS:
        if r >= rank:
            return r
    raise InvalidValueError(f"LoRA rank {rank} is above vLLM's largest max_lora_rank ({VLLM_LORA_RANKS[-1]})")


def lora_rank(model: torch.nn.Module) -> int:
    """Rank of a peft model's active adapter."""
    cfg = model.peft_config[model.active_adapter]
    return int(cfg.r)


def lora_base_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The frozen base weights of a peft model under their Hugging Face names: adapter tensors
    (``lora_A`` / ``lora_B``) dropped, peft's ``.base_layer`` removed from wrapped layers' names."""
    out = {}
    for name, t in model.get_base_model().state_dict().items():
        if ".lora_" in name:
            continue
        out[name.replace(".base_layer.", ".")] = t.detach()
    return out


def _import_vllm() -> Any:
    try:
        import vllm
    except ImportError as e:
        raise ImportError(
            f"rollout engine 'vllm' needs vLLM ({e}); install the vllm extra on a CUDA machine: "
            'pip install -e ".[vllm]"'
        ) from e
    return vllm


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The HF module inside a DDP / FSDP / compile wrapper (whose state-dict names vLLM knows)."""
    while hasattr(model, "module") and isinstance(model.module, torch.nn.Module):
        model = model.module
    return getattr(model, "_orig_mod", model)


class _SharedLLM:
    """One ``vllm.LLM`` per policy module, shared by the engines built for it (train and eval)."""

    def __init__(self, llm: Any, sleep_level: int) -> None:
        self.llm = llm
        self.sleep_level = sleep_level
        self.lora_request: Any = None  # LoRA policies: the request of the last synced adapter
        self.lora_version = 0
        self.weights_asleep = False
        self.kv_asleep = False

    def wake_kv(self) -> None:
        if self.kv_asleep:
            self.llm.wake_up(tags=["kv_cache"])
            self.kv_asleep = False

    def sleep(self) -> None:
        if self.sleep_level and not (self.weights_asleep and self.kv_asleep):
            self.llm.sleep(level=self.sleep_level)
            self.weights_asleep = self.kv_asleep = True


_SHARED: weakref.WeakKeyDictionary[torch.nn.Module, _SharedLLM] = weakref.WeakKeyDictionary()


class VLLMEngine(RolloutEngine):
    """Colocated vLLM generation for the policy ``model`` (see the module docstring)."""

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        *,
        seed: int = 0,
        max_batch_size: int | None = None,
        eos_token_ids: list[int] | None = None,
        gpu_memory_utilization: float = 0.3,
        sleep_level: int = 2,
        dtype: str = "auto",
        max_model_len: int | None = None,
        enforce_eager: bool = False,
        tis_mode: str | None = None,
        tis_cap: float = 2.0,
        tis_min: float | None = None,
        llm_kwargs: dict[str, Any] | None = None,
    ) -> None:
        check_vllm_params(gpu_memory_utilization, sleep_level, tis_mode, tis_cap, tis_min)
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.eos_token_ids, self._pad_token_id = eos_and_pad(tokenizer, eos_token_ids, "VLLMEngine")
        self.tis_mode, self.tis_cap, self.tis_min = tis_mode, tis_cap, tis_min
        self.generator = torch.Generator()
        self.generator.manual_seed(seed)
        self._vllm = _import_vllm()
        self._lora = is_lora(_unwrap(model))
        base = _unwrap(model)
        shared = _SHARED.get(base)
        if shared is None:
            shared = _SharedLLM(
                self._build_llm(
                    base,
                    seed,
                    gpu_memory_utilization,
                    sleep_level,
                    dtype,
                    max_model_len,
                    enforce_eager,
                    {**({"max_num_seqs": max_batch_size} if max_batch_size else {}), **(llm_kwargs or {})},
                ),
                sleep_level,
            )
            _SHARED[base] = shared
        self._shared = shared

    # ---------------------------------------------------------------------------------- vLLM setup
    def _build_llm(
        self,
        base: torch.nn.Module,
        seed: int,
        gpu_memory_utilization: float,
        sleep_level: int,
        dtype: str,
        max_model_len: int | None,
        enforce_eager: bool,
        extra: dict[str, Any],
    ) -> Any:
        if (
            torch.distributed.is_available()
            and torch.distributed.is_initialized()
            and torch.distributed.get_world_size() > 1
        ):
            raise InvalidValueError(
                "rollout engine 'vllm' runs one colocated vLLM per single-process run; under torchrun "
                f"(world size {torch.distributed.get_world_size()}) use the 'hf' engine"
            )
        # vLLM's in-process executor (as TRL's colocate mode): the trainer's process is rank 0 of 1
        for key, value in (
            ("RANK", "0"),
            ("LOCAL_RANK", "0"),
            ("WORLD_SIZE", "1"),
            ("MASTER_ADDR", "127.0.0.1"),
        ):
            os.environ.setdefault(key, value)
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
        path = getattr(base, "name_or_path", None) or getattr(
            getattr(base, "config", None), "_name_or_path", ""
        )
        if self._lora:  # vLLM holds the frozen base; adapters come per request (sync_weights)
            self._tmp = tempfile.TemporaryDirectory(prefix="posttrain-vllm-")
            path = self._tmp.name
            base.get_base_model().save_pretrained(path, state_dict=lora_base_state_dict(base))
            self.tokenizer.save_pretrained(path)
            extra = {
                "enable_lora": True,
                "max_loras": 1,
                "max_lora_rank": vllm_lora_rank(lora_rank(base)),
                **extra,
            }
        elif not path or not os.path.isdir(path):
            # a preset or an in-memory model: vLLM needs a directory for the architecture and tokenizer;
            # the weights are replaced by sync_weights anyway
            self._tmp = tempfile.TemporaryDirectory(prefix="posttrain-vllm-")
            path = self._tmp.name
            base.save_pretrained(path)
            self.tokenizer.save_pretrained(path)
        kwargs: dict[str, Any] = {
            "model": path,
            "tokenizer": path,
            "dtype": dtype,
            "seed": seed,
            "gpu_memory_utilization": gpu_memory_utilization,
            "enable_sleep_mode": sleep_level > 0,
            "distributed_executor_backend": "external_launcher",
            "logprobs_mode": "processed_logprobs",  # log-probs after temperature / top-p
            "enforce_eager": enforce_eager,
        }
        if max_model_len is not None:
            kwargs["max_model_len"] = max_model_len
        kwargs.update(extra)
        return self._vllm.LLM(**kwargs)

    # --------------------------------------------------------------------------- RolloutEngine API
    @property
    def pad_token_id(self) -> int:
        return self._pad_token_id

    def generate(
        self, prompt_ids: list[list[int]], n_per_prompt: list[int], params: SamplingParams
    ) -> RolloutBatch:
        check_generate_args(prompt_ids, n_per_prompt)
        if not any(n_per_prompt):
            raise InvalidValueError("generate: no sequences requested (all n_per_prompt are 0)")
        if params.seed is not None:
            self.generator.manual_seed(params.seed)
        shared = self._shared
        # level 2 discarded the weights, level 1 kept a stale copy: push the policy's (LoRA: the adapter
        # has never been synced yet, e.g. a resumed run)
        if shared.weights_asleep or (self._lora and shared.lora_request is None):
            self.sync_weights(self.model)
        shared.wake_kv()
        todo = [(i, p, n) for i, (p, n) in enumerate(zip(prompt_ids, n_per_prompt, strict=True)) if n > 0]
        sp = [self._sampling_params(params, n) for _, _, n in todo]
        lora = {"lora_request": shared.lora_request} if self._lora else {}
        outputs = shared.llm.generate(
            [{"prompt_token_ids": list(p)} for _, p, _ in todo], sampling_params=sp, use_tqdm=False, **lora
        )
        shared.sleep()
        prompts, completions, groups, reasons, logps = [], [], [], [], []
        for (i, p, n), out in zip(todo, outputs, strict=True):
            if len(out.outputs) != n:
                raise PosttrainRuntimeError(
                    f"vLLM returned {len(out.outputs)} completions for prompt {i}, asked {n}"
                )
            for c in out.outputs:
                ids = list(c.token_ids)
                prompts.append(list(p))
                completions.append(ids)
                groups.append(i)
                reasons.append(FINISH_STOP if c.finish_reason == "stop" else FINISH_LENGTH)
                logps.append(self._token_logprobs(c, ids, params))
        return RolloutBatch.from_token_lists(
            prompts,
            completions,
            pad_token_id=self.pad_token_id,
            group_ids=groups,
            finish_reasons=reasons,
            logprobs=logps if params.logprobs else None,
        )

    def _sampling_params(self, params: SamplingParams, n: int) -> Any:
        seed = int(torch.randint(0, 2**31 - 1, (1,), generator=self.generator))
        min_tokens = params.max_new_tokens if params.suppress_eos else params.min_new_tokens
        return self._vllm.SamplingParams(
            n=n,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=-1 if not params.greedy else 1,
            max_tokens=params.max_new_tokens,
            min_tokens=min_tokens,  # EOS / stop tokens banned before this many tokens
            stop_token_ids=self.eos_token_ids or None,
            logprobs=0 if params.logprobs and not params.greedy else None,
            seed=seed,
            detokenize=False,
        )

    @staticmethod
    def _token_logprobs(c: Any, ids: list[int], params: SamplingParams) -> list[float]:
        if not params.logprobs or params.greedy or c.logprobs is None:
            return [0.0] * len(ids)
        out = []
        for tok, entry in zip(ids, c.logprobs, strict=True):
            lp = entry[tok].logprob  # logprobs=0 returns the sampled token's entry
            out.append(0.0 if lp != lp else float(lp))  # NaN (unscorable) -> 0, i.e. ratio 1 under TIS
        return out

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Load ``model``'s current weights into vLLM (waking the weights first if asleep)."""
        shared = self._shared
        woke = shared.weights_asleep
        if shared.weights_asleep:
            shared.llm.wake_up(tags=["weights"])
            shared.weights_asleep = False
        runner_model = shared.llm.llm_engine.model_executor.driver_worker.model_runner.model
        if self._lora:
            if woke:  # the frozen base, once after a sleep that discarded it
                with torch.no_grad():
                    runner_model.load_weights(lora_base_state_dict(_unwrap(model)).items())
            self._sync_adapter(_unwrap(model))
        else:
            with torch.no_grad():
                runner_model.load_weights(
                    (name, t.detach()) for name, t in _unwrap(model).state_dict().items()
                )
        shared.llm.reset_prefix_cache()

    def _sync_adapter(self, model: torch.nn.Module) -> None:
        """Write the adapter (only) to a fresh directory and point the shared LoRA request at it; vLLM
        loads a request id it has not seen, so each sync gets the next id."""
        from vllm.lora.request import LoRARequest

        shared = self._shared
        shared.lora_version += 1
        if not hasattr(self, "_adapters"):
            self._adapters = tempfile.TemporaryDirectory(prefix="posttrain-vllm-lora-")
        path = os.path.join(self._adapters.name, f"v{shared.lora_version}")
        model.save_pretrained(path)
        old = shared.lora_request
        shared.lora_request = LoRARequest(f"policy-{shared.lora_version}", shared.lora_version, path)
        if old is not None:
            shutil.rmtree(old.lora_path, ignore_errors=True)

    def rollout_is_weights(
        self, trainer_logp: torch.Tensor, sampler_logp: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor | None:
        """Truncated-IS weights (``tis_mode``; None when off) for the loss's ``is_weights``."""
        if self.tis_mode is None:
            return None
        return truncated_is_weights(
            trainer_logp, sampler_logp, mask, mode=self.tis_mode, cap=self.tis_cap, floor=self.tis_min
        )

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        if "generator" in state:
            self.generator.set_state(state["generator"].cpu())


def check_vllm_params(
    gpu_memory_utilization: float,
    sleep_level: int,
    tis_mode: str | None,
    tis_cap: float,
    tis_min: float | None,
) -> None:
    """Parameter checks that need no vLLM (run at config time by the factory and at construction)."""
    if not 0 < gpu_memory_utilization <= 1:
        raise InvalidValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization!r}")
    if sleep_level not in (0, 1, 2):
        raise InvalidValueError(
            f"sleep_level must be 0 (off), 1 (weights to CPU) or 2 (discard), got {sleep_level!r}"
        )
    if tis_mode is not None and tis_mode not in TIS_MODES:
        raise InvalidValueError(f"tis_mode must be null or one of {', '.join(TIS_MODES)}, got {tis_mode!r}")
    if not tis_cap > 0:
        raise InvalidValueError(f"tis_cap must be > 0, got {tis_cap!r}")
    if tis_min is not None and not 0 <= tis_min < tis_cap:
        raise InvalidValueError(f"tis_min must be in [0, tis_cap={tis_cap}), got {tis_min!r}")


def vllm_engine(
    ctx: Any,
    *,
    eos_token_ids: list[int] | None = None,
    gpu_memory_utilization: float = 0.3,
    sleep_level: int = 2,
    dtype: str = "auto",
    max_model_len: int | None = None,
    enforce_eager: bool = False,
    tis_mode: str | None = None,
    tis_cap: float = 2.0,
    tis_min: float | None = None,
    llm_kwargs: dict[str, Any] | None = None,
) -> RolloutEngine:
    """Colocated vLLM (:class:`~posttrain.rollout.vllm.VLLMEngine`; needs the ``vllm`` extra and a GPU;
    written for, not yet run on, a GPU). ``gpu_memory_utilization``: vLLM's share of the GPU;
    ``sleep_level``: 0 off, 1 weights to CPU, 2 discard between generations; ``tis_mode`` /
    ``tis_cap`` / ``tis_min``: truncated importance sampling against sampler/trainer mismatch
    (``token_truncate``, ``token_mask``, ``sequence_truncate``, ``sequence_mask``; null = off)."""
    check_vllm_params(gpu_memory_utilization, sleep_level, tis_mode, tis_cap, tis_min)
    return VLLMEngine(
        ctx.model,
        ctx.tokenizer,
        seed=ctx.seed,
        max_batch_size=ctx.max_batch_size,
        eos_token_ids=eos_token_ids,
        gpu_memory_utilization=gpu_memory_utilization,
        sleep_level=sleep_level,
        dtype=dtype,
        max_model_len=max_model_len,
        enforce_eager=enforce_eager,
        tis_mode=tis_mode,
        tis_cap=tis_cap,
        tis_min=tis_min,
        llm_kwargs=llm_kwargs,
    )
