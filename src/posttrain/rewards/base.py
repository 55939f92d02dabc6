"""The reward interface, answer extraction, and the reward registry.

A reward function is a picklable object (a top-level class instance) with a `name` and
`__call__(completion, example) -> float`. It may also define:

- `detailed(completion, example) -> (float, dict[str, float])`: the reward plus per-component
  values (used by `weighted`; `RewardPool` reports them as `RewardResult.components`);
- `setup()`: one-time warm-up (heavy imports) run once in each pool worker before it takes work,
  so the first item's time budget is not spent importing.

Rewards never `eval`/`exec` completion text.
"""

from __future__ import annotations

import numbers
from typing import Any, Protocol, runtime_checkable

from posttrain.tasks.base import Example, check_params
from posttrain.utils.errors import InvalidTypeError, InvalidValueError
from posttrain.utils.registry import Registry

# Text that marks the end of a completion when the decoder left special tokens in.
DEFAULT_STOP: tuple[str, ...] = ("<|endoftext|>", "<|im_end|>", "<|eot_id|>", "</s>")


@runtime_checkable
class RewardFn(Protocol):
    name: str

    def __call__(self, completion: str, example: Example) -> float: ...


def cut_at_stop(text: str, stop: tuple[str, ...] | list[str] = DEFAULT_STOP) -> str:
    """`text` up to the first stop string (end-of-sequence tokens left in decoded text)."""
    cut = len(text)
    for s in stop:
        if s:
            i = text.find(s)
            if i != -1:
                cut = min(cut, i)
    return text[:cut]


def extract_answer(
    completion: str,
    marker: str | None = None,
    *,
    stop: tuple[str, ...] | list[str] = DEFAULT_STOP,
    require_marker: bool = False,
) -> str | None:
    """The final answer in a completion.

    With a `marker` (e.g. `"####"`) present in the text: the rest of the line after its LAST
    occurrence, stripped. Otherwise (no marker given, or not found and `require_marker` is False):
    the first line of the completion, stripped. Text after an end-of-sequence stop string is ignored.
    Returns None when `require_marker` is set and the marker is missing.
    """
    text = cut_at_stop(completion, stop)
    if marker:
        i = text.rfind(marker)
        if i != -1:
            return text[i + len(marker) :].split("\n", 1)[0].strip()
        if require_marker:
            return None
    return text.lstrip("\n").split("\n", 1)[0].strip()


def marker_of(example: Example, override: str | None = None) -> str | None:
    """The answer marker to use: an explicit override, else the example's `meta["answer_marker"]`."""
    if override is not None:
        return override or None
    m = example.meta.get("answer_marker") if isinstance(example.meta, dict) else None
    return m if isinstance(m, str) and m else None


GUARD_MODES = ("veto", "penalty", "reject")
"""What a flagged answer scores (a hack probe fired, or a judge rejected it), from its score ``r``:
``veto`` ``min(r, 0)`` (as a failed checker), ``penalty`` ``r - penalty``, ``reject`` ``min(r, -penalty)``
(below every answer not flagged whose score is >= 0, whatever its checker said)."""


def check_flag_settings(who: str, mode: Any, penalty: Any) -> tuple[str, float]:
    """``(mode, penalty)`` of a flag rule (:func:`flagged_score`), checked; a bad one is an error that
    starts with ``who`` (e.g. ``reward instructions_guarded``)."""
    if mode not in GUARD_MODES:
        raise InvalidValueError(f"{who}: mode must be one of {', '.join(GUARD_MODES)}, got {mode!r}")
    if not (isinstance(penalty, int | float) and penalty >= 0):
        raise InvalidValueError(f"{who}: penalty must be >= 0, got {penalty!r}")
    return mode, float(penalty)


def flagged_score(score: float, mode: str, penalty: float) -> float:
    """The score of a flagged answer under ``mode`` (:data:`GUARD_MODES`; posttrain's design). On a
    score already <= the mode's floor, ``veto`` and ``reject`` change nothing, so a second flag (a
    probe, then a judge) never stacks; ``penalty`` subtracts each time."""
    if mode == "veto":
        return min(score, 0.0)
    if mode == "penalty":
        return score - penalty
    if mode == "reject":
        return min(score, -penalty)
    raise InvalidValueError(f"flag mode must be one of {', '.join(GUARD_MODES)}, got {mode!r}")


REWARDS: Registry[type] = Registry("reward", group="posttrain.rewards")


def register_reward(name: str, *, aliases: tuple[str, ...] = ()):
    """Class decorator: `@register_reward("exact_match")`; the class must be defined at module top
    level (pool workers unpickle it by its import path)."""
    return REWARDS.register(name, aliases=aliases)


def get_reward(name: str, **params: Any) -> RewardFn:
    """Build a registered reward: `get_reward("numeric", rel_tol=1e-4)`."""
    cls = REWARDS.get(name)
    check_params("reward", name, cls, params)
    return cls(**params)


def list_rewards() -> list[str]:
    return REWARDS.names()


class NonNumericReward(InvalidTypeError):
    """A reward function returned something that is not a number (a str, None, bytes, a list, ...).

    ``float("1.0")`` would silently score 1.0, so the pool scores the item 0 and counts it as a
    reward error, the way it treats an exception or a NaN (never silently)."""


def as_reward_value(value: Any, example: Example, what: str = "reward") -> float:
    """``value`` as a float when it is a number: bool, int, float, a ``numbers.Real`` (numpy's int
    and float scalars) or a zero-dimensional numpy array / torch tensor holding one. Anything else
    raises :class:`NonNumericReward` naming ``what``, the item's id and the type, instead of being
    converted (``"1.0"`` used to score 1.0)."""
    if isinstance(value, numbers.Real):
        return float(value)
    if getattr(value, "ndim", None) == 0 and callable(getattr(value, "item", None)):
        item = value.item()  # numpy 0-d array / np.bool_, torch 0-d tensor
        if isinstance(item, numbers.Real):
            return float(item)
    item_id = getattr(example, "id", None)
    raise NonNumericReward(
        f"{what} for item {item_id!r} returned {type(value).__name__} ({value!r:.80}); "
        "expected a number (bool, int, float or a numpy/torch scalar)"
    )


def score_detailed(fn: RewardFn, completion: str, example: Example) -> tuple[float, dict[str, float] | None]:
    """`(reward, components or None)` for any reward function; a value that is not a number raises
    :class:`NonNumericReward` (see :func:`as_reward_value`)."""
    detailed = getattr(fn, "detailed", None)
    if detailed is not None:
        value, comps = detailed(completion, example)
        return as_reward_value(value, example), {
            k: as_reward_value(v, example, f"reward component {k!r}") for k, v in comps.items()
        }
    return as_reward_value(fn(completion, example), example), None
