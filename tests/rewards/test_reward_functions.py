"""exact_match, numeric, format, math_verify and weighted rewards; registry; extraction."""

from __future__ import annotations

import pickle
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.rewards import (
    RewardPool,
    extract_answer,
    get_reward,
    last_number,
    list_rewards,
    parse_number,
)
from posttrain.tasks import Example

GSM = Example("g1", "Q?", "72", meta={"answer_marker": "####"})
PLAIN = Example("p1", "12+34=", "46")


def test_registry_and_param_errors() -> None:
    assert {"exact_match", "numeric", "format", "math_verify", "countdown", "weighted"} <= set(list_rewards())
    with pytest.raises(KeyError, match="unknown reward 'exact_mach'"):
        get_reward("exact_mach")
    with pytest.raises(
        ValueError, match=r"reward 'numeric': unknown parameter\(s\) 'tol'; accepted: rel_tol"
    ):
        get_reward("numeric", tol=1)


@pytest.mark.parametrize(
    ("completion", "marker", "expected"),
    [
        ("46", None, "46"),
        ("  46 \nmore", None, "46"),
        ("\n46\n", None, "46"),
        ("46<|endoftext|>junk", None, "46"),
        ("work\n#### 72", "####", "72"),
        ("#### 1\n#### 72 \nafter", "####", "72"),
        ("no marker", "####", "no marker"),
        ("", None, ""),
    ],
)
def test_extract_answer(completion: str, marker: str | None, expected: str) -> None:
    assert extract_answer(completion, marker) == expected


def test_extract_answer_require_marker() -> None:
    assert extract_answer("72", "####", require_marker=True) is None
    assert extract_answer("#### 72", "####", require_marker=True) == "72"


def test_exact_match() -> None:
    em = get_reward("exact_match")
    assert em("46", PLAIN) == 1.0
    assert em("46\n12+34=46", PLAIN) == 1.0
    assert em("47", PLAIN) == 0.0
    assert em("4 6", PLAIN) == 0.0
    assert em("", PLAIN) == 0.0
    assert em("reasoning\n#### 72", GSM) == 1.0
    assert em("72", GSM) == 1.0  # no marker: first line
    assert get_reward("exact_match", require_marker=True)("72", GSM) == 0.0
    assert get_reward("exact_match", marker="")("#### 72", GSM) == 0.0  # marker lookup off
    assert get_reward("exact_match", case_sensitive=False)("YES", Example("y", "", "yes")) == 1.0


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("72", Fraction(72)),
        ("-3.50", Fraction(-7, 2)),
        ("1,234,567", Fraction(1234567)),
        ("$1,000.", Fraction(1000)),
        ("3/4", Fraction(3, 4)),
        ("1e-3", Fraction(1, 1000)),
        (".5", Fraction(1, 2)),
        ("abc", None),
        ("1/0", None),
        ("1,23", None),
        ("", None),
    ],
)
def test_parse_number(text: str, value: Fraction | None) -> None:
    assert parse_number(text) == value


def test_last_number() -> None:
    assert last_number("so 3 apples and 1,250 pears.") == 1250
    assert last_number("nothing") is None


def test_numeric() -> None:
    num = get_reward("numeric")
    assert num("#### 72", GSM) == 1.0
    assert num("#### 72.0", GSM) == 1.0
    assert num("#### The answer is $72.", GSM) == 1.0
    assert num("#### 71.99", GSM) == 0.0
    assert num("#### 0.333333", Example("t", "", "1/3")) == 1.0
    assert num("#### 0.3333", Example("t", "", "1/3")) == 0.0
    assert get_reward("numeric", rel_tol=1e-3)("#### 71.99", GSM) == 1.0
    assert num("#### 144/2", GSM) == 1.0
    assert num("#### ", GSM) == 0.0
    big = Example("b", "", "1,000,000", meta={"answer_marker": "####"})
    assert num("#### 1000000", big) == 1.0
    with pytest.raises(ValueError, match="gold answer 'x' is not a number"):
        num("#### 1", Example("bad", "", "x"))


def test_format_reward() -> None:
    fmt = get_reward("format")
    assert fmt("blah\n#### 72", GSM) == 1.0
    assert fmt("blah\n#### ", GSM) == 0.0
    assert fmt("72", GSM) == 0.0
    with pytest.raises(ValueError, match="has no meta\\['answer_marker'\\]"):
        fmt("72", PLAIN)
    tags = get_reward("format", pattern=r"<think>.*</think>\s*<answer>.*</answer>", fullmatch=True)
    assert tags("<think>a\nb</think> <answer>3</answer>", PLAIN) == 1.0
    assert tags("<think>a</think> <answer>3</answer> extra", PLAIN) == 0.0
    assert get_reward("format", pattern=r"\d+$")("x 12", PLAIN) == 1.0


