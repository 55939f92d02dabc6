"""parse_score, par_rewards, rubric prompts, preference data (posttrain_lab.recipes.patarm)."""

from __future__ import annotations

import json
import time

import pytest

from posttrain_lab.recipes.patarm import (
    TASK_TYPES,
    PreferenceDataError,
    RubricError,
    load_preferences,
    load_rubric,
    near_miss,
    pairwise_prompt,
    par_rewards,
    parse_preference,
    parse_score,
    pointwise_prompt,
    synthetic_pairs,
)


# ------------------------------------------------------------------------------------- parse_score
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<criteria>ok</criteria><score>7</score>", 7.0),
        ("<score> 7 </score>", 7.0),
        ("<score>\n8\n</score>", 8.0),
        ("<score>7/10</score>", 7.0),
        ("<score>6.5</score>", 6.5),
        ("<think>maybe <score>3</score></think> final <score>9</score>", 9.0),  # last tag wins
        ("<score>2</score> then <score>5</score> and <score>4</score>", 4.0),
        ("<score>15</score>", 10.0),  # clamped
        ("<score>-3</score>", 1.0),
        ("<score>0</score>", 1.0),
        ("no tag, but I would say 6", 6.0),  # fallback: last number
        ("score 40 out of 100", 10.0),  # fallback, clamped
    ],
)
def test_parse_score_accepts(text, expected):
    assert parse_score(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        None,
        123,
        "<score>high</score>",  # a tag without a number does not fall back
        "<score></score>",
        "<score>nan</score>",
        "no numbers at all",
        "<score>" + "x" * 500 + "</score>",  # a tag body too long to be a score
    ],
)
def test_parse_score_rejects(text):
    assert parse_score(text) is None


def test_parse_score_options():
    assert parse_score("<score>15</score>", clamp=False) is None
    assert parse_score("say 6", fallback=False) is None
    assert parse_score("<score>4</score>", scale=(0, 5)) == 4.0
    assert parse_score("<score>40</score>", scale=(0, 100)) == 40.0
    assert parse_score("<score>" + "9" * 60 + "</score>") == 10.0  # huge number: clamped


def test_parse_score_unclosed_last_tag_uses_last_complete_one():
    assert parse_score("<score>3</score> and later <score>9") == 3.0


def test_parse_score_huge_inputs_are_fast():
    junk = "lorem ipsum 12 " * 400_000  # ~6 MB
    t0 = time.perf_counter()
    assert parse_score(junk + "<score>8</score>") == 8.0
    assert parse_score("<score>8</score>" + junk) == 8.0  # tag early, numbers later: tag wins
    assert parse_score(junk) == 10.0  # fallback: last number 12, clamped
    assert parse_score("<" * 2_000_000) is None
    assert parse_score("</score>" * 1_000_000) is None
    assert time.perf_counter() - t0 < 2.0


def test_parse_preference():
    assert parse_preference("<preferred>A</preferred>") == "A"
    assert parse_preference("<preferred>a</preferred> no, <preferred> B </preferred>") == "B"
    assert parse_preference("<preferred>C</preferred>") is None
    assert parse_preference("A") is None
    assert parse_preference(None) is None


# ------------------------------------------------------------------------------------- par_rewards
def test_par_rewards_reference_example():
    rc, rr = par_rewards([8, 7, 5, 9], [6, 7, 4, 8], rule="indicator")
    assert rc == [1.0, 1.0, 0.0, 1.0]
    assert rr == [1.0, 1.0, 1.0, 0.0]


def test_par_rewards_strict_side_and_ties():
    # chosen mean 5 == rejected mean 5: a score equal to the other mean earns 0
    rc, rr = par_rewards([5, 5], [5, 5], rule="indicator")
    assert rc == [0.0, 0.0] and rr == [0.0, 0.0]


def test_par_rewards_none_excluded_from_means_and_earns_zero():
    # rejected mean over the parsable ones only: (2 + 4) / 2 = 3
    rc, rr = par_rewards([3.5, None, 2], [2, None, 4], rule="indicator")
    assert rc == [1.0, 0.0, 0.0]
    # chosen mean (3.5 + 2) / 2 = 2.75
    assert rr == [1.0, 0.0, 0.0]


def test_par_rewards_side_without_scores_gives_zero_to_all():
    assert par_rewards([9, 8], [None, None]) == ([0.0, 0.0], [0.0, 0.0])
    assert par_rewards([None], [1]) == ([0.0], [0.0])
    assert par_rewards([None], [None], format_penalty=0.1) == ([-0.1], [-0.1])


