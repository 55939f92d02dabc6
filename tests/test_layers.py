"""The layering is real: importing a core package loads no lab module and none of the method modules
that moved out of the library, ``import posttrain`` stays light, the method code is gone from
src/posttrain, and import-linter's contracts (pyproject.toml [tool.importlinter]) hold, the one that
keeps the library from importing the lab among them."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
HIGHER = ("posttrain_lab",)
#: Method code that lived in the library before the lab existed (module names as they were): none of it
#: may come back, under its old name or any other in src/posttrain.
MOVED = (
    "posttrain.recipes",
    "posttrain.studies",
    "posttrain.benchmarks",
    "posttrain.silo",
    "posttrain.rm",
    "posttrain.tasks.dialogue_events",
    "posttrain.rewards.events",
    "posttrain.rewards.bench",
    "posttrain.train.event_eval",
    "posttrain.train.demo",
    "posttrain.train.smol_demo",
    "posttrain.envs.sales",
    "posttrain.envs.sales_llm",
    "posttrain._compat",
    "posttrain._deprecated",
)


def _loaded(stmt: str) -> list[str]:
    code = f"import json, sys\n{stmt}\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "stmt",
    [
        "import posttrain.algos",
        "import posttrain.rollout",
        "import posttrain.hooks",
        "import posttrain.rewards",
        "import posttrain.clients",
        "import posttrain.tasks",
        "import posttrain.envs",
        "import posttrain.models",
        "import posttrain.train.rl",
        "import posttrain.train.sft",
    ],
)
def test_core_import_loads_no_lab_module_and_no_moved_method_module(stmt):
    mods = _loaded(stmt)
    bad = [
        m for m in mods if m.startswith(HIGHER) or m in MOVED or m.startswith(tuple(f"{x}." for x in MOVED))
    ]
    assert not bad, f"{stmt} loaded {bad}"


@pytest.mark.parametrize("name", MOVED)
def test_moved_method_code_is_not_in_the_library(name):
    path = ROOT / "src" / Path(*name.split("."))
    assert not path.is_dir() and not path.with_suffix(".py").is_file(), path


def test_rollout_does_not_load_httpx_and_stays_small():
    mods = _loaded("import posttrain.rollout")
    assert "httpx" not in mods
    # before the layering it loaded 44 posttrain modules, SILO's agents and all 30 SILO tasks among them
    assert len([m for m in mods if m.startswith("posttrain")]) < 40
    # the tools (and the sandbox) load only when a runner is given tools; the `answer` environment
    # loads the rewards only when it is built
    assert not [m for m in mods if m.startswith(("posttrain.tools", "posttrain.rewards", "posttrain.tasks"))]


def test_import_posttrain_is_light():
    mods = _loaded("import posttrain")
    assert "torch" not in mods
    assert [m for m in mods if m.startswith("posttrain")] == [
        "posttrain",
        "posttrain.utils",
        "posttrain.utils.errors",
    ]


@pytest.mark.parametrize("stmt", ["import posttrain.train.rl", "import posttrain.cli", "import posttrain"])
def test_ray_loads_only_for_asynchronous_rollout(stmt):
    """Ray is an extra: the library imports it only when rollout.max_staleness > 0 builds generation
    workers (posttrain.train.async_rollout, itself imported only then); a synchronous run never does
    (tests/train/test_async_rollout.py runs one in a fresh process)."""
    mods = _loaded(stmt)
    assert not [m for m in mods if m == "ray" or m.startswith("ray.")]
    assert "posttrain.train.async_rollout" not in mods


def test_import_linter_contracts_hold():
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.fail(
            "lint-imports is not installed: `pip install -e .[dev]` (the dev extra has import-linter)"
        )
    out = subprocess.run([exe], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-3000:]
    text = " ".join(out.stdout.split())  # contract names wrap across lines
    assert ", 0 broken." in text, text[-1500:]
    assert "the library never imports the lab KEPT" in text, text[-1500:]
