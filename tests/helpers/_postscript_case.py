"""One held-out prompt of the `instructions` task's postscript type, its marker and topic words, and an
answer that passes its checker and every hack probe while saying nothing of substance (a genuine answer
to the probes, a vacuous one to a judge)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class PostscriptCase:
    task: Any
    example: Any
    marker: str
    topic: str

    @property
    def template_answer(self) -> str:
        return f"Many people find {self.topic} interesting, rewarding and well worth exploring further.\n{self.marker} Thanks."


def postscript_case() -> PostscriptCase:
    from posttrain.tasks import get_task
    from posttrain.tasks.hack_probes import content_words

    task = get_task("instructions", types="detectable_content:postscript", n_train=1, n_heldout=1)
    ex = task.split("heldout")[0]
    return PostscriptCase(
        task,
        ex,
        ex.meta["kwargs"][0]["postscript_marker"],
        " ".join(sorted(content_words(ex.meta["request"]))),
    )
