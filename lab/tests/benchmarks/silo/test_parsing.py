"""XML tool-call parser (the authors' tool-call format): value conversion, multiple calls, junk never
raises."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain_lab.benchmarks.silo.parsing import (
    ToolCall,
    convert_value,
    format_tool_call,
    format_tool_results,
    parse_tool_calls,
    parse_tool_results,
)


def test_convert_value_order_int_float_bool_json_str():
    assert convert_value(" 42 ") == 42 and isinstance(convert_value("42"), int)
    assert convert_value("-7") == -7
    assert convert_value("3.25") == 3.25 and isinstance(convert_value("3.0"), float)
    assert convert_value("1e-3") == 0.001
    assert convert_value("True") is True and convert_value("false") is False
    assert convert_value("[1, 2, [3]]") == [1, 2, [3]]
    assert convert_value('{"a": 1}') == {"a": 1}
    assert convert_value('"Candidate_A"') == "Candidate_A"
    assert convert_value("null") is None
    assert convert_value("Candidate_A") == "Candidate_A"
    assert convert_value("[1, 2") == "[1, 2"  # broken JSON stays text
    assert convert_value("nan") == "nan" and convert_value("inf") == "inf"  # results stay valid JSON
    assert convert_value("1_000") == "1_000"  # not Python's int() leniency


def test_parse_single_call_with_params_and_raw_text():
    text = """I will send it.
<tool_call>
  <tool>send_message</tool>
  <parameters>
    <target_id>2</target_id>
    <content>007</content>
  </parameters>
</tool_call>"""
    (call,) = parse_tool_calls(text)
    assert call == ToolCall(
        "send_message", {"target_id": 2, "content": 7}, {"target_id": "2", "content": "007"}
    )


def test_parse_multiple_calls_in_order_and_no_params():
    text = (
        format_tool_call("receive_messages") + "\nblah\n" + format_tool_call("submit_result", answer=[1, 2])
    )
    calls = parse_tool_calls(text)
    assert [c.name for c in calls] == ["receive_messages", "submit_result"]
    assert calls[0].params == {} and calls[1].params == {"answer": [1, 2]}


def test_malformed_blocks_are_skipped_not_raised():
    text = (
        "<tool_call><tool>wait</tool_call>"  # <tool> never closed
        "<tool_call><parameters><x>1</x></parameters></tool_call>"  # no tool name
        "<tool_call><tool></tool></tool_call>"  # empty name
    )
    assert parse_tool_calls(text) == []
    # a good call after junk is still found; an unclosed trailing block is dropped
    good = (
        text
        + format_tool_call("list_agents")
        + "<tool_call><tool>send_message</tool><parameters><target_id>1"
    )
    assert [c.name for c in parse_tool_calls(good)] == ["list_agents"]
    assert parse_tool_calls(None) == [] and parse_tool_calls(123) == [] and parse_tool_calls("") == []


def test_think_blocks_are_ignored():
    text = "<think>maybe <tool_call><tool>submit_result</tool></tool_call></think>" + format_tool_call("wait")
    assert [c.name for c in parse_tool_calls(text)] == ["wait"]
    # an unclosed think swallows the rest (the model never left its reasoning)
    assert parse_tool_calls("<think>" + format_tool_call("wait")) == []


def test_tool_results_format_and_roundtrip():
    msg = format_tool_results([("wait", {"status": "waiting"}), ("receive_messages", {"messages": []})])
    assert msg == (
        '<tool_result>\n  <tool>wait</tool>\n  <result>{"status": "waiting"}</result>\n</tool_result>\n\n'
        '<tool_result>\n  <tool>receive_messages</tool>\n  <result>{"messages": []}</result>\n</tool_result>'
    )
    assert parse_tool_results(msg) == [
        ("wait", {"status": "waiting"}),
        ("receive_messages", {"messages": []}),
    ]


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text("ab c"),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text("xyz", min_size=1), inner, max_size=3)
    ),
    max_leaves=8,
)


@settings(max_examples=150, deadline=None)
@given(json_values)
def test_format_parse_roundtrip_of_json_values(value):
    """Any JSON answer written by format_tool_call (JSON text) parses back to an equal value
    (int/float/bool/JSON conversion; plain strings are written raw and come back as text)."""
    (call,) = parse_tool_calls(format_tool_call("submit_result", answer=json.dumps(value)))
    got = call.params["answer"]
    if isinstance(value, float) and value.is_integer() and "e" not in json.dumps(value):
        assert got == value  # "3.0" -> float 3.0
    else:
        assert json.dumps(got, sort_keys=True) == json.dumps(value, sort_keys=True) or got == value


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.sampled_from(
            [
                "<tool_call>",
                "</tool_call>",
                "<tool>",
                "</tool>",
                "<parameters>",
                "</parameters>",
                "<a>",
                "</a>",
                "<think>",
                "</think>",
                "wait",
                "send_message",
                "1",
                "[",
                "{",
                '"',
                "\x00",
                "é",
                "\n",
            ]
        )
        | st.text(max_size=5),
        max_size=40,
    )
)
def test_parser_never_raises_on_junk(parts):
    calls = parse_tool_calls("".join(parts))
    for c in calls:
        assert isinstance(c.name, str) and c.name
        json.dumps(c.to_json())  # always JSON-serialisable
