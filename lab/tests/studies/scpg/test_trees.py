import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain_lab.studies.scpg.trees import NodeDetails, Tree, format_production

SPEC = "(<node_3> (<node_7> <node_1>) (<node_2> <node_9>))"
CAT = "(S (NP (DT the) (NN cat)) (VP (VBD ate) (NP (DT a) (NN mouse))))"


def test_round_trip_and_whitespace():
    t = Tree.from_bracketed(CAT)
    assert t.to_bracketed() == CAT
    assert Tree.from_bracketed("( S\n (NP  x )(VP y))").to_bracketed() == "(S (NP x) (VP y))"
    odd = "(ROOT (X-1 a.b) (Y' ,) (Z <mask>))"
    assert Tree.from_bracketed(odd).to_bracketed() == odd
    assert Tree.from_bracketed("(S NP VP)").children == ["NP", "VP"]
    assert Tree.from_bracketed("(NP)").children == []


def test_slash():
    assert Tree.from_bracketed("(A (B c) (D e))").to_slash() == "A B c /B D e /D /A"
    assert Tree.from_bracketed("(A (B c) (D e))").linearize("slash") == "A B c /B D e /D /A"
    with pytest.raises(ValueError, match="unknown format"):
        Tree.from_bracketed("(A b)").linearize("xml")


def test_label_at_spec_example():
    t = Tree.from_bracketed(SPEC)
    assert t.label_at((2, 1)) == "<node_9>"
    assert t.label_at(()) == "<node_3>"
    assert t.label_at((1,)) == "<node_7>"
    assert t.label_at((1, 1)) == "<node_1>"
    for bad in [(3,), (0,), (1, 1, 1), (2, 2)]:
        with pytest.raises(ValueError, match="1-based"):
            t.label_at(bad)


def test_delete_node_spec_example():
    t = Tree.from_bracketed(SPEC)
    assert t.delete_node((2,)).to_bracketed() == "(<node_3> (<node_7> <node_1>) <node_9>)"
    assert t.to_bracketed() == SPEC  # unchanged
    c = Tree.from_bracketed(CAT)
    assert (
        c.delete_node((2, 2)).to_bracketed() == "(S (NP (DT the) (NN cat)) (VP (VBD ate) (DT a) (NN mouse)))"
    )
    assert c.delete_node((1,)).to_bracketed() == (
        "(S (DT the) (NN cat) (VP (VBD ate) (NP (DT a) (NN mouse))))"
    )
    with pytest.raises(ValueError, match="root"):
        c.delete_node(())
    with pytest.raises(ValueError, match="leaf"):
        c.delete_node((1, 1, 1))


def test_positions_walk_preorder():
    t = Tree.from_bracketed(SPEC)
    assert t.positions() == [(), (1,), (1, 1), (2,), (2, 1)]
    assert [p for p, _ in t.subtrees()] == [(), (1,), (2,)]


def test_height_depth_leaves_pos():
    c = Tree.from_bracketed(CAT)
    assert c.height() == 5  # nltk: S > VP > NP > NN > leaf
    assert Tree.from_bracketed("(DT the)").height() == 2
    assert c.depth() == 4
    assert c.leaves() == ["the", "cat", "ate", "a", "mouse"]
    assert c.sentence() == "the cat ate a mouse"
    assert c.pos() == [("the", "DT"), ("cat", "NN"), ("ate", "VBD"), ("a", "DT"), ("mouse", "NN")]
    assert c.nonterminals() == ["S", "NP", "DT", "NN", "VP", "VBD"]


def test_productions():
    t = Tree.from_bracketed("(A (B c) (D e))")
    assert t.productions() == [("A", ("B", "D")), ("B", ("c",)), ("D", ("e",))]
    assert format_production("A", ("B", "D")) == "A -> B D"


