"""Preference rows: TRL's four formats (standard / conversational, explicit / implicit prompt) from
JSONL, parquet and ``save_to_disk`` folders, the implicit prompt as TRL's ``extract_prompt`` finds it,
the encoding of conversations with the chat template, length limits with SFT's three choices, and
errors that name the file, row and field."""

from __future__ import annotations

import json

import pytest

from posttrain.models import load_adapter
from posttrain.rollout import PromptFormatter
from posttrain.train.lengths import LengthError
from posttrain.train.preference_data import (
    EncodedPair,
    OfflinePairs,
    PreferenceDataError,
    PreferenceFields,
    bound_pairs,
    encode_pair,
    parse_preference_row,
    read_preference_file,
)

U = {"role": "user", "content": "What is 2+2?"}
A4 = {"role": "assistant", "content": "4"}
A5 = {"role": "assistant", "content": "5"}

ROWS = {
    "standard explicit": {"prompt": "The sky is", "chosen": " blue.", "rejected": " green."},
    "standard implicit": {"chosen": "The sky is blue.", "rejected": "The sky is green."},
    "conversational explicit": {"prompt": [U], "chosen": [A4], "rejected": [A5]},
    "conversational implicit": {"chosen": [U, A4], "rejected": [U, A5]},
}


@pytest.fixture(scope="module")
def tok():
    return load_adapter("tiny", kind="causal-lm", dtype="float32", device="cpu", seed=0).tokenizer


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_the_four_trl_formats_parse_to_prompt_and_completions():
    se = parse_preference_row(ROWS["standard explicit"], "r")
    si = parse_preference_row(ROWS["standard implicit"], "r")
    assert (se.prompt, se.chosen, se.rejected) == ("The sky is", " blue.", " green.")
    assert (si.prompt, si.chosen, si.rejected) == ("The sky is", " blue.", " green.")  # the space starts them
    ce = parse_preference_row(ROWS["conversational explicit"], "r")
    ci = parse_preference_row(ROWS["conversational implicit"], "r")
    for row in (ce, ci):
        assert row.conversational
        assert row.prompt == (("user", "What is 2+2?"),)
        assert (row.chosen, row.rejected) == ((("assistant", "4"),), (("assistant", "5"),))
    # a string prompt with conversational completions is one user turn
    cs = parse_preference_row({"prompt": "What is 2+2?", "chosen": [A4], "rejected": [A5]}, "r")
    assert cs.prompt == (("user", "What is 2+2?"),)


@pytest.mark.parametrize("fmt", ["standard implicit", "conversational implicit"])
def test_the_implicit_prompt_is_trls_extract_prompt(fmt):
    trl = pytest.importorskip("trl", reason="TRL is not installed (bench extra)")
    row = ROWS[fmt]
    want = trl.extract_prompt(dict(row))
    got = parse_preference_row(row, "r")
    as_msgs = lambda v: v if isinstance(v, str) else tuple((m["role"], m["content"]) for m in v)  # noqa: E731
    assert (got.prompt, got.chosen, got.rejected) == tuple(
        as_msgs(want[k]) for k in ("prompt", "chosen", "rejected")
    )


