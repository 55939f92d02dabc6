"""The tasks package imports only itself and the layers below it (models, algos, tools, utils), at module
level and inside functions alike: rewards import tasks (``Example``, the instruction checkers), so a task
that imports a reward makes a cycle. import-linter's layer contract puts both in one layer, and so does
not see it; this walk of every import statement does (the hack probes moved from rewards/ to tasks/ for it).
"""

from __future__ import annotations

import ast
from pathlib import Path

TASKS = Path(__file__).resolve().parents[2] / "src" / "posttrain" / "tasks"
ALLOWED = {"tasks", "models", "algos", "tools", "utils"}


def posttrain_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every absolute ``posttrain.*`` import in ``path``, function-level ones included."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.startswith("posttrain.")]
        elif (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and (node.module or "").startswith("posttrain")
        ):
            out.append((node.lineno, str(node.module)))
    return out


def test_the_walk_sees_imports_inside_functions(tmp_path):
    f = tmp_path / "m.py"
    f.write_text(
        "import os\n\ndef g():\n    from posttrain.rewards.base import x\n    import posttrain.train.rl\n"
    )
    assert posttrain_imports(f) == [(4, "posttrain.rewards.base"), (5, "posttrain.train.rl")]


def test_tasks_import_no_reward_and_no_higher_layer():
    bad = [
        f"{p.relative_to(TASKS.parents[1])}:{line} imports {mod}"
        for p in sorted(TASKS.rglob("*.py"))
        for line, mod in posttrain_imports(p)
        if mod.split(".")[1] not in ALLOWED
    ]
    assert not bad, bad
