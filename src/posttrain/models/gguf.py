"""GGUF files as models: a ``.gguf`` file is converted once into a cached Hugging Face directory.

Wherever a model is accepted (``--model``, ``model.name``, ``posttrain eval/serve/silo/rm``), a path
ending in ``.gguf`` is read through ``transformers``, the ``gguf`` package and ``accelerate`` (which
transformers requires to load a GGUF file; both in the ``gguf`` extra: ``pip install -e ".[gguf]"``): the quantised tensors are dequantised to float32, a model is built from the
file's config with that state dict (every key must match), and it is saved with ``save_pretrained``
(safetensors) together with the tokenizer and chat template that the GGUF metadata carries. A model
loaded with ``from_pretrained(gguf_file=...)`` refuses ``save_pretrained`` ("quantized with gguf"),
which is why the model is rebuilt from its config.

Cache: ``$POSTTRAIN_CACHE/models`` when ``POSTTRAIN_CACHE`` is set, else
``~/.cache/posttrain/models``; one directory ``gguf-<first 16 hex of the file's SHA-256>`` per file
content (renaming or copying the file reuses the conversion; changing a byte converts anew). It is
written into a temporary sibling and renamed into place, so a crash leaves no half directory that
would later be taken for a model. ``remove_cached`` deletes one conversion.

A cached conversion is used without reading the file again, so a prepared model needs neither package.

Errors (:class:`GGUFError`, a ``ModelSpecError``) name the file and what was expected: a missing
``gguf`` or ``accelerate`` package (and the extra that installs them, checked before any conversion
starts), a file that is not GGUF or is cut short, an
architecture transformers cannot load from GGUF (with the supported list).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from posttrain.models.errors import ModelSpecError
from posttrain.utils.io import default_dir_mode

GGUF_MAGIC = b"GGUF"
CACHE_ENV = "POSTTRAIN_CACHE"
META_FILE = "posttrain_gguf.json"


class GGUFError(ModelSpecError):
    """A GGUF file that cannot be converted (missing package, corrupt file, unsupported architecture)."""


def cache_root() -> Path:
    """Where converted models live: ``$POSTTRAIN_CACHE/models`` or ``~/.cache/posttrain/models``."""
    base = os.environ.get(CACHE_ENV)
    root = Path(base).expanduser() if base else Path.home() / ".cache" / "posttrain"
    return root / "models"


def is_gguf_path(spec: str) -> bool:
    """True for a spec naming a ``.gguf`` file (whether or not it exists)."""
    return isinstance(spec, str) and spec.lower().endswith(".gguf")


def file_sha256(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def cached_dir_for(path: str | os.PathLike) -> Path:
    """The cache directory that the conversion of ``path`` has or will have (hashes the file)."""
    return cache_root() / f"gguf-{file_sha256(path)[:16]}"


#: what converting a GGUF file imports: ``gguf`` reads it, transformers' ``from_pretrained(gguf_file=...)``
#: refuses to run without ``accelerate`` ("accelerate is required when loading a GGUF file")
CONVERT_PACKAGES = ("gguf", "accelerate")
INSTALL_HINT = 'pip install -e ".[gguf]"'


def missing_packages(names: tuple[str, ...] = CONVERT_PACKAGES) -> list[str]:
    """The packages of ``names`` that cannot be imported here."""
    import importlib

    missing = []
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    return missing


def _require_gguf(path: Path, names: tuple[str, ...] = ("gguf",)) -> Any:
    """The ``gguf`` module, once every package of ``names`` imports; else one GGUFError naming the
    missing ones and the install command."""
    missing = missing_packages(names)
    if missing:
        what = "reading it" if names == ("gguf",) else "converting it"
        needs = " and ".join(f"`{n}`" for n in names)
        verb = "is" if len(missing) == 1 else "are"
        raise GGUFError(
            f"model {str(path)!r} is a GGUF file; {what} needs {needs}, and {' and '.join(missing)} {verb} "
            f"not installed: {INSTALL_HINT} (or pip install {' '.join(missing)})"
        )
    import gguf

    return gguf


def supported_architectures() -> list[str]:
    """GGUF ``general.architecture`` values that this transformers build can load."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    return sorted(a for a in GGUF_SUPPORTED_ARCHITECTURES if a not in ("general", "tokenizer"))


