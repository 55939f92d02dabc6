"""`posttrain bench generate`: tokens/s of the rollout engines vs llama.cpp vs the machine's limits."""

from __future__ import annotations

from pathlib import Path

import typer

from posttrain.cli.app import bench_app


@bench_app.command("generate")
def generate(
    model: str = typer.Option(
        "smollm2-135m", "--model", help="Built-in model, preset, .gguf or HF directory."
    ),
    engines: str | None = typer.Option(
        None,
        "--engines",
        help="Comma-separated engine:precision cells (hf, fast, vllm); default hf and fast at fp32 and bf16, "
        "and vllm:fp32 where vLLM is installed.",
    ),
    batches: str = typer.Option("1,8,32", "--batches", help="Comma-separated batch sizes."),
    new_tokens: int = typer.Option(64, "--new-tokens", min=1, help="Tokens per completion (EOS suppressed)."),
    repeats: int = typer.Option(3, "--repeats", min=1, help="Measured rounds."),
    warmup: int = typer.Option(1, "--warmup", min=0, help="Unmeasured rounds first."),
    threads: int | None = typer.Option(None, "--threads", min=1, help="torch and llama.cpp threads."),
    llama_cpp: bool = typer.Option(
        True, "--llama-cpp/--no-llama-cpp", help="Include llama.cpp (llama-cpp-python; skipped when absent)."
    ),
    gguf: Path | None = typer.Option(
        None, "--gguf", help="GGUF for llama.cpp (default: the built-in model's)."
    ),
    llama_cpp_extra_bufts: bool = typer.Option(
        False,
        "--llama-cpp-extra-bufts/--no-llama-cpp-extra-bufts",
        help="llama.cpp's extra CPU buffer types (AMX kernels, weight repacking); off: its AMX matmul "
        "segfaulted on the machine this bench was written on (the worker reports such a crash).",
    ),
    json_path: Path | None = typer.Option(None, "--json", help="Write the figures to this JSON file."),
    seed: int = typer.Option(0, "--seed"),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No per-cell progress lines."),
) -> None:
    """Tokens/s of each engine (hf, fast; fp32 and bf16) at each batch size, llama.cpp on the same GGUF
    beside them, and the memory-bandwidth and FLOP limits measured on this machine (docs/bench-generate.md).
    Records the load average; llama.cpp is skipped, with the install line, when not installed."""
    from rich.console import Console

    from posttrain.utils.io import atomic_write_json
    from posttrain_lab.benchmarks.perf.generate import print_generate_report, run_generate_bench

    try:
        batch_list = [int(b) for b in batches.split(",") if b.strip()]
    except ValueError:
        raise typer.BadParameter(
            f"expected integers separated by commas, got {batches!r}", param_hint="--batches"
        ) from None
    if not batch_list or min(batch_list) < 1:
        raise typer.BadParameter(f"batch sizes must be >= 1, got {batches!r}", param_hint="--batches")
    err = Console(stderr=True)
    try:
        result = run_generate_bench(
            model=model,
            engines=None if engines is None else [e.strip() for e in engines.split(",") if e.strip()],
            batches=batch_list,
            new_tokens=new_tokens,
            repeats=repeats,
            warmup=warmup,
            threads=threads,
            llama_cpp=llama_cpp,
            gguf=None if gguf is None else str(gguf),
            llama_cpp_extra_bufts=llama_cpp_extra_bufts,
            seed=seed,
            log=None if quiet else (lambda m: err.print(m, highlight=False)),
        )
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--engines") from None
    print_generate_report(result)
    if json_path is not None:
        atomic_write_json(json_path, result)
        typer.echo(f"wrote {json_path}")