def test_details_and_interpreting():
    # the authors' docstring example (tree_task_data_utils.tree_to_details)
    c = Tree.from_bracketed(CAT)
    assert c.to_details() == (
        "(S<H_1><S_1><none> (NP<H_2><S_1>S (DT<H_3><S_1>NP the) (NN<H_3><S_2>NP cat)) "
        "(VP<H_2><S_2>S (VBD<H_3><S_1>VP ate) (NP<H_3><S_2>VP (DT<H_4><S_1>NP a) (NN<H_4><S_2>NP mouse))))"
    )
    d = c.details()
    assert d[()] == NodeDetails(1, 1, None)
    assert d[(2, 2)] == NodeDetails(3, 2, "VP")


def test_prune_modes():
    # the authors' docstring example (MyTree.prune_downwards) at height 2
    t = Tree.from_bracketed("(S (NP I) (VP (VBD am) (NN king)))")
    assert t.prune(2, "none").to_bracketed() == "(S NP VP)"
    assert t.prune(2, "original").to_bracketed() == "(S (NP I) (VP am king))"
    assert t.prune(2, "original").children[1].children == ["am king"]  # one leaf string
    assert t.prune(2, "mask").to_bracketed() == "(S (NP <mask>) (VP <mask>))"
    # deeper than the tree: unchanged / leaves masked / leaves dropped
    assert t.prune(5).to_bracketed() == t.to_bracketed()
    assert t.prune(5, "mask").to_bracketed() == t.mask_leaves().to_bracketed()
    assert t.prune(5, "none").to_bracketed() == "(S (NP) (VP (VBD) (NN)))"
    with pytest.raises(ValueError, match=">= 2"):
        t.prune(1)


def test_randomize_labels():
    c = Tree.from_bracketed(CAT)
    r = c.randomize_labels(random.Random(0))
    labels = [r.label_at(p) for p in r.positions()]
    assert len(labels) == len(c.positions()) == len(set(labels))  # fresh distinct <node_k> per position
    assert all(x.startswith("<node_") for x in labels)
    assert [len(p) for p in r.positions()] == [len(p) for p in c.positions()]  # same shape
    small = c.randomize_labels(random.Random(0), n_labels=3)
    assert len({small.label_at(p) for p in small.positions()}) == 3  # modulo the label count
    assert c.randomize_labels(random.Random(1)).to_bracketed() != r.to_bracketed()


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("", "position 0"),
        ("   ", "position 0"),
        ("(S (NP a)", "position 0"),
        ("(S (NP a) (VP b)", "position 0"),
        ("(S a))", "trailing text at position 5"),
        ("(S a) b", "trailing text at position 6"),
        ("S a", "position 0"),
        ("(", "position 0"),
        ("(S (", "position 3"),
        ("( ) a", "label at position 2"),
        ("(S (NP a) (( b)))", "label at position 11"),
    ],
)
def test_malformed(text, where):
    with pytest.raises(ValueError, match="position") as e:
        Tree.from_bracketed(text)
    assert where in str(e.value)


_label = st.sampled_from(["S", "NP", "VP", "DT", "X-1", "<node_4>", "A'"])
_leaf = st.sampled_from(["a", "cat", ",", "<mask>", "don't", "3.5"])
_trees = st.recursive(
    st.builds(lambda lab, leaf: Tree(lab, [leaf]), _label, _leaf),
    lambda kids: st.builds(Tree, _label, st.lists(st.one_of(kids, _leaf), min_size=1, max_size=3)),
    max_leaves=12,
)


@settings(max_examples=60, deadline=None)
@given(_trees)
def test_properties(t):
    s = t.to_bracketed()
    assert Tree.from_bracketed(s).to_bracketed() == s
    assert len(t.to_slash().split()) == len(t.leaves()) + 2 * len(t.subtrees())
    for pos, _ in t.subtrees()[1:]:
        d = t.delete_node(pos)
        assert d.leaves() == t.leaves()
        assert len(d.subtrees()) == len(t.subtrees()) - 1
    p = t.prune(3, "original")
    assert " ".join(p.leaves()) == " ".join(t.leaves())
    assert p.depth() <= 3
