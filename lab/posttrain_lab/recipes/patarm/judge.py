"""Generative judges and the judge reward source (PaTaRM as the reward of an RL run, arXiv 2510.24235).

A :class:`Judge` maps judge prompts to judgment texts (``None`` for an item that failed). Built in:

* :class:`HFJudge` — an in-process Hugging Face causal LM (a local checkpoint, a hub id or a preset),
  prompts formatted by :class:`JudgeFormatter` (``chat=True``: the model's chat template, with
  ``enable_thinking`` passed to it when set — Qwen3's switch) and sampled by
  :class:`~posttrain.rollout.HFEngine`. A judgment that reaches ``max_new_tokens`` without ending is
  **never scored**: it comes back as an empty text (unparsable: re-asked once, then the scale
  minimum), however many numbers its cut-off reasoning holds; ``truncated`` counts them;
* :class:`EndpointJudge` — any OpenAI-compatible ``/v1/chat/completions`` server (vLLM, SGLang, ...),
  through the SILO-BENCH client :class:`~posttrain.clients.OpenAIChatAgent` (per-request
  timeout, capped retries with backoff, bounded concurrency);
* :class:`RandomJudge` — a uniformly random score (the control run of ``posttrain demo rm``).

:class:`JudgeRewardSource` is a :class:`~posttrain.rollout.RewardSource` (registered as ``judge``).
The reward of a completion is, as a **proposed design**:

    r = (s̄ − s_min) / (s_max − s_min)          s̄ = mean score of ``samples`` judgments

Each distinct (task type, prompt, response) is judged once per cache lifetime (SHA-256 key, LRU of
``cache_size`` entries). Judge calls are made in batches of ``batch_size`` in a background thread; a
call that exceeds ``timeout_s`` or raises is retried up to ``max_retries`` times, then its items get
the failure reward (the scale minimum, i.e. 0) and are counted (``ScoredBatch.timeouts`` /
``errors``). A judgment without a parsable score is re-asked once (``retry_unparsable``), then scored
as the scale minimum. Per-completion components: ``judge_score`` (mean raw score, scale minimum when
none), ``judge_parsed`` (1 when every judgment parsed), ``judge_verdicts`` (how many of the ``samples``
judgments gave a score: the reward source ``judged`` counts a verdict from any one of them),
``judge_failed`` (1 when the call failed),
``judge_cached`` (1 when served from the cache). Nothing a judge does stops training.
"""

from __future__ import annotations

import hashlib
import random
import threading
from abc import ABC, abstractmethod
from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import Any

from posttrain.clients.batch import EndpointGenerator
from posttrain.rollout.episodes import PromptFormatter
from posttrain.rollout.reward_source import RewardHandle, RewardSource, ScoredBatch
from posttrain.utils.errors import InvalidValueError
from posttrain_lab.recipes.patarm.prompts import DEFAULT_SCALE, normalise_score, parse_score, pointwise_prompt


