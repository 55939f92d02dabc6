"""Typed settings of `posttrain serve` and the OpenAI request/response shapes it accepts.

Every bound of the server is a field of :class:`ServeConfig` (the CLI flags map one to one):

=========================  =======  ==============================================================
key                        default  meaning
=========================  =======  ==============================================================
model                      —        preset name, local HF model directory or run folder
served_model_name          model    the id ``/v1/models`` lists and requests must name (or omit)
host / port                127.0.0.1 / 8000  where to listen (loopback by default)
max_request_bytes          1 MiB    request bodies above this get 413 (checked while reading)
max_prompt_tokens          model    prompts (after the chat template) above this get 400
max_tokens                 512      upper bound of a request's ``max_tokens``; 400 above it
default_max_tokens         256      ``max_tokens`` when the request gives none
max_n                      8        upper bound of ``n`` (completions per request)
max_concurrent_requests    8        requests in flight (generating + waiting); more get 429
max_messages               256      messages per request; more get 400
max_prompts                64       prompts per ``/v1/completions`` request (a batch); more get 400
device / dtype / seed      cpu / float32 / 0   where the model runs; sampling seed
=========================  =======  ==============================================================
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from posttrain.utils.config import StrictModel
from posttrain.utils.errors import InvalidValueError


class ServeConfig(StrictModel):
    model: str
    served_model_name: str | None = None
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    max_request_bytes: int = Field(1 << 20, ge=1024)
    max_prompt_tokens: int | None = Field(None, ge=1)
    max_tokens: int = Field(512, ge=1)
    default_max_tokens: int = Field(256, ge=1)
    max_n: int = Field(8, ge=1)
    max_concurrent_requests: int = Field(8, ge=1)
    max_messages: int = Field(256, ge=1)
    max_prompts: int = Field(64, ge=1)
    device: str = "cpu"
    dtype: str = "float32"
    seed: int = 0

    @model_validator(mode="after")
    def _defaults_within_bounds(self) -> ServeConfig:
        if self.default_max_tokens > self.max_tokens:
            raise InvalidValueError(
                f"default_max_tokens ({self.default_max_tokens}) must be <= max_tokens ({self.max_tokens})"
            )
        return self

    @property
    def model_id(self) -> str:
        return self.served_model_name or self.model


# ------------------------------------------------------------------------------------ requests
MAX_LOGPROBS = 20
"""Most alternatives per position a request may ask for (``logprobs`` / ``top_logprobs``), as OpenAI."""

Role = Literal["system", "user", "assistant", "tool", "developer"]


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    """One message. ``content`` is a string or a list of ``{"type": "text", "text": ...}`` parts
    (joined); other part types (images, audio) are refused with 400 by the ``type`` literal."""

    model_config = ConfigDict(extra="allow")
    role: Role
    content: str | list[ContentPart] | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class SamplingRequest(BaseModel):
    """The fields chat and text completions share: the served ``model`` (or none), sampling
    (``temperature`` 0 = greedy, ``top_p``, ``seed``), ``n`` completions, ``stop`` strings (at most 4)."""

    model_config = ConfigDict(extra="allow")
    model: str | None = None
    temperature: float = Field(1.0, ge=0.0, le=2.0, allow_inf_nan=False)
    top_p: float = Field(1.0, gt=0.0, le=1.0, allow_inf_nan=False)
    n: int = Field(1, ge=1)
    stream: bool = False
    stop: str | list[str] | None = None
    seed: int | None = None

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, v: str | list[str] | None) -> list[str] | None:
        if v is None:
            return None
        stops = [v] if isinstance(v, str) else list(v)
        if len(stops) > 4:
            raise InvalidValueError(f"at most 4 stop sequences, got {len(stops)}")
        if any(not s for s in stops):
            raise InvalidValueError("stop sequences must be non-empty strings")
        return stops

    def sampling(self) -> dict[str, Any]:
        """The keyword arguments of ``ChatModel.complete`` / ``text_completions`` this request sets."""
        return {
            "n": self.n,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "stop": self.stop,
            "seed": self.seed,
        }


class ChatCompletionRequest(SamplingRequest):
    """The OpenAI ``/v1/chat/completions`` body. Unknown fields are accepted and ignored (clients send
    ``frequency_penalty``, ``user``, ...); the fields below are validated and honoured."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


Prompt = str | list[str] | list[int] | list[list[int]]


class CompletionRequest(SamplingRequest):
    """The OpenAI legacy ``/v1/completions`` body (what lm-eval's ``local-completions`` sends).

    ``prompt``: a string, a list of strings, a list of token ids or a list of token-id lists (a
    batch: one choice per prompt and ``n``); ``echo``: the prompt's own tokens come first in the
    text and the log-probs; ``logprobs``: how many alternatives per position (0 = the sampled token's
    log-prob only); ``max_tokens: 0`` with ``echo`` scores the prompt without generating. Other
    fields are accepted and ignored."""

    prompt: Prompt
    max_tokens: int | None = Field(None, ge=0)
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)

    @field_validator("prompt")
    @classmethod
    def _non_empty(cls, v: Any) -> Any:
        if isinstance(v, list) and (not v or any(isinstance(p, list | str) and not p for p in v)):
            raise InvalidValueError("prompt must be non-empty (and so must every prompt of a list)")
        if isinstance(v, str) and not v:
            raise InvalidValueError("prompt must be a non-empty string")
        return v


class TokenizeRequest(BaseModel):
    """vLLM's ``/tokenize`` body: ``prompt`` text (or chat ``messages``, templated first)."""

    model_config = ConfigDict(extra="allow")
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = False
    add_generation_prompt: bool = True


class DetokenizeRequest(BaseModel):
    """vLLM's ``/detokenize`` body: token ids to turn back into text."""

    model_config = ConfigDict(extra="allow")
    tokens: list[int]


def error_body(
    message: str, type_: str, *, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """OpenAI's error shape: ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}
