"""`posttrain bench losses`: chunked `token_logprobs` vs naive full logits, forward + backward.

For each vocabulary size V, with N = `tokens` hidden states of width `hidden`, both variants compute
per-token log-probs and entropies of softmax(h W^T) and back-propagate
`L = Σ logp + 0.01 Σ entropy` into the hidden states and the LM-head weight:

- naive:   logits (N, V) -> log_softmax -> gather; entropy = −Σ softmax · log_softmax (autograd);
- chunked: `posttrain.models.token_logprobs` (chunks of `chunk_size` tokens, recompute in backward).

Each variant runs in its own fresh process (see `posttrain_lab.benchmarks.perf.common`): first one measured
fwd+bwd for peak memory above the baseline taken after the inputs exist, then `repeats` timed
fwd+bwd calls (median reported). Targets: peak memory <= 1/4 of naive at V = 151,936,
time <= 1.2x naive at every V.

Optionally compares `posttrain.algos` policy losses with verl's registered functions when verl is
importable (it is not a dependency).
"""

from __future__ import annotations

import math
from typing import Any

from posttrain.utils.errors import InvalidValueError, PosttrainError

MEMORY_TARGET = 0.25  # chunked peak / naive peak, at V >= MEMORY_TARGET_MIN_VOCAB
MEMORY_TARGET_MIN_VOCAB = 151_936
TIME_TARGET = 1.2  # chunked median time / naive median time
DEFAULT_VOCABS = (32_000, 151_936)
_SAMPLE = 256  # logp/entropy values returned from each child for the cross-variant check


def _child_run(
    variant: str,
    tokens: int,
    hidden: int,
    vocab: int,
    chunk_size: int,
    repeats: int,
    dtype: str,
    device: str,
    seed: int,
    threads: int | None = None,
) -> dict[str, Any]:
    """One variant, one size, in the current process: peak memory of one fwd+bwd, then timings."""
    import torch

    from posttrain.models import naive_token_logprobs, resolve_dtype, token_logprobs
    from posttrain_lab.benchmarks.perf.common import PeakMemory, summarize_times, time_fn

    if threads:
        torch.set_num_threads(threads)
    tdtype = resolve_dtype(dtype)

    def make(n: int, h: int, v: int):
        g = torch.Generator().manual_seed(seed)
        hid = torch.randn(n, h, generator=g).to(device=device, dtype=tdtype).requires_grad_()
        w = (torch.randn(v, h, generator=g) / math.sqrt(h)).to(device=device, dtype=tdtype).requires_grad_()
        y = torch.randint(0, v, (n,), generator=g).to(device)
        return hid, w, y

    def step_fn(hid, w, y):
        def step():
            hid.grad, w.grad = None, None
            if variant == "chunked":
                lp, ent = token_logprobs(hid, w, y, chunk_size=chunk_size)
            else:
                lp, ent = naive_token_logprobs(hid, w, y)
            (lp.sum() + 0.01 * ent.sum()).backward()
            return lp.detach(), ent.detach()

        return step

    if variant not in ("chunked", "naive"):
        raise InvalidValueError(f"unknown variant {variant!r}; expected 'chunked' or 'naive'")
    # initialise the math libraries (thread pools, workspaces) on small shapes before the baseline
    step_fn(*make(8, min(hidden, 16), min(vocab, 64)))()
    hid, w, y = make(tokens, hidden, vocab)
    step = step_fn(hid, w, y)
    with PeakMemory(device) as pm:
        lp, ent = step()
    times = time_fn(step, repeats=repeats, warmup=0, device=device)
    return {
        "variant": variant,
        "peak_bytes": pm.peak_bytes,
        "memory_method": pm.method,
        **summarize_times(times),
        "logp_sample": lp[:_SAMPLE].float().cpu().tolist(),
        "entropy_sample": ent[:_SAMPLE].float().cpu().tolist(),
        "grad_hidden_norm": float(hid.grad.float().norm()),
        "grad_weight_norm": float(w.grad.float().norm()),
        "threads": torch.get_num_threads(),
    }


_KEPT = ("median_s", "min_s", "times_s", "cpu_median_s", "cpu_times_s", "peak_bytes")


def _rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-30)


NAIVE_LOGIT_COPIES = 5
"""(T, V) float tensors alive at the naive variant's peak (logits, log-softmax, softmax for the
entropy, and their gradients); the chunked variant holds them for one chunk of tokens only."""


