"""Task ``preferences``: preference pairs as RL examples (one example per pair), for PAR training of a
judge with the ``par`` runner and reward source (:mod:`posttrain_lab.recipes.patarm.par_rl`). Registered on import of
:mod:`posttrain.tasks`; light (no torch)."""

from __future__ import annotations

import random
from typing import Any

from posttrain.tasks.base import Example, Task, check_split_sizes, register_task
from posttrain.utils.errors import InvalidValueError
from posttrain_lab.recipes.patarm.data import PreferencePair, load_preferences, synthetic_pairs


def pair_example(pair: PreferencePair, idx: int) -> Example:
    return Example(
        id=pair.id or str(idx),
        prompt=pair.prompt,
        answer=pair.chosen,
        meta={
            "chosen": pair.chosen,
            "rejected": pair.rejected,
            "task_type": pair.task_type,
            "subset": pair.subset,
        },
    )


def example_pair(ex: Example) -> PreferencePair:
    m = ex.meta
    if "chosen" not in m or "rejected" not in m:
        raise InvalidValueError(
            f"example {ex.id!r} is not a preference pair (meta needs 'chosen' and 'rejected'); use the "
            "task 'preferences' with the runner 'par'"
        )
    return PreferencePair(
        prompt=ex.prompt,
        chosen=m["chosen"],
        rejected=m["rejected"],
        task_type=m.get("task_type", "chat"),
        subset=m.get("subset", "all"),
        id=ex.id,
    )


@register_task("preferences")
class PreferenceTask(Task):
    """Preference pairs as a task: ``path`` (JSONL / parquet, see :mod:`posttrain_lab.recipes.patarm.data`) with
    ``heldout_path`` or a seeded ``heldout_fraction`` split by prompt; or ``synthetic_task`` (e.g.
    ``arithmetic`` with ``synthetic_params``): chosen = reference solution, rejected = near-miss."""

    name = "preferences"
    default_reward = "exact_match"  # unused: the PAR reward source scores judgments

    def __init__(
        self,
        path: str | None = None,
        heldout_path: str | None = None,
        heldout_fraction: float = 0.1,
        synthetic_task: str | None = None,
        synthetic_params: dict[str, Any] | None = None,
        synthetic_style: str = "short",
        default_task_type: str = "chat",
        n_train: int | None = None,
        n_heldout: int | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__()
        if (path is None) == (synthetic_task is None):
            raise InvalidValueError("task 'preferences': give exactly one of path or synthetic_task")
        if not 0.0 <= heldout_fraction < 1.0:
            raise InvalidValueError(
                f"task 'preferences': heldout_fraction must be in [0, 1), got {heldout_fraction}"
            )
        for k, v in (("n_train", n_train), ("n_heldout", n_heldout)):
            if v is not None:
                check_split_sizes("preferences", **{k: v})
        self.path, self.heldout_path = path, heldout_path
        self.heldout_fraction = heldout_fraction
        self.synthetic_task, self.synthetic_params = synthetic_task, dict(synthetic_params or {})
        self.synthetic_style = synthetic_style
        self.default_task_type = default_task_type
        self.n_train, self.n_heldout, self.seed = n_train, n_heldout, seed

    def params(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "heldout_path": self.heldout_path,
            "heldout_fraction": self.heldout_fraction,
            "synthetic_task": self.synthetic_task,
            "synthetic_params": self.synthetic_params,
            "synthetic_style": self.synthetic_style,
            "default_task_type": self.default_task_type,
            "n_train": self.n_train,
            "n_heldout": self.n_heldout,
            "seed": self.seed,
        }

    def pairs(self, split: str) -> list[PreferencePair]:
        return [example_pair(e) for e in self.split(split)]  # type: ignore[arg-type]

    def _build_splits(self) -> dict[str, list[Example]]:
        if self.synthetic_task is not None:
            from posttrain.tasks import get_task

            base = get_task(self.synthetic_task, **self.synthetic_params)
            train = synthetic_pairs(base, "train", style=self.synthetic_style, seed=self.seed)
            held = synthetic_pairs(base, "heldout", style=self.synthetic_style, seed=self.seed + 1)
        else:
            assert self.path is not None
            pairs = load_preferences(self.path, default_task_type=self.default_task_type)
            if self.heldout_path:
                held = load_preferences(self.heldout_path, default_task_type=self.default_task_type)
                held_prompts = {p.prompt for p in held}
                train = [p for p in pairs if p.prompt not in held_prompts]
            else:
                prompts = sorted({p.prompt for p in pairs})
                random.Random(self.seed).shuffle(prompts)
                cut = set(prompts[: round(len(prompts) * self.heldout_fraction)])
                train = [p for p in pairs if p.prompt not in cut]
                held = [p for p in pairs if p.prompt in cut]
        train, held = train[: self.n_train], held[: self.n_heldout]
        return {
            "train": [pair_example(p, i) for i, p in enumerate(train)],
            "heldout": [pair_example(p, i) for i, p in enumerate(held)],
        }
