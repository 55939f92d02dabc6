"""docs/extending.md is runnable: its Python blocks, concatenated, are the plug-in module `my_ext`, and
its YAML config trains and evaluates through the real CLI with every extension point by import path."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

from typer.testing import CliRunner

from posttrain.cli import app
from posttrain.train.rl import DegenerateSettingWarning

DOC = Path(__file__).resolve().parents[2] / "docs" / "extending.md"


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)


def test_extending_doc_examples_run(tmp_path, monkeypatch):
    (tmp_path / "my_ext.py").write_text("\n\n".join(_blocks("python")), encoding="utf-8")
    (cfg,) = _blocks("yaml")
    (tmp_path / "my_ext.yaml").write_text(cfg, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    run = tmp_path / "runs" / "ext"
    samples = tmp_path / "samples.jsonl"
    cli = CliRunner()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateSettingWarning)
        res = cli.invoke(
            app,
            [
                "rl",
                "--config",
                str(tmp_path / "my_ext.yaml"),
                f"out_dir={run}",
                f"rollout.runner.params.path={samples}",
                "steps=2",
                "threads=1",
                "eval.at_start=false",
                "--no-progress",
            ],
            catch_exceptions=False,
        )
        assert res.exit_code == 0, res.output
        rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        steps = [r for r in rows if r["kind"] == "step"]
        assert [r["controller/temperature"] for r in steps] == [1.2, 1.2 + 0.1 * (0.8 - 1.2)]
        # 2 steps x 2 prompts x 4 completions, then 3 greedy held-out completions (the final eval)
        assert len(samples.read_text().splitlines()) == 2 * 2 * 4 + 3
        res = cli.invoke(app, ["eval", "--model", str(run), "--n", "3"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    ev = json.loads(res.stdout.strip().splitlines()[-1])
    assert (
        ev["settings"]["task"] == "my_ext:CountTask" and ev["settings"]["reward"] == "my_ext:StartsWithDigit"
    )
    assert ev["settings"]["engine"]["name"] == "my_ext:TimedEngine" and ev["n"] == 3
    assert len(samples.read_text().splitlines()) == 2 * 2 * 4 + 3 + 3
