"""Experience replay: NexGRPO failure replay (proposed design), uniform failure replay, success replay.

Sources: NexGRPO, "Turning Failures into Value: Negative Experience Replay for RLVR via Confidence
Gating and Boundary Failure Sampling" (Guo et al., ACL 2026 long, 2026.acl-long.1682) — from its
abstract only: no code is public and the abstract gives no thresholds, similarity model, replay ratio
or importance-weight rule. Everything below that goes beyond the abstract is a **proposed design**,
built on ExGRPO (arXiv:2510.02245, §3: buffer of partially solved questions, batch mix ρ, delayed
start, per-token importance weights ``π_θ/π_past`` with policy shaping ``f(w) = w/(w+β)``).

Three buffers share one store (:class:`ExperienceReplay`):

* ``nexgrpo`` (proposed design): stores the **failures** of partially solved groups (0 < Acc(q) < 1)
  with their per-token sampling log-probs, confidence ``c(o) = exp(mean_t log π(o_t))`` and an
  embedding; also the group's correct solutions (embeddings only matter). At draw time a
  **mid-confidence gate** (``gate: quantile``) keeps the middle ``low..high`` share of a question's
  failures by confidence rank, or, for a question with fewer than ``gate_min_pool`` failures, those
  inside ``[Q(low), Q(high)]`` of the whole pool (none while the pool is smaller; posttrain's design),
  or those inside ``[low, high]`` (``gate: absolute``); **boundary failure sampling** scores each kept
  failure by ``s(o) = max_{o+ ∈ C(q)} cos(e(o), e(o+))``, standardised within the question
  (``similarity: zscore``: with T = 0.1 close to top-1 by rank, :func:`standardise`), and picks
  ``per_group`` of them with ``p ∝ softmax(z / T)`` (``select: softmax``) or the top ones (``topk``).
* ``random-failure``: the same failures, no gate, picked uniformly (the abstract's negative baseline).
* ``success``: ExGRPO-style replay of correct trajectories; picks the stored one with the highest
  sampling confidence (ExGRPO picks the lowest current-policy entropy; confidence at insertion is a
  cheaper proxy — a deliberate difference).

All three: the **batch mix** replaces prompts of the sampler's plan by stored questions so that
``min(⌊ρ·B⌋, eligible)`` groups carry replayed trajectories, questions drawn with ``p ∝
N(Acc(q); 0.5, σ)`` (ExGRPO); each such group gets ``per_group`` stored trajectories and
``K − per_group`` fresh rollouts, and the GRPO advantage is taken over the mixed group (failures get
A < 0 naturally). **Delayed start**: nothing is replayed before the batch accuracy of fresh rollouts
first exceeds ``start_accuracy`` (ExGRPO: Pass@1 > 35 %) and ``start_step`` steps have passed.
**Importance weights** on replayed tokens only (the trainer applies them to replayed rows):
``w = π_θ/π_past`` per token, then ``is_mode: clip`` → ``min(w, is_clip)``; ``shape`` → ``w/(w+β)``
(ExGRPO's f(w) used as a detached weight); ``shape-grad`` → ``β·w/(w+β)²`` (the weight that gives
exactly ExGRPO's gradient ``∇f(w)·A = f'(w)·w·∇log π·A``).
**Eviction and memory**: a question whose latest fresh group is all correct is retired (its entries
leave); each question keeps its newest ``max_per_question`` entries of each kind; the whole store is
capped at ``max_entries`` entries and ``max_bytes`` bytes (oldest entries leave first). Bytes are
counted as 8 per stored number (token ids, log-probs, embedding, mask) plus 64 per entry — a
deterministic estimate, documented, not a measurement of Python's overhead.
State is plain JSON (checkpointed by the trainer; no pickle).
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Callable
from typing import Any

import torch

from posttrain.hooks.base import REPLAY_BUFFERS, PromptPlan, ReplayBuffer, RunInfo, Trajectory
from posttrain.utils.errors import InvalidValueError
from posttrain.utils.registry import Registry

#: Embedding functions ``fn(policy, input_ids, attention_mask, score_mask) -> (n, d)`` for boundary
#: failure sampling; ``policy`` is the trainer's model adapter. A plug-in ``package.module:fn`` works too.
EMBEDDERS: Registry[Callable[..., torch.Tensor]] = Registry("replay embedding")
EMBEDDERS.accept(lambda obj: obj if callable(obj) else None, "a function (policy, ids, attn, mask) -> (n, d)")

_GATES = ("quantile", "absolute", "none")
_SELECT = ("softmax", "topk", "uniform", "confident")
_IS_MODES = ("clip", "shape", "shape-grad", "exgrpo")
_GATE_SCOPES = ("question", "pool")
_SIMILARITY = ("zscore", "raw")


# ------------------------------------------------------------------------------------ pure functions
def sequence_confidence(logp: list[float], mode: str = "geo") -> float:
    """``geo``: ``exp(mean_t log π(o_t))`` (geometric-mean token probability); ``mean``: mean_t π(o_t)."""
    if not logp:
        return 0.0
    if mode == "geo":
        return math.exp(sum(logp) / len(logp))
    if mode == "mean":
        return sum(math.exp(v) for v in logp) / len(logp)
    raise InvalidValueError(f"confidence must be 'geo' or 'mean', got {mode!r}")


def _quantile(sorted_vals: list[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default) of an ascending list."""
    pos = q * (len(sorted_vals) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_vals) - 1)
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (pos - lo)


