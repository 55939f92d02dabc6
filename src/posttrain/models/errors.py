"""The models layer's own error, in a module of its own so that every loader (presets, local folders, the
built-in real model, GGUF files, LoRA adapters) can raise it without importing another loader."""

from __future__ import annotations

from posttrain.utils.errors import PosttrainError


class ModelSpecError(PosttrainError, ValueError):
    """A model spec that is neither a known preset nor a loadable local model directory."""
