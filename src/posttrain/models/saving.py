"""Writing a model directory atomically: ``save_pretrained`` (safetensors) + tokenizer into a temp
directory, every file fsync'ed, then one rename (:func:`save_model_dir`). Checkpoints
(:mod:`posttrain.train.checkpoint`) install their step directories the same way (:func:`install_dir`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from posttrain.models.lora import write_base_file
from posttrain.utils.io import default_dir_mode, default_file_mode, make_public_dir


def _fsync_tree(root: Path) -> None:
    """fsync every file under ``root`` and give files / folders the umask's permissions (safetensors
    writes its files 0600 whatever the umask; a teammate or a serving process must be able to read
    them when the umask allows it)."""
    file_mode, dir_mode = default_file_mode(), default_dir_mode()
    os.chmod(root, dir_mode)
    for path in root.rglob("*"):
        if path.is_file():
            os.chmod(path, file_mode)
            with open(path, "rb") as f:
                os.fsync(f.fileno())
        elif path.is_dir():
            os.chmod(path, dir_mode)


def install_dir(tmp: Path, final: Path) -> Path:
    """fsync every file under the finished temp dir ``tmp``, then rename it to ``final`` (atomic on
    POSIX). An existing ``final`` (re-saving the same step / model dir) is moved aside first and
    deleted only once the new one is in place, so no crash loses both copies."""
    _fsync_tree(tmp)
    old = None
    if final.exists():
        old = final.parent / f".old-{final.name}-{os.getpid()}"
        os.replace(final, old)
    os.replace(tmp, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return final


def save_model_dir(
    model: torch.nn.Module,
    tokenizer: Any,
    path: str | os.PathLike,
    *,
    state_dict: dict[str, torch.Tensor] | None = None,
) -> Path:
    """``save_pretrained`` (safetensors) + tokenizer into ``path`` atomically (temp dir, then rename);
    ``state_dict``: the weights to write instead of the model's own (FSDP2: the gathered full ones)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{path.name}-", dir=path.parent))
    try:
        make_public_dir(tmp)
        quiet_transformers()
        model.save_pretrained(tmp, safe_serialization=True, state_dict=state_dict)
        write_base_file(model, tmp)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        install_dir(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def quiet_transformers() -> None:
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except Exception:  # pragma: no cover - progress bars are cosmetic
        pass
