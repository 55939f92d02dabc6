"""Typed configs: YAML files plus `dotted.key=value` overrides, validated by pydantic.

Errors name the offending key, what was expected and where the value came from, e.g.::

    config error:
      objective.name: Value error, unknown value 'dgpoo' (did you mean 'dgpo'?); accepted: cispo, ...
        (from the command-line override 'objective.name=dgpoo')
      unknown key 'optimizer.lrr' (did you mean 'optimizer.lr'?) (in configs/grpo-arithmetic.yaml)

A config section may drop values of the file that a command-line override made obsolete (e.g. the
PPO clip parameters of a YAML file when ``objective.name=gspo`` is given on the command line): see
:meth:`StrictModel.prune_inherited`.
"""

from __future__ import annotations

import difflib
import json
import re
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from posttrain.utils.errors import InvalidValueError, PosttrainError

T = TypeVar("T", bound=BaseModel)


class ConfigError(PosttrainError, ValueError):
    """A configuration problem, with a message that names the key and the accepted values."""


class StrictModel(BaseModel):
    """Base for every config section: unknown keys are errors, assignments are validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    @classmethod
    def prune_inherited(cls, data: dict[str, Any], cli_keys: set[str]) -> list[str]:
        """Hook called by :func:`build_config` before validation, with this section's raw values and
        the keys (relative, dotted) that the command line set in it. A section may drop values that
        came from the config file and that a command-line choice made obsolete; it returns one
        notice per drop (printed to stderr). Values set on the command line are never dropped."""
        return []


def settings_diff(
    saved: dict[str, Any], current: dict[str, Any], *, ignore: Iterable[str] = ()
) -> dict[str, tuple[Any, Any]]:
    """The keys (but ``ignore``) whose value differs between a run folder's saved settings (as read
    back from JSON) and the current ones, sorted, each as (saved, current). ``current`` is compared in
    its JSON form (a tuple equals the list JSON gives back); a key missing on one side reads as None.
    What a resumable command uses to refuse mixing runs made with other settings into one folder."""
    cur = json.loads(json.dumps(current))
    keys = sorted((saved.keys() | cur.keys()) - set(ignore))
    return {k: (saved.get(k), cur.get(k)) for k in keys if saved.get(k) != cur.get(k)}


def parse_override(text: str) -> tuple[str, Any]:
    """`a.b.c=value` -> ("a.b.c", value), with the value parsed as YAML (so 1e-5, true, [1,2] work)."""
    if "=" not in text:
        raise ConfigError(f"override {text!r}: expected key=value (e.g. steps=50 or optimizer.lr=1e-5)")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"override {text!r}: empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    if isinstance(value, str) and _FLOAT.fullmatch(value.strip()):
        value = float(value)  # YAML 1.1 reads "1e-5" (no dot) as a string
    return key, value


_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


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


class DuplicateKeyError(yaml.YAMLError):
    """A YAML mapping that gives one key twice (PyYAML would silently keep the last value)."""

    def __init__(self, key: Any, first_line: int, second_line: int) -> None:
        super().__init__(f"duplicate key {key!r} (lines {first_line} and {second_line})")
        self.key = key
        self.first_line = first_line
        self.second_line = second_line


class UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a mapping holding the same key twice.

    PyYAML keeps the last of two equal keys, so ``steps: 2`` followed by ``steps: 7`` runs 7 steps
    and a second ``rollout:`` block drops every key of the first one, with no warning. Merge keys
    (``<<: *anchor``) are not duplicates: the keys written next to them override the merged ones
    as YAML specifies."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.get(key)
            except TypeError:  # unhashable key: SafeLoader's own check reports it
                continue
            line = key_node.start_mark.line + 1
            if first is not None:
                raise DuplicateKeyError(key, first, line)
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def load_yaml(path: str | Path) -> dict[str, Any]:
    """The mapping a YAML config file holds ({} for an empty file); a missing file, a directory,
    invalid YAML, a duplicate key or a top level that is not a mapping is a :class:`ConfigError`
    naming the file."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"config file {path} does not exist")
    if path.is_dir():
        yamls = sorted(p.name for p in path.glob("*.yaml"))
        listing = f" (it holds: {', '.join(yamls)})" if yamls else ""
        raise ConfigError(f"config file {path} is a directory; expected a YAML file{listing}")
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=UniqueKeyLoader)  # a SafeLoader
    except DuplicateKeyError as e:
        raise ConfigError(
            f"{path}: duplicate key {e.key!r} at lines {e.first_line} and {e.second_line}; "
            "YAML would keep only the second: remove or merge one of them"
        ) from e
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


