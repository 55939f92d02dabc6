"""The DAPO recipe's config (lab/posttrain_lab/recipes/dapo/dapo.yaml): verl's DAPO values (dual clip
c = 10, 3x oversampling, 16 updates per rollout batch), dynamic sampling as the group filter (the one
way: the ``dapo`` sampler is gone), and the soft overlong penalty's limit checked against
``rollout.max_new_tokens`` when a config loads (arXiv:2503.14476, Eq. 13) by the shaper's own
``validate_config``."""

from __future__ import annotations

from pathlib import Path

import pytest

import posttrain_lab.recipes.dapo.hooks as dapo_hooks
from posttrain.hooks import PromptSampler
from posttrain.train.config import load_rl_config
from posttrain.utils.config import ConfigError
from posttrain_lab.recipes.dapo.hooks import DAPOOverlongShaper

DAPO_YAML = str(Path(__file__).parents[3] / "posttrain_lab" / "recipes" / "dapo" / "dapo.yaml")
TINY = ["model.name=tiny", "model.device=cpu", "reward.num_workers=0"]


def test_recipe_values_are_verls_dapo_recipe():
    cfg = load_rl_config(DAPO_YAML, [])
    assert cfg.objective.name == "dapo"
    assert cfg.objective.params["clip_c"] == 10.0  # verl DAPO recipe clip_ratio_c
    assert cfg.objective.params["clip_high"] == 0.28
    assert cfg.hooks.sampler.name == "uniform" and cfg.hooks.filter.name == "dynamic-sampling"
    assert cfg.hooks.filter.params["oversample"] == 3.0  # gen_prompt_bsz = 3 x train_prompt_bsz
    assert cfg.hooks.filter.params["max_rounds"] == 10  # verl's max_num_gen_batches
    assert cfg.minibatches == 16 and cfg.ppo_epochs == 1  # 512 prompts in mini-batches of 32


def test_overlong_limit_must_be_the_generation_limit():
    with pytest.raises(
        ValueError, match=r"hooks\.shapers\[0\]\.params\.max_length.*rollout\.max_new_tokens \(64\)"
    ):
        load_rl_config(DAPO_YAML, ["rollout.max_new_tokens=64"])
    overlong = "hooks.shapers=[{name: dapo-overlong, params: {max_length: 9, buffer: 2}}]"
    with pytest.raises(ValueError, match=r"hooks\.shapers\[0\]\.params\.max_length"):
        load_rl_config(None, [*TINY, "rollout.max_new_tokens=8", overlong])
    load_rl_config(None, [*TINY, "rollout.max_new_tokens=9", overlong])


def test_the_rule_is_the_shapers_own_check():
    """The library names no DAPO hook: the rule is ``DAPOOverlongShaper.validate_config``."""
    cfg = load_rl_config(None, [*TINY, "rollout.max_new_tokens=8"])
    DAPOOverlongShaper.validate_config({"max_length": 8}, cfg)
    with pytest.raises(ValueError, match=r"^max_length: .*\(8\), got 9"):
        DAPOOverlongShaper.validate_config({"max_length": 9}, cfg)


def test_dapo_names_a_loss_and_a_filter_not_a_sampler():
    """(Whether an entry point still declares a ``dapo`` sampler is lab/tests/test_entry_points.py's.)"""
    assert not [v for v in vars(dapo_hooks).values() if isinstance(v, type) and issubclass(v, PromptSampler)]
    with pytest.raises(ConfigError, match=r"hooks\.sampler\.name 'dapo' was removed.*hooks\.filter="):
        load_rl_config(None, [*TINY, "hooks.sampler={name: dapo, params: {max_rounds: 10, oversample: 3.0}}"])
    cfg = load_rl_config(None, [*TINY, "objective.name=dapo", "minibatches=2", "hooks.filter.name=dapo"])
    assert cfg.hooks.filter.name == "dapo"  # the dynamic-sampling filter's alias
