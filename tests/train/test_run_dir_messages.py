"""Run-folder refusals name options as the caller spells them (issue 41 item 23): ``resume=True`` /
``overwrite=True`` / ``allow_config_change=True`` from Python, ``--resume`` / ``--overwrite`` /
``--allow-config-change`` on the command line; a CLI call inside a Python process leaves the Python
spelling in place afterwards."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from posttrain.cli import app
from posttrain.train.checkpoint import save_checkpoint
from posttrain.train.run_dir import RunDirError, check_resume, prepare_run_dir
from posttrain.utils.errors import command_line_messages, option


def _previous_run(folder):
    folder.mkdir()
    (folder / "metrics.jsonl").write_text('{"kind": "step", "step": 1}\n')
    (folder / "config.yaml").write_text("steps: 1\n")
    return folder


def test_python_callers_are_told_the_argument_not_the_flag(tmp_path):
    run = _previous_run(tmp_path / "run")
    with pytest.raises(RunDirError) as e:
        prepare_run_dir(run)
    assert "resume=True" in str(e.value) and "overwrite=True" in str(e.value)
    assert "--" not in str(e.value)
    with pytest.raises(RunDirError, match=r"^resume=True: nothing to resume") as e:
        check_resume(tmp_path / "empty", {})
    assert "--resume" not in str(e.value)
    with pytest.raises(RunDirError, match="resume=True and overwrite=True exclude each other"):
        prepare_run_dir(run, resume=True, overwrite=True)


def test_a_changed_config_names_allow_config_change_as_the_caller_spells_it(tmp_path):
    from posttrain.models import load_model_and_tokenizer

    run = tmp_path / "run"
    model, tok = load_model_and_tokenizer("tiny")
    save_checkpoint(
        run / "checkpoints",
        1,
        model=model,
        tokenizer=tok,
        optimizer=None,
        trainer_state={"step": 1, "config": {"seed": 1}},
    )
    with pytest.raises(RunDirError) as e:
        check_resume(run, {"seed": 2})
    assert "allow_config_change=True" in str(e.value) and "--allow" not in str(e.value)
    with command_line_messages(), pytest.raises(RunDirError) as e:
        check_resume(run, {"seed": 2})
    assert "--allow-config-change" in str(e.value) and str(e.value).startswith("--resume:")


def test_the_command_line_names_flags_and_leaves_python_spelling_afterwards(tmp_path):
    run = _previous_run(tmp_path / "run")
    res = CliRunner().invoke(app, ["rl", "model.name=tiny", f"out_dir={run}"])
    assert res.exit_code == 2 and "--resume" in res.output and "--overwrite" in res.output
    assert option("resume") == "resume=True"  # the CLI's spelling ended with the command


def test_a_changed_steps_matters_only_where_the_lr_schedule_depends_on_it():
    """Issue 41 item 18 (`schedule_jump`): cosine over `steps` moves; constant, a step still in warmup,
    or an SFT run whose horizon is `schedule_steps` does not."""
    from posttrain.train.run_dir import schedule_jump

    def cfg(steps, schedule="cosine", warmup=0, **extra):
        opt = {"lr": 1e-4, "schedule": schedule, "warmup_steps": warmup, "min_lr_ratio": 0.0}
        return {"steps": steps, "optimizer": opt, **extra}

    note = schedule_jump(cfg(40), cfg(100), 30)
    # 40 -> 100 at step 30: 0.5(1 + cos(0.75 pi)) = 0.146 -> 0.5(1 + cos(0.3 pi)) = 0.794 of the peak
    assert note is not None and "from 1.46e-05 to 7.94e-05 (5.42x)" in note
    assert schedule_jump(cfg(40, "constant"), cfg(100, "constant"), 30) is None
    assert schedule_jump(cfg(40, warmup=10), cfg(100, warmup=10), 5) is None  # still warming up
    assert schedule_jump(cfg(40, schedule_steps=120), cfg(100, schedule_steps=120), 30) is None
    assert schedule_jump({"steps": 4}, {"steps": 8}, 2) is None  # a config without an optimizer


def test_prepare_driver_dir_refuses_keeps_or_empties_a_held_folder(tmp_path):
    from posttrain.train.run_dir import LOCK_NAME, RunDirError, prepare_driver_dir

    out = tmp_path / "d"
    assert prepare_driver_dir(out, "demo x", resume=False, overwrite=False) == out and out.is_dir()
    (out / LOCK_NAME).write_text("")  # the CLI's lock alone is not a previous driver
    prepare_driver_dir(out, "demo x", resume=False, overwrite=False)
    (out / "arm").mkdir()
    (out / "a.json").write_text("{}")
    with pytest.raises(RunDirError, match="already holds a demo x; continue it with"):
        prepare_driver_dir(out, "demo x", resume=False, overwrite=False)
    prepare_driver_dir(out, "demo x", resume=True, overwrite=False)
    assert (out / "a.json").is_file() and (out / "arm").is_dir()
    prepare_driver_dir(out, "demo x", resume=False, overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == [LOCK_NAME]
    with pytest.raises(RunDirError, match="exclude each other"):
        prepare_driver_dir(out, "demo x", resume=True, overwrite=True)
