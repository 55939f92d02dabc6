"""A bounded loopback load test of `posttrain serve` (``posttrain bench serve``).

Starts the server on 127.0.0.1 (a free port) in this process, sends exactly ``requests`` chat
requests from ``clients`` concurrent clients (each client sends its next request when the previous one
is answered), and reports requests/s, completion tokens/s and the latency percentiles. Every request
asks for exactly ``max_tokens`` new tokens with EOS allowed, so token counts come from the server's
``usage``. Nothing leaves the machine; the run ends after the last request.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

from posttrain.serve.config import ServeConfig
from posttrain.utils.errors import InvalidValueError


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]) of ``values``; nan when empty."""
    if not values:
        return float("nan")
    s = sorted(values)
    k = max(1, math.ceil(q / 100.0 * len(s)))
    return s[k - 1]


async def _drive(
    base_url: str, model_id: str, requests: int, clients: int, max_tokens: int, timeout_s: float
) -> dict[str, Any]:
    import httpx

    todo = list(range(requests))
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    tokens = {"prompt": 0, "completion": 0}

    async def client(http: httpx.AsyncClient) -> None:
        while todo:
            i = todo.pop()
            body = {
                "model": model_id,
                "messages": [{"role": "user", "content": f"request {i}: say something"}],
                "max_tokens": max_tokens,
                "temperature": 1.0,
                "seed": i,
            }
            t0 = time.perf_counter()
            r = await http.post(f"{base_url}/chat/completions", json=body)
            dt = time.perf_counter() - t0
            statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
            if r.status_code == 200:
                latencies.append(dt)
                u = r.json()["usage"]
                tokens["prompt"] += u["prompt_tokens"]
                tokens["completion"] += u["completion_tokens"]

    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout_s)) as http:
        t0 = time.perf_counter()
        await asyncio.gather(*(client(http) for _ in range(clients)))
        wall = time.perf_counter() - t0
    ok = len(latencies)
    return {
        "requests": requests,
        "clients": clients,
        "max_tokens": max_tokens,
        "ok": ok,
        "status_counts": {str(k): v for k, v in sorted(statuses.items())},
        "wall_s": wall,
        "requests_per_s": ok / wall if wall > 0 else float("nan"),
        "completion_tokens_per_s": tokens["completion"] / wall if wall > 0 else float("nan"),
        "prompt_tokens": tokens["prompt"],
        "completion_tokens": tokens["completion"],
        "latency_p50_s": percentile(latencies, 50),
        "latency_p99_s": percentile(latencies, 99),
        "latency_max_s": max(latencies) if latencies else float("nan"),
    }


def run_load_test(
    cfg: ServeConfig,
    *,
    requests: int = 64,
    clients: int = 4,
    max_tokens: int = 32,
    warmup: int = 2,
    timeout_s: float = 120.0,
) -> dict[str, Any]:
    """Serve ``cfg.model`` on loopback and measure it (see module docstring)."""
    if requests < 1 or clients < 1 or max_tokens < 1 or warmup < 0:
        raise InvalidValueError("requests, clients and max_tokens must be >= 1 and warmup >= 0")
    from posttrain.serve.server import BackgroundServer

    cfg = cfg.model_copy(
        update={
            "host": "127.0.0.1",
            "port": 0,
            "max_concurrent_requests": max(cfg.max_concurrent_requests, clients),
            "max_tokens": max(cfg.max_tokens, max_tokens),
            "default_max_tokens": min(cfg.default_max_tokens, max(cfg.max_tokens, max_tokens)),
        }
    )
    with BackgroundServer(cfg) as srv:
        if warmup:
            asyncio.run(_drive(srv.base_url, cfg.model_id, warmup, 1, max_tokens, timeout_s))
        result = asyncio.run(_drive(srv.base_url, cfg.model_id, requests, clients, max_tokens, timeout_s))
    result["model"] = cfg.model
    return result
