"""FastEngine: same completions as the HF engine under greedy decoding (fp32), sampling log-probs equal
to the training side's sequence_logprobs (fp32 within 1e-4; bf16 within a measured bound), the
pre-allocated cache layer against DynamicLayer, finished-row dropping, chunking, registry."""

from __future__ import annotations

import pytest
import torch
from transformers.cache_utils import DynamicLayer

from posttrain.models import load_model_and_tokenizer, sequence_logprobs
from posttrain.rollout import EngineContext, FastEngine, HFEngine, SamplingParams, build_engine
from posttrain.rollout.fast import PreallocLayer

# bf16 autocast: sampling log-probs (incremental decode, KV cache) vs the training forward (one pass),
# both under autocast. Measured on tiny / tiny-qwen2: max |diff| 0.004, mean 0.0008 per token.
BF16_MAX_ABS = 0.03
BF16_MEAN_ABS = 0.005


@pytest.fixture(scope="module", params=["tiny", "tiny-qwen2"])
def model_tok(request):
    return load_model_and_tokenizer(request.param, seed=0, padding_side="left")


def _prompts(tok):
    return [tok.encode(p, add_special_tokens=False) for p in ("12+3=", "7*8=", "100-1=", "9=")]


def _stop_ids(model, tok, prompts) -> list[int]:
    """Two tokens that greedy decoding emits early in different rows: used as EOS so that rows stop at
    different steps (the random tiny models never pick the real EOS)."""
    b = HFEngine(model, tok, seed=0).generate(
        prompts, [1] * len(prompts), SamplingParams(temperature=0, max_new_tokens=8)
    )
    seen: list[int] = []
    for t in (2, 4):
        for r in range(len(prompts)):
            x = int(b.completion_ids[r, t])
            if x not in seen:
                seen.append(x)
                break
    return seen


@pytest.mark.parametrize("drop", [True, False])
@pytest.mark.parametrize("max_batch", [None, 3])
@pytest.mark.parametrize("budget", [None, 36])
def test_greedy_same_completions_as_hf(model_tok, drop, max_batch, budget):
    model, tok = model_tok
    prompts = _prompts(tok)
    stop = _stop_ids(model, tok, prompts)
    ns = [2, 0, 3, 1]
    for params in (
        SamplingParams(temperature=0, max_new_tokens=10),
        SamplingParams(temperature=0, max_new_tokens=10, min_new_tokens=3),
    ):
        ref = HFEngine(model, tok, seed=0, eos_token_ids=stop).generate(prompts, ns, params)
        fast = FastEngine(
            model,
            tok,
            seed=0,
            eos_token_ids=stop,
            max_batch_size=max_batch,
            drop_finished=drop,
            compact_fraction=0.1,
            max_batch_tokens=budget,
        ).generate(prompts, ns, params)
        assert "stop" in ref.finish_reasons and "length" in ref.finish_reasons  # both paths exercised
        assert torch.equal(fast.prompt_ids, ref.prompt_ids) or max_batch is not None or budget
        assert torch.equal(fast.completion_ids, ref.completion_ids)
        assert torch.equal(fast.completion_mask, ref.completion_mask)
        assert fast.finish_reasons == ref.finish_reasons
        assert fast.group_ids.tolist() == ref.group_ids.tolist() == [0, 0, 2, 2, 2, 3]


def _train_side_diff(model, batch, temperature=1.0, bf16=False) -> torch.Tensor:
    ids, attn, score = batch.model_inputs()
    ctx = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else torch.autocast("cpu", enabled=False)
    with torch.no_grad(), ctx:
        lp, _ = sequence_logprobs(model, ids, attn, response_mask=score, temperature=temperature)
    p = batch.prompt_ids.shape[1]
    m = batch.completion_mask
    return (lp[:, p:] - batch.logprobs).abs() * m


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampling_logprobs_equal_training_side_fp32(model_tok, temperature):
    model, tok = model_tok
    prompts = _prompts(tok)
    stop = _stop_ids(model, tok, prompts)
    eng = FastEngine(model, tok, seed=3, eos_token_ids=stop, compact_fraction=0.1)
    b = eng.generate(prompts, [4, 4, 4, 4], SamplingParams(temperature=temperature, max_new_tokens=12))
    assert b.logprobs is not None and b.logprobs.dtype == torch.float32
    diff = _train_side_diff(model, b, temperature)
    assert float(diff.max()) <= 1e-4
    assert float((b.logprobs * b.completion_mask).abs().sum()) > 0  # real log-probs recorded
    assert (b.logprobs * (1 - b.completion_mask)).abs().sum() == 0


