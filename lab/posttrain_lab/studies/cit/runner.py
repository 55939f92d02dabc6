"""Task-stream runner: train tasks 1..T in order with the SFT trainer, evaluate every seen and held-out
task after each stage, resume per stage; compares methods (sequential, uniform replay, RGD-R,
KPIG-style) at equal compute (same steps and batch size per stage) and equal replay budget.

Run folder ``<out_dir>/<method>/seed<k>/``: ``stage_00.json`` (evaluation before any training),
``stage_XX.json`` + ``stage_XX/model`` after training task XX (accuracy and V-check row over all tasks,
replay allocation, memory with its learning-time IG and perplexity, last training metrics, wall
time), then ``summary.json`` (accuracy matrix, :func:`~posttrain_lab.studies.cit.metrics.cl_metrics`, P- and
V-scores). A rerun skips finished stages and continues from the last saved model. With
``eval.p_score_endpoint`` the P-score's held-out rewrites are asked once per study and kept in
``<out_dir>/p_score_rewrites.json``; a method's ``diversify`` endpoint rewrites only training rows.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from posttrain.train.sft import SFTConfig
from posttrain.utils.config import StrictModel
from posttrain.utils.errors import InvalidValueError
from posttrain_lab.studies.cit.data import (
    DEFAULT_MASK,
    DEFAULT_PROMPT_FORMAT,
    CITDataError,
    InstructionExample,
    encode_instruction,
    prompt_text,
    read_instruction_file,
)

SFT_DEFAULTS: dict[str, Any] = {
    "model": {"name": "tiny"},
    "steps": 150,
    "batch_size": 16,
    "optimizer": {"lr": 3e-3},
    "eval": {"at_end": False},
    "checkpoint": {"final": False},
    "save": False,
    "progress": False,
}
"""Per-stage SFT settings of a CIT run (any ``SFTConfig`` key can be overridden under ``sft.``)."""


class StreamConfig(StrictModel):
    source: str = "builtin"
    """``builtin`` (the generated entity world, :mod:`posttrain_lab.studies.cit.world`) or a JSONL training file
    of instruction/input/output/task rows (then ``test_data`` is required)."""
    test_data: str | None = None
    tasks: list[str] = Field(default_factory=lambda: ["lookup", "compare", "format", "pick"])
    """Training order."""
    heldout: list[str] = Field(default_factory=lambda: ["lookup_upper", "compare_lookup"])
    n_train: int = Field(200, ge=1)
    n_test: int = Field(50, ge=1)
    world_seed: int = 0
    n_entities: int = Field(40, ge=4)

    @model_validator(mode="after")
    def _check(self) -> StreamConfig:
        if self.source != "builtin" and self.test_data is None:
            raise InvalidValueError(
                "stream.test_data: a JSONL stream (stream.source=<file>) needs a test file"
            )
        if not self.tasks:
            raise InvalidValueError("stream.tasks: at least one task")
        if set(self.tasks) & set(self.heldout):
            raise InvalidValueError("stream.heldout: held-out tasks must not be training tasks")
        return self


class ReplayConfig(StrictModel):
    kind: Literal["none", "uniform", "rgd-r", "kpig"] = "none"
    ratio: float = Field(0.2, ge=0)
    """Replay samples per stage = round(ratio x current-task training rows), split over old tasks."""
    memory_size: int = Field(64, ge=1)
    """Samples kept per finished task (a seeded random subset of its training rows)."""
    select: Literal["random", "largest_drop"] = "random"
    """Which memory samples fill a task's budget: random, or the largest per-sample IG drop (kpig)."""


class HingeConfig(StrictModel):
    """KPIG-style hinge (proposed design): L = L_NLL + lam · mean max(0, gamma − IG)."""

    enabled: bool = False
    lam: float = Field(0.1, ge=0)
    gamma: float = 0.05
    """nats per response token."""
    masked_branch_grad: bool = False


