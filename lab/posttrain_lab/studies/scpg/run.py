"""DSMT pre-training, SCPG fine-tuning and evaluation on a seq2seq adapter.

Every training stage is the SFT trainer (:class:`posttrain.train.sft.SFTTrainer`) over (input, target)
pairs with a :class:`~posttrain.models.seq2seq.Seq2SeqAdapter`: loss on the target tokens, AdamW and
schedule, checkpoints, run folder, metrics.jsonl and progress are SFT's.

``pretrain`` (authors' ``curriculum_pre_training``): initial model (a T5 preset with a word-level
tokenizer over the corpus, or a local T5 directory) -> step A tokens (``posttrain_lab.studies.scpg.vocab``) ->
stage 1 on label-randomised trees -> step B non-terminal tokens -> stage 2 multi-task -> ``<out>/model``.
Each stage draws ``steps × batch_size`` fresh examples (the authors sample tasks on the fly; one
pass, no example repeats), seeded.

``finetune``: SCPG pairs in one format of :data:`posttrain_lab.studies.scpg.tasks.SCPG_FORMATS`, from a pre-trained
model (``model.name`` = a pretrain run folder or model directory: "full_fine_tune") or from a preset /
vanilla T5 directory that gets the same vocabulary set-up without any training ("from_scratch").

``evaluate``: beam search with the authors' decoding settings, the generated sentence parsed by a
:mod:`~posttrain_lab.studies.scpg.metrics` parser, BLEU-4, TED-R, TED-E, template match (TED-E = 0), bracket F1 of
generated trees; overall, on the hardest pairs (largest source–target TED) and on the few-shot subset.

Defaults are the authors' hyper-parameters (``config/training/tree_tasks/*.yaml``,
``config/training/stage_2/after_tree_*.yaml``, ``configs/para_train/stage_2/*.yaml``), sized for
``t5-base`` on GPUs; ``studies/scpg/scpg-demo-*.yaml`` are CPU-sized run of the tiny preset.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from posttrain.train.config import OptimizerConfig
from posttrain.utils.config import StrictModel, check_choice
from posttrain.utils.errors import InvalidValueError
from posttrain_lab.studies.scpg.tasks import SCPG_FORMATS, TRIPLET_FORMATS, SCPGExample

# ---------------------------------------------------------------------------------------- configs


class SyntheticDataConfig(StrictModel):
    n_train: int = Field(2000, ge=1)
    n_val: int = Field(100, ge=0)
    n_test: int = Field(300, ge=1)
    n_pretrain: int = Field(4000, ge=1)
    """Parses drawn for pre-training (all templates; separate from the pairs)."""
    few_shot_template: str | None = "C"
    few_shot_k: int = Field(16, ge=0)
    seed: int = 0


class DataConfig(StrictModel):
    source: str = "synthetic"
    """``synthetic`` (``posttrain_lab.studies.scpg.data``) or a directory in the SGCP layout (ParaNMT-small, QQP-Pos)."""
    synthetic: SyntheticDataConfig = Field(default_factory=SyntheticDataConfig)
    parse_suffix: str = "-corenlp-opti"
    convention: Literal["sgcp", "dsmt"] = "sgcp"
    """Which val/test file is the target: ``sgcp`` = SGCP's release (``ref.txt`` reference, ``tgt.txt``
    exemplar), ``dsmt`` = the DSMT code's inverted files (``tgt.txt`` target, ``ref.txt`` exemplar)."""


class SCPGModelConfig(StrictModel):
    name: str = "t5-tiny"
    """A T5 preset (``t5-tiny``, ``t5-mini``), a local T5 directory, or a run folder (its ``model/``)."""
    tokenizer: Literal["word", "model"] = "word"
    """For a preset: ``word`` = word-level tokenizer over the corpus; ``model`` = the preset's character
    tokenizer. Directories always use their own tokenizer."""
    dtype: str = "float32"
    device: str = "auto"


