"""How a config error reads: a check of the whole config (a ``model_validator``) is its own message,
not pydantic's ``  : Value error, `` with an empty key in front of it."""

from __future__ import annotations

import pytest
from pydantic import model_validator

from posttrain.utils.config import ConfigError, StrictModel, build_config
from posttrain.utils.errors import InvalidValueError


class Section(StrictModel):
    size: int = 4


class Whole(StrictModel):
    section: Section = Section()
    name: str = "a"

    @model_validator(mode="after")
    def _size_and_name(self) -> Whole:
        if self.section.size == 1 and self.name == "a":
            raise InvalidValueError("section.size: 1 does not work with name 'a'; use section.size >= 2")
        return self


def test_a_whole_config_error_starts_with_its_own_message():
    with pytest.raises(ConfigError) as err:
        build_config(Whole, None, ["section.size=1"])
    assert str(err.value) == (
        "config error:\n  section.size: 1 does not work with name 'a'; use section.size >= 2"
    )


def test_a_key_error_still_names_its_key():
    with pytest.raises(ConfigError) as err:
        build_config(Whole, None, ["section.size=x"])
    assert str(err.value).startswith("config error:\n  section.size: Input should be a valid integer")


def test_the_rl_configs_group_size_check_reads_as_one_sentence():
    """Issue 58 item 8: `rollout.group_size=1` printed `  : Value error, rollout.group_size: 1 ...`."""
    from posttrain.train.config import RLConfig

    with pytest.raises(ConfigError) as err:
        build_config(RLConfig, None, ["rollout.group_size=1"])
    assert str(err.value).startswith("config error:\n  rollout.group_size: 1 with the group-relative")
