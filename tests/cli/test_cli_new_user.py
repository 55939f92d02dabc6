"""The CLI's run lifecycle and messages, each through the real CLI (typer's CliRunner), tiny preset,
1-2 steps: run-folder safety (a finished run is protected, one that failed before its first step is
replaced), file permissions, resume with a changed config and Ctrl-C, objective switching and
config-time validation, early errors, messages (hints, held-out accuracy, one-line warnings), plain
progress lines, CLI habits."""

from __future__ import annotations

import json
import os
import stat
import warnings
from pathlib import Path

import pytest
import torch
from _train_helpers import CLI_TINY, kill_at_step
from typer.testing import CliRunner

from posttrain.cli import app
from posttrain.train.rl import DegenerateSettingWarning, RLTrainer

runner = CliRunner()
CFG = str(Path(__file__).resolve().parents[2] / "src/posttrain/configs/grpo-arithmetic.yaml")

TINY = CLI_TINY
QUICK = [*TINY, "eval.at_start=false", "eval.at_end=false"]


def _invoke(args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateSettingWarning)
        return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


def _rl(run, *extra):
    return _invoke(["rl", *QUICK, f"out_dir={run}", "--no-progress", *extra])


def _ok(res):
    assert res.exit_code == 0, res.output
    return res


def _step_rows(run):
    return [json.loads(x) for x in (Path(run) / "metrics.jsonl").read_text().splitlines()]


# ---------------------------------------------------------------------------- 1. run-folder safety
def test_rerun_into_a_finished_run_is_refused_until_overwrite(tmp_path):
    run = tmp_path / "run"
    _ok(_rl(run, "steps=2", "checkpoint.every=1", "checkpoint.keep=5"))
    before = (run / "metrics.jsonl").read_text()
    res = _rl(run, "steps=1")
    assert res.exit_code == 2
    assert "already holds a run" in res.output and "--resume" in res.output and "--overwrite" in res.output
    assert (run / "metrics.jsonl").read_text() == before  # nothing truncated
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_000002"

    res = _rl(run, "steps=1", "model.name=no-such-model", "--overwrite")  # fails before deleting anything
    assert res.exit_code == 2 and (run / "metrics.jsonl").read_text() == before

    (run / "notes.txt").write_text("mine")
    _ok(_rl(run, "steps=1", "--overwrite"))
    assert [r["step"] for r in _step_rows(run)] == [1]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["latest", "step_000001"]
    assert (run / "notes.txt").read_text() == "mine"  # --overwrite deletes run files only

    res = _rl(run, "steps=2", "--resume", "--overwrite")
    assert res.exit_code == 2 and "exclude each other" in res.output


