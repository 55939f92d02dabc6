"""Config-time checks of an RL config (each fails a plausible wrong config before any model loads):
``rollout.top_p < 1`` is refused wherever the rollout's sampling log-probs are used, a ratio objective
with one on-policy update per step warns that its clip never acts, every RL config the library
ships says how many updates a step makes, and a key or name removed in 0.2.0 fails naming its
replacement."""

from __future__ import annotations

import re
import warnings
from importlib.resources import files

import pytest

from posttrain.train.config import REMOVED_KEYS, REMOVED_NAMES, SingleUpdateWarning, load_rl_config
from posttrain.train.sft import SFTConfig
from posttrain.utils.config import ConfigError, build_config, load_yaml

TINY = ["model.name=tiny", "model.device=cpu", "reward.num_workers=0"]


# ------------------------------------------------------------------------------------------ top-p
@pytest.mark.parametrize(
    "extra",
    [
        # any replay buffer other than `none` (here the library's own, named by its import path)
        ["hooks.replay.name=posttrain.hooks:NoReplay"],
        ["rollout.engine.name=vllm", "rollout.is_correction.mode=token_truncate"],
    ],
)
def test_top_p_below_one_is_refused_where_rollout_logprobs_are_used(extra):
    with pytest.raises(ValueError, match=r"rollout\.top_p=0\.9.*nucleus"):
        load_rl_config(None, [*TINY, "rollout.top_p=0.9", *extra])
    load_rl_config(None, [*TINY, "rollout.top_p=0.9"])  # nothing uses the rollout log-probs: fine
    load_rl_config(None, [*TINY, "rollout.top_p=1.0", *extra])


@pytest.mark.parametrize(
    ("setting", "named"),
    [
        ("rollout.min_new_tokens=4", r"rollout\.min_new_tokens=4 \(EOS masked\)"),
        ("rollout.suppress_eos=true", r"rollout\.suppress_eos=true \(EOS masked\)"),
    ],
)
@pytest.mark.parametrize(
    "extra",
    [
        ["hooks.replay.name=posttrain.hooks:NoReplay"],
        ["rollout.engine.name=vllm", "rollout.is_correction.mode=token_truncate"],
    ],
)
def test_eos_masking_is_refused_where_rollout_logprobs_are_used(setting, named, extra):
    """min_new_tokens / suppress_eos renormalise the engine's distribution without EOS, exactly as top_p
    renormalises it over the nucleus: the rollout log-probs are biased the same way."""
    with pytest.raises(ValueError, match=named + r".*used by"):
        load_rl_config(None, [*TINY, setting, *extra])
    load_rl_config(None, [*TINY, setting])  # nothing uses the rollout log-probs: fine


# ----------------------------------------------------------------------------- single update warning
@pytest.mark.parametrize("objective", ["dgpo", "maspo", "dapo"])
def test_ratio_objectives_with_one_on_policy_update_warn_at_config_time(objective):
    with pytest.warns(SingleUpdateWarning, match="ratio"):
        load_rl_config(None, [*TINY, f"objective.name={objective}"])
    with warnings.catch_warnings():
        warnings.simplefilter("error", SingleUpdateWarning)
        load_rl_config(None, [*TINY, f"objective.name={objective}", "minibatches=2"])
        load_rl_config(None, [*TINY, f"objective.name={objective}", "ppo_epochs=2"])
        load_rl_config(None, [*TINY, "objective.name=ppo"])  # GRPO's plain one-update form


@pytest.mark.parametrize("objective", ["gspo", "cispo", "sapo"])
def test_every_objective_declared_a_ratio_mechanism_warns(objective):
    with pytest.warns(SingleUpdateWarning, match="ratio"):
        load_rl_config(None, [*TINY, f"objective.name={objective}"])


def test_a_plugin_objective_declares_its_ratio_mechanism_where_it_is_registered():
    """Which objectives warn is declared by register_policy_loss(..., ratio_mechanism=True), not by a list
    kept beside the config: a plug-in loss that declares it warns, one that does not stays quiet. Kills: a
    hand-kept list of names (the plug-in would never warn)."""
    from posttrain.algos import POLICY_LOSSES
    from posttrain.algos.policy_losses import POLICY_LOSSES as REG
    from posttrain.algos.policy_losses import register_policy_loss

    core = POLICY_LOSSES.get("ppo").core
    for name, ratio in (("test-gated", True), ("test-plain", False)):
        register_policy_loss(name, ratio_mechanism=ratio, validate=lambda n, p: None)(core)
    try:
        with pytest.warns(SingleUpdateWarning, match="'test-gated'"):
            load_rl_config(None, [*TINY, "objective.name=test-gated"])
        with warnings.catch_warnings():
            warnings.simplefilter("error", SingleUpdateWarning)
            load_rl_config(None, [*TINY, "objective.name=test-plain"])
    finally:
        REG._items.pop("test-gated", None)
        REG._items.pop("test-plain", None)


def test_shipped_rl_configs_say_how_many_updates_per_step():
    """A reader of a shipped config sees `minibatches` and `ppo_epochs` instead of trusting defaults
    (the lab's configs: lab/tests/test_configs.py)."""
    paths = [p for p in (files("posttrain") / "configs").iterdir() if p.name.endswith(".yaml")]
    rl = [p for p in paths if "objective" in load_yaml(str(p))]
    assert {p.name for p in rl} >= {"grpo-arithmetic.yaml", "qwen3-gsm8k.yaml"}
    for p in rl:
        data = load_yaml(str(p))
        assert "minibatches" in data and "ppo_epochs" in data, p.name


