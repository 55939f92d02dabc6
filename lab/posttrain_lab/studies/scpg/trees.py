"""Constituency trees for DSMT / SCPG (Liu et al., Findings ACL 2024, 2024.findings-acl.845; authors'
code ``ChristLBUPT/DSMT-T5``: ``data/TreeUtils/tree.py``, ``data/TreeUtils/linearizing_tree.py``,
``curriculum_pre_training/tree_task_data_utils.py``).

A :class:`Tree` is a label and a list of children, each a :class:`Tree` or a leaf string. Operations
return new trees (the input is never changed).

Positions are tuples of **1-based** child indices: ``()`` is the root, ``(2, 1)`` the first child of
the root's second child; a position may end on a leaf. Two depth conventions appear, as in the
authors' code:

- ``depth(position) = len(position)``: root 0 (``height selection``, position sampling);
- *level* = ``len(position) + 1``: root 1 (``<H_k>`` in ``tree interpreting``; :meth:`Tree.prune`).

``height()`` is nltk's: a node whose children are all leaves has height 2 (a leaf counts 1).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal, Union

from posttrain.utils.errors import InvalidValueError

Child = Union["Tree", str]
Position = tuple[int, ...]

MASK = "<mask>"
NONE = "<none>"


@dataclass(frozen=True)
class NodeDetails:
    """Where a node sits: ``level`` (root 1), ``sibling`` (1-based index among the parent's
    children; 1 for the root), ``parent`` label (None for the root)."""

    level: int
    sibling: int
    parent: str | None


@dataclass
class Tree:
    label: str
    children: list[Child] = field(default_factory=list)

    # ------------------------------------------------------------------------------- parse / print
    @classmethod
    def from_bracketed(cls, text: str) -> Tree:
        """Parse ``(S (NP the cat) (VP sleeps))``. Labels and leaves are kept exactly; whitespace
        between tokens is free (``( S ...`` is accepted). Raises ``ValueError`` naming the character
        position for empty input, a missing label, an unclosed or unopened bracket, or trailing text."""
        if not isinstance(text, str):
            raise InvalidValueError(f"bracketed tree: expected a string, got {type(text).__name__}")
        toks = list(_tokenize(text))
        if not toks:
            raise InvalidValueError("bracketed tree: empty input at position 0 (expected '(')")
        tree, i = _parse(toks, 0, text)
        if i < len(toks):
            raise InvalidValueError(
                f"bracketed tree: trailing text at position {toks[i][1]}: {text[toks[i][1] :][:20]!r}"
            )
        return tree

    def to_bracketed(self) -> str:
        """``(label child ...)`` with single spaces; leaves as they are."""
        parts = [self.label]
        parts += [c.to_bracketed() if isinstance(c, Tree) else c for c in self.children]
        return "(" + " ".join(parts) + ")"

    def __str__(self) -> str:
        return self.to_bracketed()

    def to_slash(self) -> str:
        """Slash linearisation (``bracket_to_slash``): ``(A (B c) (D e))`` -> ``A B c /B D e /D /A``."""
        out: list[str] = []

        def walk(t: Tree) -> None:
            out.append(t.label)
            for c in t.children:
                walk(c) if isinstance(c, Tree) else out.append(c)
            out.append("/" + t.label)

        walk(self)
        return " ".join(out)

    def linearize(self, fmt: Literal["bracket", "slash"] = "bracket") -> str:
        if fmt == "bracket":
            return self.to_bracketed()
        if fmt == "slash":
            return self.to_slash()
        raise InvalidValueError(f"linearisation: unknown format {fmt!r}; accepted: bracket, slash")

    def copy(self) -> Tree:
        return Tree(self.label, [c.copy() if isinstance(c, Tree) else c for c in self.children])

    # ------------------------------------------------------------------------------------ reading
    def positions(self) -> list[Position]:
        """Every position (root, non-terminals and leaves) in pre-order, like nltk's ``treepositions``."""
        return [p for p, _ in self.walk()]

    def walk(self) -> Iterator[tuple[Position, Child]]:
        """(position, node) for every node and leaf in pre-order."""
        stack: list[tuple[Position, Child]] = [((), self)]
        while stack:
            pos, node = stack.pop()
            yield pos, node
            if isinstance(node, Tree):
                for k in range(len(node.children), 0, -1):
                    stack.append(((*pos, k), node.children[k - 1]))

    def subtrees(self) -> list[tuple[Position, Tree]]:
        """(position, subtree) for every non-terminal node in pre-order (root first)."""
        return [(p, n) for p, n in self.walk() if isinstance(n, Tree)]

    def node_at(self, position: Position) -> Child:
        node: Child = self
        for depth, k in enumerate(position):
            if not isinstance(node, Tree) or not isinstance(k, int) or not 1 <= k <= len(node.children):
                n = len(node.children) if isinstance(node, Tree) else 0
                raise InvalidValueError(
                    f"tree position {tuple(position)}: step {depth + 1} asks for child {k!r} of a node with "
                    f"{n} children (positions are 1-based)"
                )
            node = node.children[k - 1]
        return node

    def label_at(self, position: Position) -> str:
        """The label (non-terminal) or the leaf string at ``position`` (1-based child indices)."""
        node = self.node_at(tuple(position))
        return node.label if isinstance(node, Tree) else node

    def leaves(self) -> list[str]:
        return [n for _, n in self.walk() if isinstance(n, str)]

    def sentence(self) -> str:
        return " ".join(self.leaves())

    def pos(self) -> list[tuple[str, str]]:
        """(leaf, label of its parent) for every leaf, left to right (nltk ``Tree.pos``)."""
        out: list[tuple[str, str]] = []
        self._pos(out)
        return out

    def _pos(self, out: list[tuple[str, str]]) -> None:
        for c in self.children:
            if isinstance(c, Tree):
                c._pos(out)
            else:
                out.append((c, self.label))

    def height(self) -> int:
        """nltk height: 1 + the largest child height, a leaf counting 1 (a pre-terminal has 2)."""
        return 1 + max((c.height() if isinstance(c, Tree) else 1 for c in self.children), default=0)

    def depth(self) -> int:
        """Largest ``len(position)`` over all positions (leaves included)."""
        return max(len(p) for p in self.positions())

    def productions(self) -> list[tuple[str, tuple[str, ...]]]:
        """(lhs, rhs) for every non-terminal in pre-order; rhs holds child labels and leaf strings."""
        return [
            (t.label, tuple(c.label if isinstance(c, Tree) else c for c in t.children))
            for _, t in self.subtrees()
        ]

    def details(self) -> dict[Position, NodeDetails]:
        """Level, sibling index and parent label of every non-terminal (``tree_to_details``)."""
        out: dict[Position, NodeDetails] = {}
        for pos, _ in self.subtrees():
            parent = self.label_at(pos[:-1]) if pos else None
            out[pos] = NodeDetails(level=len(pos) + 1, sibling=pos[-1] if pos else 1, parent=parent)
        return out

    def to_details(self) -> str:
        """Bracketed tree with every label rewritten ``label<H_level><S_sibling>parent`` (``<none>`` for
        the root's parent): the ``tree interpreting`` target."""
        det = self.details()

        def walk(t: Tree, pos: Position) -> Tree:
            d = det[pos]
            lab = f"{t.label}<H_{d.level}><S_{d.sibling}>{d.parent if d.parent is not None else NONE}"
            kids = [walk(c, (*pos, k)) if isinstance(c, Tree) else c for k, c in enumerate(t.children, 1)]
            return Tree(lab, kids)

        return walk(self, ()).to_bracketed()

    # ---------------------------------------------------------------------------------- rewriting
    def delete_node(self, position: Position) -> Tree:
        """A copy with the non-terminal at ``position`` removed and its children spliced into its
        parent at its place (the ``node deleting`` target)."""
        position = tuple(position)
        if not position:
            raise InvalidValueError("delete_node: the root cannot be deleted (position ())")
        node = self.node_at(position)
        if not isinstance(node, Tree):
            raise InvalidValueError(
                f"delete_node: position {position} is a leaf ({node!r}), not a non-terminal"
            )
        out = self.copy()
        parent = out.node_at(position[:-1])
        assert isinstance(parent, Tree)
        k = position[-1] - 1
        parent.children[k : k + 1] = parent.children[k].children  # type: ignore[union-attr]
        return out

    def prune(self, height: int = 5, retain: Literal["original", "mask", "none"] = "original") -> Tree:
        """``MyTree.prune_downwards(height, retain)``: nodes at level ``height`` (root = level 1)
        become leaves of their own. ``original``: such a node keeps its yield as ONE leaf string
        (``(NP the big cat)`` where ``the big cat`` is one leaf); ``mask``: its yield becomes one
        ``<mask>`` and every shallower leaf ``<mask>``; ``none``: the node becomes a bare label leaf and
        shallower leaves are dropped (the "tree without leaves")."""
        if height < 2:
            raise InvalidValueError(f"prune: height must be >= 2 (the root is level 1), got {height}")
        if retain not in ("original", "mask", "none"):
            raise InvalidValueError(f"prune: retain must be original, mask or none, got {retain!r}")

        def walk(t: Tree, level: int) -> Child:
            if level == height:
                if retain == "original":
                    return Tree(t.label, [" ".join(t.leaves())])
                if retain == "mask":
                    return Tree(t.label, [MASK])
                return t.label
            kids: list[Child] = []
            for c in t.children:
                if isinstance(c, Tree):
                    kids.append(walk(c, level + 1))
                elif retain == "original":
                    kids.append(c)
                elif retain == "mask":
                    kids.append(MASK)
            return Tree(t.label, kids)

        out = walk(self, 1)
        assert isinstance(out, Tree)
        return out

    def mask_leaves(self) -> Tree:
        """Every leaf replaced by ``<mask>`` (``replace_leaf_with_mask``)."""
        return Tree(self.label, [c.mask_leaves() if isinstance(c, Tree) else MASK for c in self.children])

    def randomize_labels(self, rng: random.Random, n_labels: int = 100) -> Tree:
        """Every label AND every leaf replaced by ``<node_k>`` (``convert_constituency_to_random_tree``):
        a fresh shuffle of ``<node_0..n-1>`` per call, assigned in pre-order (modulo ``n_labels``)."""
        labels = [f"<node_{i}>" for i in range(n_labels)]
        rng.shuffle(labels)
        counter = iter(range(10**9))

        def walk(t: Tree) -> Tree:
            lab = labels[next(counter) % n_labels]
            kids: list[Child] = []
            for c in t.children:
                kids.append(walk(c) if isinstance(c, Tree) else labels[next(counter) % n_labels])
            return Tree(lab, kids)

        return walk(self)

    def nonterminals(self) -> list[str]:
        """Distinct labels of the non-terminals (pre-terminals included), in first-seen order."""
        return list(dict.fromkeys(t.label for _, t in self.subtrees()))


def format_production(lhs: str, rhs: tuple[str, ...]) -> str:
    return f"{lhs} -> {' '.join(rhs)}"


def _tokenize(text: str) -> Iterator[tuple[str, int]]:
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch.isspace():
            i += 1
        elif ch in "()":
            yield ch, i
            i += 1
        else:
            j = i
            while j < n and not text[j].isspace() and text[j] not in "()":
                j += 1
            yield text[i:j], i
            i = j


def _parse(toks: list[tuple[str, int]], i: int, text: str) -> tuple[Tree, int]:
    tok, at = toks[i]
    if tok != "(":
        raise InvalidValueError(f"bracketed tree: expected '(' at position {at}, found {tok!r}")
    open_at = at
    i += 1
    if i >= len(toks):
        raise InvalidValueError(f"bracketed tree: unbalanced, '(' at position {open_at} is never closed")
    tok, at = toks[i]
    if tok in "()":
        raise InvalidValueError(f"bracketed tree: expected a label at position {at}, found {tok!r}")
    tree = Tree(tok, [])
    i += 1
    while True:
        if i >= len(toks):
            raise InvalidValueError(
                f"bracketed tree: unbalanced, '(' at position {open_at} is never closed "
                f"(input ends at position {len(text)})"
            )
        tok, at = toks[i]
        if tok == ")":
            return tree, i + 1
        if tok == "(":
            child, i = _parse(toks, i, text)
            tree.children.append(child)
        else:
            tree.children.append(tok)
            i += 1
