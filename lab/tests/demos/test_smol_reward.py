"""The reward `posttrain demo smol` trains with (demo_smol.yaml: ``instructions_guarded``, mode reject,
the reward's probe thresholds) on answers that game its checkers: each must score below an honest
answer to the same prompt, through the real reward and the real task's prompts."""

from __future__ import annotations

from importlib.resources import files

import pytest

pytest.importorskip("if_verifiable")


@pytest.fixture(scope="module")
def demo():
    from posttrain.rewards import get_reward
    from posttrain.tasks import get_task
    from posttrain.train.config import RLConfig
    from posttrain.utils.config import build_config

    cfg = build_config(RLConfig, str(files("posttrain_lab.demos") / "demo_smol.yaml"), [])
    task = get_task(cfg.task.name, **{**cfg.task.params, "n_train": 1, "n_heldout": 200})
    return get_reward(cfg.reward.name, **cfg.reward.params), task.split("heldout"), cfg.task.params["types"]


def _topic(example) -> str:
    from posttrain.tasks.instructions import TOPICS

    return next(t for t in TOPICS if t in example.meta["request"])


def test_stacked_postscripts_in_the_checkers_spaced_spelling_score_below_an_honest_answer(demo):
    reward, held, _types = demo
    ex = next(e for e in held if e.meta["kwargs"][0].get("postscript_marker") == "P.P.S")
    topic = _topic(ex)
    body = (
        f"Many people enjoy {topic} because it brings calm, fresh ideas and good company; "
        "a little practice each week makes a real difference over the years."
    )
    honest = f"{body}\nP.P.S Start small and keep at it."
    stacked = f"{body}\nP. P. S Start small.\np. p. s Keep at it.\nP. P. S Thanks for asking."
    score_honest, comps_honest = reward.detailed(honest, ex)
    score_stacked, comps = reward.detailed(stacked, ex)
    assert comps_honest["strict"] == 1.0 and comps["strict"] == 1.0  # the checker passes both
    assert comps_honest["hacked"] == 0.0 and score_honest == 1.0
    assert comps["probe_marker_repeated"] == 1.0 and score_stacked < score_honest
