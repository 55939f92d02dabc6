"""MCQ probe prompts byte for byte (renmengjie7/Self-Aligning eval/my_domain_eval.py) and batched scoring."""

from __future__ import annotations

import json

import pytest
import torch

from posttrain_lab.studies.analysis import MCQ, load_mcqs, probe, probe_prompt

Q = MCQ("Considered holy by three religions is _____", ("Jerusalem", "Baghdad", "Teheran", "Mecca"), 0, "q")
D1 = MCQ("2+2=?", ("3", "4"), 1, "d1")
D2 = MCQ("Capital of France?", ("Paris", "Rome", "Oslo"), 0, "d2")
HEAD = "The following are multiple choice questions about history. Please choose the correct answer. \n\n"
QTEXT = "Considered holy by three religions is _____\nA. Jerusalem\nB. Baghdad\nC. Teheran\nD. Mecca\nAnswer:"


def test_base_prompt_bytes():
    """The authors shuffle the dev set with random.seed(42) before taking k shots: for 2 dev items the
    permutation is [1, 0], so D2 comes first; dev_seed=None keeps the file order."""
    d1 = "2+2=?\nA. 3\nB. 4\nAnswer:B. 4\n\n"
    d2 = "Capital of France?\nA. Paris\nB. Rome\nC. Oslo\nAnswer:A. Paris\n\n"
    got = probe_prompt(Q, domain="history", style="base", dev=[D1, D2], shots=2)
    assert got == HEAD + d2 + d1 + QTEXT
    assert probe_prompt(Q, domain="history", style="base", dev=[D1, D2], shots=1) == HEAD + d2 + QTEXT
    assert (
        probe_prompt(Q, domain="history", style="base", dev=[D1, D2], shots=2, dev_seed=None)
        == HEAD + d1 + d2 + QTEXT
    )
    assert probe_prompt(Q, domain="history", style="base") == HEAD + QTEXT
    with pytest.raises(ValueError, match="3-shot"):
        probe_prompt(Q, domain="history", dev=[D1], shots=3)


def test_few_shot_examples_follow_the_authors_seed_42_shuffle():
    """The authors' ``my_domain_eval.main`` runs ``random.seed(42)``, shuffles ``range(len(devs))``
    and takes the first k; for 10 dev items the 5 shots are items [7, 3, 2, 8, 5]. The permutation is
    recomputed here with the global ``random`` module exactly as the authors call it."""
    import random

    from posttrain_lab.studies.analysis.probe import dev_order

    devs = [MCQ(f"dev question {i}?", ("yes", "no"), i % 2, f"d{i}") for i in range(10)]
    state = random.getstate()
    try:
        random.seed(42)
        authors = list(range(10))
        random.shuffle(authors)
    finally:
        random.setstate(state)
    assert authors[:5] == [7, 3, 2, 8, 5] == dev_order(10)[:5]
    got = probe_prompt(Q, domain="history", style="base", dev=devs, shots=5)
    want = HEAD + "".join(
        f"dev question {i}?\nA. yes\nB. no\nAnswer:{'AB'[i % 2]}. {('yes', 'no')[i % 2]}\n\n"
        for i in (7, 3, 2, 8, 5)
    )
    assert got == want + QTEXT
    assert dev_order(10, None) == list(range(10))


def test_vicuna_prompt_bytes():
    want = (
        "A chat between a curious user and an artificial intelligence assistant. The assistant gives "
        "helpful, detailed, and polite answers to the user's questions. USER: "
        + HEAD
        + QTEXT
        + " ASSISTANT: "
    )
    assert probe_prompt(Q, domain="history", style="vicuna") == want
    assert probe_prompt(Q, domain="history", style="chat") == HEAD + QTEXT


def test_load_errors(tmp_path):
    p = tmp_path / "q.jsonl"
    p.write_text(
        json.dumps({"question": "x", "choices": ["a", "b"], "answer": "B"})
        + "\n"
        + json.dumps({"q": 1})
        + "\n"
    )
    with pytest.raises(ValueError, match=r"q.jsonl: line 2: missing key 'question'"):
        load_mcqs(p)
    p.write_text(json.dumps({"question": "x", "choices": ["a", "b"], "answer": 5}) + "\n")
    with pytest.raises(ValueError, match=r"line 1: .*answer 5 outside"):
        load_mcqs(p)


def test_scoring_batched_matches_single_and_manual():
    from posttrain.models import load_model_and_tokenizer

    model, tok = load_model_and_tokenizer("tiny", seed=3)
    qs = [Q, D1, D2]
    batched = probe(model, tok, qs, domain="history", dev=[D1, D2], shots=1, batch_size=3)
    for q, r in zip(qs, batched.results, strict=True):
        single = probe(model, tok, [q], domain="history", dev=[D1, D2], shots=1).results[0]
        assert r.probs == pytest.approx(single.probs, abs=1e-5)
        ids = [tok.bos_token_id, *tok.encode(probe_prompt(q, domain="history", dev=[D1, D2], shots=1))]
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, -1]
        letters = [tok(c)["input_ids"][-1] for c in "ABCD"[: len(q.choices)]]
        assert r.probs == pytest.approx(torch.softmax(logits[letters], 0).tolist(), abs=1e-5)
        assert r.pred == max(range(len(r.probs)), key=r.probs.__getitem__)
        assert r.correct == (r.pred == q.answer)
    chat = probe(model, tok, [Q], domain="history", style="chat")
    assert len(chat.results[0].probs) == 4
