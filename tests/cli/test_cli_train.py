"""CLI end to end through typer's CliRunner: rl (2 steps) -> eval -> plot, sft data errors (a row without
its key, unknown chat roles), sft -> plot of its loss curve."""

from __future__ import annotations

import json
import warnings

import pytest
from _train_helpers import CLI_TINY
from typer.testing import CliRunner

from posttrain.cli import app
from posttrain.train.rl import DegenerateSettingWarning

runner = CliRunner()

TINY = CLI_TINY


def _invoke(args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateSettingWarning)
        return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


def test_rl_eval_plot_end_to_end(tmp_path):
    run = tmp_path / "run"
    res = _invoke(["rl", *TINY, "steps=2", f"out_dir={run}", "--no-progress"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output.strip().splitlines()[-1])
    assert out["steps"] == 2 and out["eval_start"] is not None and out["eval_end"] is not None
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["kind"] == "step"] == [1, 2]
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_000002"
    assert (run / "config.yaml").is_file()

    res = _invoke(
        [
            "eval",
            "--model",
            str(run),
            "--task-params",
            '{"digits": 1, "n_train": 40, "n_heldout": 10}',
            "--n",
            "4",
            "--k",
            "2",
            "--samples",
            "3",
            "--max-new-tokens",
            "3",
            "--out",
            str(tmp_path / "ev.json"),
        ]
    )
    assert res.exit_code == 0, res.output
    ev = json.loads((tmp_path / "ev.json").read_text())
    assert ev["n"] == 4 and 0 <= ev["accuracy"] <= 1 and 0 <= ev["pass@2"] <= 1

    res = _invoke(["plot", str(run)])
    assert res.exit_code == 0, res.output
    png = run / "curves.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000

    # resume a finished run for 1 more step
    res = _invoke(["rl", *TINY, "steps=3", f"out_dir={run}", "--resume", "--no-progress"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output.strip().splitlines()[-1])["steps"] == 3


def test_rl_config_error_names_key():
    res = _invoke(["rl", "objective.name=dgpoo"])
    assert res.exit_code == 2
    assert "objective.name" in res.output and "dgpo" in res.output


@pytest.mark.parametrize(("value", "needle"), [("{digits: 1}", "invalid JSON"), ("[1]", "got list")])
def test_eval_bad_task_params_names_the_option(value, needle):
    res = _invoke(["eval", "--model", "tiny", "--task-params", value, "--n", "2"])
    assert res.exit_code == 2
    assert "--task-params" in res.output and needle in res.output


def test_sft_bad_dataset_row_gives_clear_error(tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text('{"prompt": "1+1=", "completion": "2"}\n{"prompt": "2+2=", "answer": "4"}\n')
    res = _invoke(["sft", "model.name=tiny", f"data={data}", "steps=1", f"out_dir={tmp_path / 's'}"])
    assert res.exit_code == 2
    assert f"{data}: line 2: missing column 'completion'" in res.output


@pytest.mark.parametrize(("role", "hint"), [("assitant", " (did you mean 'assistant'?)"), ("wizard", "")])
def test_sft_refuses_unknown_chat_roles_naming_file_row_and_roles(tmp_path, role, hint):
    msgs = [{"role": "user", "content": "1+1="}, {"role": "assistant", "content": "2"}]
    bad = [
        {"role": "user", "content": "2+2="},
        {"role": role, "content": "4"},
        {"role": "assistant", "content": "4"},
    ]
    data = _rows(tmp_path / "chat.jsonl", [{"messages": msgs}, {"messages": bad}])
    res = _sft(tmp_path, data)
    assert res.exit_code == 2 and "Traceback" not in res.output
    roles = "accepted roles: system, user, assistant, tool, developer"
    assert f"{data}: line 2: messages[1]: unknown 'role' {role!r}{hint}; {roles}" in res.output, res.output


def _rows(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _sft(tmp_path, data, *extra):
    args = ["sft", "model.name=tiny", "model.device=cpu", f"data={data}", "steps=1", "batch_size=2"]
    return _invoke([*args, "threads=1", f"out_dir={tmp_path / 'sft'}", "--no-progress", *extra])


def test_sft_from_jsonl_runs_and_saves(tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text(
        "".join(json.dumps({"prompt": f"{i}+1=", "completion": str(i + 1)}) + "\n" for i in range(8))
    )
    res = _invoke(
        [
            "sft",
            "model.name=tiny",
            f"data={data}",
            "steps=2",
            "batch_size=4",
            "threads=1",
            f"out_dir={tmp_path / 's'}",
        ]
    )
    assert res.exit_code == 0, res.output
    assert (tmp_path / "s" / "model" / "model.safetensors").is_file()


def test_plot_of_an_sft_run_shows_its_loss_curve(tmp_path, monkeypatch):
    import matplotlib.figure

    data = _rows(tmp_path / "d.jsonl", [{"prompt": f"{i}+1=", "completion": str(i + 1)} for i in range(4)])
    assert _sft(tmp_path, data, "steps=3").exit_code == 0
    titles: list[str] = []
    real = matplotlib.figure.Figure.savefig
    monkeypatch.setattr(
        matplotlib.figure.Figure,
        "savefig",
        lambda self, *a, **k: titles.extend(ax.get_title() for ax in self.axes) or real(self, *a, **k),
    )
    res = _invoke(["plot", tmp_path / "sft"])
    assert res.exit_code == 0, res.output
    assert titles[0] == "loss (nats/token)"
    assert (tmp_path / "sft" / "curves.png").stat().st_size > 0


def test_plot_missing_metrics_is_an_error(tmp_path):
    res = _invoke(["plot", str(tmp_path)])
    assert res.exit_code == 2 and "metrics.jsonl" in res.output


def _read_only(monkeypatch):
    """Writes fail as on a read-only mount (tests run as root, who may write anywhere)."""
    import errno

    import posttrain.utils.io as io_mod

    def refuse(*a, dir=None, **k):
        raise OSError(errno.EROFS, "Read-only file system", str(dir))

    monkeypatch.setattr(io_mod.tempfile, "mkstemp", refuse)


@pytest.mark.parametrize("case", ["read-only", "a file in the way", "a directory"])
def test_plot_to_an_unwritable_out_is_one_line(case, tmp_path, monkeypatch):
    """Issue 58 item 3: `plot --out` to a read-only path was a 53-line traceback; now one line naming the
    path and why, as rl/sft/eval give."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"kind": "step", "step": 1, "loss": 1.0}\n', encoding="utf-8")
    out = {"read-only": tmp_path / "x.png", "a file in the way": run / "metrics.jsonl" / "x.png"}.get(
        case, run
    )
    why = {
        "read-only": "Read-only file system (EROFS)",
        "a file in the way": "(EEXIST)",
        "a directory": "Is a directory (EISDIR)",
    }[case]
    if case == "read-only":
        _read_only(monkeypatch)
    res = runner.invoke(app, ["plot", str(run), "--out", str(out)])
    assert res.exit_code == 2, res.output
    lines = res.output.splitlines()
    assert len(lines) == 1 and "Traceback" not in res.output, res.output
    assert lines[0].startswith(f"error: could not write the curves to {out}: ") and why in lines[0], lines[0]