@pytest.mark.parametrize(
    ("gold", "completion", "expected"),
    [
        (r"\frac{1}{2}", "0.5", 1.0),
        (r"\frac{1}{2}", r"So the probability is $\boxed{\frac{1}{2}}$.", 1.0),
        ("0.5", r"$\boxed{\frac{2}{4}}$", 1.0),
        (r"\boxed{\frac{1}{2}}", "The answer is $0.5$", 1.0),
        (r"\frac{1}{3}", r"\boxed{0.5}", 0.0),
        ("72", "Natalia sold 48/2 = 24 clips in May.\nShe sold 48+24 = 72 clips.\n#### 72", 1.0),
        ("72", "#### 73", 0.0),
        (r"\sqrt{2}/2", r"\boxed{\frac{\sqrt{2}}{2}}", 1.0),
        ("x^2+1", r"$\boxed{1+x^2}$", 1.0),
        ("3", "I do not know", 0.0),
    ],
)
def test_math_verify_on_gsm8k_and_math_style_answers(gold: str, completion: str, expected: float) -> None:
    mv = get_reward("math_verify")
    assert mv(completion, Example("m", "q", gold)) == expected


def test_math_verify_in_worker_processes_and_bad_gold() -> None:
    exs = [
        Example("a", "q", r"\frac{1}{2}"),
        Example("b", "q", "72"),
        Example("c", "q", r"\frac{1}{3}"),
        Example("d", "q", ""),  # gold math-verify cannot parse -> error, not a crash
    ]
    comps = [r"$\boxed{0.5}$", "#### 72", r"$\boxed{0.5}$", "1"]
    with RewardPool(get_reward("math_verify"), num_workers=1, timeout_s=20.0) as pool:
        res = pool.score(comps, exs)
    assert res.rewards == [1.0, 1.0, 0.0, 0.0]
    assert (res.errors, res.timeouts) == (1, 0)
    assert "cannot parse gold" in res.messages[0]


def test_weighted_total_components_and_errors() -> None:
    w = get_reward(
        "weighted",
        components=[
            ("exact_match", 1.0),
            ("format", 0.25, {}),
            {"name": "numeric", "weight": 0.5, "label": "num"},
        ],
    )
    total, comps = w.detailed("#### 72", GSM)
    assert comps == {"exact_match": 1.0, "format": 1.0, "num": 1.0} and total == 1.75
    assert w("72", GSM) == 1.5  # no marker: format 0, the others 1
    assert w.detailed("#### 7", GSM) == (0.25, {"exact_match": 0.0, "format": 1.0, "num": 0.0})
    twice = get_reward("weighted", components=[("exact_match", 1.0), ("exact_match", -1.0)])
    assert twice.detailed("#### 72", GSM) == (0.0, {"exact_match": 1.0, "exact_match#2": 1.0})
    assert pickle.loads(pickle.dumps(w)).detailed("#### 72", GSM) == (total, comps)
    with pytest.raises(ValueError, match=r"components\[0\]: weight must be a number"):
        get_reward("weighted", components=[("exact_match", "1")])
    with pytest.raises(KeyError, match="unknown reward 'nope'"):
        get_reward("weighted", components=[("nope", 1.0)])
    with pytest.raises(ValueError, match="non-empty list"):
        get_reward("weighted", components=[])


def test_weighted_components_through_the_pool() -> None:
    w = get_reward("weighted", components=[("exact_match", 1.0), ("format", 0.1)])
    exs = [GSM] * 3
    with RewardPool(w, num_workers=1, timeout_s=5.0) as pool:
        res = pool.score(["#### 72", "72", "#### 1"], exs)
    assert res.rewards == pytest.approx([1.1, 1.0, 0.1])
    assert res.components == {"exact_match": [1.0, 1.0, 0.0], "format": [1.0, 0.0, 1.0]}


@settings(max_examples=200, deadline=None)
@given(st.integers(-(10**12), 10**12), st.booleans())
def test_numeric_accepts_any_formatting_of_the_same_integer(n: int, commas: bool) -> None:
    text = f"{n:,}" if commas else str(n)
    ex = Example("h", "", str(n), meta={"answer_marker": "####"})
    assert get_reward("numeric")(f"work\n#### {text}", ex) == 1.0
    assert get_reward("numeric")(f"work\n#### {n + 1}", ex) == 0.0


def test_math_verify_outside_the_main_thread_disables_signal_timeouts() -> None:
    """math-verify's signal.alarm timeouts raise in non-main threads; the reward switches them off."""
    import threading

    mv = get_reward("math_verify")
    out: list[float | BaseException] = []

    def run() -> None:
        try:
            out.append(mv(r"$\boxed{\frac{2}{4}}$", Example("t", "q", "0.5")))
        except BaseException as e:
            out.append(e)

    th = threading.Thread(target=run)
    th.start()
    th.join(timeout=60)
    assert out == [1.0]