def test_sft_rerun_is_refused_until_overwrite(tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text(
        "".join(json.dumps({"prompt": f"{i}+1=", "completion": str(i + 1)}) + "\n" for i in range(4))
    )
    args = [
        "sft",
        "model.name=tiny",
        f"data={data}",
        "steps=1",
        "batch_size=2",
        "threads=1",
        f"out_dir={tmp_path / 's'}",
    ]
    _ok(_invoke(args))
    res = _invoke(args)
    assert res.exit_code == 2 and "already holds a run" in res.output and "--overwrite" in res.output
    _ok(_invoke([*args, "--overwrite"]))


def test_a_run_that_failed_before_its_first_step_is_replaced_by_a_rerun(tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    (run / "config.yaml").write_text("seed: 9\n")  # what a run that died in its first evaluation leaves
    (run / "metrics.jsonl").write_text(json.dumps({"step": 0, "eval/accuracy": 0.1}) + "\n")
    res = _rl(run, "steps=1", "--resume")
    assert res.exit_code == 2 and "nothing to resume" in res.output, res.output
    assert "start a new run without --resume" in res.output
    _ok(_rl(run, "steps=1"))  # no --overwrite needed: no step was taken
    assert "seed: 0" in (run / "config.yaml").read_text()
    assert [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()] == [1]
    res = _rl(run, "steps=1")  # a run with a step is still protected
    assert res.exit_code == 2 and "already holds a run" in res.output, res.output


# ------------------------------------------------------------------------------- 2. permissions
@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_an_unwritable_out_dir_is_one_line_naming_the_folder(tmp_path, monkeypatch):
    """Issue 41 item 21: a read-only out_dir ended in a traceback from opening .posttrain.lock.
    (Tests run as root, who may write anywhere: the OS refusal is simulated.)"""
    import builtins
    import errno

    from posttrain.train import run_dir as run_dir_mod

    real_open = builtins.open

    def read_only(path, *a, **kw):
        if str(path).endswith(run_dir_mod.LOCK_NAME):
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_open(path, *a, **kw)

    monkeypatch.setattr(run_dir_mod, "open", read_only, raising=False)
    run = tmp_path / "run"
    res = _rl(run, "steps=1")
    assert res.exit_code == 2, res.output
    assert f"out_dir {run} cannot be written: Read-only file system (EROFS)" in res.output
    assert str(run / ".posttrain.lock") in res.output and "Traceback" not in res.output


def test_a_full_disk_during_a_checkpoint_names_the_last_good_one(tmp_path, monkeypatch):
    """Issue 41 item 21: disk full while writing a checkpoint was a 111-line traceback; now one line:
    what happened, the path, the last good checkpoint, and how to continue (which works)."""
    import errno

    from posttrain.train import checkpoint as ckpt_mod

    real_save = ckpt_mod.save_file

    def disk_full_at_step_2(tensors, filename, *a, **kw):
        if "step_000002" in str(filename):
            raise OSError(errno.ENOSPC, "No space left on device", str(filename))
        return real_save(tensors, filename, *a, **kw)

    monkeypatch.setattr(ckpt_mod, "save_file", disk_full_at_step_2)
    run = tmp_path / "run"
    res = _rl(run, "steps=3", "checkpoint.every=1")
    assert res.exit_code == 2, res.output
    ckpts = run / "checkpoints"
    assert (
        f"could not write the checkpoint of step 2 to {ckpts / 'step_000002'}: No space left on device "
        "(ENOSPC)" in res.output
    )
    assert f"the last good checkpoint is {ckpts / 'step_000001'}" in res.output and "--resume" in res.output
    assert "Traceback" not in res.output
    assert sorted(p.name for p in ckpts.iterdir()) == ["latest", "step_000001"]  # nothing partial
    monkeypatch.undo()
    res = _ok(_rl(run, "steps=3", "checkpoint.every=1", "--resume"))
    assert "resuming from" in res.output and "step_000001" in res.output


def test_safetensors_disk_full_is_one_line_with_the_space_and_the_resume_command(tmp_path, monkeypatch):
    """Issue 58 item 1: safetensors 0.8 reports a full disk as ``SafetensorError: Error while serializing:
    I/O error: No space left on device (os error 28)``, which ended in a 128-line traceback. Now one
    line: what failed, the space the checkpoint needs, and the exact command that resumes; ``latest``
    stays on the last complete step."""
    from safetensors import SafetensorError

    from posttrain.train import checkpoint as ckpt_mod

    real_save = ckpt_mod.save_file

    def disk_full_at_step_2(tensors, filename, *a, **kw):
        if "step_000002" in str(filename):
            raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
        return real_save(tensors, filename, *a, **kw)

    monkeypatch.setattr(ckpt_mod, "save_file", disk_full_at_step_2)
    run = tmp_path / "run"
    res = _rl(run, "steps=3", "checkpoint.every=1")
    assert res.exit_code == 2, res.output
    errors = [ln for ln in res.output.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in res.output, res.output
    line = errors[0]
    ckpts = run / "checkpoints"
    assert "step_000002: No space left on device (ENOSPC); the checkpoint needs about " in line
    assert f"MB free in {ckpts})" in line and f"the last good checkpoint is {ckpts / 'step_000001'}" in line
    assert line.endswith(f"out_dir={run} steps=3 checkpoint.every=1 --resume)"), line
    assert "(posttrain rl " in line
    assert (ckpts / "latest").read_text().strip() == "step_000001"
    assert sorted(p.name for p in ckpts.iterdir()) == ["latest", "step_000001"]


def test_outputs_get_the_umask_permissions(tmp_path, umask_022):
    run = tmp_path / "run"
    _ok(_rl(run, "steps=1"))
    ckpt = run / "checkpoints" / "step_000001"
    for f in (
        run / "config.yaml",
        run / "metrics.jsonl",
        run / "checkpoints" / "latest",
        ckpt / "trainer_state.json",
        ckpt / "optimizer.safetensors",
        ckpt / "rng.safetensors",
        ckpt / "model" / "model.safetensors",
    ):
        assert _mode(f) == 0o644, (f, oct(_mode(f)))
    for d in (run, run / "checkpoints", ckpt, ckpt / "model"):
        assert _mode(d) == 0o755, (d, oct(_mode(d)))
    _ok(_invoke(["plot", run]))
    assert _mode(run / "curves.png") == 0o644
    ev = tmp_path / "ev.json"
    _ok(_invoke(["eval", "--model", run, "--n", "2", "--max-new-tokens", "2", "--out", ev]))
    assert _mode(ev) == 0o644


def test_atomic_writes_follow_a_stricter_umask(tmp_path):
    from posttrain.utils.io import atomic_write_json

    old = os.umask(0o027)
    try:
        p = atomic_write_json(tmp_path / "report.json", {"a": 1})  # SILO report.json, summary.json, ...
    finally:
        os.umask(old)
    assert _mode(p) == 0o640


# --------------------------------------------------------------------- 3. resume: diff, refuse, Ctrl-C
def test_resume_with_a_changed_config_shows_the_diff_and_refuses_unless_forced(tmp_path):
    run = tmp_path / "run"
    _ok(_rl(run, "steps=1"))
    saved = (run / "config.yaml").read_text()
    res = _rl(run, "steps=2", "rollout.group_size=4", "--resume")
    assert res.exit_code == 2
    assert "rollout.group_size: 2 -> 4" in res.output and "--allow-config-change" in res.output
    assert (run / "config.yaml").read_text() == saved

    res = _ok(_rl(run, "steps=2", "--resume"))  # steps is a harmless change
    assert f"resuming from {run / 'checkpoints' / 'step_000001'} (step 1 of 2)" in res.output
    assert "steps: 1 -> 2" in res.output

    res = _ok(_rl(run, "steps=3", "optimizer.lr=0.001", "--resume", "--allow-config-change"))
    assert "optimizer.lr: 1e-05 -> 0.001  (forced)" in res.output
    assert "lr: 1.0e-05" in (run / "config.until-step_000002.yaml").read_text()
    assert "lr: 0.001" in (run / "config.yaml").read_text()


def test_a_changed_steps_that_moves_a_cosine_schedule_is_refused_unless_forced(tmp_path):
    """Issue 41 item 18: `steps` was called harmless on --resume, but it is the cosine schedule's
    horizon: 2 -> 6 at step 2 lifts the lr from 0.1x to 0.775x of its peak (7.75x). Refused, naming
    the jump; forced, the jump is printed as a warning. (A constant schedule: still harmless, above.)"""
    run = tmp_path / "run"
    cosine = ["optimizer.schedule=cosine", "optimizer.min_lr_ratio=0.1", "optimizer.lr=1e-4"]
    _ok(_rl(run, "steps=2", *cosine))
    res = _rl(run, "steps=6", *cosine, "--resume")
    assert res.exit_code == 2, res.output
    assert "steps: 2 -> 6" in res.output and "--allow-config-change" in res.output
    jump = "the learning rate at step 2 jumps from 1e-05 to 7.75e-05 (7.75x)"
    assert jump in res.output
    res = _ok(_rl(run, "steps=6", *cosine, "--resume", "--allow-config-change"))
    assert "steps: 2 -> 6  (forced)" in res.output and "warning: steps 2 -> 6 moves the cosine" in res.output
    assert jump in res.output


def test_resume_of_a_run_saved_before_a_config_key_existed(tmp_path):
    run = tmp_path / "run"
    _ok(_rl(run, "steps=1"))
    state_path = run / "checkpoints" / "step_000001" / "trainer_state.json"
    state = json.loads(state_path.read_text())
    del state["config"]["rollout"]["max_batch_size"], state["config"]["entropy_coef"]  # an older release
    state_path.write_text(json.dumps(state))
    res = _rl(run, "steps=2", "entropy_coef=0.01", "--resume")
    assert res.exit_code == 2 and "entropy_coef: '<unset>' -> 0.01" in res.output
    _ok(_rl(run, "steps=2", "--resume"))  # new keys at their defaults are not changes


def test_resume_refuses_a_changed_kl_reference_even_when_forced(tmp_path):
    run = tmp_path / "run"
    _ok(_rl(run, "steps=1", "kl.coef=0.1"))
    res = _rl(run, "steps=2", "kl.coef=0.1", "model.name=tiny-qwen2", "--resume", "--allow-config-change")
    assert res.exit_code == 2 and "KL reference" in res.output and "model.name" in res.output


def test_ctrl_c_says_where_it_stopped_and_how_to_resume(tmp_path, monkeypatch):
    run = tmp_path / "run"
    kill_at_step(monkeypatch, RLTrainer, 2)
    res = _rl(run, "steps=5", "checkpoint.every=1")
    assert res.exit_code == 130
    assert "interrupted at step 2 of 5" in res.output
    assert f"last checkpoint: {run / 'checkpoints' / 'step_000002'} (step 2)" in res.output
    assert (
        "resume with: posttrain rl" in res.output
        and "--resume" in res.output
        and f"out_dir={run}" in res.output
    )


class _KilledBySigterm(Exception):
    pass


@pytest.fixture
def sigterm_fallback():
    """A SIGTERM handler for the test process itself (the default one would end pytest): a command
    that leaves SIGTERM unhandled fails the test with _KilledBySigterm instead."""
    import signal

    def fallback(signum, frame):
        raise _KilledBySigterm

    previous = signal.signal(signal.SIGTERM, fallback)
    yield
    signal.signal(signal.SIGTERM, previous)


def _sigterm_at_step(monkeypatch, trainer_cls, step_idx):
    import signal

    real_step = trainer_cls.step

    def step(self):
        if self.step_idx == step_idx:
            os.kill(os.getpid(), signal.SIGTERM)
        return real_step(self)

    monkeypatch.setattr(trainer_cls, "step", step)


@pytest.mark.parametrize("command", ["rl", "sft"])
def test_sigterm_says_where_it_stopped_and_how_to_resume(tmp_path, monkeypatch, sigterm_fallback, command):
    """Issue 41 item 23: SIGTERM (Slurm, Kubernetes) is handled as Ctrl-C: where it stopped, the last
    checkpoint, the resume command; exit 143; the previous SIGTERM handler is restored afterwards."""
    import signal

    from posttrain.train.sft import SFTTrainer

    run = tmp_path / "run"
    if command == "rl":
        _sigterm_at_step(monkeypatch, RLTrainer, 2)
        res = _rl(run, "steps=5", "checkpoint.every=1")
    else:
        _sigterm_at_step(monkeypatch, SFTTrainer, 2)
        data = tmp_path / "train.jsonl"
        data.write_text(json.dumps({"prompt": "1+1=", "completion": "2"}) + "\n")
        sft = ["sft", "model.name=tiny", f"data={data}", "batch_size=1", "threads=1"]
        res = _invoke([*sft, f"out_dir={run}", "steps=5", "checkpoint.every=1", "--no-progress"])
    assert res.exit_code == 143, res.output
    assert "SIGTERM received: interrupted at step 2 of 5" in res.output
    assert f"last checkpoint: {run / 'checkpoints' / 'step_000002'} (step 2)" in res.output
    assert f"resume with: posttrain {command}" in res.output and "--resume" in res.output
    assert signal.getsignal(signal.SIGTERM).__name__ == "fallback"


def test_a_resumed_run_reports_its_start_evaluation(tmp_path):
    """Issue 41 item 23: `eval_start` was null in the summary of a resumed run."""
    run = tmp_path / "run"
    args = ["rl", *TINY, "eval.at_start=true", "eval.at_end=true", f"out_dir={run}", "--no-progress"]
    first = json.loads(_ok(_invoke([*args, "steps=1"])).output.strip().splitlines()[-1])
    assert first["eval_start"] is not None
    resumed = json.loads(
        _ok(_invoke([*args, "steps=2", "--resume", "--allow-config-change"])).output.strip().splitlines()[-1]
    )
    assert resumed["steps"] == 2 and resumed["eval_start"] == first["eval_start"]


def test_corrupt_trainer_state_is_named(tmp_path):
    run = tmp_path / "run"
    _ok(_rl(run, "steps=1"))
    state = run / "checkpoints" / "step_000001" / "trainer_state.json"
    state.write_text("{not json")
    res = _rl(run, "steps=2", "--resume")
    assert res.exit_code == 2 and str(state) in res.output and "corrupt" in res.output
    assert "Traceback" not in res.output


# ------------------------------------------------------- 4. objective switching, config-time checks
@pytest.mark.parametrize(
    ("name", "dropped"),
    [("gspo", "clip_c"), ("cispo", "clip_c"), ("sapo", "clip_low"), ("maspo", "clip_low")],
)
def test_objective_switch_on_the_command_line_drops_the_files_params(tmp_path, name, dropped):
    res = _invoke(
        [
            "rl",
            "--config",
            CFG,
            f"objective.name={name}",
            *QUICK,
            "steps=1",
            f"out_dir={tmp_path / 'r'}",
            "--no-progress",
        ]
    )
    assert res.exit_code == 0, res.output
    assert "note: objective.params: dropped" in res.output and dropped in res.output


def test_params_given_on_the_command_line_stay_strict():
    res = _invoke(["rl", "--config", CFG, "objective.name=cispo", "objective.params.clip_c=3"])
    assert res.exit_code == 2 and "clip_c" in res.output and "accepted: clip_high, clip_low" in res.output


@pytest.mark.parametrize("value", ["abc", "-0.2"])
def test_bad_objective_param_is_a_config_error_before_any_model_loads(tmp_path, monkeypatch, value):
    import posttrain.train.builder as builder

    def boom(*a, **k):
        raise AssertionError("the model was loaded before the config was checked")

    monkeypatch.setattr(builder, "load_adapter", boom)
    res = _invoke(["rl", "--config", CFG, f"objective.params.clip_low={value}", f"out_dir={tmp_path / 'r'}"])
    assert res.exit_code == 2, res.output
    assert "objective.params.clip_low" in res.output and "must be a number >= 0" in res.output


# ---------------------------------------------------------------------------- 5. early, clear errors
@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a CPU-only torch")
def test_cuda_on_a_cpu_build_is_a_config_error():
    res = _invoke(["rl", *TINY, "model.device=cuda"])
    assert res.exit_code == 2 and "model.device" in res.output and "no CUDA" in res.output
    assert "available here: auto, cpu" in res.output


def test_unknown_device_and_config_folder_are_clear_errors():
    res = _invoke(["rl", "model.device=gpu"])
    assert (
        res.exit_code == 2
        and "model.device" in res.output
        and "accepted: auto, cpu, cuda, cuda:N, mps" in res.output
    )
    res = _invoke(["rl", "--config", Path(CFG).parent])
    assert res.exit_code == 2 and "is a directory; expected a YAML file" in res.output
    assert "grpo-arithmetic.yaml" in res.output


# ----------------------------------------------------------------------------------- 6. messages
def test_override_errors_are_blamed_on_the_override_and_hints_exist():
    res = _invoke(["rl", "--config", CFG, "optimizer.lrr=1"])
    assert res.exit_code == 2
    assert "unknown key 'optimizer.lrr' (did you mean 'optimizer.lr'?)" in res.output
    assert "from the command-line override 'optimizer.lrr=1'" in res.output and f"in {CFG}" not in res.output
    res = _invoke(["rl", "steps"])
    assert res.exit_code == 2 and "expected key=value" in res.output and "train.lr" not in res.output


def test_hf_dir_without_config_json_is_reported_as_such(tmp_path):
    empty = tmp_path / "hf"
    empty.mkdir()
    res = _invoke(["rl", *QUICK, f"model.name={empty}", f"out_dir={tmp_path / 'r'}"])
    assert res.exit_code == 2 and "has no config.json" in res.output and "not a run folder" in res.output
    res = _invoke(["eval", "--model", empty, "--n", "2"])
    assert res.exit_code == 2 and "has no config.json" in res.output


def test_a_misspelled_section_suggests_the_section():
    from posttrain.train.config import RLConfig
    from posttrain.utils.config import ConfigError, build_config

    with pytest.raises(ConfigError, match=r"unknown key 'optimiser' \(did you mean 'optimizer'\?\)"):
        build_config(RLConfig, None, ["optimiser.lr=1e-5"])
    with pytest.raises(ConfigError, match=r"unknown key 'optimizer.lrr' \(did you mean 'optimizer.lr'\?\)"):
        build_config(RLConfig, None, ["optimizer.lrr=1e-5"])


def test_rl_prints_heldout_accuracy_and_says_when_eval_n_exceeds_the_split(tmp_path):
    run = tmp_path / "r"
    res = _ok(_invoke(["rl", *TINY, "--no-progress", f"out_dir={run}", "steps=1", "eval.n=50"]))
    assert "note: task 'arithmetic' has only 10 held-out examples; eval.n=50 evaluates all 10" in res.output
    assert "eval at step 0: held-out accuracy " in res.output and "(greedy pass@1, n=10)" in res.output
    assert "eval at step 1: held-out accuracy " in res.output


def test_warnings_on_the_command_line_are_one_line(tmp_path):
    import subprocess
    import sys

    exe = str(Path(sys.executable).with_name("posttrain"))
    args = [
        exe,
        "rl",
        *TINY,
        "--no-progress",
        f"out_dir={tmp_path / 'r'}",
        "steps=1",
        "eval.at_start=false",
    ]
    args += ["eval.at_end=false", "rollout.max_new_tokens=1", "rollout.suppress_eos=true"]  # warns: truncated
    proc = subprocess.run(args, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "warning: step 1: 100% of completions hit rollout.max_new_tokens=1" in proc.stderr
    assert "warnings.warn(" not in proc.stderr and "DegenerateSettingWarning" not in proc.stderr


# ------------------------------------------------------------------------- 7. non-terminal progress
def test_plain_progress_lines_without_a_terminal(tmp_path):
    res = _ok(_rl(tmp_path / "run", "steps=2", "logging.every=1"))
    lines = [x for x in res.output.splitlines() if x.startswith("rl ")]
    assert [x.split()[1] for x in lines] == ["1/2", "2/2"]
    for k in ("reward=", "acc=", "len=", "elapsed", "eta"):
        assert k in lines[0]
    res = _ok(_rl(tmp_path / "run2", "steps=2", "logging.every=0"))
    assert not [x for x in res.output.splitlines() if x.startswith("rl ")]


def test_loading_a_model_dir_prints_no_weight_bar(tmp_path):
    from transformers.utils import logging as hf_logging

    run = tmp_path / "run"
    _ok(_rl(run, "steps=1"))
    hf_logging.enable_progress_bar()  # as in a fresh process (saving a checkpoint turned it off)
    try:
        res = _ok(_invoke(["eval", "--model", run, "--n", "2", "--max-new-tokens", "2"]))
        assert hf_logging.is_progress_bar_enabled()  # loading restores the caller's setting
    finally:
        hf_logging.disable_progress_bar()
    assert "Loading weights" not in res.output


# ------------------------------------------------------------------------------------ 8. habits
def test_dash_h_and_version():
    for args in (["-h"], ["rl", "-h"], ["bench", "-h"], ["bench", "serve", "-h"]):
        res = _ok(_invoke(args))
        assert "Usage:" in res.output
    from posttrain import __version__

    assert _ok(_invoke(["--version"])).output.strip() == __version__
    top = _ok(_invoke(["-h"])).output
    for group in ("rl", "sft", "eval", "plot", "bench", "serve", "export"):
        assert f" {group} " in top, group  # the library's commands are listed in the top-level help
    # (the lab's commands join through the posttrain.cli entry point: lab/tests/test_entry_points.py)


def test_help_text_keeps_its_square_brackets():
    """Rich reads a lowercase `[word]` as markup and drops it: `serve -h` printed `pip install -e "."`
    (issue 41 item 23). Every command's help and option help renders to its own text."""
    import typer.main
    from rich.text import Text

    assert 'pip install -e ".[serve]"' in _ok(_invoke(["serve", "-h"])).output

    def walk(cmd, path):
        for text in [cmd.help or "", *(getattr(p, "help", None) or "" for p in cmd.params)]:
            assert Text.from_markup(text).plain == text.replace("\\[", "["), (path, text)
        for name, sub in getattr(cmd, "commands", {}).items():
            walk(sub, [*path, name])

    walk(typer.main.get_command(app), [])


def test_a_run_folder_is_accepted_as_a_model(tmp_path):
    run = tmp_path / "run"
    _ok(_rl(run, "steps=1"))
    res = _ok(_rl(tmp_path / "next", "steps=1", f"model.name={run}"))
    assert json.loads(res.output.strip().splitlines()[-1])["steps"] == 1


def test_plot_drops_the_duplicate_accuracy_panel():
    from posttrain.train.plot import select_panels

    rows = [{"step": 1, "reward_mean": 0.5, "accuracy": 0.5, "clipfrac": 0.0, "approx_kl": 0.0, "lr": 1e-4}]
    keys = [k for k, _ in select_panels(rows)]
    assert "accuracy" not in keys and {"reward_mean", "clipfrac", "approx_kl", "lr"} <= set(keys)
    rows[0]["accuracy"] = 0.25
    rows[0]["kl"] = 0.1
    keys = [k for k, _ in select_panels(rows)]
    assert "accuracy" in keys and "kl" in keys and "approx_kl" not in keys
