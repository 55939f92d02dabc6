"""DSMT pre-training tasks and SCPG input formats (Liu et al., Findings ACL 2024; authors' code
``ChristLBUPT/DSMT-T5``). Every formatter maps a :class:`~posttrain_lab.studies.scpg.trees.Tree` (and a
``random.Random`` for its random choices) to an ``(input, target)`` text pair.

Stage 1 (``curriculum_pre_training/tree_task_data_utils.py: TreeTaskFormatter``), on trees whose
labels AND leaves are random ``<node_k>`` tokens (:meth:`Tree.randomize_labels`, a fresh shuffle per
tree), linearised as brackets or slashes; sampling weights 2:1:1:1:2 in the order of :data:`STAGE1_TASKS`:

==========================  ===========================================================================
treeposition indexing       ``treeposition indexing position: 2 1 tree: {t}`` -> label/leaf there; the
                            position is drawn with probability ∝ its depth (the root never)
tree forming                ``tree forming: A -> B D <sep> B -> c ...`` -> the tree
node deleting               ``node deleting position: 2, 1 node: {label} tree: {t}`` -> the tree with that
                            non-terminal removed, its children spliced into its parent
height selection            ``height selection height: {d} tree: {t}`` -> labels/leaves at depth d (root 0;
                            d drawn uniformly over positions), space-separated
tree interpreting           ``tree interpreting: {t}`` -> every label rewritten ``label<H_h><S_s>parent``
==========================  ===========================================================================

Stage 2 (``para_pretrain_multitask_dataset.py: TaskFormatter, ParaPretrainMultitaskDataset``), on real
parses: with probability 0.6 one of four fill-mask tasks on the bracketed tree (uniform), else one of the
seven syntax tasks (uniform). Fill-mask works on the tree's tokens (brackets, labels, words; the authors
mask T5 sub-word tokens, here whole tokens of the linearisation): base probability 0.15, "high
difficulty" 0.30; *intra span* masks non-bracket tokens i.i.d., consecutive masked tokens sharing one
``<extra_id_k>``, the target ending with one more sentinel; *inter span* starts a span with probability
p/3 and draws its length from Poisson(3), length 0 inserting a sentinel (T5 span corruption).

SCPG formats (``Paraphrase/para_datasets.py: ParaNMTDataset.instance_formats``) are in :data:`SCPG_FORMATS`;
trees are pruned at level 5 (``prune_height: 5``).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from posttrain.utils.errors import InvalidValueError
from posttrain_lab.studies.scpg.trees import MASK, Tree, format_production

SEP = " <sep> "
PRUNE_HEIGHT = 5
MASK_PROBABILITY = 0.15
SPAN_MEAN = 3.0
FILL_MASK_PROB = 0.6
MAX_SENTINELS = 100


def sentinel(k: int) -> str:
    return f"<extra_id_{k}>"


# ------------------------------------------------------------------------------------------ stage 1
def treeposition_indexing(tree: Tree, rng: random.Random, fmt: str = "bracket") -> tuple[str, str]:
    positions = tree.positions()
    pos = rng.choices(positions, weights=[len(p) for p in positions])[0]
    return (
        f"treeposition indexing position: {' '.join(map(str, pos))} tree: {tree.linearize(fmt)}",
        tree.label_at(pos),
    )


def tree_forming(tree: Tree, rng: random.Random, fmt: str = "bracket") -> tuple[str, str]:
    prods = SEP.join(format_production(lhs, rhs) for lhs, rhs in tree.productions())
    return f"tree forming: {prods}", tree.linearize(fmt)


def node_deleting(tree: Tree, rng: random.Random, fmt: str = "bracket") -> tuple[str, str]:
    cands = [p for p, _ in tree.subtrees() if p]
    if not cands:
        raise InvalidValueError(f"node deleting: tree {tree} has no non-terminal below the root")
    pos = rng.choice(cands)
    return (
        f"node deleting position: {', '.join(map(str, pos))} node: {tree.label_at(pos)} "
        f"tree: {tree.linearize(fmt)}",
        tree.delete_node(pos).linearize(fmt),
    )


def height_selection(tree: Tree, rng: random.Random, fmt: str = "bracket") -> tuple[str, str]:
    positions = tree.positions()
    d = len(rng.choice(positions))
    labels = [tree.label_at(p) for p in positions if len(p) == d]
    return f"height selection height: {d} tree: {tree.linearize(fmt)}", " ".join(labels)


def tree_interpreting(tree: Tree, rng: random.Random, fmt: str = "bracket") -> tuple[str, str]:
    return f"tree interpreting: {tree.linearize(fmt)}", Tree.from_bracketed(tree.to_details()).linearize(fmt)


STAGE1_TASKS: dict[str, Callable[..., tuple[str, str]]] = {
    "treeposition_indexing": treeposition_indexing,
    "tree_forming": tree_forming,
    "node_deleting": node_deleting,
    "height_selection": height_selection,
    "tree_interpreting": tree_interpreting,
}
STAGE1_WEIGHTS = (2, 1, 1, 1, 2)


# ------------------------------------------------------------------------------------------ stage 2
def _pruned(tree: Tree) -> Tree:
    return tree.prune(PRUNE_HEIGHT, "original")


def pruned_tree_parse(tree: Tree, rng: random.Random) -> tuple[str, str]:
    return f"pruned tree parse: {tree.sentence()}", _pruned(tree).to_bracketed()


def pruned_tree_completion(tree: Tree, rng: random.Random) -> tuple[str, str]:
    return f"pruned tree completion: {_pruned(tree).to_bracketed()}", tree.to_bracketed()


def tree_pruning(tree: Tree, rng: random.Random) -> tuple[str, str]:
    return f"tree pruning: {tree.to_bracketed()}", _pruned(tree).to_bracketed()


def _phrases(tree: Tree) -> list[Tree]:
    subs = [t for _, t in tree.subtrees() if t.height() > 2]
    if not subs:
        raise InvalidValueError(f"tree {tree}: no constituent above the pre-terminals (height > 2)")
    return subs


def constituency_searching(tree: Tree, rng: random.Random) -> tuple[str, str]:
    subs = _phrases(tree)
    labels = [t.label for t in subs]
    rng.shuffle(labels)
    chosen = next((lab for lab in labels if labels.count(lab) > 1), labels[0])
    spans = [t.sentence() for t in subs if t.label == chosen]
    return f"constituency searching node: {chosen} sentence: {tree.sentence()}", SEP.join(spans)


def constituency_discrimination(tree: Tree, rng: random.Random) -> tuple[str, str]:
    """Positive: a constituent's span; negative (probability 0.5): both span ends shifted by the same
    ±U{1..3}, clipped to the sentence (as the authors do; such a span can rarely be a constituent)."""
    subs = _phrases(tree)
    labels = [t.label for t in subs]
    rng.shuffle(labels)
    chosen = labels[0]
    sub = next(t for t in subs if t.label == chosen)
    words, span = tree.leaves(), sub.leaves()
    negative = rng.random() > 0.5
    if negative:
        start = next(i for i in range(len(words)) if words[i : i + len(span)] == span)
        end = start + len(span)
        off = rng.randint(1, 3) * rng.choice((-1, 1))
        start = min(max(start + off, 0), len(words))
        end = max(min(end + off, len(words)), 0)
        span = words[start:end]
    return (
        f"constituency discrimination node: {chosen} span: {' '.join(span)} sentence: {' '.join(words)}",
        "False" if negative else "True",
    )


def pos_tagging(tree: Tree, rng: random.Random) -> tuple[str, str]:
    return f"pos tagging: {tree.sentence()}", " ".join(f"{w} {tag}" for w, tag in tree.pos())


def production_detection(tree: Tree, rng: random.Random) -> tuple[str, str]:
    prods = [format_production(lhs, rhs) for lhs, rhs in tree.mask_leaves().productions() if MASK not in rhs]
    return f"production detection: {tree.to_bracketed()}", SEP.join(prods)


STAGE2_SYNTAX_TASKS: dict[str, Callable[..., tuple[str, str]]] = {
    "pruned_tree_parse": pruned_tree_parse,
    "pruned_tree_completion": pruned_tree_completion,
    "tree_pruning": tree_pruning,
    "constituency_searching": constituency_searching,
    "constituency_discrimination": constituency_discrimination,
    "pos_tagging": pos_tagging,
    "production_detection": production_detection,
}

FILL_MASK_PREFIXES = (
    "high difficulty intra span:",
    "low difficulty intra span:",
    "high difficulty inter span:",
    "low difficulty inter span:",
)


def tree_tokens(tree: Tree) -> list[str]:
    """The bracketed tree as tokens: ``(``, ``)``, labels and leaf words."""
    return tree.to_bracketed().replace("(", " ( ").replace(")", " ) ").split()


def mask_intra_bracket(tokens: Sequence[str], p: float, rng: random.Random) -> tuple[str, str]:
    """Mask non-bracket tokens i.i.d. with probability ``p``; a run of masked tokens becomes one
    sentinel; the target lists ``<extra_id_k> tokens...`` per run and ends with the next sentinel."""
    src: list[str] = []
    tgt: list[str] = []
    k = 0
    prev = False
    for tok in tokens:
        masked = tok not in "()" and rng.random() < p
        if masked and not prev:
            src.append(sentinel(k))
            tgt += [sentinel(k), tok]
            k += 1
        elif masked:
            tgt.append(tok)
        else:
            src.append(tok)
        prev = masked
    tgt.append(sentinel(k))
    return " ".join(src), " ".join(tgt)


def _poisson(lam: float, rng: random.Random) -> int:
    limit, k, prod = math.exp(-lam), 0, rng.random()
    while prod > limit:
        k += 1
        prod *= rng.random()
    return k


def mask_inter_span(
    tokens: Sequence[str], p: float, rng: random.Random, mean_span: float = SPAN_MEAN
) -> tuple[str, str]:
    """T5 span corruption (``process_line``): each token starts a span with probability p/mean_span, the
    span length ~ Poisson(mean_span); length 0 inserts a sentinel before the token; at most 100. A draw
    with no span at all is redrawn (the authors would train on an empty target)."""
    n = len(tokens)
    if n == 0:
        raise InvalidValueError("mask_inter_span: no tokens")
    marks = [0] * n
    while not any(marks):
        for i in range(n):
            if rng.random() < p / mean_span:
                length = _poisson(mean_span, rng)
                if length == 0:
                    marks[i] = -1
                else:
                    for j in range(i, min(n, i + length)):
                        marks[j] = 1
    src: list[str] = []
    tgt: list[str] = []
    k = 0
    for i, tok in enumerate(tokens):
        if marks[i] == 0 or k == MAX_SENTINELS:
            src.append(tok)
        elif marks[i] == -1:
            src += [sentinel(k), tok]
            tgt.append(sentinel(k))
            k += 1
        elif k > 0 and src and src[-1] == sentinel(k - 1):  # continue the open span
            tgt.append(tok)
        else:
            src.append(sentinel(k))
            tgt += [sentinel(k), tok]
            k += 1
    return " ".join(src), " ".join(tgt)


def fill_mask(
    tree: Tree, prefix: str, rng: random.Random, base_p: float = MASK_PROBABILITY
) -> tuple[str, str]:
    if prefix not in FILL_MASK_PREFIXES:
        raise InvalidValueError(f"fill-mask prefix {prefix!r}; accepted: {', '.join(FILL_MASK_PREFIXES)}")
    p = base_p * 2 if prefix.startswith("high") else base_p
    fn = mask_intra_bracket if "intra" in prefix else mask_inter_span
    src, tgt = fn(tree_tokens(tree), p, rng)
    return f"{prefix} {src}", tgt


# --------------------------------------------------------------------------------------------- SCPG
@dataclass(frozen=True)
class SCPGExample:
    """One SCPG instance: source sentence and parse, target paraphrase and parse, and the exemplar
    (template) sentence and parse. In training data the exemplar is the target itself (SGCP's
    convention); at test time it is a different sentence with the target's syntax."""

    src: str
    src_tree: Tree
    tgt: str
    tgt_tree: Tree
    exemplar: str
    exemplar_tree: Tree


