"""Crash-safe checkpoints without pickle.

Layout of ``<run>/checkpoints/step_000042/``::

    model/              save_pretrained(safe_serialization=True) + tokenizer files (HF format); with
                        model.lora: the adapter only (peft's adapter_config.json +
                        adapter_model.safetensors) and posttrain_base.json naming the base model
    optimizer.safetensors   every optimizer state tensor, key "state.<param index>.<name>"
    optimizer.json          param_groups and non-tensor state entries
    rng.safetensors         torch CPU (+ CUDA) generator states and the rollout engine's generator
    trainer_state.json      step, python/numpy RNG, sampler / controller / replay state, knobs, config

A checkpoint is written into ``checkpoints/.tmp-step_000042-<random>/``, every file fsync'ed, then the
directory is renamed to its final name (atomic on POSIX) and ``checkpoints/latest`` (a text file
holding the directory name) is replaced atomically. A crash at any point leaves the previous
``latest`` checkpoint intact. Loading uses safetensors and JSON only, never ``torch.load`` of
pickles, so a checkpoint from elsewhere cannot execute code.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from posttrain.models.lora import is_lora, write_base_file
from posttrain.models.saving import install_dir, quiet_transformers
from posttrain.utils.errors import InvalidTypeError, PosttrainError, option
from posttrain.utils.io import atomic_write_text, make_public_dir

LATEST = "latest"


class CheckpointError(PosttrainError, ValueError):
    """A checkpoint that cannot be read; the message names the file and what is wrong with it."""


class CheckpointWriteError(CheckpointError, PosttrainError, OSError):
    """A checkpoint that could not be written (disk full, a read-only or vanished folder): the message
    says what happened, the path, and the last good checkpoint to resume from; nothing partial is
    left behind. The OS error is its ``__cause__``; it is still an ``OSError`` (as it was raised
    before) and a :class:`CheckpointError` (which the CLI reports in one line)."""


def _io_failure(e: BaseException) -> str | None:
    """Why a write failed, when ``e`` is an I/O failure (an ``OSError``, or safetensors' error wrapping
    one), else None."""
    if isinstance(e, OSError):
        import errno

        name = errno.errorcode.get(e.errno or 0)
        what = e.strerror or str(e)
        return f"{what} ({name})" if name else what
    if type(e).__name__ == "SafetensorError":  # "Error while serializing: I/O error: ... (os error 28)"
        import errno
        import re

        text = str(e)
        code = re.search(r"os error (\d+)", text)
        if code:
            n = int(code.group(1))
            name = errno.errorcode.get(n)
            return f"{os.strerror(n)} ({name})" if name else os.strerror(n)
        if "IoError" in text or "I/O error" in text:
            return text
    return None


class RunWriteError(PosttrainError, OSError):
    """Another file of a run folder could not be written (disk full, a read-only or vanished folder):
    ``metrics.jsonl`` or ``samples.jsonl`` while appending a row, SFT's final ``model/``. The message
    names the file, what happened, what was kept and the checkpoint to continue from; the OS error is
    its ``__cause__``, and it is still an ``OSError``."""


def last_good_checkpoint(root: str | os.PathLike) -> Path | None:
    """The complete checkpoint ``root/latest`` names (``root``: a run's ``checkpoints`` folder), or None."""
    root = Path(root)
    latest = root / LATEST
    try:
        last = latest.read_text(encoding="utf-8").strip() if latest.is_file() else None
    except OSError:
        last = None
    if last and (root / last / "trainer_state.json").is_file():
        return root / last
    return None


def _continue_from(root: Path) -> str:
    last = last_good_checkpoint(root)
    if last is None:
        return "there is no earlier checkpoint in this run to resume from"
    return (
        f"the last good checkpoint is {last}; free the space (or fix the folder) and continue from it "
        f"with {option('resume')}"
    )


def _where(e: BaseException) -> str:
    return f" at {e.filename}" if isinstance(e, OSError) and e.filename else ""


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def _space(root: Path, needed: int | None) -> str:
    """``; the checkpoint needs about 12.3 MB (4.0 MB free in <root>)`` ('' when ``needed`` is unknown)."""
    if not needed:
        return ""
    try:
        free = f" ({_mb(shutil.disk_usage(root).free)} free in {root})"
    except OSError:
        free = ""
    return f"; the checkpoint needs about {_mb(needed)}{free}"


def _write_failed(
    root: Path, name: str, step: int, e: BaseException, reason: str, needed: int | None = None
) -> CheckpointWriteError:
    return CheckpointWriteError(
        f"could not write the checkpoint of step {step} to {root / name}: {reason}{_where(e)}"
        f"{_space(root, needed)}; no partial checkpoint was kept, and {_continue_from(root)}"
    )


def _tensor_bytes(tensors: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def checkpoint_bytes(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    model_state: dict[str, torch.Tensor] | None = None,
    optimizer_state: dict[str, Any] | None = None,
) -> int:
    """About how many bytes a checkpoint of ``model`` and ``optimizer`` takes: the weights it saves (a
    LoRA model: the trainable adapter only) and the optimizer's state tensors."""
    if model_state is not None:
        weights = _tensor_bytes(model_state.values())
    elif is_lora(model):
        weights = _tensor_bytes(p for p in model.parameters() if p.requires_grad)
    else:
        weights = _tensor_bytes(model.state_dict().values())
    opt = optimizer_state if optimizer_state is not None else (optimizer.state_dict() if optimizer else None)
    states = _tensor_bytes(v for st in opt["state"].values() for v in st.values()) if opt else 0
    return weights + states


def io_failure(e: BaseException) -> str | None:
    """Why a write failed (``No space left on device (ENOSPC)``) when ``e`` is an I/O failure (an
    ``OSError``, or safetensors' error wrapping one), else None."""
    return _io_failure(e)


def run_write_failed(what: str, e: BaseException, kept: str, ckpt_root: str | os.PathLike) -> RunWriteError:
    """The one-line :class:`RunWriteError` for a failed run-folder write: ``could not <what>: <reason>;
    <kept>, and <the last good checkpoint / how to continue>``."""
    reason = _io_failure(e) or f"{type(e).__name__}: {e}"
    where = _where(e) if str(getattr(e, "filename", None) or "") not in what else ""
    return RunWriteError(f"could not {what}: {reason}{where}; {kept}, and {_continue_from(Path(ckpt_root))}")


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing (the checkpoint is incomplete)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(
            f"{path}: corrupt checkpoint file ({e}); resume from an older step_* directory or start again "
            f"with {option('overwrite')}"
        ) from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: corrupt checkpoint file (expected a JSON object)")
    return data


def read_trainer_state(ckpt: str | os.PathLike) -> dict[str, Any]:
    """``trainer_state.json`` of a checkpoint (step, config, hook states); errors name the file."""
    state = _read_json(Path(ckpt) / "trainer_state.json")
    if not isinstance(state.get("step"), int):
        raise CheckpointError(
            f"{Path(ckpt) / 'trainer_state.json'}: corrupt checkpoint file (no integer 'step')"
        )
    return state


def step_dirname(step: int) -> str:
    return f"step_{step:06d}"


# ------------------------------------------------------------------------------------------- RNG
def capture_rng() -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(tensors, json) with the torch CPU/CUDA, numpy and python RNG states."""
    tensors = {"torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"torch_cuda.{i}"] = s
    np_state = np.random.get_state()
    py_state = random.getstate()
    js = {
        "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
        "python": [py_state[0], list(py_state[1]), py_state[2]],
    }
    return tensors, js


def restore_rng(tensors: dict[str, torch.Tensor], js: dict[str, Any]) -> None:
    torch.set_rng_state(tensors["torch_cpu"])
    cuda = sorted((k for k in tensors if k.startswith("torch_cuda.")), key=lambda k: int(k.split(".")[1]))
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([tensors[k] for k in cuda])
    n = js["numpy"]
    np.random.set_state((n[0], np.asarray(n[1], dtype=np.uint32), n[2], n[3], n[4]))
    p = js["python"]
    random.setstate((p[0], tuple(p[1]), p[2]))


# ------------------------------------------------------------------------------------- optimizer
def _optimizer_to_files(sd: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Files of an index-numbered optimizer state dict (``optimizer.state_dict()``)."""
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for idx, st in sd["state"].items():
        for k, v in st.items():
            if isinstance(v, torch.Tensor):
                tensors[f"state.{idx}.{k}"] = v.detach().contiguous().cpu()
            else:
                scalars.setdefault(str(idx), {})[k] = v
    groups = [{k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items()} for g in sd["param_groups"]]
    return tensors, {"param_groups": groups, "scalars": scalars}


def _optimizer_from_files(
    load: Callable[[dict[str, Any]], None], tensors: dict[str, torch.Tensor], js: dict[str, Any]
) -> None:
    state: dict[int, dict[str, Any]] = {}
    for key, t in tensors.items():
        _, idx, name = key.split(".", 2)
        state.setdefault(int(idx), {})[name] = t
    for idx, kv in js.get("scalars", {}).items():
        state.setdefault(int(idx), {}).update(kv)
    groups = []
    for g in js["param_groups"]:
        g = dict(g)
        if "betas" in g:
            g["betas"] = tuple(g["betas"])
        groups.append(g)
    load({"state": state, "param_groups": groups})


# ---------------------------------------------------------------------------------------- save/load
def save_checkpoint(
    ckpt_root: str | os.PathLike,
    step: int,
    *,
    model: torch.nn.Module,
    tokenizer: Any,
    optimizer: torch.optim.Optimizer | None,
    trainer_state: dict[str, Any],
    extra_tensors: dict[str, torch.Tensor] | None = None,
    keep: int | None = None,
    model_state: dict[str, torch.Tensor] | None = None,
    optimizer_state: dict[str, Any] | None = None,
) -> Path:
    """Write a complete checkpoint atomically and point ``latest`` at it; prune to ``keep`` newest.
    ``model_state`` / ``optimizer_state``: full state dicts to write instead of the model's and the
    optimizer's own (FSDP2: gathered on rank 0 by ``dist.full_state_dicts``; same files)."""
    root = Path(ckpt_root)
    name = step_dirname(step)
    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{name}-", dir=root))
    except OSError as e:
        raise _write_failed(root, name, step, e, _io_failure(e) or str(e)) from e
    try:
        make_public_dir(tmp)
        quiet_transformers()
        model.save_pretrained(tmp / "model", safe_serialization=True, state_dict=model_state)
        write_base_file(model, tmp / "model")  # LoRA: which base model the adapter belongs to
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp / "model")
        if optimizer is not None:
            t, js = _optimizer_to_files(
                optimizer_state if optimizer_state is not None else optimizer.state_dict()
            )
            save_file(t, str(tmp / "optimizer.safetensors"))
            (tmp / "optimizer.json").write_text(json.dumps(js), encoding="utf-8")
        rng_t, rng_js = capture_rng()
        for k, v in (extra_tensors or {}).items():
            rng_t[f"extra.{k}"] = v.detach().contiguous().cpu()
        save_file(rng_t, str(tmp / "rng.safetensors"))
        state = {"step": step, "rng": rng_js, **trainer_state}
        (tmp / "trainer_state.json").write_text(json.dumps(state, default=_json_default), encoding="utf-8")
        final = install_dir(tmp, root / name)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        reason = _io_failure(e)
        if reason is not None:  # disk full, read-only: one line, not the serializer's traceback
            needed = checkpoint_bytes(model, optimizer, model_state, optimizer_state)
            raise _write_failed(root, name, step, e, reason, needed) from e
        raise
    try:
        atomic_write_text(root / LATEST, name + "\n")
    except OSError as e:  # the step's folder is complete, but `latest` still names the one before
        shutil.rmtree(final, ignore_errors=True)
        raise _write_failed(root, name, step, e, _io_failure(e) or str(e)) from e
    if keep is not None:
        prune_checkpoints(root, keep)
    return final


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "item"):
        return obj.item()
    if hasattr(obj, "tolist"):
        return obj.tolist()
    raise InvalidTypeError(f"checkpoint state: {type(obj).__name__} is not JSON serialisable")


