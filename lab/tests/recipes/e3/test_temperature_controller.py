"""E3's entropy-targeting temperature controller (posttrain_lab.recipes.e3.hooks.E3Temperature): it
anneals its target by default, as the paper runs it, and it reads the SAMPLING policy's entropy
(``entropy_pre_update``), not the mean over the update's forwards. The formulas themselves:
lab/tests/recipes/test_e3_asrr_dapo_formulas.py."""

from __future__ import annotations

import pytest

from posttrain.hooks import RunInfo
from posttrain_lab.recipes.e3.hooks import E3Temperature, e3_annealed_target, e3_temperature_step


def test_e3_controller_anneals_by_default():
    """The default controller lowers its target over the last 40 % of the run: at step 9 of 10 the
    target is e3_annealed_target(H0, 9, 10) < H0 and τ falls although the entropy stays at H0.
    Wrong version guarded: annealing switched off by default (`target()` returning `h_init`)."""
    c = E3Temperature(init=1.0)
    c.bind(RunInfo(vocab_size=1000, total_steps=10))
    outs = [c.update({"entropy_pre_update": 1.0, "entropy": 1.0}, step) for step in range(10)]
    assert outs[0]["target_entropy"] == 1.0 and outs[5]["target_entropy"] == 1.0
    assert outs[9]["target_entropy"] == pytest.approx(e3_annealed_target(1.0, 9, 10))
    assert outs[9]["target_entropy"] < 0.95
    assert outs[9]["temperature"] < outs[5]["temperature"] == 1.0


def test_e3_controller_reads_entropy_pre_update_not_the_update_entropy():
    """The controller's entropy is `entropy_pre_update` (the sampling policy's), not `entropy` (the
    mean over the update's forwards, which differ from the second minibatch on). The trainer's side
    (what `entropy_pre_update` is): tests/train/test_step_signals.py.
    Wrong version guarded: the controller reading `metrics["entropy"]`."""
    c = E3Temperature(init=1.0, anneal=False)
    c.bind(RunInfo(vocab_size=1000, total_steps=10))
    c.update({"entropy_pre_update": 2.0, "entropy": 2.0}, 0)  # target 2.0
    out = c.update({"entropy_pre_update": 1.0, "entropy": 3.0}, 1)
    assert out["entropy"] == 1.0
    assert out["temperature"] == pytest.approx(e3_temperature_step(1.0, 1.0, 2.0, 1000))
    assert out["temperature"] > 1.0  # below target: τ rises (with `entropy` = 3.0 it would fall)
