"""The run loop RL and SFT share (posttrain/train/loop.py): both trainers' train(), save() and resume go
through it (spies, not source greps); a run killed mid-way resumes from its last checkpoint as if
never interrupted, for both, through the same code; the evaluation and checkpoint schedules; the one
evaluation batch cap (eval.max_batch_size) honoured by both trainers' evaluations."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from _train_helpers import kill_at_step

from posttrain.rollout.hf import HFEngine
from posttrain.train import run_dir as run_dir_mod
from posttrain.train.config import EVAL_MAX_BATCH_SIZE, CheckpointConfig, EvalConfig, RLConfig
from posttrain.train.loop import LoopSpec, RunLoop
from posttrain.train.rl import RLTrainer
from posttrain.train.sft import SFTConfig, SFTTrainer
from posttrain.utils.config import StrictModel

# the random tiny model truncates its completions: expected here, not a finding
pytestmark = pytest.mark.filterwarnings("ignore::posttrain.train.rl.DegenerateSettingWarning")

TASK = {"name": "arithmetic", "params": {"digits": 1, "ops": "+", "n_train": 40, "n_heldout": 10}}


def distinct_chars(completion: str, example) -> float:
    """A reward that differs between the random tiny model's samples, so every RL step has a gradient."""
    return len(set(completion)) / 5


def _rl(out: Path, **over) -> RLTrainer:
    cfg = {
        "model": {"name": "tiny", "device": "cpu"},
        "task": TASK,
        "reward": {"num_workers": 0, "success_threshold": 0.5},
        "rollout": {"prompts_per_step": 2, "group_size": 4, "max_new_tokens": 5},
        "eval": {"n": 4, "at_start": False, "every": 2},
        "checkpoint": {"every": 2},
        "logging": {"progress": False},
        "optimizer": {"lr": 1e-3},
        "threads": 1,
        "seed": 5,
        "out_dir": str(out),
        "steps": 4,
    }
    resume = over.pop("resume", False)
    for key, value in over.items():
        cfg[key] = {**cfg[key], **value} if isinstance(value, dict) else value
    return RLTrainer(RLConfig.model_validate(cfg), resume=resume, reward=distinct_chars)


def _sft(out: Path, **over) -> SFTTrainer:
    cfg = {
        "model": {"name": "tiny", "device": "cpu"},
        "task": TASK,
        "batch_size": 8,
        "micro_batch_size": 4,
        "eval": {"n": 4, "every": 2},
        "checkpoint": {"every": 2},
        "threads": 1,
        "seed": 5,
        "progress": False,
        "out_dir": str(out),
        "steps": 4,
    }
    resume = over.pop("resume", False)
    for key, value in over.items():
        cfg[key] = {**cfg[key], **value} if isinstance(value, dict) else value
    return SFTTrainer(SFTConfig.model_validate(cfg), resume=resume)


MAKE = {"rl": _rl, "sft": _sft}


def _rows(out: Path) -> list[dict]:
    timing = ("wall_s", "tokens_per_s")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith("time_") and k not in timing} for r in rows]


# ------------------------------------------------------------------- both trainers use the component
@pytest.fixture
def loop_spy(monkeypatch):
    """Records every RunLoop.run / save_checkpoint / restore call, and every trainer step together with
    whether it ran inside RunLoop.run."""
    calls: dict[str, list] = {"run": [], "save": [], "restore": [], "steps_inside": [], "steps_outside": []}
    inside = []
    run, save, restore = RunLoop.run, RunLoop.save_checkpoint, RunLoop.restore

    def spy_run(self, spec, **kw):
        calls["run"].append(type(self.trainer).__name__)
        inside.append(True)
        try:
            return run(self, spec, **kw)
        finally:
            inside.pop()

    def spy_save(self, state, extra=None):
        calls["save"].append((type(self.trainer).__name__, self.trainer.step_idx))
        return save(self, state, extra)

    def spy_restore(self, ckpt, restore_state):
        calls["restore"].append((type(self.trainer).__name__, Path(ckpt).name))
        return restore(self, ckpt, restore_state)

    for cls in (RLTrainer, SFTTrainer):
        step = cls.step

        def spy_step(self, _step=step):
            calls["steps_inside" if inside else "steps_outside"].append(type(self).__name__)
            return _step(self)

        monkeypatch.setattr(cls, "step", spy_step)
    monkeypatch.setattr(RunLoop, "run", spy_run)
    monkeypatch.setattr(RunLoop, "save_checkpoint", spy_save)
    monkeypatch.setattr(RunLoop, "restore", spy_restore)
    return calls