def mid_confidence_gate(
    conf: list[float], *, mode: str = "quantile", low: float = 0.2, high: float = 0.8
) -> list[bool]:
    """NexGRPO mid-confidence gating (proposed design): keep ``c`` with ``lo ≤ c ≤ hi``, where
    ``quantile`` mode takes ``lo, hi`` = the ``low`` / ``high`` quantiles of ``conf`` (drops the bottom
    and top shares of the pool) and ``absolute`` mode takes them as given; ``none`` keeps everything."""
    if mode == "none" or not conf:
        return [True] * len(conf)
    if not 0 <= low <= high:
        raise InvalidValueError(f"gate: need 0 <= low <= high, got low={low}, high={high}")
    if mode == "quantile":
        if high > 1:
            raise InvalidValueError(f"gate 'quantile': high must be <= 1, got {high}")
        s = sorted(conf)
        lo, hi = _quantile(s, low), _quantile(s, high)
    elif mode == "absolute":
        lo, hi = low, high
    else:
        raise InvalidValueError(f"gate must be one of {', '.join(_GATES)}, got {mode!r}")
    return [lo <= c <= hi for c in conf]


def middle_by_rank(conf: list[float], *, low: float = 0.2, high: float = 0.8) -> list[bool]:
    """Nearest-rank mid-confidence gate of one question's failures (posttrain's design, not in the
    NexGRPO abstract or ExGRPO): sorted by confidence (ties by position), the lowest
    ``d = ⌊low·n + ½⌋`` are dropped and the next ``m = max(1, ⌊(high − low)·n + ½⌋)`` kept (``d`` capped
    at ``n − m``; the rest, the most confident, dropped). ``m`` never falls as ``n`` grows (0.2 / 0.8 keep
    1, 1, 2, 2, 3, 4, 4, 5 of 1..8), where inclusive linear-interpolation quantile bounds keep 1, 0, 1,
    2, 3, 4, 3, 4. ``low = 0, high = 1`` keeps everything."""
    n = len(conf)
    if n == 0:
        return []
    if not 0 <= low <= high <= 1:
        raise InvalidValueError(f"gate: need 0 <= low <= high <= 1, got low={low}, high={high}")
    keep_n = max(1, math.floor((high - low) * n + 0.5))
    drop_lo = min(math.floor(low * n + 0.5), n - keep_n)
    order = sorted(range(n), key=lambda i: (conf[i], i))
    kept = set(order[drop_lo : drop_lo + keep_n])
    return [i in kept for i in range(n)]


def boundary_similarity(fail_emb: torch.Tensor, ok_emb: torch.Tensor) -> torch.Tensor:
    """``s(o) = max_{o+} cos(e(o), e(o+))`` for each failure row (n, d) against correct rows (m, d)."""
    if ok_emb.numel() == 0:
        return torch.zeros(fail_emb.shape[0], dtype=torch.float64)
    a = torch.nn.functional.normalize(fail_emb.double(), dim=-1)
    b = torch.nn.functional.normalize(ok_emb.double(), dim=-1)
    return (a @ b.T).max(dim=1).values


def select_indices(
    scores: list[float], k: int, *, mode: str = "softmax", temperature: float = 0.1, rng: random.Random
) -> list[int]:
    """``k`` distinct indices: ``topk`` the largest scores (ties by index), ``softmax`` sampled without
    replacement with ``p ∝ exp(s / T)``, ``uniform`` uniformly, ``confident`` the largest too."""
    n = len(scores)
    k = min(k, n)
    if k <= 0:
        return []
    if mode in ("topk", "confident"):
        return sorted(range(n), key=lambda i: (-scores[i], i))[:k]
    if mode == "uniform":
        return rng.sample(range(n), k)
    if mode != "softmax":
        raise InvalidValueError(f"select must be one of {', '.join(_SELECT)}, got {mode!r}")
    left, out = list(range(n)), []
    for _ in range(k):
        m = max(scores[i] for i in left)
        w = [math.exp((scores[i] - m) / temperature) for i in left]
        j = rng.choices(range(len(left)), weights=w)[0]
        out.append(left.pop(j))
    return out