def prune_checkpoints(root: Path, keep: int) -> None:
    latest = (root / LATEST).read_text().strip() if (root / LATEST).exists() else None
    steps = sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith("step_"))
    for p in steps[: max(0, len(steps) - keep)]:
        if p.name != latest:
            shutil.rmtree(p, ignore_errors=True)
    for p in root.iterdir():  # leftovers of crashed saves
        if p.is_dir() and p.name.startswith((".tmp-", ".old-")):
            shutil.rmtree(p, ignore_errors=True)


def resolve_checkpoint(path: str | os.PathLike) -> Path:
    """A run dir, its ``checkpoints`` dir, or a ``step_*`` dir -> the checkpoint directory to load."""
    p = Path(path)
    for root in (p / "checkpoints", p):
        if (root / LATEST).is_file():
            name = (root / LATEST).read_text().strip()
            ckpt = root / name
            if not (ckpt / "trainer_state.json").is_file():
                raise FileNotFoundError(
                    f"{root / LATEST} points to {name!r}, which is not a complete checkpoint"
                )
            return ckpt
    if (p / "trainer_state.json").is_file():
        return p
    if not p.exists():
        raise FileNotFoundError(
            f"no checkpoint at {str(p)!r}: it does not exist (expected a run directory with checkpoints/latest)"
        )
    if p.is_dir() and (p / "model" / "config.json").is_file():
        raise FileNotFoundError(
            f"no checkpoint in {str(p)!r} (no checkpoints/latest); it holds a saved model in {str(p / 'model')!r}"
        )
    if p.is_dir() and not (p / "config.json").is_file():
        raise FileNotFoundError(
            f"no checkpoint in {str(p)!r}: it has no config.json, so it is not a Hugging Face model "
            "directory, and no checkpoints/latest, so it is not a run directory with checkpoints"
        )
    raise FileNotFoundError(
        f"no checkpoint in {str(p)!r}: expected a run directory with checkpoints/latest, "
        "a checkpoints directory with a 'latest' file, or a step_* checkpoint directory"
    )


