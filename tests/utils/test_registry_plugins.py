"""Plug-ins from outside the package (``package.module:Name``) in every registry, and the engine /
runner / reward-source registries, through the real CLI (``posttrain rl`` and ``posttrain eval``).

The plug-in module is ``tests/helpers/my_plugins.py``; each test puts its folder on ``sys.path``.
"""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import pytest
from _train_helpers import CLI_TINY
from typer.testing import CliRunner

from posttrain.cli import app
from posttrain.train.rl import DegenerateSettingWarning
from posttrain.utils.registry import PluginError, Registry

PLUGINS = Path(__file__).resolve().parents[1] / "helpers"
cli = CliRunner()

TINY = [*CLI_TINY[:-1], "eval.at_start=false", CLI_TINY[-1]]


@pytest.fixture
def plugins(monkeypatch):
    monkeypatch.syspath_prepend(str(PLUGINS))
    import my_plugins

    for key in my_plugins.CALLS:
        my_plugins.CALLS[key] = 0
    my_plugins.SEEN.clear()
    return my_plugins


def _invoke(args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateSettingWarning)
        return cli.invoke(app, args, catch_exceptions=False)


def _last_json(res):
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_rl_and_eval_cli_with_plugin_engine_runner_source_loss_advantage_hook(plugins, tmp_path):
    run = tmp_path / "run"
    res = _invoke(
        [
            "rl",
            *TINY,
            "steps=2",
            f"out_dir={run}",
            "rollout.engine.name=my_plugins:CountingEngine",
            "rollout.engine.params={tag: from-config}",
            "rollout.runner.name=my_plugins:counting_runner",
            "reward.source.name=my_plugins:ConstantSource",
            "reward.source.params={value: 0.25}",
            "objective.name=my_plugins:plugin_reinforce",
            "objective.params={gain: 2.0}",
            "advantage.name=my_plugins:centered",
            "advantage.params={shift: 0.5}",
            "hooks.shapers=[{name: 'my_plugins:ClipShaper', params: {low: 0.0, high: 0.1}}]",
            "--no-progress",
        ]
    )
    assert res.exit_code == 0, res.output
    out = _last_json(res)
    assert out["steps"] == 2
    assert out["reward_mean"] == pytest.approx(0.25)  # the plug-in reward source scored every step
    calls = plugins.CALLS
    # 2 training rollouts + the final greedy evaluation, all through the plug-in engine and runner
    assert calls["engine"] >= 3 and calls["runner"] >= 3
    assert calls["loss"] >= 2 and calls["advantage"] == 2 and calls["shaper"] == 2
    assert calls["source"] == 2 * 4 + 4  # 4 completions per step, 4 held-out greedy completions
    assert plugins.SEEN == {"engine_tag": "from-config", "runner_engine": "CountingEngine"}
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["kind"] == "step"]
    # shaped rewards went through ClipShaper (0.25 -> 0.1) before the plug-in advantage
    assert [r["reward_shaped_mean"] for r in steps] == pytest.approx([0.1, 0.1])

    # `posttrain eval` of the run folder: engine, runner and reward source from the run's config.yaml
    for key in calls:
        calls[key] = 0
    res = _invoke(["eval", "--model", str(run), "--n", "3", "--out", str(tmp_path / "ev.json")])
    assert res.exit_code == 0, res.output
    ev = json.loads((tmp_path / "ev.json").read_text())
    assert ev["n"] == 3 and ev["reward_mean"] == pytest.approx(0.25) and ev["accuracy"] == 0.0
    assert calls["engine"] == 1 and calls["runner"] == 1 and calls["source"] == 3
    assert ev["settings"]["engine"] == {"name": "my_plugins:CountingEngine", "params": {"tag": "from-config"}}
    assert ev["settings"]["runner"]["name"] == "my_plugins:counting_runner"
    assert ev["settings"]["reward_source"] == {"name": "my_plugins:ConstantSource", "params": {"value": 0.25}}


