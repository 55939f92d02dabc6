"""SCPG data: a synthetic paraphrase corpus from a small probabilistic grammar, the grammar's exact
parser, and loaders for the SGCP data layout (ParaNMT-small, QQP-Pos).

Synthetic corpus
----------------
A *meaning* is (agent, verb, patient, optional location): each noun phrase a determiner, an optional
adjective (p = 0.3) and a noun; the location (p = 0.5) a preposition and a noun phrase. It is realised
by one of five syntactic templates of one context-free grammar (:data:`GRAMMAR`):

===  ===================  =================================================================
A    active               the cat saw a dog in the park .
P    passive              a dog was seen by the cat in the park .
F    fronted active       in the park , the cat saw a dog .              (needs a location)
G    fronted passive      in the park , a dog was seen by the cat .      (needs a location)
C    cleft                it was the cat that saw a dog in the park .
===  ===================  =================================================================

A paraphrase pair realises one meaning with two different templates (source, target); its exemplar
is a fresh meaning realised with the target's template and the same optional slots, so the exemplar's
parse has exactly the target's shape (SGCP's test-time "template sentence"). Templates are drawn
uniformly among those the meaning allows. The grammar is unambiguous, so :class:`GrammarParser` (a
memoised chart parser over :data:`GRAMMAR`) returns exactly the generating tree for every sentence of
the language (tested), and ``None`` outside it.

``few_shot_template`` (default ``C``) is kept rare as a *target* in the training split (``few_shot_k``
pairs), giving a few-shot test subset; the "hardest" test pairs are those whose source and target
parses differ most (tree edit distance).

SGCP layout
-----------
``<dir>/<split>/{src,tgt,ref}.txt`` (one sentence per line; ``ref`` val/test only) and the parses
``<file>-corenlp-opti`` (one tree per line). Two conventions name the same files differently
(``convention``):

- ``sgcp`` (default), as SGCP (Kumar et al., TACL 2020, ``malllabiisc/SGCP``) ships its data and
  reads it (``src/dataloader.py``: ``IterableValParaphraseDataset`` takes ``ref.txt`` as the paraphrase
  and ``tgt.txt`` as the template; ``src/evaluation/eval.py`` is run with ``-r ref.txt -t tgt.txt``):
  ``ref.txt`` = the reference paraphrase (target), ``tgt.txt`` = the exemplar (template sentence);
- ``dsmt``: the DSMT code's inverted data (``Paraphrase/para_datasets.py``: "in terms of `tgt` and
  `ref`, our data is inversed"): ``tgt.txt`` = target, ``ref.txt`` = exemplar.

In the training split (no ``ref.txt``) both read ``tgt.txt`` as the target, its own exemplar. A parse
line is SGCP's JSON (``{"ROOT": ["S-1"], "S-1": ["NP-2", ...], "DT-3": ["the"], ...}``: each node
name maps to its children in order, a name's ``-<number>`` suffix is dropped from its label, a child
that is not a key is a word) or a bracketed tree; :func:`parse_tree_line` tells them apart by the
first character.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from posttrain.utils.errors import InvalidValueError
from posttrain_lab.studies.scpg.tasks import SCPGExample
from posttrain_lab.studies.scpg.trees import Tree

LEXICON: dict[str, tuple[str, ...]] = {
    "DT": ("the", "a"),
    "JJ": ("big", "small", "old", "young", "happy", "lazy", "clever", "quiet"),
    "NN": (
        "cat",
        "dog",
        "girl",
        "boy",
        "teacher",
        "farmer",
        "bird",
        "child",
        "doctor",
        "artist",
        "king",
        "nurse",
    ),
    "LOC": ("park", "garden", "kitchen", "house", "forest", "city", "market", "school"),
    "IN": ("in", "near", "behind", "by"),
    "VERB": (
        "saw:seen",
        "chose:chosen",
        "knew:known",
        "drew:drawn",
        "took:taken",
        "chased:chased",
        "helped:helped",
        "called:called",
        "followed:followed",
        "pushed:pushed",
    ),
}
"""Terminals by category; ``VERB`` entries are ``past:participle``; ``LOC`` nouns are tagged NN."""

GRAMMAR: dict[str, tuple[tuple[str, ...], ...]] = {
    "ROOT": (("NP", "VP", "."), ("PP", ",", "NP", "VP", ".")),
    "S": (("VP",),),
    "VP": (("VBD", "NP"), ("VBD", "NP", "PP"), ("VBD", "VP"), ("VBN", "PP"), ("VBN", "PP", "PP")),
    "NP": (("DT", "NN"), ("DT", "JJ", "NN"), ("PRP",), ("NP", "SBAR")),
    "PP": (("IN", "NP"),),
    "SBAR": (("WHNP", "S"),),
    "WHNP": (("WDT",),),
}
"""Phrase rules. The root category of a sentence is written ``S`` in its tree (``ROOT`` is the rule
set with the final period); the embedded ``S`` of a cleft has no period."""

TEMPLATES = ("A", "P", "F", "G", "C")


def _pos_words() -> dict[str, set[str]]:
    verbs = [v.split(":") for v in LEXICON["VERB"]]
    return {
        "DT": set(LEXICON["DT"]),
        "JJ": set(LEXICON["JJ"]),
        "NN": set(LEXICON["NN"]) | set(LEXICON["LOC"]),
        "IN": set(LEXICON["IN"]),
        "VBD": {p for p, _ in verbs} | {"was"},
        "VBN": {pp for _, pp in verbs},
        "PRP": {"it"},
        "WDT": {"that"},
        ".": {"."},
        ",": {","},
    }


POS_WORDS = _pos_words()


@dataclass(frozen=True)
class Meaning:
    agent: tuple[str, str | None, str]  # det, adjective, noun
    verb: str  # "past:participle"
    patient: tuple[str, str | None, str]
    loc: tuple[str, tuple[str, str | None, str]] | None = None  # preposition, noun phrase

    def slots(self) -> tuple[bool, bool, bool]:
        return (self.agent[1] is not None, self.patient[1] is not None, self.loc is not None)


def _np(np: tuple[str, str | None, str]) -> Tree:
    det, adj, noun = np
    kids: list = [Tree("DT", [det])]
    if adj is not None:
        kids.append(Tree("JJ", [adj]))
    kids.append(Tree("NN", [noun]))
    return Tree("NP", kids)


def _pp(prep: str, np: tuple[str, str | None, str]) -> Tree:
    return Tree("PP", [Tree("IN", [prep]), _np(np)])


def realise(m: Meaning, template: str) -> Tree:
    """The parse of meaning ``m`` in ``template`` (A, P, F, G, C; F and G need a location)."""
    past, part = m.verb.split(":")
    loc = [_pp(*m.loc)] if m.loc is not None else []
    period = Tree(".", ["."])
    if template == "A":
        return Tree("S", [_np(m.agent), Tree("VP", [Tree("VBD", [past]), _np(m.patient), *loc]), period])
    passive = Tree(
        "VP",
        [
            Tree("VBD", ["was"]),
            Tree("VP", [Tree("VBN", [part]), _pp("by", m.agent), *([] if template == "G" else loc)]),
        ],
    )
    if template == "P":
        return Tree("S", [_np(m.patient), passive, period])
    if template in ("F", "G"):
        if m.loc is None:
            raise InvalidValueError(f"template {template} needs a location")
        if template == "F":
            vp = Tree("VP", [Tree("VBD", [past]), _np(m.patient)])
            return Tree("S", [loc[0], Tree(",", [","]), _np(m.agent), vp, period])
        return Tree("S", [loc[0], Tree(",", [","]), _np(m.patient), passive, period])
    if template == "C":
        inner = Tree("S", [Tree("VP", [Tree("VBD", [past]), _np(m.patient), *loc])])
        rel = Tree("SBAR", [Tree("WHNP", [Tree("WDT", ["that"])]), inner])
        vp = Tree("VP", [Tree("VBD", ["was"]), Tree("NP", [_np(m.agent), rel])])
        return Tree("S", [Tree("NP", [Tree("PRP", ["it"])]), vp, period])
    raise InvalidValueError(f"unknown template {template!r}; known: {', '.join(TEMPLATES)}")


def allowed_templates(m: Meaning) -> tuple[str, ...]:
    return TEMPLATES if m.loc is not None else ("A", "P", "C")


def sample_meaning(rng: random.Random, slots: tuple[bool, bool, bool] | None = None) -> Meaning:
    """A random meaning; ``slots`` = (agent adjective, patient adjective, location) forces which
    optional parts are present (used for exemplars)."""
    want = slots or (rng.random() < 0.3, rng.random() < 0.3, rng.random() < 0.5)

    def np(adj: bool) -> tuple[str, str | None, str]:
        return (
            rng.choice(LEXICON["DT"]),
            rng.choice(LEXICON["JJ"]) if adj else None,
            rng.choice(LEXICON["NN"]),
        )

    agent = np(want[0])
    patient = np(want[1])
    while patient[2] == agent[2]:
        patient = np(want[1])
    loc = None
    if want[2]:
        loc = (
            rng.choice([p for p in LEXICON["IN"] if p != "by"]),
            (rng.choice(LEXICON["DT"]), None, rng.choice(LEXICON["LOC"])),
        )
    return Meaning(agent, rng.choice(LEXICON["VERB"]), patient, loc)


def sample_sentence(rng: random.Random) -> Tree:
    m = sample_meaning(rng)
    return realise(m, rng.choice(allowed_templates(m)))


@dataclass
class SyntheticPair:
    example: SCPGExample
    src_template: str
    tgt_template: str


def sample_pair(rng: random.Random, tgt_template: str | None = None) -> SyntheticPair:
    while True:
        m = sample_meaning(rng)
        allowed = allowed_templates(m)
        if tgt_template is not None and tgt_template not in allowed:
            continue
        t_tgt = tgt_template or rng.choice(allowed)
        t_src = rng.choice([t for t in allowed if t != t_tgt])
        break
    src, tgt = realise(m, t_src), realise(m, t_tgt)
    ex_m = sample_meaning(rng, m.slots())
    while ex_m == m:
        ex_m = sample_meaning(rng, m.slots())
    exm = realise(ex_m, t_tgt)
    return SyntheticPair(
        SCPGExample(src.sentence(), src, tgt.sentence(), tgt, exm.sentence(), exm), t_src, t_tgt
    )


@dataclass
class SyntheticCorpus:
    train: list[SyntheticPair]
    val: list[SyntheticPair]
    test: list[SyntheticPair]
    pretrain_trees: list[Tree] = field(default_factory=list)
    few_shot_template: str = "C"


def synthetic_corpus(
    *,
    n_train: int = 2000,
    n_val: int = 100,
    n_test: int = 300,
    n_pretrain: int = 4000,
    few_shot_template: str | None = "C",
    few_shot_k: int = 16,
    seed: int = 0,
) -> SyntheticCorpus:
    """Train / val / test pairs and a separate pool of parses for pre-training (all templates).
    In ``train``, at most ``few_shot_k`` pairs have target template ``few_shot_template``; in
    training pairs the exemplar is the target itself (SGCP convention)."""
    rng = random.Random(seed)
    train: list[SyntheticPair] = []
    n_few = 0
    while len(train) < n_train:
        p = sample_pair(rng)
        if p.tgt_template == few_shot_template:
            if n_few >= few_shot_k:
                continue
            n_few += 1
        ex = p.example
        train.append(
            SyntheticPair(
                SCPGExample(ex.src, ex.src_tree, ex.tgt, ex.tgt_tree, ex.tgt, ex.tgt_tree),
                p.src_template,
                p.tgt_template,
            )
        )
    val = [sample_pair(rng) for _ in range(n_val)]
    test = [sample_pair(rng) for _ in range(n_test)]
    pre = [sample_sentence(rng) for _ in range(n_pretrain)]
    return SyntheticCorpus(train, val, test, pre, few_shot_template or "")


def corpus_words() -> list[str]:
    """Every terminal of the grammar (the word-level vocabulary of the synthetic corpus)."""
    words: list[str] = []
    for ws in POS_WORDS.values():
        words += sorted(ws)
    return list(dict.fromkeys(words))


class GrammarParser:
    """Exact parser of :data:`GRAMMAR` (memoised top-down chart parsing over spans; every symbol
    covers at least one word, so left recursion ``NP -> NP SBAR`` terminates). ``parse`` returns the
    tree, or ``None`` when the sentence is not in the language."""

    name = "grammar"

    def parse(self, sentence: str) -> Tree | None:
        words = sentence.split()
        if not words:
            return None
        memo: dict[tuple[str, int, int], Tree | None] = {}

        def derive(sym: str, i: int, j: int) -> Tree | None:
            key = (sym, i, j)
            if key in memo:
                return memo[key]
            memo[key] = None  # in progress: a cycle finds nothing
            out: Tree | None = None
            if sym in POS_WORDS:
                if j == i + 1 and words[i] in POS_WORDS[sym]:
                    out = Tree(sym, [words[i]])
            else:
                for rhs in GRAMMAR[sym]:
                    kids = seq(rhs, i, j)
                    if kids is not None:
                        out = Tree("S" if sym == "ROOT" else sym, kids)
                        break
            memo[key] = out
            return out

        def seq(rhs: tuple[str, ...], i: int, j: int) -> list | None:
            if len(rhs) == 1:
                t = derive(rhs[0], i, j)
                return [t] if t is not None else None
            for m in range(i + 1, j - len(rhs) + 2):
                left = derive(rhs[0], i, m)
                if left is None:
                    continue
                rest = seq(rhs[1:], m, j)
                if rest is not None:
                    return [left, *rest]
            return None

        return derive("ROOT", 0, len(words))


# --------------------------------------------------------------------------------------------- SGCP
PARSE_SUFFIX = "-corenlp-opti"


def _read_lines(path: Path) -> list[str]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{path}: missing (SGCP layout: <dir>/<split>/{{src,tgt,ref}}.txt and <file>{PARSE_SUFFIX})"
        ) from None
    except UnicodeDecodeError as e:
        raise InvalidValueError(f"{path}: not UTF-8 text ({e})") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


Convention = Literal["sgcp", "dsmt"]
CONVENTIONS = ("sgcp", "dsmt")
_SUFFIX = re.compile(r"-\d+$")


def tree_from_sgcp_json(obj: object, where: str = "parse") -> Tree:
    """A tree from SGCP's JSON parse (module docstring): ``ROOT`` is the root, ``NP-2`` has label ``NP``."""
    if not isinstance(obj, dict) or "ROOT" not in obj:
        raise InvalidValueError(f"{where}: expected a JSON object with a 'ROOT' key (SGCP parse)")
    seen: set[str] = set()

    def build(name: str) -> Tree:
        if name in seen:
            raise InvalidValueError(f"{where}: node {name!r} occurs twice (not a tree)")
        seen.add(name)
        kids = obj[name]
        if not isinstance(kids, list) or not all(isinstance(k, str) for k in kids):
            raise InvalidValueError(f"{where}: children of {name!r} must be a list of strings")
        return Tree(_SUFFIX.sub("", name), [build(k) if k in obj else k for k in kids])

    return build("ROOT")


