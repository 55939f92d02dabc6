"""`event_label`: the reward of event-detection tasks (``dialogue-events``).

APARL's reward (arXiv:2507.01327, as summarised): ``R = 1[pred = gold] − λ_fmt · 1[format invalid]``;
the prediction is the completion's first line, valid when it is one of the task's labels
(:func:`posttrain_lab.recipes.aparl.dialogue_events.event_reward`).
"""

from __future__ import annotations

from posttrain.rewards.base import DEFAULT_STOP, cut_at_stop, register_reward
from posttrain.tasks.base import Example
from posttrain.utils.errors import InvalidValueError
from posttrain_lab.recipes.aparl.dialogue_events import EVENTS, event_reward


@register_reward("event_label")
class EventLabelReward:
    """1 for the gold label, 0 for another valid label, ``−format_penalty`` for anything else.
    ``labels`` overrides the label set (default: ``Example.meta["labels"]`` or the 20 built-in events)."""

    name = "event_label"

    def __init__(self, format_penalty: float = 1.0, labels: list[str] | None = None) -> None:
        if not format_penalty >= 0:
            raise InvalidValueError(
                f"reward 'event_label': format_penalty must be >= 0, got {format_penalty!r}"
            )
        self.format_penalty = float(format_penalty)
        self.labels = tuple(labels) if labels else None

    def __call__(self, completion: str, example: Example) -> float:
        meta = example.meta if isinstance(example.meta, dict) else {}
        labels = self.labels or tuple(meta.get("labels", EVENTS))
        return event_reward(
            cut_at_stop(completion, DEFAULT_STOP),
            example.answer,
            labels=labels,
            format_penalty=self.format_penalty,
        )
