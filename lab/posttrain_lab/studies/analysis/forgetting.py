"""Pseudo vs actual forgetting along an instruction-tuning run: the restoration protocol.

Finding (Zhang et al., "Pattern Shifting or Knowledge Losing? A Forgetting Perspective for
Understanding the Effect of Instruction Fine-Tuning", CCL 2024, 2024.ccl-1.106): early in IFT the
model mainly shifts its text pattern away from the pre-training format (pseudo forgetting: restoring
it on pre-training-like text recovers the base model's score); later it loses knowledge (actual
forgetting: restoration no longer recovers it). The paper's datasets, budgets and thresholds are not
public in this form; the protocol below is a **proposed design**:

1. base model M_0; IFT for S steps, saving checkpoints M_s at log-spaced steps (:func:`log_steps`);
2. restoration: from each M_s, causal-LM training (loss on every token) on pre-training-like text for
   the same fixed budget → R_s;
3. control: M_0 restored the same way (R_0), to calibrate what restoration alone does;
4. scores with base-style prompts (few-shot, no chat template) on knowledge probes: score(M_0),
   score(M_s), score(R_s) (MCQ accuracy in points);
5. per checkpoint: forgetting F_s = score(M_0) − score(M_s), recovery gap G_s = score(M_0) − score(R_s);
   pseudo forgetting ⇔ F_s > 0 and G_s ≤ ε; actual forgetting ⇔ G_s > ε; transition step = the first
   s with G_s > ε; ε = max(1 point, 2 × the std of the control's score over restoration seeds)
   (placeholder rule of the proposed design).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from posttrain.utils.errors import InvalidValueError

Stage = Literal["none", "pseudo", "actual"]


@dataclass
class CheckpointVerdict:
    step: int
    score_tuned: float
    score_restored: float
    forgetting: float
    recovery_gap: float
    stage: Stage
    control_gap: float | None = None
    """score(R_0) − score(R_s): the recovery gap against the restored base model (control)."""
    control_stage: Stage | None = None
    """The same rule with the control's score in place of score(M_0) (restoration's own cost removed)."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def epsilon(control_scores: Sequence[float] = (), *, floor: float = 1.0, k: float = 2.0) -> float:
    """ε = max(floor, k × sample std of the control's scores over seeds) (proposed design); with
    fewer than two control scores, ε = floor."""
    sd = statistics.stdev(control_scores) if len(control_scores) >= 2 else 0.0
    return max(floor, k * sd)


def classify(
    score_base: float, score_tuned: float, score_restored: float, eps: float
) -> tuple[float, float, Stage]:
    """(F, G, stage): F = base − tuned, G = base − restored; ``actual`` when G > ε, ``pseudo`` when
    F > 0 and G ≤ ε, else ``none``."""
    f = score_base - score_tuned
    g = score_base - score_restored
    if g > eps:
        return f, g, "actual"
    if f > 0:
        return f, g, "pseudo"
    return f, g, "none"


def verdicts(
    score_base: float,
    steps: Sequence[int],
    tuned: Sequence[float],
    restored: Sequence[float],
    eps: float,
    *,
    control: float | None = None,
) -> list[CheckpointVerdict]:
    """Per-checkpoint verdicts; with ``control`` (the mean score of the restored base model R_0) also
    the control-calibrated reading: gap score(R_0) − score(R_s) and its stage under the same rule
    (forgetting F_s measured from score(M_0) as before) — a proposed addition for restoration budgets
    that cost knowledge by themselves."""
    if not (len(steps) == len(tuned) == len(restored)):
        raise InvalidValueError(
            f"steps, tuned and restored need the same length ({len(steps)}, {len(tuned)}, {len(restored)})"
        )
    out = []
    for s, t, r in zip(steps, tuned, restored, strict=True):
        f, g, stage = classify(score_base, t, r, eps)
        v = CheckpointVerdict(int(s), float(t), float(r), f, g, stage)
        if control is not None:
            gc = control - r
            v.control_gap = gc
            v.control_stage = "actual" if gc > eps else ("pseudo" if f > 0 else "none")
        out.append(v)
    return out


def transition_step(vs: Sequence[CheckpointVerdict], *, calibrated: bool = False) -> int | None:
    """The first checkpoint step with G_s > ε (actual forgetting), None when there is none;
    ``calibrated``: the first with score(R_0) − score(R_s) > ε."""
    for v in sorted(vs, key=lambda v: v.step):
        if (v.control_stage if calibrated else v.stage) == "actual":
            return v.step
    return None


def log_steps(total: int, k: int) -> list[int]:
    """k distinct log-spaced integer steps in [1, total], always including ``total``."""
    if total < 1 or k < 1:
        raise InvalidValueError(f"log_steps: total and k must be positive, got {total}, {k}")
    k = min(k, total)
    if k == 1:
        return [total]
    raw = [round(math.exp(math.log(total) * i / (k - 1))) for i in range(k)]
    out: list[int] = []
    for s in raw:
        s = max(s, out[-1] + 1 if out else 1)
        out.append(min(s, total))
    return sorted(set(out))
