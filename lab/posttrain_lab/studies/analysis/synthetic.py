"""A built-in synthetic knowledge setting small enough for a CPU: a generated fact base, pre-training
text about it, MCQ probes over its facts, chat-format instruction data and pre-training-like
restoration text. Everything is a pure function of the config (seeded); no download.

World: ``n_entities`` made-up people, each living in one of ``n_values`` towns ("Bako lives in
Lima."). The entities are split into disjoint roles:

- ``dev``: the few-shot examples of the base-model probe prompt;
- ``exam`` (none by default): entities whose facts are pre-trained but never probed;
- ``pool``: the item pool from which the knowledge-intervention groups are built (``train`` split);
- ``test``: the probe set;
- ``filler``: entities that appear only in the restoration text (so restoring the text pattern does
  not re-teach the probed facts).

The pre-training text states every non-filler fact ("Qx lives in Lima.") and contains solved exam
questions about it in the probe format ("...Answer:B. Oslo"): a model this small does not learn to
answer a question about a fact it has only seen stated (knowledge extraction needs the question
format in pre-training), so the setting's "parametric knowledge" is what the model memorised in both
forms. Knowledge is made partial on purpose: a fraction ``rare_frac`` of the facts is stated once and
asked once, the others ``repeats`` and ``exam_copies`` times, so the base model knows some facts and
not others (the intervention groups need both correctly and wrongly answered questions).

Options: by default every question lists the same ``n_choices`` towns in a fixed order (the first
``n_choices`` of the town list; ``n_values`` = ``n_choices``), so an option letter stands for one town —
the simplest exam a 1 M-parameter character model can learn from text in minutes; ``shuffle_options``
draws and orders the options per question instead (harder).

Instruction data (chat ``messages`` rows) for the forgetting analysis are knowledge-free string tasks
(reverse, upper-case, count, repeat a word): tuning on them moves the model towards the chat format
without touching the facts.
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass, field
from typing import Any

from pydantic import Field

from posttrain.utils.config import StrictModel
from posttrain.utils.errors import InvalidValueError
from posttrain_lab.studies.analysis.probe import MCQ, format_example, header

TOWNS = ("Lima", "Oslo", "Rome", "Kiev", "Bern", "Doha", "Riga", "Baku", "Suva", "Apia", "Male", "Sana")
_CONS = "bdfgklmnprstvz"
_VOWELS = "aeiou"
STATEMENTS = ("{e} lives in {v}.", "The home of {e} is {v}.", "{e} is from {v}.", "In {v} lives {e}.")
QUESTION = "Where does {e} live?"
EXPLANATION = "{e} lives in {v}."
"""Template explanation of an answer (the knowledge-intervention groups' ``explain: template``)."""


class SyntheticConfig(StrictModel):
    """The synthetic world and its pre-training (see the module docstring)."""

    seed: int = 0
    domain: str = "towns"
    n_entities: int = Field(60, ge=20)
    name_length: int = Field(2, ge=2, le=8)
    """Letters per made-up name ("Qx", "Ba", ...): short names are quick to memorise at character level."""
    n_values: int = Field(4, ge=2, le=len(TOWNS))
    n_choices: int = Field(4, ge=2, le=len(TOWNS))
    shuffle_options: bool = False
    n_dev: int = Field(4, ge=0)
    exam_frac: float = Field(0.0, ge=0, le=1)
    pool_frac: float = Field(0.45, ge=0, le=1)
    test_frac: float = Field(0.35, ge=0, le=1)
    """Fractions of the entities (after ``dev``) for exam / pool / test; the rest are ``filler``."""
    exam_copies: int = Field(8, ge=1)
    """Solved exam questions per known (not rare) fact in the pre-training text (rare facts: one)."""
    rare_frac: float = Field(0.4, ge=0, le=1)
    repeats: int = Field(8, ge=1)
    templates: int = Field(1, ge=1, le=4)
    """How many statement templates the fact text uses ("{e} lives in {v}." first)."""
    facts_per_doc: int = Field(8, ge=1)
    mcqs_per_doc: int = Field(2, ge=1)
    shots: int = Field(1, ge=0)
    """Few-shot examples in the base-model probe prompt (and in the pre-training exam documents)."""
    # pre-training (causal LM on all tokens of the text rows, through the SFT trainer)
    model: str = "tiny"
    """Preset whose architecture (and character tokenizer) the base model takes; the sizes below
    override the preset's, when set, to fit a shared CPU."""
    hidden_size: int | None = Field(64, ge=8)
    num_layers: int | None = Field(2, ge=1)
    num_heads: int | None = Field(4, ge=1)
    intermediate_size: int | None = Field(192, ge=8)
    pretrain_steps: int = Field(600, ge=0)
    pretrain_batch_size: int = Field(8, ge=1)
    pretrain_lr: float = Field(1e-2, gt=0)


@dataclass
class SyntheticWorld:
    cfg: SyntheticConfig
    facts: dict[str, str]
    roles: dict[str, list[str]]
    rare: set[str]
    options: dict[str, tuple[str, ...]] = field(default_factory=dict)

    # ------------------------------------------------------------------------------ questions
    def mcq(self, e: str) -> MCQ:
        choices = self.options[e]
        return MCQ(
            QUESTION.format(e=e),
            choices,
            choices.index(self.facts[e]),
            id=e,
            meta={"subject": e, "rare": e in self.rare},
        )

    def mcqs(self, role: str) -> list[MCQ]:
        return [self.mcq(e) for e in self.roles[role]]

    @property
    def dev(self) -> list[MCQ]:
        return self.mcqs("dev")

    # ------------------------------------------------------------------------------------ text
    def _fact_docs(self, entities: list[str], rng: random.Random, *, rare: set[str]) -> list[str]:
        stmts = []
        for e in entities:
            n = 1 if e in rare else self.cfg.repeats
            for _ in range(n):
                stmts.append(rng.choice(STATEMENTS[: self.cfg.templates]).format(e=e, v=self.facts[e]))
        rng.shuffle(stmts)
        k = self.cfg.facts_per_doc
        return [" ".join(stmts[i : i + k]) for i in range(0, len(stmts), k)]

    def _exam_docs(
        self, entities: list[str], rng: random.Random, copies: int, *, rare: set[str]
    ) -> list[str]:
        docs = []
        dev = self.dev
        for c in range(copies):
            qs = [self.mcq(e) for e in entities if c == 0 or e not in rare]
            rng.shuffle(qs)
            k = self.cfg.mcqs_per_doc
            for i in range(0, len(qs), k):
                shots = rng.sample(dev, min(self.cfg.shots, len(dev))) if dev else []
                body = "".join(format_example(q) for q in [*shots, *qs[i : i + k]])
                docs.append(header(self.cfg.domain) + body.rstrip("\n"))
        return docs

    def pretrain_rows(self) -> list[dict[str, str]]:
        """Text rows: statements of the dev/exam/pool/test facts and solved exams about them (a rare
        fact: one statement, one solved question; the others ``repeats`` and ``exam_copies``)."""
        rng = random.Random(self.cfg.seed + 1)
        known = [e for r in ("dev", "exam", "pool", "test") for e in self.roles[r]]
        docs = self._fact_docs(known, rng, rare=self.rare)
        docs += self._exam_docs(known, rng, copies=self.cfg.exam_copies, rare=self.rare)
        rng.shuffle(docs)
        return [{"text": d} for d in docs]

    def restoration_rows(self, n: int | None = None) -> list[dict[str, str]]:
        """Pre-training-like text (fact statements and solved exams) about the ``filler`` entities
        only: it restores the pre-training text pattern without re-stating any probed fact."""
        rng = random.Random(self.cfg.seed + 2)
        filler = self.roles["filler"]
        docs = self._fact_docs(filler, rng, rare=set()) + self._exam_docs(filler, rng, copies=2, rare=set())
        rng.shuffle(docs)
        rows = [{"text": d} for d in docs]
        return rows[:n] if n else rows

    def instruction_rows(self, n: int = 400) -> list[dict[str, Any]]:
        """Knowledge-free chat instructions (``messages`` rows) for the forgetting analysis."""
        rng = random.Random(self.cfg.seed + 3)
        rows = []
        for _ in range(n):
            w = "".join(rng.choice(_CONS + _VOWELS) for _ in range(rng.randint(3, 7)))
            kind = rng.randrange(4)
            if kind == 0:
                q, a = f"Reverse the word {w}.", w[::-1]
            elif kind == 1:
                q, a = f"Write {w} in capitals.", w.upper()
            elif kind == 2:
                q, a = f"How many letters are in {w}?", f"{w} has {len(w)} letters."
            else:
                q, a = f"Repeat {w} twice.", f"{w} {w}"
            rows.append({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]})
        return rows