# ------------------------------------------------------------------------------- removed in 0.2.0
@pytest.mark.parametrize(
    ("override", "key", "replacement"),
    [
        ("hooks.shaper={name: none}", "hooks.shaper", "hooks.shapers=[{name: ..."),
        ('task.continue_thinking_markers=["wait"]', "task.continue_thinking_markers", "params: {markers:"),
        ("hooks.sampler={name: dapo, params: {max_rounds: 2}}", "hooks.sampler.name 'dapo'", "hooks.filter="),
        ("hooks.sampler.name=dapo", "hooks.sampler.name 'dapo'", "name: dynamic-sampling"),
    ],
)
def test_a_removed_key_or_name_is_a_config_error_naming_its_replacement(override, key, replacement):
    """Without the table the first two were "unknown key" errors that do not say where the setting
    went, and the third an unknown (or, with an old install, a stale) sampler name."""
    with pytest.raises(ConfigError) as err:
        load_rl_config(None, [*TINY, override])
    msg = str(err.value)
    assert f"{key} was removed in 0.2.0" in msg and replacement in msg, msg
    assert override in msg  # the error says where the value came from


def test_every_removed_key_and_name_is_refused():
    """Each entry of the removal tables is enforced (an entry whose section never runs the check would
    pass silently)."""
    for key in REMOVED_KEYS:
        with pytest.raises(ConfigError, match=rf"{re.escape(key)} was removed"):
            load_rl_config(None, [*TINY, f"{key}=1"])
    for (key, name), _ in REMOVED_NAMES.items():
        with pytest.raises(ConfigError, match=rf"{re.escape(key)}\.name '{name}' was removed"):
            load_rl_config(None, [*TINY, f"{key}.name={name}"])


def test_sft_configs_refuse_the_removed_task_key_too():
    with pytest.raises(ConfigError, match=r"task\.continue_thinking_markers was removed"):
        build_config(SFTConfig, None, ["task.continue_thinking_markers=[wait]"])


# ------------------------------------ every key the user sets is honoured (issue 41 item 1)
def _resolved(cfg) -> dict:
    from posttrain.train.run_dir import flatten

    return flatten(cfg.model_dump(mode="json"))


def test_rl_honours_every_key_set_over_a_config_file(tmp_path):
    """`posttrain rl --config FILE k=v ...` (what the CLI builds): each key of the file and of the
    overrides holds its value in the resolved config, also when an override switches the task (the
    file's reward stays, as the user wrote it) or names a run folder as the model."""
    from posttrain.utils.config import parse_override

    data = tmp_path / "qa.jsonl"
    data.write_text('{"question": "1+1=", "answer": "2"}\n{"question": "2+2=", "answer": "4"}\n')
    run = tmp_path / "some_run"
    cfg_file = tmp_path / "rl.yaml"
    cfg_file.write_text("reward:\n  name: numeric\nrollout:\n  max_new_tokens: 9\nsteps: 4\n")
    overrides = [
        *(o for o in TINY if not o.startswith("model.name=")),
        f"model.name={run}",
        "task.name=jsonl",
        f"task.params={{path: {data}, heldout_fraction: 0.5}}",
        "rollout.group_size=3",
        "eval.n=3",
        "optimizer.lr=2.0e-05",
        "seed=7",
    ]
    from posttrain.train.config import RLConfig

    got = _resolved(build_config(RLConfig, cfg_file, overrides))
    assert got["reward.name"] == "numeric" and got["rollout.max_new_tokens"] == 9 and got["steps"] == 4
    for ov in overrides:
        key, value = parse_override(ov)
        if isinstance(value, dict):
            assert {k: got[f"{key}.{k}"] for k in value} == value, ov
        else:
            assert got[key] == value, ov


def test_sft_honours_every_key_set_over_a_config_file(tmp_path):
    from posttrain.utils.config import parse_override

    cfg_file = tmp_path / "sft.yaml"
    cfg_file.write_text("max_length: 64\nbatch_size: 2\ntask:\n  name: countdown\n")
    overrides = ["model.name=tiny", "steps=3", "optimizer.lr=3.0e-05", "task.prompt_template='Q: {prompt}'"]
    got = _resolved(build_config(SFTConfig, cfg_file, overrides))
    assert got["max_length"] == 64 and got["batch_size"] == 2 and got["task.name"] == "countdown"
    for ov in overrides:
        key, value = parse_override(ov)
        assert got[key] == value, ov


# ----------------------------------------------------------------------------- one correction over μ
def test_the_old_correction_settings_name_the_new_one():
    """The engine's truncated IS (vLLM's tis_*) and asynchronous rollout's staleness_is were one ratio
    π_old / μ under two names; both old names are refused with the one setting that replaced them."""
    with pytest.raises(ValueError, match=r"rollout\.staleness_is was renamed rollout\.is_correction"):
        load_rl_config(None, [*TINY, "rollout.staleness_is.mode=token_mask"])
    with pytest.raises(ValueError, match=r"rollout\.engine\.params\.tis_mode.*rollout\.is_correction"):
        load_rl_config(None, [*TINY, "rollout.engine={name: vllm, params: {tis_mode: token_truncate}}"])


@pytest.mark.parametrize(
    ("setting", "staleness", "want"),
    [
        ("auto", 0, None),  # synchronous: the engine samples from π_old itself
        ("auto", 1, "token_truncate"),  # asynchronous: verl's truncated IS by default
        ("token_mask", 0, "token_mask"),  # AReaL-style masking, e.g. against vLLM's mismatch
        ("null", 2, None),  # the ablation
    ],
)
def test_the_correction_mode_auto_follows_the_staleness(setting, staleness, want):
    cfg = load_rl_config(
        None, [*TINY, f"rollout.is_correction.mode={setting}", f"rollout.max_staleness={staleness}"]
    )
    assert cfg.rollout.correction_mode() == want
