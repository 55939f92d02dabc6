"""SCPG metrics: BLEU-4 (sacrebleu), tree edit distance (zss, Zhang & Shasha 1989), labelled bracket
F1, and a pluggable constituency-parser interface.

- **BLEU-4**: ``sacrebleu.corpus_bleu`` (Post 2018), 4-gram, brevity penalty, one reference;
  ``tokenize="none"`` by default because SCPG data is already tokenised (SGCP scores tokenised text).
- **TED** between two parses: Zhang–Shasha edit distance (unit costs: insert, delete, relabel) between
  the trees with their leaves (words) removed, optionally pruned at a level first (``height``; root =
  level 1). **TED-R** = TED(parse(generated), reference/target parse), **TED-E** = TED(parse(generated),
  exemplar parse): the SGCP reporting convention (Kumar et al., TACL 2020). This default mode
  (``posttrain``) keeps every node, ``S`` included; SGCP's own script is the ``sgcp`` mode below.
- **``sgcp`` mode** (``mode="sgcp"``), SGCP's evaluation script (``malllabiisc/SGCP``
  ``src/evaluation/eval.py`` + ``eval_utils.py``): BLEU is ``multi-bleu.perl -lc`` (lowercased,
  whitespace tokens, no smoothing: 0 when any n-gram precision is 0, printed to 2 decimals), here
  sacrebleu with ``lowercase=True, smooth_method="none", tokenize="none"`` rounded to 2 decimals; TED
  drops the words (``deleaf``, and subtrees whose words are all ``-NONE-`` traces), then rebuilds the
  tree under a fresh ``S`` root keeping every node whose label is not ``S`` — every ``S`` node is
  dropped and its children spliced into its parent (``build_tree``) — and takes the zss distance with
  unit costs on the full height (no pruning).
- **Bracket F1** (relaxed EVALB): labelled spans ``(label, start, end)`` of the nodes above the
  pre-terminals, spans counted in the tree's own leaves, micro-averaged; a tree text that does not
  parse scores 0 recall and precision.
- **Parsers** (``PARSERS``): ``grammar`` is the synthetic grammar's exact parser
  (:class:`posttrain_lab.studies.scpg.data.GrammarParser`); any object with ``parse(sentence) -> Tree | None`` is
  a plug-in (``package.module:Class``, constructed without arguments), e.g. a wrapper of an installed
  constituency parser. A sentence the parser rejects gets the flat tree ``(S (X w1) ... (X wn))``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from posttrain.utils.errors import InvalidValueError
from posttrain.utils.registry import Registry
from posttrain_lab.studies.scpg.trees import Tree


@runtime_checkable
class ConstituencyParser(Protocol):
    name: str

    def parse(self, sentence: str) -> Tree | None: ...


PARSERS: Registry[Any] = Registry("constituency parser")


@PARSERS.register("grammar")
def _grammar_parser() -> ConstituencyParser:
    from posttrain_lab.studies.scpg.data import GrammarParser

    return GrammarParser()


def get_parser(name: str) -> ConstituencyParser:
    """A registered parser by name, or ``package.module:Class`` (called with no arguments)."""
    factory = PARSERS.get(name)
    parser = factory()
    if not callable(getattr(parser, "parse", None)):
        raise InvalidValueError(f"parser {name!r}: {type(parser).__name__} has no parse(sentence) method")
    return parser


def flat_tree(sentence: str) -> Tree:
    return Tree("S", [Tree("X", [w]) for w in sentence.split()] or ["<empty>"])


def _extra(module: str) -> Any:
    """Import one of the ``scpg`` extra's libraries, or say how to install it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(f"posttrain scpg needs {module}: pip install -e '.[scpg]'") from e


METRIC_MODES = ("posttrain", "sgcp")
"""``posttrain``: case-sensitive sacrebleu BLEU, TED with every node kept; ``sgcp``: SGCP's script."""


def _check_mode(mode: str) -> None:
    if mode not in METRIC_MODES:
        raise InvalidValueError(f"unknown metric mode {mode!r}; known: {', '.join(METRIC_MODES)}")


