"""posttrain.utils.config.settings_diff: what a resumable command (bench ablation, demo rm) compares
before it mixes new runs into a folder of older ones."""

from __future__ import annotations

from posttrain.utils.config import settings_diff


def test_settings_diff_names_changed_added_and_removed_keys_but_not_ignored_ones():
    saved = {"steps": 12, "seeds": [0, 1], "threads": 1, "old": 3}
    now = {"steps": 20, "seeds": (0, 1), "threads": 2, "new": "x"}
    assert settings_diff(saved, now, ignore=("threads",)) == {
        "new": (None, "x"),
        "old": (3, None),
        "steps": (12, 20),
    }  # a tuple equals the list JSON gives back; sorted by key
    assert settings_diff(saved, {**saved}) == {}