def test_both_trainers_train_save_and_resume_through_the_run_loop(tmp_path, loop_spy):
    for kind, cls in (("rl", "RLTrainer"), ("sft", "SFTTrainer")):
        with MAKE[kind](tmp_path / kind, steps=3) as tr:
            tr.train()
        with MAKE[kind](tmp_path / kind, steps=4, resume=True) as tr:
            tr.train()
            assert tr.resume_info.step == 3 and tr.resume_info.checkpoint.name == "step_000003"
        assert loop_spy["run"].count(cls) == 2
        # every step ran inside the shared loop (a trainer with its own loop would step outside it)
        assert loop_spy["steps_inside"].count(cls) == 4
        # periodic (step 2) and final (3; 4 is periodic) checkpoints went through the shared save
        assert [s for c, s in loop_spy["save"] if c == cls] == [2, 3, 4]
        assert [c for c, _ in loop_spy["restore"]].count(cls) == 1
        assert (tmp_path / kind / "checkpoints" / "step_000004").is_dir()
    assert loop_spy["steps_outside"] == []
    assert ("RLTrainer", "step_000003") in loop_spy["restore"]
    assert ("SFTTrainer", "step_000003") in loop_spy["restore"]


# --------------------------------------------------------------------- resume after a kill, both
class Killed(BaseException):
    """Stands for the process being killed (not an Exception: nothing may swallow it)."""


@pytest.mark.parametrize("kind", ["rl", "sft"])
def test_a_run_killed_mid_way_resumes_from_its_last_checkpoint_as_if_uninterrupted(
    tmp_path, kind, monkeypatch
):
    with MAKE[kind](tmp_path / "full", steps=5) as tr:
        full_summary = tr.train()
        full_weights = [p.detach().clone() for p in tr.model.parameters()]
    kill_at_step(monkeypatch, RLTrainer if kind == "rl" else SFTTrainer, 3, Killed)  # in step 4
    out = tmp_path / "killed"
    with MAKE[kind](out, steps=5) as tr, pytest.raises(Killed):
        tr.train()
    # the loop released the run folder's lock on the way out; the last checkpoint is step 2
    assert os.path.realpath(out) not in run_dir_mod._HELD
    assert (out / "checkpoints" / "latest").read_text().strip() == "step_000002"
    monkeypatch.undo()
    with MAKE[kind](out, steps=5, resume=True) as tr:
        assert tr.step_idx == 2
        summary = tr.train()
        weights = list(tr.model.parameters())
    assert summary["start_step"] == 2 and summary["steps"] == 5
    assert _same_but_timing(summary["last"], full_summary["last"])
    # metrics.jsonl: step 3 logged by the killed run is dropped on resume; every row equals the full run's
    rows = _rows(out)
    assert rows == _rows(tmp_path / "full")
    assert [r["step"] for r in rows if r["kind"] == "step"] == [1, 2, 3, 4, 5]
    assert [r["step"] for r in rows if r["kind"] == "eval"] == [2, 4, 5]
    assert all(r["grad_norm"] > 0 for r in rows if r["kind"] == "step")  # every step updated the weights
    for a, b in zip(weights, full_weights, strict=True):
        assert torch.equal(a.detach(), b)


def _same_but_timing(a: dict, b: dict) -> bool:
    drop = lambda d: {k: v for k, v in d.items() if not k.startswith("time_") and k != "tokens_per_s"}  # noqa: E731
    return drop(a) == drop(b)


