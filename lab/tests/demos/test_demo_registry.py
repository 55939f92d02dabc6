"""`posttrain demo [NAME]` dispatch: a name picks a registered demo, options / key=value overrides / no
argument run the default RL demo, an unknown name is an error listing the registered names. The demo
runners are replaced by recorders, so nothing trains here."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from posttrain.cli import app
from posttrain_lab.cli.demo import DEFAULT_DEMO, demo_app, demo_names

runner = CliRunner()


@pytest.fixture
def calls(monkeypatch):
    rec: list[tuple[str, tuple, dict]] = []
    import posttrain_lab.demos.tiny as rl_demo
    import posttrain_lab.recipes.patarm.demo as rm_demo

    monkeypatch.setattr(rl_demo, "run_demo", lambda *a, **k: rec.append(("rl", a, k)))
    monkeypatch.setattr(rm_demo, "run_rm_demo", lambda *a, **k: rec.append(("rm", a, k)))
    import posttrain_lab.recipes.patarm.real_demo as rm_real

    monkeypatch.setattr(rm_real, "run_real_rm_demo", lambda *a, **k: rec.append(("rm-real", a, k)))
    return rec


def _run(args: list[str]):
    return runner.invoke(app, args)


def test_no_name_runs_the_rl_demo_as_before(calls):
    # what `make demo` runs
    res = _run(["demo", "--out", "runs/x", "--overwrite"])
    assert res.exit_code == 0, res.output
    assert len(calls) == 1
    name, args, kw = calls[0]
    assert name == "rl" and args == (Path("runs/x"),) and kw["overwrite"] is True and kw["overrides"] == []
    res = _run(["demo"])
    assert res.exit_code == 0, res.output
    assert calls[-1][0] == "rl" and calls[-1][1] == (Path("runs/demo"),)


def test_overrides_only_run_the_rl_demo(calls):
    res = _run(["demo", "optimizer.lr=2e-4", "steps=3", "--seed", "1"])
    assert res.exit_code == 0, res.output
    name, _, kw = calls[-1]
    assert name == "rl" and kw["overrides"] == ["optimizer.lr=2e-4", "steps=3"] and kw["seed"] == 1


def test_name_picks_the_registered_demo(calls):
    res = _run(["demo", "rm", "--char", "--quick", "--out", "runs/r", "--par-steps", "3", "--no-progress"])
    assert res.exit_code == 0, res.output
    name, args, kw = calls[-1]
    assert name == "rm" and args == (Path("runs/r"),)
    assert kw["quick"] is True and kw["par_steps"] == 3 and kw["judge_sft_steps"] is None
    assert kw["progress"] is False and kw["trace"] == "check"
    # the explicit default name and the `rm demo` alias reach the same runners
    assert _run(["demo", "rl", "steps=2"]).exit_code == 0 and calls[-1][0] == "rl"
    assert calls[-1][2]["overrides"] == ["steps=2"]
    assert _run(["rm", "demo", "--char", "--quick"]).exit_code == 0 and calls[-1][0] == "rm"
    # without --char: the real-model demo
    assert _run(["demo", "rm", "--quick", "--seeds", "3", "--rlhf-arms", ""]).exit_code == 0
    name, args, kw = calls[-1]
    assert name == "rm-real" and args == (Path("runs/rm-real"),)
    assert kw["settings"].seeds == (3,) and kw["rlhf_arms"] == () and kw["settings"].n_train_prompts == 8


def test_unknown_name_is_an_error_listing_the_demos(calls):
    res = _run(["demo", "nosuchdemo", "--quick"])
    assert res.exit_code == 2 and not calls
    assert "unknown demo 'nosuchdemo'" in res.output
    for n in ("rl", "rm"):
        assert n in res.output


def test_rm_options_are_not_rl_options(calls):
    # an rm-only option without the name goes to the RL demo, which rejects it
    res = _run(["demo", "--par-steps", "3"])
    assert res.exit_code == 2 and not calls


def test_help_lists_the_demos():
    res = _run(["demo", "--help"])
    assert res.exit_code == 0
    assert "rl" in res.output and "rm" in res.output and "PaTaRM" in res.output
    assert DEFAULT_DEMO == "rl" and {"rl", "rm"} <= set(demo_names())


def test_a_new_demo_registers_by_name_only(calls):
    seen = []

    @demo_app.command("zz-test-demo")
    def _zz(n: int = typer.Option(1, "--n")) -> None:
        seen.append(n)

    try:
        res = _run(["demo", "zz-test-demo", "--n", "4"])
        assert res.exit_code == 0, res.output
        assert seen == [4] and "zz-test-demo" in demo_names()
    finally:
        demo_app.registered_commands.pop()
    assert "zz-test-demo" not in demo_names()
