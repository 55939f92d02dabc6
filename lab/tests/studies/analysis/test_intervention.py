"""Knowledge-intervention group construction (renmengjie7/Self-Aligning data/group, partial_correlation.py)."""

from __future__ import annotations

import pytest

from posttrain_lab.studies.analysis import MCQ, ProbeResult, ProbeSet
from posttrain_lab.studies.analysis.intervention import (
    CORRECT,
    GOLDEN,
    PREDICT,
    _fenced,
    build_groups,
    chat_row,
    explanation_prompt,
    group_names,
    group_ratio,
    mixture_name,
    template_explainer,
)


def _setup(n_right=4, n_wrong=10):
    qs, res = [], []
    for i in range(n_right + n_wrong):
        q = MCQ(f"q{i}?", ("w", "x", "y", "z"), i % 4, id=f"q{i}", meta={"subject": f"S{i}"})
        pred = q.answer if i < n_right else (q.answer + 1) % 4
        p = [0.1] * 4
        p[pred] = 0.7
        qs.append(q)
        res.append(ProbeResult(q.id, p, pred, q.answer, pred == q.answer, p[q.answer], p[pred]))
    return qs, ProbeSet(res, "base", 0, "d")


def test_groups_sizes_targets_and_mixtures():
    qs, ps = _setup()
    groups = build_groups(qs, ps, ratios=[0.2, 0.5])
    assert list(groups) == [CORRECT, GOLDEN, mixture_name(0.2), mixture_name(0.5), PREDICT]
    assert {len(v) for v in groups.values()} == {4}  # min(#right, #wrong)
    assert all(it.target == it.mcq.answer for it in groups[CORRECT] + groups[GOLDEN])
    assert all(ps.results[int(it.mcq.id[1:])].correct for it in groups[CORRECT])
    assert all(it.own_prediction for it in groups[PREDICT])
    wrong_ids = [it.mcq.id for it in groups[GOLDEN]]
    for r, k in ((0.2, 1), (0.5, 2)):  # round(r * 4) own predictions, on the same items
        g = groups[mixture_name(r)]
        assert [it.mcq.id for it in g] == wrong_ids and sum(it.own_prediction for it in g) == k
    assert (
        groups[PREDICT][0].explanation
        == f'The answer is "{groups[PREDICT][0].mcq.choices[groups[PREDICT][0].target]}".'
    )
    assert group_ratio(GOLDEN) == 0 and group_ratio(PREDICT) == 1 and group_ratio(mixture_name(0.05)) == 0.05
    assert group_ratio(CORRECT) is None and len(group_names()) == 9


def test_group_errors_and_rows():
    qs, ps = _setup(n_right=0)
    with pytest.raises(ValueError, match="answered 0 of 10"):
        build_groups(qs, ps)
    only_wrong = build_groups(qs, ps, groups=[GOLDEN, PREDICT], size=3)
    assert {len(v) for v in only_wrong.values()} == {3}
    with pytest.raises(ValueError, match="unknown group 'nope'"):
        build_groups(qs, ps, groups=["nope"])
    with pytest.raises(ValueError, match="unknown field"):
        template_explainer("{missing}")(qs[0], 0)
    it = only_wrong[PREDICT][0]
    row = chat_row(it, "towns")
    assert row["messages"][0]["content"].endswith("\nAnswer:")
    assert (
        row["messages"][1]["content"] == f"{'ABCD'[it.target]}. {it.mcq.choices[it.target]}\n{it.explanation}"
    )
    assert explanation_prompt(qs[0], 1, "towns") == (
        'The following is a multi choice question about towns.\n\nq0?\nA. w\nB. x\nC. y\nD. z\n\nThe answer is "x". '
        "Please explain why.\n"
    )
    assert _fenced("```\nBecause.\n```\nmore") == "Because." and _fenced(" plain ") == "plain"


def test_model_explanations_run():
    from posttrain.models import load_model_and_tokenizer
    from posttrain_lab.studies.analysis.intervention import model_explanations

    qs, _ = _setup()
    model, tok = load_model_and_tokenizer("tiny")
    out = model_explanations(model, tok, [(qs[0], 1), (qs[1], 2)], domain="d", max_new_tokens=4)
    assert len(out) == 2 and all(isinstance(s, str) for s in out)