def tree_to_sgcp_json(tree: Tree) -> str:
    """The inverse of :func:`tree_from_sgcp_json`: node names ``label-k`` (k in pre-order), root ``ROOT``."""
    out: dict[str, list[str]] = {}
    n = 0

    def name(t: Tree, root: bool = False) -> str:
        nonlocal n
        n += 1
        key = "ROOT" if root else f"{t.label}-{n}"
        out[key] = []
        out[key] = [name(c) if isinstance(c, Tree) else c for c in t.children]
        return key

    if tree.label == "ROOT":
        name(tree, root=True)
    else:  # a tree without the ROOT node gets one
        out["ROOT"] = [name(tree)]
    return json.dumps(out)


def parse_tree_line(line: str, where: str = "parse") -> Tree:
    """One parse line: SGCP's JSON when it starts with ``{``, else a bracketed tree."""
    if line.lstrip().startswith("{"):
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise InvalidValueError(f"{where}: bad JSON parse ({e})") from None
        return tree_from_sgcp_json(obj, where)
    return Tree.from_bracketed(line)


def _read_trees(path: Path) -> list[Tree]:
    out = []
    for n, line in enumerate(_read_lines(path), 1):
        try:
            out.append(parse_tree_line(line, "parse"))
        except ValueError as e:
            raise InvalidValueError(f"{path}:{n}: bad parse ({e})") from None
    return out