def load_checkpoint(
    ckpt: str | os.PathLike,
    *,
    optimizer: torch.optim.Optimizer | None = None,
    load_optimizer: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Read trainer state (JSON) and RNG/extra tensors, restore the global RNGs and (optionally) the
    optimizer (with ``load_optimizer`` when given, e.g. FSDP2's ``dist.optimizer_loader``; else
    ``optimizer.load_state_dict``). The model weights are in ``ckpt/model`` (load with ``load_model_and_tokenizer``).
    Returns the trainer state dict with ``extra_tensors`` added."""
    ckpt = Path(ckpt)
    state = read_trainer_state(ckpt)
    if "rng" not in state:
        raise CheckpointError(f"{ckpt / 'trainer_state.json'}: corrupt checkpoint file (no 'rng' entry)")
    rng_t = _load_tensors(ckpt / "rng.safetensors")
    restore_rng({k: v for k, v in rng_t.items() if not k.startswith("extra.")}, state["rng"])
    state["extra_tensors"] = {k[len("extra.") :]: v for k, v in rng_t.items() if k.startswith("extra.")}
    if optimizer is not None:
        js = _read_json(ckpt / "optimizer.json")
        load = load_optimizer or optimizer.load_state_dict
        _optimizer_from_files(load, _load_tensors(ckpt / "optimizer.safetensors"), js)
    return state


def _load_tensors(path: Path) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise CheckpointError(f"{path}: missing (the checkpoint is incomplete)")
    try:
        return load_file(str(path))
    except Exception as e:  # safetensors raises its own error types for truncated / foreign files
        raise CheckpointError(f"{path}: corrupt checkpoint file ({e})") from None
