"""The OpenAI-compatible HTTP application (FastAPI) of `posttrain serve`.

Endpoints: ``POST /v1/chat/completions`` (optionally streamed as server-sent events), ``GET
/v1/models``, ``GET /health``. Every error is OpenAI's JSON shape ``{"error": {"message", "type",
"param", "code"}}``:

====  =========================  ==================================================================
400   invalid_request_error      malformed JSON, a field of the wrong type or out of range, a prompt
                                 over ``max_prompt_tokens`` or over the model's context
404   invalid_request_error      ``model`` is not the served model; unknown path
405   invalid_request_error      wrong HTTP method
413   invalid_request_error      body over ``max_request_bytes`` (checked while reading, so a lying or
                                 missing Content-Length does not get past it)
429   rate_limit_exceeded        ``max_concurrent_requests`` already in flight (``Retry-After: 1``)
====  =========================  ==================================================================

Streaming (``"stream": true``) sends OpenAI's ``chat.completion.chunk`` events and ``data: [DONE]``;
the text is produced by one ``generate`` call first and then sent token by token, so it follows
the protocol but does not lower the time to the first token.
"""

# No `from __future__ import annotations`: FastAPI reads the endpoint annotations (Request) at runtime.
import asyncio
import json
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from posttrain.serve.config import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    ServeConfig,
    TokenizeRequest,
    error_body,
)
from posttrain.serve.model import ChatModel, Completion, RequestError

log = logging.getLogger("posttrain.serve")
_DISCONNECT_POLL_S = 0.1

ASGIApp = Callable[[dict, Callable[[], Awaitable[dict]], Callable[[dict], Awaitable[None]]], Awaitable[None]]


