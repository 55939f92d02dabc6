import pytest
import torch

from posttrain.models import ADAPTERS, Seq2SeqAdapter, load_adapter
from posttrain.models.seq2seq import build_t5_preset, build_word_tokenizer
from posttrain.rollout import SamplingParams, generate_completions
from posttrain_lab.studies.scpg.trees import Tree
from posttrain_lab.studies.scpg.vocab import (
    add_node_tokens,
    add_nonterminal_tokens,
    node_tokens,
    nonterminal_inventory,
)


@pytest.fixture(scope="module")
def tiny():
    tok = build_word_tokenizer(["the", "cat", "tree:", *(str(i) for i in range(100))])
    model = build_t5_preset("t5-tiny", tok, seed=0)
    return model, tok


def test_word_tokenizer():
    tok = build_word_tokenizer(["the", "cat"])
    assert tok.pad_token_id == 0 and tok.eos_token_id == 1 and tok.unk_token_id == 2
    ids = tok.encode("(S (NP the cat)) dog <extra_id_3>", add_special_tokens=False)
    assert tok.convert_ids_to_tokens(ids) == [
        "(",
        "<unk>",
        "(",
        "<unk>",
        "the",
        "cat",
        ")",
        ")",
        "<unk>",
        "<extra_id_3>",
    ]
    assert tok.decode(tok.encode("the cat", add_special_tokens=False)) == "the cat"


def test_step_a_and_b(tiny):
    model, tok = tiny
    new = add_node_tokens(model, tok)
    assert set(node_tokens()) <= set(new) and "<tgt>" in new
    assert len(node_tokens()) == 100 + 100 + 40 + 40 + 2
    emb = model.get_input_embeddings().weight
    tid = tok.convert_tokens_to_ids
    assert torch.equal(emb[tid("<node_7>")], emb[tid("7")])
    assert torch.equal(emb[tid("</node_42>")], emb[tid("42")])
    assert torch.equal(emb[tid("<H_40>")], emb[tid("40")]) and torch.equal(emb[tid("<S_1>")], emb[tid("1")])
    assert torch.equal(emb[tid("<none>")], emb[tok.unk_token_id]) and torch.equal(
        emb[tid("<sep>")], emb[tok.unk_token_id]
    )
    assert add_node_tokens(model, tok) == []  # idempotent
    ids = tok.encode("(<node_3> (<node_7> <node_1>)) <node_3><H_1><S_2><none>", add_special_tokens=False)
    assert tok.convert_ids_to_tokens(ids)[1] == "<node_3>" and len(ids) == 11

    labels = nonterminal_inventory([Tree.from_bracketed("(S (NP (DT a) (NN b)) (VP (VBD c)))")])
    assert labels == ["DT", "NN", "NP", "S", "VBD", "VP"]
    add_nonterminal_tokens(model, tok, labels[:3], init="node", seed=0)
    node = model.get_input_embeddings().weight[[tid(f"<node_{i}>") for i in range(100)]].detach()
    w = model.get_input_embeddings().weight.detach()
    z = (w[tid("NP")] - node.mean(0)) / node.std(0)
    g = torch.Generator().manual_seed(0)
    draws = torch.stack([torch.randn(node.shape[1], generator=g) for _ in range(3)])
    assert torch.allclose(z, draws[2], atol=1e-4)  # the third label of the seeded N(mean, std) draws
    add_nonterminal_tokens(model, tok, labels[3:], init="unk")
    w = model.get_input_embeddings().weight.detach()
    assert torch.equal(w[tid("VP")], w[tok.unk_token_id])
    # NT tokens match whole words only
    assert tok.convert_ids_to_tokens(tok.encode("S NP /NP", add_special_tokens=False)) == [
        "S",
        "NP",
        "/",
        "NP",
    ]
    with pytest.raises(ValueError, match="init"):
        add_nonterminal_tokens(model, tok, ["X"], init="zero")


def test_adapter_logprobs_match_t5_loss(tiny):
    model, tok = tiny
    model.eval()
    ad = Seq2SeqAdapter(model, tok)
    assert "seq2seq" in ADAPTERS.names()
    # row 0: prompt [5,6,7] target [8,9,eos]; row 1: prompt [5,6] target [8,eos]
    ids = torch.tensor([[5, 6, 7, 8, 9, 1], [5, 6, 8, 1, 0, 0]])
    am = torch.tensor([[1] * 6, [1, 1, 1, 1, 0, 0]])
    lm = torch.tensor([[0, 0, 0, 1, 1, 1], [0, 0, 1, 1, 0, 0]])
    logp, ent = ad.logprobs(ids, am, lm)
    assert (logp[lm == 0] == 0).all() and (ent[lm == 0] == 0).all() and (ent[lm == 1] > 0).all()
    for r, (enc, dec) in enumerate([([5, 6, 7, 1], [8, 9, 1]), ([5, 6, 1], [8, 1])]):
        out = model(input_ids=torch.tensor([enc]), labels=torch.tensor([dec]))
        assert float(-logp[r][lm[r] == 1].mean().detach()) == pytest.approx(float(out.loss), rel=1e-5)
    with pytest.raises(ValueError, match="several loss spans"):
        ad.logprobs(ids[:1], am[:1], torch.tensor([[0, 1, 0, 1, 1, 1]]))
    with pytest.raises(ValueError, match="beam_search"):
        generate_completions(ad, [[5, 6]], SamplingParams(max_new_tokens=2))


def test_preset_load_save_reload(tmp_path):
    ad = load_adapter("t5-tiny", kind="seq2seq", device="cpu")
    assert ad.kind == "seq2seq" and ad.tokenizer.convert_tokens_to_ids("<extra_id_0>") is not None
    out = ad.beam_search(["hello"], num_beams=2, min_length=0, max_length=5)
    assert isinstance(out[0], str)
    ad.save(tmp_path / "m")
    again = load_adapter(str(tmp_path / "m"), kind="seq2seq", device="cpu")
    assert torch.equal(again.model.shared.weight, ad.model.shared.weight)
    from posttrain.models.loading import ModelSpecError

    with pytest.raises(ModelSpecError, match="not a T5 preset"):
        load_adapter(str(tmp_path / "nothing"), kind="seq2seq", device="cpu")
