"""The layering is real: importing a core package loads no higher layer, and import-linter's
contracts (pyproject.toml [tool.importlinter]) hold."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
HIGHER = (
    "posttrain.silo",
    "posttrain.rm",
    "posttrain_lab.recipes",
    "posttrain_lab.studies",
    "posttrain_lab.benchmarks",
)


def _loaded(stmt: str) -> list[str]:
    code = f"import json, sys\n{stmt}\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "stmt",
    [
        "import posttrain.rollout",
        "import posttrain.hooks",
        "import posttrain.tasks",
        "import posttrain.envs",
        "import posttrain.models",
        "import posttrain.train.rl",
    ],
)
def test_core_import_loads_no_recipe_study_or_benchmark(stmt):
    mods = _loaded(stmt)
    bad = [m for m in mods if m.startswith(HIGHER)]
    assert not bad, f"{stmt} loaded {bad}"


def test_rollout_does_not_load_httpx_or_the_silo_tasks():
    mods = _loaded("import posttrain.rollout")
    assert "httpx" not in mods
    # before the layering it loaded 44 posttrain modules, SILO's agents and all 30 SILO tasks among them
    assert not [m for m in mods if m.startswith("posttrain_lab.benchmarks")]
    assert len([m for m in mods if m.startswith("posttrain")]) < 40


def test_import_posttrain_is_light():
    mods = _loaded("import posttrain")
    assert "torch" not in mods
    assert [m for m in mods if m.startswith("posttrain")] == [
        "posttrain",
        "posttrain._compat",
        "posttrain.utils",
        "posttrain.utils.errors",
    ]


def test_import_linter_contracts_hold():
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.fail(
            "lint-imports is not installed: `pip install -e .[dev]` (the dev extra has import-linter)"
        )
    out = subprocess.run([exe], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-3000:]
    assert "3 kept, 0 broken" in out.stdout
