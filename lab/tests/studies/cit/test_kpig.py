"""Information gain on deterministic tiny models, replay allocation, and the hinge objective."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain_lab.studies.cit.data import InstructionExample, encode_instruction, parse_markup
from posttrain_lab.studies.cit.kpig import (
    HingeLoss,
    information_gain,
    kpig_allocation,
    largest_remainder,
    rgd_allocation,
    uniform_allocation,
)


class Bigram(torch.nn.Module):
    """Logits depend on the current token only: the response is predicted from the tokens just before
    it, never from the instruction -> a model that ignores the instruction."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.table = torch.nn.Parameter(torch.randn(vocab, vocab, generator=g))

    def forward(self, input_ids, attention_mask=None):
        return self.table[input_ids]


class KeyListener(torch.nn.Module):
    """Causal bag of words: logits_t = A[x_t] + B · counts(x_≤t). B rewards the answer's tokens when
    the key word's tokens occurred earlier, so the key part decides the answer."""

    def __init__(self, vocab: int, key_ids: list[int], answer_ids: list[int]) -> None:
        super().__init__()
        self.vocab = vocab
        self.a = torch.nn.Parameter(torch.zeros(vocab, vocab))
        self.b = torch.nn.Parameter(torch.zeros(vocab, vocab))
        with torch.no_grad():
            for y in answer_ids:
                for k in key_ids:
                    self.b[k, y] = 3.0

    def forward(self, input_ids, attention_mask=None):
        onehot = torch.nn.functional.one_hot(input_ids, self.vocab).float()
        if attention_mask is not None:
            onehot = onehot * attention_mask[..., None]
        counts = onehot.cumsum(1)
        return self.a[input_ids] + counts @ self.b


def _examples():
    out = []
    for key, ans in (("upper", "OSLO"), ("lower", "oslo"), ("upper", "RIGA"), ("lower", "riga")):
        text, spans = parse_markup(f"Write it [[{key}]].")
        out.append(InstructionExample(text, ans.capitalize(), ans, "format", spans, key))
    return out


def test_ig_zero_when_the_model_ignores_the_instruction(char_tok):
    model = Bigram(len(char_tok))
    ig = information_gain(model, char_tok, _examples())
    assert ig.shape == (4,)
    assert torch.allclose(ig, torch.zeros(4, dtype=torch.float64), atol=1e-6)


def test_ig_positive_when_the_key_part_decides(char_tok):
    ids = lambda s: char_tok.encode(s, add_special_tokens=False)  # noqa: E731
    exs = _examples()
    # tokens found only in the key word "upper" boost the uppercase answers' tokens and EOS
    model = KeyListener(len(char_tok), ids("up"), [*ids("OSLRIGA"), char_tok.eos_token_id])
    ig = information_gain(model, char_tok, exs)
    assert (ig[[0, 2]] > 0.1).all()  # "upper" in the instruction raises p(uppercase answer)
    # closed form: IG = (1/|y|) (Σ log p(y|I,x) − Σ log p(y|I^m,x)) computed by hand from the logits
    enc = encode_instruction(exs[0], char_tok)

    def total(prompt):
        x = torch.tensor([prompt + enc.response_ids])
        with torch.no_grad():
            lp = torch.log_softmax(model(x)[0, :-1].double(), -1)
        p = len(prompt)
        return sum(float(lp[t - 1, x[0, t]]) for t in range(p, x.shape[1]))

    want = (total(enc.prompt_ids) - total(enc.masked_prompt_ids)) / len(enc.response_ids)
    assert float(ig[0]) == pytest.approx(want, rel=1e-5)
    # batched = one by one; no gradient recorded
    one = torch.cat([information_gain(model, char_tok, [e], batch_size=1) for e in exs])
    assert torch.allclose(one, ig, atol=1e-6)
    assert not ig.requires_grad


def test_ig_on_a_real_preset(char_tok):
    """A real HF causal LM goes through sequence_logprobs; a row without key parts has IG 0."""
    from posttrain.models import build_preset_model

    model = build_preset_model("tiny", char_tok, seed=0)
    exs = [*_examples()[:2], InstructionExample("Say it.", "a", "b", "t", (), "nokey")]
    ig = information_gain(model, char_tok, exs, batch_size=2)
    assert ig.shape == (3,) and float(ig[2]) == 0.0 and torch.isfinite(ig).all()


