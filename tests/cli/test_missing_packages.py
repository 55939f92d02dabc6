"""A missing optional package is named in one line with the command that installs it, before a model
loads (issue 41 item 14): the messages said `pip install 'posttrain[gguf]'`, a name that is not on PyPI,
and a missing checker package ended in a long traceback."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from _train_helpers import CLI_TINY
from typer.testing import CliRunner

from posttrain.cli import app
from posttrain.tasks import ifcheckers

ROOT = Path(__file__).parents[2]
CHECKER_MODULES = tuple(ifcheckers.REGISTRIES.values())


def test_no_install_hint_names_a_posttrain_package_on_pypi():
    """posttrain is installed from its checkout: `pip install -e ".[extra]"`, never `posttrain[extra]`."""
    files = [*sorted((ROOT / "src" / "posttrain").rglob("*.py")), *sorted((ROOT / "docs").glob("*.md"))]
    files.append(ROOT / "README.md")
    bad = [
        f"{f.relative_to(ROOT)}:{i}: {line.strip()}"
        for f in files
        for i, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1)
        if re.search(r"posttrain\[\w", line)
    ]
    assert not bad, "\n".join(bad)


@pytest.fixture
def no_checkers(monkeypatch):
    """if-verifiable's checker registries cannot be imported (as after `make demo`, `.[dev]` only)."""
    for module in CHECKER_MODULES:
        monkeypatch.setitem(sys.modules, module, None)
    ifcheckers.registry.cache_clear()
    ifcheckers.unavailable_types.cache_clear()
    yield
    ifcheckers.registry.cache_clear()
    ifcheckers.unavailable_types.cache_clear()


@pytest.fixture
def no_model_load(monkeypatch):
    """Fail the test if a model starts loading."""

    def refuse(*a, **k):
        raise AssertionError("the model was loaded before the missing package was reported")

    import posttrain.models
    import posttrain.train.builder

    monkeypatch.setattr(posttrain.models, "load_model_and_tokenizer", refuse)
    monkeypatch.setattr(posttrain.train.builder, "load_adapter", refuse)


def test_missing_checkers_name_the_extra(no_checkers):
    with pytest.raises(ifcheckers.CheckerUnavailable) as err:
        ifcheckers.registry("ifeval")
    assert 'pip install -e ".[ifbench]"' in str(err.value) and "posttrain[" not in str(err.value)


