"""Suite-wide fixtures.

Registries are process-global: a test (or a documented example) that registers a plug-in, or a
module-level ``@register`` in a test file, would otherwise leak its names into later tests, whose
exact-list checks then depend on test order. Every test gets every registry back as it was
(:meth:`posttrain.utils.registry.Registry.snapshot`; names imported lazily meanwhile stay resolved,
their modules being imported for good)."""

from __future__ import annotations

import pytest
from transformers.utils import logging as hf_logging

import posttrain.algos
import posttrain.hooks
import posttrain.rollout  # noqa: F401
from posttrain.utils.registry import all_registries

# transformers binds its log handler to whatever sys.stderr is when its root logger is first set up;
# posttrain imports transformers lazily, so without this a CliRunner test (which swaps sys.stderr and
# closes it afterwards) would own that handler and every later transformers warning would print
# "--- Logging error ---" with a traceback into another test's output.
hf_logging.get_logger("transformers")


@pytest.fixture(autouse=True)
def _restore_registries():
    saved = [(r, r.snapshot()) for r in all_registries()]
    yield
    for reg, state in saved:
        reg.restore(state)