def test_allocations_follow_ig_drops():
    learn = {"a": 0.5, "b": 0.5, "c": 0.3}
    now = {"a": 0.2, "b": 0.4, "c": 0.4}  # drops 0.3, 0.1, 0 (c rose)
    assert kpig_allocation(learn, now, 8) == {"a": 6, "b": 2, "c": 0}
    # no drop anywhere -> uniform
    assert kpig_allocation(learn, learn, 9) == {"a": 3, "b": 3, "c": 3}
    # caps: a can give only 3, the rest flows to the others in proportion
    assert kpig_allocation(learn, now, 8, caps={"a": 3, "b": 10, "c": 10}) == {"a": 3, "b": 5, "c": 0}
    # RGD-R: α_j ∝ PPL_now / PPL_at_learning = 2, 1, 1
    assert rgd_allocation({"a": 2.0, "b": 3.0, "c": 5.0}, {"a": 4.0, "b": 3.0, "c": 5.0}, 8) == {
        "a": 4,
        "b": 2,
        "c": 2,
    }
    assert uniform_allocation(["a", "b", "c"], 7) == {"a": 3, "b": 2, "c": 2}


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(0, 1), min_size=1, max_size=6),
    st.lists(st.floats(0, 1), min_size=6, max_size=6),
    st.integers(0, 50),
)
def test_kpig_allocation_properties(learn, now, budget):
    keys = [f"t{i}" for i in range(len(learn))]
    ig_l = dict(zip(keys, learn, strict=False))
    ig_n = dict(zip(keys, now, strict=False))
    alloc = kpig_allocation(ig_l, ig_n, budget)
    assert sum(alloc.values()) == budget
    drops = {k: max(ig_l[k] - ig_n[k], 0.0) for k in keys}
    if sum(drops.values()) > 0:
        for k in keys:
            if drops[k] == 0:
                assert alloc[k] == 0  # no drop, no replay
        for i in keys:
            for j in keys:
                if drops[i] > drops[j]:
                    assert alloc[i] >= alloc[j]  # larger drop, at least as much replay


def test_largest_remainder_caps_and_total():
    assert largest_remainder({"a": 1, "b": 1}, 10, caps={"a": 2, "b": 3}) == {"a": 2, "b": 3}
    assert largest_remainder({"a": 1}, 0) == {"a": 0}


def test_hinge_term_value_and_gradient(char_tok):
    """Through the SFT trainer's extra_loss hook: the added term equals λ/B Σ max(0, γ − IG_i), and with
    masked_branch_grad=False its gradient equals that of −(λ/B) Σ_{IG_i<γ} log p(y_i|I,x)/|y_i|."""
    from posttrain.models import CausalLMAdapter, build_preset_model
    from posttrain.train.sft import SFTConfig, SFTTrainer

    model = build_preset_model("tiny", char_tok, seed=0).double()
    exs = _examples()
    enc = [encode_instruction(e, char_tok) for e in exs]
    pairs = [(char_tok.decode(e.prompt_ids), ex.output) for e, ex in zip(enc, exs, strict=True)]
    lam, gamma = 0.7, 0.05
    hook = HingeLoss([e.sft_example(masked=True) for e in enc], lam=lam, gamma=gamma)
    cfg = SFTConfig(save=False, steps=1, batch_size=4, micro_batch_size=3, model={"dtype": "float64"})
    tr = SFTTrainer(cfg, adapter=CausalLMAdapter(model, char_tok), pairs=pairs, extra_loss=hook)
    idx = [0, 1, 2, 3]
    model.zero_grad()
    nll, _ = tr.accumulate_gradients(idx)
    g_hook = [p.grad.clone() for p in model.parameters()]
    ig = information_gain(model, char_tok, exs)
    assert ig.max() < gamma  # random init: hinge active for every row
    assert tr.last_extra_loss == pytest.approx(lam * float((gamma - ig).clamp_min(0).sum()) / 4, rel=1e-9)
    # reference gradient: NLL + up-weighted per-row NLL, one forward
    model.zero_grad()
    ids, am, lm = tr.collate(idx)
    logp, _ = tr.lm.logprobs(ids, am, lm)
    n_tok = lm.sum()
    rows = (logp * lm).sum(1)
    ref = -rows.sum() / n_tok - lam / 4 * (rows / lm.sum(1)).sum()
    ref.backward()
    for a, p in zip(g_hook, model.parameters(), strict=True):
        assert torch.allclose(a, p.grad, atol=1e-10)
    assert nll == pytest.approx(float(-rows.detach().sum() / n_tok), rel=1e-9)


