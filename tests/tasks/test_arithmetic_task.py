"""arithmetic task: determinism, disjoint splits, formats, reference completions vs exact_match."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.rewards import get_reward
from posttrain.tasks import Example, get_task, list_tasks
from posttrain.tasks.arithmetic import long_addition, long_multiplication, long_subtraction


def _key(e: Example) -> str:
    return e.prompt


def test_registered_and_unknown_names() -> None:
    assert "arithmetic" in list_tasks()
    with pytest.raises(KeyError, match=r"unknown task 'arithmetc'\. Did you mean 'arithmetic'"):
        get_task("arithmetc")
    with pytest.raises(ValueError, match=r"unknown parameter\(s\) 'digit'; accepted: digits, ops"):
        get_task("arithmetic", digit=3)


@pytest.mark.parametrize("fmt", ["plain", "scratchpad"])
def test_deterministic_per_seed_and_disjoint(fmt: str) -> None:
    a = get_task("arithmetic", seed=3, n_train=500, n_heldout=100, format=fmt, ops="+-*")
    b = get_task("arithmetic", seed=3, n_train=500, n_heldout=100, format=fmt, ops="+-*")
    c = get_task("arithmetic", seed=4, n_train=500, n_heldout=100, format=fmt, ops="+-*")
    assert a.split("train") == b.split("train") and a.split("heldout") == b.split("heldout")
    assert a.split("train") != c.split("train")
    train, held = a.split("train"), a.split("heldout")
    assert len(train) == 500 and len(held) == 100
    assert not {_key(e) for e in train} & {_key(e) for e in held}
    assert len({_key(e) for e in train}) == 500  # no duplicate questions either
    assert len({e.id for e in train + held}) == 600


def test_heldout_does_not_depend_on_n_train() -> None:
    small = get_task("arithmetic", n_train=10, n_heldout=50)
    big = get_task("arithmetic", n_train=3000, n_heldout=50)
    assert small.split("heldout") == big.split("heldout")
    assert big.split("train")[:10] == small.split("train")


def test_plain_format_closed_form() -> None:
    t = get_task("arithmetic", digits=2, ops="+", n_train=50, n_heldout=0)
    for e in t.split("train"):
        a, b = e.meta["a"], e.meta["b"]
        assert e.prompt == f"{a}+{b}="
        assert e.answer == str(a + b)
        assert 0 <= a < 100 and 0 <= b < 100
        assert t.reference_completion(e) == e.answer


def test_large_digit_space_uses_rejection_sampling() -> None:
    t = get_task("arithmetic", digits=9, ops="*", n_train=200, n_heldout=20, seed=1)
    train, held = t.split("train"), t.split("heldout")
    assert not {e.prompt for e in train} & {e.prompt for e in held}
    for e in train[:20]:
        assert int(e.answer) == e.meta["a"] * e.meta["b"]


def test_bad_params_have_clear_errors() -> None:
    with pytest.raises(ValueError, match="ops must be a non-empty subset"):
        get_task("arithmetic", ops="+/")
    with pytest.raises(ValueError, match="exceeds the 100 distinct questions"):
        get_task("arithmetic", digits=1, n_train=100, n_heldout=1)
    with pytest.raises(ValueError, match="format must be one of plain, scratchpad"):
        get_task("arithmetic", format="cot")
    with pytest.raises(ValueError, match="unknown split 'test'"):
        get_task("arithmetic").split("test")  # type: ignore[arg-type]


def test_long_scratchpad_lines_closed_form() -> None:
    assert long_addition(58, 67) == [
        "8+7+0=15 write 5 carry 1",
        "5+6+1=12 write 2 carry 1",
        "write 1",
    ]
    assert long_subtraction(52, 17) == ["2-7-0=-5 write 5 borrow 1", "5-1-1=3 write 3 borrow 0"]
    assert long_subtraction(17, 52)[0] == "17<52 so 17-52=-(52-17)"
    assert long_multiplication(12, 34) == ["12*4=48", "12*30=360", "48+360=408"]


@pytest.mark.parametrize("style", ["short", "long"])
def test_reference_completions_score_one_and_corrupted_zero(style: str) -> None:
    t = get_task("arithmetic", digits=3, ops="+-*", format="scratchpad", n_train=300, n_heldout=0)
    em, fmt = get_reward("exact_match"), get_reward("format")
    for e in t.split("train"):
        ref = t.reference_completion(e, style)
        assert ref.endswith(f"#### {e.answer}")
        assert em(ref, e) == 1.0 and fmt(ref, e) == 1.0
        wrong = ref[: -len(e.answer)] + str(int(e.answer) + 1)
        assert em(wrong, e) == 0.0
        assert em(ref.replace("####", "###"), e) == 0.0  # marker lost: first line is not the answer
    long_e = t.split("train")[0]
    assert len(t.reference_completion(long_e, "long")) > len(t.reference_completion(long_e, "short"))


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 10**6), st.integers(0, 10**6))
def test_long_forms_compute_the_right_digits(a: int, b: int) -> None:
    # the written digits of the column algorithm, read back, are the true result
    add = long_addition(a, b)
    digits = [int(line.split("write ")[1].split()[0]) for line in add]
    assert int("".join(map(str, reversed(digits)))) == a + b
    hi, lo = max(a, b), min(a, b)
    sub = [x for x in long_subtraction(hi, lo) if "write" in x]
    digits = [int(line.split("write ")[1].split()[0]) for line in sub]
    assert int("".join(map(str, reversed(digits)))) == hi - lo
    assert long_multiplication(a, b)[-1].endswith(f"={a * b}")
