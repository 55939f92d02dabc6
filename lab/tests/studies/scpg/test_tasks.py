import random
from collections import Counter

import pytest

from posttrain_lab.studies.scpg import tasks as T
from posttrain_lab.studies.scpg.trees import Tree

SPEC = Tree.from_bracketed("(<node_3> (<node_7> <node_1>) (<node_2> <node_9>))")
CAT = Tree.from_bracketed("(S (NP (DT the) (NN cat)) (VP (VBD ate) (NP (DT a) (NN mouse))))")


class FixedRng(random.Random):
    """random.Random whose choice/choices return a forced element."""

    def __init__(self, pick):
        super().__init__(0)
        self.pick = pick

    def choices(self, population, weights=None, k=1):
        assert weights is None or all(w >= 0 for w in weights)
        return [self.pick(population, weights)]

    def choice(self, seq):
        return self.pick(seq, None)


def test_treeposition_indexing_spec_example():
    rng = FixedRng(lambda pop, w: (2, 1) if (2, 1) in pop else pop[0])
    src, tgt = T.treeposition_indexing(SPEC, rng)
    assert src == f"treeposition indexing position: 2 1 tree: {SPEC.to_bracketed()}"
    assert tgt == "<node_9>"
    # position drawn with probability proportional to its depth: root weight 0
    seen = []
    T.treeposition_indexing(
        SPEC, FixedRng(lambda pop, w: seen.append(dict(zip(pop, w, strict=True))) or pop[1])
    )
    assert seen[0] == {(): 0, (1,): 1, (1, 1): 2, (2,): 1, (2, 1): 2}
    src, _ = T.treeposition_indexing(SPEC, rng, "slash")
    assert src.endswith("tree: " + SPEC.to_slash())


def test_node_deleting_spec_example():
    rng = FixedRng(lambda pop, w: (2,))
    src, tgt = T.node_deleting(SPEC, rng)
    assert src == f"node deleting position: 2 node: <node_2> tree: {SPEC.to_bracketed()}"
    assert tgt == "(<node_3> (<node_7> <node_1>) <node_9>)"
    src, _ = T.node_deleting(CAT, FixedRng(lambda pop, w: (2, 2)))
    assert src.startswith("node deleting position: 2, 2 node: NP tree: (S")
    with pytest.raises(ValueError, match="no non-terminal"):
        T.node_deleting(Tree("A", ["b"]), random.Random(0))


def test_tree_forming_height_interpreting():
    src, tgt = T.tree_forming(SPEC, random.Random(0))
    assert (
        src
        == "tree forming: <node_3> -> <node_7> <node_2> <sep> <node_7> -> <node_1> <sep> <node_2> -> <node_9>"
    )
    assert tgt == SPEC.to_bracketed()
    src, tgt = T.height_selection(SPEC, FixedRng(lambda pop, w: (1, 1)))
    assert (src, tgt) == (f"height selection height: 2 tree: {SPEC.to_bracketed()}", "<node_1> <node_9>")
    src, tgt = T.height_selection(SPEC, FixedRng(lambda pop, w: ()))
    assert tgt == "<node_3>" and "height: 0" in src
    src, tgt = T.tree_interpreting(SPEC, random.Random(0))
    assert src == f"tree interpreting: {SPEC.to_bracketed()}"
    assert (
        tgt
        == "(<node_3><H_1><S_1><none> (<node_7><H_2><S_1><node_3> <node_1>) (<node_2><H_2><S_2><node_3> <node_9>))"
    )
    _, tgt = T.tree_interpreting(SPEC, random.Random(0), "slash")
    assert tgt.split()[0] == "<node_3><H_1><S_1><none>" and tgt.split()[-1] == "/<node_3><H_1><S_1><none>"


def test_stage1_weights_and_randomisation():
    rng = random.Random(0)
    prefixes = Counter()
    for _ in range(4000):
        src, _ = T.stage1_example(CAT, rng)
        assert "NP" not in src and "cat" not in src  # labels and leaves replaced
        prefixes[src.split(":")[0].split(" position")[0].split(" height")[0]] += 1
    w = dict(
        zip(
            [
                "treeposition indexing",
                "tree forming",
                "node deleting",
                "height selection",
                "tree interpreting",
            ],
            T.STAGE1_WEIGHTS,
            strict=True,
        )
    )
    for name, weight in w.items():
        assert abs(prefixes[name] / 4000 - weight / 7) < 0.03, (name, prefixes)


