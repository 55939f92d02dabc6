"""`posttrain demo smol`: paired standard error, and the whole demo path on the tiny preset (the real
model run is a measurement, in docs/real-model.md)."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

pytest.importorskip("if_verifiable")

from posttrain.cli import app
from posttrain.utils.stats import paired_gain


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


TINY = [
    "model.name=tiny",
    "task.params.n_train=16",
    "task.params.n_heldout=6",
    "task.params.n_ood=6",
    "eval.n=6",
    "rollout.max_new_tokens=8",
    "rollout.prompts_per_step=2",
    "rollout.group_size=2",
    "reward.num_workers=0",
    "hooks.shapers=[{name: dapo-overlong, params: {max_length: 8, buffer: 4, factor: 0.5}}]",
]


def test_smol_demo_runs_end_to_end_on_tiny(tmp_path):
    out = tmp_path / "smol"
    args = [
        "demo",
        "smol",
        "--out",
        str(out),
        "--rl-steps",
        "1",
        "--no-ifbench",
        "--no-progress",
        "--seeds",
        "2",
    ]
    res = CliRunner().invoke(app, [*args, *TINY])
    assert res.exit_code == 0, res.output
    s = json.loads((out / "summary.json").read_text())
    assert s["rl_steps"] == 1 and s["seeds"] == [0, 1] and s["ifbench"] is None
    assert s["before"]["heldout"]["n"] == 6 and s["before"]["ifbench"] is None
    # issue 40's figures: trained types, untrained types (the ood split), hacked_frac before and after
    for key in ("heldout_trained", "heldout_new_types"):
        assert {"before", "after", "diff", "se", "per_seed"} <= set(s[key]) and len(s[key]["per_seed"]) == 2
    assert set(s["hacked_frac"]) == {"before", "after", "per_seed"} and 0 <= s["hacked_frac"]["after"] <= 1
    assert s["reward"] == "instructions_guarded" and s["reward_params"]["mode"] == "reject"
    # issue 58 item 18: the machine kind a figure comes from (the same seed gave +24.0 and +10.3 on two)
    from posttrain.models.precision import cpu_capability

    assert s["machine"]["cpu_capability"] == cpu_capability() and s["machine"]["cpu"]
    assert s["machine"]["precision_setting"] == "auto" and s["machine"]["precision"] in ("fp32", "bf16")
    assert "[smol] machine: " in res.output and cpu_capability() in res.output
    # the gates, read from each seed's step metrics: tiny's 8 random tokens are always flagged and cut
    for seed in ("0", "1"):
        g = s["gates"][seed]
        assert set(g) == {"sampled_hacked_frac", "shaped_groups_frac", "truncated_frac", "zero_var_frac"}
        assert g["sampled_hacked_frac"]["mean"] == 1.0 and g["shaped_groups_frac"]["mean"] > 0
    items = json.loads((out / "items.json").read_text())
    before = [float(i["strict"]) for i in items["heldout"]["before"]]
    after = [
        (float(a["strict"]) + float(b["strict"])) / 2
        for a, b in zip(*items["heldout"]["after"].values(), strict=True)
    ]
    # the headline is paired over prompts of the seed-averaged verdicts
    assert s["heldout_trained"]["diff"] == pytest.approx(paired_gain(before, after)["gain"])
    assert s["heldout_trained"]["se"] == pytest.approx(paired_gain(before, after)["se"])
    # clean: the checker followed and no probe fired (the guarded reward's verdict)
    clean_b = [float(i["strict"] and not i["hacked"]) for i in items["heldout"]["before"]]
    clean_a = [
        (float(a["strict"] and not a["hacked"]) + float(b["strict"] and not b["hacked"])) / 2
        for a, b in zip(*items["heldout"]["after"].values(), strict=True)
    ]
    assert s["heldout_trained"]["clean"]["diff"] == pytest.approx(paired_gain(clean_b, clean_a)["gain"])
    assert len(items["ood"]["after"]["1"]) == 6 and "hacked" in items["ood"]["after"]["0"][0]
    for seed in (0, 1):
        assert (out / f"seed{seed}" / "rl" / "model" / "config.json").is_file()
        assert (out / f"seed{seed}" / "after.json").is_file()
        assert not (out / f"seed{seed}" / "rl" / "checkpoints").exists()  # dropped once after.json exists
    assert (out / "curves.png").is_file() and (out / "before.json").is_file()
    # a finished demo is not overwritten silently
    res = CliRunner().invoke(app, [*args, *TINY])
    assert res.exit_code != 0 and "--overwrite" in res.output


def test_smol_demo_resumes_a_stopped_seed_without_redoing_finished_parts(tmp_path, monkeypatch):
    """Killed during seed 1's evaluation after RL: --resume keeps before.json and seed 0, resumes seed 1
    from its last checkpoint (no step trained twice) and evaluates it."""
    import posttrain_lab.demos.smol as smol

    out = tmp_path / "smol"
    calls = []
    real = smol._evaluate_sets

    def stop_on_fourth(*a, **k):  # before RL, seed 0 after, seed 1 after (killed)
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(smol, "_evaluate_sets", stop_on_fourth)
    kw = {"rl_steps": 2, "ifbench": False, "seeds": 2, "progress": False, "overrides": TINY}
    with pytest.raises(KeyboardInterrupt):
        smol.run_smol_demo(out, **kw)
    assert (out / "seed0" / "after.json").is_file() and not (out / "seed1" / "after.json").exists()
    assert (out / "seed1" / "rl" / "checkpoints" / "latest").is_file()
    steps_before = (out / "seed1" / "rl" / "metrics.jsonl").read_text().count('"kind": "step"')
    seed0 = (out / "seed0" / "after.json").read_text()
    with pytest.raises(ValueError, match="resume=True"):  # a stopped demo is not silently started over
        smol.run_smol_demo(out, **kw)
    calls.clear()
    monkeypatch.setattr(smol, "_evaluate_sets", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    s = smol.run_smol_demo(out, resume=True, **kw)
    assert len(calls) == 1  # only seed 1's evaluation after RL
    assert (out / "seed0" / "after.json").read_text() == seed0
    assert (out / "seed1" / "rl" / "metrics.jsonl").read_text().count('"kind": "step"') == steps_before == 2
    assert s["seeds"] == [0, 1] and len(s["heldout_trained"]["per_seed"]) == 2
    # resuming with settings that change the evaluation before RL is refused, naming the key
    with pytest.raises(ValueError, match="max_new_tokens"):
        nine = "hooks.shapers=[{name: dapo-overlong, params: {max_length: 9, buffer: 4, factor: 0.5}}]"
        smol.run_smol_demo(out, resume=True, **{**kw, "overrides": [*TINY, "rollout.max_new_tokens=9", nine]})


def test_the_summary_names_the_machine_and_the_precision_computed_in(monkeypatch):
    """``machine`` resolves ``model.precision`` as the run does: ``auto`` follows the CPU (or
    POSTTRAIN_AUTO_PRECISION), an explicit setting is kept; the CPU's capability is recorded as is."""
    from importlib.resources import files

    from posttrain.models.precision import cpu_capability
    from posttrain.train.config import RLConfig
    from posttrain.utils.config import build_config
    from posttrain_lab.demos.smol import machine

    yaml = str(files("posttrain_lab.demos") / "demo_smol.yaml")
    for forced in ("bf16", "fp32"):
        monkeypatch.setenv("POSTTRAIN_AUTO_PRECISION", forced)
        m = machine(build_config(RLConfig, yaml, []))
        assert m["precision"] == forced and m["precision_setting"] == "auto"
        assert m["precision_reason"] == f"POSTTRAIN_AUTO_PRECISION={forced}"
    m = machine(build_config(RLConfig, yaml, ["model.precision=fp32"]))
    assert (m["precision"], m["precision_setting"], m["precision_reason"]) == (
        "fp32",
        "fp32",
        "set explicitly",
    )
    assert m["cpu_capability"] == cpu_capability()


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
    # the real model runs in the CPU's native precision (bf16 with AVX512-BF16/AMX, fp32 on AVX2 only):
    # the config says auto, resolved where the model is built
    assert cfg.model.precision == "auto" and cfg.rollout.engine.name == "fast"
