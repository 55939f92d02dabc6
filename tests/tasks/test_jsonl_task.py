"""jsonl dataset loader: fields, answer extraction, splits, and exact bad-row errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from posttrain.rewards import get_reward
from posttrain.tasks import DatasetError, get_task, gsm8k_final, last_boxed

GSM_ROWS = [
    {
        "question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many "
        "clips in May. How many clips did Natalia sell altogether in April and May?",
        "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 "
        "clips altogether in April and May.\n#### 72",
    },
    {
        "question": "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of "
        "babysitting. How much did she earn?",
        "answer": "Weng earns 12/60 = $<<12/60=0.2>>0.2 per minute.\nWorking 50 minutes, she earned "
        "0.2 x 50 = $<<0.2*50=10>>10.\n#### 10",
    },
]
MATH_ROWS = [
    {
        "problem": "What is $\\frac{1}{4} + \\frac{1}{4}$?",
        "solution": "Adding, $\\frac{1}{4}+\\frac{1}{4} = \\frac{2}{4} = \\boxed{\\frac{1}{2}}$.",
        "unique_id": "test/algebra/1.json",
    },
    {
        "problem": "Compute $\\sqrt{16}$.",
        "solution": "Since $4^2 = 16$, the answer is $\\boxed{4}$.",
        "unique_id": "test/algebra/2.json",
    },
]


def _write(path: Path, rows: list) -> Path:
    lines = [r if isinstance(r, str) else json.dumps(r) for r in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _many(n: int) -> list[dict]:
    return [{"question": f"q{i}", "answer": f"#### {i}"} for i in range(n)]


def test_gsm8k_rows_extract_and_score(tmp_path: Path) -> None:
    p = _write(tmp_path / "gsm.jsonl", GSM_ROWS)
    t = get_task("jsonl", path=p, answer_extract="gsm8k", heldout_fraction=0.0)
    train = t.split("train")
    assert [e.answer for e in train] == ["72", "10"]
    assert [e.id for e in train] == ["gsm:1", "gsm:2"]
    assert train[0].prompt == GSM_ROWS[0]["question"]
    assert t.split("heldout") == []
    assert t.default_reward == "numeric"
    num, em = get_reward("numeric"), get_reward("exact_match")
    for e in train:
        for style in ("short", "long"):
            ref = t.reference_completion(e, style)
            assert num(ref, e) == 1.0 and em(ref, e) == 1.0
        assert num("#### 11", e) == 0.0
    assert t.reference_completion(train[0], "long") == (
        "Natalia sold 48/2 = 24 clips in May.\nNatalia sold 48+24 = 72 clips altogether in April and May.\n#### 72"
    )
    assert train[0].meta["raw_answer"] == GSM_ROWS[0]["answer"]
    raw = get_task("jsonl", path=p, answer_extract="gsm8k", heldout_fraction=0.0, strip_calculator=False)
    assert raw.reference_completion(raw.split("train")[0], "long") == GSM_ROWS[0]["answer"]


def test_math_rows_boxed_template_ids_and_math_verify(tmp_path: Path) -> None:
    p = _write(tmp_path / "math.jsonl", MATH_ROWS)
    t = get_task(
        "jsonl",
        path=p,
        prompt_field="problem",
        answer_field="solution",
        id_field="unique_id",
        answer_extract="boxed",
        prompt_template="Problem: {question}\nPut the answer in \\boxed{{}}.\nSource: {unique_id}\n",
        heldout_fraction=0.0,
    )
    train = t.split("train")
    assert [e.answer for e in train] == ["\\frac{1}{2}", "4"]
    assert [e.id for e in train] == ["test/algebra/1.json", "test/algebra/2.json"]
    assert train[0].prompt == (
        "Problem: What is $\\frac{1}{4} + \\frac{1}{4}$?\nPut the answer in \\boxed{}.\n"
        "Source: test/algebra/1.json\n"
    )
    assert t.default_reward == "math_verify"
    mv = get_reward("math_verify")
    for e in train:
        assert mv(t.reference_completion(e, "long"), e) == 1.0
        assert mv(t.reference_completion(e, "short"), e) == 1.0
    assert mv("so it is 0.5", train[0]) == 1.0
    assert mv("$\\boxed{5}$", train[1]) == 0.0


def test_fraction_split_is_seeded_and_disjoint_by_prompt(tmp_path: Path) -> None:
    rows = _many(200) + [{"question": "q7", "answer": "#### 7"}] * 3  # duplicates of one prompt
    p = _write(tmp_path / "d.jsonl", rows)
    a = get_task("jsonl", path=p, answer_extract="gsm8k", heldout_fraction=0.25, seed=5)
    b = get_task("jsonl", path=p, answer_extract="gsm8k", heldout_fraction=0.25, seed=5)
    c = get_task("jsonl", path=p, answer_extract="gsm8k", heldout_fraction=0.25, seed=6)
    assert a.split("heldout") == b.split("heldout") and a.split("train") == b.split("train")
    assert a.split("heldout") != c.split("heldout")
    train_p = {e.prompt for e in a.split("train")}
    held_p = {e.prompt for e in a.split("heldout")}
    assert not train_p & held_p
    assert len(a.split("train")) + len(a.split("heldout")) == 203  # nothing dropped
    assert len(held_p) == 50
    assert {e.meta["split"] for e in a.split("heldout")} == {"heldout"}


def test_heldout_path_and_overlap_report(tmp_path: Path) -> None:
    train_p = _write(tmp_path / "train.jsonl", _many(10))
    held_p = _write(
        tmp_path / "test.jsonl",
        [{"question": "q3", "answer": "#### 3"}, {"question": "z", "answer": "#### 0"}],
    )
    with pytest.warns(UserWarning, match="removed 1 train row"):
        t = get_task("jsonl", path=train_p, heldout_path=held_p, answer_extract="gsm8k")
    assert len(t.split("train")) == 9 and len(t.split("heldout")) == 2
    assert t.load_report["overlap_removed_from_train"] == 1
    with pytest.raises(ValueError, match="either heldout_path or heldout_fraction"):
        get_task("jsonl", path=train_p, heldout_path=held_p, heldout_fraction=0.1)


BAD_ROWS = [
    ('{"question": "a", "answer": "1"', "row 2: invalid JSON (Expecting ',' delimiter at column 32)"),
    ('["a", "1"]', "row 2: expected a JSON object, got list"),
    (
        {"prompt": "a", "answer": "1"},
        "row 2: missing field 'question' (expected a non-empty string; the row has fields: answer, prompt)",
    ),
    ({"question": 5, "answer": "1"}, "row 2: field 'question' must be a string, got int (5)"),
    (
        {"question": "a", "answer": None},
        "row 2: field 'answer' must be a string or an integer, got null (None)",
    ),
    (
        {"question": "a", "answer": ["1"]},
        "row 2: field 'answer' must be a string or an integer, got list (['1'])",
    ),
    ({"question": "  ", "answer": "1"}, "row 2: field 'question' is empty (expected a non-empty string)"),
]


@pytest.mark.parametrize(("bad", "message"), BAD_ROWS)
def test_bad_rows_name_file_row_and_field(tmp_path: Path, bad, message: str) -> None:
    p = _write(
        tmp_path / "bad.jsonl", [{"question": "ok", "answer": "1"}, bad, {"question": "ok2", "answer": "2"}]
    )
    with pytest.raises(DatasetError) as info:
        get_task("jsonl", path=p)
    assert str(info.value) == f"{p}: {message}"


def test_extraction_failures_and_duplicate_ids(tmp_path: Path) -> None:
    p = _write(
        tmp_path / "g.jsonl", [{"question": "a", "answer": "#### 1"}, {"question": "b", "answer": "2"}]
    )
    with pytest.raises(DatasetError) as info:
        get_task("jsonl", path=p, answer_extract="gsm8k")
    assert (
        str(info.value) == f"{p}: row 2: field 'answer' has no '#### <final answer>' (answer_extract='gsm8k')"
    )
    p = _write(tmp_path / "m.jsonl", [{"question": "a", "answer": "so $\\boxed{}$"}])
    with pytest.raises(DatasetError, match=r"row 1: field 'answer' has no non-empty \\boxed"):
        get_task("jsonl", path=p, answer_extract="boxed")
    p = _write(
        tmp_path / "ids.jsonl",
        [{"question": "a", "answer": "1", "id": 7}, {"question": "b", "answer": "2", "id": "7"}],
    )
    with pytest.raises(DatasetError) as info:
        get_task("jsonl", path=p, id_field="id")
    assert (
        str(info.value)
        == f"{p}: row 2: field 'id': duplicate id '7' (first seen at row 1); ids must be unique"
    )


def test_skip_bad_rows_counts_and_reports(tmp_path: Path) -> None:
    rows = [*_many(5), "{not json", {"question": "x"}, {"question": "", "answer": "#### 1"}]
    p = _write(tmp_path / "mixed.jsonl", rows)
    with pytest.warns(UserWarning, match=r"skipped 3 bad row\(s\) of 8"):
        t = get_task("jsonl", path=p, answer_extract="gsm8k", skip_bad_rows=True, heldout_fraction=0.0)
    assert len(t.split("train")) == 5
    rep = t.load_report[str(p)]
    assert rep["bad_rows"] == 3 and rep["examples"] == 5
    assert rep["bad_row_messages"][0].startswith(f"{p}: row 6: invalid JSON")


def test_file_level_errors(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="does not exist"):
        get_task("jsonl", path=tmp_path / "missing.jsonl")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(DatasetError, match="no usable rows"):
        get_task("jsonl", path=empty)
    bad_utf = tmp_path / "latin1.jsonl"
    bad_utf.write_bytes(b'{"question": "caf\xe9", "answer": "1"}\n')
    with pytest.raises(DatasetError, match="row 1: not valid UTF-8"):
        get_task("jsonl", path=bad_utf)
    with pytest.raises(ValueError, match="must contain '\\{question\\}'"):
        get_task("jsonl", path=empty, prompt_template="Q: {problem}")
    with pytest.raises(ValueError, match="unmatched '\\}'"):
        get_task("jsonl", path=empty, prompt_template="{question} }")


def test_a_utf8_byte_order_mark_is_accepted_by_rl_and_sft_alike(tmp_path: Path) -> None:
    """Issue 41 item 23: a file saved "UTF-8 with BOM" (Windows editors) was refused by the task reader
    (`rl`, `eval`) and accepted by the SFT reader; both accept it now, .jsonl and .json."""
    from posttrain.train.sft_data import read_sft_file

    bom = "\ufeff"
    jl = tmp_path / "bom.jsonl"
    jl.write_text(bom + "\n".join(json.dumps(r) for r in GSM_ROWS) + "\n", encoding="utf-8")
    ja = tmp_path / "bom.json"
    ja.write_text(bom + json.dumps(GSM_ROWS), encoding="utf-8")
    for p in (jl, ja):
        assert p.read_bytes().startswith(b"\xef\xbb\xbf")
        t = get_task("jsonl", path=p, answer_extract="gsm8k", heldout_fraction=0.0)
        assert [e.answer for e in t.split("train")] == ["72", "10"], p
    sft = [{"prompt": "1+1=", "completion": "2"}]
    (tmp_path / "sft.jsonl").write_text(bom + json.dumps(sft[0]) + "\n", encoding="utf-8")
    (tmp_path / "sft.json").write_text(bom + json.dumps(sft), encoding="utf-8")
    for name in ("sft.jsonl", "sft.json"):
        assert len(read_sft_file(tmp_path / name)) == 1, name


def test_json_array_files_and_parquet(tmp_path: Path) -> None:
    p = tmp_path / "rows.json"
    p.write_text(json.dumps(GSM_ROWS))
    t = get_task("jsonl", path=p, answer_extract="gsm8k", heldout_fraction=0.0)
    assert [e.answer for e in t.split("train")] == ["72", "10"]
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    pp = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist(GSM_ROWS), pp)
    tp = get_task("jsonl", path=pp, answer_extract="gsm8k", heldout_fraction=0.0)
    assert [e.answer for e in tp.split("train")] == ["72", "10"]


def test_parquet_without_pyarrow_says_what_to_install(tmp_path: Path, monkeypatch) -> None:
    import builtins

    real_import = builtins.__import__

    def no_pyarrow(name, *args, **kwargs):
        if name.startswith("pyarrow"):
            raise ImportError("no pyarrow")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pyarrow)
    pp = tmp_path / "x.parquet"
    pp.write_bytes(b"PAR1")
    with pytest.raises(DatasetError, match="needs pyarrow"):
        get_task("jsonl", path=pp)


def test_corrupt_parquet_is_a_dataset_error(tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")
    pp = tmp_path / "bad.parquet"
    pp.write_bytes(b"not parquet at all")
    with pytest.raises(DatasetError, match=r"bad\.parquet: not a readable parquet file"):
        get_task("jsonl", path=pp)


@pytest.mark.parametrize(
    ("text", "boxed"),
    [
        ("so $\\boxed{\\frac{1}{2}}$", "\\frac{1}{2}"),
        ("\\boxed{1} then \\boxed{{2}+1}", "{2}+1"),
        ("\\boxed 5$", "5"),
        ("\\boxed 5 and then {x}", "5"),
        ("\\fbox 7", "7"),
        ("\\boxed {4}", "4"),
        ("\\boxed", None),
        ("\\fbox{3}", "3"),
        ("no box", None),
        ("\\boxed{unclosed", None),
    ],
)
def test_last_boxed(text: str, boxed: str | None) -> None:
    assert last_boxed(text) == boxed


def test_gsm8k_final() -> None:
    assert gsm8k_final("a\n#### 1,000") == "1,000"
    assert gsm8k_final("#### ") is None
    assert gsm8k_final("none") is None
