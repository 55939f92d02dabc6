"""The built-in stream: deterministic, gold answers satisfy the V rules, key parts decide the answer."""

from __future__ import annotations

from posttrain_lab.studies.cit.diversify import TEMPLATES, diversify
from posttrain_lab.studies.cit.world import CONCRETE, GENERATORS, check, make_task, make_world


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


def _words(s: str) -> set[str]:
    import re

    return set(re.findall(r"[a-z]+", s.lower()))


def test_p_score_rewrites_use_wordings_no_method_trained_on():
    """The P-score's held-out rewrites must not reuse the phrasings the kpig arm's
    diversified training rows use (rule templates + CONCRETE), or only kpig has seen them. Every word a
    held-out rewrite adds to an instruction is a word no training rewrite adds (over every training
    row of every task, every template); the train-rules diagnostic set does overlap (the check bites)."""
    from posttrain_lab.studies.cit.runner import CITConfig, StreamRun

    cfg = CITConfig(
        stream={"n_train": 120, "n_test": 30},
        methods=[{"name": "kpig", "replay": {"kind": "kpig"}, "diversify": {"ratio": 1.0}}],
    )
    run = StreamRun(cfg, cfg.methods[0], 0)
    train_added: set[str] = set()
    for k, task in enumerate(cfg.stream.tasks, 1):
        for a, b in zip(run.train[task], run._diversified(k, run.train[task]), strict=True):
            train_added |= _words(b.instruction) - _words(a.instruction)
    assert {"step", "answer", "home", "tell"} <= train_added  # every template contributed
    held = run.p_score_sets("heldout")
    assert set(held) == set(TEMPLATES)
    eval_added: set[str] = set()
    for tmpl, by_task in held.items():
        assert set(by_task) == set(cfg.stream.heldout)
        for t, exs in by_task.items():
            for a, b in zip(run.test[t], exs, strict=True):
                assert b.output == a.output and b.input == a.input and len(b.key_spans) >= len(a.key_spans)
                assert b.instruction != a.instruction, (tmpl, a.instruction)
                eval_added |= _words(b.instruction) - _words(a.instruction)
    assert eval_added and not (eval_added & train_added), eval_added & train_added
    leaked: set[str] = set()
    for by_task in run.p_score_sets("train").values():
        for t, exs in by_task.items():
            for a, b in zip(run.test[t], exs, strict=True):
                leaked |= _words(b.instruction) - _words(a.instruction)
    assert leaked & train_added
