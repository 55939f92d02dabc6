"""A built-in synthetic task stream over a generated entity world (short sequences for CPU runs).

The world: ``n_entities`` entities, each a 3-letter name, an age (10-99), a city and a colour, drawn
from ``seed``. Every task's instruction carries a key part (``[[...]]``) that decides the answer, so a
model that ignores ("half-listens to") the instruction is right only by chance:

| task | instruction (key part) | input | output |
|---|---|---|---|
| ``lookup`` | ``Give the [[city]].`` (age/city/color) | ``Bax 31 Oslo red`` | ``Oslo`` |
| ``compare`` | ``Who is [[older]]?`` (older/younger) | ``Bax 31, Kor 45`` | ``Kor`` |
| ``format`` | ``Rewrite [[uppercase]].`` (uppercase/lowercase/reversed) | ``Oslo`` | ``OSLO`` |
| ``pick`` | ``Pick the [[last]] one.`` (first/second/last) | ``red Oslo gold`` | ``gold`` |
| ``lookup_upper`` (held out) | ``Give the [[city]] in [[uppercase]].`` | ``Bax 31 Oslo red`` | ``OSLO`` |
| ``compare_lookup`` (held out) | ``Give the [[color]] of the [[older]].`` | ``Bax 31 Oslo red, Kor 45 Lima gold`` | ``gold`` |

The held-out tasks compose skills of the seen ones. ``check(task, example, output)`` is the rule
behind the V-score (key-part constraint satisfied, which may hold for a wrong answer): lookup — the
answer has the asked attribute's type (a city / a colour / a number); compare — the answer is the
name with the asked relation; format — the asked case holds (upper/lower) or it is the reversal;
pick — the answer is the item at the asked position; the held-out tasks combine their parts' rules.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, replace

from posttrain.utils.errors import InvalidValueError
from posttrain_lab.studies.cit.data import InstructionExample, parse_markup

CITIES = ("Oslo", "Lima", "Rome", "Riga", "Baku", "Kiev", "Doha", "Bern")
COLORS = ("red", "blue", "gold", "pink", "gray", "teal", "navy", "lime")
_C, _V = "bdfgklmnprstvz", "aeiou"

CONCRETE = {
    "city": "home city",
    "age": "age in years",
    "color": "favourite color",
    "older": "the older person",
    "younger": "the younger person",
    "uppercase": "in capital letters",
    "lowercase": "in small letters",
    "reversed": "spelled backwards",
    "first": "first-listed",
    "second": "second-listed",
    "last": "last-listed",
}
"""Concretizing rewrites of the key parts (more specific wording, same meaning); the training-time
table (the ``kpig`` arm's diversified rows use it)."""

HELDOUT_CONCRETE = {
    "city": "residence town",
    "age": "numeric age",
    "color": "colour attribute",
    "older": "senior",
    "younger": "junior",
    "uppercase": "all caps",
    "lowercase": "all lower-case",
    "reversed": "back to front",
    "first": "initial",
    "second": "middle",
    "last": "final",
}
"""Concretizing wordings for the P-score's held-out rewrites: no word added here is added by any
training-time rewrite (:data:`CONCRETE` or the training rules of :mod:`posttrain_lab.studies.cit.diversify`), so
no method trained on these phrasings."""


@dataclass(frozen=True)
class Entity:
    name: str
    age: int
    city: str
    color: str

    def record(self) -> str:
        return f"{self.name} {self.age} {self.city} {self.color}"

    def attr(self, key: str) -> str:
        return str(getattr(self, key))


def make_world(seed: int = 0, n_entities: int = 40) -> list[Entity]:
    rng = random.Random(f"world-{seed}")
    names: set[str] = set()
    while len(names) < n_entities:
        names.add(rng.choice(_C).upper() + rng.choice(_V) + rng.choice(_C))
    return [Entity(n, rng.randint(10, 99), rng.choice(CITIES), rng.choice(COLORS)) for n in sorted(names)]


def _ex(marked: str, inp: str, out: str, task: str, key: dict[str, str]) -> InstructionExample:
    text, spans = parse_markup(marked, task)
    return InstructionExample(text, inp, out, task, spans, f"{task}", dict(key))


def _fmt(word: str, how: str) -> str:
    return {"uppercase": word.upper(), "lowercase": word.lower(), "reversed": word[::-1]}[how]


def _two(rng: random.Random, world: list[Entity]) -> tuple[Entity, Entity]:
    while True:
        a, b = rng.sample(world, 2)
        if a.age != b.age:
            return a, b


def gen_lookup(rng: random.Random, world: list[Entity]) -> InstructionExample:
    e, key = rng.choice(world), rng.choice(("age", "city", "color"))
    return _ex(f"Give the [[{key}]].", e.record(), e.attr(key), "lookup", {"attr": key})


def gen_compare(rng: random.Random, world: list[Entity]) -> InstructionExample:
    a, b = _two(rng, world)
    rel = rng.choice(("older", "younger"))
    ans = max(a, b, key=lambda e: e.age) if rel == "older" else min(a, b, key=lambda e: e.age)
    return _ex(f"Who is [[{rel}]]?", f"{a.name} {a.age}, {b.name} {b.age}", ans.name, "compare", {"rel": rel})


def gen_format(rng: random.Random, world: list[Entity]) -> InstructionExample:
    word = rng.choice((*CITIES, *(e.name for e in world)))
    how = rng.choice(("uppercase", "lowercase", "reversed"))
    return _ex(f"Rewrite [[{how}]].", word, _fmt(word, how), "format", {"how": how})


def gen_pick(rng: random.Random, world: list[Entity]) -> InstructionExample:
    items = rng.sample((*COLORS, *CITIES), 3)
    pos = rng.choice(("first", "second", "last"))
    ans = items[{"first": 0, "second": 1, "last": 2}[pos]]
    return _ex(f"Pick the [[{pos}]] one.", " ".join(items), ans, "pick", {"pos": pos})


def gen_lookup_upper(rng: random.Random, world: list[Entity]) -> InstructionExample:
    e, key = rng.choice(world), rng.choice(("city", "color"))
    how = rng.choice(("uppercase", "lowercase"))
    out = _fmt(e.attr(key), how)
    return _ex(
        f"Give the [[{key}]] in [[{how}]].", e.record(), out, "lookup_upper", {"attr": key, "how": how}
    )


def gen_compare_lookup(rng: random.Random, world: list[Entity]) -> InstructionExample:
    a, b = _two(rng, world)
    rel, key = rng.choice(("older", "younger")), rng.choice(("city", "color"))
    ans = max(a, b, key=lambda e: e.age) if rel == "older" else min(a, b, key=lambda e: e.age)
    return _ex(
        f"Give the [[{key}]] of the [[{rel}]].",
        f"{a.record()}, {b.record()}",
        ans.attr(key),
        "compare_lookup",
        {"attr": key, "rel": rel},
    )


GENERATORS: dict[str, Callable[[random.Random, list[Entity]], InstructionExample]] = {
    "lookup": gen_lookup,
    "compare": gen_compare,
    "format": gen_format,
    "pick": gen_pick,
    "lookup_upper": gen_lookup_upper,
    "compare_lookup": gen_compare_lookup,
}
SEEN_TASKS = ("lookup", "compare", "format", "pick")
HELDOUT_TASKS = ("lookup_upper", "compare_lookup")


def _attr_ok(attr: str, out: str) -> bool:
    if attr == "age":
        return out.isdigit()
    pool = CITIES if attr == "city" else COLORS
    return out.lower() in {w.lower() for w in pool}


def _case_ok(how: str, out: str, word: str | None = None) -> bool:
    if how == "uppercase":
        return out.isupper()
    if how == "lowercase":
        return out.islower()
    return word is not None and out == word[::-1]


def check(ex: InstructionExample, output: str) -> bool:
    """Whether ``output`` satisfies the key-part constraints of a built-in task's example (V-score)."""
    out, m = output.strip(), ex.meta
    if ex.task == "lookup":
        return _attr_ok(m["attr"], out)
    if ex.task in ("compare", "pick"):
        return out == ex.output
    if ex.task == "format":
        return _case_ok(m["how"], out, ex.input)
    if ex.task == "lookup_upper":
        return _attr_ok(m["attr"], out) and _case_ok(m["how"], out)
    if ex.task == "compare_lookup":
        names = [part.split()[0] for part in ex.input.split(", ")]
        ages = [int(part.split()[1]) for part in ex.input.split(", ")]
        want = names[ages.index(max(ages) if m["rel"] == "older" else min(ages))]
        recs = {part.split()[0]: part.split() for part in ex.input.split(", ")}
        idx = 2 if m["attr"] == "city" else 3
        return _attr_ok(m["attr"], out) and out == recs[want][idx]
    raise KeyError(f"no V-score rule for task {ex.task!r}")


def make_task(
    name: str,
    n: int,
    *,
    world: list[Entity],
    seed: int,
    split: str,
    avoid: list[InstructionExample] | None = None,
) -> list[InstructionExample]:
    """``n`` examples of built-in task ``name`` (each ``split`` its own RNG stream); examples whose
    (instruction, input) occurs in ``avoid`` (e.g. the training split) are redrawn."""
    if name not in GENERATORS:
        raise InvalidValueError(f"unknown built-in CIT task {name!r}; known: {', '.join(GENERATORS)}")
    rng = random.Random(f"{name}-{split}-{seed}")
    seen = {(e.instruction, e.input) for e in avoid or []}
    out: list[InstructionExample] = []
    tries = 0
    while len(out) < n:
        ex = GENERATORS[name](rng, world)
        tries += 1
        if (ex.instruction, ex.input) in seen and tries < 50 * n:
            continue
        out.append(replace(ex, source=f"{name}/{split}[{len(out)}]"))
    return out
