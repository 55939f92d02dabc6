"""APARL: perplexity-aware dual-loop curriculum (proposed design).

Source: APARL, "Adaptive Perplexity-Aware Reinforcement Learning" for abnormal-event detection in
customer-service dialogues (arXiv:2507.01327, EMNLP 2025 Industry). The abstract states a dual-loop
dynamic curriculum that moves to harder samples as the model improves, with perplexity-aware sampling;
it gives no perplexity definition, schedule or thresholds, so the rule below is a **proposed design**
and every threshold is a parameter.

* **Inner loop** (every step): DAPO dynamic sampling (arXiv:2503.14476 §3.3), the core group filter
  ``hooks.filter: {name: dynamic-sampling, params: {max_rounds, oversample}}``
  (:class:`~posttrain.hooks.filters.DynamicSamplingFilter`): groups whose rewards are all equal are
  dropped and, while fewer than ``rollout.prompts_per_step`` groups are kept, another round is drawn
  (at most ``max_rounds``; ``max_rounds: 1`` = drop only). The recipe's YAMLs set it beside the
  sampler; until 0.2.0 the sampler brought it itself (``max_rounds`` / ``oversample`` in
  ``hooks.sampler.params``, now refused with a message saying where they went).
* **Outer loop** (every ``stage_steps`` steps; default ``null`` = one pass over the pool, the
  *current* pool (``stage_pool: current``, default) or the original one (``stage_pool: original``,
  the behaviour before the 2026-12-01 fixes)): the policy's perplexity of the task's **reference completion**
  given the prompt (``target: reference``, :meth:`Task.reference_completion` with ``reference_style``;
  on scratchpad arithmetic that is the reasoning lines plus ``#### answer``, what the policy writes),
  ``PPL(x) = exp(−mean_t log π(y*_t | x))`` (completion tokens + EOS, temperature 1);
  ``target: answer`` scores the bare gold answer string (the behaviour before the 2026-12-01 fixes, only right where
  the completion IS the answer, e.g. a label). For every item still in the pool, computed in batches of
  ``batch_size`` rows through the model adapter's chunked log-probs
  (:func:`posttrain.models.sequence_logprobs`); the cost (seconds, rows, tokens) is logged as
  ``sampler/ppl_*``. Items with ``PPL ≤ saturated_ppl`` or whose latest group was all correct are
  **saturated** and leave the pool for good (never below ``min_pool`` items). The next stage samples
  prompts with

      p(x) ∝ 1[q(x) ≥ q_lo] · PPL(x)^γ,     q_lo = min(level · quantile_step, max_quantile)

  where ``q(x)`` is x's perplexity rank in the pool scaled to [0, 1] (0 = lowest PPL). ``level``
  starts at 0 and rises by one at each stage boundary where the accuracy signal is ≥ the threshold.
  Signals (``accuracy_source``, all proposed design):

  - ``heldout``: the held-out accuracy of the trainer's latest evaluation (``eval.every``; before the
    first evaluation the training accuracy of the last stage);
  - ``train``: the mean accuracy over EVERY group sampled in the stage, in every sampling round
    (before the 2026-12-01 fixes only the groups DAPO kept, 0 < acc < 1, which pulls the signal toward 0.5);
  - ``minibatch``: per-step Monte-Carlo proficiency, the mean accuracy of the groups sampled in the
    latest ``signal_window`` steps (every round). A third-party summary of the paper describes the
    schedule this way; here the level is checked after EVERY step (perplexities are still re-scored
    only at stage boundaries).

  Threshold: ``shift_accuracy`` (absolute; 0.6 is our placeholder, the paper gives none) or, with
  ``shift_margin`` set, relative: ``baseline + shift_margin`` where ``baseline`` is the signal at the
  first check of the current level (re-taken after every level change), so the threshold follows
  the warm start's own signal. So the pool shifts toward higher perplexity as accuracy rises.

  Every sampling round's groups reach the sampler (``observe_round``: the loop reports them before the
  group filter drops any), so ``drop_solved`` sees the all-correct groups DAPO drops.

Example: reference-completion log-probs [−0.1, −0.5, −0.3] → PPL = exp(0.3) = 1.3499 (:func:`perplexity`).
"""