def test_stage2_syntax_tasks():
    rng = random.Random(0)
    assert T.pos_tagging(CAT, rng) == (
        "pos tagging: the cat ate a mouse",
        "the DT cat NN ate VBD a DT mouse NN",
    )
    assert T.production_detection(CAT, rng) == (
        f"production detection: {CAT.to_bracketed()}",
        "S -> NP VP <sep> NP -> DT NN <sep> VP -> VBD NP <sep> NP -> DT NN",
    )
    deep = Tree.from_bracketed(
        "(S (VP (VBD sat) (PP (IN on) (NP (NP (DT the) (NN mat)) (PP (IN of) (NN wool))))))"
    )
    pruned = "(S (VP (VBD sat) (PP (IN on) (NP (NP the mat) (PP of wool)))))"
    assert T.tree_pruning(deep, rng) == (f"tree pruning: {deep.to_bracketed()}", pruned)
    assert T.pruned_tree_parse(deep, rng) == ("pruned tree parse: sat on the mat of wool", pruned)
    assert T.pruned_tree_completion(deep, rng) == (
        f"pruned tree completion: {pruned}",
        deep.to_bracketed(),
    )
    # constituency searching prefers a label occurring twice (NP here)
    src, tgt = T.constituency_searching(CAT, rng)
    assert src == "constituency searching node: NP sentence: the cat ate a mouse"
    assert tgt == "the cat <sep> a mouse"
    with pytest.raises(ValueError, match="height > 2"):
        T.constituency_searching(Tree.from_bracketed("(NN cat)"), rng)


def test_constituency_discrimination_negatives():
    rng = random.Random(3)
    n_false = 0
    spans = {t.sentence() for _, t in CAT.subtrees() if t.height() > 2}
    for _ in range(400):
        src, tgt = T.constituency_discrimination(CAT, rng)
        assert src.startswith("constituency discrimination node: ") and src.endswith(
            " sentence: the cat ate a mouse"
        )
        span = src.split(" span: ")[1].split(" sentence: ")[0]
        if tgt == "True":
            assert span in spans
        else:
            assert tgt == "False"
            n_false += 1
    assert 150 < n_false < 250  # 50% negatives


def test_fill_mask_intra_and_inter():
    toks = T.tree_tokens(CAT)
    assert toks[:4] == ["(", "S", "(", "NP"]

    class AllMask(random.Random):
        def random(self):
            return 0.0

    src, tgt = T.mask_intra_bracket(["(", "A", "b", ")", "(", "c", ")"], 0.15, AllMask())
    assert src == "( <extra_id_0> ) ( <extra_id_1> )"
    assert tgt == "<extra_id_0> A b <extra_id_1> c <extra_id_2>"
    rng = random.Random(0)
    for prefix in T.FILL_MASK_PREFIXES:
        for _ in range(50):
            src, tgt = T.fill_mask(CAT, prefix, rng)
            assert src.startswith(prefix + " ")
            body = src[len(prefix) + 1 :].split()
            # reconstruct the tree from the masked input and the target
            fills, cur = {}, None
            for t in tgt.split():
                if t.startswith("<extra_id_"):
                    cur = t
                    fills[cur] = []
                else:
                    fills[cur].append(t)
            rebuilt = [w for t in body for w in (fills.get(t, []) if t.startswith("<extra_id_") else [t])]
            assert rebuilt == toks
            if "intra" in prefix:
                assert body.count("(") == toks.count("(") and tgt.split()[-1].startswith("<extra_id_")
    with pytest.raises(ValueError, match="fill-mask prefix"):
        T.fill_mask(CAT, "medium difficulty:", rng)


def test_fill_mask_rates():
    rng = random.Random(1)
    toks = T.tree_tokens(CAT) * 20
    non_bracket = sum(t not in "()" for t in toks)
    for p in (0.15, 0.30):
        masked = 0
        for _ in range(30):
            _, tgt = T.mask_intra_bracket(toks, p, rng)
            masked += sum(not t.startswith("<extra_id_") for t in tgt.split())
        assert abs(masked / (30 * non_bracket) - p) < 0.03
    # inter span: spans start at p/3, mean length 3 -> ~p masked before overlaps
    masked = 0
    for _ in range(30):
        _, tgt = T.mask_inter_span(toks, 0.15, rng)
        masked += sum(not t.startswith("<extra_id_") for t in tgt.split())
    assert 0.09 < masked / (30 * len(toks)) < 0.17


