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
