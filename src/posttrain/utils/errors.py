"""The root of posttrain's own errors.

Every error posttrain raises on purpose (a bad config key, a dataset row, a plug-in path, a
checkpoint, a run folder ...) is a :class:`PosttrainError`, so ``except posttrain.PosttrainError``
catches them all; each is also the built-in error it was before (``ValueError``, ``TypeError``,
``RuntimeError``, ``KeyError``), so existing ``except ValueError`` code keeps working.

Specific errors (``ConfigError``, ``DatasetError``, ``CheckpointError`` ...) subclass these; a raise
that has no more specific class uses the generic ones below. ``tests/test_errors.py`` walks the source
and fails on a bare ``raise ValueError/TypeError/RuntimeError(`` outside its documented list.
"""

from __future__ import annotations

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