from __future__ import annotations

import math
import random
import time
from typing import Any

import torch

from posttrain.hooks.base import SAMPLERS, GroupOutcome, PromptPlan, RunInfo, UniformSampler
from posttrain.models.logprobs import pad_right
from posttrain.utils.errors import InvalidValueError


# ------------------------------------------------------------------------------------ pure functions
def perplexity(logps: list[float]) -> float:
    """``exp(−mean(logps))``."""
    if not logps:
        raise InvalidValueError("perplexity: no tokens")
    return math.exp(-sum(logps) / len(logps))


def quantile_floor(level: int, quantile_step: float, max_quantile: float) -> float:
    """``q_lo = min(level · quantile_step, max_quantile)``."""
    return min(level * quantile_step, max_quantile)


def next_level(level: int, accuracy: float | None, shift_accuracy: float, max_level: int) -> int:
    """The curriculum level after a stage: one up when ``accuracy ≥ shift_accuracy`` (capped)."""
    if accuracy is not None and accuracy >= shift_accuracy - 1e-12:
        return min(level + 1, max_level)
    return level


def aparl_weights(ppl: dict[str, float], *, gamma: float = 1.0, quantile_lo: float = 0.0) -> dict[str, float]:
    """Sampling probabilities ``p(x) ∝ 1[q(x) ≥ q_lo] · PPL(x)^γ`` (q = perplexity rank scaled to
    [0, 1], ties broken by id); they sum to 1 over the items kept."""
    if not ppl:
        return {}
    order = sorted(ppl, key=lambda k: (ppl[k], k))
    n = len(order)
    q = {k: (i / (n - 1) if n > 1 else 1.0) for i, k in enumerate(order)}
    raw = {k: ppl[k] ** gamma for k in order if q[k] >= quantile_lo - 1e-12}
    s = sum(raw.values())
    return {k: v / s for k, v in raw.items()}


def gold_perplexities(
    policy: Any,
    encode_prompt: Any,
    examples: list[Any],
    *,
    batch_size: int = 64,
    chunk_size: int = 1024,
    target: Any = None,
) -> tuple[list[float], int]:
    """PPL of each example's target text (+ EOS) after its prompt under ``policy`` (a model adapter),
    in right-padded batches, no gradient. ``target(example) -> str`` (None = ``example.answer``; the
    sampler passes the task's reference completion). Returns (perplexities, target tokens scored)."""
    tok = policy.tokenizer
    eos = tok.eos_token_id
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    out: list[float] = []
    tokens = 0
    was_training = policy.model.training
    policy.model.eval()
    try:
        for start in range(0, len(examples), batch_size):
            part = examples[start : start + batch_size]
            rows = []
            for ex in part:
                p = list(encode_prompt(ex.prompt))
                text = str(ex.answer) if target is None else str(target(ex))
                a = [int(t) for t in tok.encode(text, add_special_tokens=False)]
                if eos is not None:
                    a.append(int(eos))
                rows.append((p, a))
            ids, attn, score = pad_right(
                [p + a for p, a in rows], pad, [[0] * len(p) + [1] * len(a) for p, a in rows]
            )
            dev = policy.device
            with torch.no_grad():
                lp, _ = policy.logprobs(ids.to(dev), attn.to(dev), score.to(dev), chunk_size=chunk_size)
            lp = lp.float().cpu()
            for i in range(len(rows)):
                m = score[i].bool()
                out.append(math.exp(-float(lp[i][m].mean())))
                tokens += int(m.sum())
    finally:
        policy.model.train(was_training)
    return out, tokens


def _qid(example: Any) -> str:
    return str(getattr(example, "id", None) or getattr(example, "prompt", example))


