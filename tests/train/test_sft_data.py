"""SFT data formats: the loss mask is exactly on assistant turns (checked with character offsets),
text rows, prompt/completion rows, data_fields mapping, and errors naming file, line and key."""

from __future__ import annotations

import json

import pytest

from posttrain.models import CHAT_TEMPLATE, build_char_tokenizer
from posttrain.rollout import PromptFormatter
from posttrain.train.sft import SFTConfig, SFTDataError, SFTTrainer
from posttrain.train.sft_data import DataFields, encode_rows, iter_rows, read_sft_file

CONV = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "2+2?"},
    {"role": "assistant", "content": "4 (four)"},
]


@pytest.fixture
def tok():
    return build_char_tokenizer()


def _encode(tok, rows, fields=None, formatter=None):
    return encode_rows(list(iter_rows(rows, "rows", fields)), tok, formatter or PromptFormatter(tok))


def _char_spans_of_targets(tok, ex):
    """The characters covered by loss-mask tokens, as (start, end) offsets in the decoded text."""
    text = tok.decode(ex.input_ids)
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    assert enc["input_ids"] == ex.input_ids
    return text, [tuple(o) for o, m in zip(enc["offset_mapping"], ex.loss_mask, strict=True) if m]


def test_messages_loss_mask_is_exactly_the_assistant_turns(tok):
    (ex,) = _encode(tok, [{"messages": CONV}])
    text, spans = _char_spans_of_targets(tok, ex)
    assert text == (
        "<|system|>\nBe brief.\n<|user|>\nHi\n<|assistant|>\nHello!<eos>\n"
        "<|user|>\n2+2?\n<|assistant|>\n4 (four)<eos>\n"
    )
    # expected target characters: each assistant content followed by its EOS, nothing else
    want = []
    for content in ("Hello!", "4 (four)"):
        a = text.index(f"<|assistant|>\n{content}") + len("<|assistant|>\n")
        want += [(i, i + 1) for i in range(a, a + len(content))]
        want.append((a + len(content), a + len(content) + len("<eos>")))
    assert spans == want
    assert (
        tok.decode([t for t, m in zip(ex.input_ids, ex.loss_mask, strict=True) if m])
        == "Hello!<eos>4 (four)<eos>"
    )


def test_messages_without_a_tokenizer_template_use_the_documented_plain_template(tok):
    (with_template,) = _encode(tok, [{"messages": CONV}])
    assert tok.chat_template == CHAT_TEMPLATE
    tok.chat_template = None
    (plain,) = _encode(tok, [{"messages": CONV}])
    assert plain == with_template


def test_messages_with_another_template_mask_what_the_model_must_generate(tok):
    tok.chat_template = (
        "{% for m in messages %}{{ '[' + m['role'] + ']' + m['content'] + '|end|' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '[assistant]' }}{% endif %}"
    )
    (ex,) = _encode(tok, [{"messages": CONV}])
    targets = "".join(tok.decode([t]) for t, m in zip(ex.input_ids, ex.loss_mask, strict=True) if m)
    # no EOS token in this template: the whole turn up to the next message is the target
    assert targets == "Hello!|end|4 (four)|end|"


def test_a_template_that_rewrites_past_turns_is_an_error_naming_the_row(tok):
    tok.chat_template = (  # renders the LAST message in capitals: not turn-by-turn
        "{% for m in messages %}{% if loop.last %}{{ m['content'] | upper }}{% else %}"
        "{{ m['content'] }}{% endif %}{% endfor %}"
    )
    with pytest.raises(SFTDataError, match=r"rows\[0\]: message 2: the chat template does not render"):
        _encode(tok, [{"messages": CONV}])


def test_text_rows_train_on_every_token_after_bos(tok):
    (ex,) = _encode(tok, [{"text": "abc"}])
    assert ex.input_ids == [tok.bos_token_id, *tok.encode("abc", add_special_tokens=False), tok.eos_token_id]
    assert ex.loss_mask == [0, 1, 1, 1, 1]


def test_prompt_completion_rows_use_the_rl_prompt_formatter(tok):
    fmt = PromptFormatter(tok, template="Q: {prompt}\nA: ")
    (ex,) = _encode(tok, [{"prompt": "1+1", "completion": "2"}], formatter=fmt)
    p = fmt.encode("1+1")
    assert ex.input_ids == [*p, *tok.encode("2", add_special_tokens=False), tok.eos_token_id]
    assert ex.loss_mask == [0] * len(p) + [1, 1]


def test_data_fields_map_other_column_names(tmp_path, tok):
    f = tmp_path / "qa.jsonl"
    rows = [
        {"question": "1+1=", "answer": "2"},
        {"conversation": [{"from": "user", "value": "hi"}, {"from": "assistant", "value": "yo"}]},
        {"body": "free text"},
    ]
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    fields = DataFields(
        prompt="question",
        completion="answer",
        messages="conversation",
        role="from",
        content="value",
        text="body",
    )
    parsed = read_sft_file(f, fields)
    assert [type(r).__name__ for r in parsed] == ["PromptCompletion", "Chat", "Text"]
    assert parsed[1].messages == (("user", "hi"), ("assistant", "yo"))
    assert parsed[0].source == f"{f}: line 1"
    # and through the trainer's config (data_fields.prompt=question ...)
    cfg = SFTConfig(data=str(f), data_fields=fields.model_dump(), save=False)
    tr = SFTTrainer(cfg, *_tiny())
    assert len(tr.examples) == 3
    # a mapped key that is missing is named with its mapping
    with pytest.raises(SFTDataError, match=r"line 1: missing column 'reply' \(data_fields\.completion\)"):
        read_sft_file(f, DataFields(prompt="question", completion="reply"))