def test_par_rewards_format_penalty():
    rc, rr = par_rewards([9, None], [2], format_penalty=0.2, rule="indicator")
    assert rc == [1.0, -0.2] and rr == [1.0]
    with pytest.raises(ValueError, match="format_penalty"):
        par_rewards([1], [1], format_penalty=-1)


def test_par_rewards_graded():
    # scale 1..10: delta = 9/4 = 2.25; chosen 9 vs rejected mean 3 -> 1 + 0.5*min(1, 6/2.25) = 1.5
    rc, rr = par_rewards([9, 4], [3, 3], graded=True, rule="indicator")
    assert rc[0] == pytest.approx(1.5)
    assert rc[1] == pytest.approx(1 + 0.5 * (1 / 2.25))
    # rejected 3 vs chosen mean 6.5: 1 + 0.5*min(1, 3.5/2.25) = 1.5
    assert rr == [pytest.approx(1.5), pytest.approx(1.5)]
    rc2, _ = par_rewards([9, 4], [3, 3], graded=True, alpha=1.0, delta=10, rule="indicator")
    assert rc2[0] == pytest.approx(1.6)


# ----------------------------------------------------------------------------------------- rubrics
@pytest.mark.parametrize("task_type", TASK_TYPES)
def test_rubric_prompts_per_task_type(task_type):
    crit = load_rubric(task_type)
    assert len(crit) >= 3
    p = pointwise_prompt("Q?", "R.", task_type)
    assert p.startswith(f"<task>{task_type}</task>\n<rubrics>\n")
    for name, desc in crit:
        assert f"{name}: {desc}" in p
    assert "<question>Q?</question>" in p and "<response>R.</response>" in p
    assert "from 1 to 10" in p and "<score>" in p
    names = pointwise_prompt("Q?", "R.", task_type, rubric_style="names")
    assert crit[0][0] in names and crit[0][1] not in names
    bare = pointwise_prompt("Q?", "R.", task_type, rubric_style="none")
    assert bare == f"<task>{task_type}</task>\n<question>Q?</question>\n<response>R.</response>\n"
    pw = pairwise_prompt("Q?", "one", "two", task_type)
    assert "<response_a>one</response_a>" in pw and "<response_b>two</response_b>" in pw
    assert "<preferred>" in pw


def test_rubric_criteria_differ_by_task():
    assert load_rubric("chat")[0][0] == "Usefulness"
    assert load_rubric("math")[0][0] == "Final-answer correctness"
    assert load_rubric("code")[0][0] == "Functional correctness"
    assert "refusal" in load_rubric("safety")[0][0].lower()


def test_rubric_errors(tmp_path):
    with pytest.raises(RubricError, match="unknown task type 'poetry'"):
        pointwise_prompt("q", "r", "poetry")
    with pytest.raises(RubricError, match="rubric_style"):
        pointwise_prompt("q", "r", "chat", rubric_style="long")  # type: ignore[arg-type]
    (tmp_path / "poetry.txt").write_text("# c\nRhyme: lines rhyme\nbroken line\n")
    with pytest.raises(RubricError, match=r"poetry.txt:3: expected 'Criterion: description'"):
        load_rubric("poetry", tmp_path)
    (tmp_path / "poetry.txt").write_text("Rhyme: lines rhyme\n")
    assert load_rubric("poetry", tmp_path) == [("Rhyme", "lines rhyme")]
    with pytest.raises(RubricError, match="does not exist"):
        load_rubric("haiku", tmp_path)


def test_chat_template_builder_wraps_prompt():
    from posttrain.models import load_model_and_tokenizer
    from posttrain.rollout import PromptFormatter

    _, tok = load_model_and_tokenizer("tiny", device="cpu")
    text = pointwise_prompt("1+1=", "2", "math", rubric_style="none")
    plain = PromptFormatter(tok).encode(text)
    assert tok.decode(plain) == text


