"""DuCA's duca_hian estimator in verl's registry (lab/posttrain_lab/recipes/duca/verl.py); skipped where verl does not import."""

from __future__ import annotations

import importlib

import pytest
import torch

from posttrain_lab.recipes.duca.advantages import hian_advantages


@pytest.fixture(scope="module")
def verl():
    core = pytest.importorskip(
        "verl.trainer.ppo.core_algos", reason="verl is not importable here (pip install -e '.[verl]')"
    )
    integ = importlib.import_module("posttrain.integrations.verl")
    duca_verl = importlib.import_module("posttrain_lab.recipes.duca.verl")
    yield core, integ, duca_verl
    integ.register({})


def test_duca_hian_estimator_reads_turns_from_response_mask(verl):
    core, integ, duca_verl = verl
    integ.register({"duca_hian": {"w_turn": 0.5}})
    duca_verl.register()
    fn = core.get_adv_estimator_fn("duca_hian")
    # 4 sessions, 2 scenarios; turns are runs of 1 in the response mask, rewards on each turn's last token
    mask = torch.tensor(
        [
            [1, 1, 0, 0, 1, 1, 1, 0],
            [1, 1, 1, 0, 0, 1, 0, 0],
            [1, 1, 1, 1, 1, 0, 0, 0],
            [1, 0, 1, 0, 1, 0, 0, 0],
        ],
        dtype=torch.float32,
    )
    rew = torch.zeros(4, 8)
    rew[0, 1], rew[0, 6] = 1.0, 0.5
    rew[1, 2], rew[1, 5] = 0.0, 1.0
    rew[2, 4] = 2.0
    rew[3, 0], rew[3, 2], rew[3, 4] = 0.3, 0.1, 0.2
    adv, ret = fn(token_level_rewards=rew, response_mask=mask, index=["a", "a", "b", "b"], config=None)
    spans = [[(0, 2), (4, 7)], [(0, 3), (5, 6)], [(0, 5)], [(0, 1), (2, 3), (4, 5)]]
    turns = [
        torch.tensor([1.0, 0.5]),
        torch.tensor([0.0, 1.0]),
        torch.tensor([2.0]),
        torch.tensor([0.3, 0.1, 0.2]),
    ]
    want = hian_advantages(rew.sum(1), torch.tensor([0, 0, 1, 1]), turns, spans, 8, w_turn=0.5)
    torch.testing.assert_close(adv, want)
    assert torch.equal(adv, ret) and bool((adv[mask == 0] == 0).all())
