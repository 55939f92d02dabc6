"""`posttrain bench rl-step`: posttrain's RL step vs TRL's GRPOTrainer vs the compute floor and plain HF."""

from __future__ import annotations

from pathlib import Path

import typer

from posttrain.cli.app import bench_app


@bench_app.command("rl-step")
def rl_step(
    preset: str = typer.Option(
        "tiny",
        "--preset",
        help="tiny (16x8 completions, 8 tokens), small (8x8, 32), smol (real model smollm2-135m, 8x4, 32, bf16, fast engine).",
    ),
    precision: str | None = typer.Option(
        None, "--precision", help="Override the preset's precision: fp32 or bf16."
    ),
    engine: str | None = typer.Option(
        None, "--engine", help="Override posttrain's rollout engine: hf, fast or vllm (vLLM installed)."
    ),
    json_path: Path | None = typer.Option(None, "--json", help="Write the figures to this JSON file."),
    repeats: int = typer.Option(5, "--repeats", min=1, help="Measured steps of each implementation."),
    warmup: int = typer.Option(2, "--warmup", min=0, help="Unmeasured warm-up steps of each, first."),
    trl: bool = typer.Option(
        True, "--trl/--no-trl", help="Include TRL's GRPOTrainer (needs the bench extra)."
    ),
    seed: int = typer.Option(0, "--seed", help="Model initialisation and trainer seeds."),
    model: str | None = typer.Option(
        None, "--model", help="Override the preset's model (preset or local dir)."
    ),
    prompts: int | None = typer.Option(None, "--prompts", min=1, help="Override prompts per step."),
    group_size: int | None = typer.Option(
        None, "--group-size", min=2, help="Override completions per prompt."
    ),
    new_tokens: int | None = typer.Option(
        None, "--new-tokens", min=1, help="Override new tokens per completion."
    ),
    matmul_size: int = typer.Option(2048, "--matmul-size", min=64, help="Side of the timed fp32 matmul."),
    threads: int | None = typer.Option(
        None, "--threads", min=1, help="torch threads for the run (1 = steadiest on a shared machine)."
    ),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No per-round progress lines."),
    profile: bool = typer.Option(
        False, "--profile", help="One more posttrain step under torch.profiler: the top operators."
    ),
    async_: bool = typer.Option(
        False,
        "--async",
        help="Instead: synchronous (2 threads) vs asynchronous RL (rollout.max_staleness, trainer 1 + "
        "generator 1 thread) on the same rollouts and seeds (docs/async.md).",
    ),
    steps: int = typer.Option(8, "--steps", min=2, help="--async: steps per arm (the first is warm-up)."),
    seeds: int = typer.Option(1, "--seeds", min=1, help="--async: seeds (paired over seeds)."),
    max_staleness: int = typer.Option(1, "--max-staleness", min=1, help="--async: the async arm's bound."),
    out: Path | None = typer.Option(
        None,
        "--out",
        help="--async: folder of the arms' JSON and runs (resumable; default runs/bench-async).",
    ),
) -> None:
    """Median time of one RL step: posttrain vs TRL GRPOTrainer vs the floor (HF generate with posttrain's
    sampler + fwd/bwd/AdamW) vs plain HF (the same with HF's multinomial sampler).

    All run interleaved in this process: same weights, prompts, reward, lr, fp32, no KL, EOS off.

    Prints the ratios, the FLOP limit and pass/fail against posttrain <= 1.05x floor (docs/bench-rl-step.md).
    """
    from dataclasses import replace

    from rich.console import Console

    if async_:
        _async_bench(
            preset,
            model,
            prompts,
            group_size,
            new_tokens,
            precision,
            engine,
            steps,
            seeds,
            max_staleness,
            out,
            json_path,
            quiet,
        )
        return

    from posttrain.utils.io import atomic_write_json
    from posttrain_lab.benchmarks.perf.rl_step import get_preset, print_report, run_rl_step_bench

    try:
        cfg = get_preset(preset)
        overrides = {
            k: v
            for k, v in {
                "model": model,
                "num_prompts": prompts,
                "group_size": group_size,
                "new_tokens": new_tokens,
                "precision": precision,
                "engine": engine,
            }.items()
            if v is not None
        }
        if overrides:
            cfg = replace(cfg, **overrides)
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--preset") from None
    err = Console(stderr=True)
    result = run_rl_step_bench(
        cfg,
        repeats=repeats,
        warmup=warmup,
        with_trl=trl,
        seed=seed,
        matmul_size=matmul_size,
        threads=threads,
        profile=profile,
        log=None if quiet else (lambda msg: err.print(msg, highlight=False)),
    )
    result["overrides"] = overrides
    print_report(result)
    if json_path is not None:
        atomic_write_json(json_path, result)
        typer.echo(f"wrote {json_path}")


def _async_bench(
    preset: str,
    model: str | None,
    prompts: int | None,
    group_size: int | None,
    new_tokens: int | None,
    precision: str | None,
    engine: str | None,
    steps: int,
    seeds: int,
    max_staleness: int,
    out: Path | None,
    json_path: Path | None,
    quiet: bool,
) -> None:
    """`bench rl-step --async`: the fixed-budget comparison of posttrain_lab.benchmarks.perf.async_rl."""
    from rich.console import Console

    from posttrain.utils.io import atomic_write_json
    from posttrain_lab.benchmarks.perf.async_rl import (
        PRESET_TASK,
        AsyncBenchSpec,
        print_report,
        run_comparison,
    )
    from posttrain_lab.benchmarks.perf.rl_step import get_preset

    try:
        p = get_preset(preset)
        spec = AsyncBenchSpec(
            model=model or p.model,
            num_prompts=prompts or p.num_prompts,
            group_size=group_size or p.group_size,
            new_tokens=new_tokens or p.new_tokens,
            precision=precision or p.precision,
            engine=engine or "fast",
            steps=steps,
            seeds=seeds,
            max_staleness=max_staleness,
            **PRESET_TASK.get(preset, {}),
        )
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--preset") from None
    err = Console(stderr=True)
    folder = out or Path("runs/bench-async")
    result = run_comparison(
        spec, folder, log=None if quiet else (lambda msg: err.print(msg, highlight=False))
    )
    print_report(result)
    if json_path is not None:
        atomic_write_json(json_path, result)
        typer.echo(f"wrote {json_path}")
