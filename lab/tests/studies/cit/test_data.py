"""Key-part markup, instruction rows, and key-part masks after tokenisation (char preset + saved BPE)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain_lab.studies.cit.data import (
    CITDataError,
    InstructionExample,
    encode_instruction,
    parse_markup,
    read_instruction_file,
    render_prompt,
)


def test_parse_markup_spans_and_roundtrip():
    text, spans = parse_markup("Give the [[city]] of [[Bax]].")
    assert text == "Give the city of Bax."
    assert spans == ((9, 13), (17, 20))
    ex = InstructionExample(text, "x", "y", "t", spans)
    assert ex.key_parts == ["city", "Bax"]
    assert ex.marked() == "Give the [[city]] of [[Bax]]."
    assert ex.masked_instruction("_") == "Give the _ of _."
    assert ex.masked_instruction("") == "Give the  of ."


@pytest.mark.parametrize(
    ("marked", "why"),
    [
        ("a [[b", "never closed"),
        ("a ]] b", "without an opening"),
        ("a [[]] b", "empty key part"),
        ("a [[b [[c]] d]]", "do not nest"),
    ],
)
def test_markup_errors(marked, why):
    with pytest.raises(CITDataError, match=why):
        parse_markup(marked, "f.jsonl: line 3: instruction")


def test_bad_rows_name_file_and_line(tmp_path):
    p = tmp_path / "d.jsonl"
    good = {
        "instruction": "Give the [[city]].",
        "input": "Bax 31 Oslo red",
        "output": "Oslo",
        "task": "lookup",
    }
    rows = [
        good,
        {**good, "output": ""},
        {k: v for k, v in good.items() if k != "task"},
        {**good, "instruction": "x [[y"},
    ]
    for _i, bad in enumerate(rows[1:], start=2):
        p.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
        with pytest.raises(CITDataError, match=r"d\.jsonl: line 2: "):
            read_instruction_file(p)
    p.write_text(json.dumps(good) + "\n" + json.dumps({**good, "input": 3}) + "\n")
    with pytest.raises(CITDataError, match=r"line 2: 'input' must be a string"):
        read_instruction_file(p)
    p.write_text(json.dumps(good) + "\n")
    (ex,) = read_instruction_file(p)
    assert ex.key_parts == ["city"] and ex.source.endswith("d.jsonl: line 1")


def _key_text(tok, enc):
    return tok.decode([i for i, k in zip(enc.prompt_ids, enc.key_mask, strict=True) if k])


@pytest.mark.parametrize("chat", [False, True])
@pytest.mark.parametrize("which", ["char_tok", "bpe_tok"])
def test_key_mask_survives_tokenisation(request, which, chat):
    tok = request.getfixturevalue(which)
    text, spans = parse_markup("Give the [[city]] in [[uppercase]].")
    ex = InstructionExample(text, "Bax 31 Oslo red", "OSLO", "lookup_upper", spans, "row")
    enc = encode_instruction(ex, tok, chat=chat)
    prompt, pspans = render_prompt(ex)
    assert [prompt[a:b] for a, b in pspans] == ["city", "uppercase"]
    key = _key_text(tok, enc)
    # every key character is covered, and the key tokens cover nothing but the key words (+ BPE's
    # leading-space merges)
    assert "city" in key and "uppercase" in key
    assert key.replace(" ", "") == "cityuppercase"
    if which == "char_tok":  # one token per character
        assert sum(enc.key_mask) == len("city") + len("uppercase")
    # the masked prompt differs exactly in the key parts; the response is output + EOS
    assert "city" not in tok.decode(enc.masked_prompt_ids)
    assert tok.decode(enc.response_ids, skip_special_tokens=True) == "OSLO"
    assert enc.response_ids[-1] == tok.eos_token_id
    sft = enc.sft_example()
    assert sft.loss_mask == [0] * len(enc.prompt_ids) + [1] * len(enc.response_ids)


words = st.text(alphabet="abcdefghij XYZ.,?", min_size=1, max_size=8).filter(lambda s: s.strip() == s and s)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(words, st.booleans()), min_size=1, max_size=5))
def test_key_mask_property_bpe(bpe_tok, parts):
    """For any instruction, the key tokens of the saved BPE tokenizer decode to text containing every
    key part, and every non-key token lies outside all key spans."""
    marked = " ".join(f"[[{w}]]" if key else w for w, key in parts)
    if not any(k for _, k in parts):
        marked += " [[k]]"
    text, spans = parse_markup(marked)
    ex = InstructionExample(text, "in", "out", "t", spans, "row")
    enc = encode_instruction(ex, bpe_tok)
    prompt, pspans = render_prompt(ex)
    offsets = bpe_tok(prompt, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    for (s, e), k in zip(offsets, enc.key_mask, strict=True):
        overlaps = any(s < b and e > a for a, b in pspans)
        assert bool(k) == overlaps
    covered = set()
    for (s, e), k in zip(offsets, enc.key_mask, strict=True):
        if k:
            covered |= set(range(s, e))
    for a, b in pspans:
        assert set(range(a, b)) <= covered
