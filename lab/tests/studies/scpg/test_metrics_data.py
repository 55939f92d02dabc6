import random

import pytest

from posttrain_lab.studies.scpg import data as D
from posttrain_lab.studies.scpg.metrics import bleu4, bracket_prf, flat_tree, get_parser, strip_leaves, ted
from posttrain_lab.studies.scpg.trees import Tree

B = Tree.from_bracketed


def test_bleu4_closed_form():
    assert bleu4(["a b c d"], ["a b c d"]) == pytest.approx(100.0)
    # p1..p4 = 4/5, 3/4, 2/3, 1/2, same length (BP = 1): 100 * (0.2) ** 0.25
    assert bleu4(["a b c d e"], ["a b c d f"]) == pytest.approx(100 * 0.2**0.25, abs=1e-6)
    assert bleu4([], []) == 0.0
    with pytest.raises(ValueError, match="2 hypotheses vs 1"):
        bleu4(["a", "b"], ["a"])


def test_ted_hand_examples():
    a = B("(A (B x) (C y))")
    assert ted(a, a) == 0
    assert ted(a, B("(A (B x) (D y))")) == 1  # relabel
    assert ted(a, B("(A (B x))")) == 1  # delete
    assert ted(B("(A (B x))"), B("(A (B z))")) == 0  # words do not count
    s1, s2 = B("(S (NP (DT a) (NN b)) (VP v))"), B("(S (NP (PRP it)) (VP v))")
    assert ted(s1, s2) == 2  # DT->PRP relabel, NN deleted
    assert ted(s1, s2, height=2) == 0  # both (S NP VP) at level 2
    assert strip_leaves(s1, height=2).to_bracketed() == "(S (NP) (VP))"
    assert strip_leaves(s1).to_bracketed() == "(S (NP (DT) (NN)) (VP))"


def test_bracket_f1_hand_example():
    gold = "(S (NP (DT a) (NN b)) (VP (V c)))"  # S(0,3) NP(0,2) VP(2,3)
    pred = "(S (NP (DT a)) (VP (V b) (V c)))"  # S(0,3) NP(0,1) VP(1,3)
    r = bracket_prf([pred], [gold])
    assert r["precision"] == pytest.approx(1 / 3) and r["recall"] == pytest.approx(1 / 3)
    assert r["f1"] == pytest.approx(1 / 3)
    assert bracket_prf([gold], [gold])["f1"] == 1.0
    bad = bracket_prf(["(S (", None], [gold, gold])
    assert bad["f1"] == 0.0 and bad["well_formed"] == 0.0
    assert (
        bracket_prf(["( S ( NP ( DT a ) ( NN b ) ) ( VP ( V c ) ) )"], [gold])["f1"] == 1.0
    )  # spaced output


def test_parsers():
    p = get_parser("grammar")
    assert p.parse("the cat saw a dog .").to_bracketed() == (
        "(S (NP (DT the) (NN cat)) (VP (VBD saw) (NP (DT a) (NN dog))) (. .))"
    )
    assert p.parse("cat the saw a dog .") is None and p.parse("") is None
    plug = get_parser("posttrain_lab.studies.scpg.data:GrammarParser")  # plug-in by import path
    assert plug.parse("the cat saw a dog .") is not None
    with pytest.raises(ValueError):
        get_parser("no_such_parser")
    assert flat_tree("a b").to_bracketed() == "(S (X a) (X b))"


def test_grammar_parser_is_exact_on_the_language():
    rng = random.Random(0)
    p = D.GrammarParser()
    for _ in range(300):
        t = D.sample_sentence(rng)
        assert p.parse(t.sentence()).to_bracketed() == t.to_bracketed()
    m = D.sample_meaning(random.Random(1), (True, False, True))
    for tpl in D.TEMPLATES:
        t = D.realise(m, tpl)
        assert p.parse(t.sentence()).to_bracketed() == t.to_bracketed(), tpl


def test_pairs_share_meaning_and_exemplars_share_syntax():
    rng = random.Random(2)
    for i in range(60):
        pair = D.sample_pair(rng)
        e = pair.example
        assert pair.src_template != pair.tgt_template
        content = lambda s: {w for w in s.split() if w in D.POS_WORDS["NN"] or w in D.POS_WORDS["JJ"]}  # noqa: E731
        assert content(e.src) == content(e.tgt)
        assert e.exemplar != e.tgt
        assert strip_leaves(e.exemplar_tree).to_bracketed() == strip_leaves(e.tgt_tree).to_bracketed()
        if i < 3:
            assert ted(e.exemplar_tree, e.tgt_tree) == 0  # same shape and labels
    with pytest.raises(ValueError, match="needs a location"):
        D.realise(D.sample_meaning(random.Random(0), (False, False, False)), "F")