def bleu4(
    hypotheses: Sequence[str], references: Sequence[str], *, tokenize: str = "none", mode: str = "posttrain"
) -> float:
    """Corpus BLEU-4 (×100). ``posttrain``: sacrebleu as is (case-sensitive, exp smoothing);
    ``sgcp``: ``multi-bleu.perl -lc`` (lowercased, no smoothing, 2 decimals)."""
    sacrebleu = _extra("sacrebleu")

    _check_mode(mode)
    if len(hypotheses) != len(references):
        raise InvalidValueError(f"bleu4: {len(hypotheses)} hypotheses vs {len(references)} references")
    if not hypotheses:
        return 0.0
    if mode == "sgcp":
        res = sacrebleu.corpus_bleu(
            list(hypotheses), [list(references)], tokenize="none", lowercase=True, smooth_method="none"
        )
        return round(float(res.score), 2)
    return float(sacrebleu.corpus_bleu(list(hypotheses), [list(references)], tokenize=tokenize).score)


def strip_leaves(tree: Tree, height: int | None = None) -> Tree:
    """The tree without its words (pre-terminals become leaves), pruned at level ``height`` if given."""
    t = tree.prune(height, "none") if height else tree

    def walk(n: Tree) -> Tree:  # words go; after prune(..., "none") bare labels become childless nodes
        kids = [walk(c) if isinstance(c, Tree) else Tree(c, []) if height else None for c in n.children]
        return Tree(n.label, [k for k in kids if k is not None])

    return walk(t)


def _words(t: Tree) -> int:
    return sum(_words(c) if isinstance(c, Tree) else 1 for c in t.children)


def _traces(t: Tree) -> int:
    return (t.label == "-NONE-") + sum(_traces(c) for c in t.children if isinstance(c, Tree))


def sgcp_tree(tree: Tree) -> Any:
    """SGCP's TED tree (``eval_utils.deleaf`` + ``build_tree``) as a zss node: words removed, children
    whose words are all ``-NONE-`` traces removed, every ``S`` node dropped (its children go to its
    parent) under a fresh root ``S``."""
    zss = _extra("zss")
    root = zss.Node("S")

    def add(parent: Any, t: Tree) -> None:
        node = parent
        if t.label and t.label != "S":
            node = zss.Node(t.label)
            parent.addkid(node)
        for c in t.children:
            if isinstance(c, Tree) and not (_words(c) and _traces(c) == _words(c)):
                add(node, c)

    add(root, tree)
    return root


def ted(a: Tree, b: Tree, *, height: int | None = None, mode: str = "posttrain") -> int:
    """Zhang–Shasha tree edit distance (unit costs) between the leafless trees; ``mode="sgcp"``: SGCP's
    trees (:func:`sgcp_tree`, no pruning)."""
    zss = _extra("zss")

    _check_mode(mode)
    if mode == "sgcp":
        if height:
            raise InvalidValueError(
                "ted: SGCP's TED has no pruning; leave ted_height unset with metrics=sgcp"
            )
        return int(zss.simple_distance(sgcp_tree(b), sgcp_tree(a)))

    def to_zss(t: Tree) -> Any:
        node = zss.Node(t.label)
        for c in t.children:
            node.addkid(to_zss(c))
        return node

    return int(zss.simple_distance(to_zss(strip_leaves(a, height)), to_zss(strip_leaves(b, height))))


def labelled_spans(tree: Tree) -> Counter:
    spans: Counter = Counter()

    def walk(t: Tree, start: int) -> int:
        end = start
        for c in t.children:
            end = walk(c, end) if isinstance(c, Tree) else end + 1
        if end == start:  # childless node: one position of its own (leafless trees)
            end = start + 1
        if any(isinstance(c, Tree) for c in t.children):  # not a pre-terminal
            spans[(t.label, start, end)] += 1
        return end

    walk(tree, 0)
    return spans


def bracket_prf(pred: Sequence[str | None], gold: Sequence[str]) -> dict[str, float]:
    """Micro-averaged labelled bracket precision / recall / F1 over tree texts (``None`` or malformed
    predictions match nothing) and the fraction of predictions that parse."""
    tp = n_pred = n_gold = ok = 0
    for p, g in zip(pred, gold, strict=True):
        gs = labelled_spans(Tree.from_bracketed(g))
        n_gold += sum(gs.values())
        try:
            ps = labelled_spans(Tree.from_bracketed(p)) if p else Counter()
            ok += p is not None
        except ValueError:
            ps = Counter()
        n_pred += sum(ps.values())
        tp += sum((ps & gs).values())
    prec = tp / n_pred if n_pred else 0.0
    rec = tp / n_gold if n_gold else 0.0
    f1 = 2 * prec * rec / (prec + rec) if prec + rec else 0.0
    return {"precision": prec, "recall": rec, "f1": f1, "well_formed": ok / len(gold) if gold else 0.0}
