"""HFEngine and RolloutBatch: shapes, group ids, finish reasons, exact sampling log-probs, top-p,
EOS control, seeding; nucleus masking properties."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.models import load_model_and_tokenizer
from posttrain.rollout import HFEngine, RolloutBatch, SamplingParams, pad_left
from posttrain.rollout.hf import _nucleus


@pytest.fixture(scope="module")
def tiny():
    return load_model_and_tokenizer("tiny", seed=0)


def _prompts(tok):
    return [tok.encode(p, add_special_tokens=False) for p in ("12+3=", "7*8=", "100-1=")]


def _teacher_forced(model, batch: RolloutBatch, temperature: float) -> torch.Tensor:
    ids, am, _ = batch.model_inputs()
    pos = (am.cumsum(1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=am, position_ids=pos).logits.double() / temperature
    lp = torch.log_softmax(logits[:, :-1], -1).gather(2, ids[:, 1:, None]).squeeze(2)
    p = batch.prompt_ids.shape[1]
    return lp[:, p - 1 :] * batch.completion_mask


def test_sampling_params_validation():
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0)
    with pytest.raises(ValueError, match="min_new_tokens"):
        SamplingParams(max_new_tokens=4, min_new_tokens=5)
    assert SamplingParams(temperature=0).greedy


def test_variable_group_sizes_shapes_and_masks(tiny):
    model, tok = tiny
    eng = HFEngine(model, tok, seed=0)
    b = eng.generate(_prompts(tok), [3, 0, 2], SamplingParams(max_new_tokens=7))
    assert len(b) == 5
    assert b.group_ids.tolist() == [0, 0, 0, 2, 2]
    assert b.group_sizes() == {0: 3, 2: 2}
    assert b.completion_ids.shape[1] <= 7
    lengths = b.lengths
    for i, reason in enumerate(b.finish_reasons):
        row = b.completion_ids[i, : int(lengths[i])].tolist()
        if reason == "stop":
            assert row[-1] == tok.eos_token_id and tok.eos_token_id not in row[:-1]
        else:
            assert int(lengths[i]) == 7 and tok.eos_token_id not in row
        assert b.completion_mask[i, int(lengths[i]) :].sum() == 0
        assert (b.completion_ids[i, int(lengths[i]) :] == eng.pad_token_id).all()
    # prompts are left-padded copies of the inputs
    assert b.prompt_ids[3, -len(_prompts(tok)[2]) :].tolist() == _prompts(tok)[2]
    assert b.prompt_mask[3].sum() == len(_prompts(tok)[2])


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampling_logprobs_equal_teacher_forced_temperature_scaled(tiny, temperature):
    model, tok = tiny
    b = HFEngine(model, tok, seed=3).generate(
        _prompts(tok), [4, 4, 4], SamplingParams(temperature=temperature, max_new_tokens=10)
    )
    ref = _teacher_forced(model, b, temperature)
    assert torch.allclose(b.logprobs.double(), ref, atol=2e-5)
    assert (b.logprobs[b.completion_mask == 0] == 0).all()


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_top_p_logprobs_are_of_the_renormalised_nucleus(tiny, temperature):
    """Recorded log-prob = log p(token) - log(nucleus mass), p = softmax(logits / T), the nucleus of
    `_nucleus` at the same position (docs/rl-trainer.md). Mutant tried: recording the un-renormalised
    log p(token) (`log_softmax(z)` before the nucleus mask) -> off by -log(mass), up to log 2 here; the
    old test (0 <= diff <= log 2) passed it."""
    model, tok = tiny
    top_p = 0.5
    b = HFEngine(model, tok, seed=1).generate(
        _prompts(tok), [6, 6, 6], SamplingParams(top_p=top_p, temperature=temperature, max_new_tokens=6)
    )
    ids, am, _ = b.model_inputs()
    pos = (am.cumsum(1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=am, position_ids=pos).logits.double() / temperature
    p_width = b.prompt_ids.shape[1]
    z = logits[:, p_width - 1 : -1]  # (B, T, V): the distributions the completion tokens were drawn from
    logp_all = torch.log_softmax(z, -1)
    tokens = b.completion_ids
    logp_tok = logp_all.gather(2, tokens[..., None]).squeeze(2)
    kept = torch.isfinite(_nucleus(z, top_p))
    log_mass = torch.logsumexp(logp_all.masked_fill(~kept, float("-inf")), dim=-1)
    m = b.completion_mask.bool()
    assert kept.gather(2, tokens[..., None]).squeeze(2)[m].all()  # every sampled token is in its nucleus
    assert (log_mass[m] < -1e-3).any()  # the nucleus really cut mass off: the check can tell
    expected = logp_tok - log_mass
    torch.testing.assert_close(b.logprobs.double()[m], expected[m], rtol=0, atol=2e-5)
    assert (b.logprobs[~m] == 0).all()


def test_seed_reproducible_and_greedy_deterministic(tiny):
    model, tok = tiny
    p = SamplingParams(max_new_tokens=6, seed=11)
    a = HFEngine(model, tok, seed=0).generate(_prompts(tok), [3, 3, 3], p)
    b = HFEngine(model, tok, seed=99).generate(_prompts(tok), [3, 3, 3], p)
    assert torch.equal(a.completion_ids, b.completion_ids)
    g = SamplingParams(temperature=0, max_new_tokens=6)
    e = HFEngine(model, tok, seed=0)
    x, y = e.generate(_prompts(tok), [2, 2, 2], g), e.generate(_prompts(tok), [2, 2, 2], g)
    assert torch.equal(x.completion_ids, y.completion_ids)
    assert torch.equal(x.completion_ids[0], x.completion_ids[1])
    # the engine's generator is its own: the global torch RNG is untouched by sampling
    state = torch.get_rng_state()
    HFEngine(model, tok, seed=0).generate(_prompts(tok), [2, 2, 2], SamplingParams(max_new_tokens=4))
    assert torch.equal(state, torch.get_rng_state())


def test_state_dict_resumes_the_stream(tiny):
    model, tok = tiny
    e = HFEngine(model, tok, seed=5)
    p = SamplingParams(max_new_tokens=5)
    st_ = e.state_dict()
    a = e.generate(_prompts(tok), [2, 2, 2], p)
    e2 = HFEngine(model, tok, seed=123)
    e2.load_state_dict(st_)
    assert torch.equal(a.completion_ids, e2.generate(_prompts(tok), [2, 2, 2], p).completion_ids)


def test_suppress_eos_and_min_new_tokens(tiny):
    model, tok = tiny
    eng = HFEngine(model, tok, seed=0, eos_token_ids=[tok.eos_token_id])
    b = eng.generate(_prompts(tok), [4, 4, 4], SamplingParams(max_new_tokens=5, suppress_eos=True))
    assert b.finish_reasons == ["length"] * 12 and b.completion_mask.all()
    assert (b.completion_ids != tok.eos_token_id).all()

    # a model that always wants EOS: min_new_tokens forces that many tokens first
    def eos_first(module, inputs, out):
        out = out.clone()
        out[..., tok.eos_token_id] = 100.0
        return out

    handle = model.lm_head.register_forward_hook(eos_first)
    try:
        b = eng.generate(_prompts(tok), [2, 2, 2], SamplingParams(max_new_tokens=6, min_new_tokens=3))
        assert b.lengths.tolist() == [4] * 6 and b.finish_reasons == ["stop"] * 6
        b = eng.generate(_prompts(tok), [1, 1, 1], SamplingParams(max_new_tokens=6))
        assert b.lengths.tolist() == [1] * 3
    finally:
        handle.remove()


def test_generate_rejects_bad_requests(tiny):
    model, tok = tiny
    eng = HFEngine(model, tok)
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        eng.generate([[5], []], [1, 1], SamplingParams())
    with pytest.raises(ValueError, match="2 prompts but 1 group sizes"):
        eng.generate([[5], [6]], [1], SamplingParams())
    with pytest.raises(ValueError, match="no sequences"):
        eng.generate([[5]], [0], SamplingParams())


def test_max_batch_size_chunks_give_the_same_shapes(tiny):
    model, tok = tiny
    b = HFEngine(model, tok, seed=0, max_batch_size=4).generate(
        _prompts(tok), [3, 3, 3], SamplingParams(max_new_tokens=4)
    )
    assert len(b) == 9 and b.group_ids.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]


def test_pad_left_concat_select_model_inputs():
    ids, m = pad_left([[1, 2, 3], [4]], pad_id=0)
    assert ids.tolist() == [[1, 2, 3], [0, 0, 4]] and m.tolist() == [[1, 1, 1], [0, 0, 1]]
    a = RolloutBatch(
        ids,
        m,
        torch.tensor([[7, 2], [8, 0]]),
        torch.tensor([[1, 1], [1, 0]]),
        torch.zeros(2, 2),
        ["stop", "length"],
        torch.tensor([0, 1]),
        0,
    )
    b = RolloutBatch(
        torch.tensor([[5]]),
        torch.tensor([[1]]),
        torch.tensor([[9, 9, 9]]),
        torch.ones(1, 3, dtype=torch.long),
        torch.zeros(1, 3),
        ["length"],
        torch.tensor([2]),
        0,
    )
    c = RolloutBatch.concat([a, b])
    assert c.prompt_ids.tolist() == [[1, 2, 3], [0, 0, 4], [0, 0, 5]]
    assert c.completion_ids.tolist() == [[7, 2, 0], [8, 0, 0], [9, 9, 9]]
    assert c.lengths.tolist() == [2, 1, 3]
    inp, am, rm = c.model_inputs()
    assert inp[1].tolist() == [0, 0, 4, 8, 0, 0] and am[1].tolist() == [0, 0, 1, 1, 0, 0]
    assert rm[1].tolist() == [0, 0, 0, 1, 0, 0]
    s = c.select([2, 0])
    assert s.group_ids.tolist() == [2, 0] and s.finish_reasons == ["length", "stop"]
    with pytest.raises(ValueError, match="finish_reasons"):
        RolloutBatch(ids, m, ids, m, None, ["stop"], torch.tensor([0, 1]), 0)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(-8, 8, allow_nan=False), min_size=2, max_size=12),
    st.floats(0.05, 0.999),
)
def test_nucleus_is_the_smallest_prefix_reaching_top_p(logits, top_p):
    z = torch.tensor([logits], dtype=torch.float64)
    kept = torch.isfinite(_nucleus(z, top_p))[0]
    p = torch.softmax(z, -1)[0]
    assert p[kept].max() == p.max()  # the most likely token (one of them, under ties) stays
    assert p[kept].sum() >= top_p - 1e-9 or kept.all()
    # dropping the least likely kept token must fall below top_p (minimality), unless only one is kept
    if kept.sum() > 1:
        assert p[kept].sum() - p[kept].min() < top_p + 1e-9
    # every kept token is at least as likely as every removed one
    if (~kept).any():
        assert p[kept].min() >= p[~kept].max() - 1e-12


def test_inverse_cdf_draw_matches_the_distribution_and_skips_zero_mass():
    from posttrain.rollout.hf import _draw

    g = torch.Generator().manual_seed(0)
    p = torch.tensor([[0.5, 0.0, 0.2, 0.3, 0.0]]).repeat(20000, 1)
    tok = _draw(p, g).squeeze(1)
    freq = torch.bincount(tok, minlength=5).float() / len(tok)
    assert freq[1] == 0 and freq[4] == 0
    torch.testing.assert_close(freq, p[0], atol=0.015, rtol=0)
    one_hot = torch.zeros(3, 4)
    one_hot[torch.arange(3), torch.tensor([3, 0, 2])] = 1
    assert _draw(one_hot, g).squeeze(1).tolist() == [3, 0, 2]
