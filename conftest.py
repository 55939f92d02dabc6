"""Fixtures of the whole suite (the library's tests/ and the lab's lab/tests/).

Shared test helpers (``_train_helpers``, ``_reward_pool_helpers``, ``tiny_gguf``, ``my_plugins``) live in
``tests/helpers``, on ``sys.path`` for every test (and so for the reward-pool workers that unpickle them).

Registries are process-global: a test (or a documented example) that registers a plug-in, or a
module-level ``@register`` in a test file, would otherwise leak its names into later tests, whose
exact-list checks then depend on test order. Every test gets every registry back as it was
(:meth:`posttrain.utils.registry.Registry.snapshot`; names imported lazily meanwhile stay resolved,
their modules being imported for good)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch
from transformers.utils import logging as hf_logging

import posttrain.algos
import posttrain.hooks
import posttrain.rollout  # noqa: F401
from posttrain.models.precision import AUTO_ENV
from posttrain.utils.registry import all_registries

sys.path.insert(0, str(Path(__file__).parent / "tests" / "helpers"))

# transformers binds its log handler to whatever sys.stderr is when its root logger is first set up;
# posttrain imports transformers lazily, so without this a CliRunner test (which swaps sys.stderr and
# closes it afterwards) would own that handler and every later transformers warning would print
# "--- Logging error ---" with a traceback into another test's output.
hf_logging.get_logger("transformers")

# `model.precision: auto` (the default) resolves to fp32 in the suite on every machine, from collection on
# and in every process a test starts (POSTTRAIN_AUTO_PRECISION is inherited): its closed-form, resume and
# batching-invariance checks compare against float64 or a second run at fp32 tolerances, which bf16
# autocast (what `auto` gives on a CPU with AVX512-BF16 or AMX) does not meet. Tests of bf16 set it
# explicitly; the tests of the per-machine resolution unset the variable. Set here, not through a test's
# monkeypatch, which a test may undo.
os.environ[AUTO_ENV] = "fp32"


@pytest.fixture(autouse=True)
def _restore_registries():
    saved = [(r, r.snapshot()) for r in all_registries()]
    yield
    for reg, state in saved:
        reg.restore(state)


@pytest.fixture(autouse=True, scope="session")
def _one_thread():
    # tiny models on a shared 2-core CPU: one intra-op thread is several times faster
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)