class DiversifyConfig(StrictModel):
    ratio: float = Field(0.0, ge=0, le=1)
    """Fraction of the current task's training rows whose instruction is rewritten (same row count)."""
    templates: list[str] = Field(
        default_factory=lambda: ["concretizing", "reasoning", "constraint", "breadth"]
    )
    base_url: str | None = None
    """OpenAI-compatible endpoint for the TRAINING rewrites (None: offline rules). It never writes the
    P-score's held-out rewrites (``eval.p_score_endpoint`` does, for every method alike)."""
    model: str | None = None
    api_key_env: str | None = None


class MethodConfig(StrictModel):
    name: str
    replay: ReplayConfig = Field(default_factory=ReplayConfig)
    hinge: HingeConfig = Field(default_factory=HingeConfig)
    diversify: DiversifyConfig = Field(default_factory=DiversifyConfig)


METHOD_PRESETS: dict[str, dict[str, Any]] = {
    "sequential": {},
    "uniform": {"replay": {"kind": "uniform"}},
    "rgd-r": {"replay": {"kind": "rgd-r"}},
    "kpig": {
        "replay": {"kind": "kpig", "select": "largest_drop"},
        "hinge": {"enabled": True},
        "diversify": {"ratio": 0.25},
    },
}
"""Built-in methods (``methods: [sequential, uniform, rgd-r, kpig]``); ``kpig`` is KPIG-style
(proposed design): IG-driven replay, the hinge objective and instruction diversification."""


class RewriteEndpointConfig(StrictModel):
    base_url: str
    model: str
    api_key_env: str | None = None
    seed: int = 0
    """Seed of the held-out rewrite requests (mixed with the split and the template)."""


class CITEvalConfig(StrictModel):
    max_new_tokens: int = Field(8, ge=1)
    batch_size: int = Field(128, ge=1)
    p_score: bool = True
    """Evaluate held-out tasks under the four rewrites after the last stage (P-score)."""
    p_score_endpoint: RewriteEndpointConfig | None = None
    """Where the P-score's held-out rewrites come from (posttrain's design): None (default) the offline
    held-out rules; else this OpenAI-compatible endpoint, asked with the held-out prompt (not the
    training rewrites' prompt) and its own seeds, once per study (``<out_dir>/p_score_rewrites.json``)
    so every method and seed is scored on the same rows. A method's ``diversify`` endpoint rewrites
    only its training rows."""


