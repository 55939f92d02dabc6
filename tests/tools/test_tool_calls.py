"""Tool-call parsing per format (issue 43 item 1): well-formed and malformed calls, format detection."""

from __future__ import annotations

import pytest

from posttrain.tools.calls import (
    MalformedCall,
    ToolCall,
    detect_call_format,
    fallback_results,
    get_call_format,
    parse_hermes,
    parse_llama3,
)

CALC = '{"name": "calculator", "arguments": {"expression": "12*7"}}'


def test_hermes_single_multiple_list_and_string_arguments():
    (c,) = parse_hermes(f"Let me compute.\n<tool_call>\n{CALC}\n</tool_call>")
    assert c == ToolCall("calculator", {"expression": "12*7"}, CALC)
    two = parse_hermes(f"<tool_call>{CALC}</tool_call> and <tool_call>{CALC.replace('12', '3')}</tool_call>")
    assert [x.arguments["expression"] for x in two] == ["12*7", "3*7"]
    lst = parse_hermes(f"<tool_call>[{CALC}, {CALC}]</tool_call>")  # SmolLM2-1.7B writes a list
    assert len(lst) == 2 and all(isinstance(x, ToolCall) for x in lst)
    s = parse_hermes(
        '<tool_call>{"name": "calculator", "arguments": "{\\"expression\\": \\"1+1\\"}"}</tool_call>'
    )
    assert s[0].arguments == {"expression": "1+1"}
    assert parse_hermes("The answer is 84.") == []  # a message, not a call


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ('<tool_call>{"name": "calculator", "arguments": {"expression": </tool_call>', "not valid JSON"),
        ('<tool_call>{"arguments": {}}</tool_call>', '"name"'),
        ('<tool_call>{"name": "calculator", "arguments": [1, 2]}</tool_call>', "must be a JSON object"),
        ('<tool_call>"calculator"</tool_call>', "must be a JSON object"),
        ('<tool_call>{"name": "calculator", "arguments": "{oops"}</tool_call>', "not valid JSON"),
        ('<tool_call>{"name": "calculator", "arguments": {"expression": "1+', "without its closing"),
        ("<tool_call>[]</tool_call>", "empty list"),
    ],
)
def test_hermes_malformed_calls_are_kept_with_the_reason(text, why):
    out = parse_hermes(text)
    assert out and isinstance(out[-1], MalformedCall) and why in out[-1].error


def test_a_well_formed_call_before_an_unclosed_one_is_kept():
    out = parse_hermes(f"<tool_call>{CALC}</tool_call> then <tool_call>{{")
    assert isinstance(out[0], ToolCall) and isinstance(out[1], MalformedCall)


def test_llama3_json_tool_calls():
    obj = '{"name": "calculator", "parameters": {"expression": "2**10"}}'
    assert parse_llama3(obj) == [ToolCall("calculator", {"expression": "2**10"}, obj)]
    assert parse_llama3(f"<|python_tag|>{obj}")[0].name == "calculator"
    two = parse_llama3(f"{obj}; {obj}")
    assert len(two) == 2 and all(isinstance(x, ToolCall) for x in two)
    assert parse_llama3("The answer is 1024.") == []
    bad = parse_llama3('{"name": "calculator", "parameters": {"expression": ')
    assert isinstance(bad[0], MalformedCall) and "not valid JSON" in bad[0].error
    assert isinstance(parse_llama3("<|python_tag|>print(1)")[0], MalformedCall)
    assert isinstance(parse_llama3('{"parameters": {}}')[0], MalformedCall)


def test_format_detection_and_unknown_format():
    qwen = "{% if tools %}<tools>{{ tools }}</tools> write <tool_call>{% endif %}"
    llama = "{% if tools %}Environment: ipython{% endif %}<|python_tag|>"
    assert detect_call_format(qwen) == "hermes"
    assert detect_call_format(llama) == "llama3"
    assert detect_call_format("{% for m in messages %}{{ m.content }}{% endfor %}") == "fallback"
    assert detect_call_format(None) == "fallback"
    assert get_call_format("fallback") is parse_hermes
    with pytest.raises(ValueError, match="tool call format must be one of"):
        get_call_format("xml")
    assert fallback_results(["84"]) == "<tool_response>\n84\n</tool_response>"