# ------------------------------------------------------------------------ schedules (no model)
class _Cfg(StrictModel):
    steps: int = 0
    eval: EvalConfig = EvalConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()


class _Counter:
    """A trainer whose step only counts: what RunLoop reads from a trainer, nothing more."""

    model = tokenizer = optimizer = None

    def __init__(self, tmp_path: Path, start: int = 0, **cfg) -> None:
        self.cfg = _Cfg.model_validate(cfg)
        self.run_dir = tmp_path / "run"
        self.step_idx = start
        self.loop = RunLoop(self)
        self.evals: list[int] = []
        self.saves: list[int] = []

    def step(self) -> dict[str, float]:
        self.step_idx += 1
        return {"step": self.step_idx, "loss": 1.0 / self.step_idx}

    def evaluate(self) -> dict:
        self.evals.append(self.step_idx)
        return {"accuracy": 0.5, "samples": ["x"]}

    def save(self) -> Path:
        self.saves.append(self.step_idx)
        self.loop.checkpointed_step = self.step_idx
        return self.run_dir

    def spec(self, **over) -> LoopSpec:
        kw = {"step": self.step, "evaluate": self.evaluate, "save": self.save, "live": {"loss": "loss"}}
        return LoopSpec(name="t", **{**kw, **over})


def test_eval_and_checkpoint_schedule(tmp_path):
    t = _Counter(
        tmp_path,
        steps=6,
        eval={"every": 2, "at_start": True, "at_end": True},
        checkpoint={"every": 4, "final": True},
    )
    summary = t.loop.run(t.spec())
    # at the start, every 2nd step except the last (the final evaluation covers it, once), at the end
    assert t.evals == [0, 2, 4, 6]
    assert t.saves == [4, 6]  # every 4th step and the final one
    assert summary["eval_start"] == summary["eval_end"] == {"accuracy": 0.5}  # without samples
    assert summary["start_step"] == 0 and summary["steps"] == 6 and summary["last"]["step"] == 6
    logged = [(r["kind"], r["step"]) for r in map(json.loads, (t.run_dir / "metrics.jsonl").open())]
    assert [s for k, s in logged if k == "eval"] == [0, 2, 4, 6]
    assert [s for k, s in logged if k == "step"] == list(range(1, 7))


def test_final_checkpoint_is_not_written_twice_and_a_resumed_run_skips_the_start_eval(tmp_path):
    t = _Counter(tmp_path, steps=4, eval={"at_start": True}, checkpoint={"every": 2})
    t.loop.run(t.spec())
    assert t.saves == [2, 4]  # step 4 is on disk after the periodic save: no second final save
    t2 = _Counter(tmp_path, start=4, steps=6, eval={"at_start": True, "every": 0})
    t2.loop.checkpointed_step = 4
    summary = t2.loop.run(t2.spec())
    assert t2.evals == [6]  # no start eval on resume; the end eval
    # ... but the resumed run reports the first part's start eval, from the log (issue 41 item 23)
    assert summary["eval_start"] == {"accuracy": 0.5}
    # a resumed run with nothing left to do evaluates nothing
    t3 = _Counter(tmp_path, start=6, steps=6)
    t3.loop.checkpointed_step = 6
    t3.loop.run(t3.spec())
    assert t3.evals == [] and t3.saves == []


def test_without_an_evaluation_or_a_run_folder(tmp_path):
    t = _Counter(tmp_path, steps=3, eval={"every": 1, "at_start": True}, checkpoint={"every": 1})
    summary = t.loop.run(t.spec(write=False, evaluate=None))
    assert t.evals == [] and t.saves == [] and summary["steps"] == 3
    assert not t.run_dir.exists()  # write=False: no config, logs or checkpoints
    # a fresh zero-step run evaluates at the end only when the trainer asks (SFT does)
    t0 = _Counter(tmp_path / "zero", steps=0, eval={"at_start": False})
    assert "eval" not in t0.loop.run(t0.spec(end_eval_key="eval"))
    t1 = _Counter(tmp_path / "zero1", steps=0, eval={"at_start": False})
    assert t1.loop.run(t1.spec(end_eval_key="eval", eval_fresh_zero_steps=True))["eval"] == {"accuracy": 0.5}