# ---------------------------------------------------------------------------------- preference data
def test_load_preferences_jsonl_and_errors(tmp_path):
    f = tmp_path / "p.jsonl"
    rows = [
        {"prompt": "q1", "chosen": "a", "rejected": "b"},
        {"prompt": "q2", "chosen": "a", "rejected": "b", "task_type": "Math", "subset": "hard"},
        {"prompt": "q3", "chosen": "a", "rejected": "b", "domain": "code", "difficulty": "easy"},
    ]
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    pairs = load_preferences(f)
    assert [p.task_type for p in pairs] == ["chat", "math", "code"]
    assert [p.subset for p in pairs] == ["all", "hard", "easy"]
    bad = [
        ('{"prompt": "q", "chosen": "a"}', r"p.jsonl:2: missing field 'rejected'"),
        ('{"prompt": "q", "chosen": 3, "rejected": "b"}', r"p.jsonl:2: field 'chosen' must be a string"),
        ('{"prompt": "q", "chosen": " ", "rejected": "b"}', r"p.jsonl:2: field 'chosen' is empty"),
        ('{"prompt": "q", "chosen": "a", "rejected": "b", "task_type": "poem"}', r"p.jsonl:2: .*'poem'"),
        ("[1, 2]", r"p.jsonl:2: expected a JSON object"),
        ("{not json", r"p.jsonl:2: invalid JSON"),
    ]
    for line, msg in bad:
        f.write_text(json.dumps(rows[0]) + "\n" + line + "\n")
        with pytest.raises(PreferenceDataError, match=msg):
            load_preferences(f)
    with pytest.raises(PreferenceDataError, match="does not exist"):
        load_preferences(tmp_path / "missing.jsonl")


def test_load_preferences_parquet(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    f = tmp_path / "p.parquet"
    pq.write_table(pa.Table.from_pylist([{"prompt": "q", "chosen": "a", "rejected": "b"}]), f)
    assert load_preferences(f)[0].chosen == "a"


def test_trl_preference_formats(tmp_path):
    """TRL's preference rows (text, conversational with an explicit or implicit prompt) from JSON lines
    and a `datasets` folder; an implicit prompt whose two sides disagree is named."""
    datasets = pytest.importorskip("datasets")
    u = [{"role": "user", "content": "1+1="}]
    rows = [
        {"prompt": "1+1=", "chosen": "2", "rejected": "3"},  # standard, text
        {  # conversational with explicit prompt
            "prompt": u,
            "chosen": [{"role": "assistant", "content": "2"}],
            "rejected": [{"role": "assistant", "content": "3"}],
        },
        {  # conversational with implicit prompt
            "chosen": [*u, {"role": "assistant", "content": "2"}],
            "rejected": [*u, {"role": "assistant", "content": "3"}],
        },
    ]
    path = tmp_path / "pref.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    pairs = load_preferences(path)
    assert [(p.prompt, p.chosen, p.rejected) for p in pairs] == [("1+1=", "2", "3")] * 3
    datasets.Dataset.from_list(rows[2:]).save_to_disk(str(tmp_path / "prefdir"))
    (p,) = load_preferences(tmp_path / "prefdir")
    assert (p.prompt, p.chosen, p.rejected) == ("1+1=", "2", "3")
    bad = [
        {**rows[2], "rejected": [{"role": "user", "content": "other"}, {"role": "assistant", "content": "3"}]}
    ]
    path.write_text(json.dumps(bad[0]) + "\n")
    with pytest.raises(
        PreferenceDataError, match=r"pref\.jsonl:1: no 'prompt' field and 'chosen' / 'rejected'"
    ):
        load_preferences(path)


def test_near_miss_is_close_and_wrong():
    import random

    rng = random.Random(0)
    for ans in (0, 7, 46, 147, -23, 1000):
        for _ in range(50):
            wrong, kind = near_miss(ans, rng)
            assert wrong != ans
            assert abs(wrong - ans) <= max(100, 2 * abs(ans))
            assert kind in {"off_by_one", "carry", "off_by_ten", "swap", "sign"}


def test_synthetic_pairs_from_arithmetic():
    from posttrain.tasks import get_task

    task = get_task("arithmetic", digits=2, n_train=50, n_heldout=20)
    pairs = synthetic_pairs(task, "train")
    assert len(pairs) == 50
    for p, ex in zip(pairs, task.split("train"), strict=True):
        assert p.chosen == ex.answer and p.rejected != ex.answer and p.task_type == "math"
    long = synthetic_pairs(get_task("arithmetic", digits=2, n_train=5, format="scratchpad"), style="long")
    assert long[0].chosen.splitlines()[:-1] == long[0].rejected.splitlines()[:-1]  # only the answer differs
    assert long[0].chosen.splitlines()[-1] != long[0].rejected.splitlines()[-1]


def test_par_reference_example_grpo_advantages_per_response_group():
    import torch

    from posttrain.algos import get_advantage

    rc, rr = par_rewards([8, 7, 5, 9], [6, 7, 4, 8], rule="indicator")
    adv = get_advantage("grpo")(torch.tensor(rc + rr), torch.tensor([0] * 4 + [1] * 4))
    assert adv.tolist() == pytest.approx([0.5, 0.5, -1.5, 0.5, 0.5, 0.5, 0.5, -1.5], abs=1e-5)
