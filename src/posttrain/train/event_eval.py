"""Evaluation workflow of the dialogue event-detection task: greedy accuracy and macro-F1 of a trainer's
policy on the task's in-domain and out-of-domain splits (``docs/replay-and-curriculum.md``).

It lives in ``train`` (not in ``tasks``) because it drives a rollout engine and runner: a task defines
data and scoring only, and layers point down.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from posttrain.rollout import EngineContext, RunnerContext, SamplingParams, build_engine, build_runner
from posttrain.tasks.dialogue_events import EVENTS, classification_scores, parse_label
from posttrain.train.evaluate import EVAL_SEED


def evaluate_event_detection(
    trainer: Any, *, splits: Sequence[str] = ("heldout", "ood"), n: int | None = None
) -> dict[str, dict[str, float]]:
    """Greedy accuracy and macro-F1 of a :class:`~posttrain.train.rl.RLTrainer`'s policy on the
    task's in-domain (``heldout``) and ``ood`` splits, with its own engine and runner (the training
    RNG is untouched)."""
    cfg, task = trainer.cfg, trainer.task
    engine = build_engine(
        cfg.rollout.engine.name,
        cfg.rollout.engine.params,
        EngineContext(
            trainer.model, trainer.tokenizer, seed=EVAL_SEED, max_batch_size=cfg.rollout.max_batch_size
        ),
    )
    runner = build_runner(
        cfg.rollout.runner.name,
        cfg.rollout.runner.params,
        RunnerContext(engine, trainer.formatter, trainer.tokenizer, seed=EVAL_SEED),
    )
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