class BodyLimit:
    """ASGI middleware: read the whole body up to ``limit`` bytes, answer 413 past it, and replay the
    buffered body to the app (bodies here are small JSON documents)."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await self._too_large(send, int(declared))
            return
        chunks, size, more = [], 0, True
        while more:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            body = msg.get("body", b"")
            size += len(body)
            if size > self.limit:
                await self._too_large(send, size)
                return
            chunks.append(body)
            more = msg.get("more_body", False)
        data = b"".join(chunks)
        sent = False

        async def replay() -> dict:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": data, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _too_large(self, send: Callable, size: int) -> None:
        body = json.dumps(
            error_body(
                f"request body of {size}+ bytes exceeds this server's limit of {self.limit} bytes "
                "(max_request_bytes)",
                "invalid_request_error",
                code="request_too_large",
            )
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


def _validation_message(err: Any) -> tuple[str, str | None]:
    """One line per pydantic error: ``messages.0.role: Input should be 'system', ...``."""
    lines, param = [], None
    for e in err.errors():
        loc = ".".join(str(x) for x in e.get("loc", ()))
        param = param or (loc or None)
        lines.append(f"{loc or 'body'}: {e.get('msg')}")
    return "; ".join(lines), param


def create_app(cfg: ServeConfig, chat_model: ChatModel | None = None) -> Any:
    """The FastAPI app serving ``chat_model`` (loaded from ``cfg.model`` when not given)."""
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, Response, StreamingResponse
    from pydantic import ValidationError
    from starlette.exceptions import HTTPException as StarletteHTTPException

    model = chat_model if chat_model is not None else ChatModel(cfg)
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="posttrain-serve")
    created = int(time.time())
    state = {"inflight": 0, "served": 0, "rejected": 0, "cancelled": 0}

    app = FastAPI(title="posttrain serve", docs_url=None, redoc_url=None, openapi_url=None)

    def err(status: int, message: str, type_: str = "invalid_request_error", **kw: Any) -> JSONResponse:
        headers = {"Retry-After": "1"} if status == 429 else None
        return JSONResponse(error_body(message, type_, **kw), status_code=status, headers=headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        what = {404: f"no route {request.url.path}", 405: f"method {request.method} not allowed here"}
        return err(exc.status_code, what.get(exc.status_code, str(exc.detail)))

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "model": cfg.model_id, **state}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {"id": cfg.model_id, "object": "model", "created": created, "owned_by": "posttrain"}
        return {"object": "list", "data": [{**card, **model.describe()}]}

    async def parse(request: Request, schema: Any) -> Any:
        """The validated body, or the 400 response saying what is wrong with it."""
        raw = await request.body()
        try:
            payload = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            return err(400, f"malformed JSON body: {e}", code="invalid_json")
        if not isinstance(payload, dict):
            return err(
                400, f"the body must be a JSON object, got {type(payload).__name__}", code="invalid_json"
            )
        try:
            return schema.model_validate(payload), payload
        except ValidationError as e:
            message, param = _validation_message(e)
            return err(400, message, param=param, code="invalid_value")

    def check_common(req: Any, max_tokens: int) -> JSONResponse | None:
        """The checks every generating request passes: served model id, n, max_tokens, concurrency."""
        if req.model is not None and req.model != cfg.model_id:
            return err(
                404,
                f"model {req.model!r} is not served here; this server serves {cfg.model_id!r}",
                param="model",
                code="model_not_found",
            )
        if req.n > cfg.max_n:
            return err(400, f"n = {req.n}; this server allows at most {cfg.max_n} (max_n)", param="n")
        if max_tokens > cfg.max_tokens:
            return err(
                400,
                f"max_tokens = {max_tokens}; this server allows at most {cfg.max_tokens}",
                param="max_tokens",
            )
        if state["inflight"] >= cfg.max_concurrent_requests:
            state["rejected"] += 1
            return err(
                429,
                f"{state['inflight']} requests in flight, the limit is "
                f"{cfg.max_concurrent_requests} (max_concurrent_requests); retry later",
                "rate_limit_exceeded",
                code="too_many_requests",
            )
        return None

    async def run_job(request: Request, job_fn: Callable[[threading.Event], Any]) -> Any:
        """Run ``job_fn(cancel)`` on the model's worker thread, counted in flight; a client that goes
        away sets ``cancel`` (its generation stops at the next token: it held the model's lock for the
        full max_tokens before, delaying every later request). Returns the result, a 400 response for a
        :class:`RequestError`, or a 499 for a client that went away."""
        state["inflight"] += 1
        cancel = threading.Event()
        try:
            job = asyncio.get_running_loop().run_in_executor(executor, lambda: job_fn(cancel))
            while not (await asyncio.wait({job}, timeout=_DISCONNECT_POLL_S))[0]:
                if await request.is_disconnected():
                    cancel.set()
                    break
            out = await job
        except RequestError as e:
            return err(400, str(e), param=e.param, code=e.code)
        finally:
            state["inflight"] -= 1
        if cancel.is_set():
            state["cancelled"] += 1
            log.warning("client went away; its generation was stopped (%d so far)", state["cancelled"])
            return Response(status_code=499)  # nobody reads it; nginx's "client closed request"
        state["served"] += 1
        return out

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        parsed = await parse(request, ChatCompletionRequest)
        if not isinstance(parsed, tuple):
            return parsed
        req, payload = parsed
        max_tokens = req.requested_max_tokens() or cfg.default_max_tokens
        if len(req.messages) > cfg.max_messages:
            return err(
                400,
                f"{len(req.messages)} messages; at most {cfg.max_messages} (max_messages)",
                param="messages",
            )
        refused = check_common(req, max_tokens)
        if refused is not None:
            return refused
        top = req.top_logprobs or 0
        if top and not req.logprobs:
            return err(400, "top_logprobs needs logprobs: true", param="top_logprobs")

        def job(cancel: threading.Event) -> Completion:
            prompt = model.render(req.messages)
            model.check_prompt(prompt, max_tokens)
            out = model.complete(prompt, max_tokens=max_tokens, cancel=cancel, **req.sampling())
            if req.logprobs and not cancel.is_set():
                out = Completion(model.chat_logprobs(prompt, out.choices, top), out.prompt_tokens)
            return out

        out = await run_job(request, job)
        if not isinstance(out, Completion):
            return out
        rid = f"chatcmpl-{uuid.uuid4().hex[:24]}"
        if req.stream:
            include_usage = bool((payload.get("stream_options") or {}).get("include_usage"))
            return StreamingResponse(
                _sse(rid, cfg.model_id, out, model, include_usage), media_type="text/event-stream"
            )
        return {
            "id": rid,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": cfg.model_id,
            "choices": [
                {
                    "index": i,
                    "message": {"role": "assistant", "content": c.text},
                    "logprobs": None if c.logprobs is None else {"content": c.logprobs},
                    "finish_reason": c.finish_reason,
                }
                for i, c in enumerate(out.choices)
            ],
            "usage": _usage(out),
        }

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        parsed = await parse(request, CompletionRequest)
        if not isinstance(parsed, tuple):
            return parsed
        req = parsed[0]
        if req.stream:
            return err(400, "stream is not supported on /v1/completions", param="stream")
        max_tokens = cfg.default_max_tokens if req.max_tokens is None else req.max_tokens
        if max_tokens == 0 and not req.echo:
            return err(400, "max_tokens 0 needs echo: true (nothing to return otherwise)", param="max_tokens")
        refused = check_common(req, max_tokens)
        if refused is not None:
            return refused

        def job(cancel: threading.Event) -> dict[str, Any]:
            prompts = model.encode_prompts(req.prompt)
            if len(prompts) > cfg.max_prompts:
                raise RequestError(
                    f"{len(prompts)} prompts; at most {cfg.max_prompts} per request (max_prompts)",
                    param="prompt",
                )
            for ids in prompts:
                model.check_prompt(ids, max_tokens, param="prompt")
            choices = model.text_completions(
                prompts,
                max_tokens=max_tokens,
                echo=req.echo,
                logprobs=req.logprobs,
                cancel=cancel,
                **req.sampling(),
            )
            return {"choices": choices, "prompt_tokens": sum(len(p) for p in prompts)}

        out = await run_job(request, job)
        if not isinstance(out, dict):
            return out
        used = sum(c.pop("completion_tokens") for c in out["choices"])
        return {
            "id": f"cmpl-{uuid.uuid4().hex[:24]}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": cfg.model_id,
            "choices": out["choices"],
            "usage": {
                "prompt_tokens": out["prompt_tokens"],
                "completion_tokens": used,
                "total_tokens": out["prompt_tokens"] + used,
            },
        }

    # vLLM's tokenizer endpoints: lm-eval's `local-completions` finds them (tokenizer_backend=auto)
    # and tokenizes through the server, so a model without a tokenizer on disk (a preset) works
    @app.get("/tokenizer_info")
    async def tokenizer_info() -> dict[str, Any]:
        tok = model.tokenizer
        return {
            "tokenizer_class": type(tok).__name__,
            "eos_token": tok.eos_token,
            "bos_token": tok.bos_token,
            "pad_token": tok.pad_token,
            "chat_template": getattr(tok, "chat_template", None),
            "model_max_length": model.context,
        }

    @app.post("/tokenize")
    async def tokenize(request: Request) -> Any:
        parsed = await parse(request, TokenizeRequest)
        if not isinstance(parsed, tuple):
            return parsed
        req = parsed[0]
        text = req.prompt
        if req.messages is not None:
            text = model.tokenizer.apply_chat_template(
                [m.model_dump(exclude_none=True) for m in req.messages],
                tokenize=False,
                add_generation_prompt=req.add_generation_prompt,
            )
        if text is None:
            return err(400, "give prompt (text) or messages", param="prompt")
        ids = model.tokenizer(text, add_special_tokens=req.add_special_tokens)["input_ids"]
        return {"tokens": list(ids), "count": len(ids), "max_model_len": model.context}

    @app.post("/detokenize")
    async def detokenize(request: Request) -> Any:
        parsed = await parse(request, DetokenizeRequest)
        if not isinstance(parsed, tuple):
            return parsed
        return {"prompt": model.tokenizer.decode(parsed[0].tokens, skip_special_tokens=False)}

    app.state.executor = executor
    app.state.counters = state
    return BodyLimit(app, cfg.max_request_bytes)


def _usage(out: Completion) -> dict[str, int]:
    return {
        "prompt_tokens": out.prompt_tokens,
        "completion_tokens": out.completion_tokens,
        "total_tokens": out.prompt_tokens + out.completion_tokens,
    }


async def _sse(
    rid: str, model_id: str, out: Completion, model: ChatModel, include_usage: bool
) -> AsyncIterator[str]:
    """OpenAI chunk events: the role, then the text piece by piece (one token's worth of characters
    per event), then the finish reason per choice, optionally the usage, then ``[DONE]``."""
    created = int(time.time())

    def chunk(choices: list[dict[str, Any]], **extra: Any) -> str:
        body = {
            "id": rid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model_id,
            "choices": choices,
            **extra,
        }
        return f"data: {json.dumps(body)}\n\n"

    for i, c in enumerate(out.choices):
        yield chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])
        for piece in _pieces(c.text, model):
            yield chunk([{"index": i, "delta": {"content": piece}, "finish_reason": None}])
        yield chunk([{"index": i, "delta": {}, "finish_reason": c.finish_reason}])
    if include_usage:
        yield chunk([], usage=_usage(out))
    yield "data: [DONE]\n\n"


def _pieces(text: str, model: ChatModel) -> list[str]:
    """``text`` split at token boundaries (prefix decoding, so multi-byte characters stay whole)."""
    tok = model.tokenizer
    ids = tok(text, add_special_tokens=False)["input_ids"]
    pieces, done = [], ""
    for k in range(1, len(ids) + 1):
        prefix = tok.decode(ids[:k], skip_special_tokens=True)
        if prefix.endswith("\ufffd") and k < len(ids):
            continue
        pieces.append(prefix[len(done) :])
        done = prefix
    pieces = [p for p in pieces if p]
    return pieces if "".join(pieces) == text else [text]
