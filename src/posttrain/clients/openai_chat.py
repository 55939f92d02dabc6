"""Async OpenAI-compatible chat client (SILO-BENCH agents, the sales LLM buyer, PaTaRM remote judges) (any ``/v1/chat/completions`` server:
vLLM, SGLang, llama.cpp, OpenAI, ...).

The authors' client (jwyjohn/acl26-silo-bench, `src/utils/llm.py`) retries forever (tenacity, fixed 2 s
wait, 3600 s timeout), which can hang a run. Here retries are **capped** with exponential backoff, and a
clear `AgentError` is raised after the cap:

* retried: HTTP 429 and 5xx, timeouts, connection errors, a 200 response without a usable message;
* not retried: other 4xx (bad request, auth, unknown model) -> `AgentError` at once;
* backoff before retry k (k = 1, 2, ...): ``min(backoff_max, backoff_base * 2**(k-1))`` seconds, or the
  server's ``Retry-After`` header when it is larger (still capped by ``backoff_max``).

One client serves every agent seat; an ``asyncio.Semaphore(concurrency)`` bounds in-flight requests
across all agents (and all cases, when the runner shares the client). Usage (``prompt_tokens``,
``completion_tokens``) is taken from the response and summed in `OpenAIChatAgent.usage_total`.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import httpx

from posttrain.clients.base import Agent, AgentError, AgentReply
from posttrain.utils.errors import InvalidValueError

RETRY_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})


class OpenAIChatAgent(Agent):
    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        *,
        temperature: float | None = None,
        max_tokens: int | None = None,
        concurrency: int = 8,
        timeout_s: float = 600.0,
        max_retries: int = 5,
        backoff_base: float = 1.0,
        backoff_max: float = 60.0,
        extra_body: dict[str, Any] | None = None,
    ) -> None:
        if concurrency < 1:
            raise InvalidValueError(f"concurrency must be >= 1, got {concurrency}")
        if max_retries < 0:
            raise InvalidValueError(f"max_retries must be >= 0, got {max_retries}")
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.name = model
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.max_retries = max_retries
        self.backoff_base, self.backoff_max = backoff_base, backoff_max
        self.extra_body = dict(extra_body or {})
        self.timeout_s = timeout_s
        self.concurrency = concurrency
        self._sem: asyncio.Semaphore | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        headers = {"Content-Type": "application/json"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self._headers = headers
        self._client: httpx.AsyncClient | None = None
        self.usage_total = {"prompt_tokens": 0, "completion_tokens": 0, "requests": 0, "retries": 0}

    def _bind_loop(self) -> asyncio.Semaphore:
        """Semaphore and HTTP client belong to one event loop; a new loop (another `asyncio.run`)
        gets fresh ones, so one agent object can serve several synchronous `run_case` calls."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._sem is None:
            self._loop = loop
            self._sem = asyncio.Semaphore(self.concurrency)
            self._client = None
        return self._sem

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=httpx.Timeout(self.timeout_s), headers=self._headers)
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def _delay(self, attempt: int, retry_after: str | None) -> float:
        d = self.backoff_base * 2 ** (attempt - 1)
        if retry_after:
            with contextlib.suppress(ValueError):
                d = max(d, float(retry_after))
        return min(self.backoff_max, d)

    async def reply(self, messages: list[dict[str, str]]) -> AgentReply:
        body: dict[str, Any] = {"model": self.model, "messages": messages, **self.extra_body}
        if self.temperature is not None:
            body["temperature"] = self.temperature
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens
        last = "no attempt made"
        async with self._bind_loop():
            for attempt in range(self.max_retries + 1):
                if attempt:
                    self.usage_total["retries"] += 1
                retry_after = None
                try:
                    resp = await self._http().post(self.url, json=body)
                except httpx.TimeoutException as e:
                    last = f"timeout after {self.timeout_s:g}s ({type(e).__name__})"
                except httpx.TransportError as e:
                    last = f"connection error: {type(e).__name__}: {e}"
                else:
                    if resp.status_code == 200:
                        out = self._parse(resp)
                        if isinstance(out, AgentReply):
                            return out
                        last = out
                    elif resp.status_code in RETRY_STATUS or resp.status_code >= 500:
                        last = f"HTTP {resp.status_code}: {resp.text[:200]}"
                        retry_after = resp.headers.get("retry-after")
                    else:
                        raise AgentError(
                            f"{self.url} (model {self.model!r}) answered HTTP {resp.status_code}, not retried: "
                            f"{resp.text[:300]}"
                        )
                if attempt < self.max_retries:
                    await asyncio.sleep(self._delay(attempt + 1, retry_after))
        raise AgentError(
            f"{self.url} (model {self.model!r}) failed after {self.max_retries + 1} attempts; last error: {last}"
        )

    def _parse(self, resp: httpx.Response) -> AgentReply | str:
        try:
            data = resp.json()
            msg = data["choices"][0]["message"]
            text = msg.get("content") or ""
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            return f"malformed response body: {resp.text[:200]}"
        if not isinstance(text, str):
            text = str(text)
        usage = data.get("usage") if isinstance(data.get("usage"), dict) else None
        self.usage_total["requests"] += 1
        if usage:
            for k in ("prompt_tokens", "completion_tokens"):
                v = usage.get(k)
                if isinstance(v, int) and not isinstance(v, bool):
                    self.usage_total[k] += v
        return AgentReply(text, usage)
