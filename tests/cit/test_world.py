"""The built-in stream: deterministic, gold answers satisfy the V rules, key parts decide the answer."""

from __future__ import annotations

from posttrain.studies.cit.diversify import TEMPLATES, diversify
from posttrain.studies.cit.world import CONCRETE, GENERATORS, check, make_task, make_world


def test_stream_is_deterministic_and_gold_passes_the_rules():
    world = make_world(0, 20)
    assert world == make_world(0, 20)
    for t in GENERATORS:
        train = make_task(t, 30, world=world, seed=0, split="train")
        test = make_task(t, 10, world=world, seed=0, split="test", avoid=train)
        assert train == make_task(t, 30, world=world, seed=0, split="train")
        assert not {(e.instruction, e.input) for e in test} & {(e.instruction, e.input) for e in train}
        for ex in train:
            assert ex.key_spans and check(ex, ex.output), ex
            assert len(ex.instruction) + len(ex.input) + len(ex.output) < 80  # short for CPU runs


def test_key_part_changes_the_answer():
    """Per task, the same input with another key part has another correct output (mostly), so a
    model that ignores the instruction cannot be right on all of them."""
    world = make_world(0, 20)
    for t in ("lookup", "compare", "format", "pick"):
        exs = make_task(t, 200, world=world, seed=0, split="train")
        by_input: dict[str, set[str]] = {}
        for e in exs:
            by_input.setdefault(e.input, set()).add(e.output)
        assert any(len(v) > 1 for v in by_input.values()), t


def test_rewrites_keep_key_parts_and_answers():
    world = make_world(0, 20)
    exs = make_task("lookup_upper", 5, world=world, seed=0, split="test")
    rew = diversify(exs, concrete=CONCRETE)
    assert set(rew) == set(TEMPLATES)
    for t, out in rew.items():
        for a, b in zip(exs, out, strict=True):
            assert b.output == a.output and b.input == a.input and b.key_spans
            if t != "concretizing":
                assert set(a.key_parts) <= set(b.key_parts)
            assert b.instruction != a.instruction
