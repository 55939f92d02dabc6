"""What instruction tuning does to a model's knowledge: MCQ knowledge probes, knowledge-consistency
metrics and the Spearman partial correlation (Ren et al. 2024, arXiv 2402.18243), knowledge-
intervention data groups, and the pseudo-vs-actual forgetting restoration protocol (Zhang et al.,
CCL 2024; the protocol is a proposed design). See docs/analysis.md.
"""

from __future__ import annotations

from posttrain_lab.studies.analysis.metrics import (
    cosine_consistency,
    kl_consistency,
    pearson,
    rank_consistency,
    rank_order,
    spearman,
    spearman_partial_correlation,
)
from posttrain_lab.studies.analysis.probe import (
    MCQ,
    VICUNA_TEMPLATE,
    ProbeResult,
    ProbeSet,
    format_example,
    header,
    load_mcqs,
    probe,
    probe_prompt,
    save_mcqs,
)

__all__ = [
    "MCQ",
    "VICUNA_TEMPLATE",
    "ProbeResult",
    "ProbeSet",
    "cosine_consistency",
    "format_example",
    "header",
    "kl_consistency",
    "load_mcqs",
    "pearson",
    "probe",
    "probe_prompt",
    "rank_consistency",
    "rank_order",
    "save_mcqs",
    "spearman",
    "spearman_partial_correlation",
]