def test_jsonl_parquet_and_save_to_disk_read_the_same_rows(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = [ROWS["standard explicit"], {"prompt": "Q", "chosen": "good", "rejected": "bad"}]
    a = read_preference_file(_write_jsonl(tmp_path / "p.jsonl", rows))
    ds = datasets.Dataset.from_list(rows)
    ds.to_parquet(str(tmp_path / "p.parquet"))
    ds.save_to_disk(str(tmp_path / "saved"))
    b = read_preference_file(tmp_path / "p.parquet")
    c = read_preference_file(tmp_path / "saved")
    key = lambda rs: [(r.prompt, r.chosen, r.rejected) for r in rs]  # noqa: E731
    assert key(a) == key(b) == key(c) == [("The sky is", " blue.", " green."), ("Q", "good", "bad")]
    assert a[1].source.endswith("p.jsonl: line 2")


def test_renamed_columns_through_data_fields(tmp_path):
    p = _write_jsonl(tmp_path / "p.jsonl", [{"question": "Q", "better": "a", "worse": "b"}])
    (row,) = read_preference_file(p, PreferenceFields(prompt="question", chosen="better", rejected="worse"))
    assert (row.prompt, row.chosen, row.rejected) == ("Q", "a", "b")


@pytest.mark.parametrize(
    ("row", "match"),
    [
        ({"prompt": "Q", "chosen": "a"}, r"line 2: missing field 'rejected'.*data_fields"),
        (
            {"prompt": [U], "chosen": "a", "rejected": "b"},
            r"line 2: 'prompt' is a list of messages but 'chosen' is text",
        ),
        (
            {"prompt": [U], "chosen": [U], "rejected": [A5]},
            r"line 2: 'chosen' must end with an 'assistant' message",
        ),
        ({"chosen": "abc", "rejected": "xyz"}, r"line 2: no 'prompt' field .* share no prefix"),
        ({"chosen": [A4], "rejected": [A5]}, r"line 2: no 'prompt' field .* share no messages"),
        (
            {"prompt": "Q", "chosen": "a", "rejected": 3},
            r"line 2: 'rejected' must be a string or a list of messages",
        ),
        (
            {"prompt": [{"role": "usr", "content": "x"}], "chosen": [A4], "rejected": [A5]},
            r"unknown role 'usr'",
        ),
        ({"chosen": "The sky", "rejected": "The sky is"}, r"line 2: 'chosen' is empty"),
    ],
)
def test_bad_rows_name_the_file_line_and_field(tmp_path, row, match):
    p = _write_jsonl(tmp_path / "p.jsonl", [ROWS["standard explicit"], row])
    with pytest.raises(PreferenceDataError, match=match):
        read_preference_file(p)


def test_missing_file_and_empty_file(tmp_path):
    with pytest.raises(PreferenceDataError, match="does not exist"):
        read_preference_file(tmp_path / "nope.jsonl")
    (tmp_path / "e.jsonl").write_text("\n")
    with pytest.raises(PreferenceDataError, match="no rows"):
        read_preference_file(tmp_path / "e.jsonl")


def test_standard_rows_encode_as_sft_does(tok):
    fmt = PromptFormatter(tok, template="Q: {prompt}\nA:")
    pair = encode_pair(parse_preference_row(ROWS["standard explicit"], "r"), tok, fmt)
    assert pair.prompt_ids == fmt.encode("The sky is")
    assert pair.chosen_ids == fmt.encode_completion(" blue.") and pair.chosen_ids[-1] == tok.eos_token_id
    assert pair.rejected_ids == fmt.encode_completion(" green.")


def test_conversations_encode_with_the_chat_template_up_to_the_turns_eos(tok):
    pair = encode_pair(parse_preference_row(ROWS["conversational implicit"], "r"), tok, None)
    head = tok.apply_chat_template([U], tokenize=False, add_generation_prompt=True)
    full = tok.apply_chat_template([U, A4], tokenize=False)
    assert tok.decode(pair.prompt_ids) == head
    assert full.startswith(tok.decode(pair.prompt_ids + pair.chosen_ids))
    assert pair.chosen_ids[-1] == tok.eos_token_id  # the template's newline after EOS is not a target
    assert tok.decode(pair.chosen_ids).startswith("4")


def _pair(p, c, r, i=0):
    return EncodedPair(
        list(range(1, p + 1)), list(range(10, 10 + c)), list(range(20, 20 + r)), f"f.jsonl: line {i}"
    )


def test_length_limits_error_truncate_and_skip():
    pairs = [_pair(3, 2, 2, 1), _pair(9, 2, 5, 2)]
    limits = {"max_prompt_length": 4, "max_completion_length": 3, "max_length": None}
    with pytest.raises(
        LengthError,
        match=r"f.jsonl: line 2: the prompt is 9 tokens \(max_prompt_length=4\); a completion is 5",
    ):
        bound_pairs(pairs, **limits, overlong="error", source="f.jsonl")
    kept, rep = bound_pairs(pairs, **limits, overlong="skip", source="f.jsonl")
    assert [p.source for p in kept] == ["f.jsonl: line 1"] and rep.skipped == 1
    kept, rep = bound_pairs(pairs, **limits, overlong="truncate", source="f.jsonl")
    assert rep.truncated == 1
    assert kept[1].prompt_ids == [6, 7, 8, 9]  # the prompt keeps its end
    assert kept[1].rejected_ids == [20, 21, 22] and kept[1].chosen_ids == [10, 11]  # completions their start
    kept, _ = bound_pairs(
        [_pair(4, 6, 2)],
        max_prompt_length=None,
        max_completion_length=None,
        max_length=7,
        overlong="truncate",
        source="f",
    )
    assert len(kept[0].prompt_ids) + len(kept[0].chosen_ids) == 7
    with pytest.raises(LengthError, match="no room for a completion"):
        bound_pairs(
            [_pair(8, 2, 2)],
            max_prompt_length=None,
            max_completion_length=None,
            max_length=7,
            overlong="truncate",
            source="f",
        )
    with pytest.raises(LengthError, match="no pairs left"):
        bound_pairs([_pair(8, 2, 2)], **limits, overlong="skip", source="f.jsonl")


def test_offline_pairs_resume_their_position():
    pairs = [_pair(2, 1, 1, i) for i in range(5)]
    a = OfflinePairs(pairs, seed=3)
    a.next_pairs(3)
    state = a.state_dict()
    want = [p.source for p in a.next_pairs(6)]
    b = OfflinePairs(pairs, seed=3)
    b.load_state_dict(state)
    assert [p.source for p in b.next_pairs(6)] == want
    assert a.fingerprint == b.fingerprint != OfflinePairs(pairs[:4]).fingerprint
