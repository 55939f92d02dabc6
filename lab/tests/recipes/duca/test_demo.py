"""Pieces of the DuCA comparison: the noisy teacher's conversations, SFT on its turns, the table."""

from __future__ import annotations

import torch

from posttrain.models import load_model_and_tokenizer
from posttrain_lab.recipes.duca.demo import METRICS, NoisySeller, sft_on_episodes, table, teacher_episodes
from posttrain_lab.recipes.duca.sales import SalesTask

PARAMS = {
    "env": "sales",
    "env_params": {"max_turns": 4},
    "max_context": 1024,
    "user_turn": "\nCustomer: {observation}\nSeller:",
}


def test_noisy_seller_is_seeded_and_noisy():
    obs = ["Hi, I want to buy something."]
    s1, s2 = NoisySeller(seed=3), NoisySeller(seed=3)
    assert [s1.reply(obs) for _ in range(20)] == [s2.reply(obs) for _ in range(20)]
    noisy = NoisySeller(seed=0, p_disclose=1.0, p_repeat=1.0, p_claim=1.0).reply(obs)
    assert noisy == "As an AI, happy to help. Welcome! What are you looking for? Guaranteed!"
    assert (
        NoisySeller(seed=0, p_disclose=0.0, p_repeat=0.0, p_claim=0.0).reply(obs)
        == "Welcome! What are you looking for?"
    )


def test_noisy_seller_format_noise_is_a_format_violation_and_off_by_default():
    """The warm start of the DuCA experiment needs format violations to be learnable: with
    ``p_format`` the teacher's turn ends with a role marker, which the sales environment's format
    check rejects; ``p_format=0`` (default) draws nothing, so the demo's teacher is unchanged."""
    from posttrain_lab.recipes.duca.sales import format_ok

    obs = ["Hi, I want to buy something."]
    bad = NoisySeller(seed=0, p_disclose=0.0, p_repeat=0.0, p_claim=0.0, p_format=1.0).reply(obs)
    assert bad == "Welcome! What are you looking for? Customer: ok?"
    assert not format_ok(bad, max_words=60)
    assert format_ok(bad.removesuffix(NoisySeller.FORMAT_NOISE), max_words=60)
    default, off = NoisySeller(seed=5), NoisySeller(seed=5, p_format=0.0)
    assert [default.reply(obs) for _ in range(30)] == [off.reply(obs) for _ in range(30)]
    some = NoisySeller(seed=5, p_format=0.3)
    share = sum(r.endswith(NoisySeller.FORMAT_NOISE) for r in (some.reply(obs) for _ in range(400))) / 400
    assert 0.22 < share < 0.38


def test_teacher_conversations_then_sft_on_policy_turns_only():
    model, tok = load_model_and_tokenizer("tiny", device="cpu", seed=0)
    exs = SalesTask(n_train=2, n_heldout=1).split("train")
    eps = teacher_episodes(tok, exs, PARAMS, max_new_tokens=96, seed=0)
    b = eps.batch
    assert eps.rewards.tolist() == [1.0] * 2  # the underlying script converts in 3 turns
    for i in range(len(b)):
        n = int(b.lengths[i])
        agent = tok.decode(
            b.completion_ids[i, :n][b.action_mask[i, :n].bool()].tolist(), skip_special_tokens=True
        )
        assert "What are you looking for?" in agent and "recommend the" in agent
        assert "Customer:" not in agent
    before = [p.detach().clone() for p in model.parameters()]
    losses = sft_on_episodes(model, eps, steps=3, batch_size=2, lr=3e-3, seed=0)
    assert losses[-1] < losses[0]
    assert any(not torch.equal(p, q) for p, q in zip(before, model.parameters(), strict=True))


def test_table_reports_relative_changes():
    row = dict.fromkeys(METRICS, 0.5)
    res = {
        "teacher": row,
        "variants": {
            "duca": {"start": row, "end": {**row, "conversion_rate": 0.6, "repetition_rate": 0.1}},
            "grpo_sum": {"start": row, "end": row},
            "grpo_session": {"start": row, "end": {**row, "repetition_rate": 0.0}},
        },
    }
    md = table(res)
    assert md.splitlines()[1].count("|---") == len(METRICS) + 1
    vs_sum = next(ln for ln in md.splitlines() if ln.startswith("| duca vs grpo_sum"))
    assert "+20 %" in vs_sum and "-80 %" in vs_sum
    vs_sess = next(ln for ln in md.splitlines() if ln.startswith("| duca vs grpo_session"))
    assert "n/a" in vs_sess