def _roles(convention: str) -> tuple[str, str]:
    """(file of the target, file of the exemplar) in val/test splits."""
    if convention not in CONVENTIONS:
        raise InvalidValueError(
            f"unknown SGCP-layout convention {convention!r}; known: {', '.join(CONVENTIONS)}"
        )
    return ("ref", "tgt") if convention == "sgcp" else ("tgt", "ref")


def load_sgcp_split(
    data_dir: str | Path,
    split: str,
    *,
    parse_suffix: str = PARSE_SUFFIX,
    convention: Convention = "sgcp",
) -> list[SCPGExample]:
    """Examples of ``<data_dir>/<split>``; ``ref.txt`` is optional (training: the target is its own
    exemplar). ``convention`` says which of ``tgt``/``ref`` is the target (module docstring). Errors name
    the file and line: unequal line counts, empty sentences, malformed parses."""
    target, exemplar = _roles(convention)
    d = Path(data_dir) / split
    if not d.is_dir():
        raise FileNotFoundError(f"{d}: no such split directory (SGCP layout: <dir>/{{train,val,test}}/)")
    names = ["src", "tgt"] + (["ref"] if (d / "ref.txt").exists() else [])
    sents = {k: _read_lines(d / f"{k}.txt") for k in names}
    trees = {k: _read_trees(d / f"{k}.txt{parse_suffix}") for k in names}
    n = len(sents["src"])
    for k in names:
        for what, items, fname in (
            (f"{k}.txt", sents[k], d / f"{k}.txt"),
            ("parses", trees[k], d / f"{k}.txt{parse_suffix}"),
        ):
            if len(items) != n:
                raise InvalidValueError(
                    f"{fname}: {len(items)} lines, but {d / 'src.txt'} has {n} ({what} must align line by line)"
                )
        for i, s in enumerate(sents[k], 1):
            if not s.strip():
                raise InvalidValueError(f"{d / f'{k}.txt'}:{i}: empty sentence")
    if "ref" not in names:
        target = exemplar = "tgt"
    return [
        SCPGExample(
            sents["src"][i],
            trees["src"][i],
            sents[target][i],
            trees[target][i],
            sents[exemplar][i],
            trees[exemplar][i],
        )
        for i in range(n)
    ]


