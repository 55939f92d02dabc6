"""`posttrain bench dpo-step`: one DPO optimizer step of posttrain vs TRL's `DPOTrainer`, side by side.

Both sides train the SAME model (copies of the same weights and tokenizer) on the SAME pairs (the
shipped standard preference file, ``src/posttrain/configs/preference/preferences-arithmetic.jsonl``,
repeated to ``pairs`` rows) with the same batch (``batch`` pairs per optimizer step, no gradient
accumulation), the sigmoid loss with the same β, AdamW at the same constant lr, the same gradient clip,
the same precision, and reference log-probs computed ONCE before training on both sides (posttrain
always; TRL with ``precompute_ref_log_probs=True``), so a step is one forward and backward over the
batch's 2 × ``batch`` sequences plus the optimizer update on each side.

- **posttrain**: :meth:`posttrain.train.preference.PreferenceTrainer.step`, the real training call.
- **TRL**: ``DPOTrainer.train()`` with a callback that times every optimizer step (``on_step_begin`` ->
  ``on_step_end``) and runs one posttrain step after it, outside TRL's timed window: the two sides
  alternate step by step in one process (warm-up steps first, then ``repeats`` measured ones), so load
  on a shared machine hits both alike. Medians and the ratio posttrain / TRL are reported; the paired
  ratio (median of per-round ratios) beside it.
- **Peak memory**: each side again in a fresh process (:func:`~posttrain_lab.benchmarks.perf.common.run_isolated`),
  one warm-up step, then the peak above the start of one measured step
  (:class:`~posttrain_lab.benchmarks.perf.common.PeakMemory`: CPU peak RSS, or CUDA's
  ``max_memory_allocated``).

TRL's order of the pairs is its own shuffled sampler (posttrain's is its epoch-wise shuffle): the same
rows, batch size and lengths distribution, not the same pairs in the same step.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from importlib.resources import files
from typing import Any

from posttrain.models.precision import cpu_capability
from posttrain.utils.errors import InvalidValueError
from posttrain_lab.benchmarks.perf.common import PeakMemory, run_isolated, train_timed

DATA = str(files("posttrain") / "configs" / "preference" / "preferences-arithmetic.jsonl")


@dataclass(frozen=True)
class DPOStepPreset:
    name: str
    model: str  # a posttrain preset, smollm2-135m or a local HF directory
    batch: int  # pairs per optimizer step
    pairs: int = 64  # rows of the dataset (the shipped file repeated)
    beta: float = 0.1
    lr: float = 1e-5
    grad_clip: float = 1.0
    precision: str = "fp32"  # fp32, bf16 (TRL: bf16=True) or auto (resolved for this machine)

    def __post_init__(self) -> None:
        from posttrain.models.precision import check_precision, resolve_precision

        try:
            check_precision(self.precision, allow_auto=True)
        except ValueError as e:
            raise InvalidValueError(f"dpo-step preset {self.name!r}: {e}") from None
        object.__setattr__(self, "precision", resolve_precision(self.precision, "cpu")[0])
        for key in ("batch", "pairs"):
            if not isinstance(getattr(self, key), int) or getattr(self, key) < 1:
                raise InvalidValueError(f"dpo-step preset {self.name!r}: {key} must be an integer >= 1")


PRESETS: dict[str, DPOStepPreset] = {
    "tiny": DPOStepPreset("tiny", model="tiny", batch=8),
    # the built-in real model (posttrain models prepare smollm2-135m), native precision of this CPU
    "smol": DPOStepPreset("smol", model="smollm2-135m", batch=8, precision="auto"),
}


def get_preset(name: str) -> DPOStepPreset:
    if name not in PRESETS:
        raise InvalidValueError(f"unknown dpo-step preset {name!r}; known: {', '.join(sorted(PRESETS))}")
    return PRESETS[name]


def bench_rows(n: int) -> list[dict[str, str]]:
    """The shipped standard preference rows, repeated to ``n``."""
    with open(DATA, encoding="utf-8") as f:
        base = [json.loads(line) for line in f if line.strip()]
    return [base[i % len(base)] for i in range(n)]


def trl_versions() -> dict[str, str] | None:
    try:
        import accelerate
        import datasets
        import trl
    except ImportError:
        return None
    return {"trl": trl.__version__, "accelerate": accelerate.__version__, "datasets": datasets.__version__}


# --------------------------------------------------------------------------------------------- sides
def posttrain_side(
    model: Any, tokenizer: Any, preset: DPOStepPreset, *, steps: int, seed: int, out_dir: str
) -> Any:
    """A :class:`PreferenceTrainer` on the preset's pairs (reference log-probs computed here, untimed)."""
    from posttrain.train.preference import PreferenceConfig, PreferenceTrainer

    cfg = PreferenceConfig(
        model={"name": preset.model, "precision": preset.precision},
        loss={"name": "dpo", "params": {"beta": preset.beta}},
        steps=steps,
        batch_size=preset.batch,
        optimizer={"lr": preset.lr, "grad_clip": preset.grad_clip},
        seed=seed,
        out_dir=out_dir,
        save=False,
        progress=False,
    )
    return PreferenceTrainer(cfg, model, tokenizer, rows=bench_rows(preset.pairs))


