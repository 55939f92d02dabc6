"""Batch generation through an OpenAI-compatible chat endpoint (used by PaTaRM's endpoint judge and the
CIT endpoint rewriter)."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from posttrain.clients.openai_chat import OpenAIChatAgent


class EndpointGenerator:
    """Batch text generation behind an OpenAI-compatible endpoint: ``generate(prompts)`` sends each
    prompt as one user message, concurrently. The API key is read from the environment variable
    ``api_key_env`` (never from a config file). Per-request timeout ``timeout_s`` and ``max_retries``
    capped retries are the client's; an item that still fails is ``None``."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key_env: str | None = None,
        temperature: float | None = 0.0,
        max_tokens: int | None = 1024,
        concurrency: int = 8,
        timeout_s: float = 120.0,
        max_retries: int = 2,
        backoff_base: float = 0.5,
        backoff_max: float = 10.0,
        extra_body: dict[str, Any] | None = None,
    ) -> None:
        key = os.environ.get(api_key_env) if api_key_env else None
        self.agent = OpenAIChatAgent(
            base_url,
            model,
            key,
            temperature=temperature,
            max_tokens=max_tokens,
            concurrency=concurrency,
            timeout_s=timeout_s,
            max_retries=max_retries,
            backoff_base=backoff_base,
            backoff_max=backoff_max,
            extra_body=extra_body,
        )
        self.last_errors: list[str] = []

    def generate(self, prompts: list[str]) -> list[str | None]:
        async def one(p: str) -> str | None:
            try:
                return (await self.agent.reply([{"role": "user", "content": p}])).text
            except Exception as e:  # AgentError after the capped retries, or anything unexpected
                self.last_errors.append(f"{type(e).__name__}: {e}")
                return None

        async def run() -> list[str | None]:
            try:
                return list(await asyncio.gather(*(one(p) for p in prompts)))
            finally:
                await self.agent.aclose()

        return asyncio.run(run())
