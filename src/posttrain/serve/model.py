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
    token_ids: tuple[int, ...] = ()  # the sampled tokens (after a stop sequence cut: those kept)
    logprobs: list[dict[str, Any]] | None = None  # chat ``logprobs.content`` entries, when asked


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

    def check_prompt(self, prompt: list[int], max_tokens: int, *, param: str = "messages") -> None:
        if len(prompt) > self.max_prompt_tokens:
            where = "after the chat template" if param == "messages" else "long"
            raise RequestError(
                f"the prompt is {len(prompt)} tokens {where}; this server accepts at "
                f"most {self.max_prompt_tokens} (max_prompt_tokens)",
                param=param,
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
        rows = self._sample([prompt], n, max_tokens, temperature, top_p, seed, cancel)
        choices = []
        for _, ids, reason in rows:
            text, kept, finish = self._finish(ids, reason, stop)
            choices.append(Choice(text, len(ids), finish, tuple(kept)))
        return Completion(choices, len(prompt))

    def _sample(
        self,
        prompts: list[list[int]],
        n: int,
        max_tokens: int,
        temperature: float,
        top_p: float,
        seed: int | None,
        cancel: Any,
    ) -> list[tuple[int, list[int], str]]:
        """(prompt index, completion ids, engine finish reason) of ``n`` samples per prompt, one
        ``generate`` call for all of them."""
        from posttrain.rollout.base import SamplingParams

        params = SamplingParams(
            temperature=temperature,
            top_p=top_p,
            max_new_tokens=max_tokens,
            seed=seed,
            logprobs=False,
            cancel=cancel,
        )
        with self._lock:
            batch = self.engine.generate(prompts, [n] * len(prompts), params)
        return [
            (int(g), ids, reason)
            for g, ids, reason in zip(
                batch.group_ids.tolist(), batch.completion_lists(), batch.finish_reasons, strict=True
            )
        ]

    def _finish(self, ids: list[int], reason: str, stop: list[str] | None) -> tuple[str, list[int], str]:
        """(text cut at the earliest stop string, the tokens kept, OpenAI's finish reason)."""
        from posttrain.rollout.base import FINISH_STOP

        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        text, stopped = _cut_at_stop(text, stop)
        kept = ids[: self._tokens_within(ids, text)] if stopped else ids
        return text, kept, "stop" if stopped or reason == FINISH_STOP else "length"

    # ------------------------------------------------------------------ log-probs, /v1/completions
    def token_text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id], skip_special_tokens=False)

    def _tokens_within(self, ids: list[int], text: str) -> int:
        """How many leading tokens of ``ids`` decode to a prefix of ``text`` (a stop-cut completion)."""
        k = 0
        while k < len(ids) and len(self.tokenizer.decode(ids[: k + 1], skip_special_tokens=True)) <= len(
            text
        ):
            k += 1
        return k

    def chat_logprobs(self, prompt: list[int], choices: list[Choice], top: int) -> list[Choice]:
        """``choices`` with OpenAI's chat ``logprobs.content`` (one entry per kept completion token,
        ``top`` alternatives each), scored by :func:`posttrain.serve.scoring.score_tokens`."""
        from dataclasses import replace

        from posttrain.serve.scoring import score_tokens

        with self._lock:
            scored = score_tokens(
                self.model, [prompt + list(c.token_ids) for c in choices], top_k=top, pad_id=self.pad_id
            )
        out = []
        for c, sc in zip(choices, scored, strict=True):
            entries = []
            for t in range(len(prompt), len(sc.ids)):
                alts = sc.top[t] or []
                entries.append(
                    {
                        **self._token_entry(sc.ids[t], sc.logprobs[t]),
                        "top_logprobs": [self._token_entry(i, v) for i, v in alts],
                    }
                )
            out.append(replace(c, logprobs=entries))
        return out

    def _token_entry(self, token_id: int, logprob: float | None) -> dict[str, Any]:
        text = self.token_text(token_id)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

    @property
    def pad_id(self) -> int:
        return int(self.tokenizer.pad_token_id or 0)

    def encode_prompts(self, prompt: Any) -> list[list[int]]:
        """A ``/v1/completions`` prompt (string, strings, token ids, token-id lists) as token-id lists
        (text is tokenized without special tokens, as lm-eval's ``tok_encode`` does); ids outside the
        vocabulary are a :class:`RequestError`."""
        if isinstance(prompt, str):
            prompts: list[Any] = [prompt]
        elif prompt and all(isinstance(x, int) for x in prompt):
            prompts = [prompt]
        else:
            prompts = list(prompt)
        vocab = int(self.model.get_output_embeddings().weight.shape[0])
        out = []
        for i, p in enumerate(prompts):
            ids = self._encode(p, split_special=False) if isinstance(p, str) else [int(x) for x in p]
            bad = [x for x in ids if not 0 <= x < vocab]
            if bad:
                raise RequestError(
                    f"prompt {i}: token id {bad[0]} is outside this model's vocabulary [0, {vocab})",
                    param="prompt",
                    code="invalid_value",
                )
            if not ids:
                raise RequestError(f"prompt {i} is empty after tokenization", param="prompt")
            out.append(ids)
        return out

    def text_completions(
        self,
        prompts: list[list[int]],
        *,
        n: int,
        max_tokens: int,
        temperature: float,
        top_p: float,
        stop: list[str] | None,
        seed: int | None,
        echo: bool,
        logprobs: int | None,
        cancel: Any = None,
    ) -> list[dict[str, Any]]:
        """OpenAI ``/v1/completions`` choices (index = prompt * n + sample) for token-id ``prompts``.

        ``max_tokens`` 0 generates nothing (with ``echo``: the prompt scored). One greedy token
        (``temperature`` 0, ``max_tokens`` 1: lm-eval's log-likelihood request) is read from the same
        forward that scores the prompt; otherwise the engine samples and prompt + completion are
        scored afterwards. ``logprobs`` (None = none) are the trainer's token log-probs at
        temperature 1 (:mod:`posttrain.serve.scoring`)."""
        from posttrain.rollout.base import FINISH_STOP
        from posttrain.serve.scoring import score_tokens

        eos = set(self.engine_eos_ids())
        rows: list[tuple[int, list[int], str]] = []  # (prompt index, completion ids, finish reason)
        scored = None
        top = logprobs or 0
        if max_tokens == 0:
            rows = [(i, [], "length") for i in range(len(prompts)) for _ in range(n)]
        elif max_tokens == 1 and temperature == 0:
            with self._lock:
                scored = score_tokens(self.model, prompts, top_k=top, with_next=True, pad_id=self.pad_id)
            for i, sc in enumerate(scored):
                nxt = sc.next_top[0][0]
                rows += [(i, [nxt], FINISH_STOP if nxt in eos else "length")] * n
        else:
            rows = self._sample(prompts, n, max_tokens, temperature, top_p, seed, cancel)
        choices = []
        texts = []
        for i, ids, reason in rows:
            text, kept, finish = self._finish(ids, reason, stop)
            texts.append((text, kept, finish))
            choices.append((i, kept))
        seq_scores = None
        if logprobs is not None:
            if scored is not None and all(len(k) <= 1 for _, k in choices):
                seq_scores = [self._extend(scored[i], kept, top) for i, kept in choices]
            else:
                with self._lock:
                    seq_scores = score_tokens(
                        self.model, [prompts[i] + kept for i, kept in choices], top_k=top, pad_id=self.pad_id
                    )
        out = []
        for j, ((i, _), (text, _, finish)) in enumerate(zip(choices, texts, strict=True)):
            start = 0 if echo else len(prompts[i])
            body: dict[str, Any] = {
                "index": j,
                "text": (self.tokenizer.decode(prompts[i], skip_special_tokens=False) if echo else "") + text,
                "logprobs": None,
                "finish_reason": finish,
                "completion_tokens": len(rows[j][1]),
            }
            if seq_scores is not None:
                body["logprobs"] = self._legacy_logprobs(seq_scores[j], start)
            out.append(body)
        return out

    @staticmethod
    def _extend(sc: Any, kept: list[int], top: int) -> Any:
        """A prompt's scores plus its one greedy token (read from ``next_top``; ``top`` alternatives)."""
        from posttrain.serve.scoring import TokenScores

        if not kept:
            return sc
        value = next(v for i, v in sc.next_top if i == kept[0])
        return TokenScores(sc.ids + kept, [*sc.logprobs, value], [*sc.top, sc.next_top[:top] or None])

    def _legacy_logprobs(self, sc: Any, start: int) -> dict[str, Any]:
        """OpenAI's completions ``logprobs`` object for tokens ``start:`` of a scored sequence."""
        tokens, offsets, top, offset = [], [], [], 0
        for t in range(start, len(sc.ids)):
            piece = self.token_text(sc.ids[t])
            tokens.append(piece)
            offsets.append(offset)
            offset += len(piece)
            alts: dict[str, float] = {}
            for i, v in sc.top[t] or []:
                alts.setdefault(self.token_text(i), v)  # most likely first: keep the larger on a clash
            top.append(alts if sc.top[t] is not None else None)
        return {
            "tokens": tokens,
            "token_logprobs": sc.logprobs[start:],
            "top_logprobs": top,
            "text_offset": offsets,
        }

    def engine_eos_ids(self) -> list[int]:
        eos = self.tokenizer.eos_token_id
        return [] if eos is None else [int(eos)]

    def describe(self) -> dict[str, Any]:
        return {"context": self.context, "max_prompt_tokens": self.max_prompt_tokens}
