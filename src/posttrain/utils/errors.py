"""The root of posttrain's own errors.

Every error posttrain raises on purpose (a bad config key, a dataset row, a plug-in path, a
checkpoint, a run folder ...) is a :class:`PosttrainError`, so ``except posttrain.PosttrainError``
catches them all; each is also still the ``ValueError`` (or ``RuntimeError``) it was before, so
existing ``except ValueError`` code keeps working."""

from __future__ import annotations


class PosttrainError(Exception):
    """Base class of posttrain's errors (also raised as ``ValueError`` / ``RuntimeError`` subclasses)."""
