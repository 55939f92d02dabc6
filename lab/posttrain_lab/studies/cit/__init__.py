"""Continual instruction tuning (CIT): instruction data with key-part markup, a built-in synthetic task
stream, forgetting metrics, replay baselines (uniform, RGD-R) and KPIG-style information-gain replay and
objective (He et al., arXiv 2403.10056; proposed design), on top of the SFT trainer. See docs/cit.md.
"""

from __future__ import annotations

from posttrain_lab.studies.cit.data import (
    CITDataError,
    EncodedInstruction,
    InstructionExample,
    encode_instruction,
    parse_markup,
    read_instruction_file,
)
from posttrain_lab.studies.cit.diversify import TEMPLATES, diversify, rewrite_rules
from posttrain_lab.studies.cit.kpig import (
    HingeLoss,
    hinge_term,
    information_gain,
    kpig_allocation,
    largest_remainder,
    rgd_allocation,
    uniform_allocation,
)
from posttrain_lab.studies.cit.metrics import cl_metrics, p_score, v_score

__all__ = [
    "TEMPLATES",
    "CITDataError",
    "EncodedInstruction",
    "HingeLoss",
    "InstructionExample",
    "cl_metrics",
    "diversify",
    "encode_instruction",
    "hinge_term",
    "information_gain",
    "kpig_allocation",
    "largest_remainder",
    "p_score",
    "parse_markup",
    "read_instruction_file",
    "rewrite_rules",
    "rgd_allocation",
    "uniform_allocation",
    "v_score",
]
