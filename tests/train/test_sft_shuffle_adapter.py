"""The epoch shuffler shared by SFT and the RL prompt sampler (orders pinned to the historical ones,
exact resume), and the model adapter (log-probs, generate, save/load, registry)."""

from __future__ import annotations

import random

import pytest
import torch

from posttrain.hooks import UniformSampler
from posttrain.models import (
    ADAPTERS,
    CausalLMAdapter,
    ModelAdapter,
    ModelSpecError,
    load_adapter,
    load_model_and_tokenizer,
    sequence_logprobs,
)
from posttrain.rollout import HFEngine, SamplingParams, generate_completions
from posttrain.utils.data import EpochShuffler


def _seeded_reference(n, seed, draws):
    """The RL sampler's order: epoch e = random.Random(seed + e).shuffle(range(n)), front to back."""
    out, e = [], 0
    while len(out) < draws:
        order = list(range(n))
        random.Random(seed + e).shuffle(order)
        out += order
        e += 1
    return out[:draws]


def _stream_reference(n, seed, draws):
    """SFT's order: one random.Random(seed) shuffles a fresh range(n) per epoch, popped from the end."""
    rng, order, out = random.Random(seed), [], []
    while len(out) < draws:
        if not order:
            order = list(range(n))
            rng.shuffle(order)
        out.append(order.pop())
    return out


@pytest.mark.parametrize(
    ("order", "reference"), [("seeded", _seeded_reference), ("stream", _stream_reference)]
)
@pytest.mark.parametrize(("n", "seed"), [(1, 0), (7, 3), (40, 11)])
def test_orders_are_the_historical_ones_and_resume_exactly(order, reference, n, seed):
    draws = 4 * n + 5
    want = reference(n, seed, draws)
    sh = EpochShuffler(n, seed=seed, order=order)
    assert sh.take(draws) == want
    for cut in (0, 1, n - 1, n, n + 1, 3 * n + 2):  # restore anywhere, incl. exactly at an epoch end
        src = EpochShuffler(n, seed=seed, order=order)
        src.take(cut)
        state = src.state_dict()
        assert set(state) == {"epoch", "pos"}
        again = EpochShuffler(n, seed=seed, order=order)
        again.load_state_dict(state)
        assert again.take(draws - cut) == want[cut:]


def test_uniform_sampler_keeps_its_order_and_state_format():
    ex = [f"q{i}" for i in range(9)]
    s = UniformSampler(ex, seed=5)
    got = [q for step in range(7) for q in s.plan(step, 4, 2).examples]
    assert got == [ex[i] for i in _seeded_reference(9, 5, 28)]
    assert s.state_dict() == {"epoch": 3, "pos": 1} and (s.epoch, s.pos) == (3, 1)
    resumed = UniformSampler(ex, seed=5)
    resumed.load_state_dict({"epoch": 3, "pos": 1})  # the format checkpoints have always stored
    assert resumed.plan(0, 20, 1).examples == [ex[i] for i in _seeded_reference(9, 5, 48)[28:]]


def test_shuffler_rejects_bad_input():
    with pytest.raises(ValueError, match="at least one item"):
        EpochShuffler(0)
    with pytest.raises(ValueError, match="unknown order 'nope'"):
        EpochShuffler(3, order="nope")
    with pytest.raises(ValueError, match="invalid state"):
        EpochShuffler(3).load_state_dict({"epoch": 0, "pos": 4})


def test_causal_lm_adapter_wraps_loading_logprobs_generate_and_save(tmp_path):
    lm = load_adapter("tiny", device="cpu", seed=2)
    assert isinstance(lm, ModelAdapter) and isinstance(lm, CausalLMAdapter) and lm.kind == "causal-lm"
    assert lm.device == torch.device("cpu")
    ids = torch.tensor([[5, 6, 7, 8, 9], [10, 11, 12, 0, 0]])
    am = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    loss_mask = torch.tensor([[0, 0, 1, 1, 1], [0, 1, 1, 0, 0]])
    logp, ent = lm.logprobs(ids, am, loss_mask)
    ref_logp, ref_ent = sequence_logprobs(lm.model, ids, am, response_mask=loss_mask)
    assert torch.equal(logp, ref_logp) and torch.equal(ent, ref_ent)
    assert bool((logp[loss_mask == 0] == 0).all()) and bool((logp[loss_mask == 1] < 0).all())

    greedy = SamplingParams(temperature=0.0, max_new_tokens=5, logprobs=False)
    batch = generate_completions(lm, [[5, 6], [7, 8, 9]], greedy)
    ref = HFEngine(lm.model, lm.tokenizer).generate([[5, 6], [7, 8, 9]], [1, 1], greedy)
    assert torch.equal(batch.completion_ids, ref.completion_ids)
    assert len(generate_completions(lm, [[5, 6]], greedy, n_per_prompt=[3])) == 3

    lm.save(tmp_path / "m")
    back = load_adapter(str(tmp_path / "m"), device="cpu")
    for (k, a), (_, b) in zip(lm.model.state_dict().items(), back.model.state_dict().items(), strict=True):
        assert torch.equal(a, b), k
    model, tok = load_model_and_tokenizer("tiny", seed=2)
    assert torch.equal(CausalLMAdapter(model, tok).logprobs(ids, am, loss_mask)[0], logp)


def test_adapter_registry_and_errors():
    assert "causal-lm" in ADAPTERS.names()
    with pytest.raises(ValueError, match="unknown model adapter 'encoder-only'"):
        load_adapter("tiny", kind="encoder-only")
    with pytest.raises(ModelSpecError, match="not a known preset"):
        load_adapter("no-such-model")
    with pytest.raises(ValueError, match="pass the tokenizer"):
        CausalLMAdapter(torch.nn.Linear(2, 2), None)