def test_stage2_mixture():
    rng = random.Random(0)
    c = Counter()
    for _ in range(3000):
        src, _ = T.stage2_example(CAT, rng)
        c["fill" if "difficulty" in src.split(":")[0] else "syntax"] += 1
    assert abs(c["fill"] / 3000 - 0.6) < 0.03


def _example():
    src = Tree.from_bracketed("(S (NP (DT the) (NN cat)) (VP (VBD ate) (NP (DT a) (NN mouse))))")
    tgt = Tree.from_bracketed(
        "(S (NP (DT a) (NN mouse)) (VP (VBD was) (VP (VBN eaten) (PP (IN by) (NP (DT the) (NN cat))))))"
    )
    ex = Tree.from_bracketed(
        "(S (NP (DT a) (NN dog)) (VP (VBD was) (VP (VBN seen) (PP (IN by) (NP (DT the) (NN girl))))))"
    )
    return T.SCPGExample(src.sentence(), src, tgt.sentence(), tgt, ex.sentence(), ex)


def test_scpg_formats():
    e = _example()
    src_tree = e.src_tree.to_bracketed()
    ref = "(S (NP (DT a) (NN dog)) (VP (VBD was) (VP (VBN seen) (PP (IN by) (NP the girl)))))"
    noleaf = "(S (NP (DT) (NN)) (VP (VBD) (VP (VBN) (PP IN NP))))"
    masked = (
        "(S (NP (DT <extra_id_0>) (NN <extra_id_1>)) (VP (VBD <extra_id_2>) (VP (VBN <extra_id_3>) "
        "(PP (IN <extra_id_4>) (NP <extra_id_5>)))))"
    )
    tgt = "a mouse was eaten by the cat"
    assert T.format_scpg(e, "t5_prefix") == (
        f"scpg source sentence: the cat ate a mouse source syntax tree: {src_tree} template syntax tree:{masked}",
        tgt,
    )
    assert T.format_scpg(e, "aesop") == (
        f"the cat ate a mouse <sep> {src_tree} <sep> {noleaf}",
        f"{noleaf} <sep> {tgt}",
    )
    assert T.format_scpg(e, "aesop_nooutputtree")[1] == tgt
    trip_in = (
        "no-tree-scpg source sentence: the cat ate a mouse template sentence: a dog was seen by the girl"
    )
    assert T.format_scpg(e, "triplet") == (
        trip_in,
        f"source syntax tree: {src_tree} template syntax tree: {ref} target sentence: {tgt}",
    )
    assert T.format_scpg(e, "triplet_sentencetree") == (trip_in, f"{tgt} <tgt> {ref}")
    assert T.format_scpg(e, "triplet_nooutputtree") == (trip_in, tgt)
    for fmt in T.SCPG_FORMATS:
        sent, tree = T.split_scpg_output(T.format_scpg(e, fmt)[1], fmt)
        assert sent == tgt
        assert (tree is None) == (fmt in ("t5_prefix", "aesop_nooutputtree", "triplet_nooutputtree"))
    with pytest.raises(ValueError, match="SCPG format"):
        T.format_scpg(e, "bart")
    assert T.replace_masks_with_sentinels("a <mask> b <mask>") == "a <extra_id_0> b <extra_id_1>"


def test_inter_span_never_empty():
    rng = random.Random(0)
    for _ in range(300):
        _, tgt = T.mask_inter_span(["(", "A", "b", ")"], 0.15, rng)
        assert tgt.startswith("<extra_id_0>")


def test_stage_pairs_skip_tasks_that_do_not_apply():
    from posttrain_lab.studies.scpg.run import Corpus, PretrainConfig, stage_pairs

    c = Corpus.__new__(Corpus)
    c.pretrain_trees, c.splits = [Tree.from_bracketed("(NN cat)"), CAT], {"train": []}
    for stage in (1, 2):
        pairs = stage_pairs(c, stage, 150, seed=0, cfg=PretrainConfig())
        assert len(pairs) == 150 and all(s.strip() and t.strip() for s, t in pairs)
    assert pairs == stage_pairs(c, 2, 150, seed=0, cfg=PretrainConfig())  # seeded
