"""sequence_logprobs on real tiny Llama / Qwen2 models: agreement with full logits, left/right padding,
response masks, gradients, and consistency with what `generate` scored."""

from __future__ import annotations

import pytest
import torch

from posttrain.models import load_model_and_tokenizer, position_ids_from_attention_mask, sequence_logprobs

PRESET_NAMES = ["tiny", "tiny-qwen2"]
TEXTS = ["12+30=42", "7*8=56!", "a"]


@pytest.fixture(scope="module", params=PRESET_NAMES)
def model_tok(request):
    model, tok = load_model_and_tokenizer(request.param, seed=1, padding_side="left")
    # scale the random init up so the distributions are far from uniform (a stricter comparison)
    with torch.no_grad():
        model.lm_head.weight.mul_(20.0)
    return model, tok


def _full_reference(model, ids, mask, temperature=1.0):
    """logits -> log_softmax -> gather at the next token, with generate's position ids."""
    logits = model(
        input_ids=ids, attention_mask=mask, position_ids=position_ids_from_attention_mask(mask)
    ).logits
    logp_all = (logits[:, :-1].float() / temperature).log_softmax(-1)
    lp = logp_all.gather(-1, ids[:, 1:, None]).squeeze(-1)
    ent = -(logp_all.exp() * logp_all).sum(-1)
    return lp, ent


def test_position_ids_match_generate_convention():
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    assert position_ids_from_attention_mask(mask).tolist() == [
        [0, 0, 0, 1, 2],
        [0, 1, 2, 3, 4],
        [0, 1, 2, 0, 0],
    ]


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_matches_full_logits_left_padded(model_tok, temperature):
    model, tok = model_tok
    batch = tok(TEXTS, padding=True, return_tensors="pt")
    ids, mask = batch["input_ids"], batch["attention_mask"]
    with torch.no_grad():
        lp, ent = sequence_logprobs(model, ids, mask, temperature=temperature, chunk_size=5)
        rlp, rent = _full_reference(model, ids, mask, temperature)
    valid = (mask[:, 1:] * mask[:, :-1]).bool()
    torch.testing.assert_close(lp[:, 1:][valid], rlp[valid], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent[:, 1:][valid], rent[valid], rtol=1e-5, atol=1e-5)
    assert (lp[:, 0] == 0).all() and (lp[:, 1:][~valid] == 0).all() and (ent[:, 1:][~valid] == 0).all()
    assert lp.shape == ids.shape and lp.dtype == torch.float32
    assert lp[:, 1:][valid].min() < -1.0  # the check is not vacuous: the model is far from certain