class StageConfig(StrictModel):
    steps: int = Field(1000, ge=0)
    batch_size: int = Field(512, ge=1)
    """Sequences per optimizer step (authors: 32 × grad-accum 16)."""
    micro_batch_size: int | None = Field(32, ge=1)
    optimizer: OptimizerConfig = Field(
        default_factory=lambda: OptimizerConfig(lr=5e-5, warmup_steps=1000, schedule="constant")
    )
    max_length: int = Field(300, ge=8)
    """Examples whose input or target exceeds this many tokens are dropped (counted in the summary)."""
    checkpoint_every: int = Field(0, ge=0)
    """SFT checkpoints under ``<stage dir>/checkpoints`` every this many steps (authors: 512); 0 = none."""


def _ft_optimizer() -> OptimizerConfig:
    return OptimizerConfig(lr=6e-5, schedule="cosine", warmup_steps=0)


class PretrainConfig(StrictModel):
    model: SCPGModelConfig = Field(default_factory=SCPGModelConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    stage1: StageConfig = Field(default_factory=StageConfig)
    stage2: StageConfig = Field(default_factory=StageConfig)
    linearize: Literal["bracket", "slash"] = "bracket"
    """Stage-1 linearisation (the authors have one config for each)."""
    nt_init: Literal["node", "unk"] = "node"
    scpg_fraction: float = Field(0.0, ge=0, le=1)
    """Share of stage-2 examples that are SCPG instances (the authors' "scpg" task; share not
    given — proposed design, off by default)."""
    scpg_format: str = "t5_prefix"
    seed: int = 114514
    threads: int | None = Field(None, ge=1)
    out_dir: str = "runs/scpg-pretrain"
    progress: bool | None = None

    @field_validator("scpg_format")
    @classmethod
    def _fmt(cls, v: str) -> str:
        return check_choice("scpg_format", v, list(SCPG_FORMATS))


class FinetuneConfig(StrictModel):
    model: SCPGModelConfig = Field(default_factory=SCPGModelConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    format: str = "t5_prefix"
    steps: int = Field(1000, ge=0)
    batch_size: int = Field(128, ge=1)
    """Authors: 16 × grad-accum 8 for 8 epochs."""
    micro_batch_size: int | None = Field(16, ge=1)
    optimizer: OptimizerConfig = Field(default_factory=_ft_optimizer)
    schedule_factor: float = Field(1.2, ge=1.0)
    """The cosine runs over ``schedule_factor × steps`` (authors: total steps × 1.2)."""
    max_length: int = Field(256, ge=8)
    checkpoint_every: int = Field(0, ge=0)
    nt_init: Literal["node", "unk"] = "node"
    """Step-B initialisation when the model does not have the non-terminal tokens yet (from scratch)."""
    max_train: int | None = Field(None, ge=1)
    seed: int = 1453
    threads: int | None = Field(None, ge=1)
    out_dir: str = "runs/scpg-finetune"
    progress: bool | None = None

    @field_validator("format")
    @classmethod
    def _fmt(cls, v: str) -> str:
        return check_choice("format", v, list(SCPG_FORMATS))


class DecodeConfig(StrictModel):
    num_beams: int = Field(5, ge=1)
    min_length: int = Field(5, ge=0)
    max_length: int | None = Field(None, ge=1)
    """None: 256, or 400 for the triplet formats (authors' settings)."""
    no_repeat_ngram_size: int = Field(3, ge=0)
    length_penalty: float = 1.0
    batch_size: int = Field(32, ge=1)


class EvalConfig(StrictModel):
    model: SCPGModelConfig = Field(default_factory=lambda: SCPGModelConfig(name="runs/scpg-finetune"))
    data: DataConfig = Field(default_factory=DataConfig)
    format: str | None = None
    """None: the format the fine-tuning run used (its config.yaml)."""
    split: Literal["val", "test"] = "test"
    n: int | None = Field(None, ge=1)
    decode: DecodeConfig = Field(default_factory=DecodeConfig)
    parser: str = "grammar"
    ted_height: int | None = Field(None, ge=2)
    metrics: Literal["posttrain", "sgcp"] = "posttrain"
    """``posttrain``: case-sensitive sacrebleu BLEU-4, TED with every node; ``sgcp``: SGCP's evaluation
    script (lowercased multi-bleu BLEU, TED without ``S`` nodes, no pruning)."""
    hardest_fraction: float = Field(0.25, gt=0, le=1)
    out: str | None = None
    """Report folder (eval.json, eval.md); None = ``<model run>/eval-<split>``."""
    threads: int | None = Field(None, ge=1)
    progress: bool | None = None

    @model_validator(mode="after")
    def _sgcp_no_pruning(self) -> EvalConfig:
        if self.metrics == "sgcp" and self.ted_height:
            raise InvalidValueError("ted_height: SGCP's TED has no pruning; leave it unset with metrics=sgcp")
        return self


# ------------------------------------------------------------------------------------------- data
TASK_WORDS = [
    "treeposition",
    "indexing",
    "position:",
    "tree:",
    "tree",
    "forming:",
    "->",
    "node",
    "deleting",
    "node:",
    ",",
    "height",
    "selection",
    "height:",
    "tree",
    "interpreting:",
    "pruned",
    "parse:",
    "completion:",
    "pruning:",
    "constituency",
    "searching",
    "sentence:",
    "discrimination",
    "span:",
    "True",
    "False",
    "pos",
    "tagging:",
    "production",
    "detection:",
    "high",
    "low",
    "difficulty",
    "intra",
    "inter",
    "span:",
    "scpg",
    "source",
    "syntax",
    "template",
    "no-tree-scpg",
    "target",
]


class Corpus:
    """Splits of SCPG examples, the pre-training parses and (synthetic) per-example target templates."""

    def __init__(self, cfg: DataConfig) -> None:
        self.source = cfg.source
        self.templates: dict[str, list[str]] = {}
        self.few_shot_template = ""
        if cfg.source == "synthetic":
            from posttrain_lab.studies.scpg.data import corpus_words, synthetic_corpus

            s = cfg.synthetic
            c = synthetic_corpus(
                n_train=s.n_train,
                n_val=s.n_val,
                n_test=s.n_test,
                n_pretrain=s.n_pretrain,
                few_shot_template=s.few_shot_template,
                few_shot_k=s.few_shot_k,
                seed=s.seed,
            )
            self.splits = {k: [p.example for p in getattr(c, k)] for k in ("train", "val", "test")}
            self.templates = {k: [p.tgt_template for p in getattr(c, k)] for k in ("train", "val", "test")}
            self.few_shot_template = c.few_shot_template
            self.pretrain_trees = c.pretrain_trees
            self.words = corpus_words()
        else:
            from posttrain_lab.studies.scpg.data import load_sgcp_split

            self.splits = {}
            for split in ("train", "val", "test"):
                if (Path(cfg.source) / split).is_dir():
                    self.splits[split] = load_sgcp_split(
                        cfg.source, split, parse_suffix=cfg.parse_suffix, convention=cfg.convention
                    )
            if "train" not in self.splits:
                raise FileNotFoundError(f"{cfg.source}/train: missing (SGCP layout: <dir>/train/src.txt ...)")
            tr = self.splits["train"]
            self.pretrain_trees = [e.src_tree for e in tr] + [e.tgt_tree for e in tr]
            words: dict[str, None] = {}
            for exs in self.splits.values():
                for e in exs:
                    for t in (e.src_tree, e.tgt_tree, e.exemplar_tree):
                        words.update(dict.fromkeys(t.leaves()))
            self.words = list(words)

    def vocabulary(self) -> list[str]:
        return [*TASK_WORDS, *(str(i) for i in range(100)), *self.words]

    def nonterminals(self) -> list[str]:
        from posttrain_lab.studies.scpg.vocab import nonterminal_inventory

        return nonterminal_inventory([*self.pretrain_trees, *(e.tgt_tree for e in self.splits["train"])])


# ------------------------------------------------------------------------------------------ model
def _device(name: str) -> str:
    from posttrain.models.loading import pick_device

    return pick_device() if name == "auto" else name


def init_model(mcfg: SCPGModelConfig, corpus: Corpus, *, seed: int) -> Any:
    """A fresh model (preset or T5 directory) with the step-A tokens added."""
    from posttrain.models.loading import resolve_dtype
    from posttrain.models.seq2seq import (
        T5_PRESETS,
        Seq2SeqAdapter,
        _preset_tokenizer,
        build_t5_preset,
        build_word_tokenizer,
        load_seq2seq,
    )
    from posttrain_lab.studies.scpg.vocab import add_node_tokens

    dev = _device(mcfg.device)
    if mcfg.name in T5_PRESETS:
        tok = build_word_tokenizer(corpus.vocabulary()) if mcfg.tokenizer == "word" else _preset_tokenizer()
        model = build_t5_preset(mcfg.name, tok, seed=seed).to(device=dev, dtype=resolve_dtype(mcfg.dtype))
    else:
        model, tok = load_seq2seq(mcfg.name, dtype=mcfg.dtype, device=dev, seed=seed)
    add_node_tokens(model, tok)
    return Seq2SeqAdapter(model, tok)


def has_nonterminals(adapter: Any, labels: list[str]) -> bool:
    vocab = adapter.tokenizer.get_vocab()
    return all(lab in vocab for lab in labels)


# ---------------------------------------------------------------------------------------- training
def _fit(pairs: list[tuple[str, str]], tokenizer: Any, max_length: int) -> tuple[list[tuple[str, str]], int]:
    keep = []
    for s, t in pairs:
        n_s = len(tokenizer.encode(s, add_special_tokens=False)) + 1
        n_t = len(tokenizer.encode(t, add_special_tokens=False)) + 1
        if n_s <= max_length and n_t <= max_length:
            keep.append((s, t))
    return keep, len(pairs) - len(keep)


def train_pairs(
    adapter: Any,
    pairs: list[tuple[str, str]],
    *,
    out_dir: str | Path,
    steps: int,
    batch_size: int,
    micro_batch_size: int | None,
    optimizer: OptimizerConfig,
    max_length: int,
    seed: int,
    device: str,
    schedule_steps: int | None = None,
    threads: int | None = None,
    progress: bool | None = None,
    name: str = "scpg",
    checkpoint_every: int = 0,
) -> dict[str, Any]:
    """One SFT run of ``adapter`` on (input, target) pairs (module docstring); returns SFT's summary
    plus ``dropped`` (pairs over ``max_length``). ``checkpoint_every`` > 0 writes SFT checkpoints
    (model, AdamW state, data position) every that many steps and at the end; the final model is
    always written to ``<out_dir>/model``."""
    from posttrain.train.config import ModelConfig
    from posttrain.train.sft import SFTConfig, SFTTrainer

    pairs, dropped = _fit(pairs, adapter.tokenizer, max_length)
    if not pairs:
        raise InvalidValueError(f"{name}: every training pair is longer than max_length={max_length} tokens")
    cfg = SFTConfig(
        model=ModelConfig(name=str(Path(out_dir) / "model"), adapter="seq2seq", device=device),
        steps=steps,
        schedule_steps=schedule_steps,
        batch_size=batch_size,
        micro_batch_size=micro_batch_size,
        optimizer=optimizer.model_dump(),
        seed=seed,
        threads=threads,
        out_dir=str(out_dir),
        eval={"every": 0, "at_start": False, "at_end": False},
        checkpoint={"every": checkpoint_every, "final": checkpoint_every > 0},
        progress=progress,
    )
    with SFTTrainer(cfg, adapter=adapter, pairs=pairs) as trainer:
        summary = trainer.train(overwrite=True)
    summary["dropped"] = dropped
    summary["examples"] = len(pairs)
    return summary


def stage_pairs(
    corpus: Corpus, stage: int, n: int, *, seed: int, cfg: PretrainConfig
) -> list[tuple[str, str]]:
    from posttrain_lab.studies.scpg.tasks import stage1_example, stage2_example

    rng = random.Random(seed)
    trees = corpus.pretrain_trees
    scpg = corpus.splits["train"] if cfg.scpg_fraction > 0 else ()
    out: list[tuple[str, str]] = []
    failures = 0
    while len(out) < n:
        t = trees[rng.randrange(len(trees))]
        try:
            if stage == 1:
                pair = stage1_example(t, rng, cfg.linearize)
            else:
                pair = stage2_example(
                    t, rng, scpg=scpg, scpg_fraction=cfg.scpg_fraction, scpg_format=cfg.scpg_format
                )
        except ValueError:  # a task that does not apply to this tree (e.g. no phrase above the POS level)
            pair = ("", "")
        if pair[0].strip() and pair[1].strip():
            out.append(pair)
            continue
        failures += 1
        if failures > 100 + n:
            raise InvalidValueError(
                f"stage {stage}: most pre-training trees give no example (last tree: {t})"
            )
    return out


def pretrain(cfg: PretrainConfig) -> dict[str, Any]:
    """Stage 1 and stage 2 (module docstring); returns a summary (also ``<out>/pretrain.json``)."""
    import torch

    from posttrain.utils.io import atomic_write_json
    from posttrain_lab.studies.scpg.vocab import add_nonterminal_tokens

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    t0 = time.perf_counter()
    out = Path(cfg.out_dir)
    corpus = Corpus(cfg.data)
    adapter = init_model(cfg.model, corpus, seed=cfg.seed)
    dev = _device(cfg.model.device)
    summary: dict[str, Any] = {"model": cfg.model.name, "vocab_after_step_a": len(adapter.tokenizer)}
    for stage, scfg in ((1, cfg.stage1), (2, cfg.stage2)):
        if stage == 2:
            new = add_nonterminal_tokens(
                adapter.model, adapter.tokenizer, corpus.nonterminals(), init=cfg.nt_init, seed=cfg.seed
            )
            summary["nonterminals_added"] = len(new)
        if scfg.steps == 0:
            summary[f"stage{stage}"] = {"steps": 0}
            continue
        pairs = stage_pairs(corpus, stage, scfg.steps * scfg.batch_size, seed=cfg.seed + stage, cfg=cfg)
        s = train_pairs(
            adapter,
            pairs,
            out_dir=out / f"stage{stage}",
            steps=scfg.steps,
            batch_size=scfg.batch_size,
            micro_batch_size=scfg.micro_batch_size,
            optimizer=scfg.optimizer,
            max_length=scfg.max_length,
            seed=cfg.seed,
            device=dev,
            threads=cfg.threads,
            progress=cfg.progress,
            name=f"stage {stage}",
            checkpoint_every=scfg.checkpoint_every,
        )
        summary[f"stage{stage}"] = {
            "steps": s["steps"],
            "loss": s["last"].get("loss"),
            "wall_s": s["wall_s"],
            "dropped": s["dropped"],
        }
    adapter.save(out / "model")
    summary["model_dir"] = str(out / "model")
    summary["wall_s"] = time.perf_counter() - t0
    atomic_write_json(out / "pretrain.json", summary)
    from posttrain.utils.io import atomic_write_text

    atomic_write_text(out / "pretrain-config.json", json.dumps(cfg.model_dump(mode="json"), indent=2) + "\n")
    return summary


def load_for_finetune(cfg: FinetuneConfig, corpus: Corpus) -> tuple[Any, str]:
    """(adapter with step-A and step-B tokens, "full_fine_tune" | "from_scratch")."""
    from posttrain.models.seq2seq import T5_PRESETS, Seq2SeqAdapter, load_seq2seq
    from posttrain_lab.studies.scpg.vocab import add_nonterminal_tokens

    nts = corpus.nonterminals()
    if cfg.model.name in T5_PRESETS:
        adapter = init_model(cfg.model, corpus, seed=cfg.seed)
        mode = "from_scratch"
    else:
        model, tok = load_seq2seq(cfg.model.name, dtype=cfg.model.dtype, device=_device(cfg.model.device))
        adapter = Seq2SeqAdapter(model, tok)
        mode = "full_fine_tune" if "<node_0>" in tok.get_vocab() else "from_scratch"
        if mode == "from_scratch":
            from posttrain_lab.studies.scpg.vocab import add_node_tokens

            add_node_tokens(adapter.model, adapter.tokenizer)
    if not has_nonterminals(adapter, nts):
        add_nonterminal_tokens(adapter.model, adapter.tokenizer, nts, init=cfg.nt_init, seed=cfg.seed)
    return adapter, mode


def finetune(cfg: FinetuneConfig) -> dict[str, Any]:
    import torch

    from posttrain.utils.io import atomic_write_json, atomic_write_text
    from posttrain_lab.studies.scpg.tasks import format_scpg

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    t0 = time.perf_counter()
    corpus = Corpus(cfg.data)
    adapter, mode = load_for_finetune(cfg, corpus)
    pairs = [format_scpg(e, cfg.format) for e in corpus.splits["train"][: cfg.max_train]]
    s = train_pairs(
        adapter,
        pairs,
        out_dir=cfg.out_dir,
        steps=cfg.steps,
        schedule_steps=max(1, round(cfg.steps * cfg.schedule_factor)),
        batch_size=cfg.batch_size,
        micro_batch_size=cfg.micro_batch_size,
        optimizer=cfg.optimizer,
        max_length=cfg.max_length,
        seed=cfg.seed,
        device=_device(cfg.model.device),
        threads=cfg.threads,
        progress=cfg.progress,
        name="finetune",
        checkpoint_every=cfg.checkpoint_every,
    )
    summary = {
        "mode": mode,
        "init": cfg.model.name,
        "format": cfg.format,
        "steps": s["steps"],
        "loss": s["last"].get("loss"),
        "examples": s["examples"],
        "dropped": s["dropped"],
        "model_dir": s.get("model_dir"),
        "wall_s": time.perf_counter() - t0,
    }
    atomic_write_json(Path(cfg.out_dir) / "finetune.json", summary)
    atomic_write_text(Path(cfg.out_dir) / "scpg.json", json.dumps({"format": cfg.format}) + "\n")
    return summary


# -------------------------------------------------------------------------------------- evaluation
def _gold_tree_text(ex: SCPGExample, fmt: str) -> str | None:
    from posttrain_lab.studies.scpg.tasks import format_scpg, split_scpg_output

    return split_scpg_output(format_scpg(ex, fmt)[1], fmt)[1]


def score(
    examples: list[SCPGExample],
    outputs: list[str],
    fmt: str,
    parser: Any,
    *,
    ted_height: int | None = None,
    metrics: str = "posttrain",
) -> list[dict[str, Any]]:
    """Per-example records: hypothesis, parse, TED-R, TED-E, source–target TED, tree texts (TEDs in
    the ``metrics`` mode)."""
    from posttrain_lab.studies.scpg.metrics import flat_tree, ted
    from posttrain_lab.studies.scpg.tasks import split_scpg_output

    rows = []
    for ex, out in zip(examples, outputs, strict=True):
        sent, tree_text = split_scpg_output(out, fmt)
        parsed = parser.parse(sent) if sent else None
        hyp_tree = parsed if parsed is not None else flat_tree(sent)
        rows.append(
            {
                "src": ex.src,
                "exemplar": ex.exemplar,
                "reference": ex.tgt,
                "output": out,
                "hypothesis": sent,
                "parsed": parsed is not None,
                "ted_r": ted(hyp_tree, ex.tgt_tree, height=ted_height, mode=metrics),
                "ted_e": ted(hyp_tree, ex.exemplar_tree, height=ted_height, mode=metrics),
                "difficulty": ted(ex.src_tree, ex.tgt_tree, height=ted_height, mode=metrics),
                "tree_pred": tree_text,
                "tree_gold": _gold_tree_text(ex, fmt),
            }
        )
    return rows


def aggregate(rows: list[dict[str, Any]], metrics: str = "posttrain") -> dict[str, Any]:
    from posttrain_lab.studies.scpg.metrics import bleu4, bracket_prf

    if not rows:
        return {"n": 0}
    n = len(rows)
    out: dict[str, Any] = {
        "n": n,
        "bleu4": bleu4([r["hypothesis"] for r in rows], [r["reference"] for r in rows], mode=metrics),
        "ted_r": sum(r["ted_r"] for r in rows) / n,
        "ted_e": sum(r["ted_e"] for r in rows) / n,
        "template_match": sum(r["ted_e"] == 0 for r in rows) / n,
        "exact": sum(r["hypothesis"] == r["reference"] for r in rows) / n,
        "parsed": sum(r["parsed"] for r in rows) / n,
    }
    if rows[0]["tree_gold"] is not None:
        prf = bracket_prf([r["tree_pred"] for r in rows], [r["tree_gold"] for r in rows])
        out["tree_f1"] = prf["f1"]
    return out


def _format_of(model_name: str) -> str | None:
    p = Path(model_name)
    for d in (p, p.parent):
        f = d / "scpg.json"
        if f.is_file():
            return json.loads(f.read_text(encoding="utf-8")).get("format")
    return None


def evaluate(cfg: EvalConfig) -> dict[str, Any]:
    """Generate and score (module docstring); writes ``eval.json`` and ``eval.md`` to the report folder."""
    import torch

    from posttrain.models.seq2seq import Seq2SeqAdapter, load_seq2seq
    from posttrain.utils.io import atomic_write_json, atomic_write_text
    from posttrain.utils.progress import progress_bar
    from posttrain_lab.studies.scpg.metrics import get_parser

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    fmt = cfg.format or _format_of(cfg.model.name)
    if fmt is None:
        raise InvalidValueError(
            f"eval: {cfg.model.name!r} has no scpg.json naming its format (not a `posttrain scpg finetune` "
            "run folder); set format="
        )
    check_choice("format", fmt, list(SCPG_FORMATS))
    t0 = time.perf_counter()
    corpus = Corpus(cfg.data)
    if cfg.split not in corpus.splits:
        raise InvalidValueError(f"eval: the data has no {cfg.split!r} split")
    examples = corpus.splits[cfg.split][: cfg.n]
    templates = corpus.templates.get(cfg.split, [])[: cfg.n]
    model, tok = load_seq2seq(cfg.model.name, dtype=cfg.model.dtype, device=_device(cfg.model.device))
    adapter = Seq2SeqAdapter(model, tok)
    parser = get_parser(cfg.parser)
    from posttrain_lab.studies.scpg.tasks import format_scpg

    d = cfg.decode
    max_len = d.max_length or (400 if fmt in TRIPLET_FORMATS else 256)
    inputs = [format_scpg(e, fmt)[0] for e in examples]
    outputs: list[str] = []
    with progress_bar("scpg eval", total=len(inputs), enabled=cfg.progress) as bar:
        for s in range(0, len(inputs), d.batch_size):
            outputs += adapter.beam_search(
                inputs[s : s + d.batch_size],
                num_beams=d.num_beams,
                min_length=d.min_length,
                max_length=max_len,
                no_repeat_ngram_size=d.no_repeat_ngram_size,
                length_penalty=d.length_penalty,
                batch_size=d.batch_size,
            )
            bar.advance(len(inputs[s : s + d.batch_size]))
    rows = score(examples, outputs, fmt, parser, ted_height=cfg.ted_height, metrics=cfg.metrics)
    k = max(1, round(cfg.hardest_fraction * len(rows)))
    hardest = sorted(rows, key=lambda r: -r["difficulty"])[:k]
    subsets = {"overall": aggregate(rows, cfg.metrics), "hardest": aggregate(hardest, cfg.metrics)}
    if corpus.few_shot_template and templates:
        subsets["few_shot"] = aggregate(
            [r for r, t in zip(rows, templates, strict=True) if t == corpus.few_shot_template], cfg.metrics
        )
    report = {
        "model": cfg.model.name,
        "format": fmt,
        "split": cfg.split,
        "parser": cfg.parser,
        "metrics": cfg.metrics,
        "decode": d.model_dump() | {"max_length": max_len},
        "hardest_fraction": cfg.hardest_fraction,
        "few_shot_template": corpus.few_shot_template or None,
        "subsets": subsets,
        "wall_s": time.perf_counter() - t0,
        "samples": rows[:20],
    }
    out = Path(cfg.out) if cfg.out else _default_eval_dir(cfg.model.name, cfg.split)
    atomic_write_json(out / "eval.json", report)
    atomic_write_text(out / "eval.md", report_markdown(report))
    report["out"] = str(out)
    return report


def _default_eval_dir(model_name: str, split: str) -> Path:
    p = Path(model_name)
    return (p.parent if p.name == "model" else p) / f"eval-{split}"


METRIC_COLUMNS = ("n", "bleu4", "ted_r", "ted_e", "template_match", "exact", "parsed", "tree_f1")


def report_rows(report: dict[str, Any]) -> list[list[Any]]:
    return [[name, *(m.get(c) for c in METRIC_COLUMNS)] for name, m in report["subsets"].items()]


def report_markdown(report: dict[str, Any]) -> str:
    from posttrain.utils.tables import markdown_table

    head = f"# SCPG evaluation\n\nmodel `{report['model']}`, format `{report['format']}`, split `{report['split']}`, parser `{report['parser']}`, metrics `{report.get('metrics', 'posttrain')}`\n\n"
    return head + markdown_table(["subset", *METRIC_COLUMNS], report_rows(report), floatfmt=".2f")
