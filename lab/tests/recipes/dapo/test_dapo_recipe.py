"""The DAPO recipe's config (lab/posttrain_lab/recipes/dapo/dapo.yaml): verl's DAPO values (dual clip
c = 10, 3x oversampling, 16 updates per rollout batch), and the soft overlong penalty's limit checked
against ``rollout.max_new_tokens`` when a config loads (arXiv:2503.14476, Eq. 13)."""

from __future__ import annotations

from pathlib import Path

import pytest

from posttrain.train.config import load_rl_config

DAPO_YAML = str(Path(__file__).parents[3] / "posttrain_lab" / "recipes" / "dapo" / "dapo.yaml")
TINY = ["model.name=tiny", "model.device=cpu", "reward.num_workers=0"]


def test_recipe_values_are_verls_dapo_recipe():
    cfg = load_rl_config(DAPO_YAML, [])
    assert cfg.objective.name == "dapo"
    assert cfg.objective.params["clip_c"] == 10.0  # verl DAPO recipe clip_ratio_c
    assert cfg.objective.params["clip_high"] == 0.28
    assert cfg.hooks.sampler.params["oversample"] == 3.0  # gen_prompt_bsz = 3 x train_prompt_bsz
    assert cfg.minibatches == 16 and cfg.ppo_epochs == 1  # 512 prompts in mini-batches of 32


def test_overlong_limit_must_be_the_generation_limit():
    with pytest.raises(
        ValueError, match=r"hooks\.shaper\.params\.max_length.*rollout\.max_new_tokens \(64\)"
    ):
        load_rl_config(DAPO_YAML, ["rollout.max_new_tokens=64"])
    overlong = "hooks.shapers=[{name: dapo-overlong, params: {max_length: 9, buffer: 2}}]"
    with pytest.raises(ValueError, match=r"hooks\.shapers\[0\]\.params\.max_length"):
        load_rl_config(None, [*TINY, "rollout.max_new_tokens=8", overlong])
    load_rl_config(None, [*TINY, "rollout.max_new_tokens=9", overlong])