def test_left_padding_invariance_and_right_padding(model_tok):
    model, tok = model_tok
    with torch.no_grad():
        left = tok(TEXTS, padding=True, return_tensors="pt")
        lp_left, ent_left = sequence_logprobs(model, left["input_ids"], left["attention_mask"])
        tok.padding_side = "right"
        right = tok(TEXTS, padding=True, return_tensors="pt")
        tok.padding_side = "left"
        lp_right, _ = sequence_logprobs(model, right["input_ids"], right["attention_mask"])
        for i, text in enumerate(TEXTS):
            ids = torch.tensor([tok.encode(text)])
            lp_one, ent_one = sequence_logprobs(model, ids, torch.ones_like(ids))
            n = ids.shape[1]
            torch.testing.assert_close(lp_left[i, -n:], lp_one[0], rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(ent_left[i, -n:], ent_one[0], rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(lp_right[i, :n], lp_one[0], rtol=1e-5, atol=1e-5)


def test_response_mask_selects_positions_and_gradients_match_full(model_tok):
    model, tok = model_tok
    batch = tok(["1+2=3", "10+5=15"], padding=True, return_tensors="pt")
    ids, mask = batch["input_ids"], batch["attention_mask"]
    resp = torch.zeros_like(mask)
    resp[:, -2:] = 1  # the answer tokens
    lp, ent = sequence_logprobs(model, ids, mask, response_mask=resp, chunk_size=3)
    assert (lp[resp == 0] == 0).all() and (ent[resp == 0] == 0).all()
    loss = -(lp * resp).sum() - 0.1 * (ent * resp).sum()
    model.zero_grad()
    loss.backward()
    grads = {k: p.grad.clone() for k, p in model.named_parameters()}
    model.zero_grad()
    rlp, rent = _full_reference(model, ids, mask)
    r = resp[:, 1:].float()
    ref_loss = -(rlp * r).sum() - 0.1 * (rent * r).sum()
    ref_loss.backward()
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-5)
    for k, p in model.named_parameters():
        assert torch.isfinite(grads[k]).all(), k
        # fp32 noise scales with the largest gradient entry (up to ~100 with the scaled-up head)
        atol = 1e-5 * float(p.grad.abs().max()) + 1e-7
        torch.testing.assert_close(grads[k], p.grad, rtol=1e-4, atol=atol, msg=k)
    model.zero_grad()


def test_scores_match_generate_output_logits(model_tok):
    """Score what `generate` produced from a left-padded batch: the logits generate saw per step must
    give the same log-probs as re-scoring the full sequence (this checks the position-id convention)."""
    model, tok = model_tok
    prompts = tok(["3+4=", "100+200="], padding=True, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(
            **prompts, max_new_tokens=5, do_sample=False, return_dict_in_generate=True, output_logits=True
        )
    seq = out.sequences
    p_len = prompts["input_ids"].shape[1]
    gen = seq[:, p_len:]
    step_logits = torch.stack(out.logits, dim=1).float()  # (B, 5, V)
    gen_lp = step_logits.log_softmax(-1).gather(-1, gen[..., None]).squeeze(-1)
    mask = torch.cat([prompts["attention_mask"], torch.ones_like(gen)], dim=1)
    resp = torch.zeros_like(mask)
    resp[:, p_len:] = 1
    with torch.no_grad():
        lp, _ = sequence_logprobs(model, seq, mask, response_mask=resp)
    torch.testing.assert_close(lp[:, p_len:], gen_lp, rtol=1e-4, atol=1e-4)


def test_response_mask_errors(model_tok):
    model, tok = model_tok
    batch = tok(["ab", "abcd"], padding=True, return_tensors="pt")  # row 0 is left-padded by 2
    ids, mask = batch["input_ids"], batch["attention_mask"]
    bad0 = torch.zeros_like(mask)
    bad0[1, 0] = 1
    with pytest.raises(ValueError, match="row 1, position 0, but position 0 has no context"):
        sequence_logprobs(model, ids, mask, response_mask=bad0)
    pad = torch.zeros_like(mask)
    pad[0, 1] = 1
    with pytest.raises(ValueError, match="row 0, position 1, but the token is padding"):
        sequence_logprobs(model, ids, mask, response_mask=pad)
    first = torch.zeros_like(mask)
    first[0, 2] = 1
    with pytest.raises(ValueError, match="row 0, position 2, but the preceding token is padding"):
        sequence_logprobs(model, ids, mask, response_mask=first)
    with pytest.raises(ValueError, match="response_mask shape"):
        sequence_logprobs(model, ids, mask, response_mask=mask[:, 1:])
    with pytest.raises(ValueError, match=r"input_ids must be \(B, T\)"):
        sequence_logprobs(model, ids[0], mask[0])


def test_bf16_model_gives_fp32_outputs():
    model, tok = load_model_and_tokenizer("tiny", dtype="bfloat16")
    ids = torch.tensor([tok.encode("hello")])
    lp, ent = sequence_logprobs(model, ids)
    assert lp.dtype == ent.dtype == torch.float32
    rlp, _ = _full_reference(model, ids, torch.ones_like(ids))
    torch.testing.assert_close(lp[:, 1:], rlp, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_single_token_rows_give_float32_zeros(dtype):
    model, _ = load_model_and_tokenizer("tiny", dtype=dtype)
    ids = torch.tensor([[5], [6]])
    lp, ent = sequence_logprobs(model, ids)
    assert lp.shape == ent.shape == (2, 1)
    assert lp.dtype == ent.dtype == torch.float32
    assert (lp == 0).all() and (ent == 0).all()