def replay_is_weights(
    logp: torch.Tensor,
    logp_past: torch.Tensor,
    mask: torch.Tensor,
    *,
    mode: str = "clip",
    clip: float = 10.0,
    beta: float = 0.1,
) -> torch.Tensor:
    """Per-token importance weights of replayed tokens from ``w = exp(logp − logp_past)`` (logp
    detached): ``clip`` → ``min(w, clip)``; ``shape`` → ``w/(w+β)``; ``shape-grad`` → ``β·w/(w+β)²``
    (ExGRPO, arXiv:2510.02245, policy shaping). 1 outside ``mask``."""
    w = torch.exp((logp.detach() - logp_past).clamp(-20, 20))
    if mode == "clip":
        w = w.clamp(max=clip)
    elif mode == "shape":
        w = w / (w + beta)
    elif mode in ("shape-grad", "exgrpo"):  # exgrpo: ExGRPO's f(w) = w/(w+β) as its gradient weight
        w = beta * w / (w + beta) ** 2
    else:
        raise InvalidValueError(f"is_mode must be one of {', '.join(_IS_MODES)}, got {mode!r}")
    return torch.where(mask.bool(), w, torch.ones_like(w))


def standardise(scores: list[float], min_std: float = 1e-12) -> list[float]:
    """``(s − mean) / max(std, min_std)`` over one question's candidates (population std), so the
    softmax temperature acts on the spread WITHIN a question, not on raw cosines that all sit near 1.

    What a z-score is: it erases the size of the gap (two candidates are always ±1, so at T = 0.1 the
    higher one is picked with odds e^20 whatever the gap): with a small T, ``zscore`` boundary sampling
    is close to **top-1 by rank**. The floor ``min_std`` (``zscore_min_std``, posttrain's design, not in
    the NexGRPO abstract) keeps the gap's size where the spread is below it: the scores are then divided
    by ``min_std``, a fixed scale, so a gap of 1e-6 gives z ≈ ±5e-4 (a near-uniform draw), and the draw
    sharpens continuously as the spread grows to ``min_std`` (no cliff)."""
    if len(scores) < 2:
        return [0.0] * len(scores)
    m = sum(scores) / len(scores)
    sd = math.sqrt(sum((x - m) ** 2 for x in scores) / len(scores))
    scale = max(sd, min_std)
    return [0.0] * len(scores) if scale < 1e-12 else [(x - m) / scale for x in scores]


def token_edit_distance(a: list[int], b: list[int]) -> float:
    """Levenshtein distance of two token-id lists divided by the longer length (0 = identical)."""
    if not a and not b:
        return 0.0
    prev = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        cur = [i] + [0] * len(b)
        for j, y in enumerate(b, 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x != y))
        prev = cur
    return prev[-1] / max(len(a), len(b))


def acc_weight(acc: float, sigma: float) -> float:
    """ExGRPO's question-sampling weight: the density of N(0.5, σ) at Acc(q) (unnormalised)."""
    return math.exp(-0.5 * ((acc - 0.5) / sigma) ** 2)


# -------------------------------------------------------------------------------------- embeddings
@EMBEDDERS.register("policy-mean")
def policy_mean_hidden(
    policy: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, score_mask: torch.Tensor
) -> torch.Tensor:
    """Mean over the completion tokens of the policy's last hidden state (no gradient)."""
    from posttrain.models.logprobs import _hidden_and_head, position_ids_from_attention_mask

    run, _, _ = _hidden_and_head(policy.model)
    with torch.no_grad():
        h = run(input_ids, attention_mask, position_ids_from_attention_mask(attention_mask))
    m = score_mask.to(h.dtype)[..., None]
    return ((h * m).sum(1) / m.sum(1).clamp(min=1)).float().cpu()


@EMBEDDERS.register("token-bag")
def token_bag(
    policy: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    score_mask: torch.Tensor,
    dim: int = 256,
) -> torch.Tensor:
    """Normalised counts of the completion's token ids hashed into ``dim`` buckets (no model call)."""
    out = torch.zeros(input_ids.shape[0], dim)
    ids = (input_ids % dim).long()
    out.scatter_add_(1, ids, score_mask.float())
    return out / out.sum(1, keepdim=True).clamp(min=1)


