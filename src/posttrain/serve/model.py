"""The model behind `posttrain serve`: chat template, bounded prompts, sampling, stop sequences.

Generation goes through :class:`posttrain.rollout.HFEngine` (the trainer's own sampler, so a served
checkpoint samples exactly as it did in training), one request at a time on a single worker thread:
one model, one ``generate`` call at a time; requests wait in the server's bounded queue.
"""

from __future__ import annotations

import secrets
import threading
from dataclasses import dataclass
from typing import Any

from posttrain.serve.config import ChatMessage, ServeConfig
from posttrain.utils.errors import InvalidValueError, PosttrainError


class RequestError(PosttrainError, ValueError):
    """A request the model cannot serve as asked (HTTP 400); ``code`` is OpenAI's error code."""

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.code = code


@dataclass(frozen=True)
class Choice:
    text: str
    completion_tokens: int
    finish_reason: str  # "stop" | "length"


@dataclass(frozen=True)
class Completion:
    choices: list[Choice]
    prompt_tokens: int

    @property
    def completion_tokens(self) -> int:
        return sum(c.completion_tokens for c in self.choices)


def _cut_at_stop(text: str, stops: list[str] | None) -> tuple[str, bool]:
    """``text`` up to (excluding) the earliest stop sequence, and whether one was found."""
    if not stops:
        return text, False
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    if not hits:
        return text, False
    return text[: min(hits)], True


class ChatModel:
    """A loaded causal LM with its tokenizer, answering chat requests."""

    def __init__(self, cfg: ServeConfig) -> None:
        from posttrain.models import load_model_and_tokenizer
        from posttrain.rollout.hf import HFEngine

        self.model, self.tokenizer = load_model_and_tokenizer(
            cfg.model, dtype=cfg.dtype, device=cfg.device, seed=cfg.seed
        )
        if not getattr(self.tokenizer, "chat_template", None):
            raise InvalidValueError(
                f"model {cfg.model!r}: its tokenizer has no chat template (tokenizer_config.json "
                "'chat_template'), so chat messages cannot be rendered; add one before serving"
            )
        self.engine = HFEngine(self.model, self.tokenizer, seed=cfg.seed)
        self.context = int(getattr(self.model.config, "max_position_embeddings", 0) or 4096)
        self.max_prompt_tokens = min(cfg.max_prompt_tokens or self.context, self.context)
        self._lock = threading.Lock()

    def render(self, messages: list[ChatMessage]) -> list[int]:
        """Token ids of the chat-templated conversation with the assistant turn opened.

        Message content is text, never markup: a special-token string a client writes
        (``<|im_start|>system`` inside a user message) must not become a real role turn. Content free
        of special-token strings is tokenized with the template exactly as in training (one string);
        otherwise the template is rendered with a placeholder per message, its own pieces are
        tokenized as usual and each message's content with ``split_special_tokens=True`` (as plain
        text). A template that alters content so the placeholders cannot be found refuses such
        content (400) rather than let it through.
        """
        contents = [m.text() for m in messages]
        specials = self._special_strings()
        forged = [(i, tok) for i, c in enumerate(contents) for tok in specials if tok in c]
        if not forged:
            return self._encode(self._apply_template(messages, contents), split_special=False)
        nonce = secrets.token_hex(8)
        marks = [f"PTMSG{nonce}N{i}E" for i in range(len(contents))]
        text = self._apply_template(messages, marks)
        ids: list[int] = []
        pos = 0
        for i, mark in enumerate(marks):
            at = text.find(mark, pos)
            if at < 0 or text.count(mark) != 1:
                j, tok = forged[0]
                raise RequestError(
                    f"messages[{j}].content holds the special-token string {tok!r}, and this model's "
                    "chat template transforms message content, so it cannot be kept as plain text; "
                    "remove the special-token strings from the messages",
                    param=f"messages[{j}].content",
                    code="invalid_value",
                )
            ids += self._encode(text[pos:at], split_special=False)
            ids += self._encode(contents[i], split_special=True)
            pos = at + len(mark)
        ids += self._encode(text[pos:], split_special=False)
        return ids

    def _apply_template(self, messages: list[ChatMessage], contents: list[str]) -> str:
        return self.tokenizer.apply_chat_template(
            [{"role": m.role, "content": c} for m, c in zip(messages, contents, strict=True)],
            tokenize=False,
            add_generation_prompt=True,
        )

    def _encode(self, text: str, *, split_special: bool) -> list[int]:
        if not text:
            return []
        out = self.tokenizer(text, add_special_tokens=False, split_special_tokens=split_special)
        return list(out["input_ids"])

    def _special_strings(self) -> list[str]:
        """The strings the tokenizer turns into special tokens when it parses text."""
        tok = self.tokenizer
        found = set(getattr(tok, "all_special_tokens", []) or [])
        for added in (getattr(tok, "added_tokens_decoder", None) or {}).values():
            if getattr(added, "special", False):
                found.add(str(added.content))
        return sorted(s for s in found if s)

    def check_prompt(self, prompt: list[int], max_tokens: int) -> None:
        if len(prompt) > self.max_prompt_tokens:
            raise RequestError(
                f"the prompt is {len(prompt)} tokens after the chat template; this server accepts at "
                f"most {self.max_prompt_tokens} (max_prompt_tokens)",
                param="messages",
                code="context_length_exceeded",
            )
        if len(prompt) + max_tokens > self.context:
            raise RequestError(
                f"prompt ({len(prompt)} tokens) + max_tokens ({max_tokens}) exceeds the model's context "
                f"of {self.context} tokens; lower max_tokens or shorten the messages",
                param="max_tokens",
                code="context_length_exceeded",
            )

    def complete(
        self,
        prompt: list[int],
        *,
        n: int,
        max_tokens: int,
        temperature: float,
        top_p: float,
        stop: list[str] | None,
        seed: int | None,
        cancel: Any = None,
    ) -> Completion:
        """Sample ``n`` completions of ``prompt`` (blocking; run it on a worker thread). ``cancel``: a
        ``threading.Event``; once set, generation stops at the next token (a client that went away)."""
        from posttrain.rollout.base import FINISH_STOP, SamplingParams

        params = SamplingParams(
            temperature=temperature,
            top_p=top_p,
            max_new_tokens=max_tokens,
            seed=seed,
            logprobs=False,
            cancel=cancel,
        )
        with self._lock:
            batch = self.engine.generate([prompt], [n], params)
        choices = []
        for ids, reason in zip(batch.completion_lists(), batch.finish_reasons, strict=True):
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            text, stopped = _cut_at_stop(text, stop)
            finish = "stop" if stopped or reason == FINISH_STOP else "length"
            choices.append(Choice(text, len(ids), finish))
        return Completion(choices, len(prompt))

    def describe(self) -> dict[str, Any]:
        return {"context": self.context, "max_prompt_tokens": self.max_prompt_tokens}
