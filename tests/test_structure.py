"""The tests mirror the code, are named by behaviour, and the library never names the lab.

* Every folder under ``tests/`` is ``tests/<a>/<b>`` for a package ``src/posttrain/<a>/<b>/`` or a
  module ``src/posttrain/<a>/<b>.py``; every folder under ``lab/tests/`` mirrors ``lab/posttrain_lab``
  the same way. A test therefore sits where a reader of the code looks for it, and a folder named
  after an event or an old layout fails here. Test files at the top of ``tests/`` and ``lab/tests/``
  are the cross-cutting ones (flat API, layers, errors, README, entry points, this file).
* No test file is named after an event (an audit, an issue number, a wave of fixes, mutants, a
  regression): a name says which behaviour is tested.
* No file under ``src/posttrain`` (code, docstrings, YAML, JSON) contains the lab's name: the library
  never imports the lab (import-linter, ``tests/test_layers.py``) and never names it either.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: (tests root, code root) pairs that must mirror each other.
MIRRORS = [
    (ROOT / "tests", ROOT / "src" / "posttrain"),
    (ROOT / "lab" / "tests", ROOT / "lab" / "posttrain_lab"),
]

#: Folders (with everything below them) that hold no tests of their own, with the reason.
ALLOWED_FOLDERS = {
    "tests/helpers": "shared test helpers, on sys.path through the root conftest.py",
    "lab/tests/benchmarks/silo/data": "SILO-BENCH case files (the authors' published cases) read by tests",
    "lab/tests/benchmarks/perf/fake_llama_cpp": "a fake llama_cpp package put on sys.path by the bench tests",
}

#: Words that name an event rather than a behaviour, as a whole ``_``-separated part of a file name.
EVENT_WORD = re.compile(r"^(audits?|issues?\d*|fix|fixes|mutants?|waves?\d*|regressions?)$")

LAB_NAME = re.compile(r"posttrain[_-]lab")


def _folders(root: Path) -> list[Path]:
    """Folders under `root`, without caches and hidden folders."""
    return sorted(
        p
        for p in root.rglob("*")
        if p.is_dir() and not any(part.startswith((".", "__")) for part in p.relative_to(root).parts)
    )


def _shown(path: Path, tests_root: Path) -> str:
    """`path` relative to the repository (or, outside it, to the folder holding `tests_root`)."""
    base = ROOT if tests_root.is_relative_to(ROOT) else tests_root.parent
    return path.relative_to(base).as_posix()


def folder_violations(tests_root: Path, code_root: Path, allowed: dict[str, str]) -> list[str]:
    """Folders under `tests_root` that mirror no package or module of `code_root` and are not under
    an `allowed` folder (keys as :func:`_shown` writes paths)."""
    bad = []
    for folder in _folders(tests_root):
        rel = _shown(folder, tests_root)
        if any(rel == a or rel.startswith(a + "/") for a in allowed):
            continue
        target = code_root / folder.relative_to(tests_root)
        if not (target.is_dir() or target.with_suffix(".py").is_file()):
            bad.append(
                f"{rel}: no package {target.relative_to(code_root.parent)}/ and no module of that name"
            )
    return bad


def name_violations(tests_root: Path) -> list[str]:
    """Test files under `tests_root` whose name has an event word as one of its parts."""
    bad = []
    for path in sorted(tests_root.rglob("test_*.py")):
        words = [w for w in path.stem.split("_") if EVENT_WORD.match(w)]
        if words:
            bad.append(f"{_shown(path, tests_root)}: named after an event ({', '.join(words)})")
    return bad


def test_every_test_folder_mirrors_a_package_or_module():
    bad = [
        v
        for tests_root, code_root in MIRRORS
        for v in folder_violations(tests_root, code_root, ALLOWED_FOLDERS)
    ]
    assert not bad, (
        "test folders that mirror no code (move the tests, or list the folder with a reason):\n"
        + "\n".join(bad)
    )


def test_allowed_folders_exist():
    """An exception for a folder that is gone is a stale exception."""
    missing = [a for a in ALLOWED_FOLDERS if not (ROOT / a).is_dir()]
    assert not missing, missing


def test_test_files_are_named_by_behaviour_not_by_event():
    bad = [v for tests_root, _ in MIRRORS for v in name_violations(tests_root)]
    assert not bad, "rename each file after what it tests:\n" + "\n".join(bad)


def test_the_checks_catch_a_stray_folder_and_an_event_name(tmp_path):
    """The two checks above fail on a folder that matches nothing and on an event-named file, and
    accept a package folder, a module folder and an allowed folder."""
    code = tmp_path / "pkg"
    (code / "algos").mkdir(parents=True)
    (code / "train").mkdir()
    (code / "train" / "dist.py").write_text("")
    tests = tmp_path / "tests"
    for folder in ("algos", "train/dist", "helpers", "sampling", "train/old_layout"):
        (tests / folder).mkdir(parents=True)
    for name in ("test_losses.py", "test_audit_fixes.py", "test_cli_issue30.py", "test_prefix.py"):
        (tests / "algos" / name).write_text("")
    assert folder_violations(tests, code, {"tests/helpers": "helpers"}) == [
        "tests/sampling: no package pkg/sampling/ and no module of that name",
        "tests/train/old_layout: no package pkg/train/old_layout/ and no module of that name",
    ]
    assert name_violations(tests) == [
        "tests/algos/test_audit_fixes.py: named after an event (audit, fixes)",
        "tests/algos/test_cli_issue30.py: named after an event (issue30)",
    ]


def _library_files() -> list[Path]:
    src = ROOT / "src" / "posttrain"
    return sorted(p for p in src.rglob("*") if p.is_file() and "__pycache__" not in p.parts)


def test_no_file_of_the_library_names_the_lab():
    """Code, docstrings, comments, help texts, YAML and JSON: the library is readable, installable and
    documented without the lab existing; the lab names the library, never the other way."""
    files = _library_files()
    assert len(files) > 50
    bad = []
    for path in files:
        text = path.read_bytes().decode("utf-8", errors="replace")
        for n, line in enumerate(text.splitlines(), 1):
            if LAB_NAME.search(line):
                bad.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:100]}")
    assert not bad, "the library names the lab:\n" + "\n".join(bad)