def replace_masks_with_sentinels(text: str) -> str:
    """``<mask>`` -> ``<extra_id_0>``, ``<extra_id_1>``, ... left to right (``replace_mask_with_extra_id``)."""
    parts = text.split(MASK)
    out = parts[0]
    for k, part in enumerate(parts[1:]):
        out += sentinel(k) + part
    return out


def scpg_fields(ex: SCPGExample, prune_height: int = PRUNE_HEIGHT) -> dict[str, str]:
    return {
        "src_text": ex.src,
        "src_tree": ex.src_tree.prune(prune_height, "original").to_bracketed(),
        "tgt_text": ex.tgt,
        "ref_text": ex.exemplar,
        "ref_tree": ex.exemplar_tree.prune(prune_height, "original").to_bracketed(),
        "ref_tree_noleaf": ex.exemplar_tree.prune(prune_height, "none").to_bracketed(),
        "ref_tree_masked": replace_masks_with_sentinels(
            ex.exemplar_tree.prune(prune_height, "mask").to_bracketed()
        ),
    }


_TRIPLET_IN = "no-tree-scpg source sentence: {src_text} template sentence: {ref_text}"
SCPG_FORMATS: dict[str, tuple[str, str]] = {
    # format: (input template, target template); note the missing space after "template syntax tree:"
    # in t5_prefix, as in the authors' code
    "t5_prefix": (
        "scpg source sentence: {src_text} source syntax tree: {src_tree} template syntax tree:{ref_tree_masked}",
        "{tgt_text}",
    ),
    "aesop": ("{src_text} <sep> {src_tree} <sep> {ref_tree_noleaf}", "{ref_tree_noleaf} <sep> {tgt_text}"),
    "aesop_nooutputtree": ("{src_text} <sep> {src_tree} <sep> {ref_tree_noleaf}", "{tgt_text}"),
    "triplet": (
        _TRIPLET_IN,
        "source syntax tree: {src_tree} template syntax tree: {ref_tree} target sentence: {tgt_text}",
    ),
    "triplet_sentencetree": (_TRIPLET_IN, "{tgt_text} <tgt> {ref_tree}"),
    "triplet_nooutputtree": (_TRIPLET_IN, "{tgt_text}"),
}
"""The six SCPG formats. For the mask formats the authors train ``t5_prefix`` on sentinel-wrapped
words when no separate exemplar exists; here its target is always the sentence (as tabulated)."""