def test_corpus_few_shot_and_splits():
    c = D.synthetic_corpus(n_train=300, n_val=5, n_test=40, n_pretrain=20, few_shot_k=3, seed=1)
    assert sum(p.tgt_template == "C" for p in c.train) == 3
    assert any(p.tgt_template == "C" for p in c.test)
    assert all(p.example.exemplar == p.example.tgt for p in c.train)  # SGCP training convention
    assert len(c.pretrain_trees) == 20
    c2 = D.synthetic_corpus(n_train=300, n_val=5, n_test=40, n_pretrain=20, few_shot_k=3, seed=1)
    assert [p.example.src for p in c2.test] == [p.example.src for p in c.test]


def test_sgcp_round_trip_and_errors(tmp_path):
    c = D.synthetic_corpus(n_train=6, n_val=1, n_test=4, n_pretrain=1, seed=0)
    exs = [p.example for p in c.test]
    D.write_sgcp_split(exs, tmp_path, "test")
    D.write_sgcp_split([p.example for p in c.train], tmp_path, "train", with_ref=False)
    back = D.load_sgcp_split(tmp_path, "test")
    assert [(e.src, e.tgt, e.exemplar) for e in back] == [(e.src, e.tgt, e.exemplar) for e in exs]
    assert [e.exemplar_tree.to_bracketed() for e in back] == [e.exemplar_tree.to_bracketed() for e in exs]
    train = D.load_sgcp_split(tmp_path, "train")
    assert all(e.exemplar == e.tgt for e in train)
    f = tmp_path / "test" / "tgt.txt-corenlp-opti"
    lines = f.read_text().splitlines()
    lines[2] = "(S (NP the cat"
    f.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=r"tgt.txt-corenlp-opti:3: bad parse .*position 3 is never closed"):
        D.load_sgcp_split(tmp_path, "test")
    f.write_text("\n".join(lines[:2]) + "\n")
    with pytest.raises(ValueError, match=r"tgt.txt-corenlp-opti: 2 lines, but .*src.txt has 4"):
        D.load_sgcp_split(tmp_path, "test")
    with pytest.raises(FileNotFoundError, match="no such split"):
        D.load_sgcp_split(tmp_path, "val")


SGCP_ROWS = {  # two val rows in SGCP's release layout: ref.txt = reference, tgt.txt = exemplar (template)
    "src": ["the cat saw a dog .", "a girl helped the boy ."],
    "ref": ["a dog was seen by the cat .", "the boy was helped by a girl ."],
    "tgt": ["a bird was chosen by the king .", "the nurse was called by a farmer ."],
}


def _sgcp_json(sent: str, passive: bool) -> str:
    """An SGCP-style JSON parse (node names with -k suffixes, ROOT on top) of a 6-word sentence."""
    import json

    w = sent.split()
    if not passive:  # (S (NP DT NN) (VP VBD (NP DT NN)) .)
        t = {
            "ROOT": ["S-1"],
            "S-1": ["NP-2", "VP-5", ".-10"],
            "NP-2": ["DT-3", "NN-4"],
            "DT-3": [w[0]],
            "NN-4": [w[1]],
            "VP-5": ["VBD-6", "NP-7"],
            "VBD-6": [w[2]],
            "NP-7": ["DT-8", "NN-9"],
            "DT-8": [w[3]],
            "NN-9": [w[4]],
            ".-10": [w[5]],
        }
    else:  # (S (NP DT NN) (VP VBD (VP VBN (PP IN (NP DT NN)))) .)
        t = {
            "ROOT": ["S-1"],
            "S-1": ["NP-2", "VP-5", ".-15"],
            "NP-2": ["DT-3", "NN-4"],
            "DT-3": [w[0]],
            "NN-4": [w[1]],
            "VP-5": ["VBD-6", "VP-7"],
            "VBD-6": [w[2]],
            "VP-7": ["VBN-8", "PP-9"],
            "VBN-8": [w[3]],
            "PP-9": ["IN-10", "NP-11"],
            "IN-10": [w[4]],
            "NP-11": ["DT-12", "NN-13"],
            "DT-12": [w[5]],
            "NN-13": [w[6]],
            ".-15": [w[7]],
        }
    return json.dumps(t)