class TRLSide:
    """TRL's ``DPOTrainer`` configured like posttrain's side, driven by ``trainer.train()``."""

    def __init__(
        self, model: Any, tokenizer: Any, preset: DPOStepPreset, *, steps: int, seed: int, out_dir: str
    ) -> None:
        from datasets import Dataset
        from transformers import ProgressCallback
        from transformers.trainer_callback import PrinterCallback
        from transformers.utils import logging as hf_logging
        from trl import DPOConfig, DPOTrainer

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            args = DPOConfig(
                output_dir=out_dir,
                use_cpu=not str(next(model.parameters()).device).startswith("cuda"),
                bf16=preset.precision == "bf16",
                fp16=False,
                seed=seed,
                max_steps=steps,
                per_device_train_batch_size=preset.batch,
                gradient_accumulation_steps=1,
                learning_rate=preset.lr,
                lr_scheduler_type="constant",
                warmup_steps=0,
                weight_decay=0.0,
                max_grad_norm=preset.grad_clip,
                beta=preset.beta,
                loss_type=["sigmoid"],
                precompute_ref_log_probs=True,
                gradient_checkpointing=False,
                logging_strategy="no",
                save_strategy="no",
                eval_strategy="no",
                report_to=[],
                disable_tqdm=True,
                dataloader_num_workers=0,
            )
            verbosity = hf_logging.get_verbosity()
            hf_logging.set_verbosity_error()
            try:
                self.trainer = DPOTrainer(
                    model=model,
                    args=args,
                    train_dataset=Dataset.from_list(bench_rows(preset.pairs)),
                    processing_class=tokenizer,
                )
            finally:
                hf_logging.set_verbosity(verbosity)
        for cb in (PrinterCallback, ProgressCallback):
            self.trainer.remove_callback(cb)

    def run(self, begin: Callable[[int], None], end: Callable[[int, float], None]) -> int:
        """``trainer.train()``; ``begin(i)`` before and ``end(i, seconds)`` after the i-th optimizer step."""
        return train_timed(self.trainer, end, begin)


# ---------------------------------------------------------------------------------------- memory child
def memory_child(
    side: str, preset: dict[str, Any], seed: int, threads: int | None, device: str
) -> dict[str, Any]:
    """In a fresh process: build ``side``, one warm-up step, then the peak memory of one step."""
    import torch

    from posttrain.models import load_model_and_tokenizer

    if threads:
        torch.set_num_threads(threads)
    p = DPOStepPreset(**preset)
    model, tok = load_model_and_tokenizer(p.model, dtype="float32", device=device, seed=seed)
    peak: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="posttrain-bench-dpo-mem-") as work:
        if side == "posttrain":
            t = posttrain_side(model, tok, p, steps=2, seed=seed, out_dir=f"{work}/p")
            t.step()
            with PeakMemory(device) as pm:
                t.step()
        else:
            trl = TRLSide(model, tok, p, steps=2, seed=seed, out_dir=f"{work}/t")
            holder: dict[str, PeakMemory] = {}

            def begin(i: int) -> None:
                if i == 1:
                    holder["pm"] = PeakMemory(device).__enter__()

            def end(i: int, dt: float) -> None:
                if i == 1:
                    holder["pm"].__exit__(None, None, None)

            trl.run(begin, end)
            pm = holder["pm"]
    peak = {"peak_bytes": pm.peak_bytes, "method": pm.method}
    return peak


