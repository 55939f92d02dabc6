"""Suite-wide fixtures.

Registries are process-global: a test (or a documented example) that registers a plug-in, or a
module-level ``@register`` in a test file, would otherwise leak its names into later tests, whose
exact-list checks then depend on test order. Every test gets every registry back as it was
(:meth:`posttrain.utils.registry.Registry.snapshot`; names imported lazily meanwhile stay resolved,
their modules being imported for good)."""

from __future__ import annotations

import pytest

import posttrain.algos
import posttrain.hooks
import posttrain.rollout  # noqa: F401
from posttrain.utils.registry import all_registries


@pytest.fixture(autouse=True)
def _restore_registries():
    saved = [(r, r.snapshot()) for r in all_registries()]
    yield
    for reg, state in saved:
        reg.restore(state)