def _tiny():
    from posttrain.models import load_model_and_tokenizer

    return load_model_and_tokenizer("tiny")


@pytest.mark.parametrize(
    ("row", "needle"),
    [
        ({"messages": "hi"}, "line 1: 'messages' must be a non-empty list"),
        ({"messages": []}, "line 1: 'messages' must be a non-empty list"),
        ({"messages": ["hi"]}, "line 1: messages[0]: expected an object"),
        ({"messages": [{"role": "user"}]}, "line 1: messages[0]: missing key 'content'"),
        ({"messages": [{"role": "user", "content": 3}]}, "messages[0]: 'content' must be a string, got int"),
        ({"messages": [{"role": "user", "content": "x"}]}, "line 1: no message with role 'assistant'"),
        ({"text": ""}, "line 1: 'text' is empty"),
        ({"text": 5}, "line 1: 'text' must be a string, got int"),
        (
            {"text": "a", "prompt": "b", "completion": "c"},
            "line 1: the row mixes formats text and prompt/completion",
        ),
        ({"question": "a", "answer": "b"}, "line 1: no known fields"),
        ({"prompt": "a", "completion": ""}, "line 1: 'completion' is empty"),
    ],
)
def test_bad_rows_are_named_by_file_and_line(tmp_path, row, needle):
    f = tmp_path / "bad.jsonl"
    f.write_text(json.dumps(row) + "\n")
    with pytest.raises(SFTDataError) as e:
        read_sft_file(f)
    assert str(f) in str(e.value) and needle in str(e.value)


@pytest.mark.parametrize("end", ["\n", "\r\n"])
def test_a_truncated_line_is_reported_at_its_column_as_the_rl_reader_does(tmp_path, end):
    """Issue 58 item 6: SFT read the line with its newline, so a line cut short was "invalid JSON
    (Expecting ',' delimiter, column 1)" (column 1 of the next line); the RL dataset reader said column
    37. One line reader for both now: the same message, the column on the line itself."""
    from posttrain.tasks import get_task
    from posttrain.tasks.jsonl import DatasetError

    cut = '{"prompt": "2+2=", "completion": "4"'  # the closing brace lost
    f = tmp_path / "x.jsonl"
    f.write_text(f'{{"prompt": "1+1=", "completion": "2"}}{end}{cut}{end}', encoding="utf-8", newline="")
    problem = f"invalid JSON (Expecting ',' delimiter at column {len(cut) + 1})"
    with pytest.raises(SFTDataError) as sft:
        read_sft_file(f)
    assert str(sft.value) == f"{f}: line 2: {problem}"
    rl = tmp_path / "rl.jsonl"
    rl.write_text(f'{{"question": "1+1=", "answer": "2"}}{end}{cut}{end}', encoding="utf-8", newline="")
    with pytest.raises(DatasetError) as err:
        get_task("jsonl", path=rl, heldout_fraction=0.0)
    assert f"{rl}: row 2: {problem}" in str(err.value)


@pytest.mark.parametrize(
    "prompt", ['"1+1="', '[{"role": "user", "content": "1+1?"}]'], ids=["text", "conversational"]
)
def test_a_prompt_solution_file_names_the_missing_column_and_the_mapping(tmp_path, prompt):
    """Issue 58 item 7: a prompt/solution file said "'completion' must be a list of messages ... got
    NoneType" (a chat prompt) or "missing key 'completion'"; now: the column is missing, the columns
    the row has, and the data_fields mapping that uses the other one."""
    f = tmp_path / "ps.jsonl"
    f.write_text(f'{{"prompt": {prompt}, "solution": "2"}}\n', encoding="utf-8")
    with pytest.raises(SFTDataError) as err:
        read_sft_file(f)
    assert str(err.value) == (
        f"{f}: line 1: missing column 'completion'; it has columns: prompt, solution; if 'solution' "
        "holds it, map it with data_fields.completion=solution"
    )
    if prompt.startswith('"'):  # the mapping it names reads the file
        assert read_sft_file(f, DataFields(completion="solution"))[0].completion == "2"


def test_non_utf8_bom_and_directories(tmp_path):
    f = tmp_path / "x.jsonl"
    f.write_bytes(b'{"text": "ok"}\n\n{"text": "\xff"}\n')
    with pytest.raises(
        SFTDataError, match=r"x\.jsonl: line 3: not valid UTF-8 \(byte 0xff at byte 11 of the line\)"
    ):
        read_sft_file(f)
    f.write_bytes(b'\xef\xbb\xbf{"text": "bom is fine"}\n')
    assert read_sft_file(f)[0].text == "bom is fine"
    with pytest.raises(SFTDataError, match="is a directory"):
        read_sft_file(tmp_path)


def test_empty_prompt_is_named(tok):
    with pytest.raises(SFTDataError, match=r"pairs\[1\]: the prompt encodes to zero tokens"):
        SFTTrainer(SFTConfig(save=False), *_tiny(), pairs=[("1+1=", "2"), ("", "3")])
