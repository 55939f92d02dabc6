"""SFT judgment-trace templates of the PaTaRM demo (proposed design): range / fixed / check."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from posttrain_lab.recipes.patarm import parse_score
from posttrain_lab.recipes.patarm.data import PreferencePair
from posttrain_lab.recipes.patarm.demo import check_marks, judgment_traces

PAIR = PreferencePair(
    prompt="98+49=?\n",
    chosen="8+9+0=17 write 7 carry 1\n9+4+1=14 write 4 carry 1\nwrite 1\n#### 147",
    rejected="8+9+0=17 write 7 carry 1\n9+4+1=14 write 4 carry 1\nwrite 1\n#### 174",
    task_type="math",
    id="p0",
)


def test_check_marks_closed_form():
    assert check_marks("147", "174") == "11= 47x 74x"
    assert check_marks("147", "147") == "11= 44= 77="
    assert check_marks("95", "105") == "91x 50x _5x"
    assert check_marks("105", "95") == "19x 05x 5_x"


@given(st.from_regex(r"[0-9]{1,4}", fullmatch=True), st.from_regex(r"[0-9]{1,4}", fullmatch=True))
def test_check_marks_has_a_mismatch_iff_the_answers_differ(a, b):
    marks = check_marks(a, b)
    assert ("x" in marks) == (a != b)
    assert len(marks.split()) == max(len(a), len(b))


def test_templates():
    (pc, tc), (pr, tr) = judgment_traces([PAIR], template="check")
    assert tc == "<criteria>11= 44= 77=</criteria><score>8</score>"
    assert tr == "<criteria>11= 47x 74x</criteria><score>3</score>"
    assert "#### 147" in pc and "#### 174" in pr and parse_score(tc) == 8 and parse_score(tr) == 3
    assert [t for _, t in judgment_traces([PAIR], template="fixed", good=9, bad=2)] == [
        "<score>9</score>",
        "<score>2</score>",
    ]
    for seed in range(20):
        (_, c), (_, r) = judgment_traces([PAIR], template="range", seed=seed)
        assert 7 <= parse_score(c) <= 10 and 1 <= parse_score(r) <= 4


def test_bad_template_and_missing_answer_are_clear_errors():
    with pytest.raises(ValueError, match="unknown trace template 'nope'"):
        judgment_traces([PAIR], template="nope")
    bad = PreferencePair(prompt="q", chosen="no marker", rejected="x", task_type="chat", id="row7")
    with pytest.raises(ValueError, match=r"pair row7 chosen.*'####'"):
        judgment_traces([bad], template="check")
    assert len(judgment_traces([bad], template="fixed")) == 2  # no answer needed


def test_cli_rm_sft_from_pairs_with_check_traces(tmp_path):
    import json

    from typer.testing import CliRunner

    from posttrain.cli import app

    data = tmp_path / "p.jsonl"
    data.write_text(json.dumps(PAIR.to_row()) + "\n")
    out = tmp_path / "judge"
    args = ["rm", "sft", "--pairs", str(data), "--task-type", "math", "--rubric-style", "none"]
    common = ["model.name=tiny", "steps=2", "batch_size=2", "progress=false", f"out_dir={out}"]
    r = CliRunner().invoke(app, [*args, "--trace", "check", *common])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output.strip().splitlines()[-1])["steps"] == 2
    # a pair without a '#### answer' cannot give a check trace: the file and the pair are named
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "q", "chosen": "a", "rejected": "b", "id": "r1"}) + "\n")
    r = CliRunner().invoke(app, ["rm", "sft", "--pairs", str(bad), "--trace", "check", *common])
    assert r.exit_code == 2 and "bad.jsonl" in r.output and "'####'" in r.output
    r = CliRunner().invoke(app, ["rm", "sft", "--pairs", str(bad), "--trace", "nope", *common])
    assert r.exit_code == 2 and "unknown trace template" in r.output