def memory_need(
    tokens: int, hidden: int, vocab: int, dtype: str = "float32", chunk_size: int = 1024
) -> dict[str, int]:
    """Estimated peak bytes of each variant: the (T, V) copies above plus the lm-head weight and its
    gradient (V, H) and the hidden states (T, H) with gradient."""
    import torch

    from posttrain.models import resolve_dtype

    b = torch.empty((), dtype=resolve_dtype(dtype)).element_size()
    fixed = 2 * vocab * hidden * b + 2 * tokens * hidden * b
    return {
        "naive": NAIVE_LOGIT_COPIES * tokens * vocab * b + fixed,
        "chunked": NAIVE_LOGIT_COPIES * min(tokens, chunk_size) * vocab * b + fixed,
    }


class OutOfMemory(PosttrainError, ValueError):
    """A measured variant was killed for memory; the message says what it needed and what to try."""


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def _oom_message(variant: str, tokens: int, hidden: int, vocab: int, dtype: str, signal_name: str) -> str:
    import os

    need = memory_need(tokens, hidden, vocab, dtype)[variant]
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        have = f"; this machine has {_gib(total)} of RAM"
    except (ValueError, OSError, AttributeError):
        have = ""
    smaller = max(256, tokens // 4)
    return (
        f"the {variant} variant at V={vocab} was killed by {signal_name}: it ran out of memory. It needs "
        f"about {_gib(need)} ({NAIVE_LOGIT_COPIES} x tokens x V x {dtype} logits plus the lm head){have}. "
        f"Try fewer tokens (--tokens {smaller}: about "
        f"{_gib(memory_need(smaller, hidden, vocab, dtype)[variant])}), a smaller vocabulary (--vocab 32000: "
        f"about {_gib(memory_need(tokens, hidden, 32000, dtype)[variant])}), or close other programs"
    )


def run_bench(
    *,
    tokens: int = 4096,
    hidden: int = 1024,
    vocabs: tuple[int, ...] | list[int] = DEFAULT_VOCABS,
    chunk_size: int | None = None,
    repeats: int = 3,
    dtype: str = "float32",
    device: str = "auto",
    seed: int = 0,
    threads: int | None = None,
    check_verl: bool = True,
    timeout_s: float | None = 3600,
) -> dict[str, Any]:
    """Measure both variants at each V (each in a fresh process) and return the figures as a dict."""
    from posttrain.models import DEFAULT_CHUNK_SIZE, pick_device, resolve_dtype
    from posttrain_lab.benchmarks.perf.common import ChildKilled, run_isolated

    chunk = DEFAULT_CHUNK_SIZE if chunk_size is None else chunk_size
    for name, val in (("tokens", tokens), ("hidden", hidden), ("repeats", repeats), ("chunk_size", chunk)):
        if val < 1:
            raise InvalidValueError(f"{name} must be >= 1, got {val}")
    if not vocabs or any(v < 2 for v in vocabs):
        raise InvalidValueError(f"vocab sizes must be >= 2, got {list(vocabs)}")
    resolve_dtype(dtype)  # validate early, in the parent
    dev = pick_device() if device == "auto" else device
    rows = []
    method = ""
    for v in vocabs:
        res = {}
        for variant in ("naive", "chunked"):
            kw = dict(
                variant=variant,
                tokens=tokens,
                hidden=hidden,
                vocab=v,
                chunk_size=chunk,
                repeats=repeats,
                dtype=dtype,
                device=dev,
                seed=seed,
                threads=threads,
            )
            try:
                res[variant] = run_isolated(
                    "posttrain_lab.benchmarks.perf.losses:_child_run", kw, timeout=timeout_s
                )
            except ChildKilled as e:
                raise OutOfMemory(_oom_message(variant, tokens, hidden, v, dtype, e.signal_name)) from None
        naive, chunked = res["naive"], res["chunked"]
        method = naive["memory_method"]
        time_ratio = chunked["median_s"] / naive["median_s"]
        mem_ratio = chunked["peak_bytes"] / naive["peak_bytes"] if naive["peak_bytes"] > 0 else float("nan")
        mem_applies = v >= MEMORY_TARGET_MIN_VOCAB
        rows.append(
            {
                "vocab": v,
                "naive": {k: naive[k] for k in _KEPT},
                "chunked": {k: chunked[k] for k in _KEPT},
                "time_ratio": time_ratio,
                "cpu_time_ratio": chunked["cpu_median_s"] / max(naive["cpu_median_s"], 1e-12),
                "memory_ratio": mem_ratio,
                "time_target": TIME_TARGET,
                "time_pass": time_ratio <= TIME_TARGET,
                "memory_target": MEMORY_TARGET if mem_applies else None,
                "memory_pass": (mem_ratio <= MEMORY_TARGET) if mem_applies else None,
                "max_abs_diff_logp": max(
                    abs(a - b) for a, b in zip(chunked["logp_sample"], naive["logp_sample"], strict=True)
                ),
                "max_abs_diff_entropy": max(
                    abs(a - b)
                    for a, b in zip(chunked["entropy_sample"], naive["entropy_sample"], strict=True)
                ),
                "rel_diff_grad_hidden_norm": _rel(chunked["grad_hidden_norm"], naive["grad_hidden_norm"]),
                "rel_diff_grad_weight_norm": _rel(chunked["grad_weight_norm"], naive["grad_weight_norm"]),
            }
        )
    result: dict[str, Any] = {
        "bench": "losses",
        "config": {
            "tokens": tokens,
            "hidden": hidden,
            "vocabs": list(vocabs),
            "chunk_size": chunk,
            "repeats": repeats,
            "dtype": dtype,
            "device": dev,
            "seed": seed,
            "threads": res["naive"]["threads"],
            "loss": "sum(logp) + 0.01 * sum(entropy), backward into hidden and lm-head weight",
        },
        "memory_method": method,
        "rows": rows,
    }
    if check_verl:
        result["verl"] = compare_with_verl(seed=seed)
    return result


# ---------------------------------------------------------------------------------------------------------
# verl comparison (optional)

VERL_LOSS_NAMES = {"ppo": "vanilla", "gspo": "gspo", "cispo": "cispo", "sapo": "sapo"}


def compare_with_verl(*, seed: int = 0) -> dict[str, Any]:
    """Max |ours − verl| of the policy loss values for ppo/gspo/cispo/sapo on identical random tensors.

    Returns {"available": False, "reason": ...} when verl cannot be imported (it is optional)."""
    try:
        from verl.trainer.ppo import core_algos  # type: ignore[import-not-found]
    except Exception as e:  # ImportError or a broken optional install
        return {"available": False, "reason": f"verl is not importable ({type(e).__name__}: {e})"}
    return _compare_with_verl_module(core_algos, seed=seed)


def _compare_with_verl_module(core_algos: Any, *, seed: int) -> dict[str, Any]:
    import torch

    from posttrain.algos import get_policy_loss

    g = torch.Generator().manual_seed(seed)
    b, t = 8, 24
    old = -torch.rand(b, t, generator=g, dtype=torch.float64) * 3
    logp = old + 0.5 * torch.randn(b, t, generator=g, dtype=torch.float64)
    adv = torch.randn(b, 1, generator=g, dtype=torch.float64).expand(b, t).contiguous()
    lengths = torch.randint(4, t + 1, (b,), generator=g)
    mask = (torch.arange(t)[None, :] < lengths[:, None]).to(torch.float64)
    out: dict[str, Any] = {"available": True, "losses": {}}
    for ours, theirs in VERL_LOSS_NAMES.items():
        # verl forces seq-mean-token-mean for sapo and recommends it for gspo; use it on both sides
        agg = "seq-mean-token-mean" if ours in ("gspo", "sapo") else "token-mean"
        try:
            lp_v = logp.clone().requires_grad_()
            verl_loss = core_algos.get_policy_loss_fn(theirs)(
                old_log_prob=old,
                log_prob=lp_v,
                advantages=adv,
                response_mask=mask,
                loss_agg_mode=agg,
                config=_verl_actor_config(ours),
            )[0]
            (grad_v,) = torch.autograd.grad(verl_loss, lp_v)
        except Exception as e:  # an API change in verl: report it, do not fail the benchmark
            out["losses"][ours] = {"verl_name": theirs, "agg": agg, "error": f"{type(e).__name__}: {e}"}
            continue
        lp_o = logp.clone().requires_grad_()
        our_loss, _ = get_policy_loss(ours)(lp_o, old, adv, mask, agg=agg, **_our_params(ours))
        (grad_o,) = torch.autograd.grad(our_loss, lp_o)
        out["losses"][ours] = {
            "verl_name": theirs,
            "agg": agg,
            "params": _our_params(ours),
            "loss_ours": float(our_loss.detach()),
            "loss_verl": float(verl_loss.detach()),
            "max_abs_diff": float((our_loss - verl_loss).detach().abs()),
            "max_abs_diff_grad": float((grad_o - grad_v).abs().max()),
        }
    return out


def _our_params(name: str) -> dict[str, Any]:
    """Parameters given to both implementations (the same numbers under each one's names)."""
    return {
        "ppo": {"clip_low": 0.2, "clip_high": 0.28, "clip_c": 3.0},
        "gspo": {"clip_low": 3e-4, "clip_high": 4e-4},
        "cispo": {"clip_low": 0.2, "clip_high": 0.28},
        "sapo": {"tau_pos": 1.0, "tau_neg": 1.05},
    }[name]


def _verl_actor_config(name: str) -> Any:
    """verl's `ActorConfig` carrying the same parameters as `_our_params(name)`."""
    from verl.workers.config import ActorConfig  # type: ignore[import-not-found]

    p = _our_params(name)
    # fields verl validates in __post_init__ but the loss functions do not read
    kw: dict[str, Any] = {"strategy": "fsdp", "rollout_n": 1, "ppo_micro_batch_size_per_gpu": 1}
    if "clip_low" in p:
        kw.update(clip_ratio=p["clip_low"], clip_ratio_low=p["clip_low"], clip_ratio_high=p["clip_high"])
    if "clip_c" in p:
        kw["clip_ratio_c"] = p["clip_c"]
    if "tau_pos" in p:
        kw.update(tau_pos=p["tau_pos"], tau_neg=p["tau_neg"])
    return ActorConfig(**kw)


# ---------------------------------------------------------------------------------------------------------
# presentation


def _fmt_bytes(n: float) -> str:
    return f"{n / 2**20:,.0f} MiB" if n < 2**30 else f"{n / 2**30:,.2f} GiB"


def _verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("PASS" if ok else "FAIL")


def table_rows(result: dict[str, Any]) -> list[list[Any]]:
    rows = []
    for r in result["rows"]:
        rows.append(
            [
                f"{r['vocab']:,}",
                f"{r['naive']['median_s']:.3f}",
                f"{r['chunked']['median_s']:.3f}",
                f"{r['time_ratio']:.2f}x",
                f"{r['cpu_time_ratio']:.2f}x",
                _fmt_bytes(r["naive"]["peak_bytes"]),
                _fmt_bytes(r["chunked"]["peak_bytes"]),
                f"{r['memory_ratio']:.3f}",
                _verdict(r["time_pass"]),
                _verdict(r["memory_pass"]),
                f"{max(r['max_abs_diff_logp'], r['max_abs_diff_entropy']):.1e}",
            ]
        )
    return rows


TABLE_COLUMNS = [
    "V",
    "naive s",
    "chunked s",
    "time ratio",
    "cpu-time ratio",
    "naive peak",
    "chunked peak",
    "mem ratio",
    f"time <= {TIME_TARGET}x",
    f"mem <= {MEMORY_TARGET}",
    "max |Δ|",
]


def print_report(result: dict[str, Any], console: Any = None) -> None:
    from rich.console import Console

    from posttrain.utils.tables import print_table

    if console is None:
        console = Console()
        if not console.is_terminal:  # logs and pipes: do not squeeze the table into 80 columns
            console = Console(width=160)
    c = result["config"]
    title = (
        f"token_logprobs fwd+bwd: N={c['tokens']} tokens, H={c['hidden']}, {c['dtype']} on {c['device']} "
        f"({c['threads']} threads), chunk {c['chunk_size']}, median of {c['repeats']}"
    )
    print_table(title, TABLE_COLUMNS, table_rows(result), console=console)
    console.print(
        f"targets: time ratio <= {TIME_TARGET}x (wall-clock medians) at every V; memory ratio <= {MEMORY_TARGET} "
        f"at V >= {MEMORY_TARGET_MIN_VOCAB:,} (n/a below). max |Δ| = largest logp/entropy difference between "
        f"the variants on the first {_SAMPLE} tokens."
    )
    console.print(f"peak memory: {result['memory_method']}")
    verl = result.get("verl")
    if verl is None:
        return
    if not verl["available"]:
        console.print(f"verl comparison skipped: {verl['reason']}")
        return
    for name, r in verl["losses"].items():
        if "error" in r:
            console.print(f"verl {r['verl_name']} vs posttrain {name}: could not compare ({r['error']})")
        else:
            console.print(
                f"verl {r['verl_name']} vs posttrain {name} ({r['agg']}): loss |Δ| = {r['max_abs_diff']:.2e}, "
                f"max |Δ grad wrt logp| = {r['max_abs_diff_grad']:.2e}"
            )
