"""Typed configs: YAML files plus `dotted.key=value` overrides, validated by pydantic.

Errors name the offending key and what was expected, e.g.::

    config error: train.objective: unknown value 'dgpoo'; accepted: cispo, dapo, dgpo, ...
    config error: unknown key 'train.lrr' (did you mean 'train.lr'?)
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

T = TypeVar("T", bound=BaseModel)


class ConfigError(ValueError):
    """A configuration problem, with a message that names the key and the accepted values."""


class StrictModel(BaseModel):
    """Base for every config section: unknown keys are errors, assignments are validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def parse_override(text: str) -> tuple[str, Any]:
    """`a.b.c=value` -> ("a.b.c", value), with the value parsed as YAML (so 1e-5, true, [1,2] work)."""
    if "=" not in text:
        raise ConfigError(f"override {text!r}: expected key=value (e.g. train.lr=1e-5)")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"override {text!r}: empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key, value


def set_dotted(tree: dict[str, Any], key: str, value: Any) -> None:
    node = tree
    parts = key.split(".")
    for p in parts[:-1]:
        child = node.get(p)
        if child is None:
            child = node[p] = {}
        elif not isinstance(child, dict):
            raise ConfigError(f"override {key}: '{p}' is a value, not a section")
        node = child
    node[parts[-1]] = value


def load_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"config file {path} does not exist")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: invalid YAML: {e}") from e
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def _known_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    keys = []
    for name, field in model.model_fields.items():
        full = f"{prefix}{name}"
        keys.append(full)
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            keys.extend(_known_keys(ann, full + "."))
    return keys


def _format_error(model: type[BaseModel], err: ValidationError, source: str) -> str:
    lines = []
    known = _known_keys(model)
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"])
        if e["type"] == "extra_forbidden":
            close = difflib.get_close_matches(loc, known, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            lines.append(f"unknown key '{loc}'{hint}")
        elif e["type"] in ("literal_error", "enum"):
            lines.append(f"{loc}: {e['msg']} (got {e.get('input')!r})")
        else:
            lines.append(f"{loc}: {e['msg']} (got {e.get('input')!r})")
    where = f" in {source}" if source else ""
    return f"config error{where}:\n  " + "\n  ".join(lines)


def build_config(
    model: type[T],
    path: str | Path | None = None,
    overrides: list[str] | None = None,
    base: dict[str, Any] | None = None,
) -> T:
    """Merge `base` <- YAML file <- overrides and validate into `model`."""
    tree: dict[str, Any] = _deep_merge({}, base or {})
    source = ""
    if path is not None:
        tree = _deep_merge(tree, load_yaml(path))
        source = str(path)
    for ov in overrides or []:
        key, value = parse_override(ov)
        set_dotted(tree, key, value)
    try:
        return model.model_validate(tree)
    except ValidationError as e:
        raise ConfigError(_format_error(model, e, source)) from None


def _deep_merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def check_choice(key: str, value: str, accepted: list[str] | tuple[str, ...]) -> str:
    """Validator helper for registry-backed string options: clear error naming key and choices."""
    if value not in accepted:
        close = difflib.get_close_matches(value, list(accepted), n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise ValueError(f"unknown value {value!r}{hint}; accepted: {', '.join(sorted(accepted))}")
    return value
