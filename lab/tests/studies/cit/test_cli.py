"""End to end through `posttrain cit run | report` on a micro setting, and per-stage resume."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from posttrain.cli import app

MICRO = [
    "sft.steps=2",
    "sft.batch_size=4",
    "stream.n_train=8",
    "stream.n_test=4",
    "stream.tasks=[lookup,format]",
    "stream.heldout=[lookup_upper]",
    "methods=[sequential,rgd-r,kpig]",
    "eval.max_new_tokens=4",
]


def test_cit_run_report_and_resume(tmp_path):
    out = tmp_path / "cit"
    r = CliRunner().invoke(app, ["cit", "run", *MICRO, f"out_dir={out}"])
    assert r.exit_code == 0, r.output
    for m in ("sequential", "rgd-r", "kpig"):
        s = json.loads((out / m / "seed0" / "summary.json").read_text())
        assert len(s["acc"]) == 2 and len(s["acc"][0]) == 2
        assert set(s["metrics"]) >= {
            "average_accuracy",
            "backward_transfer",
            "forward_transfer",
            "forgetting",
        }
        assert 0 <= s["p_score"] <= 1 and 0 <= s["v_score"] <= 1 and 0 <= s["p_score_train_rules"] <= 1
        p_rec = json.loads((out / m / "seed0" / "p_score.json").read_text())
        assert p_rec["rules"] == "heldout" and p_rec["by_rewrite"] == s["p_by_rewrite"]
        assert (out / m / "seed0" / "stage_02" / "model").is_dir()
    kp = json.loads((out / "kpig" / "seed0" / "stage_02.json").read_text())
    assert kp["replay"]["budget"] == 2 and sum(kp["replay"]["alloc"].values()) == 2  # 0.2 x 8 rows
    assert kp["pool"] == {"current": 8, "replay": 2, "diversified": 2}
    assert kp["train"]["last"]["extra_loss"] >= 0  # the hinge ran through the SFT hook
    seq = json.loads((out / "sequential" / "seed0" / "stage_02.json").read_text())
    assert seq["pool"]["replay"] == 0 and "extra_loss" not in seq["train"]["last"]
    for f in ("report.json", "report.md", "report.png"):
        assert (out / f).stat().st_size > 0
    # resume: drop the last stage of one method; a rerun redoes only that stage
    run = out / "kpig" / "seed0"
    keep = (run / "stage_01.json").read_text()
    (run / "stage_02.json").unlink()
    mtime_seq = (out / "sequential" / "seed0" / "stage_02.json").stat().st_mtime_ns
    r = CliRunner().invoke(app, ["cit", "run", *MICRO, f"out_dir={out}"])
    assert r.exit_code == 0, r.output
    assert (run / "stage_01.json").read_text() == keep
    again = json.loads((run / "stage_02.json").read_text())
    assert again["replay"]["alloc"] == kp["replay"]["alloc"]  # same memory scores after resume
    assert (out / "sequential" / "seed0" / "stage_02.json").stat().st_mtime_ns == mtime_seq
    r = CliRunner().invoke(app, ["cit", "report", str(out)])
    assert r.exit_code == 0 and "kpig" in r.output


def test_cit_cli_errors(tmp_path):
    r = CliRunner().invoke(app, ["cit", "run", "methods=[nope]", f"out_dir={tmp_path}"])
    assert r.exit_code == 2 and "unknown method 'nope'" in r.output
    r = CliRunner().invoke(app, ["cit", "report", str(tmp_path / "none")])
    assert r.exit_code == 2 and "no */seed*/summary.json" in r.output
    bad = tmp_path / "train.jsonl"
    bad.write_text('{"instruction": "Give [[x", "output": "y", "task": "a"}\n')
    r = CliRunner().invoke(
        app,
        [
            "cit",
            "run",
            f"stream.source={bad}",
            f"stream.test_data={bad}",
            "stream.tasks=[a]",
            "stream.heldout=[]",
            f"out_dir={tmp_path}/o",
        ],
    )
    assert (
        r.exit_code == 2
        and "train.jsonl: line 1: instruction: '[[' at character 5 is never closed" in r.output
    )