def test_eval_cli_engine_runner_source_named_in_config_file(plugins, tmp_path):
    cfg = tmp_path / "eval.yaml"
    cfg.write_text(
        "task: {name: arithmetic, params: {digits: 1, n_train: 40, n_heldout: 10}}\n"
        "rollout: {max_new_tokens: 2, engine: {name: hf}, runner: {name: single-turn}}\n"
        "reward: {num_workers: 0, source: {name: 'my_plugins:ConstantSource', params: {value: 1.0}}}\n"
    )
    res = _invoke(["eval", "--model", "tiny", "--config", str(cfg), "--n", "2"])
    assert res.exit_code == 0, res.output
    ev = _last_json(res)
    assert ev["accuracy"] == 1.0 and ev["reward_mean"] == 1.0 and plugins.CALLS["source"] == 2
    # a key=value override replaces the config file's source (name and params) by the default
    res = _invoke(["eval", "--model", "tiny", "-c", str(cfg), "--n", "2", "reward.source={name: function}"])
    assert res.exit_code == 0, res.output
    assert _last_json(res)["settings"]["reward_source"]["name"] == "function"
    assert plugins.CALLS["source"] == 2


def test_rl_cli_with_plugin_task_and_reward(plugins, tmp_path):
    res = _invoke(
        [
            "rl",
            "model.name=tiny",
            "model.device=cpu",
            "task.name=my_plugins:CountTask",
            "task.params={n_heldout: 2}",
            "reward.name=my_plugins:StartsWithDigit",
            "reward.num_workers=0",
            "rollout.prompts_per_step=2",
            "rollout.group_size=2",
            "rollout.max_new_tokens=2",
            "eval.n=2",
            "steps=1",
            "threads=1",
            f"out_dir={tmp_path / 'r'}",
            "--no-progress",
        ]
    )
    assert res.exit_code == 0, res.output
    out = _last_json(res)
    assert out["steps"] == 1 and 0.0 <= out["reward_mean"] <= 1.0
    ev = _invoke(["eval", "--model", str(tmp_path / "r"), "--n", "5"])
    assert ev.exit_code == 0, ev.output
    rec = _last_json(ev)
    assert rec["settings"]["task"] == "my_plugins:CountTask" and rec["n"] == 2  # the task has 2 held-out
    assert rec["settings"]["reward"] == "my_plugins:StartsWithDigit"


@pytest.mark.parametrize(
    ("override", "needles"),
    [
        (
            "rollout.engine.name=no_such_module:Engine",
            ["rollout.engine", "cannot import module 'no_such_module'"],
        ),
        ("rollout.runner.name=my_plugins:nope", ["rollout.runner", "has no attribute 'nope'"]),
        ("reward.source.name=my_plugins:NOT_A_CLASS", ["reward.source", "is a int", "factory"]),
        ("hooks.shapers=[{name: 'my_plugins:StartsWithDigit'}]", ["hooks.shapers", "GroupRewardShaper"]),
        ("objective.name=my_plugins:ClipShaper", ["objective.name", "register_policy_loss"]),
        ("advantage.name=my_plugins:plugin_reinforce", ["advantage.name", "register_advantage"]),
        ("task.name=my_plugins:StartsWithDigit", ["task.name", "subclass of posttrain.tasks.Task"]),
        ("reward.name=my_plugins:CountTask", ["reward.name", "__call__"]),
        ("rollout.engine.params={tagg: x}", ["rollout.engine", "'tagg'", "accepted: eos_token_ids"]),
        (
            "hooks.shapers=[{name: 'my_plugins:ClipShaper', params: {lo: 1}}]",
            ["hooks.shapers", "'lo' (did you mean 'low'?)", "accepted: low, high"],
        ),
        ("hooks.sampler.params={seed: 3}", ["hooks.sampler", "'seed'", "set by the trainer"]),
        (
            "hooks.controllers=[{name: constant-temperature, params: {valu: 1}}]",
            ["hooks.controllers", "'valu' (did you mean 'value'?)"],
        ),
        ("advantage.params={epss: 1}", ["advantage.params", "'epss'", "eps, norm_std"]),
        ("advantage.params={eps: abc}", ["advantage.params", "eps must be a number"]),
        ("task.params={digitz: 1}", ["task.params", "'digitz'"]),
        ("reward.params={tol: 1}", ["reward.params", "'tol'"]),
    ],
)
def test_config_errors_name_the_key_before_any_model_is_loaded(plugins, override, needles, monkeypatch):
    import posttrain.models

    def boom(*a, **k):
        raise AssertionError("the model was loaded before the config was checked")

    monkeypatch.setattr(posttrain.models, "load_model_and_tokenizer", boom)
    extra = ["reward.name=numeric"] if override.startswith("reward.params") else []
    res = _invoke(["rl", "model.name=tiny", *extra, override])
    assert res.exit_code == 2, res.output
    for needle in needles:
        assert needle in res.output, (needle, res.output)