def read_architecture(path: str | os.PathLike) -> str:
    """The file's ``general.architecture``, after checking that it is a complete GGUF file."""
    p = Path(path)
    if not p.is_file():
        raise GGUFError(f"model {str(p)!r}: no such GGUF file")
    with open(p, "rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise GGUFError(
            f"model {str(p)!r}: not a GGUF file (its first bytes are {magic!r}, expected {GGUF_MAGIC!r})"
        )
    gguf = _require_gguf(p)
    try:
        reader = gguf.GGUFReader(str(p))
        field = reader.fields.get("general.architecture")
        arch = field.contents() if field is not None else None
        # reading each tensor's data view fails on a file that is cut short
        for t in reader.tensors:
            _ = t.data.shape
    except Exception as e:
        raise GGUFError(
            f"model {str(p)!r}: corrupt or truncated GGUF file ({type(e).__name__}: {e}); expected a "
            "complete GGUF v2/v3 file"
        ) from e
    if not isinstance(arch, str) or not arch:
        raise GGUFError(f"model {str(p)!r}: GGUF metadata has no general.architecture")
    return arch


def convert_gguf(path: str | os.PathLike, *, progress: bool = True) -> Path:
    """The cached Hugging Face directory of GGUF file ``path``, converting it on first use."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise GGUFError(f"model {str(p)!r}: no such GGUF file")
    target = cached_dir_for(p)
    if (target / META_FILE).is_file() and (target / "config.json").is_file():
        return target  # converted before (the same bytes): gguf and accelerate are not needed
    _require_gguf(p, CONVERT_PACKAGES)  # before anything is read, in one line
    arch = read_architecture(p)
    supported = supported_architectures()
    if arch not in supported:
        raise GGUFError(
            f"model {str(p)!r}: GGUF architecture {arch!r} is not supported by transformers' GGUF loader; "
            f"supported: {', '.join(supported)}"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    if progress:
        print(f"converting GGUF {p} -> {target} (once; dequantised to float32)", flush=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    os.chmod(tmp, default_dir_mode())  # mkdtemp makes it 0700
    try:
        _convert_into(p, tmp, arch)
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / META_FILE).is_file():  # another process finished first: keep theirs
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def _convert_into(p: Path, out: Path, arch: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    _require_gguf(p, CONVERT_PACKAGES)
    bar = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name, local_files_only=True)
            loaded = AutoModelForCausalLM.from_pretrained(
                str(p.parent), gguf_file=p.name, dtype=torch.float32, local_files_only=True
            )
        except Exception as e:
            raise GGUFError(
                f"model {str(p)!r}: transformers could not load this GGUF file ({type(e).__name__}: {e})"
            ) from e
    finally:
        if bar:
            hf_logging.enable_progress_bar()
    config = loaded.config
    for attr in ("quantization_config", "_pre_quantization_dtype"):
        if hasattr(config, attr):
            delattr(config, attr)
    state = loaded.state_dict()
    with torch.random.fork_rng(devices=[]):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    result = model.load_state_dict(state, strict=False)
    missing = [k for k in result.missing_keys if k not in getattr(model, "_tied_weights_keys", {})]
    if missing or result.unexpected_keys:
        raise GGUFError(
            f"model {str(p)!r}: the dequantised weights do not match a {arch} model built from the file's "
            f"config (missing {missing[:5]}, unexpected {result.unexpected_keys[:5]})"
        )
    del loaded
    model.generation_config.pad_token_id = tokenizer.pad_token_id or tokenizer.eos_token_id
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    meta = {
        "source": str(p.resolve()),
        "sha256": file_sha256(p),
        "architecture": arch,
        "parameters": sum(t.numel() for t in model.parameters()),
    }
    (out / META_FILE).write_text(json.dumps(meta, indent=2), encoding="utf-8")


def cached_conversions() -> list[dict[str, Any]]:
    """Every finished conversion in the cache: its directory and what it was converted from."""
    root = cache_root()
    out = []
    if root.is_dir():
        for d in sorted(root.glob("gguf-*")):
            meta = d / META_FILE
            if meta.is_file():
                out.append({"dir": str(d), **json.loads(meta.read_text(encoding="utf-8"))})
    return out


def remove_cached(path: str | os.PathLike) -> Path | None:
    """Delete the cached conversion of GGUF file ``path``; the directory removed, or None."""
    target = cached_dir_for(path)
    if target.exists():
        shutil.rmtree(target)
        return target
    return None
