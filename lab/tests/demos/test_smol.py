"""`posttrain demo smol`: paired standard error, and the whole demo path on the tiny preset (the real
model run is a measurement, in docs/real-model.md)."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

pytest.importorskip("if_verifiable")

from posttrain.cli import app
from posttrain_lab.demos.smol import paired_gain


def test_paired_gain_closed_form():
    before = [0, 0, 1, 1, 0, 0, 0, 1]
    after = [1, 0, 1, 1, 1, 0, 1, 0]
    d = [1, 0, 0, 0, 1, 0, 1, -1]
    mean = sum(d) / 8
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / 7)
    g = paired_gain([bool(x) for x in before], [bool(x) for x in after])
    assert g["gain"] == pytest.approx(0.25) and g["se"] == pytest.approx(sd / math.sqrt(8))
    assert g["gain_over_se"] == pytest.approx(0.25 / (sd / math.sqrt(8)))
    with pytest.raises(ValueError, match="equally long"):
        paired_gain([True], [True, False])


def test_smol_demo_runs_end_to_end_on_tiny(tmp_path):
    out = tmp_path / "smol"
    res = CliRunner().invoke(
        app,
        [
            "demo",
            "smol",
            "--out",
            str(out),
            "--rl-steps",
            "1",
            "--no-ifbench",
            "--no-progress",
            "model.name=tiny",
            "task.params.n_train=16",
            "task.params.n_heldout=6",
            "task.params.n_ood=6",
            "eval.n=6",
            "rollout.max_new_tokens=8",
            "rollout.prompts_per_step=2",
            "rollout.group_size=2",
            "reward.num_workers=0",
        ],
    )
    assert res.exit_code == 0, res.output
    s = json.loads((out / "summary.json").read_text())
    assert s["rl_steps"] == 1 and s["heldout_before"]["n"] == 6 and s["ifbench_before"] is None
    assert set(s["heldout_gain"]) == {"gain", "se", "gain_over_se"} and s["ifbench_prompt_gain"] is None
    # issue 40's figures: trained types, untrained types (the ood split), hacked_frac before and after
    for key in ("heldout_trained", "heldout_new_types"):
        assert set(s[key]) == {"before", "after", "diff", "se"}
    assert s["heldout_trained"]["diff"] == s["heldout_gain"]["gain"]
    assert set(s["hacked_frac"]) == {"before", "after"} and 0 <= s["hacked_frac"]["after"] <= 1
    assert s["reward"] == "instructions_guarded" and s["heldout_new_types_before"]["n"] == 6
    items = json.loads((out / "items.json").read_text())
    assert len(items["heldout"]["before"]) == len(items["heldout"]["after"]) == 6
    assert len(items["ood"]["after"]) == 6 and "hacked" in items["ood"]["after"][0]
    assert (out / "rl" / "model" / "config.json").is_file() and (out / "curves.png").is_file()


def test_shipped_demo_smol_config_builds_its_task():
    """The shipped settings must be satisfiable: n_train 2000 asked for more distinct one-type prompts than
    the request x topic x kwargs space holds (520), so the real demo stopped before loading the model."""
    from importlib.resources import files

    from posttrain.tasks import get_task
    from posttrain.train.config import RLConfig
    from posttrain.utils.config import build_config

    cfg = build_config(RLConfig, str(files("posttrain_lab.demos") / "demo_smol.yaml"), [])
    task = get_task(cfg.task.name, **cfg.task.params)
    train, held = task.split("train"), task.split("heldout")
    assert len(train) == cfg.task.params["n_train"] and len(held) >= cfg.eval.n
    assert not {e.prompt for e in train} & {e.prompt for e in held}
    from posttrain.models.precision import resolve_precision

    # the real model runs in the CPU's native precision: bf16 with AVX512-BF16/AMX, fp32 on AVX2 only
    assert cfg.model.precision == resolve_precision("auto", "cpu")[0] and cfg.rollout.engine.name == "fast"