# ------------------------------------------------------------------------------------------ the bench
def run_dpo_step_bench(
    preset: DPOStepPreset,
    *,
    repeats: int = 5,
    warmup: int = 2,
    seed: int = 0,
    threads: int | None = None,
    memory: bool = True,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Time both sides interleaved in this process, then each side's peak memory in a fresh process;
    return the JSON-able result (medians, ratios posttrain / TRL, versions, the CPU's capability)."""
    import torch
    import transformers

    from posttrain.models import load_model_and_tokenizer

    if repeats < 1 or warmup < 0:
        raise InvalidValueError(f"repeats must be >= 1 and warmup >= 0, got {repeats}, {warmup}")
    versions = trl_versions()
    if versions is None:
        raise InvalidValueError(
            'dpo-step compares with TRL, which is not installed (pip install -e "./lab[bench]")'
        )
    log = log or (lambda _m: None)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    total = warmup + repeats
    threads_before = torch.get_num_threads()
    times: dict[str, list[float]] = {"posttrain": [], "trl": []}
    with contextlib.ExitStack() as stack:
        if threads:
            torch.set_num_threads(threads)
            stack.callback(torch.set_num_threads, threads_before)
        work = stack.enter_context(tempfile.TemporaryDirectory(prefix="posttrain-bench-dpo-step-"))
        base, tok = load_model_and_tokenizer(preset.model, dtype="float32", device=device, seed=seed)
        ours = posttrain_side(
            copy.deepcopy(base), copy.deepcopy(tok), preset, steps=total, seed=seed, out_dir=f"{work}/p"
        )
        trl = TRLSide(
            copy.deepcopy(base), copy.deepcopy(tok), preset, steps=total, seed=seed, out_dir=f"{work}/t"
        )
        metrics: list[dict[str, float]] = []

        def after_trl(i: int, dt: float) -> None:
            times["trl"].append(dt)
            if device == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            metrics.append(ours.step())
            if device == "cuda":
                torch.cuda.synchronize()
            times["posttrain"].append(time.perf_counter() - t0)
            phase = "warm-up" if i < warmup else "measured"
            log(f"step {i + 1}/{total} ({phase}): trl {dt:.3f}s, posttrain {times['posttrain'][-1]:.3f}s")

        trl.run(lambda i: None, after_trl)
    measured = {k: v[warmup:] for k, v in times.items()}
    med = {k: statistics.median(v) for k, v in measured.items()}
    paired = statistics.median(a / b for a, b in zip(measured["posttrain"], measured["trl"], strict=True))
    result: dict[str, Any] = {
        "preset": asdict(preset),
        "device": device,
        "cpu_capability": cpu_capability(),
        "torch_threads": threads or torch.get_num_threads(),
        "repeats": repeats,
        "warmup": warmup,
        "step_times_s": measured,
        "median_s": med,
        "posttrain_over_trl": med["posttrain"] / med["trl"],
        "posttrain_over_trl_paired": paired,
        "posttrain_last_metrics": metrics[-1],
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__, **versions},
        "loadavg_end": list(os.getloadavg()),
    }
    if memory:
        mem = {}
        for side in ("posttrain", "trl"):
            log(f"peak memory: {side} (fresh process)")
            mem[side] = run_isolated(
                "posttrain_lab.benchmarks.perf.dpo_step:memory_child",
                {"side": side, "preset": asdict(preset), "seed": seed, "threads": threads, "device": device},
            )
        result["peak_memory"] = mem
        result["memory_posttrain_over_trl"] = mem["posttrain"]["peak_bytes"] / max(
            1, mem["trl"]["peak_bytes"]
        )
    return result


def print_report(result: dict[str, Any], echo: Callable[[str], None] = print) -> None:
    p = result["preset"]
    echo(
        f"dpo-step {p['name']}: model {p['model']}, {p['batch']} pairs/step, {p['precision']}, "
        f"{result['device']} ({result['cpu_capability']}), torch threads {result['torch_threads']}, "
        f"TRL {result['versions']['trl']}"
    )
    echo(f"{'side':<10} {'step median (s)':>16} {'peak memory (MiB)':>18}")
    mem = result.get("peak_memory", {})
    for side in ("posttrain", "trl"):
        m = mem.get(side, {}).get("peak_bytes")
        echo(
            f"{side:<10} {result['median_s'][side]:>16.4f} {(m / 2**20 if m is not None else float('nan')):>18.1f}"
        )
    echo(
        f"posttrain / TRL: time {result['posttrain_over_trl']:.3f} (paired {result['posttrain_over_trl_paired']:.3f})"
        + (
            f", peak memory {result['memory_posttrain_over_trl']:.3f}"
            if "memory_posttrain_over_trl" in result
            else ""
        )
    )
    if mem:
        echo(f"memory: {next(iter(mem.values()))['method']}")
