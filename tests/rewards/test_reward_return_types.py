"""A reward must return a number: a str (``"1.0"``), None, bytes, a list ... is refused as a reward
error (scored 0, counted, the first one shown with the item's id and the type), in the worker pool and
in-process, instead of being silently converted by ``float()``. bool, int, float and numpy / torch
scalars are numbers and score as before."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

from posttrain.rewards import RewardPool, WeightedReward, score_detailed
from posttrain.rewards.base import NonNumericReward
from posttrain.tasks import Example

# Workers unpickle the reward by module path: the reward lives in a plain module written for the test
# (the pool hands the parent's sys.path to its workers).
_MODULE = '''
class MetaValueReward:
    """Returns the item's meta["value"] as it is (whatever its type)."""

    name = "meta_value"

    def __call__(self, completion, example):
        return example.meta["value"]


class MetaComponentsReward:
    """detailed(): a numeric total and one component holding meta["value"]."""

    name = "meta_components"

    def __call__(self, completion, example):
        return self.detailed(completion, example)[0]

    def detailed(self, completion, example):
        return 1.0, {"format": example.meta["value"]}
'''

NOT_NUMBERS = ["1.0", None, b"1", [1.0], {"r": 1.0}, np.array([0.5]), object()]


@pytest.fixture(scope="module")
def rewards(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    folder = tmp_path_factory.mktemp("reward_module")
    (folder / "_meta_value_reward.py").write_text(textwrap.dedent(_MODULE), encoding="utf-8")
    sys.path.insert(0, str(folder))
    try:
        import _meta_value_reward

        yield _meta_value_reward
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop("_meta_value_reward", None)


def _items(values: list[Any]) -> tuple[list[str], list[Example]]:
    examples = [Example(id=f"q{i}", prompt="p", answer="a", meta={"value": v}) for i, v in enumerate(values)]
    return ["c"] * len(values), examples


@pytest.mark.parametrize("workers", [0, 1], ids=["in-process", "worker-pool"])
def test_a_string_reward_is_a_reward_error_naming_the_item_and_the_type(rewards, workers):
    with RewardPool(rewards.MetaValueReward(), num_workers=workers, timeout_s=30) as pool:
        res = pool.score(*_items([0.5, "1.0", 1.0]))
    assert res.rewards == [0.5, 0.0, 1.0]
    assert res.statuses == ["ok", "error", "ok"]
    assert (res.errors, res.timeouts) == (1, 0)
    [(kind, text)] = res.failures.items()
    assert kind == "NonNumericReward"
    assert "'q1'" in text and "returned str" in text


@pytest.mark.parametrize("workers", [0, 1], ids=["in-process", "worker-pool"])
def test_every_non_number_is_refused(rewards, workers):
    with RewardPool(rewards.MetaValueReward(), num_workers=workers, timeout_s=30) as pool:
        res = pool.score(*_items(NOT_NUMBERS))
    assert res.rewards == [0.0] * len(NOT_NUMBERS)
    assert res.errors == len(NOT_NUMBERS)
    assert all("NonNumericReward" in m for m in res.messages)


NUMBERS = [
    (True, 1.0),
    (False, 0.0),
    (2, 2.0),
    (0.25, 0.25),
    (np.float32(0.5), 0.5),
    (np.float64(0.75), 0.75),
    (np.int64(3), 3.0),
    (np.bool_(True), 1.0),
    (np.array(0.5), 0.5),
    (torch.tensor(0.5), 0.5),
    (torch.tensor(1), 1.0),
    (torch.tensor(True), 1.0),
]


@pytest.mark.parametrize("workers", [0, 1], ids=["in-process", "worker-pool"])
def test_bools_ints_floats_and_numpy_torch_scalars_still_score(rewards, workers):
    with RewardPool(rewards.MetaValueReward(), num_workers=workers, timeout_s=30) as pool:
        res = pool.score(*_items([v for v, _ in NUMBERS]))
    assert res.rewards == [want for _, want in NUMBERS]
    assert res.errors == 0
    assert all(type(r) is float for r in res.rewards)


def test_a_string_component_is_refused_with_its_name(rewards):
    _, [ex] = _items(["1"])
    with pytest.raises(NonNumericReward, match=r"component 'format' for item 'q0' returned str"):
        score_detailed(rewards.MetaComponentsReward(), "c", ex)


def test_a_weighted_part_that_returns_a_string_is_refused(rewards, monkeypatch):
    weighted = WeightedReward(components=[("exact_match", 1.0)])
    label, weight, _ = weighted.parts[0]
    monkeypatch.setattr(weighted, "parts", [(label, weight, rewards.MetaValueReward())])
    _, [ex] = _items(["1.0"])
    with pytest.raises(NonNumericReward, match=r"reward part 'exact_match' for item 'q0' returned str"):
        score_detailed(weighted, "c", ex)
