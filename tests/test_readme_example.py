"""The Python example in the README's "Python API" section runs as written (tiny preset, 2 steps)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

README = Path(__file__).parents[1] / "README.md"


def _example() -> str:
    text = README.read_text(encoding="utf-8")
    section = text[text.index("### Python API") :]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_readme_python_example_is_short():
    code = _example()
    assert len([line for line in code.splitlines() if line.strip()]) <= 15, code


def test_readme_is_a_front_page():
    words = len(README.read_text(encoding="utf-8").split())
    assert words <= 1200, f"README.md has {words} words; measurements go to docs/results.md"


def test_readme_links_and_paths_exist():
    text = README.read_text(encoding="utf-8")
    root = README.parent
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    missing = [t for t in links if not t.startswith("http") and not (root / t).exists()]
    assert not missing, missing
    for path in re.findall(r"(?:src/posttrain|lab/posttrain_lab)/[\w/.<>-]+\.yaml", text):
        assert (root / path).is_file(), path


def test_readme_python_example_runs_as_written(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # the example writes its run folder (runs/...) under the current directory
    namespace: dict = {"__name__": "readme_example"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exec(compile(_example(), str(README), "exec"), namespace)
    trainer, summary = namespace["trainer"], namespace["summary"]
    assert summary["steps"] == 2 and 0.0 <= summary["eval_end"]["accuracy"] <= 1.0
    assert type(trainer.task).__name__ == "Parity" and trainer.reward_fn is namespace["says_answer"]
    assert [type(s).__name__ for s in trainer.shapers] == ["ShorterIsBetter"]
    assert capsys.readouterr().out.strip().startswith("2 ")
    assert any(Path("runs").iterdir())


def test_readme_python_example_runs_as_a_script(tmp_path):
    """`python example.py` with the README's code as written, no `if __name__ == "__main__":` guard, a
    reward and a task defined in `__main__` (issue 41 item 12): reward workers started with
    forkserver/spawn re-ran the script and it died with 'RewardPool: worker 0 exited during start'."""
    script = tmp_path / "example.py"
    script.write_text(_example(), encoding="utf-8")
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    out = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    steps, accuracy = out.stdout.strip().splitlines()[-1].split()
    assert steps == "2" and 0.0 <= float(accuracy) <= 1.0
    assert any((tmp_path / "runs").iterdir())


def test_readme_rl_commands_let_their_objective_act():
    """The README's `posttrain rl` lines load without SingleUpdateWarning (issue 41 item 23): the
    headline DAPO command ran one on-policy update per step, where its own warning says DAPO's clip
    never acts and the gradient equals GRPO's; two minibatches give DAPO's clip-higher a ratio."""
    import importlib.util
    import shlex

    from posttrain.train.config import SingleUpdateWarning, load_rl_config

    lines = re.findall(r"^posttrain rl .*$", README.read_text(encoding="utf-8"), re.M)
    assert any("objective.name=dapo" in line for line in lines), lines
    for line in lines:
        args = shlex.split(line.split("#", 1)[0])[2:]
        path = args[args.index("--config") + 1]
        if path.startswith("lab/") and importlib.util.find_spec("posttrain_lab") is None:
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("error", SingleUpdateWarning)
            cfg = load_rl_config(str(README.parent / path), [a for a in args if "=" in a])
        if cfg.objective.name == "dapo":
            assert cfg.minibatches * cfg.ppo_epochs >= 2, line