def test_the_run_folder_lock_is_released_when_a_step_raises(tmp_path):
    t = _Counter(tmp_path, steps=3)

    def boom() -> dict:
        raise RuntimeError("step failed")

    with pytest.raises(RuntimeError, match="step failed"):
        t.loop.run(LoopSpec(name="t", step=boom, evaluate=None, save=t.save))
    assert os.path.realpath(t.run_dir) not in run_dir_mod._HELD


# ------------------------------------------------------------------------- the evaluation batch cap
def test_batch_cap_resolution():
    assert EvalConfig().batch_cap() == EVAL_MAX_BATCH_SIZE == 512
    assert EvalConfig().batch_cap(rollout_cap=16) == 16  # RL: the training generation's memory limit
    assert EvalConfig(max_batch_size=3).batch_cap(rollout_cap=16) == 3  # the eval setting wins
    assert SFTConfig().eval.batch_cap() == RLConfig().eval.batch_cap() == 512  # one default


@pytest.fixture
def generate_sizes(monkeypatch):
    sizes: list[int] = []
    rows = HFEngine._generate_rows

    def spy(self, chunk, params):
        sizes.append(len(chunk))
        return rows(self, chunk, params)

    monkeypatch.setattr(HFEngine, "_generate_rows", spy)
    return sizes


@pytest.mark.parametrize("kind", ["rl", "sft"])
def test_both_trainers_honour_the_eval_batch_cap(tmp_path, kind, generate_sizes):
    eval_cfg = {"n": 7, "max_batch_size": 3, "every": 0}
    with MAKE[kind](tmp_path / "capped", eval=eval_cfg) as tr:
        generate_sizes.clear()
        ev = tr.evaluate() if kind == "rl" else tr._evaluate_all()
    assert ev["n"] == 7 and generate_sizes == [3, 3, 1]
    with MAKE[kind](tmp_path / "default", eval={"n": 7, "every": 0}) as tr:
        generate_sizes.clear()
        tr.evaluate() if kind == "rl" else tr._evaluate_all()
    assert generate_sizes == [7]  # default cap (512): one batch


def test_rl_pass_at_k_samples_and_trainer_evaluations_share_the_cap(tmp_path, generate_sizes):
    with _rl(tmp_path, eval={"n": 4, "k": 2, "samples": 3, "max_batch_size": 5}) as tr:
        generate_sizes.clear()
        tr.evaluate()
        assert generate_sizes == [4, 5, 5, 2]  # greedy 4, then 12 samples in batches of at most 5
        assert tr.eval_runner().engine.max_batch_size == 5
    with _rl(tmp_path / "r", rollout={"max_batch_size": 6}, eval={"n": 4}) as tr:
        assert tr.eval_runner().engine.max_batch_size == 6  # no eval setting: the rollout's cap


def test_posttrain_eval_of_a_run_uses_its_eval_batch_cap():
    from posttrain.train.evaluate import ModelLocation, evaluate_cli_settings

    def cap(settings: dict) -> int:
        loc = ModelLocation(given="run", path="tiny", settings={"task": TASK, **settings})
        cfg = evaluate_cli_settings(loc, None, [], n=4)
        return cfg.eval.batch_cap(cfg.rollout.max_batch_size)

    assert cap({"eval": {"max_batch_size": 16, "every": 3}, "rollout": {"max_batch_size": 8}}) == 16
    assert cap({"rollout": {"max_batch_size": 8}}) == 8
    assert cap({"eval": {"every": 3}}) == 512  # an SFT run's config has no rollout section