def _names(n: int, rng: random.Random, length: int) -> list[str]:
    capacity = 26**length
    if n > capacity // 2:
        raise InvalidValueError(
            f"n_entities={n} is too many for names of {length} characters (at most {capacity // 2})"
        )
    out: list[str] = []
    seen: set[str] = set()
    while len(out) < n:
        name = "".join(rng.choice(string.ascii_lowercase) for _ in range(length)).capitalize()
        if name not in seen and name not in TOWNS:
            seen.add(name)
            out.append(name)
    return out


def build_world(cfg: SyntheticConfig | None = None) -> SyntheticWorld:
    cfg = cfg or SyntheticConfig()
    if cfg.n_choices > cfg.n_values:
        raise InvalidValueError(f"n_choices ({cfg.n_choices}) cannot exceed n_values ({cfg.n_values})")
    if cfg.exam_frac + cfg.pool_frac + cfg.test_frac > 1 + 1e-9:
        raise InvalidValueError("exam_frac + pool_frac + test_frac must be at most 1")
    rng = random.Random(cfg.seed)
    towns = TOWNS[: cfg.n_values]
    ents = _names(cfg.n_entities, rng, cfg.name_length)
    facts = {e: rng.choice(towns) for e in ents}
    rest = ents[cfg.n_dev :]
    m = len(rest)
    a = round(cfg.exam_frac * m)
    b = a + round(cfg.pool_frac * m)
    c = b + round(cfg.test_frac * m)
    roles = {
        "dev": ents[: cfg.n_dev],
        "exam": rest[:a],
        "pool": rest[a:b],
        "test": rest[b:c],
        "filler": rest[c:],
    }
    rare = {e for e in (*roles["exam"], *roles["pool"], *roles["test"]) if rng.random() < cfg.rare_frac}
    options: dict[str, tuple[str, ...]] = {}
    for e in ents:
        if cfg.shuffle_options:
            others = [t for t in towns if t != facts[e]]
            ch = [facts[e], *rng.sample(others, cfg.n_choices - 1)]
            rng.shuffle(ch)
            options[e] = tuple(ch)
        else:
            options[e] = towns[: cfg.n_choices]
    # with fixed options and n_choices < n_values, an entity's town may be missing: move it in
    for e in ents:
        if facts[e] not in options[e]:
            facts[e] = rng.choice(options[e])
    return SyntheticWorld(cfg, facts, roles, rare, options)


