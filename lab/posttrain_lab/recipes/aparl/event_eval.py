"""Evaluation workflow of the dialogue event-detection task: greedy accuracy and macro-F1 of a trainer's
policy on the task's in-domain and out-of-domain splits (``docs/replay-and-curriculum.md``).

It lives in ``train`` (not in ``tasks``) because it drives a rollout engine and runner: a task defines
data and scoring only, and layers point down.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from posttrain.rollout import SamplingParams
from posttrain_lab.recipes.aparl.dialogue_events import EVENTS, classification_scores, parse_label


def evaluate_event_detection(
    trainer: Any, *, splits: Sequence[str] = ("heldout", "ood"), n: int | None = None
) -> dict[str, dict[str, float]]:
    """Greedy accuracy and macro-F1 of a :class:`~posttrain.train.rl.RLTrainer`'s policy on the
    task's in-domain (``heldout``) and ``ood`` splits, with the trainer's evaluation runner
    (:meth:`~posttrain.train.rl.RLTrainer.eval_runner`: the training RNG is untouched)."""
    cfg, task = trainer.cfg, trainer.task
    runner = trainer.eval_runner()
    labels = getattr(task, "labels", EVENTS)
    out: dict[str, dict[str, float]] = {}
    for s in splits:
        exs = task.split(s)[: n or None]
        eps = runner.run(
            exs,
            [1] * len(exs),
            SamplingParams(temperature=0.0, max_new_tokens=cfg.rollout.max_new_tokens, logprobs=False),
        )
        preds = [parse_label(t, labels) for t in eps.texts]
        out[s] = classification_scores(preds, [e.answer for e in eps.examples])
    return out