def test_sampling_logprobs_bf16_within_measured_bound(model_tok):
    model, tok = model_tok
    prompts = _prompts(tok)
    eng = FastEngine(model, tok, seed=3, precision="bf16")
    b = eng.generate(prompts, [4, 4, 4, 4], SamplingParams(max_new_tokens=12))
    diff = _train_side_diff(model, b, bf16=True)
    m = b.completion_mask
    assert float(diff.max()) <= BF16_MAX_ABS
    assert float(diff.sum() / m.sum()) <= BF16_MEAN_ABS
    # the engine really ran in bf16: the same tokens scored in fp32 differ by more than fp32 noise
    assert float(_train_side_diff(model, b).max()) > 1e-4


def test_seeded_and_reproducible(model_tok):
    model, tok = model_tok
    prompts = _prompts(tok)
    p = SamplingParams(max_new_tokens=8, seed=11)
    a = FastEngine(model, tok, seed=0).generate(prompts, [2, 2, 2, 2], p)
    b = FastEngine(model, tok, seed=99).generate(prompts, [2, 2, 2, 2], p)
    assert torch.equal(a.completion_ids, b.completion_ids)
    eng = FastEngine(model, tok, seed=5)
    state = eng.state_dict()
    c = eng.generate(prompts, [2, 2, 2, 2], SamplingParams(max_new_tokens=8))
    eng.load_state_dict(state)
    d = eng.generate(prompts, [2, 2, 2, 2], SamplingParams(max_new_tokens=8))
    assert torch.equal(c.completion_ids, d.completion_ids)


def test_prealloc_layer_matches_dynamic_layer():
    torch.manual_seed(0)
    a, b = PreallocLayer(capacity=10), DynamicLayer()
    k, v = torch.randn(3, 2, 4, 5), torch.randn(3, 2, 4, 5)
    for layer in (a, b):
        layer.update(k, v)
    rep = torch.tensor([0, 0, 1, 2, 2, 2])
    a.batch_select_indices(rep)
    b.batch_select_indices(rep)
    for _ in range(3):
        k1, v1 = torch.randn(6, 2, 1, 5), torch.randn(6, 2, 1, 5)
        ka, va = a.update(k1, v1)
        kb, vb = b.update(k1, v1)
        assert torch.equal(ka, kb) and torch.equal(va, vb)
    keep = torch.tensor([1, 3, 4])  # compaction in place
    a.batch_select_indices(keep)
    b.batch_select_indices(keep)
    k1, v1 = torch.randn(3, 2, 1, 5), torch.randn(3, 2, 1, 5)
    ka, va = a.update(k1, v1)
    kb, vb = b.update(k1, v1)
    assert torch.equal(ka, kb) and torch.equal(va, vb)
    assert a.get_seq_length() == b.get_seq_length() == 8
    with pytest.raises(RuntimeError, match="capacity 10"):
        a.update(torch.randn(3, 2, 3, 5), torch.randn(3, 2, 3, 5))


def test_registry_builds_fast_engine_with_precision(model_tok):
    model, tok = model_tok
    eng = build_engine("fast", {"drop_finished": False}, EngineContext(model, tok, seed=0, precision="bf16"))
    assert isinstance(eng, FastEngine) and eng.precision == "bf16" and not eng.drop_finished
    with pytest.raises(ValueError, match="precision"):
        FastEngine(model, tok, precision="fp8")


def test_model_left_in_training_mode(model_tok):
    model, tok = model_tok
    model.train()
    FastEngine(model, tok).generate(_prompts(tok), [1, 1, 1, 1], SamplingParams(max_new_tokens=2))
    assert model.training
    model.eval()