def base_model(cfg: SyntheticConfig) -> tuple[Any, Any]:
    """The randomly initialised base model (preset ``cfg.model`` with the size overrides) and its
    character tokenizer, deterministic in ``cfg.seed``."""
    import torch
    from transformers import AutoModelForCausalLM

    from posttrain.models import build_char_tokenizer, preset_config

    tokenizer = build_char_tokenizer()
    config = preset_config(cfg.model, tokenizer)
    for key, value in (
        ("hidden_size", cfg.hidden_size),
        ("num_hidden_layers", cfg.num_layers),
        ("num_attention_heads", cfg.num_heads),
        ("num_key_value_heads", cfg.num_heads),
        ("intermediate_size", cfg.intermediate_size),
    ):
        if value is not None:
            setattr(config, key, value)
    if hasattr(config, "head_dim"):
        config.head_dim = config.hidden_size // config.num_attention_heads
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        model = AutoModelForCausalLM.from_config(config)
    gc = model.generation_config
    gc.pad_token_id, gc.eos_token_id, gc.bos_token_id = (
        tokenizer.pad_token_id,
        tokenizer.eos_token_id,
        tokenizer.bos_token_id,
    )
    return model, tokenizer


def pretrain_base(
    world: SyntheticWorld, out_dir: str, *, threads: int | None = None, progress: bool | None = None
) -> str:
    """Pre-train ``cfg.model`` (randomly initialised preset) as a causal LM on the world's text rows
    with the SFT trainer (loss on every token of a text row); returns the saved model directory
    (``<out_dir>/model``). An existing ``<out_dir>/model`` is reused."""
    import json
    from pathlib import Path

    from posttrain.train.sft import SFTConfig, SFTTrainer
    from posttrain.utils.io import atomic_write_json

    cfg = world.cfg
    model_dir = Path(out_dir) / "model"
    stamp = Path(out_dir) / "synthetic.json"
    want = cfg.model_dump(mode="json")
    if (model_dir / "config.json").exists() and stamp.exists():
        have = json.loads(stamp.read_text())
        if have != want:
            changed = sorted(k for k in set(have) | set(want) if have.get(k) != want.get(k))
            raise InvalidValueError(
                f"{out_dir} holds a base model pre-trained for another synthetic config (differs in: "
                f"{', '.join(changed)}); use another directory or delete it"
            )
        return str(model_dir)
    scfg = SFTConfig(
        model={"name": cfg.model, "device": "cpu"},
        steps=cfg.pretrain_steps,
        batch_size=cfg.pretrain_batch_size,
        optimizer={
            "lr": cfg.pretrain_lr,
            "schedule": "cosine",
            "warmup_steps": min(50, cfg.pretrain_steps // 10),
        },
        seed=cfg.seed,
        threads=threads,
        out_dir=str(out_dir),
        checkpoint={"every": 0, "final": False},
        eval={"at_end": False},
        progress=progress,
    )
    model, tokenizer = base_model(cfg)
    with SFTTrainer(scfg, model, tokenizer, rows=world.pretrain_rows()) as tr:
        tr.train(overwrite=True)
    atomic_write_json(stamp, want)
    return str(model_dir)
