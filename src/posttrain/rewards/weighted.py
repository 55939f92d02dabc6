"""`weighted`: a weighted sum of rewards, `R = Σ_k w_k · r_k(completion, example)`.

`components` is a list of `(name, weight)`, `(name, weight, params)`, dicts
`{"name": ..., "weight": ..., "params": {...}, "label": ...}`, or reward objects (weight 1).
`detailed()` returns the total and each component's raw (unweighted) value keyed by its label
(the reward name; `name#2`, `name#3` for repeats), which `RewardPool` reports as
`RewardResult.components` for per-component metrics.
"""

from __future__ import annotations

from typing import Any

from posttrain.rewards.base import as_reward_value, get_reward, register_reward
from posttrain.tasks.base import Example
from posttrain.utils.errors import InvalidValueError


@register_reward("weighted", aliases=("sum",))
class WeightedReward:
    name = "weighted"

    def __init__(self, components: list[Any]) -> None:
        if not isinstance(components, list | tuple) or not components:
            raise InvalidValueError(
                "reward 'weighted': components must be a non-empty list of (name, weight[, params])"
            )
        self.parts: list[tuple[str, float, Any]] = []
        labels: dict[str, int] = {}
        for i, spec in enumerate(components):
            label, weight, fn = self._build(i, spec)
            labels[label] = labels.get(label, 0) + 1
            if labels[label] > 1:
                label = f"{label}#{labels[label]}"
            self.parts.append((label, weight, fn))

    @staticmethod
    def _build(i: int, spec: Any) -> tuple[str, float, Any]:
        where = f"reward 'weighted': components[{i}]"
        if callable(spec) and hasattr(spec, "name"):
            return str(spec.name), 1.0, spec
        label = None
        if isinstance(spec, dict):
            unknown = set(spec) - {"name", "weight", "params", "label"}
            if unknown or "name" not in spec:
                raise InvalidValueError(
                    f"{where}: expected keys name, weight, params, label; got {sorted(spec)}"
                )
            name, weight, params, label = (
                spec["name"],
                spec.get("weight", 1.0),
                spec.get("params", {}),
                spec.get("label"),
            )
        elif isinstance(spec, list | tuple) and len(spec) in (2, 3):
            name, weight = spec[0], spec[1]
            params = spec[2] if len(spec) == 3 else {}
        else:
            raise InvalidValueError(
                f"{where}: expected (name, weight) or (name, weight, params), got {spec!r}"
            )
        if not isinstance(name, str):
            raise InvalidValueError(f"{where}: reward name must be a string, got {name!r}")
        if isinstance(weight, bool) or not isinstance(weight, int | float):
            raise InvalidValueError(f"{where}: weight must be a number, got {weight!r}")
        if not isinstance(params, dict):
            raise InvalidValueError(f"{where}: params must be a mapping, got {params!r}")
        return str(label or name), float(weight), get_reward(name, **params)

    def setup(self) -> None:
        for _, _, fn in self.parts:
            s = getattr(fn, "setup", None)
            if callable(s):
                s()

    def detailed(self, completion: str, example: Example) -> tuple[float, dict[str, float]]:
        values = {
            label: as_reward_value(fn(completion, example), example, f"reward part {label!r}")
            for label, _, fn in self.parts
        }
        total = sum(w * values[label] for label, w, _ in self.parts)
        return total, values

    def __call__(self, completion: str, example: Example) -> float:
        return self.detailed(completion, example)[0]