# ------------------------------------------------------------------------------------------ sampler
class _CurriculumDraw(UniformSampler):
    """Draws prompts from the curriculum's weights (the uniform pass until a policy is bound)."""

    def plan(self, step: int, num_prompts: int, group_size: int) -> PromptPlan:
        self._round += 1
        weights = self.weights
        if not weights:  # no policy bound (outside the trainer): the uniform pass
            return super().plan(step, num_prompts, group_size)
        rng = random.Random(f"aparl:{self.seed}:{step}:{self._round}")
        ids, w = list(weights), list(weights.values())
        picked: list[str] = []
        while len(picked) < num_prompts:  # without replacement; a pass over a small pool repeats
            left_ids, left_w = list(ids), list(w)
            while left_ids and len(picked) < num_prompts:
                j = rng.choices(range(len(left_ids)), weights=left_w)[0]
                picked.append(left_ids.pop(j))
                left_w.pop(j)
        exs = [self.by_id[q] for q in picked]
        self._sampled_ppl = [self.ppl[q] for q in picked]
        return PromptPlan(exs, [group_size] * num_prompts)


ACCURACY_SOURCES = ("heldout", "train", "minibatch")
#: The inner loop's parameters, the sampler's until 0.2.0, now ``hooks.filter``'s (dynamic-sampling).
REMOVED_PARAMS = ("max_rounds", "oversample")
TARGETS = ("reference", "answer")
STAGE_POOLS = ("current", "original")


