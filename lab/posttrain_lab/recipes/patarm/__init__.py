"""PaTaRM-style generative reward models (arXiv 2510.24235): rubric prompts, score parsing, PAR rewards,
preference data, judges as reward sources, Bradley-Terry baseline and evaluation. See docs/patarm.md.

Imports here stay light (no torch); the trainers are imported from their modules.
"""

from posttrain_lab.recipes.patarm.data import (
    PreferenceDataError,
    PreferencePair,
    load_preferences,
    near_miss,
    save_preferences,
    synthetic_pairs,
)
from posttrain_lab.recipes.patarm.par import par_rewards
from posttrain_lab.recipes.patarm.prompts import (
    TASK_TYPES,
    RubricError,
    load_rubric,
    normalise_score,
    pairwise_prompt,
    parse_preference,
    parse_score,
    pointwise_prompt,
)

__all__ = [
    "TASK_TYPES",
    "PreferenceDataError",
    "PreferencePair",
    "RubricError",
    "load_preferences",
    "load_rubric",
    "near_miss",
    "normalise_score",
    "pairwise_prompt",
    "par_rewards",
    "parse_preference",
    "parse_score",
    "pointwise_prompt",
    "save_preferences",
    "synthetic_pairs",
]