def _leaf_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Dotted keys that hold values (not sections): what an override hint may suggest."""
    keys = []
    for name, field in model.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            keys.extend(_leaf_keys(ann, f"{prefix}{name}."))
        else:
            keys.append(f"{prefix}{name}")
    return keys


def _origin(loc: str, source: str, cli: dict[str, str]) -> str:
    """Where the value at `loc` came from: the command-line override(s) that set it (or a section
    above / a key below it), else the config file."""
    hits = [
        text
        for key, text in cli.items()
        if key == loc or loc.startswith(key + ".") or key.startswith(loc + ".")
    ]
    if hits:
        s = "s" if len(hits) > 1 else ""
        return f" (from the command-line override{s} {', '.join(repr(h) for h in hits)})"
    return f" (in {source})" if source else ""


def _format_error(
    model: type[BaseModel], err: ValidationError, source: str, cli: dict[str, str] | None = None
) -> str:
    lines = []
    known = _known_keys(model)
    leaves = _leaf_keys(model)
    cli = cli or {}
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"])
        if e["type"] == "extra_forbidden":
            # a misspelled section ('optimiser') means the section ('optimizer'), not one of its keys
            depth = [k for k in known if k.count(".") == loc.count(".")]
            close = (
                difflib.get_close_matches(loc, depth, n=1)
                or difflib.get_close_matches(loc, leaves, n=1)
                or difflib.get_close_matches(loc, known, n=1)
            )
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            lines.append(f"unknown key '{loc}'{hint}{_origin(loc, source, cli)}")
        elif not loc:  # a check of the whole config: its message names the keys it is about
            msg = e["msg"].removeprefix("Value error, ")
            lines.append(f"{msg}{_origin(loc, source, cli)}")
        else:
            got = e.get("input")
            shown = "" if isinstance(got, dict) else f" (got {got!r})"  # a section: the message says it
            lines.append(f"{loc}: {e['msg']}{shown}{_origin(loc, source, cli)}")
    return "config error:\n  " + "\n  ".join(lines)


def _prune(model: type[BaseModel], data: dict[str, Any], cli_keys: set[str], prefix: str = "") -> list[str]:
    """Run every section's :meth:`StrictModel.prune_inherited` hook, children first."""
    notices: list[str] = []
    for name, field in model.model_fields.items():
        ann = field.annotation
        sub = data.get(name)
        if not (isinstance(ann, type) and issubclass(ann, BaseModel) and isinstance(sub, dict)):
            continue
        if name in cli_keys:  # the whole section came from the command line: nothing inherited
            continue
        rel = {k[len(name) + 1 :] for k in cli_keys if k.startswith(name + ".")}
        notices.extend(_prune(ann, sub, rel, f"{prefix}{name}."))
    hook = getattr(model, "prune_inherited", None)
    if hook is not None:
        notices.extend(hook(data, cli_keys))
    return notices


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
    cli: dict[str, str] = {}
    for ov in overrides or []:
        key, value = parse_override(ov)
        set_dotted(tree, key, value)
        cli[key] = ov
    for notice in _prune(model, tree, set(cli)):
        print(f"note: {notice}", file=sys.stderr)
    try:
        return model.model_validate(tree)
    except ValidationError as e:
        raise ConfigError(_format_error(model, e, source, cli)) from None


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
        raise InvalidValueError(f"unknown value {value!r}{hint}; accepted: {', '.join(sorted(accepted))}")
    return value