TRIPLET_FORMATS = ("triplet", "triplet_sentencetree", "triplet_nooutputtree")


def format_scpg(ex: SCPGExample, fmt: str, prune_height: int = PRUNE_HEIGHT) -> tuple[str, str]:
    if fmt not in SCPG_FORMATS:
        raise InvalidValueError(f"SCPG format {fmt!r}; accepted: {', '.join(SCPG_FORMATS)}")
    fields = scpg_fields(ex, prune_height)
    src, tgt = SCPG_FORMATS[fmt]
    return src.format(**fields), tgt.format(**fields)


def split_scpg_output(text: str, fmt: str) -> tuple[str, str | None]:
    """(sentence, tree text or None) from a generated output of format ``fmt`` (``post_process.py``:
    ``after <sep>``, ``after target sentence:``, ``sentence <tgt> tree``, or the output itself)."""
    text = " ".join(text.split())
    if fmt in ("t5_prefix", "aesop_nooutputtree", "triplet_nooutputtree"):
        return text, None
    if fmt == "aesop":
        tree, _, sent = text.partition("<sep>")
        return sent.strip(), tree.strip() or None
    if fmt == "triplet":
        head, _, sent = text.partition("target sentence:")
        tree = head.partition("template syntax tree:")[2].strip()
        return sent.strip(), tree or None
    if fmt == "triplet_sentencetree":
        sent, _, tree = text.partition("<tgt>")
        return sent.strip(), tree.strip() or None
    raise InvalidValueError(f"SCPG format {fmt!r}; accepted: {', '.join(SCPG_FORMATS)}")


