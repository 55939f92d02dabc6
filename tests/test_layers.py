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


# ------------------------------------------------------------------------------ no import cycles
def _import_graph() -> dict[str, set[str]]:
    """Module -> the posttrain modules it imports, at the top level, inside functions and under
    TYPE_CHECKING alike (``from pkg import name`` counts as the submodule ``pkg.name`` when it is one)."""
    import ast

    src = ROOT / "src"
    mods = {}
    for p in (src / "posttrain").rglob("*.py"):
        name = ".".join(p.relative_to(src).with_suffix("").parts)
        mods[name.removesuffix(".__init__")] = p

    def known(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for mod, path in mods.items():
        deps: set[str] = set()
        pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                    base = ".".join([*parts, *([node.module] if node.module else [])])
                names = [f"{base}.{a.name}" for a in node.names] + [base]
            else:
                continue
            deps.update(k for k in map(known, names) if k and k.startswith("posttrain") and k != mod)
        graph[mod] = deps
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle_among_modules_or_packages():
    """No module of src/posttrain imports, directly or through others, a module that imports it back
    (function-level imports included); no package of it (models, rollout, tasks, rewards, train ...)
    imports one that imports it back. A package's __init__ re-exporting its own submodules is not an
    edge between packages."""
    graph = _import_graph()

    def strip_own_package(mod: str, deps: set[str]) -> set[str]:  # a package -> its submodules: re-exports
        return {d for d in deps if not d.startswith(mod + ".")}

    modules = {m: strip_own_package(m, d) for m, d in graph.items()}
    assert _cycles(modules) == []

    def package(mod: str) -> str:
        return ".".join(mod.split(".")[:2])

    packages: dict[str, set[str]] = {}
    for m, deps in graph.items():
        packages.setdefault(package(m), set()).update(package(d) for d in deps if package(d) != package(m))
    packages = {p: d - {"posttrain"} for p, d in packages.items() if p != "posttrain"}
    assert _cycles(packages) == []


def test_the_cycle_check_finds_a_cycle():
    """The checker itself: a planted cycle of three modules is found (so an empty answer means none)."""
    planted = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(planted) == [["a", "b", "c"]]