# ------------------------------------------------------------------------------------------ buffer
def _qid(example: Any) -> str:
    return str(getattr(example, "id", None) or getattr(example, "prompt", example))


def entry_bytes(e: dict[str, Any]) -> int:
    """Memory estimate of one stored entry: 8 bytes per stored number plus 64."""
    n = len(e["ids"]) + len(e["logp"]) + len(e.get("emb") or []) + len(e.get("mask") or [])
    n += sum(len(v) if isinstance(v, list) else 1 for v in e.get("adv", {}).values())
    return 8 * n + 64


class ExperienceReplay(ReplayBuffer):
    """Shared store of the ``nexgrpo``, ``random-failure`` and ``success`` buffers (module docstring).

    ``store``: ``failures`` or ``successes``; ``gate`` / ``select`` / ``embedding`` pick the
    variant. Every threshold is a parameter (the NexGRPO ones are proposed-design placeholders)."""

    needs_logprobs = True
    store_kind = "failures"
    defaults: dict[str, Any] = {}

    def __init__(self, **params: Any) -> None:
        p = {**_BASE_DEFAULTS, **self.defaults, **params}
        self.validate_params(p)
        self.p = p
        self.records: dict[str, dict[str, Any]] = {}  # qid -> {example, acc, fail: [...], ok: [...]}
        self.started = False
        self.seq = 0  # insertion counter (eviction order)
        self.totals = {
            "stored": 0,
            "evicted": 0,
            "retired": 0,
            "replayed": 0,
            "near_miss": 0,
            "near_miss_measured": 0,
        }
        self.policy: Any = None
        self._chosen: set[str] = set()
        self._bounds: tuple[float, float] | None = None
        self._last: dict[str, float] = {}

    @classmethod
    def validate_params(cls, params: dict[str, Any]) -> None:
        p = {**_BASE_DEFAULTS, **cls.defaults, **params}
        unknown = sorted(set(p) - set(_BASE_DEFAULTS))
        if unknown:
            raise InvalidValueError(
                f"unknown parameter(s) {', '.join(unknown)}; accepted: {', '.join(_BASE_DEFAULTS)}"
            )
        if not (isinstance(p["ratio"], int | float) and 0 <= p["ratio"] <= 1):
            raise InvalidValueError(f"ratio must lie in [0, 1], got {p['ratio']!r}")
        for key in ("per_group", "max_per_question", "max_correct_per_question", "max_entries", "max_bytes"):
            if not (isinstance(p[key], int) and p[key] >= 1):
                raise InvalidValueError(f"{key} must be an integer >= 1, got {p[key]!r}")
        if not (isinstance(p["start_step"], int) and p["start_step"] >= 0):
            raise InvalidValueError(f"start_step must be an integer >= 0, got {p['start_step']!r}")
        if not (isinstance(p["start_accuracy"], int | float) and 0 <= p["start_accuracy"] <= 1):
            raise InvalidValueError(f"start_accuracy must lie in [0, 1], got {p['start_accuracy']!r}")
        if p["gate"] not in _GATES:
            raise InvalidValueError(f"gate must be one of {', '.join(_GATES)}, got {p['gate']!r}")
        if not 0 <= p["gate_low"] <= p["gate_high"] or (p["gate"] == "quantile" and p["gate_high"] > 1):
            raise InvalidValueError(
                f"gate_low / gate_high: need 0 <= low <= high (<= 1 for quantiles), got {p['gate_low']}, {p['gate_high']}"
            )
        if p["gate_scope"] not in _GATE_SCOPES:
            raise InvalidValueError(
                f"gate_scope must be one of {', '.join(_GATE_SCOPES)}, got {p['gate_scope']!r}"
            )
        if p["similarity"] not in _SIMILARITY:
            raise InvalidValueError(
                f"similarity must be one of {', '.join(_SIMILARITY)}, got {p['similarity']!r}"
            )
        if not (isinstance(p["near_miss_distance"], int | float) and 0 <= p["near_miss_distance"] <= 1):
            raise InvalidValueError(f"near_miss_distance must lie in [0, 1], got {p['near_miss_distance']!r}")
        if p["select"] not in _SELECT:
            raise InvalidValueError(f"select must be one of {', '.join(_SELECT)}, got {p['select']!r}")
        if p["is_mode"] not in _IS_MODES:
            raise InvalidValueError(f"is_mode must be one of {', '.join(_IS_MODES)}, got {p['is_mode']!r}")
        for key in ("temperature", "is_clip", "is_beta", "sigma"):
            if not (isinstance(p[key], int | float) and p[key] > 0):
                raise InvalidValueError(f"{key} must be a number > 0, got {p[key]!r}")
        if not (isinstance(p["gate_min_pool"], int) and p["gate_min_pool"] >= 1):
            raise InvalidValueError(f"gate_min_pool must be an integer >= 1, got {p['gate_min_pool']!r}")
        if not (isinstance(p["zscore_min_std"], int | float) and p["zscore_min_std"] >= 0):
            raise InvalidValueError(f"zscore_min_std must be a number >= 0, got {p['zscore_min_std']!r}")
        if p["confidence"] not in ("geo", "mean"):
            raise InvalidValueError(f"confidence must be 'geo' or 'mean', got {p['confidence']!r}")
        if p["embedding"] is not None:
            EMBEDDERS.get(p["embedding"])  # unknown names fail at config time

    def bind(self, run: RunInfo) -> None:
        self.policy = run.policy

    # -- store ----------------------------------------------------------------------------------
    def observe(self, episodes: Any, rewards: torch.Tensor, correct: torch.Tensor, step: int) -> None:
        b = episodes.batch
        fresh = ~episodes.replayed.cpu()
        if not bool(fresh.any()):
            return
        ok = correct.cpu().bool()
        batch_acc = float(ok[fresh].float().mean())
        if not self.started and batch_acc > self.p["start_accuracy"] and step + 1 >= self.p["start_step"]:
            self.started = True
        if b.logprobs is None:
            raise InvalidValueError(
                "hooks.replay: the episodes carry no sampling log-probs (needed as logp_past)"
            )
        gids = b.group_ids.cpu()
        keep_rows: list[int] = []
        for g in torch.unique(gids[fresh]).tolist():
            rows = ((gids == g) & fresh).nonzero().flatten().tolist()
            ex = episodes.examples[rows[0]]
            q = _qid(ex)
            acc = float(ok[rows].float().mean())
            if acc >= 1.0:  # solved: retire the question (eviction)
                if self.records.pop(q, None) is not None:
                    self.totals["retired"] += 1
                continue
            if acc <= 0.0:
                if q in self.records:
                    self.records[q]["acc"] = acc
                continue
            rec = self.records.setdefault(q, {"example": ex, "acc": acc, "fail": [], "ok": []})
            rec["acc"] = acc
            keep_rows += rows
        if not keep_rows:
            self._enforce_caps()
            return
        emb = self._embed(b, keep_rows)
        lp = b.logprobs.detach().cpu()
        lengths = b.lengths.cpu()
        am = b.action_mask.cpu() if b.action_mask is not None else None
        for j, i in enumerate(keep_rows):
            n = int(lengths[i])
            logp = [float(v) for v in lp[i, :n]]
            act = [int(v) for v in am[i, :n]] if am is not None else [1] * n
            scored = [v for v, a in zip(logp, act, strict=True) if a]
            e = {
                "ids": [int(t) for t in b.completion_ids[i, :n]],
                "logp": logp,
                "finish": b.finish_reasons[i],
                "mask": None if all(act) else act,
                "adv": _row_inputs(episodes.advantage_inputs, i, n),
                "conf": sequence_confidence(scored, self.p["confidence"]),
                "emb": None if emb is None else [float(v) for v in emb[j]],
                "step": step,
                "seq": self.seq,
            }
            self.seq += 1
            rec = self.records[_qid(episodes.examples[i])]
            is_ok = bool(ok[i])
            # failure stores keep the group's correct solutions too (never replayed): boundary scoring
            # compares embeddings with them, the near-miss metric compares tokens
            if not is_ok and self.store_kind == "successes":
                continue
            bucket = "ok" if is_ok else "fail"
            rec[bucket].append(e)
            self.totals["stored"] += 1
            cap = self.p["max_per_question"] if bucket == "fail" else self.p["max_correct_per_question"]
            if len(rec[bucket]) > cap:
                self.totals["evicted"] += len(rec[bucket]) - cap
                del rec[bucket][: len(rec[bucket]) - cap]
        self._enforce_caps()

    def _embed(self, batch: Any, rows: list[int]) -> torch.Tensor | None:
        name = self.p["embedding"]
        if name is None:
            return None
        fn = EMBEDDERS.get(name)
        if name == "policy-mean" and self.policy is None:
            raise InvalidValueError(
                "hooks.replay: embedding 'policy-mean' needs the policy (bind() was not called)"
            )
        ids, attn, score = batch.select(rows).model_inputs()
        dev = self.policy.device if self.policy is not None else ids.device
        return fn(self.policy, ids.to(dev), attn.to(dev), score.to(dev))

    def _entries(self) -> list[tuple[str, str, dict[str, Any]]]:
        return [(q, k, e) for q, r in self.records.items() for k in ("fail", "ok") for e in r[k]]

    def total_bytes(self) -> int:
        return sum(entry_bytes(e) for _, _, e in self._entries())

    def _enforce_caps(self) -> None:
        entries = sorted(self._entries(), key=lambda t: t[2]["seq"])
        size = sum(entry_bytes(e) for _, _, e in entries)
        n, drop = len(entries), 0
        while drop < n and (n - drop > self.p["max_entries"] or size > self.p["max_bytes"]):
            q, k, e = entries[drop]
            self.records[q][k].remove(e)
            size -= entry_bytes(e)
            drop += 1
        self.totals["evicted"] += drop
        for q in [q for q, r in self.records.items() if not r["fail"] and not r["ok"]]:
            del self.records[q]

    # -- replay ---------------------------------------------------------------------------------
    def gate_bounds(self, q: str | None = None) -> tuple[float, float]:
        """``[lo, hi]`` of the mid-confidence gate by value: the ``gate_low`` / ``gate_high`` quantiles
        (linear interpolation) of the whole failure pool (``gate_scope: pool``, and the fallback of a
        question with fewer than ``gate_min_pool`` failures under ``gate_scope: question``; ``q`` is
        unused: a question with enough failures of its own is gated by rank, :meth:`candidates`).
        Fewer than ``gate_min_pool`` failures in the whole pool: an empty band (nothing yet)."""
        if self.p["gate"] == "none":
            return -math.inf, math.inf
        if self.p["gate"] == "absolute":
            return self.p["gate_low"], self.p["gate_high"]
        s = sorted(e["conf"] for r in self.records.values() for e in r["fail"])
        if len(s) < self.p["gate_min_pool"]:  # too few failures anywhere to tell mid-confidence from noise
            return math.inf, -math.inf
        return _quantile(s, self.p["gate_low"]), _quantile(s, self.p["gate_high"])

    def candidates(self, q: str, bounds: tuple[float, float] | None = None) -> list[dict[str, Any]]:
        """The entries of question ``q`` that may be replayed (failures: those the gate keeps).

        ``gate: quantile, gate_scope: question`` (default; posttrain's design): a question with at least
        ``gate_min_pool`` failures keeps its own middle by rank (:func:`middle_by_rank`: the kept count
        never falls as the question's failures grow); one with fewer is gated by the whole pool's
        quantile bounds (:meth:`gate_bounds`), none while the whole pool is smaller. ``bounds``: the
        pool's bounds when the caller already has them."""
        rec = self.records.get(q)
        if rec is None:
            return []
        if self.store_kind == "successes":
            return list(rec["ok"])
        fails = rec["fail"]
        own = self.p["gate"] == "quantile" and self.p["gate_scope"] == "question"
        if own and len(fails) >= self.p["gate_min_pool"]:
            keep = middle_by_rank(
                [e["conf"] for e in fails], low=self.p["gate_low"], high=self.p["gate_high"]
            )
            return [e for e, k in zip(fails, keep, strict=True) if k]
        lo, hi = self.gate_bounds() if bounds is None else bounds
        return [e for e in fails if lo <= e["conf"] <= hi]

    def pick(self, q: str, k: int, rng: random.Random) -> list[dict[str, Any]]:
        """``k`` entries of ``q`` by the buffer's selection rule (boundary sampling for ``nexgrpo``)."""
        cands = self.candidates(q, self._bounds)
        mode = self.p["select"]
        if mode in ("softmax", "topk"):
            ok = [e["emb"] for e in self.records[q]["ok"] if e.get("emb") is not None]
            fails = [e["emb"] for e in cands]
            if not ok or any(f is None for f in fails):
                mode = "uniform"  # no correct solution left to compare with
                scores = [0.0] * len(cands)
            else:
                scores = boundary_similarity(torch.tensor(fails), torch.tensor(ok)).tolist()
                if self.p["similarity"] == "zscore":
                    scores = standardise(scores, self.p["zscore_min_std"])
        else:
            scores = [e["conf"] for e in cands]
        idx = select_indices(scores, k, mode=mode, temperature=self.p["temperature"], rng=rng)
        return [cands[i] for i in idx]

    def mix(self, plan: PromptPlan, step: int) -> PromptPlan:
        self._chosen = set()
        self._last = {"replay_groups": 0.0}
        if not self.started or step < self.p["start_step"] or self.p["ratio"] <= 0:
            return plan
        want = math.floor(self.p["ratio"] * len(plan.examples))
        self._bounds = self.gate_bounds()
        eligible = {q for q in self.records if self.candidates(q, self._bounds)}
        if want <= 0 or not eligible:
            return plan
        rng = random.Random(f"{self.p['seed']}:mix:{step}")
        in_plan = [i for i, ex in enumerate(plan.examples) if _qid(ex) in eligible]
        chosen = in_plan[:want]
        examples = list(plan.examples)
        others = sorted(eligible - {_qid(examples[i]) for i in chosen} - {_qid(e) for e in examples})
        need = want - len(chosen)
        if need > 0 and others:
            w = [acc_weight(self.records[q]["acc"], self.p["sigma"]) for q in others]
            picked: list[str] = []
            while others and len(picked) < need:
                j = rng.choices(range(len(others)), weights=w)[0]
                picked.append(others.pop(j))
                w.pop(j)
            free = [i for i in reversed(range(len(examples))) if i not in chosen]
            for i, q in zip(free, picked, strict=False):
                examples[i] = self.records[q]["example"]
                chosen.append(i)
        self._chosen = {_qid(examples[i]) for i in chosen}
        self._last["replay_groups"] = float(len(self._chosen))
        return PromptPlan(examples, list(plan.n_per_prompt))

    def draw(self, plan: PromptPlan, step: int) -> list[list[Trajectory]]:
        out: list[list[Trajectory]] = []
        rng = random.Random(f"{self.p['seed']}:draw:{step}")
        n_traj = n_near = measured = 0
        done: set[str] = set()
        for ex, size in zip(plan.examples, plan.n_per_prompt, strict=True):
            q = _qid(ex)
            if q not in self._chosen or q in done or size < 2:
                out.append([])
                continue
            done.add(q)
            picked = self.pick(q, min(self.p["per_group"], size - 1), rng)
            if self.store_kind == "failures":
                for e in picked:
                    near = self.near_miss(q, e)
                    if near is not None:
                        measured += 1
                        n_near += int(near)
            trajs = [_trajectory(e) for e in picked]
            n_traj += len(trajs)
            out.append(trajs)
        self.totals["replayed"] += n_traj
        self.totals["near_miss"] += n_near
        self.totals["near_miss_measured"] += measured
        self._last["replayed_trajectories"] = float(n_traj)
        if measured:
            self._last["near_miss_rate"] = n_near / measured
        return out

    def near_miss(self, q: str, entry: dict[str, Any]) -> bool | None:
        """Whether a stored failure is a near miss: its token edit distance to the closest stored
        correct solution of the same question is at most ``near_miss_distance`` (of the longer
        length). None when the question has no stored correct solution."""
        oks = self.records.get(q, {}).get("ok", [])
        if not oks:
            return None
        d = min(token_edit_distance(entry["ids"], o["ids"]) for o in oks)
        return d <= self.p["near_miss_distance"]

    def is_weights(self, logp: torch.Tensor, logp_past: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return replay_is_weights(
            logp, logp_past, mask, mode=self.p["is_mode"], clip=self.p["is_clip"], beta=self.p["is_beta"]
        )

    def metrics(self) -> dict[str, float]:
        fails = sum(len(r["fail"]) for r in self.records.values())
        oks = sum(len(r["ok"]) for r in self.records.values())
        out = {
            "questions": float(len(self.records)),
            "failures": float(fails),
            "successes": float(oks),
            "bytes": float(self.total_bytes()),
            "started": float(self.started),
            **{f"{k}_total": float(v) for k, v in self.totals.items()},
            **self._last,
        }
        if self.store_kind == "failures" and fails:
            bounds = self.gate_bounds()
            out["gated_frac"] = sum(len(self.candidates(q, bounds)) for q in self.records) / fails
        if self.totals["near_miss_measured"]:
            out["near_miss_rate_total"] = self.totals["near_miss"] / self.totals["near_miss_measured"]
        return out

    # -- checkpoint -----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "records": {q: {**r, "example": _example_state(r["example"])} for q, r in self.records.items()},
            "started": self.started,
            "seq": self.seq,
            "totals": dict(self.totals),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        from posttrain.tasks.base import Example

        self.records = {}
        for q, r in state.get("records", {}).items():
            ex = r["example"]
            example = Example(**ex) if isinstance(ex, dict) else ex
            self.records[q] = {"example": example, "acc": float(r["acc"]), "fail": r["fail"], "ok": r["ok"]}
        self.started = bool(state.get("started", False))
        self.seq = int(state.get("seq", 0))
        self.totals.update({k: int(v) for k, v in state.get("totals", {}).items()})


_BASE_DEFAULTS: dict[str, Any] = {
    "ratio": 0.5,  # ρ: share of groups that carry replayed trajectories (ExGRPO)
    "per_group": 1,  # k: replayed trajectories per replay group
    "start_accuracy": 0.35,  # delayed start: batch Pass@1 above this (ExGRPO)
    "start_step": 0,  # and at least this many steps done
    "gate": "quantile",  # mid-confidence gate: quantile | absolute | none
    "gate_low": 0.2,
    "gate_high": 0.8,
    "gate_scope": "question",  # quantiles per question (question) or over the whole pool (pool)
    # posttrain's design (not in NexGRPO or ExGRPO): quantiles of fewer than this many failures do not
    # gate (1 failure is its own 0.2 and 0.8 quantile; 2 leave none inside); a question with fewer
    # failures falls back to the whole failure pool's quantile bounds, a smaller whole pool keeps
    # nothing yet; a question with this many or more keeps its middle by rank (count never falls)
    "gate_min_pool": 5,
    "confidence": "geo",  # geo: exp(mean log π); mean: mean π
    "embedding": "policy-mean",  # boundary sampling embedding (None: none); plug-in module:fn
    "select": "softmax",  # softmax | topk | uniform | confident
    "temperature": 0.1,  # T of the softmax over similarities
    # zscore: standardised within the question (with T 0.1 close to top-1 BY RANK: z erases the gap's
    # size); raw: max cosine as is
    "similarity": "zscore",
    # posttrain's design (not in the NexGRPO abstract): z = (s - mean) / max(std, this), so a spread
    # below this (cosine units) is not blown up to ±1: a 1e-6 gap draws near-uniformly, not by rank
    "zscore_min_std": 1e-3,
    "near_miss_distance": 0.2,  # a failure within this token edit distance of a correct one is a near miss
    "sigma": 1.0,  # question sampling p ∝ N(Acc; 0.5, σ) (ExGRPO)
    "is_mode": "clip",  # clip | shape | shape-grad
    "is_clip": 10.0,
    "is_beta": 0.1,  # β of f(w) = w / (w + β) (ExGRPO)
    "max_per_question": 8,  # stored entries per question (each kind)
    "max_correct_per_question": 4,
    "max_entries": 4096,  # whole store
    "max_bytes": 64 * 2**20,
    "seed": 0,
}


def _example_state(ex: Any) -> Any:
    if dataclasses.is_dataclass(ex) and not isinstance(ex, type):
        return dataclasses.asdict(ex)
    return ex


def _row_inputs(inputs: dict[str, Any], i: int, n: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in (inputs or {}).items():
        t = v[i] if isinstance(v, torch.Tensor) else torch.as_tensor(v[i])
        out[k] = float(t) if t.dim() == 0 else [float(x) for x in t[:n]]
    return out


def _trajectory(e: dict[str, Any]) -> Trajectory:
    return Trajectory(
        completion_ids=list(e["ids"]),
        logp_past=list(e["logp"]),
        finish_reason=e["finish"],
        action_mask=e["mask"],
        advantage_inputs=dict(e["adv"]),
    )


@REPLAY_BUFFERS.register("nexgrpo")
class NexGRPOReplay(ExperienceReplay):
    """NexGRPO failure replay, **proposed design** (2026.acl-long.1682 abstract + ExGRPO): mid-confidence
    gate (quantile 0.2 / 0.8), boundary failure sampling (softmax T = 0.1 over max cosine similarity to
    the question's correct solutions, policy mean-pooled last hidden state), ρ = 0.5, k = 1, start at
    batch accuracy > 0.35, clipped π_θ/π_past weights."""

    store_kind = "failures"
    defaults = {"gate": "quantile", "select": "softmax", "embedding": "policy-mean"}


@REPLAY_BUFFERS.register("random-failure")
class RandomFailureReplay(ExperienceReplay):
    """Uniform replay of stored failures (no gate, no similarity): NexGRPO's negative baseline."""

    store_kind = "failures"
    defaults = {"gate": "none", "select": "uniform", "embedding": None}


@REPLAY_BUFFERS.register("success")
class SuccessReplay(ExperienceReplay):
    """ExGRPO-style replay of correct trajectories of partially solved questions (arXiv:2510.02245)."""

    store_kind = "successes"
    defaults = {"gate": "none", "select": "confident", "embedding": None}
