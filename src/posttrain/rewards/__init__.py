"""Reward functions for verifiable tasks, and `RewardPool` to run them safely in worker processes.

`get_reward(name, **params)`, `list_rewards()`, `register_reward` (a `Registry`). Built in:
`exact_match`, `numeric`, `format`, `countdown`, `math_verify`, `weighted`, `instructions_strict`,
`instructions_loose`, `instructions_fraction`, `last_number`.
A plug-in ``package.module:Name`` (a top-level class whose instances are called as
``reward(completion, example) -> float``) works wherever a reward name does.
"""

from posttrain.rewards import basic as _basic  # noqa: F401  (registers the rewards)
from posttrain.rewards import countdown as _countdown  # noqa: F401
from posttrain.rewards import instructions as _instructions  # noqa: F401
from posttrain.rewards import last_number as _last_number  # noqa: F401
from posttrain.rewards import mathverify as _mathverify  # noqa: F401
from posttrain.rewards import weighted as _weighted  # noqa: F401
from posttrain.rewards.base import (
    REWARDS,
    RewardFn,
    cut_at_stop,
    extract_answer,
    get_reward,
    list_rewards,
    register_reward,
    score_detailed,
)
from posttrain.rewards.basic import ExactMatchReward, FormatReward, NumericReward, last_number, parse_number
from posttrain.rewards.countdown import CountdownReward
from posttrain.rewards.mathverify import MathVerifyReward
from posttrain.rewards.pool import RewardHandle, RewardPool, RewardResult
from posttrain.rewards.weighted import WeightedReward


def _reward_class(obj: object) -> object:
    """Plug-in adapter: a class defining ``__call__`` (instances score one completion)."""
    if isinstance(obj, type) and any("__call__" in vars(k) for k in obj.__mro__[:-1]):
        return obj
    return None


REWARDS.accept(_reward_class, "a class with __call__(self, completion, example) -> float")

__all__ = [
    "REWARDS",
    "CountdownReward",
    "ExactMatchReward",
    "FormatReward",
    "MathVerifyReward",
    "NumericReward",
    "RewardFn",
    "RewardHandle",
    "RewardPool",
    "RewardResult",
    "WeightedReward",
    "cut_at_stop",
    "extract_answer",
    "get_reward",
    "last_number",
    "list_rewards",
    "parse_number",
    "register_reward",
    "score_detailed",
]
