"""Every error posttrain (library and lab) raises on purpose is a PosttrainError: the source has no bare
``raise ValueError/TypeError/RuntimeError(...)``, and every exception class it defines on a built-in
error also subclasses PosttrainError (so ``except posttrain.PosttrainError`` catches them all, while
``except ValueError`` keeps working)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import posttrain
from posttrain.utils.errors import InvalidTypeError, InvalidValueError, PosttrainError, PosttrainRuntimeError

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = [ROOT / "src" / "posttrain", ROOT / "lab" / "posttrain_lab"]
BARE = {"ValueError", "TypeError", "RuntimeError"}
BUILTIN_BASES = {"ValueError", "TypeError", "RuntimeError", "KeyError", "OSError"}
#: "path:name" -> why a raise of a bare built-in there is right (none today)
ALLOWED_RAISES: dict[str, str] = {}


def _sources() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in pkg.rglob("*.py"))


def bare_raises(path: Path, root: Path = ROOT) -> list[str]:
    """``path:line`` of each ``raise ValueError(...)``-style statement (a call of a bare built-in)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = []
    for node in ast.walk(tree):
        exc = node.exc if isinstance(node, ast.Raise) else None
        if isinstance(exc, ast.Call) and isinstance(exc.func, ast.Name) and exc.func.id in BARE:
            out.append(f"{path.relative_to(root)}:{node.lineno}")
    return out


def builtin_only_classes(path: Path, root: Path = ROOT) -> list[str]:
    """Exception classes defined on a built-in error without PosttrainError among their direct bases
    (a class deriving from another posttrain error is checked through that one)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            names = {b.id for b in node.bases if isinstance(b, ast.Name)}
            if names & BUILTIN_BASES and "PosttrainError" not in names:
                out.append(f"{path.relative_to(root)}:{node.lineno} {node.name}")
    return out


def test_no_bare_builtin_raises():
    found = [r for p in _sources() for r in bare_raises(p) if r not in ALLOWED_RAISES]
    assert not found, "raise a posttrain.utils.errors class (InvalidValueError, ...) instead:\n" + "\n".join(
        found
    )


def test_every_error_class_is_a_posttrain_error():
    found = [c for p in _sources() for c in builtin_only_classes(p)]
    assert not found, "add PosttrainError as a base:\n" + "\n".join(found)


def test_the_walker_finds_what_it_forbids(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(
        "class E(ValueError):\n    pass\n\n\ndef f():\n    raise TypeError('x')\n", encoding="utf-8"
    )
    assert bare_raises(probe, tmp_path) == ["probe.py:6"]
    assert builtin_only_classes(probe, tmp_path) == ["probe.py:1 E"]


@pytest.mark.parametrize(
    ("cls", "builtin"),
    [(InvalidValueError, ValueError), (InvalidTypeError, TypeError), (PosttrainRuntimeError, RuntimeError)],
)
def test_generic_errors_keep_their_builtin_base(cls, builtin):
    with pytest.raises(builtin):
        raise cls("x")
    assert issubclass(cls, posttrain.PosttrainError) and issubclass(cls, PosttrainError)


def test_a_config_error_is_caught_as_both():
    from posttrain.train.config import load_rl_config

    with pytest.raises(PosttrainError):
        load_rl_config(None, ["steps=-1"])
    with pytest.raises(ValueError):
        load_rl_config(None, ["steps=-1"])