def write_sgcp_split(
    examples: list[SCPGExample],
    data_dir: str | Path,
    split: str,
    *,
    with_ref: bool = True,
    convention: Convention = "sgcp",
    parse_format: Literal["bracket", "json"] = "bracket",
) -> Path:
    """Write ``examples`` in the SGCP layout (the inverse of :func:`load_sgcp_split` with the same
    ``convention``); parses bracketed or as SGCP's JSON. Without ``with_ref`` (training) ``tgt`` holds
    the targets."""
    from posttrain.utils.io import atomic_write_text

    target, exemplar = _roles(convention)
    d = Path(data_dir) / split
    d.mkdir(parents=True, exist_ok=True)
    cols = {"src": [(e.src, e.src_tree) for e in examples]}
    if with_ref:
        cols[target] = [(e.tgt, e.tgt_tree) for e in examples]
        cols[exemplar] = [(e.exemplar, e.exemplar_tree) for e in examples]
    else:
        cols["tgt"] = [(e.tgt, e.tgt_tree) for e in examples]
    fmt = tree_to_sgcp_json if parse_format == "json" else Tree.to_bracketed
    for k, rows in cols.items():
        atomic_write_text(d / f"{k}.txt", "".join(s + "\n" for s, _ in rows))
        atomic_write_text(d / f"{k}.txt{PARSE_SUFFIX}", "".join(fmt(t) + "\n" for _, t in rows))
    return d
