"""Continual-learning metrics over an accuracy matrix, and the KPIG-style P- and V-scores.

``acc[i][j]`` = accuracy on task j after training through task i (T stages x T tasks, tasks in
training order); ``acc_init[j]`` = accuracy on task j before any training. Following Lopez-Paz &
Ranzato, "Gradient Episodic Memory for Continual Learning" (GEM, arXiv 1706.08840, §4):

    ACC = (1/T) Σ_j acc[T-1][j]
    BWT = (1/(T-1)) Σ_{j<T-1} (acc[T-1][j] − acc[j][j])
    FWT = (1/(T-1)) Σ_{j≥1} (acc[j-1][j] − acc_init[j])

(0-based indices). Forgetting of task j < T-1 (Chaudhry et al., RWalk, arXiv 1801.10112, §4):
``f_j = max_{l ∈ [j, T-2]} acc[l][j] − acc[T-1][j]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from posttrain.utils.errors import InvalidValueError


def cl_metrics(acc: Sequence[Sequence[float]], acc_init: Sequence[float] | None = None) -> dict[str, Any]:
    """``average_accuracy``, ``backward_transfer``, ``forward_transfer`` (None without ``acc_init``),
    ``forgetting`` (list over tasks 0..T-2) and ``mean_forgetting`` (module docstring).
    BWT / FWT / forgetting are None for T = 1."""
    a = np.asarray(acc, dtype=np.float64)
    if a.ndim != 2 or a.shape[0] != a.shape[1] or a.shape[0] == 0:
        raise InvalidValueError(f"acc must be a square T x T matrix (stages x tasks), got shape {a.shape}")
    t = a.shape[0]
    out: dict[str, Any] = {"average_accuracy": float(a[-1].mean())}
    if t == 1:
        out.update(backward_transfer=None, forward_transfer=None, forgetting=[], mean_forgetting=None)
        return out
    out["backward_transfer"] = float(np.mean([a[-1, j] - a[j, j] for j in range(t - 1)]))
    if acc_init is not None:
        b = np.asarray(acc_init, dtype=np.float64)
        if b.shape != (t,):
            raise InvalidValueError(f"acc_init must have one entry per task ({t}), got shape {b.shape}")
        out["forward_transfer"] = float(np.mean([a[j - 1, j] - b[j] for j in range(1, t)]))
    else:
        out["forward_transfer"] = None
    forg = [float(a[j : t - 1, j].max() - a[-1, j]) for j in range(t - 1)]
    out["forgetting"] = forg
    out["mean_forgetting"] = float(np.mean(forg))
    return out


def p_score(acc_by_rewrite: dict[str, dict[str, float]]) -> float:
    """KPIG-style P-score (proposed design): mean accuracy on held-out tasks under diversified
    instructions, averaged over rewrite templates then tasks. ``acc_by_rewrite[template][task]``."""
    vals = [v for per_task in acc_by_rewrite.values() for v in per_task.values()]
    if not vals:
        raise InvalidValueError("p_score: no held-out accuracies")
    return float(np.mean(vals))


def v_score(satisfied: Sequence[bool]) -> float:
    """KPIG-style V-score (proposed design): fraction of outputs satisfying their instruction's
    key-part constraints (rule checks per task)."""
    if not len(satisfied):
        raise InvalidValueError("v_score: no outputs")
    return float(np.mean([bool(s) for s in satisfied]))
