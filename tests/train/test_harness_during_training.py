"""``eval.harness``: lm-eval's scores logged beside posttrain's own evaluation during an RL run, equal to
the harness run on the same weights by hand, thinned by ``every``, plotted, and without touching the
training run's random streams (lm-eval seeds every global generator)."""

from __future__ import annotations

import json
import random
import warnings

import numpy as np
import pytest
import torch
from _train_helpers import RL_BASE

pytest.importorskip("lm_eval", reason="lm-eval is not installed: pip install -e '.[lm-eval]'")

from posttrain.train.config import load_rl_config
from posttrain.train.evaluate import EVAL_HARNESSES, preserved_rng
from posttrain.train.rl import DegenerateSettingWarning, RLTrainer

HARNESS = "eval.harness={tasks: [posttrain_arithmetic_mc], limit: 4, every: 2, params: {bootstrap_iters: 0}}"


def _train(tmp_path, name, *extra):
    cfg = load_rl_config(
        None,
        [
            *RL_BASE,
            "steps=3",
            "eval.every=1",
            "eval.at_start=true",
            "eval.n=4",
            f"out_dir={tmp_path / name}",
            *extra,
        ],
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateSettingWarning)
        tr = RLTrainer(cfg)
        with tr:
            tr.train()
    rows = [json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    return tr, rows


# LoRA dropout draws from torch's global generator at every training forward: a harness that reseeds it
# (lm-eval's torch_random_seed=1234) would change the run unless its streams are restored
DROPOUT = ["model.lora={rank: 2, dropout: 0.5}", "reward.name=_async_helpers:CrcParity"]  # a reward that varies


def test_harness_scores_are_logged_beside_the_evaluation_and_leave_training_untouched(tmp_path):
    pytest.importorskip("peft", reason="LoRA dropout (the lora extra) makes training use the global RNG")
    with_h, rows = _train(tmp_path, "with", HARNESS, *DROPOUT)
    without, plain = _train(tmp_path, "without", *DROPOUT)
    assert all(r["grad_norm"] > 0 for r in rows if r.get("kind") == "step")  # the dropout masks matter
    evals = {r["step"]: r for r in rows if r.get("kind") == "eval"}
    key = "harness/posttrain_arithmetic_mc/acc"
    # every: 2 thins posttrain's evaluations (steps 0, 1, 2, 3): step 0 (start), 2, and 3 (the end)
    assert sorted(s for s, r in evals.items() if key in r) == [0, 2, 3]
    assert all(0.0 <= evals[s][key] <= 1.0 for s in (0, 2, 3))
    # the harness seeds torch, numpy and random: the run's streams must be as without it (same steps)
    steps_with = [
        {k: v for k, v in r.items() if not k.startswith(("time", "tokens_per_s"))}
        for r in rows
        if r.get("kind") == "step"
    ]
    steps_without = [
        {k: v for k, v in r.items() if not k.startswith(("time", "tokens_per_s"))}
        for r in plain
        if r.get("kind") == "step"
    ]
    assert steps_with == steps_without
    for a, b in zip(with_h.model.parameters(), without.model.parameters(), strict=True):
        assert torch.equal(a, b)
    # the logged score is the harness's own on the final weights
    direct = EVAL_HARNESSES.get("lm-eval")(with_h.lm, ["posttrain_arithmetic_mc"], 4, bootstrap_iters=0)
    assert evals[3][key] == pytest.approx(direct["posttrain_arithmetic_mc"]["acc,none"])
    from posttrain.train.plot import plot_run

    assert plot_run(tmp_path / "with").stat().st_size > 0


def test_preserved_rng_restores_every_stream():
    """Kills: a harness call without the guard (lm-eval's torch_random_seed=1234 would reset the run)."""
    torch.manual_seed(7)
    np.random.seed(7)
    random.seed(7)
    want = (torch.rand(3), np.random.rand(3), random.random())
    torch.manual_seed(7)
    np.random.seed(7)
    random.seed(7)
    with preserved_rng():
        torch.manual_seed(1234)
        np.random.seed(1234)
        random.seed(1234)
        torch.rand(5), np.random.rand(5), random.random()
    got = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(got[0], want[0]) and np.array_equal(got[1], want[1]) and got[2] == want[2]


def test_the_harness_config_is_checked():
    with pytest.raises(ValueError, match=r"eval\.harness"):
        load_rl_config(None, [*RL_BASE, "eval.harness={tasks: []}"])
    with pytest.raises(ValueError, match="every"):
        load_rl_config(None, [*RL_BASE, "eval.harness={tasks: [x], every: 0}"])