def test_sgcp_release_layout_ref_is_the_reference_tgt_the_exemplar(tmp_path):
    """SGCP ships val/test as ref.txt = reference paraphrase, tgt.txt = exemplar, with
    JSON parses (src/dataloader.py IterableValParaphraseDataset; eval.py -r ref.txt -t tgt.txt). Rows
    written by hand in that layout load with the reference as the target (convention "sgcp", the
    default) and inverted with convention "dsmt" (the DSMT code's data). Mutant caught: tgt/ref swapped
    in both loader and writer (a round trip alone cannot see it; these files are not our writer's)."""
    d = tmp_path / "val"
    d.mkdir()
    for k, sents in SGCP_ROWS.items():
        (d / f"{k}.txt").write_text("".join(s + "\n" for s in sents))
        parses = [_sgcp_json(s, passive=len(s.split()) == 8) for s in sents]
        (d / f"{k}.txt-corenlp-opti").write_text("".join(p + "\n" for p in parses))
    exs = D.load_sgcp_split(tmp_path, "val")
    assert [e.tgt for e in exs] == SGCP_ROWS["ref"]
    assert [e.exemplar for e in exs] == SGCP_ROWS["tgt"]
    assert exs[0].tgt_tree.to_bracketed() == (
        "(ROOT (S (NP (DT a) (NN dog)) (VP (VBD was) (VP (VBN seen) (PP (IN by) (NP (DT the) (NN cat))))) (. .)))"
    )
    assert exs[0].src_tree.leaves() == SGCP_ROWS["src"][0].split()
    assert exs[1].exemplar_tree.leaves() == SGCP_ROWS["tgt"][1].split()
    inv = D.load_sgcp_split(tmp_path, "val", convention="dsmt")
    assert [e.tgt for e in inv] == SGCP_ROWS["tgt"] and [e.exemplar for e in inv] == SGCP_ROWS["ref"]
    # the writer puts references in ref.txt under the SGCP convention (and in tgt.txt under dsmt)
    out = tmp_path / "out"
    D.write_sgcp_split(exs, out, "val", parse_format="json")
    assert (out / "val" / "ref.txt").read_text().splitlines() == SGCP_ROWS["ref"]
    assert (out / "val" / "tgt.txt").read_text().splitlines() == SGCP_ROWS["tgt"]
    back = D.load_sgcp_split(out, "val")
    assert [(e.tgt, e.exemplar, e.tgt_tree) for e in back] == [(e.tgt, e.exemplar, e.tgt_tree) for e in exs]
    D.write_sgcp_split(exs, out, "dsmt", convention="dsmt")
    assert (out / "dsmt" / "tgt.txt").read_text().splitlines() == SGCP_ROWS["ref"]
    (d / "ref.txt-corenlp-opti").write_text('{"S-1": ["x"]}\n{"ROOT": []}\n')
    with pytest.raises(ValueError, match=r"ref.txt-corenlp-opti:1: bad parse .*'ROOT'"):
        D.load_sgcp_split(tmp_path, "val")
    with pytest.raises(ValueError, match="unknown SGCP-layout convention"):
        D.load_sgcp_split(tmp_path, "val", convention="other")


def test_sgcp_ted_drops_every_S_node_and_traces():
    """SGCP's eval_utils.build_tree drops every S node (not only the root) and deleaf
    drops all-trace subtrees; posttrain's default TED keeps them."""
    cleft = Tree.from_bracketed(
        "(ROOT (S (NP (PRP it)) (VP (VBD was) (NP (NP (DT the) (NN cat)) (SBAR (WHNP (WDT that))"
        " (S (VP (VBD saw) (NP (DT a) (NN dog))))))) (. .)))"
    )
    no_s = Tree.from_bracketed(
        "(ROOT (NP (PRP it)) (VP (VBD was) (NP (NP (DT the) (NN cat)) (SBAR (WHNP (WDT that))"
        " (VP (VBD saw) (NP (DT a) (NN dog)))))) (. .))"
    )
    assert ted(cleft, no_s, mode="sgcp") == 0
    assert ted(cleft, no_s) == 2  # posttrain mode: the two S nodes
    relabel = Tree.from_bracketed(
        "(ROOT (S (NP (PRP it)) (VP (VBD was) (NP (NP (DT the) (NN cat)) (SBAR (WHNP (WDT that))"
        " (S (ADJP (VBD saw) (NP (DT a) (NN dog))))))) (. .)))"
    )
    assert ted(cleft, relabel, mode="sgcp") == 1
    trace = Tree.from_bracketed("(S (NP (-NONE- *T*)) (VP (VBD ran)) (. .))")
    assert ted(trace, Tree.from_bracketed("(S (VP (VBD left)) (. .))"), mode="sgcp") == 0
    assert ted(trace, Tree.from_bracketed("(S (VP (VBD left)) (. .))")) == 2
    with pytest.raises(ValueError, match="no pruning"):
        ted(cleft, no_s, mode="sgcp", height=3)
    with pytest.raises(ValueError, match="unknown metric mode"):
        ted(cleft, no_s, mode="nltk")


def test_sgcp_bleu_is_lowercased_multi_bleu():
    """SGCP scores BLEU with multi-bleu.perl -lc: lowercased, no smoothing (0 when a
    precision is 0), corpus-level counts, 2 decimals; posttrain's default is case-sensitive sacrebleu."""
    import math

    assert bleu4(["The cat sat on the mat ."], ["the cat sat on the mat ."], mode="sgcp") == 100.0
    assert bleu4(["The cat sat on the mat ."], ["the cat sat on the mat ."]) < 90
    assert bleu4(["a b c d"], ["a b c e"], mode="sgcp") == 0.0
    assert bleu4(["a b c d"], ["a b c e"]) > 50
    # corpus counts: every precision 7/7, 5/5, 3/3, 1/1; hypothesis 7 words, reference 8 -> BP
    hyps, refs = ["the cat sat", "A dog ran fast"], ["the cat sat down", "a dog ran fast"]
    assert bleu4(hyps, refs, mode="sgcp") == round(100 * math.exp(1 - 8 / 7), 2) == 86.69
