"""A full disk while appending to metrics.jsonl or writing SFT's final model/ is one line naming the
file, what was kept and the checkpoint to continue from (issue 41 item 21; checkpoints had it already).
The OS error is simulated (OSError ENOSPC); tests run as root, who may write anywhere."""

from __future__ import annotations

import errno
import json
import warnings

from _train_helpers import CLI_TINY
from typer.testing import CliRunner

from posttrain.cli import app
from posttrain.train.builder import DegenerateSettingWarning

runner = CliRunner()
QUICK = [*CLI_TINY, "eval.at_start=false", "eval.at_end=false", "--no-progress"]


def _invoke(args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateSettingWarning)
        return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


def _enospc(path=None):
    return OSError(errno.ENOSPC, "No space left on device", *([str(path)] if path else []))


def test_full_disk_appending_metrics_is_one_line_naming_the_file_and_checkpoint(tmp_path, monkeypatch):
    from posttrain.train import logger as logger_mod

    real = logger_mod.append_jsonl

    def full_at_step_3(path, row):
        if row.get("kind") == "step" and row.get("step") == 3:
            raise _enospc(path)
        return real(path, row)

    monkeypatch.setattr(logger_mod, "append_jsonl", full_at_step_3)
    run = tmp_path / "run"
    res = _invoke(["rl", *QUICK, f"out_dir={run}", "steps=4", "checkpoint.every=2"])
    assert res.exit_code == 2, res.output
    errors = [ln for ln in res.output.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in res.output, res.output
    metrics = run / "metrics.jsonl"
    assert (
        f"error: could not append the metrics of step 3 to {metrics}: No space left on device (ENOSPC); "
        "the rows before it are kept (no partial row) and the run stopped, and the last good checkpoint "
        f"is {run / 'checkpoints' / 'step_000002'}"
    ) in errors[0]
    assert "--resume" in errors[0]
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["step"] for r in rows if r["kind"] == "step"] == [1, 2]
    monkeypatch.undo()
    res = _invoke(["rl", *QUICK, f"out_dir={run}", "steps=4", "checkpoint.every=2", "--resume"])
    assert res.exit_code == 0, res.output
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["step"] for r in rows if r["kind"] == "step"] == [1, 2, 3, 4]


def test_a_failed_append_leaves_no_partial_row(tmp_path, monkeypatch):
    """append_jsonl takes back the part of a row the disk took before it filled up."""
    from posttrain.utils import io

    path = tmp_path / "m.jsonl"
    io.append_jsonl(path, {"step": 1})
    before = path.read_bytes()
    real_write = io.os.write

    def half_then_full(fd, data):
        if len(data) > 4:
            return real_write(fd, bytes(data[: len(data) // 2]))
        raise _enospc()

    monkeypatch.setattr(io.os, "write", half_then_full)
    try:
        io.append_jsonl(path, {"step": 2, "loss": 0.5})
    except OSError as e:
        assert e.errno == errno.ENOSPC
    else:
        raise AssertionError("no error")
    monkeypatch.undo()
    assert path.read_bytes() == before
    io.append_jsonl(path, {"step": 2})
    assert [json.loads(x)["step"] for x in path.read_text().splitlines()] == [1, 2]


def test_full_disk_writing_sfts_model_names_the_folder_and_the_final_checkpoint(tmp_path, monkeypatch):
    from posttrain.models import saving

    data = tmp_path / "d.jsonl"
    data.write_text(
        "".join(json.dumps({"prompt": f"{i}+1=", "completion": str(i + 1)}) + "\n" for i in range(6))
    )
    real_save = saving.install_dir

    def full_for_model(tmp, final):
        if final.name == "model":
            raise _enospc(tmp / "model.safetensors")
        return real_save(tmp, final)

    monkeypatch.setattr(saving, "install_dir", full_for_model)
    run = tmp_path / "sft"
    args = ["sft", "model.name=tiny", "model.device=cpu", f"data={data}", "steps=2", "batch_size=2"]
    args += ["threads=1", f"out_dir={run}", "--no-progress"]
    res = _invoke(args)
    assert res.exit_code == 2, res.output
    errors = [ln for ln in res.output.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in res.output, res.output
    ckpt = run / "checkpoints" / "step_000002"
    assert errors[0].startswith(
        f"error: could not write the trained model to {run / 'model'}: No space left on device (ENOSPC) at "
    )
    assert "no partial model/ was kept" in errors[0] and "the trained weights of step 2" in errors[0]
    assert f"the last good checkpoint is {ckpt}" in errors[0] and "--resume" in errors[0]
    assert not (run / "model").exists() and not [p for p in run.iterdir() if p.name.startswith(".tmp")]
    monkeypatch.undo()
    res = _invoke([*args, "--resume"])  # what the message says: the model is written from the checkpoint
    assert res.exit_code == 0, res.output
    assert (run / "model" / "config.json").is_file()
