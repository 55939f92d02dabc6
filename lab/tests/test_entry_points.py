"""The lab plugs into the library only through the entry points lab/pyproject.toml declares, and each
name is written twice (the entry point, and the decorator beside the code) without drifting apart:

* every entry point of a ``posttrain.*`` registry group names a library registry that reads that
  group, loads, and its module registers exactly that name (or alias) on import, for that object;
* every name a lab module registers into a library registry is declared as an entry point, so it
  exists before anything imports the module;
* the ``posttrain.cli`` entry point adds the lab's commands to ``posttrain.cli.app``, and the library
  alone has none of them;
* the installed metadata is what lab/pyproject.toml declares (a stale editable install is named).

Each check runs in a fresh interpreter: in this process the suite has imported modules and
snapshotted registries already.
"""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import distribution
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

LAB = Path(__file__).resolve().parents[1]
DECLARED: dict[str, dict[str, str]] = tomllib.loads((LAB / "pyproject.toml").read_text())["project"][
    "entry-points"
]
REGISTRY_GROUPS = {
    g: eps for g, eps in DECLARED.items() if g.startswith("posttrain.") and g != "posttrain.cli"
}
LAB_COMMANDS = {"demo", "silo", "rm", "cit", "analyze", "scpg"}
LAB_BENCHES = {"ablation", "dpo-step", "generate", "losses", "preference", "rl-step", "reward-pool", "silo"}

# Imports the library's registries, then each entry point's module, and reports per entry point whether
# the module's import registered that name for that object; then imports every lab module and lists
# the names lab code registered into a library registry.
_REGISTRATIONS = r"""
import importlib, json, pkgutil, sys
import posttrain.algos, posttrain.envs, posttrain.hooks, posttrain.models, posttrain.rewards
import posttrain.rollout, posttrain.tasks
from posttrain.algos import AdvantageEstimator, PolicyLoss
from posttrain.utils.registry import all_registries

declared = json.loads(sys.argv[1])
regs = {r.group: r for r in all_registries() if r.group}

def unwrap(entry):
    if isinstance(entry, AdvantageEstimator):
        return entry.fn
    if isinstance(entry, PolicyLoss):
        return entry.core
    return entry

def registered(reg):
    items, aliases = reg.snapshot()[:2]
    out = dict(items)
    out.update({a: items[n] for a, n in aliases.items() if n in items})
    return out

report = {"unknown_groups": sorted(set(declared) - set(regs)), "entry_points": [], "lab_names": []}
for group, eps in sorted(declared.items()):
    reg = regs.get(group)
    if reg is None:
        continue
    for name, target in sorted(eps.items()):
        module, attr = target.split(":")
        obj = getattr(importlib.import_module(module), attr)
        entry = registered(reg).get(name)
        try:
            resolved = unwrap(reg.get(name)) is obj
        except Exception:  # reported by the test, with the other names
            resolved = False
        report["entry_points"].append(
            [group, name, entry is not None, entry is not None and unwrap(entry) is obj, resolved]
        )

def optional_dependency_missing(e):  # a third-party module not installed (verl, sacrebleu, ...)
    while e is not None:
        if isinstance(e, ModuleNotFoundError) and not (e.name or "").startswith("posttrain"):
            return True
        e = e.__cause__ or e.__context__
    return False

import posttrain_lab
skipped = []
for info in pkgutil.walk_packages(posttrain_lab.__path__, "posttrain_lab."):
    try:
        importlib.import_module(info.name)
    except ImportError as e:
        if not optional_dependency_missing(e):
            raise
        skipped.append(info.name)
for group, reg in sorted(regs.items()):
    for name, entry in sorted(registered(reg).items()):
        if getattr(unwrap(entry), "__module__", "").startswith("posttrain_lab"):
            report["lab_names"].append([group, name])
report["skipped"] = skipped
print(json.dumps(report))
"""

# The command names of `posttrain` without the posttrain.cli entry points, then after loading the lab's.
_COMMANDS = r"""
import importlib.metadata as md, json
import typer.main

real = md.entry_points
md.entry_points = lambda **kw: [] if kw.get("group") == "posttrain.cli" else real(**kw)
import posttrain.cli

def names():
    cmd = typer.main.get_command(posttrain.cli.app)
    return {"top": sorted(cmd.commands), "bench": sorted(cmd.commands["bench"].commands)}

core = names()
md.entry_points = real
(ep,) = [ep for ep in real(group="posttrain.cli") if ep.value.startswith("posttrain_lab")]
ep.load()
print(json.dumps({"core": core, "full": names()}))
"""


def _run(code: str, *args: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=LAB.parent, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def registrations() -> dict:
    return _run(_REGISTRATIONS, json.dumps(REGISTRY_GROUPS))


def test_the_lab_declares_registry_entry_points():
    assert {"posttrain.samplers", "posttrain.shapers", "posttrain.advantages", "posttrain.tasks"} <= set(
        REGISTRY_GROUPS
    )
    assert sum(len(eps) for eps in REGISTRY_GROUPS.values()) >= 15


def test_every_registry_group_is_read_by_a_library_registry(registrations):
    assert registrations["unknown_groups"] == []


def test_each_entry_point_is_the_name_its_module_registers(registrations):
    rows = registrations["entry_points"]
    assert len(rows) == sum(len(eps) for eps in REGISTRY_GROUPS.values())
    not_registered = [f"{g}: {n}" for g, n, reg, _, _ in rows if not reg]
    assert not not_registered, (
        "entry points whose module does not register that name (the decorator says another):\n"
        + "\n".join(not_registered)
    )
    other_object = [f"{g}: {n}" for g, n, reg, same, _ in rows if reg and not same]
    assert not other_object, (
        "the name is registered for another object than the entry point's:\n" + "\n".join(other_object)
    )
    assert all(resolved for *_, resolved in rows)


def test_every_name_the_lab_registers_is_declared(registrations):
    declared = {(g, n) for g, eps in REGISTRY_GROUPS.items() for n in eps}
    undeclared = sorted(
        f"{g}: {n}" for g, n in map(tuple, registrations["lab_names"]) if (g, n) not in declared
    )
    assert not undeclared, (
        "lab names that exist only once their module is imported (declare them in lab/pyproject.toml):\n"
        + "\n".join(undeclared)
    )
    assert {tuple(x) for x in registrations["lab_names"]} == declared


def test_the_lab_adds_its_commands_to_the_cli():
    got = _run(_COMMANDS)
    core, full = got["core"], got["full"]
    assert not LAB_COMMANDS & set(core["top"]) and not LAB_BENCHES & set(core["bench"])
    assert {"rl", "sft", "eval", "serve", "bench"} <= set(core["top"]) and "serve" in core["bench"]
    assert set(full["top"]) - set(core["top"]) == LAB_COMMANDS
    assert set(full["bench"]) - set(core["bench"]) == LAB_BENCHES


def test_the_installed_entry_points_are_the_declared_ones():
    installed = {(ep.group, ep.name, ep.value) for ep in distribution("posttrain-lab").entry_points}
    declared = {(g, n, v) for g, eps in DECLARED.items() for n, v in eps.items()}
    assert installed == declared, (
        "the installed posttrain-lab is stale: pip install -e lab (without deps) to re-read lab/pyproject.toml"
    )