class Judge(ABC):
    """``generate(prompts)`` -> one judgment text per prompt, ``None`` for an item that failed.
    It may raise (the whole call then counts as failed and is retried by the reward source)."""

    @abstractmethod
    def generate(self, prompts: list[str]) -> list[str | None]: ...

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources."""


class JudgeFormatter(PromptFormatter):
    """A :class:`~posttrain.rollout.PromptFormatter` whose chat template also receives
    ``enable_thinking`` (Qwen3 and other thinking models; ``None``: not passed, the template's
    default). :meth:`wrap` builds one from any formatter."""

    def __init__(
        self,
        tokenizer: Any,
        *,
        template: str = "{prompt}",
        chat: bool = False,
        enable_thinking: bool | None = None,
    ) -> None:
        super().__init__(tokenizer, template=template, chat=chat)
        self.enable_thinking = enable_thinking

    @classmethod
    def wrap(cls, formatter: Any, *, enable_thinking: bool | None) -> JudgeFormatter:
        """The same tokenizer, template and chat setting, passing ``enable_thinking``."""
        return cls(
            formatter.tokenizer,
            template=getattr(formatter, "template", "{prompt}"),
            chat=bool(getattr(formatter, "chat", False)),
            enable_thinking=enable_thinking,
        )

    def encode(self, prompt: str) -> list[int]:
        if not self.chat or self.enable_thinking is None:
            return super().encode(prompt)
        ids = self.tokenizer.apply_chat_template(
            [{"role": "user", "content": self.text(prompt)}],
            add_generation_prompt=True,
            tokenize=True,
            enable_thinking=self.enable_thinking,
        )
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return [int(i) for i in ids]


class HFJudge(Judge):
    """An in-process causal LM judge. ``model`` is a checkpoint directory, a hub id or a preset name
    (or pass ``model_obj`` + ``tokenizer``). Sampling at ``temperature`` (0 = greedy).
    ``enable_thinking`` goes to the chat template (``chat_template=True``). A judgment cut off at
    ``max_new_tokens`` (no end of sequence) is returned as ``""`` — never scored as a verdict — and
    counted in ``truncated``. ``engine`` (a registered rollout engine: ``hf``, ``fast``) and
    ``precision`` (fp32 | bf16) choose how the judgments are generated."""

    def __init__(
        self,
        model: str | None = None,
        *,
        model_obj: Any = None,
        tokenizer: Any = None,
        chat_template: bool = False,
        enable_thinking: bool | None = None,
        temperature: float = 0.0,
        max_new_tokens: int = 256,
        max_batch_size: int | None = 64,
        device: str = "auto",
        dtype: str = "float32",
        precision: str = "fp32",
        engine: str = "hf",
        seed: int = 0,
    ) -> None:
        from posttrain.rollout import RolloutSpec

        if model_obj is None:
            from posttrain.models import load_model_and_tokenizer, pick_device

            if model is None:
                raise InvalidValueError("HFJudge: give a model name/path or model_obj + tokenizer")
            dev = pick_device() if device == "auto" else device
            model_obj, tokenizer = load_model_and_tokenizer(model, dtype=dtype, device=dev, seed=seed)
        elif tokenizer is None:
            raise InvalidValueError("HFJudge: pass the tokenizer together with model_obj")
        model_obj.eval()
        self.model, self.tokenizer = model_obj, tokenizer
        self.formatter = JudgeFormatter(tokenizer, chat=chat_template, enable_thinking=enable_thinking)
        self.truncated = 0
        # ``engine``: a rollout engine from the registry ("hf" reference, "fast" pre-allocated cache);
        # precision "bf16": judgments generated under bf16 autocast (the engine enters it itself, so it
        # holds in the reward source's worker thread too)
        spec = RolloutSpec(engine=engine, precision=precision, max_batch_size=max_batch_size)
        self.engine = spec.build(model_obj, tokenizer, seed=seed).engine
        self.temperature = temperature
        self.max_new_tokens = max_new_tokens
        self._lock = threading.Lock()

    def generate(self, prompts: list[str]) -> list[str | None]:
        import torch

        from posttrain.rollout import SamplingParams

        if not prompts:
            return []
        params = SamplingParams(
            temperature=self.temperature, max_new_tokens=self.max_new_tokens, logprobs=False
        )
        # identical prompts (k judgments of one response) go to the engine as one prompt with n
        # samples: an engine that shares a prompt's prefill across its group (fast) encodes it once
        counts = Counter(prompts)  # in first-occurrence order
        uniq = list(counts)
        ids = [self.formatter.encode(p) for p in uniq]
        with self._lock, torch.no_grad():
            batch = self.engine.generate(ids, list(counts.values()), params)
        texts = list(self.tokenizer.batch_decode(batch.completion_lists(), skip_special_tokens=True))
        cut = batch.truncated.tolist()
        self.truncated += sum(cut)
        rows: dict[str, list[int]] = {p: [] for p in uniq}  # each prompt's rows, in output order
        for r, g in enumerate(batch.group_ids.tolist()):
            rows[uniq[g]].append(r)
        order = {p: iter(rs) for p, rs in rows.items()}
        return ["" if cut[r] else texts[r] for r in (next(order[p]) for p in prompts)]


class EndpointJudge(EndpointGenerator, Judge):
    """A judge behind an OpenAI-compatible endpoint (:class:`posttrain.clients.EndpointGenerator`:
    the API key from the environment variable ``api_key_env``, never from a config file; per-request
    ``timeout_s`` and capped ``max_retries``; an item that still fails is ``None``)."""


class RandomJudge(Judge):
    """Scores uniformly at random on the integer scale: the no-information control."""

    def __init__(self, *, scale: tuple[float, float] = DEFAULT_SCALE, seed: int = 0) -> None:
        self.lo, self.hi = int(scale[0]), int(scale[1])
        self.rng = random.Random(seed)

    def generate(self, prompts: list[str]) -> list[str | None]:
        return [f"<score>{self.rng.randint(self.lo, self.hi)}</score>" for _ in prompts]


# ----------------------------------------------------------------------------------- reward source
@dataclass
class _Judged:
    scores: list[float | None]
    failed: bool
    timed_out: bool
    cached: bool = False


class _CallTimeout(Exception):
    pass


def _call_with_timeout(judge: Judge, prompts: list[str], timeout_s: float | None) -> list[str | None]:
    """``judge.generate(prompts)`` in a daemon thread; raises :class:`_CallTimeout` after ``timeout_s``
    (the thread is abandoned: it cannot be killed, but it never blocks training or interpreter exit)."""
    if timeout_s is None:
        return judge.generate(prompts)
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["out"] = judge.generate(prompts)
        except BaseException as e:  # reported to the caller
            box["err"] = e

    t = threading.Thread(target=target, daemon=True, name="posttrain-judge")
    t.start()
    t.join(timeout_s)
    if t.is_alive():
        raise _CallTimeout(f"judge call exceeded {timeout_s:g}s")
    if "err" in box:
        raise box["err"]
    return box["out"]


def cache_key(task_type: str, prompt: str, response: str) -> str:
    h = hashlib.sha256()
    for part in (task_type, prompt, response):
        b = part.encode("utf-8", "surrogatepass")
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    return h.hexdigest()


class _Handle(RewardHandle):
    def __init__(self, fn: Any) -> None:
        self._box: dict[str, Any] = {}

        def target() -> None:
            try:
                self._box["out"] = fn()
            except BaseException as e:  # re-raised in result()
                self._box["err"] = e

        self._thread = threading.Thread(target=target, daemon=True, name="posttrain-judge-source")
        self._thread.start()

    def result(self) -> ScoredBatch:
        self._thread.join()
        if "err" in self._box:
            raise self._box["err"]
        return self._box["out"]


class JudgeRewardSource(RewardSource):
    """Rewards from a pointwise generative judge (see the module docstring for the rules)."""

    def __init__(
        self,
        judge: Judge,
        *,
        samples: int = 1,
        scale: tuple[float, float] = DEFAULT_SCALE,
        rubric_style: str = "full",
        default_task_type: str = "chat",
        batch_size: int = 32,
        timeout_s: float | None = 60.0,
        max_retries: int = 1,
        retry_unparsable: bool = True,
        cache_size: int = 100_000,
        fallback: bool = True,
    ) -> None:
        if samples < 1:
            raise InvalidValueError(f"judge reward source: samples must be >= 1, got {samples}")
        if batch_size < 1:
            raise InvalidValueError(f"judge reward source: batch_size must be >= 1, got {batch_size}")
        if max_retries < 0:
            raise InvalidValueError(f"judge reward source: max_retries must be >= 0, got {max_retries}")
        lo, hi = float(scale[0]), float(scale[1])
        if not hi > lo:
            raise InvalidValueError(
                f"judge reward source: scale must be (min, max) with max > min, got {scale}"
            )
        self.judge = judge
        self.samples = samples
        self.scale = (lo, hi)
        self.rubric_style = rubric_style
        self.default_task_type = default_task_type
        self.batch_size = batch_size
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.retry_unparsable = retry_unparsable
        self.fallback = fallback
        self.cache_size = cache_size
        self._cache: OrderedDict[str, list[float | None]] = OrderedDict()
        self._lock = threading.Lock()
        self.stats = {"calls": 0, "timeouts": 0, "errors": 0, "unparsable": 0, "cache_hits": 0}

    # -------------------------------------------------------------------------------------- api
    def submit(self, completions: list[str], examples: list[Any]) -> RewardHandle:
        if len(completions) != len(examples):
            raise InvalidValueError(f"judge: {len(completions)} completions for {len(examples)} examples")
        return _Handle(lambda: self._score(list(completions), list(examples)))

    def close(self) -> None:
        self.judge.close()

    def task_type(self, example: Any) -> str:
        meta = getattr(example, "meta", None) or {}
        return str(meta.get("task_type") or self.default_task_type)

    def judge_scores(self, items: list[tuple[str, str, str]]) -> list[_Judged]:
        """``samples`` scores for each (task type, question, response), with cache, retries and
        timeouts. Used by the reward source, ``posttrain rm score`` and ``posttrain rm eval``."""
        out: list[_Judged | None] = [None] * len(items)
        todo: list[int] = []
        keys = [cache_key(*it) for it in items]
        with self._lock:
            for i, k in enumerate(keys):
                if k in self._cache:
                    self._cache.move_to_end(k)
                    out[i] = _Judged(list(self._cache[k]), failed=False, timed_out=False, cached=True)
                    self.stats["cache_hits"] += 1
        first: dict[str, int] = {}
        for i, k in enumerate(keys):
            if out[i] is None:
                if k in first:  # duplicate in this batch: judged once
                    continue
                first[k] = i
                todo.append(i)
        prompts = [
            pointwise_prompt(q, r, t, rubric_style=self.rubric_style, scale=self.scale)  # type: ignore[arg-type]
            for t, q, r in (items[i] for i in todo)
        ]
        results = self._judge_prompts(prompts)
        for i, res in zip(todo, results, strict=True):
            out[i] = res
            if not res.failed:
                self._store(keys[i], res.scores)
        for i, k in enumerate(keys):
            if out[i] is None:
                src = out[first[k]]
                assert src is not None
                out[i] = _Judged(list(src.scores), src.failed, src.timed_out, cached=True)
        return [o for o in out if o is not None]

    # ---------------------------------------------------------------------------------- internals
    def _store(self, key: str, scores: list[float | None]) -> None:
        if self.cache_size <= 0:
            return
        with self._lock:
            self._cache[key] = list(scores)
            self._cache.move_to_end(key)
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)

    def _call(self, prompts: list[str]) -> tuple[list[str | None] | None, bool]:
        """One batch with capped retries: (texts, timed_out); texts None when every attempt failed."""
        timed_out = False
        for _ in range(self.max_retries + 1):
            self.stats["calls"] += 1
            try:
                texts = _call_with_timeout(self.judge, prompts, self.timeout_s)
            except _CallTimeout:
                timed_out = True
                self.stats["timeouts"] += 1
                continue
            except Exception:
                self.stats["errors"] += 1
                continue
            if not isinstance(texts, list) or len(texts) != len(prompts):
                self.stats["errors"] += 1
                continue
            return texts, False
        return None, timed_out

    def _parse(self, text: Any) -> float | None:
        return parse_score(text if isinstance(text, str) else None, scale=self.scale, fallback=self.fallback)

    def _judge_prompts(self, prompts: list[str]) -> list[_Judged]:
        n = len(prompts)
        scores: list[list[float | None]] = [[] for _ in range(n)]
        failed = [False] * n
        timed = [False] * n
        for s in range(self.samples):
            del s
            for b in range(0, n, self.batch_size):
                idx = list(range(b, min(n, b + self.batch_size)))
                texts, to = self._call([prompts[i] for i in idx])
                if texts is None:
                    for i in idx:
                        failed[i], timed[i] = True, timed[i] or to
                        scores[i].append(None)
                    continue
                parsed = [None if t is None else self._parse(t) for t in texts]
                for i, t in zip(idx, texts, strict=True):
                    if t is None:
                        failed[i] = True
                again = [
                    j
                    for j, (t, v) in enumerate(zip(texts, parsed, strict=True))
                    if t is not None and v is None
                ]
                if again and self.retry_unparsable:
                    retry, _ = self._call([prompts[idx[j]] for j in again])
                    if retry is not None:
                        for j, t in zip(again, retry, strict=True):
                            parsed[j] = self._parse(t)
                for i, v in zip(idx, parsed, strict=True):
                    if v is None and not failed[i]:
                        self.stats["unparsable"] += 1
                    scores[i].append(v)
        return [_Judged(scores[i], failed[i], timed[i]) for i in range(n)]

    def _score(self, completions: list[str], examples: list[Any]) -> ScoredBatch:
        items = [
            (self.task_type(ex), str(getattr(ex, "prompt", ex)), c)
            for c, ex in zip(completions, examples, strict=True)
        ]
        judged = self.judge_scores(items)
        lo = self.scale[0]
        rewards, raw, parsed, verdicts, failed, cached = [], [], [], [], [], []
        for j in judged:
            vals = [v for v in j.scores if v is not None]
            mean = sum(vals) / len(vals) if vals else lo
            rewards.append(normalise_score(mean, self.scale))
            raw.append(mean)
            parsed.append(float(bool(vals) and len(vals) == len(j.scores)))
            verdicts.append(float(len(vals)))
            failed.append(float(j.failed))
            cached.append(float(j.cached))
        return ScoredBatch(
            rewards=rewards,
            timeouts=sum(1 for j in judged if j.timed_out and not j.cached),
            errors=sum(1 for j in judged if j.failed and not j.timed_out and not j.cached),
            components={
                "judge_score": raw,
                "judge_parsed": parsed,
                "judge_verdicts": verdicts,
                "judge_failed": failed,
                "judge_cached": cached,
            },
        )
