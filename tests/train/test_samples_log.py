"""samples.jsonl: the completions behind the numbers, every logging.samples_every steps, and
`posttrain samples RUN [--step N] [--worst]`."""

from __future__ import annotations

import json
import sys
import warnings

import pytest
from _train_helpers import CLI_TINY, FirstCharDigit
from typer.testing import CliRunner

from posttrain.cli import app
from posttrain.rollout import FunctionRewardSource
from posttrain.train.config import load_rl_config
from posttrain.train.rl import DegenerateSettingWarning, RLTrainer
from posttrain.train.samples import markdown_table, select


def _rows(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_rows_match_the_step_and_resume_drops_later_steps(tmp_path):
    over = [
        *CLI_TINY,
        "rollout.group_size=4",
        "eval.at_start=false",
        "eval.at_end=false",
        "logging.samples_every=2",
        "checkpoint.every=2",
        "checkpoint.final=false",
        f"out_dir={tmp_path / 'run'}",
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateSettingWarning)
        src = FunctionRewardSource(FirstCharDigit(), num_workers=0)
        with RLTrainer(load_rl_config(None, [*over, "steps=4"]), reward_source=src) as tr:
            seen = {}
            orig = tr.step

            def step():  # remember what each step scored, to compare with the file
                m = orig()
                ro, sc = tr.last_scored
                seen[tr.step_idx] = (list(ro.episodes.texts), sc.raw.tolist(), sc.advantages.tolist())
                return m

            tr.step = step
            tr.train(progress=False)
    rows = _rows(tmp_path / "run" / "samples.jsonl")
    assert sorted({r["step"] for r in rows}) == [2, 4]  # every 2nd step only
    for s in (2, 4):
        got = [r for r in rows if r["step"] == s]
        texts, raw, adv = seen[s]
        assert [r["completion"] for r in got] == texts
        assert [r["reward"] for r in got] == pytest.approx(raw)
        assert [r["advantage"] for r in got] == pytest.approx(adv)
        assert all(r["reward"] == float(r["completion"][:1].isdigit()) for r in got)
        assert all(r["length"] <= 3 and r["truncated"] == (r["length"] == 3) for r in got)
        assert len({r["group"] for r in got}) == 2 and all("+" in r["prompt"] for r in got)
    # resuming from the step-2 checkpoint of a killed run drops the later steps' rows first
    ck = tmp_path / "run" / "checkpoints"
    (ck / "latest").write_text("step_000002\n")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateSettingWarning)
        cfg = load_rl_config(None, [*over, "steps=3", "logging.samples_every=1"])
        with RLTrainer(cfg, resume=True) as tr:
            tr.train(progress=False, allow_config_change=True)
    assert sorted({r["step"] for r in _rows(tmp_path / "run" / "samples.jsonl")}) == [2, 3]


def test_cli_samples_table_step_and_worst(tmp_path):
    run = tmp_path / "run"
    res = CliRunner().invoke(
        app, ["rl", *CLI_TINY, "steps=2", "logging.samples_every=1", "eval.at_start=false", f"out_dir={run}"]
    )
    assert res.exit_code == 0, res.output
    rows = _rows(run / "samples.jsonl")
    assert sorted({r["step"] for r in rows}) == [1, 2] and len(rows) == 8
    out = CliRunner().invoke(app, ["samples", str(run), "--step", "1", "--width", "40"])
    assert out.exit_code == 0, out.output
    assert "4 completions" in out.output and "completion" in out.output
    first = next(r for r in rows if r["step"] == 1)
    assert first["prompt"] in out.output
    js = CliRunner().invoke(app, ["samples", str(run), "--worst", "--json", "-n", "3"])
    got = [json.loads(x) for x in js.output.splitlines()]
    assert len(got) == 3 and all(r["step"] == 2 for r in got)
    assert [r["reward"] for r in got] == sorted(r["reward"] for r in got)
    bad = CliRunner().invoke(app, ["samples", str(run), "--step", "7"])
    assert bad.exit_code == 2 and "steps with samples: 1, 2" in bad.output
    none = CliRunner().invoke(app, ["samples", str(tmp_path)])
    assert none.exit_code == 2 and "no samples file" in none.output


def test_worst_order_and_markdown():
    rows = [
        {"step": 1, "group": 0, "reward": 1.0, "truncated": False, "advantage": 0.5, "length": 2,
         "prompt": "a|b", "completion": "x\ny"},
        {"step": 1, "group": 0, "reward": 0.0, "truncated": False, "advantage": -0.5, "length": 2,
         "prompt": "p", "completion": "c"},
        {"step": 1, "group": 1, "reward": 0.0, "truncated": True, "advantage": -0.1, "length": 3,
         "prompt": "p", "completion": "c"},
    ]  # fmt: skip
    _, w = select(rows, worst=True)
    assert [(r["reward"], r["truncated"]) for r in w] == [(0.0, True), (0.0, False), (1.0, False)]
    md = markdown_table(rows)
    assert "a\\|b" in md and "x⏎y" in md and md.count("\n") == 4


def test_tensorboard_gets_the_samples_table(tmp_path):
    pytest.importorskip("tensorboard")
    run = tmp_path / "run"
    res = CliRunner().invoke(
        app,
        ["rl", *CLI_TINY, "steps=1", "logging.samples_every=1", "logging.tensorboard=true", f"out_dir={run}"],
    )
    assert res.exit_code == 0, res.output
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ev = EventAccumulator(str(run / "tensorboard"), size_guidance={"tensors": 0})
    ev.Reload()
    assert any("samples" in t for t in ev.Tags()["tensors"])


def test_samples_reach_tensorboard_and_wandb_writers(tmp_path, monkeypatch):
    """The mirror to the enabled loggers (TensorBoard's add_text, a wandb.Table), with stand-in writers
    (neither extra is installed in CI)."""
    import types

    from posttrain.train.samples import SamplesLog

    calls = []
    tb = types.SimpleNamespace(add_text=lambda tag, text, step: calls.append(("tb", tag, text, step)))
    fake_wandb = types.ModuleType("wandb")
    fake_wandb.Table = lambda columns, data: ("table", columns, data)
    monkeypatch.setitem(sys.modules, "wandb", fake_wandb)
    run = types.SimpleNamespace(log=lambda d, step: calls.append(("wandb", d, step)))
    row = {"step": 5, "group": 0, "reward": 1.0, "truncated": False, "advantage": 0.5, "length": 2,
           "prompt": "1+1=", "completion": "2"}  # fmt: skip
    SamplesLog(tmp_path).write([row], tensorboard=tb, wandb=run)
    assert calls[0][:2] == ("tb", "samples") and "1+1=" in calls[0][2] and calls[0][3] == 5
    kind, cols, data = calls[1][1]["samples"]
    assert kind == "table"
    assert calls[1][2] == 5 and cols == list(row) and data == [list(row.values())]
    assert _rows(tmp_path / "samples.jsonl") == [row]
