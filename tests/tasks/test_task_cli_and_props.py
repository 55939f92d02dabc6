"""CLI (`posttrain tasks ...`), Example hashing, split properties."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from posttrain.cli import app
from posttrain.tasks import Example, get_task

runner = CliRunner()


def test_example_is_hashable_and_compares_meta() -> None:
    a = Example("1", "p", "a", meta={"x": [1]})
    b = Example("1", "p", "a", meta={"x": [1]})
    c = Example("1", "p", "a", meta={"x": [2]})
    assert a == b and hash(a) == hash(b)
    assert a != c
    assert len({a, b}) == 1


def test_cli_tasks_list_and_show() -> None:
    res = runner.invoke(app, ["tasks", "list"])
    assert res.exit_code == 0, res.output
    for name in ("arithmetic", "countdown", "jsonl", "exact_match", "math_verify", "weighted"):
        assert name in res.output
    res = runner.invoke(app, ["tasks", "show", "countdown", "-p", "n_train=5", "--n", "2", "--style", "long"])
    assert res.exit_code == 0, res.output
    assert res.output.count("reward of reference: 1.0") == 2
    res = runner.invoke(app, ["tasks", "show", "arithmetic", "-p", "digit=3"])
    assert res.exit_code != 0
    assert "unknown parameter(s) 'digit'" in res.output
    res = runner.invoke(app, ["tasks", "show", "arithmetic", "--style", "medium"])
    assert res.exit_code == 2 and "expected short or long, got 'medium'" in res.output


@pytest.mark.parametrize("task", ["arithmetic", "countdown"])
@pytest.mark.parametrize(("key", "value"), [("n_train", -1), ("n_heldout", True), ("n_train", 2.5)])
def test_split_sizes_must_be_non_negative_ints(task: str, key: str, value: object) -> None:
    with pytest.raises(ValueError, match=rf"task '{task}': {key} must be a non-negative integer, got"):
        get_task(task, **{key: value})


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    prompts=st.lists(st.integers(0, 30), min_size=1, max_size=60),
    frac=st.floats(0.0, 0.9),
    seed=st.integers(0, 3),
)
def test_jsonl_fraction_split_properties(
    tmp_path_factory, prompts: list[int], frac: float, seed: int
) -> None:
    """Any rows, any fraction: splits are disjoint by prompt, nothing is dropped, same seed = same split."""
    d = tmp_path_factory.mktemp("prop")
    p = d / "rows.jsonl"
    p.write_text("".join(json.dumps({"question": f"q{i}", "answer": str(i)}) + "\n" for i in prompts))
    t = get_task("jsonl", path=p, heldout_fraction=frac, seed=seed)
    train, held = t.split("train"), t.split("heldout")
    assert not {e.prompt for e in train} & {e.prompt for e in held}
    assert sorted(e.meta["row"] for e in train + held) == list(range(1, len(prompts) + 1))
    assert len({e.prompt for e in held}) == round(frac * len(set(prompts)))
    assert get_task("jsonl", path=p, heldout_fraction=frac, seed=seed).split("heldout") == held


@settings(max_examples=30, deadline=None)
@given(
    digits=st.integers(1, 3),
    ops=st.sampled_from(["+", "-", "*", "+-*"]),
    n_held=st.integers(0, 40),
    n_train=st.integers(0, 40),
    seed=st.integers(0, 100),
)
def test_arithmetic_split_properties(digits: int, ops: str, n_held: int, n_train: int, seed: int) -> None:
    t = get_task("arithmetic", digits=digits, ops=ops, n_train=n_train, n_heldout=n_held, seed=seed)
    train, held = t.split("train"), t.split("heldout")
    assert (len(train), len(held)) == (n_train, n_held)
    assert len({e.prompt for e in train + held}) == n_train + n_held
    for e in train + held:
        a, b, op = e.meta["a"], e.meta["b"], e.meta["op"]
        assert op in ops and 0 <= a < 10**digits and 0 <= b < 10**digits
        assert int(e.answer) == {"+": a + b, "-": a - b, "*": a * b}[op]
