"""Every YAML config the lab ships validates against its config class (RL configs by default; the
studies' configs by file-name prefix)."""

from __future__ import annotations

from pathlib import Path

import pytest

import posttrain_lab
from posttrain.train.config import load_rl_config
from posttrain.utils.config import build_config

LAB = Path(posttrain_lab.__file__).parent
CONFIGS = sorted(LAB.rglob("*.yaml"))


def _config_class(name: str):
    from posttrain_lab.studies.analysis.runner import ConsistencyConfig, ForgettingConfig, InterventionConfig
    from posttrain_lab.studies.cit.runner import CITConfig
    from posttrain_lab.studies.scpg.run import FinetuneConfig, PretrainConfig

    by_prefix = {
        "analysis-consistency": ConsistencyConfig,
        "analysis-intervention": InterventionConfig,
        "analysis-forgetting": ForgettingConfig,
        "cit-": CITConfig,
        "scpg-demo-pretrain": PretrainConfig,
        "scpg-paper-pretrain": PretrainConfig,
        "scpg-demo-finetune": FinetuneConfig,
        "scpg-paper-finetune": FinetuneConfig,
    }
    return next((c for prefix, c in by_prefix.items() if name.startswith(prefix)), None)


def test_the_lab_ships_configs():
    names = {p.name for p in CONFIGS}
    assert {
        "demo.yaml",
        "demo_smol.yaml",
        "e3.yaml",
        "dapo.yaml",
        "duca-sales.yaml",
        "cit-builtin.yaml",
    } <= names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: str(p.relative_to(LAB)))
def test_shipped_config_validates(path):
    cls = _config_class(path.name)
    if cls is None:
        assert not path.name.startswith(("analysis-", "cit-", "scpg-")), (
            f"{path.name}: add its config class here"
        )
        load_rl_config(str(path))
    else:
        build_config(cls, str(path))


def test_shipped_rl_configs_say_how_many_updates_per_step():
    """A reader of a recipe's config sees `minibatches` and `ppo_epochs` instead of trusting defaults
    (a ratio objective with one on-policy update never clips; the library's configs:
    tests/train/test_rl_config_checks.py)."""
    from posttrain.utils.config import load_yaml

    rl = [p for p in CONFIGS if "objective" in load_yaml(str(p))]
    assert len(rl) >= 10
    for p in rl:
        data = load_yaml(str(p))
        assert "minibatches" in data and "ppo_epochs" in data, p.relative_to(LAB)
