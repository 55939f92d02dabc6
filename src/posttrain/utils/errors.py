"""The root of posttrain's own errors and warnings.

Every error posttrain raises on purpose (a bad config key, a dataset row, a plug-in path, a
checkpoint, a run folder ...) is a :class:`PosttrainError`, so ``except posttrain.PosttrainError``
catches them all; each is also the built-in error it was before (``ValueError``, ``TypeError``,
``RuntimeError``, ``KeyError``), so existing ``except ValueError`` code keeps working.

Specific errors (``ConfigError``, ``DatasetError``, ``CheckpointError`` ...) subclass these; a raise
that has no more specific class uses the generic ones below. ``tests/test_errors.py`` walks the source
and fails on a bare ``raise ValueError/TypeError/RuntimeError(`` outside its documented list.

Every warning posttrain issues is a :class:`PosttrainWarning` (each also the built-in category it was:
``RuntimeWarning``, ``UserWarning``), shown as one line ``posttrain: <Category>: message``; Python's
default format added the file:line of the ``warnings.warn`` call and that source line, which meant
nothing to a user. ``import posttrain`` installs the format (:func:`install_warning_format`); other
packages' warnings keep theirs. The command line prints every warning as ``warning: <message>``.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar


class PosttrainError(Exception):
    """Base class of posttrain's errors (each also subclasses the built-in error it replaces)."""


class InvalidValueError(PosttrainError, ValueError):
    """An argument, setting or input has a value posttrain cannot use (the message names it)."""


class InvalidTypeError(PosttrainError, TypeError):
    """An argument or input has a type posttrain cannot use (the message names it and the type)."""


class PosttrainRuntimeError(PosttrainError, RuntimeError):
    """Something failed while running (a worker, an engine, a sync); the message says what and where."""


class MissingPackageError(PosttrainError, ImportError):
    """An optional package a setting needs is not installed (``peft`` for ``model.lora``, ``tensorboard``
    for ``logging.tensorboard`` ...); the message names the setting, the package and the command that
    installs its extra, and the command line prints it as one line."""


# ------------------------------------------------------------------------------------- warnings
class PosttrainWarning(UserWarning):
    """Base class of posttrain's warnings (filter them all with ``category=posttrain.PosttrainWarning``)."""


def format_posttrain_warning(message: Warning | str, category: type[Warning]) -> str | None:
    """``posttrain: <Category>: message`` (one line, newline-terminated) for a posttrain warning, else
    None."""
    if isinstance(category, type) and issubclass(category, PosttrainWarning):
        return f"posttrain: {category.__name__}: {message}\n"
    return None


def install_warning_format() -> None:
    """Show posttrain's warnings as one line wherever Python shows warnings (``warnings.showwarning``
    formats through ``warnings.formatwarning``): wraps the current ``formatwarning``, which still
    formats every other warning. Idempotent."""
    current = warnings.formatwarning
    if getattr(current, "_posttrain_format", False):
        return

    def formatwarning(
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        line: str | None = None,
    ) -> str:
        text = format_posttrain_warning(message, category)
        return text if text is not None else current(message, category, filename, lineno, line)

    formatwarning._posttrain_format = True  # type: ignore[attr-defined]
    warnings.formatwarning = formatwarning


# --------------------------------------------------------------------- options named in messages
_ON_COMMAND_LINE: ContextVar[bool] = ContextVar("posttrain_on_command_line", default=False)

_SPELLINGS = {
    "resume": ("--resume", "resume=True"),
    "overwrite": ("--overwrite", "overwrite=True"),
    "allow_config_change": ("--allow-config-change", "allow_config_change=True"),
}


def option(name: str) -> str:
    """An option as the caller spells it, for a message: ``--resume`` on the command line (inside
    :func:`command_line_messages`), ``resume=True`` from Python (``RLTrainer(cfg, resume=True)``,
    ``trainer.train(overwrite=True)``), so an API user is not told to pass a CLI flag."""
    cli, api = _SPELLINGS[name]
    return cli if _ON_COMMAND_LINE.get() else api


@contextmanager
def command_line_messages() -> Iterator[None]:
    """Messages raised inside name options by their command-line flags (the CLI enters it)."""
    token = _ON_COMMAND_LINE.set(True)
    try:
        yield
    finally:
        _ON_COMMAND_LINE.reset(token)