@pytest.mark.parametrize(
    "args",
    [
        ["eval", "--model", "tiny", "--task", "instructions", "--n", "2"],
        ["rl", "model.name=tiny", "task.name=instructions", "steps=1"],
    ],
    ids=["eval", "rl"],
)
def test_cli_names_missing_checkers_in_one_line_before_the_model_loads(
    args, no_checkers, no_model_load, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 1, (res.output, res.exception)
    lines = [ln for ln in res.output.splitlines() if ln.strip() and not ln.startswith("note:")]
    assert len(lines) == 1 and lines[0].startswith("error: "), res.output
    assert "if-verifiable" in lines[0] and 'pip install -e ".[ifbench]"' in lines[0]
    assert "Traceback" not in res.output


def test_traceback_on_request(no_checkers, no_model_load, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("POSTTRAIN_TRACEBACK", "1")
    res = CliRunner().invoke(app, ["eval", "--model", "tiny", "--task", "instructions", "--n", "2"])
    assert isinstance(res.exception, ifcheckers.CheckerUnavailable)


def test_reward_pool_reports_a_workers_missing_package_in_one_line():
    """A reward whose setup() raises posttrain's own error in a worker: its message, not the worker's
    traceback."""
    from _reward_pool_helpers import MissingPackageReward

    from posttrain.rewards import RewardPool

    with pytest.raises(RuntimeError) as err:
        RewardPool(MissingPackageReward(), num_workers=1, timeout_s=30.0)
    msg = str(err.value)
    assert "\n" not in msg and "Traceback" not in msg, msg
    assert msg.endswith(
        'CheckerUnavailable: checkers need the `if-verifiable` package: pip install -e ".[ifbench]"'
    )


# ------------------------------------------- every optional extra, missing: one line (issue 58 item 2)
def _tiny_gguf(tmp_path: Path) -> list[str]:
    from tiny_gguf import write_tiny_llama_gguf

    path = write_tiny_llama_gguf(tmp_path / "tiny.gguf")
    return ["eval", "--model", str(path), "--n", "1"]


def _parquet_task(tmp_path: Path) -> list[str]:
    (tmp_path / "rows.parquet").write_bytes(b"PAR1")
    return [
        "rl",
        *CLI_TINY,
        "task.name=jsonl",
        f"task.params={{path: {tmp_path / 'rows.parquet'}}}",
        "steps=1",
    ]


def _adapter_dir(tmp_path: Path) -> list[str]:
    """An adapter directory as a LoRA run saves it (peft's adapter_config.json, posttrain_base.json)."""
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text('{"peft_type": "LORA", "r": 2}', encoding="utf-8")
    (adapter / "posttrain_base.json").write_text('{"model": "tiny", "seed": 0}', encoding="utf-8")
    return ["export", "--merge", str(adapter), str(tmp_path / "merged")]


#: (extra, modules made unimportable, the command (or a function of tmp_path giving it), what the line names)
EXTRAS = [
    ("lora-rl", ("peft",), ["rl", *CLI_TINY, "model.lora.rank=2", "steps=1"], '".[lora]"'),
    ("lora-sft", ("peft",), ["sft", "model.name=tiny", "model.lora.rank=2", "steps=1"], '".[lora]"'),
    ("lora-export", ("peft",), _adapter_dir, '".[lora]"'),
    (
        "tensorboard",
        ("torch.utils.tensorboard",),
        ["rl", *CLI_TINY, "logging.tensorboard=true", "steps=1"],
        '".[tensorboard]"',
    ),
    ("wandb", ("wandb",), ["rl", *CLI_TINY, "logging.wandb=true", "steps=1"], '".[wandb]"'),
    ("ray", ("ray",), ["rl", *CLI_TINY, "rollout.max_staleness=1", "steps=1"], ".[ray]"),
    ("gguf", ("gguf",), _tiny_gguf, '".[gguf]"'),
    (
        "ifbench",
        CHECKER_MODULES,
        ["eval", "--model", "tiny", "--task", "instructions", "--n", "1"],
        '".[ifbench]"',
    ),
    ("serve", ("fastapi", "uvicorn"), ["serve", "tiny", "--port", "0"], '".[serve]"'),
    ("data", ("pyarrow", "pyarrow.parquet"), _parquet_task, "pyarrow"),
    ("vllm", ("vllm",), ["rl", *CLI_TINY, "rollout.engine.name=vllm", "steps=1"], '".[vllm]"'),
]


#: reported from the config alone, before a model loads (a real model takes minutes to load)
BEFORE_THE_MODEL = ("lora-rl", "lora-sft", "tensorboard", "wandb", "ray")


@pytest.mark.parametrize(
    ("extra", "modules", "args", "names"),
    EXTRAS,
    ids=[getattr(e, "values", e)[0] for e in EXTRAS],
)
def test_each_missing_extra_is_one_line_without_a_traceback(
    extra, modules, args, names, tmp_path, monkeypatch
):
    """Each optional extra, its package made unimportable: the command ends with one `error:` line that
    names the extra's install command, no traceback (`model.lora` without peft was 110 lines)."""
    if callable(args):
        args = args(tmp_path)
    if extra == "ifbench":
        ifcheckers.registry.cache_clear()
        ifcheckers.unavailable_types.cache_clear()
    for module in modules:
        monkeypatch.setitem(sys.modules, module, None)
    if extra in BEFORE_THE_MODEL:
        import posttrain.models.loading

        def refuse(*a, **k):
            raise AssertionError("the model was loaded before the missing package was reported")

        monkeypatch.setattr(posttrain.models.loading, "build_preset_model", refuse)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("POSTTRAIN_CACHE", str(tmp_path / "cache"))
    if args[0] in ("rl", "sft"):
        args = [*args, f"out_dir={tmp_path / 'run'}"]
    try:
        res = CliRunner().invoke(app, args)
    finally:
        ifcheckers.registry.cache_clear()
        ifcheckers.unavailable_types.cache_clear()
    assert res.exit_code in (1, 2), (res.output, res.exception)
    lines = [ln for ln in res.output.splitlines() if ln.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in res.output, res.output
    assert names in lines[0], lines[0]
