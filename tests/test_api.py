"""The flat Python API: names from `posttrain` (the README's import line works), objects accepted
wherever names are, one root error."""

from __future__ import annotations

import warnings

import pytest

import posttrain
from posttrain.hooks import ConstantTemperature, DynamicSamplingFilter, UniformSampler


def test_the_flat_import_line_works():
    from posttrain import Example, PosttrainError, RLConfig, RLTrainer, SFTConfig, SFTTrainer, Task

    assert issubclass(PosttrainError, Exception)
    assert all(isinstance(c, type) for c in (Example, RLConfig, RLTrainer, SFTConfig, SFTTrainer, Task))


def test_flat_names_are_the_library_classes():
    from posttrain.tasks import Example, Task
    from posttrain.train.config import RLConfig
    from posttrain.train.rl import RLTrainer
    from posttrain.train.sft import SFTConfig, SFTTrainer

    assert (posttrain.RLTrainer, posttrain.RLConfig, posttrain.SFTTrainer, posttrain.SFTConfig) == (
        RLTrainer,
        RLConfig,
        SFTTrainer,
        SFTConfig,
    )
    assert posttrain.Task is Task and posttrain.Example is Example
    assert set(posttrain.__all__) == set(posttrain._API) | {
        "PosttrainError",
        "PosttrainWarning",
        "__version__",
    }
    for name in posttrain._API:
        assert getattr(posttrain, name) is not None, name
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        posttrain.Nope  # noqa: B018


def test_every_deliberate_error_is_a_posttrain_error_and_still_a_value_error():
    from posttrain.models.loading import ModelSpecError
    from posttrain.tasks import DatasetError
    from posttrain.train.checkpoint import CheckpointError
    from posttrain.train.run_dir import RunDirError
    from posttrain.utils.config import ConfigError
    from posttrain.utils.registry import PluginError, UnknownNameError

    for cls in (
        ConfigError,
        PluginError,
        UnknownNameError,
        DatasetError,
        CheckpointError,
        RunDirError,
        ModelSpecError,
    ):
        assert issubclass(cls, posttrain.PosttrainError) and issubclass(cls, ValueError), cls
    with pytest.raises(posttrain.PosttrainError, match="unknown"):
        from posttrain.hooks import SAMPLERS

        SAMPLERS.get("unifrom")


class _CountingReward:
    def __init__(self):
        self.calls = 0

    def __call__(self, completion, example):
        self.calls += 1
        return float(completion[:1].isdigit())


def test_hook_objects_replace_configured_names(tmp_path):
    cfg = {
        "model": {"name": "tiny", "device": "cpu"},
        "task": {"params": {"digits": 1, "ops": "+", "n_train": 8, "n_heldout": 4}},
        "rollout": {"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 3},
        "eval": {"at_start": False, "at_end": False},
        "checkpoint": {"final": False},
        "threads": 1,
        "out_dir": str(tmp_path / "run"),
    }
    reward = _CountingReward()
    trainer_cls = posttrain.RLTrainer  # the class through the lazy attribute
    from posttrain.tasks import get_task

    task = get_task("arithmetic", digits=1, ops="+", n_train=8, n_heldout=4)
    sampler = UniformSampler(task.split("train"), seed=3)
    filt = DynamicSamplingFilter(max_rounds=2)
    ctl = ConstantTemperature(value=0.9)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tr = trainer_cls(
            cfg,
            task=task,
            reward=lambda c, e: reward(c, e),
            sampler=sampler,
            group_filter=filt,
            controllers=[ctl],
        )
        try:
            m = tr.step()
        finally:
            tr.close()
    assert tr.task is task and tr.collector.sampler is sampler and tr.collector.group_filter is filt
    assert tr.controllers == [ctl]
    assert reward.calls >= 4  # the lambda (unpicklable) was scored in-process
    assert m["filter/rounds"] >= 1 and m["controller/temperature"] == 0.9