@SAMPLERS.register("aparl")
class APARLSampler(_CurriculumDraw):
    """APARL dual-loop curriculum, **proposed design** (module docstring): this sampler is the outer
    loop; the inner loop is the core ``dynamic-sampling`` group filter (``hooks.filter``), whose every
    round's groups reach the sampler through :meth:`observe_round`. Parameters: the outer loop's
    ``stage_steps`` (None = one pass over the pool at
    ``rollout.prompts_per_step``; ``stage_pool`` current | original), ``gamma`` (γ), ``quantile_step``,
    ``max_quantile``, ``shift_accuracy`` / ``shift_margin`` (absolute / relative threshold) with
    ``shift_baseline`` (level 0's baseline; None = the first signal), ``gamma`` < 0 (the
    ``aparl-reverse`` control, p ∝ PPL^γ favours easy items), ``quantile_step: 0`` (level fixed, the
    ``aparl-frozen`` control),
    ``accuracy_source`` (heldout | train | minibatch), ``signal_window`` (steps, minibatch),
    ``target`` (reference | answer) and ``reference_style`` (short | long), ``saturated_ppl``,
    ``drop_solved`` (an all-correct group saturates its item), ``min_pool``, ``batch_size``
    (perplexity rows per forward).

    Under asynchronous rollout (``rollout.max_staleness`` = η > 0, docs/async.md) the curriculum
    chooses at dispatch time: ``plan`` runs when groups are sent to the generation workers (stage
    boundaries and perplexities use the trainer's policy of that moment), ``observe_round`` sees each
    batch of consumed groups the inner-loop filter decides on, and ``observe`` the groups a step
    trains on, generated by a policy up to η versions old."""

    def __init__(
        self,
        examples: list[Any],
        *,
        seed: int = 0,
        stage_steps: int | None = None,
        stage_pool: str = "current",
        gamma: float = 1.0,
        quantile_step: float = 0.25,
        max_quantile: float = 0.75,
        shift_accuracy: float = 0.6,
        shift_margin: float | None = None,
        shift_baseline: float | None = None,
        accuracy_source: str = "heldout",
        signal_window: int = 1,
        target: str = "reference",
        reference_style: str = "short",
        saturated_ppl: float = 1.05,
        drop_solved: bool = True,
        min_pool: int = 32,
        batch_size: int = 64,
    ) -> None:
        self.validate_params(
            {
                "stage_steps": stage_steps,
                "stage_pool": stage_pool,
                "gamma": gamma,
                "quantile_step": quantile_step,
                "max_quantile": max_quantile,
                "shift_accuracy": shift_accuracy,
                "shift_margin": shift_margin,
                "shift_baseline": shift_baseline,
                "accuracy_source": accuracy_source,
                "signal_window": signal_window,
                "target": target,
                "reference_style": reference_style,
                "saturated_ppl": saturated_ppl,
                "min_pool": min_pool,
                "batch_size": batch_size,
            }
        )
        super().__init__(examples, seed=seed)
        self._step = -1
        self.stage_steps, self.stage_pool, self.gamma = stage_steps, stage_pool, gamma
        self.quantile_step, self.max_quantile = quantile_step, max_quantile
        self.shift_accuracy, self.shift_margin = shift_accuracy, shift_margin
        self.accuracy_source, self.signal_window = accuracy_source, signal_window
        self.target, self.reference_style = target, reference_style
        self.saturated_ppl, self.drop_solved = saturated_ppl, drop_solved
        self.min_pool, self.batch_size = min_pool, batch_size
        self.max_level = math.ceil(max_quantile / quantile_step) if quantile_step > 0 else 0
        self.by_id = {_qid(e): e for e in examples}
        self.dropped: set[str] = set()
        self.solved: set[str] = set()  # items whose latest group was all correct (saturate next stage)
        self.ppl: dict[str, float] = {}
        self.weights: dict[str, float] = {}
        self.level = 0
        self.stage = -1
        self.stage_start = 0  # the step the current stage began
        self.stage_len = 1  # steps in the current stage
        # the signal at the first check of the current level (shift_baseline: given for level 0, e.g.
        # the warm start's measured training accuracy)
        self.baseline: float | None = shift_baseline
        self.heldout_acc: float | None = None
        self._train_acc: list[float] = []  # per group, every round, this stage
        self._step_acc: list[list[float]] = []  # per step (latest signal_window), per group
        self._recorded_step = -1  # the last step whose groups arrived through the filter
        self._acc_step = -1  # the step of the last _step_acc row
        self._round = 0
        self._sampled_ppl: list[float] = []
        self._stage_stats: dict[str, float] = {}
        self.policy: Any = None
        self.encode_prompt: Any = None
        self.task: Any = None
        self.chunk_size = 1024

    @staticmethod
    def validate_params(params: dict[str, Any]) -> None:
        for key in REMOVED_PARAMS:
            if key in params:
                raise InvalidValueError(
                    f"{key}: the inner loop's {key} is the group filter's parameter since 0.2.0; set "
                    f"hooks.filter={{name: dynamic-sampling, params: {{{key}: {params[key]!r}}}}} and drop it "
                    "from hooks.sampler.params"
                )
        ss = params.get("stage_steps")
        if ss is not None and not (isinstance(ss, int) and ss >= 1):
            raise InvalidValueError(f"stage_steps must be an integer >= 1 or null, got {ss!r}")
        g = params.get("gamma", 1.0)
        if not (isinstance(g, int | float) and not isinstance(g, bool) and math.isfinite(g)):
            raise InvalidValueError(f"gamma must be a finite number (< 0 favours LOW perplexity), got {g!r}")
        for key, lo in (("quantile_step", 0.0), ("saturated_ppl", 0.0)):
            v = params.get(key, 1.0)
            if not (isinstance(v, int | float) and v >= lo):
                raise InvalidValueError(f"{key} must be a number >= {lo}, got {v!r}")
        for key in ("max_quantile", "shift_accuracy"):
            v = params.get(key, 0.5)
            if not (isinstance(v, int | float) and 0 <= v <= 1):
                raise InvalidValueError(f"{key} must lie in [0, 1], got {v!r}")
        m = params.get("shift_margin")
        if m is not None and not (isinstance(m, int | float) and not isinstance(m, bool) and -1 <= m <= 1):
            raise InvalidValueError(f"shift_margin must be a number in [-1, 1] or null, got {m!r}")
        b = params.get("shift_baseline")
        if b is not None and not (isinstance(b, int | float) and not isinstance(b, bool) and 0 <= b <= 1):
            raise InvalidValueError(f"shift_baseline must lie in [0, 1] or be null, got {b!r}")
        for key, allowed in (
            ("accuracy_source", ACCURACY_SOURCES),
            ("target", TARGETS),
            ("stage_pool", STAGE_POOLS),
            ("reference_style", ("short", "long")),
        ):
            v = params.get(key, allowed[0])
            if v not in allowed:
                raise InvalidValueError(
                    f"{key} must be one of {', '.join(repr(a) for a in allowed)}, got {v!r}"
                )
        for key in ("min_pool", "batch_size", "signal_window"):
            v = params.get(key, 1)
            if not (isinstance(v, int) and v >= 1):
                raise InvalidValueError(f"{key} must be an integer >= 1, got {v!r}")

    def bind(self, run: RunInfo) -> None:
        self.policy, self.encode_prompt, self.chunk_size = run.policy, run.encode_prompt, run.chunk_size
        self.task = getattr(run, "task", None)

    def target_text(self, example: Any) -> str:
        """What the perplexity scores: the task's reference completion (``target: reference``) or the
        bare gold answer (``target: answer``)."""
        if self.target == "answer":
            return str(example.answer)
        if self.task is None:
            raise InvalidValueError(
                "hooks.sampler 'aparl': target 'reference' needs the task (RunInfo.task, given by the "
                "trainer); set hooks.sampler.params.target=answer to score the bare gold answer"
            )
        try:
            return str(self.task.reference_completion(example, style=self.reference_style))
        except NotImplementedError as e:
            raise InvalidValueError(
                f"hooks.sampler 'aparl': target 'reference': {e}; set hooks.sampler.params.target=answer "
                "to score the bare gold answer"
            ) from e

    # -- statistics -----------------------------------------------------------------------------
    def observe_round(self, outcomes: list[GroupOutcome], step: int) -> None:
        """Every sampled group of a round, before the group filter drops any (the loop calls it when
        a filter is active)."""
        self._record(outcomes, step)

    def _record(self, outcomes: list[GroupOutcome], step: int) -> None:
        """Every sampled group of a round: accuracies for the signal, all-correct items for
        ``drop_solved``."""
        self._recorded_step = step
        if step != self._acc_step or not self._step_acc:
            self._step_acc.append([])
            self._step_acc = self._step_acc[-self.signal_window :]
            self._acc_step = step
        for o in outcomes:
            self._train_acc.append(o.accuracy)
            self._step_acc[-1].append(o.accuracy)
            qid = _qid(o.example)
            if o.correct and all(o.correct):
                self.solved.add(qid)
            else:
                self.solved.discard(qid)  # "latest group" all correct

    def observe(self, outcomes: list[GroupOutcome], step: int) -> None:
        # with a group filter every round's groups arrived already (observe_round, also those it
        # dropped); without one the step's single round is reported here
        if self._recorded_step != step:
            self._record(outcomes, step)
        if self.accuracy_source == "minibatch" and self.policy is not None and self.stage >= 0:
            self._shift(self.accuracy_signal())  # per-step Monte-Carlo proficiency

    def observe_eval(self, result: dict[str, Any], step: int) -> None:
        if "accuracy" in result:
            self.heldout_acc = float(result["accuracy"])

    # -- outer loop -----------------------------------------------------------------------------
    def accuracy_signal(self) -> float | None:
        train = sum(self._train_acc) / len(self._train_acc) if self._train_acc else None
        if self.accuracy_source == "heldout" and self.heldout_acc is not None:
            return self.heldout_acc
        if self.accuracy_source == "minibatch":
            accs = [a for step in self._step_acc for a in step]
            return sum(accs) / len(accs) if accs else None
        return train

    def threshold(self) -> float | None:
        """``shift_accuracy``, or ``baseline + shift_margin`` (None before the baseline is taken)."""
        if self.shift_margin is None:
            return self.shift_accuracy
        return None if self.baseline is None else self.baseline + self.shift_margin

    def _shift(self, acc: float | None) -> None:
        """One level check: take the baseline first (relative threshold), then move the level."""
        if acc is None:
            return
        if self.shift_margin is not None and self.baseline is None:
            self.baseline = acc
            return
        thr = self.threshold()
        new = next_level(self.level, acc, thr, self.max_level)
        if new != self.level:
            self.level = new
            self.baseline = None
            self._reweight()
        self._stage_stats.update(
            {
                "level": float(self.level),
                "accuracy_signal": float(acc),
                "threshold": float("nan") if thr is None else float(thr),
                "quantile_lo": quantile_floor(self.level, self.quantile_step, self.max_quantile),
            }
        )

    def _reweight(self) -> None:
        q_lo = quantile_floor(self.level, self.quantile_step, self.max_quantile)
        self.weights = aparl_weights(self.ppl, gamma=self.gamma, quantile_lo=q_lo)

    def new_stage(self, step: int) -> None:
        """Stage boundary: move the level, re-score the pool's perplexities, drop saturated items,
        re-weight."""
        t0 = time.perf_counter()
        acc = self.accuracy_signal()
        if self.stage >= 0 and self.accuracy_source != "minibatch":  # minibatch: checked every step
            self._shift(acc)
        self.stage += 1
        self.stage_start = step
        active = [q for q in self.by_id if q not in self.dropped]
        ppl, tokens = gold_perplexities(
            self.policy,
            self.encode_prompt,
            [self.by_id[q] for q in active],
            batch_size=self.batch_size,
            chunk_size=self.chunk_size,
            target=self.target_text,
        )
        self.ppl = dict(zip(active, ppl, strict=True))
        sat = [
            q for q in active if self.ppl[q] <= self.saturated_ppl or (self.drop_solved and q in self.solved)
        ]
        room = max(len(active) - self.min_pool, 0)
        if len(sat) > room:  # keep at least min_pool items: the highest-perplexity saturated ones stay
            sat = sorted(sat, key=lambda q: (self.ppl[q], q))[:room]
        self.dropped.update(sat)
        for q in sat:
            del self.ppl[q]
        self.solved.clear()
        self._reweight()
        vals = sorted(self.ppl.values())
        thr = self.threshold()
        self._stage_stats = {
            "stage": float(self.stage),
            "level": float(self.level),
            "quantile_lo": quantile_floor(self.level, self.quantile_step, self.max_quantile),
            "accuracy_signal": float("nan") if acc is None else float(acc),
            "threshold": float("nan") if thr is None else float(thr),
            "pool_size": float(len(self.ppl)),
            "pool_sampled": float(len(self.weights)),
            "dropped_total": float(len(self.dropped)),
            "dropped_now": float(len(sat)),
            "ppl_pool_median": vals[len(vals) // 2] if vals else float("nan"),
            "ppl_seconds": time.perf_counter() - t0,
            "ppl_rows": float(len(active)),
            "ppl_tokens": float(tokens),
        }
        self._train_acc = []

    def _stage_length(self, num_prompts: int) -> int:
        if self.stage_steps is not None:
            return self.stage_steps
        pool = len(self.by_id) if self.stage_pool == "original" else max(len(self.ppl), 1)
        return max(1, math.ceil(pool / max(num_prompts, 1)))

    def plan(self, step: int, num_prompts: int, group_size: int) -> PromptPlan:
        if step != self._step:  # first round of a step
            self._step = step
            self._round = 0
            if self.policy is not None and (self.stage < 0 or step - self.stage_start >= self.stage_len):
                self.new_stage(step)
                self.stage_len = self._stage_length(num_prompts)
                self._stage_stats["stage_steps"] = float(self.stage_len)
            elif self.policy is not None:
                self._stage_stats["ppl_seconds"] = 0.0  # logged cost: only at stage boundaries
        return super().plan(step, num_prompts, group_size)

    def metrics(self) -> dict[str, float]:
        out = dict(self._stage_stats)
        if self._sampled_ppl:
            out["ppl_sampled_mean"] = sum(self._sampled_ppl) / len(self._sampled_ppl)
        return out

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "dropped": sorted(self.dropped),
            "solved": sorted(self.solved),
            "ppl": self.ppl,
            "level": self.level,
            "stage": self.stage,
            "stage_start": self.stage_start,
            "stage_len": self.stage_len,
            "baseline": self.baseline,
            "heldout_acc": self.heldout_acc,
            "train_acc": self._train_acc,
            "step_acc": self._step_acc,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.dropped = set(state["dropped"])
        self.solved = set(state["solved"])
        self.ppl = {k: float(v) for k, v in state["ppl"].items()}
        self.level, self.stage = int(state["level"]), int(state["stage"])
        self.stage_start = int(state.get("stage_start", 0))
        self.stage_len = int(state.get("stage_len", 1))
        self.baseline = state.get("baseline")
        self.heldout_acc = state["heldout_acc"]
        self._train_acc = [float(v) for v in state["train_acc"]]
        self._step_acc = [[float(v) for v in row] for row in state.get("step_acc", [])]
        self._reweight()
