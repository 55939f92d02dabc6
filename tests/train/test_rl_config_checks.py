"""Config-time checks of an RL config (each fails a plausible wrong config before any model loads):
``rollout.top_p < 1`` is refused wherever the rollout's sampling log-probs are used, a ratio objective
with one on-policy update per step warns that its clip never acts, and every RL config the library
ships says how many updates a step makes."""

from __future__ import annotations

import warnings
from importlib.resources import files

import pytest

from posttrain.train.config import SingleUpdateWarning, load_rl_config
from posttrain.utils.config import load_yaml

TINY = ["model.name=tiny", "model.device=cpu", "reward.num_workers=0"]


# ------------------------------------------------------------------------------------------ top-p
@pytest.mark.parametrize(
    "extra",
    [
        # any replay buffer other than `none` (here the library's own, named by its import path)
        ["hooks.replay.name=posttrain.hooks:NoReplay"],
        ["rollout.engine={name: vllm, params: {tis_mode: token_truncate}}"],
    ],
)
def test_top_p_below_one_is_refused_where_rollout_logprobs_are_used(extra):
    with pytest.raises(ValueError, match=r"rollout\.top_p=0\.9.*nucleus"):
        load_rl_config(None, [*TINY, "rollout.top_p=0.9", *extra])
    load_rl_config(None, [*TINY, "rollout.top_p=0.9"])  # nothing uses the rollout log-probs: fine
    load_rl_config(None, [*TINY, "rollout.top_p=1.0", *extra])


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


def test_shipped_rl_configs_say_how_many_updates_per_step():
    """A reader of a shipped config sees `minibatches` and `ppo_epochs` instead of trusting defaults
    (the lab's configs: lab/tests/test_configs.py)."""
    paths = [p for p in (files("posttrain") / "configs").iterdir() if p.name.endswith(".yaml")]
    rl = [p for p in paths if "objective" in load_yaml(str(p))]
    assert {p.name for p in rl} >= {"grpo-arithmetic.yaml", "qwen3-gsm8k.yaml"}
    for p in rl:
        data = load_yaml(str(p))
        assert "minibatches" in data and "ppo_epochs" in data, p.name
