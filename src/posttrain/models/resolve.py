"""What a ``model.name`` means on disk: :func:`resolve_model_dir` (a preset, a Hugging Face model folder, a
run folder or checkpoint, a LoRA adapter folder, the built-in real model or a GGUF file converted once).
Below the loaders: :mod:`posttrain.models.loading` and :mod:`posttrain.models.lora` both use it, neither
is imported by it."""

from __future__ import annotations

from pathlib import Path

from posttrain.models.errors import ModelSpecError
from posttrain.models.presets import PRESETS, list_presets

#: the file that marks a LoRA adapter folder (peft's ``save_pretrained``)
ADAPTER_CONFIG = "adapter_config.json"


def resolve_model_dir(spec: str) -> str:
    """A preset name or HF model directory unchanged; a built-in real model (``smollm2-135m``) or a
    ``.gguf`` file -> its cached converted HF directory (:mod:`posttrain.models.gguf`); a run folder -> the model directory it means
    (RL run: its latest checkpoint's ``model/``; SFT run / demo ``rl/``: ``model/``; ``step_*``
    checkpoint: ``model/``). A directory that is none of these is a :class:`ModelSpecError` saying so."""
    if spec in PRESETS:
        return spec
    from posttrain.models.builtin import resolve_builtin_or_gguf

    converted = resolve_builtin_or_gguf(spec)  # a built-in real model or a .gguf file -> cached HF dir
    if converted is not None:
        return converted
    path = Path(spec).expanduser()
    if not path.is_dir() or _is_model_dir(path):
        return spec
    for root in (path / "checkpoints", path):
        latest = root / "latest"
        if latest.is_file():
            name = latest.read_text(encoding="utf-8").strip()
            model = root / name / "model"
            if not _is_model_dir(model):
                raise ModelSpecError(
                    f"model {spec!r}: {str(latest)!r} points to {name!r}, which has no model/config.json "
                    "(an incomplete checkpoint)"
                )
            return str(model)
    if _is_model_dir(path / "model"):
        return str(path / "model")
    raise ModelSpecError(
        f"model {spec!r}: directory {str(path)!r} has no config.json, so it is not a Hugging Face model "
        "directory, and it is not a run folder either (no checkpoints/latest, no model/config.json); "
        f"expected one of those, a preset ({', '.join(list_presets())}), a built-in real model or a .gguf file"
    )


def _is_model_dir(path: Path) -> bool:
    """A full Hugging Face model directory or a LoRA adapter directory (posttrain.models.lora)."""
    return (path / "config.json").is_file() or (path / ADAPTER_CONFIG).is_file()