def test_hinge_masked_branch_grad_pushes_the_masked_likelihood_down(char_tok):
    """masked_branch_grad=True: same value, and the gradient gains +(λ/B) Σ ∇ log p(y_i|I^m,x)/|y_i|."""
    from posttrain.models import CausalLMAdapter, build_preset_model
    from posttrain.train.sft import SFTConfig, SFTTrainer

    model = build_preset_model("tiny", char_tok, seed=1).double()
    exs = _examples()[:3]
    enc = [encode_instruction(e, char_tok) for e in exs]
    masked = [e.sft_example(masked=True) for e in enc]
    pairs = [(char_tok.decode(e.prompt_ids), ex.output) for e, ex in zip(enc, exs, strict=True)]
    lam, gamma = 0.5, 10.0  # gamma large: the hinge is active for every row
    hook = HingeLoss(masked, lam=lam, gamma=gamma, masked_branch_grad=True)
    cfg = SFTConfig(save=False, steps=1, batch_size=3, model={"dtype": "float64"})
    tr = SFTTrainer(cfg, adapter=CausalLMAdapter(model, char_tok), pairs=pairs, extra_loss=hook)
    idx = [0, 1, 2]
    model.zero_grad()
    tr.accumulate_gradients(idx)
    got = [p.grad.clone() for p in model.parameters()]
    ig = information_gain(model, char_tok, exs)
    assert tr.last_extra_loss == pytest.approx(lam * float((gamma - ig).sum()) / 3, rel=1e-9)
    model.zero_grad()
    ids, am, lm = tr.collate(idx)
    rows = (tr.lm.logprobs(ids, am, lm)[0] * lm).sum(1)
    mids, mam, mlm = tr.collate(idx, masked)
    mrows = (tr.lm.logprobs(mids, mam, mlm)[0] * mlm).sum(1)
    ref = -rows.sum() / lm.sum() - lam / 3 * (rows / lm.sum(1)).sum() + lam / 3 * (mrows / mlm.sum(1)).sum()
    ref.backward()
    for a, p in zip(got, model.parameters(), strict=True):
        assert torch.allclose(a, p.grad, atol=1e-10)


def _replay_run(select: str):
    """A StreamRun at stage 3 (old tasks lookup, compare) whose memory scores are faked: lookup's IG
    dropped (1.0 -> per-row values below), compare's rose (0.5 -> 0.9)."""
    from posttrain_lab.studies.cit.runner import CITConfig, StreamRun

    cfg = CITConfig(
        stream={"n_train": 10, "n_test": 2, "tasks": ["lookup", "compare", "format"]},
        methods=[{"name": "kpig", "replay": {"kind": "kpig", "ratio": 0.3, "select": select}}],
    )
    run = StreamRun(cfg, cfg.methods[0], 0)
    idx = list(range(8))
    memory = {
        "lookup": {"idx": idx, "ig": [1.0] * 8, "ppl": 2.0},
        "compare": {"idx": idx, "ig": [0.5] * 8, "ppl": 2.0},
    }
    now_lookup = [0.9, 0.1, 0.5, 0.95, 0.3, 0.8, 0.99, 0.7]  # drops 0.1 .9 .5 .05 .7 .2 .01 .3
    fake = {id(run.train["lookup"][i]): v for i, v in zip(idx, now_lookup, strict=True)}
    fake |= {id(run.train["compare"][i]): 0.9 for i in idx}

    def scores(rows):
        return [fake[id(r)] for r in rows], 2.0

    run._memory_scores = scores
    return run, memory


def test_kpig_replay_goes_to_the_task_whose_ig_dropped():
    """Wrong version guarded: the runner calling ``kpig_allocation(ig_now, ig_at_learning, ...)``
    (arguments swapped: replays the task whose IG rose). The whole budget (0.3 x 10 rows = 3) must go
    to lookup (IG 1.0 -> 0.58), none to compare (IG 0.5 -> 0.9)."""
    run, memory = _replay_run("random")
    rows, rec = run._replay(3, memory)
    assert rec["budget"] == 3 and rec["alloc"] == {"lookup": 3, "compare": 0}
    assert [r.task for r in rows] == ["lookup"] * 3
    assert rec["ig_now"]["compare"] == pytest.approx(0.9)


def test_largest_drop_replays_the_rows_whose_ig_dropped_most():
    """Wrong version guarded: ``select: largest_drop`` sorting the per-row IG drops ascending
    (replays the rows the model still listens to). The 3 rows must be memory rows 1, 4, 2 (drops 0.9,
    0.7, 0.5), in that order."""
    run, memory = _replay_run("largest_drop")
    rows, rec = run._replay(3, memory)
    assert rec["alloc"] == {"lookup": 3, "compare": 0}
    assert rows == [run.train["lookup"][i] for i in (1, 4, 2)]
