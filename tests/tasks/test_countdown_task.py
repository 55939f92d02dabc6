"""countdown: generation, disjoint splits, the safe parser, and the countdown reward."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.rewards import get_reward
from posttrain.tasks import Example, ExpressionError, get_task, parse_expression


def _cd(numbers: list[int], target: int) -> Example:
    return Example(
        id="x", prompt="p", answer="", meta={"numbers": numbers, "target": target, "answer_marker": "####"}
    )


def test_deterministic_disjoint_and_solvable() -> None:
    a = get_task("countdown", n_train=300, n_heldout=60, seed=1)
    b = get_task("countdown", n_train=300, n_heldout=60, seed=1)
    assert a.split("train") == b.split("train") and a.split("heldout") == b.split("heldout")
    assert a.split("train") != get_task("countdown", n_train=300, n_heldout=60, seed=2).split("train")
    key = lambda e: (tuple(sorted(e.meta["numbers"])), e.meta["target"])  # noqa: E731
    train, held = a.split("train"), a.split("heldout")
    assert not {key(e) for e in train} & {key(e) for e in held}
    assert len({key(e) for e in train}) == 300
    for e in train + held:
        assert len(e.meta["numbers"]) == 4 and all(1 <= n <= 20 for n in e.meta["numbers"])
        assert 1 <= e.meta["target"] <= 100
        value, used = parse_expression(e.answer)
        assert value == e.meta["target"] and sorted(used) == sorted(e.meta["numbers"])


def test_reference_completions_score_one_and_corrupted_zero() -> None:
    t = get_task("countdown", n_train=200, n_heldout=0, prompt_style="compact")
    r = get_reward("countdown")
    for e in t.split("train"):
        assert e.prompt.startswith("numbers: ")
        for style in ("short", "long"):
            assert r(t.reference_completion(e, style), e) == 1.0
        n0 = e.meta["numbers"][0]
        wrong_target = _cd(e.meta["numbers"], e.meta["target"] + 1)
        assert r(t.reference_completion(e), wrong_target) == 0.0
        # the reference uses every number, so using one more time than offered fails
        assert r(f"#### {e.answer}+{n0}-{n0}", e) == 0.0


def test_generation_that_cannot_fill_the_splits_says_so() -> None:
    t = get_task("countdown", n_numbers=2, max_number=2, n_train=50, n_heldout=0)
    with pytest.raises(ValueError, match=r"could only generate .* distinct solvable instances"):
        t.split("train")


@pytest.mark.parametrize(
    ("text", "value", "used"),
    [
        ("1+2*3", Fraction(7), [1, 2, 3]),
        ("(1+2)*3", Fraction(9), [1, 2, 3]),
        ("8/3", Fraction(8, 3), [8, 3]),
        ("10 - 4 - 3", Fraction(3), [10, 4, 3]),
        ("12/(6/3)", Fraction(6), [12, 6, 3]),
        (" ( ( 7 ) ) ", Fraction(7), [7]),
    ],
)
def test_parser_closed_form(text: str, value: Fraction, used: list[int]) -> None:
    assert parse_expression(text) == (value, used)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("__import__('os').system('echo pwned')", "unexpected character '_'"),
        ("os.system(1)", "unexpected character 'o'"),
        ("(1).__class__", "unexpected character '.'"),
        ("abs(3)", "unexpected character 'a'"),
        ("2**100000", r"unexpected '\*'"),
        ("lambda: 1", "unexpected character 'l'"),
        ("1 if 1 else 2", "unexpected character 'i'"),
        ("3.5+1", r"unexpected character '\.'"),
        ("-3+5", r"unexpected '-'"),
        ("1/(2-2)", "division by zero"),
        ("(1+2", r"missing '\)'"),
        ("1+", "ended early"),
        ("1 2", "unexpected 2 after"),
        ("", "empty expression"),
        ("07+1", "leading zero"),
        ("(" * 40 + "1" + ")" * 40, "nested deeper"),
        ("1+" * 200 + "1", "longer than"),
    ],
)
def test_parser_rejects_everything_else(text: str, why: str) -> None:
    with pytest.raises(ExpressionError, match=why):
        parse_expression(text)


def test_reward_rules() -> None:
    r = get_reward("countdown")
    ex = _cd([3, 5, 7, 2], 24)
    assert r("#### (7-3)*(5+1)", ex) == 0.0  # 1 is not offered
    assert r("#### 3*(5+7-2)-6", ex) == 0.0
    assert r("#### (7+5)*2", ex) == 1.0  # a sub-multiset is enough by default
    assert r("#### (7+5)*2 = 24", ex) == 1.0
    assert r("#### (7+5)*2 = 25", ex) == 0.0
    assert r("#### (7+5)*2*1", ex) == 0.0
    assert r("reasoning...\n#### (7+5)*2\n", ex) == 1.0
    assert r("(7+5)*2", ex) == 1.0  # no marker: first line
    assert r("#### __import__('os')", ex) == 0.0
    assert get_reward("countdown", use_all=True)("#### (7+5)*2", ex) == 0.0
    assert get_reward("countdown", use_all=True)("#### (7+5)*2*(3-2)", ex) == 0.0  # 2 used twice
    assert get_reward("countdown", use_all=True)("#### 3*(7+5-2)-6", ex) == 0.0
    assert get_reward("countdown", use_all=True)("#### (3*7+5)-2", ex) == 1.0
    assert get_reward("countdown", format_score=0.1)("#### 3+5", ex) == 0.1
    assert get_reward("countdown", format_score=0.1)("#### three", ex) == 0.0
    assert r("#### 8/3*9", _cd([8, 3, 9], 24)) == 1.0  # exact rationals, no float rounding
    with pytest.raises(ValueError, match="countdown needs meta"):
        r("#### 1", Example("bad", "p", "a", meta={}))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 30), min_size=1, max_size=6), st.randoms(use_true_random=False))
def test_parser_agrees_with_fraction_arithmetic(numbers: list[int], rnd) -> None:
    # build a random fully parenthesized expression and its exact value side by side
    items = [(Fraction(n), str(n)) for n in numbers]
    while len(items) > 1:
        (a, ta), (b, tb) = items.pop(rnd.randrange(len(items))), items.pop(rnd.randrange(len(items)))
        op = rnd.choice("+-*/" if b != 0 else "+-*")
        v = {"+": a + b, "-": a - b, "*": a * b, "/": a / b if b else a}[op]
        items.append((v, f"({ta}{op}{tb})"))
    value, used = parse_expression(items[0][1])
    assert value == items[0][0]
    assert sorted(used) == sorted(numbers)
