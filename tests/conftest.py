"""Suite-wide fixtures.

Registries are process-global: a test (or a documented example) that registers a plug-in by import
would otherwise leak its names into later tests, whose exact-list checks then depend on test order.
Every test gets the algos registries back as they were."""

from __future__ import annotations

import pytest

from posttrain.algos.advantages import ADVANTAGES
from posttrain.algos.policy_losses import POLICY_LOSSES


@pytest.fixture(autouse=True)
def _restore_algos_registries():
    saved = [(r, dict(r._items), dict(r._aliases)) for r in (POLICY_LOSSES, ADVANTAGES)]
    yield
    for reg, items, aliases in saved:
        reg._items.clear()
        reg._items.update(items)
        reg._aliases.clear()
        reg._aliases.update(aliases)