def test_chunks_without_a_token_budget_keep_the_callers_order_and_whole_groups(model_tok):
    model, tok = model_tok
    eng = FastEngine(model, tok, max_batch_size=4)
    widths = [50, 10, 30, 20, 40]
    assert eng._chunks([2, 3, 1, 4, 2], widths) == [[(0, 2)], [(1, 3), (2, 1)], [(3, 4)], [(4, 2)]]
    assert eng._chunks([6], [10]) == [[(0, 4)], [(0, 2)]]  # a group larger than the cap is split
    assert FastEngine(model, tok)._chunks([2, 3], [5, 9]) == [[(0, 2), (1, 3)]]


def test_chunks_under_a_token_budget_go_shortest_first_within_the_budget(model_tok):
    """Each decode batch holds rows x (its widest prompt + new tokens) <= max_batch_tokens (a single
    row may exceed it), prompts shortest first; every requested copy is generated exactly once."""
    model, tok = model_tok
    widths = [50, 10, 30, 20, 2600, 40]
    ns = [2, 3, 1, 4, 2, 2]
    eng = FastEngine(model, tok, max_batch_size=8, max_batch_tokens=120)
    chunks = eng._chunks(ns, widths)
    assert chunks == [[(1, 3)], [(3, 4)], [(2, 1), (5, 2)], [(0, 2)], [(4, 1)], [(4, 1)]]
    for c in chunks:
        rows, width = sum(n for _, n in c), max(widths[i] for i, _ in c)
        assert rows * width <= 120 or rows == 1
        assert rows <= 8
    done = [0] * len(ns)
    for c in chunks:
        for i, n in c:
            done[i] += n
    assert done == ns


def test_token_budget_batches_come_back_in_the_callers_order(model_tok):
    """Sampled under a budget that reorders and splits the prompts, the batch is grouped by prompt in
    the caller's order, each row's prompt is its own, and its log-probs are those of its tokens."""
    model, tok = model_tok
    prompts = [tok.encode(p, add_special_tokens=False) for p in ("100-12=", "9=", "7*8=", "12+3=")]
    eng = FastEngine(model, tok, seed=3, max_batch_tokens=30)
    b = eng.generate(prompts, [2, 3, 1, 2], SamplingParams(max_new_tokens=6))
    assert b.group_ids.tolist() == [0, 0, 1, 1, 1, 2, 3, 3]
    for r, g in enumerate(b.group_ids.tolist()):
        assert b.prompt_ids[r][b.prompt_mask[r].bool()].tolist() == prompts[g]
    assert _train_side_diff(model, b).abs().max() < 1e-4
    with pytest.raises(ValueError, match="max_batch_tokens must be None or an int >= 1"):
        FastEngine(model, tok, max_batch_tokens=0)


def test_evaluate_passes_engine_params_and_a_budget_keeps_the_greedy_answers():
    """``evaluate(engine_params=)`` reaches the engine (an invalid budget is refused by FastEngine), and
    the greedy completions under a budget that batches by length are the unbudgeted ones, in order."""
    from posttrain.rewards import get_reward
    from posttrain.rollout import FunctionRewardSource
    from posttrain.tasks import get_task
    from posttrain.train.evaluate import evaluate

    model, tok = load_model_and_tokenizer("tiny", seed=0, padding_side="left")
    short, long = (get_task("arithmetic", digits=d, n_train=4, n_heldout=6).split("heldout") for d in (1, 4))
    exs = [e for pair in zip(long, short, strict=True) for e in pair]  # lengths alternate: reordered
    src = FunctionRewardSource(get_reward("exact_match"), num_workers=0)

    def texts(examples, completions):
        return {"prompts": [e.prompt for e in examples], "texts": list(completions)}

    try:
        runs = [
            evaluate(model, tok, exs, src, engine="fast", engine_params=p, max_new_tokens=5, report=texts)
            for p in (None, {"max_batch_tokens": 30})
        ]
        with pytest.raises(ValueError, match="max_batch_tokens must be None or an int >= 1"):
            evaluate(model, tok, exs, src, engine="fast", engine_params={"max_batch_tokens": 0})
    finally:
        src.close()
    assert runs[0]["report"]["prompts"] == [e.prompt for e in exs]
    assert runs[0]["report"] == runs[1]["report"] and runs[0]["reward_mean"] == runs[1]["reward_mean"]
