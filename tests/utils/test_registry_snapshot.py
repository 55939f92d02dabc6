"""A registry's snapshot/restore (the suite's isolation fixture) keeps the names installed packages
declare as entry points, whenever they were first read."""

from __future__ import annotations

import importlib.metadata
from importlib.metadata import EntryPoint

from posttrain.utils.registry import Registry


def _fake_entry_points(monkeypatch, group: str) -> None:
    eps = [EntryPoint(name="json-dumps", value="json:dumps", group=group)]
    monkeypatch.setattr(
        importlib.metadata, "entry_points", lambda group=None: [e for e in eps if e.group == group]
    )


def test_restore_keeps_entry_points_read_after_the_snapshot(monkeypatch):
    _fake_entry_points(monkeypatch, "test.snapshot")
    reg: Registry = Registry("thing", group="test.snapshot")
    state = reg.snapshot()  # before anything asked for a name
    assert "json-dumps" in reg.names()  # the entry points are read now (or were, by the snapshot)
    reg.register("local")(object())
    reg.restore(state)
    assert "json-dumps" in reg.names() and "local" not in reg.names()
    import json

    assert reg.get("json-dumps") is json.dumps
