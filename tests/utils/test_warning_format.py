"""posttrain's warnings are shown as one line `posttrain: <Category>: message` from the Python API
(issue 41 item 23): Python's default format printed the file:line of the `warnings.warn` call and that
source line (`self._warn_degenerate(metrics)`), which meant nothing to a user. Other packages' warnings
keep Python's format; the command line keeps `warning: <message>`."""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest

import posttrain


def _categories() -> list[type[Warning]]:
    from posttrain.hooks.filters import DynamicSamplingWarning
    from posttrain.tasks import DatasetWarning
    from posttrain.train.builder import DegenerateSettingWarning
    from posttrain.train.config import SingleUpdateWarning

    return [SingleUpdateWarning, DegenerateSettingWarning, DynamicSamplingWarning, DatasetWarning]


SCRIPT = """
import warnings
from posttrain.train.config import load_rl_config
load_rl_config(None, ["objective.name=dapo"])  # one update per step: SingleUpdateWarning
warnings.warn("someone else's warning")
"""


def test_api_warnings_are_one_line_naming_posttrain_and_the_category(tmp_path):
    script = tmp_path / "warns.py"
    script.write_text(SCRIPT, encoding="utf-8")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if "note:" not in ln]
    ours = [ln for ln in lines if ln.startswith("posttrain: SingleUpdateWarning: objective 'dapo' with ")]
    assert len(ours) == 1, proc.stderr
    # no file:line and no source line for ours (the one `warnings.warn(` line is the other warning's)
    assert proc.stderr.count("warnings.warn(") == 1 and "config.py" not in proc.stderr, proc.stderr
    # another package's warning keeps Python's format (file:line: Category: message, then the source)
    assert any(ln.endswith("UserWarning: someone else's warning") and "warns.py:5" in ln for ln in lines)


@pytest.mark.parametrize("i", range(4))
def test_every_posttrain_warning_category_is_one_line(i):
    category = _categories()[i]
    assert issubclass(category, posttrain.PosttrainWarning)
    text = warnings.formatwarning("it happened", category, "/x/y.py", 3, "warnings.warn(msg)")
    assert text == f"posttrain: {category.__name__}: it happened\n"


def test_built_in_categories_are_kept():
    """`except`/filters written for RuntimeWarning or UserWarning still match."""
    single, degenerate, dynamic, dataset = _categories()
    assert issubclass(degenerate, RuntimeWarning) and issubclass(dynamic, RuntimeWarning)
    assert issubclass(single, UserWarning) and issubclass(dataset, UserWarning)


def test_every_warn_call_in_the_library_names_a_posttrain_category():
    """A `warnings.warn(...)` without a category is a plain UserWarning, shown with Python's format."""
    import re
    from pathlib import Path

    root = Path(posttrain.__file__).parent
    bad = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        for m in re.finditer(r"warnings\.warn\((.*?)\n\s*\)", text, re.S):
            if "Warning" not in m.group(1):
                bad.append(f"{path.relative_to(root)}: {m.group(0)[:80]}")
    assert not bad, bad
