"""Environment ``sales-llm``: the ``sales`` scenario with customer replies written by an LLM behind
any OpenAI-compatible ``/v1/chat/completions`` endpoint (vLLM, SGLang, llama.cpp, ``posttrain serve``,
OpenAI, ...). Written for GPU users with a real model; tested only against the tiny preset over
loopback.

What the LLM decides and what the rules decide:

* **Rules** (inherited from :class:`~posttrain_lab.recipes.duca.sales.SalesEnv`, unchanged): the hidden need and
  budget (from the scenario), the opening line, the conversion decision (the agent names a product of
  the needed category within the budget), the turn limit and all four turn criteria. Rewards are
  therefore verifiable and deterministic given the agent's turns, whatever the LLM writes.
* **LLM**: the customer's reply text on every turn that does not end the session. It sees
  :data:`CUSTOMER_PROMPT` (filled with the persona, need and budget) as its system message, then the
  conversation from the customer's side: its own lines as ``assistant``, the agent's as ``user``.

An endpoint that still fails after the capped retries (HTTP 5xx/429, timeouts, connection errors,
malformed answers; other 4xx at once) ends the conversation cleanly: ``done=True``, session reward
0.0 (:meth:`SalesEnv.abort`), ``summary()["endpoint_failed"] = True`` with the error text, and the
process-wide count in :func:`endpoint_failures`. ``endpoint_failed`` is a boolean fact, so the runner's
evaluation reports it as ``endpoint_failed_rate``. No exception escapes ``step``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from typing import Any

import httpx
from pydantic import Field, ValidationError, field_validator

from posttrain.clients import AgentError, OpenAIChatAgent
from posttrain.envs.base import StepResult, register_env
from posttrain.utils.config import StrictModel
from posttrain.utils.errors import InvalidValueError
from posttrain_lab.recipes.duca.sales import SalesEnv

CUSTOMER_PROMPT = (
    "You are {customer}, a customer chatting with a salesperson of an electronics store. "
    "You secretly want to buy a {need} and can spend at most ${budget}. "
    "Do not state your need or your budget outright unless the salesperson asks about them; "
    "reveal them gradually through hints, one at a time. "
    "If the salesperson offers something of another kind or above your budget, decline and say why. "
    "Reply as the customer only, in one or two short sentences, without role labels."
)
"""System prompt of the LLM customer; ``{customer}``, ``{need}`` and ``{budget}`` come from the
scenario (``SalesTask`` meta). Printed in docs/multi-turn.md."""

_FAILURES = 0
_FAILURES_LOCK = threading.Lock()


def endpoint_failures() -> int:
    """Number of ``sales-llm`` conversations in this process ended by an endpoint failure."""
    return _FAILURES


def _count_failure() -> None:
    global _FAILURES
    with _FAILURES_LOCK:
        _FAILURES += 1


class SalesLLMParams(StrictModel):
    """The endpoint parameters of ``sales-llm`` (``rollout.runner.params.env_params``)."""

    base_url: str = Field(min_length=1)
    model: str = Field(min_length=1)
    api_key_env: str | None = None
    temperature: float = Field(0.7, ge=0.0, le=2.0)
    timeout_s: float = Field(30.0, gt=0.0)
    max_retries: int = Field(2, ge=0, le=10)
    max_tokens: int = Field(64, ge=1)
    backoff_base: float = Field(0.5, ge=0.0)
    backoff_max: float = Field(8.0, ge=0.0)

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, v: str) -> str:
        if not v.startswith(("http://", "https://")):
            raise InvalidValueError(
                f"must start with http:// or https:// (e.g. http://127.0.0.1:8000/v1), got {v!r}"
            )
        return v


def _param_error(e: ValidationError) -> ValueError:
    lines = [f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors()]
    return ValueError("environment 'sales-llm': invalid env_params: " + "; ".join(lines))


@register_env("sales-llm")
class SalesLLMEnv(SalesEnv):
    """``sales`` with an LLM customer (see the module docstring). Endpoint params: ``base_url``
    (e.g. ``http://127.0.0.1:8000/v1``), ``model``, ``api_key_env`` (the *name* of an environment
    variable holding the key; unset = no key), ``temperature``, ``timeout_s`` (per request),
    ``max_retries``, ``max_tokens``, ``backoff_base`` / ``backoff_max`` (seconds). ``max_turns``,
    ``max_words``, ``multi_offer`` and ``accept_prob`` are the ``sales`` ones (``cue_prob`` only drives the rule-based replies, which
    the LLM replaces, but it still seeds the same rule state)."""

    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        api_key_env: str | None = None,
        temperature: float = 0.7,
        timeout_s: float = 30.0,
        max_retries: int = 2,
        max_tokens: int = 64,
        backoff_base: float = 0.5,
        backoff_max: float = 8.0,
        max_turns: int = 6,
        cue_prob: float = 0.3,
        max_words: int = 40,
        multi_offer: str = "decline",
        accept_prob: float = 1.0,
        conversion_reward: float = 1.0,
    ) -> None:
        super().__init__(
            max_turns=max_turns,
            cue_prob=cue_prob,
            max_words=max_words,
            multi_offer=multi_offer,
            accept_prob=accept_prob,
            conversion_reward=conversion_reward,
        )
        try:
            p = SalesLLMParams(
                base_url=base_url,
                model=model,
                api_key_env=api_key_env,
                temperature=temperature,
                timeout_s=timeout_s,
                max_retries=max_retries,
                max_tokens=max_tokens,
                backoff_base=backoff_base,
                backoff_max=backoff_max,
            )
        except ValidationError as e:
            raise _param_error(e) from None
        api_key = None
        if p.api_key_env:
            api_key = os.environ.get(p.api_key_env)
            if not api_key:
                raise InvalidValueError(
                    f"environment 'sales-llm': api_key_env: the environment variable {p.api_key_env!r} "
                    "is not set or empty (give the name of a variable holding the key, or omit api_key_env)"
                )
        self.params = p
        self.client = OpenAIChatAgent(
            p.base_url,
            p.model,
            api_key,
            temperature=p.temperature,
            max_tokens=p.max_tokens,
            concurrency=1,
            timeout_s=p.timeout_s,
            max_retries=p.max_retries,
            backoff_base=p.backoff_base,
            backoff_max=p.backoff_max,
        )
        self.messages: list[dict[str, str]] = []
        self.endpoint_error: str | None = None

    def reset(self, example: Any, seed: int) -> str:
        opening = super().reset(example, seed)  # validates need/budget; rule-based opening, no request
        meta = getattr(example, "meta", None) or {}
        system = CUSTOMER_PROMPT.format(
            customer=meta.get("customer", "Alex"), need=self.need, budget=self.budget
        )
        self.messages = [{"role": "system", "content": system}, {"role": "assistant", "content": opening}]
        self.endpoint_error = None
        self.llm_replies = 0
        return opening

    def _ask(self) -> str:
        """One customer reply from the endpoint (capped retries); raises ``AgentError``."""

        async def go() -> str:
            try:
                return (await self.client.reply(list(self.messages))).text
            finally:
                await self.client.aclose()

        try:
            asyncio.get_running_loop()
        except RuntimeError:  # the usual case: a synchronous training step
            return asyncio.run(go())
        with concurrent.futures.ThreadPoolExecutor(1) as pool:  # called from inside an event loop
            return pool.submit(asyncio.run, go()).result()

    def step(self, agent_text: str) -> StepResult:
        res = super().step(agent_text)  # rules: turn criteria, conversion, turn limit
        self.messages.append({"role": "user", "content": agent_text})
        if res.done:
            self.messages.append({"role": "assistant", "content": res.observation})
            return res
        try:
            reply = self._ask().strip()
        except (AgentError, httpx.HTTPError, httpx.InvalidURL, OSError) as e:
            self.endpoint_error = str(e)
            _count_failure()
            info = {"endpoint_error": self.endpoint_error}
            return StepResult("", res.turn_rewards, True, self.abort(), info)
        self.llm_replies += 1
        self.messages.append({"role": "assistant", "content": reply})
        return StepResult(reply, res.turn_rewards, False, None, {"rule_reply": res.observation})

    def summary(self) -> dict[str, Any]:
        out = super().summary()
        out.update(
            user="llm",
            endpoint_failed=self.endpoint_error is not None,
            endpoint_error=self.endpoint_error,
            llm_replies=getattr(self, "llm_replies", 0),
        )
        return out