class CITConfig(StrictModel):
    sft: SFTConfig = Field(default_factory=lambda: SFTConfig(**SFT_DEFAULTS))
    stream: StreamConfig = Field(default_factory=StreamConfig)
    methods: list[MethodConfig] = Field(
        default_factory=lambda: [MethodConfig(name=n, **METHOD_PRESETS[n]) for n in METHOD_PRESETS]
    )
    seeds: list[int] = Field(default_factory=lambda: [0])
    prompt_format: str = DEFAULT_PROMPT_FORMAT
    mask: str = DEFAULT_MASK
    """String replacing each key part in ``I^m`` ("" deletes it)."""
    ig_batch_size: int = Field(64, ge=1)
    eval: CITEvalConfig = Field(default_factory=CITEvalConfig)
    out_dir: str = "runs/cit"

    @model_validator(mode="before")
    @classmethod
    def _defaults(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        from posttrain.utils.config import _deep_merge

        data = dict(data)
        if not isinstance(data.get("sft"), SFTConfig):
            data["sft"] = _deep_merge(SFT_DEFAULTS, data.get("sft") or {})
        if "methods" in data:
            out = []
            for m in data["methods"] or []:
                if isinstance(m, str):
                    if m not in METHOD_PRESETS:
                        raise InvalidValueError(
                            f"methods: unknown method {m!r}; built-in: {', '.join(METHOD_PRESETS)} "
                            "(or give {name, replay, hinge, diversify})"
                        )
                    m = {"name": m, **METHOD_PRESETS[m]}
                out.append(m)
            data["methods"] = out
        return data

    @model_validator(mode="after")
    def _check(self) -> CITConfig:
        if self.sft.task.prompt_template != "{prompt}":
            raise InvalidValueError(
                "sft.task.prompt_template: CIT renders prompts with prompt_format; leave it '{prompt}'"
            )
        names = [m.name for m in self.methods]
        if len(set(names)) != len(names) or not names:
            raise InvalidValueError(f"methods: names must be unique and at least one, got {names}")
        return self


# ------------------------------------------------------------------------------------- stream
def load_stream(
    cfg: CITConfig,
) -> tuple[dict[str, list[InstructionExample]], dict[str, list[InstructionExample]]]:
    """(train rows per training task, test rows per task incl. held-out)."""
    s = cfg.stream
    if s.source == "builtin":
        from posttrain_lab.studies.cit.world import make_task, make_world

        world = make_world(s.world_seed, s.n_entities)
        train = {t: make_task(t, s.n_train, world=world, seed=s.world_seed, split="train") for t in s.tasks}
        test = {
            t: make_task(t, s.n_test, world=world, seed=s.world_seed, split="test", avoid=train.get(t))
            for t in [*s.tasks, *s.heldout]
        }
        return train, test
    rows, trows = read_instruction_file(s.source), read_instruction_file(s.test_data or "")
    train = {t: [r for r in rows if r.task == t][: s.n_train] for t in s.tasks}
    test = {t: [r for r in trows if r.task == t][: s.n_test] for t in [*s.tasks, *s.heldout]}
    for t, v in [*train.items(), *test.items()]:
        if not v:
            raise CITDataError(f"task {t!r}: no rows in {s.source if t in train else s.test_data}")
    return train, test


# ---------------------------------------------------------------------------------- evaluation
def generate_outputs(lm: Any, cfg: CITConfig, examples: list[InstructionExample]) -> list[str]:
    """Greedy outputs (decoded, stripped) for ``examples``."""
    import torch

    from posttrain.rollout import PromptFormatter, SamplingParams, generate_completions

    fmt = PromptFormatter(lm.tokenizer, chat=cfg.sft.task.chat_template)
    params = SamplingParams(temperature=0.0, max_new_tokens=cfg.eval.max_new_tokens)
    outs: list[str] = []
    was = lm.model.training
    lm.model.eval()
    try:
        with torch.no_grad():
            for s in range(0, len(examples), cfg.eval.batch_size):
                chunk = examples[s : s + cfg.eval.batch_size]
                batch = generate_completions(
                    lm, [fmt.encode(prompt_text(e, cfg.prompt_format)) for e in chunk], params
                )
                for row, m in zip(batch.completion_ids, batch.completion_mask, strict=True):
                    ids = [int(i) for i, k in zip(row, m, strict=True) if k]
                    outs.append(lm.tokenizer.decode(ids, skip_special_tokens=True).strip())
    finally:
        lm.model.train(was)
    return outs


def evaluate_tasks(
    lm: Any, cfg: CITConfig, test: dict[str, list[InstructionExample]]
) -> dict[str, dict[str, float]]:
    """``{task: {"acc", "v"}}``: exact-match accuracy and (built-in stream) V-check rate."""
    from posttrain_lab.studies.cit.metrics import v_score
    from posttrain_lab.studies.cit.world import GENERATORS, check

    res = {}
    for task, exs in test.items():
        outs = generate_outputs(lm, cfg, exs)
        acc = sum(o == e.output.strip() for o, e in zip(outs, exs, strict=True)) / len(exs)
        row: dict[str, float] = {"acc": acc}
        if task in GENERATORS and cfg.stream.source == "builtin":
            row["v"] = v_score([check(e, o) for o, e in zip(outs, exs, strict=True)])
        res[task] = row
    return res


# ------------------------------------------------------------------------------------- runner
def _write(path: Path, obj: Any) -> None:
    from posttrain.utils.io import atomic_write_json

    atomic_write_json(path, obj)


class StreamRun:
    """One (method, seed) pass over the stream; ``run()`` resumes from the last finished stage."""

    def __init__(
        self, cfg: CITConfig, method: MethodConfig, seed: int, data: tuple[dict, dict] | None = None
    ) -> None:
        self.cfg, self.method, self.seed = cfg, method, seed
        self.dir = Path(cfg.out_dir) / method.name / f"seed{seed}"
        self.train, self.test = data or load_stream(cfg)
        self.tasks = list(cfg.stream.tasks)
        self.lm: Any = None
        self.rewriter: Any = None
        d = method.diversify
        if d.base_url and d.model:
            from posttrain_lab.studies.cit.diversify import EndpointRewriter

            self.rewriter = EndpointRewriter(d.base_url, d.model, api_key_env=d.api_key_env, seed=seed)

    # ---- helpers
    def _encode(self, exs: list[InstructionExample]) -> list[Any]:
        return [
            encode_instruction(
                e,
                self.lm.tokenizer,
                prompt_format=self.cfg.prompt_format,
                chat=self.cfg.sft.task.chat_template,
                mask=self.cfg.mask,
            )
            for e in exs
        ]

    def _load(self, spec: str) -> None:
        from posttrain.models import load_adapter

        m = self.cfg.sft.model
        self.lm = load_adapter(spec, kind=m.adapter, dtype=m.dtype, device=m.device, seed=self.seed)

    def _stage_path(self, k: int) -> Path:
        return self.dir / f"stage_{k:02d}.json"

    def _memory_scores(self, rows: list[InstructionExample]) -> tuple[list[float], float]:
        from posttrain_lab.studies.cit.kpig import information_gain, response_perplexity

        enc = self._encode(rows)
        ig = information_gain(self.lm.model, self.lm.tokenizer, enc, batch_size=self.cfg.ig_batch_size)
        ppl = response_perplexity(self.lm.model, self.lm.tokenizer, enc, batch_size=self.cfg.ig_batch_size)
        return [float(x) for x in ig], ppl

    def _replay(
        self, k: int, memory: dict[str, dict[str, Any]]
    ) -> tuple[list[InstructionExample], dict[str, Any]]:
        """Replay rows for stage k (1-based) and a record of the allocation."""
        from posttrain_lab.studies.cit.kpig import kpig_allocation, rgd_allocation, uniform_allocation

        r = self.method.replay
        old = [t for t in self.tasks[: k - 1] if t in memory]
        if r.kind == "none" or not old:
            return [], {"budget": 0}
        budget = round(r.ratio * len(self.train[self.tasks[k - 1]]))
        caps = {t: len(memory[t]["idx"]) for t in old}
        rows = {t: [self.train[t][i] for i in memory[t]["idx"]] for t in old}
        now: dict[str, Any] = {}
        if r.kind in ("kpig", "rgd-r") or r.select == "largest_drop":
            for t in old:
                ig, ppl = self._memory_scores(rows[t])
                now[t] = {"ig": ig, "ppl": ppl}
        if r.kind == "uniform":
            alloc = uniform_allocation(old, budget, caps)
        elif r.kind == "kpig":
            ig_l = {t: sum(memory[t]["ig"]) / len(memory[t]["ig"]) for t in old}
            ig_n = {t: sum(now[t]["ig"]) / len(now[t]["ig"]) for t in old}
            alloc = kpig_allocation(ig_l, ig_n, budget, caps)
        else:
            alloc = rgd_allocation(
                {t: memory[t]["ppl"] for t in old}, {t: now[t]["ppl"] for t in old}, budget, caps
            )
        rng = random.Random(f"replay-{self.seed}-{k}")
        out: list[InstructionExample] = []
        for t in old:
            n = alloc[t]
            if r.select == "largest_drop":
                drop = [a - b for a, b in zip(memory[t]["ig"], now[t]["ig"], strict=True)]
                order = sorted(range(len(drop)), key=lambda i: (-drop[i], i))
            else:
                order = rng.sample(range(len(rows[t])), len(rows[t]))
            out += [rows[t][i] for i in order[:n]]
        rec = {
            "budget": budget,
            "alloc": alloc,
            "ig_now": {t: sum(v["ig"]) / len(v["ig"]) for t, v in now.items()},
            "ppl_now": {t: v["ppl"] for t, v in now.items()},
        }
        return out, rec

    def _diversified(self, k: int, rows: list[InstructionExample]) -> list[InstructionExample]:
        from posttrain_lab.studies.cit.diversify import diversify
        from posttrain_lab.studies.cit.world import CONCRETE

        d = self.method.diversify
        n = round(d.ratio * len(rows))
        if n == 0:
            return rows
        rng = random.Random(f"diversify-{self.seed}-{k}")
        pick = sorted(rng.sample(range(len(rows)), n))
        tmpl = [d.templates[rng.randrange(len(d.templates))] for _ in pick]
        out = list(rows)
        for t in set(tmpl):
            sel = [i for i, tt in zip(pick, tmpl, strict=True) if tt == t]
            new = diversify(
                [rows[i] for i in sel],
                [t],
                concrete=CONCRETE,
                rewriter=self.rewriter,
                seed=f"{self.seed}-{k}",
            )[t]
            for i, ex in zip(sel, new, strict=True):
                out[i] = ex
        return out

    # ---- stages
    def _eval_record(self) -> dict[str, Any]:
        return evaluate_tasks(self.lm, self.cfg, self.test)

    def _train_stage(self, k: int, memory: dict[str, dict[str, Any]]) -> dict[str, Any]:
        from posttrain.train.sft import SFTTrainer
        from posttrain_lab.studies.cit.kpig import HingeLoss

        task = self.tasks[k - 1]
        cur = self._diversified(k, self.train[task])
        replay, rec = self._replay(k, memory)
        pool = cur + replay
        enc = self._encode(pool)
        pairs = [(prompt_text(e, self.cfg.prompt_format), e.output) for e in pool]
        h = self.method.hinge
        hook = None
        if h.enabled:
            masked = [e.sft_example(masked=True) if any(e.key_mask) else None for e in enc]
            hook = HingeLoss(masked, lam=h.lam, gamma=h.gamma, masked_branch_grad=h.masked_branch_grad)
        scfg = self.cfg.sft.model_copy(update={"seed": self.seed * 1000 + k, "save": False})
        trainer = SFTTrainer(scfg, adapter=self.lm, pairs=pairs, extra_loss=hook)
        for a, b in zip(trainer.examples, enc, strict=True):  # SFT encodes exactly as the CIT encoder
            if a.input_ids != b.prompt_ids + b.response_ids:
                raise CITDataError(
                    f"{b.source}: SFT and CIT encodings differ (prompt template / chat settings?)"
                )
        summary = trainer.train()
        trainer.close()
        rows = self.train[task]
        rng = random.Random(f"memory-{self.seed}-{task}")
        idx = sorted(rng.sample(range(len(rows)), min(self.method.replay.memory_size, len(rows))))
        mem: dict[str, Any] = {"idx": idx}
        if self.method.replay.kind != "none":
            ig, ppl = self._memory_scores([rows[i] for i in idx])
            mem.update(ig=ig, ppl=ppl)
        return {
            "task": task,
            "pool": {
                "current": len(cur),
                "replay": len(replay),
                "diversified": sum(1 for a, b in zip(cur, self.train[task], strict=True) if a is not b),
            },
            "replay": rec,
            "memory": mem,
            "train": {
                "steps": summary.get("steps"),
                "wall_s": summary.get("wall_s"),
                "last": summary.get("last"),
            },
        }

    def run(self, progress: Any = None) -> dict[str, Any]:
        """All stages (skipping those already saved), then ``summary.json``."""
        self.dir.mkdir(parents=True, exist_ok=True)
        t_all = time.perf_counter()
        done = [k for k in range(len(self.tasks) + 1) if self._stage_path(k).exists()]
        last = -1
        for k in range(len(self.tasks) + 1):
            if k not in done:
                break
            last = k
        records: dict[int, dict[str, Any]] = {
            k: json.loads(self._stage_path(k).read_text()) for k in range(last + 1)
        }
        if last >= 1:
            self._load(str(self.dir / f"stage_{last:02d}" / "model"))
        else:
            self._load(self.cfg.sft.model.name)
        memory = {r["task"]: r["memory"] for k, r in records.items() if k >= 1}
        for k in range(last + 1, len(self.tasks) + 1):
            t0 = time.perf_counter()
            rec: dict[str, Any] = {"stage": k}
            if k >= 1:
                rec.update(self._train_stage(k, memory))
                memory[rec["task"]] = rec["memory"]
            rec["eval"] = self._eval_record()
            rec["wall_s"] = time.perf_counter() - t0
            if k >= 1:
                self.lm.save(self.dir / f"stage_{k:02d}" / "model")
            _write(self._stage_path(k), rec)
            records[k] = rec
            if progress is not None:
                progress(self.method.name, self.seed, k, rec)
        summary = self._summary(records)
        summary["wall_s_this_call"] = time.perf_counter() - t_all
        _write(self.dir / "summary.json", summary)
        return summary

    def _summary(self, records: dict[int, dict[str, Any]]) -> dict[str, Any]:
        from posttrain_lab.studies.cit.metrics import cl_metrics, p_score

        tasks, held = self.tasks, list(self.cfg.stream.heldout)
        acc = [[records[i + 1]["eval"][t]["acc"] for t in tasks] for i in range(len(tasks))]
        acc_init = [records[0]["eval"][t]["acc"] for t in tasks]
        out: dict[str, Any] = {
            "method": self.method.model_dump(mode="json"),
            "seed": self.seed,
            "tasks": tasks,
            "heldout": held,
            "acc": acc,
            "acc_init": acc_init,
            "heldout_acc": [[records[i]["eval"][t]["acc"] for t in held] for i in range(len(tasks) + 1)],
            "metrics": cl_metrics(acc, acc_init),
            "wall_s_stages": sum(float(r["wall_s"]) for r in records.values()),
        }
        final = records[len(tasks)]["eval"]
        if held:
            out["heldout_final"] = sum(final[t]["acc"] for t in held) / len(held)
        vs = [final[t]["v"] for t in [*tasks, *held] if "v" in final[t]]
        if vs:
            out["v_score"] = float(sum(vs) / len(vs))  # mean over tasks of each task's V rate
        if held and self.cfg.eval.p_score:
            p_path = self.dir / "p_score.json"
            rec = json.loads(p_path.read_text()) if p_path.exists() else {}
            # recomputed when missing, written before held-out rules existed, or from another source
            if rec.get("rules") != "heldout" or rec.get("source", self._legacy_p_source()) != self.p_source():
                rec = {
                    "rules": "heldout",
                    "source": self.p_source(),
                    "by_rewrite": self._p_accuracy("heldout"),
                    "by_rewrite_train_rules": self._p_accuracy("train"),
                }
                _write(p_path, rec)
            out["p_by_rewrite"] = rec["by_rewrite"]
            out["p_score"] = p_score(rec["by_rewrite"])
            out["p_score_train_rules"] = p_score(rec["by_rewrite_train_rules"])
        return out

    def p_source(self) -> dict[str, Any]:
        """Where the P-score's held-out rewrites come from (recorded in ``p_score.json``)."""
        e = self.cfg.eval.p_score_endpoint
        if e is None:
            return {"kind": "rules"}
        return {"kind": "endpoint", "base_url": e.base_url, "model": e.model, "seed": e.seed}

    def _legacy_p_source(self) -> dict[str, Any]:
        """What a ``p_score.json`` without ``source`` was scored with: the method's own rewriter."""
        d = self.method.diversify
        if d.base_url and d.model:
            return {"kind": "method-endpoint", "base_url": d.base_url, "model": d.model}
        return {"kind": "rules"}

    def p_score_sets(self, rules: str = "heldout") -> dict[str, dict[str, list[InstructionExample]]]:
        """``{template: {held-out task: rewritten test rows}}`` scored by the P-score, the same for every
        method. ``heldout`` (the P-score): :data:`~posttrain_lab.studies.cit.diversify.HELDOUT_RULES`
        with :data:`~posttrain_lab.studies.cit.world.HELDOUT_CONCRETE`, wordings no method trained on,
        or ``eval.p_score_endpoint`` (:meth:`_endpoint_heldout_sets`); never the method's training
        rewriter. ``train``: the offline training rules and table (a diagnostic of how much the ``kpig``
        arm gains from having trained on the rules' phrasings)."""
        from posttrain_lab.studies.cit.diversify import RULE_SETS, TEMPLATES, diversify
        from posttrain_lab.studies.cit.world import CONCRETE, HELDOUT_CONCRETE

        if rules == "heldout" and self.cfg.eval.p_score_endpoint is not None:
            return self._endpoint_heldout_sets()
        concrete = HELDOUT_CONCRETE if rules == "heldout" else CONCRETE
        by: dict[str, dict[str, list[InstructionExample]]] = {}
        for t in self.cfg.stream.heldout:
            rew = diversify(self.test[t], TEMPLATES, concrete=concrete, rules=RULE_SETS[rules])
            for tmpl, exs in rew.items():
                by.setdefault(tmpl, {})[t] = exs
        return by

    def _endpoint_heldout_sets(self) -> dict[str, dict[str, list[InstructionExample]]]:
        """The held-out rewrites of ``eval.p_score_endpoint`` (held-out prompt, its own seeds; falls back
        to the held-out rules per row), asked once per study and kept in ``<out_dir>/p_score_rewrites.json``
        (reused while the endpoint, seed and held-out test rows are the same)."""
        from posttrain_lab.studies.cit.data import parse_markup
        from posttrain_lab.studies.cit.diversify import HELDOUT_RULES, TEMPLATES, EndpointRewriter, diversify
        from posttrain_lab.studies.cit.world import HELDOUT_CONCRETE

        e = self.cfg.eval.p_score_endpoint
        assert e is not None
        held = list(self.cfg.stream.heldout)
        key = {"source": self.p_source(), "rows": {t: [x.marked() for x in self.test[t]] for t in held}}
        path = Path(self.cfg.out_dir) / "p_score_rewrites.json"
        cached = json.loads(path.read_text()) if path.exists() else {}
        if {k: cached.get(k) for k in key} != key:
            rewriter = EndpointRewriter(e.base_url, e.model, api_key_env=e.api_key_env, seed=e.seed)
            marked: dict[str, dict[str, list[str]]] = {}
            for t in held:
                rew = diversify(
                    self.test[t], TEMPLATES, concrete=HELDOUT_CONCRETE, rewriter=rewriter, rules=HELDOUT_RULES
                )
                for tmpl, exs in rew.items():
                    marked.setdefault(tmpl, {})[t] = [x.marked() for x in exs]
            cached = {**key, "rewrites": marked, "fallbacks": rewriter.fallbacks, "crossed": rewriter.crossed}
            _write(path, cached)
        by: dict[str, dict[str, list[InstructionExample]]] = {}
        for tmpl, tasks in cached["rewrites"].items():
            for t, rows in tasks.items():
                out = []
                for x, m in zip(self.test[t], rows, strict=True):
                    text, spans = parse_markup(m, f"{path}: {tmpl} rewrite of {t}")
                    out.append(InstructionExample(text, x.input, x.output, x.task, spans, x.source, x.meta))
                by.setdefault(tmpl, {})[t] = out
        return by

    def _p_accuracy(self, rules: str) -> dict[str, dict[str, float]]:
        by: dict[str, dict[str, float]] = {}
        for tmpl, tasks in self.p_score_sets(rules).items():
            for t, exs in tasks.items():
                outs = generate_outputs(self.lm, self.cfg, exs)
                by.setdefault(tmpl, {})[t] = sum(
                    o == e.output.strip() for o, e in zip(outs, exs, strict=True)
                ) / len(exs)
        return by


def run_cit(cfg: CITConfig, progress: Any = None) -> list[dict[str, Any]]:
    """Every (method, seed) of ``cfg``; each resumes from its last finished stage."""
    from posttrain.utils.io import atomic_write_text

    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    import yaml

    atomic_write_text(out / "config.yaml", yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
    data = load_stream(cfg)
    return [StreamRun(cfg, m, s, data).run(progress) for m in cfg.methods for s in cfg.seeds]
