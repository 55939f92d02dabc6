"""Old import paths of modules that moved in 0.2 (layout: core / recipes / benchmarks / studies).

``import posttrain.sampling.e3`` still works for one release: a finder on ``sys.meta_path`` maps the
old dotted name to the new module, emits a :class:`DeprecationWarning` that names the new path, and
binds the old name to the *same* module object (``sys.modules``), so ``isinstance`` checks, registries
and monkeypatching see one module. No file exists at the old path, which keeps ``git`` rename detection
intact for anyone merging edits made to the old files.

Old packages whose ``__init__`` re-exported a mix of things (``posttrain.sampling``) map to a small
module in :mod:`posttrain._deprecated` that re-exports the same names from their new homes.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from types import ModuleType
from typing import Any

#: old module -> new module (a prefix entry maps every submodule below it too)
MOVED_PACKAGES: dict[str, str] = {
    "posttrain.rm": "posttrain.recipes.patarm",
    "posttrain.silo": "posttrain.benchmarks.silo",
    "posttrain.cit": "posttrain.studies.cit",
    "posttrain.analysis": "posttrain.studies.analysis",
    "posttrain.scpg": "posttrain.studies.scpg",
    "posttrain.bench": "posttrain.benchmarks",
}
MOVED_MODULES: dict[str, str] = {
    "posttrain.sampling": "posttrain._deprecated.sampling",
    "posttrain.sampling.hooks": "posttrain.hooks.base",
    "posttrain.sampling.e3": "posttrain.recipes.e3.hooks",
    "posttrain.sampling.dapo": "posttrain.recipes.dapo.hooks",
    "posttrain.sampling.asrr": "posttrain.recipes.asrr.hooks",
    "posttrain.sampling.nexgrpo": "posttrain.recipes.nexgrpo.replay",
    "posttrain.sampling.aparl": "posttrain.recipes.aparl.sampler",
    "posttrain.envs.duca_demo": "posttrain.recipes.duca.demo",
    "posttrain.silo.agents.openai_client": "posttrain.clients.openai_chat",
    "posttrain.bench.silo": "posttrain.benchmarks.silo.bench",
    "posttrain.bench.rl_step": "posttrain.benchmarks.perf.rl_step",
    "posttrain.bench.losses": "posttrain.benchmarks.perf.losses",
    "posttrain.bench.common": "posttrain.benchmarks.perf.common",
}


def new_name(old: str) -> str | None:
    """The module that replaced ``old``, or None when ``old`` did not move."""
    if old in MOVED_MODULES:
        return MOVED_MODULES[old]
    for pkg, new in MOVED_PACKAGES.items():
        if old == pkg or old.startswith(pkg + "."):
            return new + old[len(pkg) :]
    return None


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, new: str) -> None:
        self.new = new

    def create_module(self, spec: Any) -> ModuleType:
        warnings.warn(
            f"{spec.name} moved to {self.new}; the old import path works until posttrain 0.3",
            DeprecationWarning,
            stacklevel=2,
        )
        module = importlib.import_module(self.new)
        self._real_spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # the module already ran under its new name; the import system binds the old name to it.
        # It overwrote __spec__ with the alias's spec: put the real one back.
        module.__spec__ = self._real_spec


class _MovedFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        new = new_name(fullname)
        if new is None:
            return None
        real = importlib.util.find_spec(new)
        if real is None:
            return None
        spec = importlib.util.spec_from_loader(
            fullname, _AliasLoader(new), is_package=real.submodule_search_locations is not None
        )
        if spec is not None and real.submodule_search_locations is not None:
            spec.submodule_search_locations = list(real.submodule_search_locations)
        return spec


_FINDER = _MovedFinder()


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (idempotent)."""
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
