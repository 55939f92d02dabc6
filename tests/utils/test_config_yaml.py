"""YAML config files (posttrain.utils.config.load_yaml): a mapping that gives one key twice is refused,
naming the file, the key and both lines, instead of PyYAML's silent "the last one wins" (``steps: 2``
then ``steps: 7`` ran 7 steps; a second ``rollout:`` block dropped the first one's keys)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from posttrain.utils.config import ConfigError, load_yaml

CONFIGS = Path(__file__).resolve().parents[2] / "src" / "posttrain" / "configs"


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_a_top_level_duplicate_key_is_refused_with_the_file_key_and_both_lines(tmp_path):
    path = _write(tmp_path, "model: {name: tiny}\nsteps: 2\nseed: 1\nsteps: 7\n")
    with pytest.raises(ConfigError) as err:
        load_yaml(path)
    msg = str(err.value)
    assert str(path) in msg
    assert "'steps'" in msg
    assert "lines 2 and 4" in msg


def test_a_second_section_block_is_refused_rather_than_replacing_the_first(tmp_path):
    text = "rollout:\n  temperature: 0.7\n  group_size: 4\nsteps: 3\nrollout:\n  top_p: 1.0\n"
    with pytest.raises(ConfigError, match=r"'rollout' at lines 1 and 5"):
        load_yaml(_write(tmp_path, text))


def test_a_nested_duplicate_key_is_refused(tmp_path):
    text = "rollout:\n  temperature: 0.7\n  group_size: 4\n  temperature: 1.0\n"
    with pytest.raises(ConfigError, match=r"'temperature' at lines 2 and 4"):
        load_yaml(_write(tmp_path, text))


def test_a_duplicate_in_a_flow_mapping_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"'name' at lines 1 and 1"):
        load_yaml(_write(tmp_path, "model: {name: tiny, device: cpu, name: gpt2}\n"))


def test_equal_keys_in_different_sections_are_not_duplicates(tmp_path):
    text = "task:\n  params: {n: 1}\nreward:\n  params: {n: 2}\n"
    assert load_yaml(_write(tmp_path, text)) == {"task": {"params": {"n": 1}}, "reward": {"params": {"n": 2}}}


def test_a_merge_key_and_the_keys_that_override_it_still_load(tmp_path):
    text = "base: &b {lr: 1.0, clip: 0.2}\noptimizer:\n  <<: *b\n  lr: 0.5\n"
    assert load_yaml(_write(tmp_path, text))["optimizer"] == {"lr": 0.5, "clip": 0.2}


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.yaml")), ids=lambda p: p.name)
def test_the_shipped_configs_load_as_before(path):
    assert load_yaml(path) == yaml.safe_load(path.read_text(encoding="utf-8"))


def test_an_empty_file_is_still_an_empty_mapping(tmp_path):
    assert load_yaml(_write(tmp_path, "# only a comment\n")) == {}
