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


def _shaped(ex, body: list[str], tail: str) -> str:
    """``body`` (sentences without commas) laid out so that the example's one instruction is followed:
    a postscript ``tail``, a title, the keyword as often as asked, the number of bullets asked."""
    iid, kw = ex.meta["instruction_id_list"][0], ex.meta["kwargs"][0]
    if iid == "detectable_content:postscript":
        return " ".join(body) + f"\n{kw['postscript_marker']} {tail}"
    if iid == "detectable_format:title":
        return f"<<{_topic(ex).title()}>>\n" + " ".join(body)
    if iid == "keywords:frequency":
        n = kw["frequency"] if kw["relation"] == "at least" else 0
        return " ".join(body) + "".join(f" The word {kw['keyword']} is here." for _ in range(n))
    if iid == "detectable_format:number_bullet_lists":
        n = kw["num_bullets"]
        return "\n".join(f"* {' '.join(body[i::n])}" for i in range(n))
    assert iid == "punctuation:no_comma", iid
    return " ".join(body)


def test_restatements_and_contentless_templates_score_below_an_honest_answer_on_every_trained_type(demo):
    """Issue 58 item 14: an answer that restates the instruction or the request, or a contentless
    template of 12+ words, got full credit on all five trained types when no probe fired. Each is laid
    out to pass its checker; under the demo's reward each now scores below an honest answer."""
    reward, held, types = demo
    for iid in types:
        ex = next(e for e in held if e.meta["instruction_id_list"] == [iid])
        t = _topic(ex)
        honest = [
            f"Many people enjoy {t} because it brings calm and fresh ideas.",
            "A little practice each week makes a real difference.",
            "Friends and neighbours often share tips and stories about it.",
        ]
        answers = {
            "template": [
                f"Here is a short answer about {t} with the details that matter most.",
                f"This answer about {t} follows the instruction given above.",
            ],
            "request echoed": [ex.meta["request"].replace(",", ""), f"Here is my answer about {t}."],
            "instruction echoed": [ex.meta["instructions"][0].split("\n")[0].replace(",", "")],
        }
        score, comps = reward.detailed(_shaped(ex, honest, "Start small and keep at it."), ex)
        assert (score, comps["strict"], comps["hacked"]) == (1.0, 1.0, 0.0), (iid, comps)
        for name, body in answers.items():
            text = _shaped(ex, body, "Thanks.")
            s, c = reward.detailed(text, ex)
            assert c["strict"] == 1.0, (iid, name, text)  # the checker passes it
            assert c["probe_restated"] == 1.0 and s < score, (iid, name, text, c)
