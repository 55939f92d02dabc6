"""`posttrain serve MODEL` (OpenAI-compatible HTTP server) and `posttrain bench serve` (loopback load test)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from posttrain.cli.app import app, bench_app


def _config(model: str, **kw):
    from pydantic import ValidationError

    from posttrain.serve.config import ServeConfig

    try:
        return ServeConfig(model=model, **{k: v for k, v in kw.items() if v is not None})
    except ValidationError as e:
        lines = "; ".join(f"{'.'.join(map(str, x['loc'])) or 'config'}: {x['msg']}" for x in e.errors())
        typer.echo(f"error: invalid serve settings: {lines}", err=True)
        raise typer.Exit(2) from None


def _require_extra() -> None:
    from posttrain.serve import require_serve_extra

    try:
        require_serve_extra()
    except ImportError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None


@app.command("serve")
def serve(
    model: str = typer.Argument(..., help="Preset name, local HF model directory or run folder."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (0.0.0.0 = every interface)."),
    port: int = typer.Option(8000, "--port", help="Port (0 = any free port)."),
    served_model_name: str | None = typer.Option(
        None, "--served-model-name", help="Model id (default MODEL)."
    ),
    max_request_bytes: int = typer.Option(1 << 20, "--max-request-bytes", help="413 above this body size."),
    max_prompt_tokens: int | None = typer.Option(
        None, "--max-prompt-tokens", help="400 above (default: context)."
    ),
    max_tokens: int = typer.Option(512, "--max-tokens", help="Largest max_tokens a request may ask."),
    default_max_tokens: int = typer.Option(256, "--default-max-tokens", help="max_tokens when not given."),
    max_n: int = typer.Option(8, "--max-n", help="Largest n (completions per request)."),
    max_concurrent: int = typer.Option(
        8, "--max-concurrent-requests", help="429 beyond this many in flight."
    ),
    device: str = typer.Option("cpu", "--device", help="cpu, cuda, cuda:1, mps."),
    dtype: str = typer.Option("float32", "--dtype", help="float32, bfloat16, float16."),
    seed: int = typer.Option(0, "--seed", help="Sampling seed (and preset initialisation)."),
    log_level: str = typer.Option("info", "--log-level", help="uvicorn log level."),
) -> None:
    """OpenAI-compatible HTTP server: /v1/chat/completions (stream optional), /v1/models, /health.

    Bounded request size, prompt length, max_tokens, n and requests in flight; errors are OpenAI JSON
    (docs/serve.md). Needs the serve extra: pip install -e ".\\[serve]".
    """
    _require_extra()
    cfg = _config(
        model,
        host=host,
        port=port,
        served_model_name=served_model_name,
        max_request_bytes=max_request_bytes,
        max_prompt_tokens=max_prompt_tokens,
        max_tokens=max_tokens,
        default_max_tokens=default_max_tokens,
        max_n=max_n,
        max_concurrent_requests=max_concurrent,
        device=device,
        dtype=dtype,
        seed=seed,
    )
    from posttrain.models import ModelSpecError
    from posttrain.serve.server import run_server

    try:
        run_server(
            cfg,
            log_level=log_level,
            on_loaded=lambda: typer.echo(
                f"serving {cfg.model_id!r} on http://{cfg.host}:{cfg.port}/v1 (Ctrl-C stops)", err=True
            ),
        )
    except (ModelSpecError, ValueError, OSError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None


@bench_app.command("serve")
def bench_serve(
    model: str = typer.Option("tiny", "--model", help="Preset name or local HF model directory."),
    requests: int = typer.Option(64, "--requests", min=1, max=100_000, help="Measured requests in all."),
    clients: int = typer.Option(4, "--clients", min=1, max=1024, help="Concurrent clients."),
    max_tokens: int = typer.Option(32, "--max-tokens", min=1, help="New tokens asked per request."),
    warmup: int = typer.Option(2, "--warmup", min=0, help="Unmeasured requests first."),
    threads: int | None = typer.Option(None, "--threads", min=1, help="torch threads in the server."),
    json_path: Path | None = typer.Option(None, "--json", help="Write the figures to this JSON file."),
) -> None:
    """Loopback load test: start `posttrain serve` on 127.0.0.1, send REQUESTS from CLIENTS clients,
    print requests/s, completion tokens/s and p50/p99 latency. Ends after the last request."""
    _require_extra()
    cfg = _config(model)
    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    from posttrain.serve.loadtest import run_load_test

    res = run_load_test(cfg, requests=requests, clients=clients, max_tokens=max_tokens, warmup=warmup)
    typer.echo(
        f"{res['ok']}/{res['requests']} ok ({res['status_counts']}), {res['clients']} clients, "
        f"{res['max_tokens']} tokens/request, {res['wall_s']:.2f} s\n"
        f"throughput {res['requests_per_s']:.2f} req/s, {res['completion_tokens_per_s']:.1f} completion tokens/s\n"
        f"latency p50 {res['latency_p50_s'] * 1000:.0f} ms, p99 {res['latency_p99_s'] * 1000:.0f} ms, "
        f"max {res['latency_max_s'] * 1000:.0f} ms"
    )
    if json_path is not None:
        json_path.write_text(json.dumps(res, indent=2) + "\n", encoding="utf-8")
        typer.echo(f"wrote {json_path}")