# ----------------------------------------------------- a third trainer on the loop (docs/extending.md)
def _memorize_module(tmp_path: Path):
    import importlib.util
    import re

    doc = (Path(__file__).resolve().parents[2] / "docs" / "extending.md").read_text(encoding="utf-8")
    (block,) = [
        b for b in re.findall(r"```python\n(.*?)```", doc, flags=re.S) if "class MemorizeTrainer" in b
    ]
    path = tmp_path / "memorize_example.py"
    path.write_text(block, encoding="utf-8")
    spec = importlib.util.spec_from_file_location("memorize_example", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_extending_doc_trainer_runs_and_resumes_on_the_run_loop(tmp_path):
    m = _memorize_module(tmp_path)
    cfg = lambda out, steps: m.MemorizeConfig(  # noqa: E731
        out_dir=str(tmp_path / out), steps=steps, eval={"every": 2}, checkpoint={"every": 2}
    )
    full = m.MemorizeTrainer(cfg("full", 6))
    summary = full.train()
    assert summary["eval_end"]["loss"] < summary["eval_start"]["loss"]
    assert sorted(p.name for p in (tmp_path / "full" / "checkpoints").glob("step_*")) == [
        "step_000004",
        "step_000006",
    ]
    m.MemorizeTrainer(cfg("split", 4)).train()
    resumed = m.MemorizeTrainer(cfg("split", 6), resume=True)
    assert resumed.step_idx == 4
    resumed.train()
    assert _rows(tmp_path / "split") == _rows(tmp_path / "full")
    for a, b in zip(resumed.model.parameters(), full.model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_leaving_the_with_block_releases_the_run(tmp_path):
    """Trainers used one after another in one process (a benchmark's arms) do not pile up: leaving the
    ``with`` block empties the optimizer state and collects earlier trainers' reference cycles (before,
    every finished trainer stayed alive until a full GC: +2 GB per real-model arm)."""
    import gc
    import warnings
    import weakref

    from posttrain.models import load_model_and_tokenizer
    from posttrain.train.config import load_rl_config
    from posttrain.train.rl import RLTrainer

    model, tok = load_model_and_tokenizer("tiny", device="cpu", seed=0)
    base = [
        "model.name=tiny",
        "model.device=cpu",
        'task.params={digits: 1, ops: "+", n_train: 20, n_heldout: 8}',
        "reward.num_workers=0",
        "rollout.prompts_per_step=2",
        "rollout.group_size=2",
        "rollout.max_new_tokens=3",
        "eval.at_start=false",
        "eval.at_end=false",
        "checkpoint.final=false",
        "steps=1",
        "threads=1",
    ]
    refs = []
    gc.disable()  # no automatic collection: only what the with statement does counts
    try:
        for i in range(3):
            cfg = load_rl_config(None, [*base, f"out_dir={tmp_path / str(i)}"])
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                with RLTrainer(cfg, model, tok) as tr:
                    tr.train(progress=False)
                    assert tr.optimizer.state
            assert not tr.optimizer.state
            refs.append(weakref.ref(tr))
        del tr
        alive = [r() is not None for r in refs]
    finally:
        gc.enable()
    assert alive[:2] == [False, False]  # the last one may wait for the next exit or collection


# ---------------------------------------------------------------------- early stopping (eval.stop_at)
@pytest.mark.parametrize("kind", ["rl", "sft"])
def test_eval_stop_at_ends_the_run_at_the_first_evaluation_that_reaches_it(tmp_path, kind):
    # the random tiny model scores accuracy 0.0: stop_at 0.0 is reached (>=, not >) at the first
    # scheduled evaluation (step 2 of 4); its evaluation is the final one, the checkpoint is at step 2
    out = tmp_path / kind
    steps = []
    trainer = MAKE[kind](out, eval={"every": 2, "stop_at": 0.0}, checkpoint={"every": 0})
    orig = trainer.step

    def counted():
        steps.append(1)
        return orig()

    trainer.step = counted
    s = trainer.train()
    assert s["stopped_at"] == 2 and s["steps"] == 2 and len(steps) == 2
    end = s["eval_end" if kind == "rl" else "eval"]
    assert end["accuracy"] == 0.0
    evals = [r for r in _rows(out) if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [2]  # no second evaluation at the end
    assert (out / "checkpoints" / "latest").read_text().strip() == "step_000002"
    # a resumed run that had stopped does not train on
    steps.clear()
    again = MAKE[kind](out, eval={"every": 2, "stop_at": 0.0}, checkpoint={"every": 0}, resume=True)
    again.step = lambda: steps.append(1) or {}
    s2 = again.train()
    assert steps == [] and s2["stopped_at"] == 2 and s2["steps"] == 2


@pytest.mark.parametrize("kind", ["rl", "sft"])
def test_eval_stop_at_not_reached_runs_every_step(tmp_path, kind):
    s = MAKE[kind](tmp_path / kind, eval={"every": 2, "stop_at": 1.0}).train()
    assert "stopped_at" not in s and s["steps"] == 4


def test_sft_warm_start_stops_at_a_target_on_calibration_questions_held_back_from_training(
    tmp_path, monkeypatch
):
    from posttrain.tasks import get_task
    from posttrain.train import sft as sft_mod

    cfg = RLConfig.model_validate(
        {"model": {"name": "tiny"}, "task": TASK, "threads": 1, "rollout": {"max_new_tokens": 8}}
    )
    seen = {}
    real = sft_mod.SFTTrainer

    class Spy(real):
        def __init__(self, c, *a, **kw):
            super().__init__(c, *a, **kw)
            seen["train_prompts"] = len(self.examples)
            seen["heldout"] = [e.id for e in self._heldout]

        def evaluate(self, n=None):
            ev = super().evaluate(n)
            seen.setdefault("eval_n", []).append(ev["n"])
            return ev

    monkeypatch.setattr(sft_mod, "SFTTrainer", Spy)
    from posttrain.models import load_model_and_tokenizer

    model, tok = load_model_and_tokenizer("tiny", device="cpu", seed=0)
    s = sft_mod.sft_warm_start(
        cfg,
        model,
        tok,
        steps=6,
        lr=1e-3,
        out_dir=tmp_path / "w",
        progress=False,
        stop_at=0.0,
        check_every=3,
        calibration=8,
    )
    train = get_task(TASK["name"], **TASK["params"]).split("train")
    assert seen["heldout"] == [e.id for e in train[-8:]]  # the train split's last 8, never the held-out
    assert seen["train_prompts"] == len(train) - 8 and seen["eval_n"] == [8]
    assert s["stopped_at"] == 3 and s["steps"] == 3 and s["eval"]["split"] == "calibration"
    with pytest.raises(ValueError, match="calibration must be between 1 and 39"):
        sft_mod.sft_warm_start(cfg, model, tok, steps=1, out_dir=tmp_path / "x", stop_at=0.5, calibration=40)
    with pytest.raises(ValueError, match="takes no pairs/rows"):
        sft_mod.sft_warm_start(
            cfg, model, tok, steps=1, out_dir=tmp_path / "y", stop_at=0.5, pairs=[("a", "b")]
        )


def test_train_to_end_restarts_a_run_killed_before_its_first_checkpoint_and_resumes_one_after(tmp_path):
    from posttrain.train.rl import train_to_end

    out = tmp_path / "arm"
    cfg = _rl(out, steps=2, checkpoint={"every": 0}).cfg
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.jsonl").write_text('{"kind": "step", "step": 1}\n')  # killed at step 1, no checkpoint
    (out / "config.yaml").write_text("steps: 2\n")
    s, seen = train_to_end(cfg, after=lambda tr: tr.step_idx)
    assert s["start_step"] == 0 and s["steps"] == 2 and seen == 2
    assert (out / "model" / "config.json").is_file()
    assert (out / "checkpoints" / "latest").read_text().strip() == "step_000002"
    s2, _ = train_to_end(cfg)  # the finished arm resumes from its final checkpoint: nothing to train
    assert s2["start_step"] == 2 and s2["steps"] == 2