def test_registry_plugin_resolution_and_errors(plugins):
    from posttrain.algos import get_advantage, get_policy_loss
    from posttrain.hooks import GROUP_SHAPERS
    from posttrain.rewards import get_reward
    from posttrain.rollout import ENGINES, EngineContext, RunnerContext, build_engine, build_runner
    from posttrain.tasks import get_task

    assert get_policy_loss("my_plugins:plugin_reinforce").name == "plugin-reinforce"
    assert get_advantage("my_plugins:centered").defaults == {"shift": 0.0}
    assert GROUP_SHAPERS.get("my_plugins:ClipShaper") is plugins.ClipShaper
    assert get_task("my_plugins:CountTask", n_heldout=1).split("heldout")[0].answer == "3"
    assert get_reward("my_plugins:StartsWithDigit")("7", None) == 1.0
    with pytest.raises(ValueError, match="unknown parameter"):
        get_task("my_plugins:CountTask", heldout=1)
    assert ENGINES.get("my_plugins:CountingEngine") is plugins.CountingEngine
    with pytest.raises(PluginError, match="did you mean 'CountingEngine'"):
        ENGINES.get("my_plugins:CountingEngin")
    with pytest.raises(PluginError, match=re.escape("expected 'package.module:Name'")):
        ENGINES.get("my_plugins:")
    with pytest.raises(PluginError, match="is a int; expected a factory"):
        ENGINES.get("my_plugins:NOT_A_CLASS")

    from posttrain.models import load_model_and_tokenizer

    model, tok = load_model_and_tokenizer("tiny")
    engine = build_engine("my_plugins:CountingEngine", {"tag": "t"}, EngineContext(model, tok, seed=0))
    assert isinstance(engine, plugins.CountingEngine) and engine.tag == "t"
    from posttrain.rollout import PromptFormatter

    ctx = RunnerContext(engine, PromptFormatter(tok), tok, seed=0)
    with pytest.raises(PluginError, match="returned a int, not a EpisodeRunner"):
        build_runner("my_plugins:not_a_runner", {}, ctx)
    with pytest.raises(ValueError, match="unknown parameter"):
        build_runner("single-turn", {"x": 1}, ctx)


def test_registry_rejects_colon_in_registered_names_and_plugin_module_errors(plugins, tmp_path, monkeypatch):
    reg: Registry[object] = Registry("widget")
    with pytest.raises(ValueError, match="must not contain ':'"):
        reg.register("a:b")
    (tmp_path / "broken_plugin.py").write_text("raise RuntimeError('boom at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(
        PluginError,
        match="widget 'broken_plugin:X': importing module 'broken_plugin' raised RuntimeError: boom",
    ):
        reg.get("broken_plugin:X")