# ------------------------------------------------------------------------------------------ samplers
def stage1_example(
    tree: Tree, rng: random.Random, fmt: str = "bracket", n_labels: int = 100
) -> tuple[str, str]:
    """One stage-1 pair: a fresh label randomisation of ``tree`` and a task drawn 2:1:1:1:2."""
    task = rng.choices(list(STAGE1_TASKS), weights=STAGE1_WEIGHTS)[0]
    return STAGE1_TASKS[task](tree.randomize_labels(rng, n_labels), rng, fmt)


def stage2_example(
    tree: Tree,
    rng: random.Random,
    *,
    scpg: Sequence[SCPGExample] = (),
    scpg_fraction: float = 0.0,
    scpg_format: str = "t5_prefix",
) -> tuple[str, str]:
    """One stage-2 pair: 60% a fill-mask task (uniform over the four prefixes), else a syntax task
    (uniform over seven). ``scpg_fraction`` > 0 mixes SCPG instances in first (the authors' "scpg"
    task; its share is not given, so it is off by default — proposed design)."""
    if scpg and rng.random() < scpg_fraction:
        return format_scpg(rng.choice(list(scpg)), scpg_format)
    if rng.random() < FILL_MASK_PROB:
        return fill_mask(tree, rng.choice(FILL_MASK_PREFIXES), rng)
    task = rng.choice(list(STAGE2_SYNTAX_TASKS))
    return STAGE2_SYNTAX_TASKS[task](tree, rng)
