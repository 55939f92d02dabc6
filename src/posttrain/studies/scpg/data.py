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
``<dir>/<split>/{src,tgt,ref}.txt`` (one sentence per line; ``ref`` = exemplar, val/test only) and the
parses ``<file>-corenlp-opti`` (one bracketed tree per line), as in SGCP (Kumar et al., TACL 2020,
``malllabiisc/SGCP``) and the DSMT code's ``Paraphrase/para_datasets.py``. Without ``ref`` the target
is its own exemplar (training).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

from posttrain.studies.scpg.tasks import SCPGExample
from posttrain.studies.scpg.trees import Tree

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
            raise ValueError(f"template {template} needs a location")
        if template == "F":
            vp = Tree("VP", [Tree("VBD", [past]), _np(m.patient)])
            return Tree("S", [loc[0], Tree(",", [","]), _np(m.agent), vp, period])
        return Tree("S", [loc[0], Tree(",", [","]), _np(m.patient), passive, period])
    if template == "C":
        inner = Tree("S", [Tree("VP", [Tree("VBD", [past]), _np(m.patient), *loc])])
        rel = Tree("SBAR", [Tree("WHNP", [Tree("WDT", ["that"])]), inner])
        vp = Tree("VP", [Tree("VBD", ["was"]), Tree("NP", [_np(m.agent), rel])])
        return Tree("S", [Tree("NP", [Tree("PRP", ["it"])]), vp, period])
    raise ValueError(f"unknown template {template!r}; known: {', '.join(TEMPLATES)}")


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
        raise ValueError(f"{path}: not UTF-8 text ({e})") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def _read_trees(path: Path) -> list[Tree]:
    out = []
    for n, line in enumerate(_read_lines(path), 1):
        try:
            out.append(Tree.from_bracketed(line))
        except ValueError as e:
            raise ValueError(f"{path}:{n}: bad parse ({e})") from None
    return out


def load_sgcp_split(
    data_dir: str | Path, split: str, *, parse_suffix: str = PARSE_SUFFIX
) -> list[SCPGExample]:
    """Examples of ``<data_dir>/<split>``; ``ref.txt`` (exemplars) is optional (training). Errors name
    the file and line: unequal line counts, empty sentences, malformed parses."""
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
                raise ValueError(
                    f"{fname}: {len(items)} lines, but {d / 'src.txt'} has {n} ({what} must align line by line)"
                )
        for i, s in enumerate(sents[k], 1):
            if not s.strip():
                raise ValueError(f"{d / f'{k}.txt'}:{i}: empty sentence")
    ref = "ref" if "ref" in names else "tgt"
    return [
        SCPGExample(
            sents["src"][i], trees["src"][i], sents["tgt"][i], trees["tgt"][i], sents[ref][i], trees[ref][i]
        )
        for i in range(n)
    ]


def write_sgcp_split(
    examples: list[SCPGExample], data_dir: str | Path, split: str, *, with_ref: bool = True
) -> Path:
    """Write ``examples`` in the SGCP layout (the inverse of :func:`load_sgcp_split`)."""
    from posttrain.utils.io import atomic_write_text

    d = Path(data_dir) / split
    d.mkdir(parents=True, exist_ok=True)
    cols = {"src": [(e.src, e.src_tree) for e in examples], "tgt": [(e.tgt, e.tgt_tree) for e in examples]}
    if with_ref:
        cols["ref"] = [(e.exemplar, e.exemplar_tree) for e in examples]
    for k, rows in cols.items():
        atomic_write_text(d / f"{k}.txt", "".join(s + "\n" for s, _ in rows))
        atomic_write_text(d / f"{k}.txt{PARSE_SUFFIX}", "".join(t.to_bracketed() + "\n" for _, t in rows))
    return d
