"""Character tokenizer: vocabulary, round trip, padding sides, save/load, chat template."""

from __future__ import annotations

import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.models import build_char_tokenizer, char_vocab
from posttrain.models.tokenizer import SPECIAL_TOKENS

TOK = build_char_tokenizer()
PRINTABLE = "".join(c for c in string.printable if c not in "\r\x0b\x0c")


def test_special_tokens_and_vocab():
    assert (TOK.pad_token, TOK.bos_token, TOK.eos_token, TOK.unk_token) == (
        "<pad>",
        "<bos>",
        "<eos>",
        "<unk>",
    )
    assert (TOK.pad_token_id, TOK.bos_token_id, TOK.eos_token_id, TOK.unk_token_id) == (0, 1, 2, 3)
    # 4 specials + 95 printable ASCII + newline + tab + 256 byte fallbacks
    assert len(TOK) == len(char_vocab()) == 4 + 95 + 2 + 256
    assert TOK.padding_side == "right"


def test_one_token_per_ascii_character_and_no_bos_added():
    text = "Q: 12+7=?\nA: 19"
    ids = TOK.encode(text)
    assert len(ids) == len(text)
    assert TOK.convert_ids_to_tokens(ids) == list(text)
    assert TOK.bos_token_id not in ids and TOK.eos_token_id not in ids


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=PRINTABLE, max_size=80).filter(lambda s: not any(t in s for t in SPECIAL_TOKENS)))
def test_round_trip_printable(text):
    ids = TOK.encode(text)
    assert TOK.unk_token_id not in ids
    assert len(ids) == len(text)
    assert TOK.decode(ids) == text


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=30).filter(lambda s: "<" not in s))
def test_round_trip_any_unicode_through_byte_fallback(text):
    assert TOK.decode(TOK.encode(text)) == text


def test_special_strings_are_single_tokens_and_skippable():
    ids = TOK.encode("ab<eos>")
    assert ids[-1] == TOK.eos_token_id and len(ids) == 3
    assert TOK.decode(ids, skip_special_tokens=True) == "ab"


@pytest.mark.parametrize("side", ["left", "right"])
def test_padding_side(side):
    tok = build_char_tokenizer(padding_side=side)
    batch = tok(["ab", "abcd"], padding=True, return_tensors="pt")
    ids, mask = batch["input_ids"], batch["attention_mask"]
    if side == "left":
        assert ids[0].tolist() == [0, 0, *TOK.encode("ab")] and mask[0].tolist() == [0, 0, 1, 1]
    else:
        assert ids[0].tolist() == [*TOK.encode("ab"), 0, 0] and mask[0].tolist() == [1, 1, 0, 0]


def test_bad_padding_side():
    with pytest.raises(ValueError, match="padding_side"):
        build_char_tokenizer(padding_side="middle")  # type: ignore[arg-type]


def test_chat_template():
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    text = TOK.apply_chat_template(msgs, tokenize=False)
    assert text == "<|user|>\nhi\n<|assistant|>\nyo<eos>\n"
    gen = TOK.apply_chat_template(msgs[:1], tokenize=False, add_generation_prompt=True)
    assert gen == "<|user|>\nhi\n<|assistant|>\n"


def test_save_and_load_with_autotokenizer(tmp_path):
    from transformers import AutoTokenizer

    tok = build_char_tokenizer(padding_side="left")
    tok.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    text = "x = 3*4 é\n"
    assert loaded.encode(text) == tok.encode(text)
    assert loaded.decode(loaded.encode(text)) == text
    assert loaded.padding_side == "left"
    assert (loaded.pad_token_id, loaded.eos_token_id, loaded.bos_token_id) == (0, 2, 1)
    msgs = [{"role": "user", "content": "q"}]
    assert loaded.apply_chat_template(msgs, tokenize=False) == tok.apply_chat_template(msgs, tokenize=False)
