"""ASRR's Continue-Thinking ratio is the ASRR shaper's metric (arXiv:2505.15400, §4): the share of
completions containing a marker, reported by the shaper per step (``continue_thinking_frac``) and per
evaluation (``continue_thinking``) through the hook interface, with the markers as the shaper's own
parameter; ``beta = 0`` (the prefix-only control) leaves every reward as it is."""

from __future__ import annotations

import types

import pytest
import torch

from posttrain.train.config import load_rl_config
from posttrain.utils.config import ConfigError
from posttrain_lab.recipes.asrr.hooks import CONTINUE_THINKING_MARKERS, ASRRShaper, continue_thinking_ratio

TEXTS = ["4", "Wait, let me check: 2+2=4", "</think> 4", "The answer is 4"]


def test_continue_thinking_ratio():
    assert continue_thinking_ratio(TEXTS) == 0.5
    assert continue_thinking_ratio(TEXTS, ["answer"]) == 0.25
    assert continue_thinking_ratio([]) == 0.0


def test_the_shaper_reports_the_ratio_with_its_own_markers():
    eps = types.SimpleNamespace(texts=TEXTS)
    assert ASRRShaper().step_metrics(eps) == {"continue_thinking_frac": 0.5}
    assert ASRRShaper().eval_metrics(eps) == {"continue_thinking": 0.5}
    assert ASRRShaper(markers=["answer", "check"]).step_metrics(eps) == {"continue_thinking_frac": 0.5}
    assert ASRRShaper(markers=["ANSWER"]).eval_metrics(eps) == {"continue_thinking": 0.25}  # any case
    assert ASRRShaper().markers == CONTINUE_THINKING_MARKERS


@pytest.mark.parametrize("markers", ["wait", [], ["wait", ""], [3], 3])
def test_bad_markers_are_a_config_error(markers):
    with pytest.raises(
        ConfigError, match=r"hooks\.shapers[\s\S]*markers must be a list of non-empty strings"
    ):
        load_rl_config(None, [f"hooks.shapers=[{{name: asrr, params: {{markers: {markers!r}}}}}]"])


def test_markers_are_the_shapers_param_not_the_tasks():
    cfg = load_rl_config(None, ['hooks.shapers=[{name: asrr, params: {markers: ["wait"]}}]'])
    assert cfg.hooks.shapers[0].params == {"markers": ["wait"]}
    with pytest.raises(ConfigError, match=r"task\.continue_thinking_markers was removed.*markers"):
        load_rl_config(None, ['task.continue_thinking_markers=["wait"]'])


def test_beta_zero_changes_no_reward():
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0])
    out = ASRRShaper(beta=0.0, window=2, tau=0.0).shape(
        rewards.clone(),
        torch.tensor([0, 0, 1, 1]),
        correct=rewards > 0.5,
        lengths=torch.tensor([2, 9, 3, 7]),
        truncated=torch.zeros(4),
    )
    assert torch.equal(out, rewards)
