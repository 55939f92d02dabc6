"""What a trainer's ``reward=`` accepts: a posttrain reward ``(completion, example) -> float``, a
reward function written for TRL's ``GRPOTrainer`` (``def reward(completions, **kwargs) ->
list[float]``, also with ``prompts``), adapted by :class:`TRLReward`, or a registered reward name;
anything else is refused in one line by :func:`as_reward_fn`, before a model is loaded.

A TRL reward is recognised by a parameter named ``completions``. It is called once per completion,
as TRL would call it for a batch of one: ``prompts=[example.prompt]``, ``completions=[completion]``,
``completion_ids=None``, the example's other dataset columns as one-element lists
(``meta["columns"]`` of a rows / ``datasets.Dataset`` task, else ``answer``), and ``trainer_state=None``;
keyword arguments the function does not take are left out unless it takes ``**kwargs``. Its one
value is the reward (``None``, TRL's "not applicable", is refused as a non-number like any other).
"""

from __future__ import annotations

import inspect
from typing import Any

from posttrain.tasks.base import Example
from posttrain.utils.errors import InvalidTypeError, InvalidValueError

ACCEPTED = (
    "a callable (completion, example) -> float, a TRL reward function (completions, **kwargs) -> "
    "list[float], or a registered reward name"
)


class TRLReward:
    """A TRL-signature reward function as a posttrain reward (module docstring). Picklable when the
    function is (a module-level function), so it runs in the reward pool's workers."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn
        self.name = getattr(fn, "__name__", type(fn).__name__)

    def __call__(self, completion: str, example: Example) -> Any:
        meta = example.meta or {}
        columns = meta.get("columns")
        if not isinstance(columns, dict):
            columns = {"answer": example.answer}
        kwargs: dict[str, Any] = {k: [v] for k, v in columns.items()}
        kwargs.update(
            prompts=[example.prompt], completions=[completion], completion_ids=None, trainer_state=None
        )
        params = inspect.signature(self.fn).parameters
        if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
            kwargs = {k: v for k, v in kwargs.items() if k in params}
        out = self.fn(**kwargs)
        if not isinstance(out, list | tuple) or len(out) != 1:
            raise InvalidValueError(
                f"TRL reward {self.name!r}: expected a list of one value for one completion, got "
                f"{type(out).__name__} ({out!r:.80})"
            )
        return out[0]


def _signature(fn: Any) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):  # some builtins have none: accepted as they are
        return None


def as_reward_fn(obj: Any, *, where: str = "reward") -> Any:
    """``obj`` as a posttrain reward (module docstring); anything else raises naming what is accepted."""
    if isinstance(obj, str):  # a registered reward name, as in reward.name
        from posttrain.rewards.base import get_reward

        return get_reward(obj)
    if not callable(obj):
        raise InvalidTypeError(f"{where}: expected {ACCEPTED}; got {type(obj).__name__} ({obj!r:.60})")
    sig = _signature(obj)
    if sig is None:
        return obj
    if "completions" in sig.parameters:
        return TRLReward(obj)
    try:
        sig.bind("completion", None)
    except TypeError:
        raise InvalidTypeError(
            f"{where}: {getattr(obj, '__name__', type(obj).__name__)}{sig} cannot be called as "
            f"(completion, example); expected {ACCEPTED}"
        ) from None
    return obj
