"""``model.precision: auto`` (the default) resolves to bf16 only where the hardware computes bf16
natively (a CPU with AVX512-BF16 or AMX, a CUDA GPU with bf16), fp32 elsewhere; it is resolved where the
model is built (never when a config is validated or a module imported), printed once per run with what
the run uses, and recorded in the run folder's run.json."""

from __future__ import annotations

import pytest

from posttrain.models import precision as prec
from posttrain.train.config import RLConfig

AVX2_CPUINFO = "processor\t: 0\nflags\t\t: fpu sse sse2 avx avx2 fma\n"
SPR_CPUINFO = "processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"


@pytest.fixture(autouse=True)
def _machine_resolution(monkeypatch):
    """These tests check the per-machine resolution: without the suite's POSTTRAIN_AUTO_PRECISION."""
    monkeypatch.delenv(prec.AUTO_ENV, raising=False)


def test_the_environment_variable_fixes_auto_on_every_machine(monkeypatch):
    monkeypatch.setenv(prec.AUTO_ENV, "fp32")
    assert prec.resolve_precision("auto", "cpu", flags={"amx_bf16"}) == (
        "fp32",
        "POSTTRAIN_AUTO_PRECISION=fp32",
    )
    monkeypatch.setenv(prec.AUTO_ENV, "BF16")
    assert prec.resolve_precision("auto", "cpu", flags=set())[0] == "bf16"
    assert prec.resolve_precision("fp32", "cpu", flags=set())[0] == "fp32"  # an explicit setting wins
    assert prec.resolve_precision("auto", "cpu", "bfloat16", flags=set())[0] == "fp32"  # no fp32 master
    monkeypatch.setenv(prec.AUTO_ENV, "fp16")
    with pytest.raises(ValueError, match=r"POSTTRAIN_AUTO_PRECISION='fp16'.*accepted: fp32, bf16"):
        prec.resolve_precision("auto", "cpu")


def test_cpu_flags_are_read_from_cpuinfo():
    assert "avx2" in prec.cpu_flags(AVX2_CPUINFO) and "avx512_bf16" not in prec.cpu_flags(AVX2_CPUINFO)
    assert {"avx512_bf16", "amx_bf16"} <= prec.cpu_flags(SPR_CPUINFO)
    assert prec.cpu_flags("no flags line") == set()


@pytest.mark.parametrize(
    ("flags", "want"),
    [
        (set(), "fp32"),
        ({"avx2", "avx512f"}, "fp32"),  # AVX-512 without its bf16 extension: no native bf16
        ({"avx512_bf16"}, "bf16"),
        ({"amx_bf16"}, "bf16"),
    ],
)
def test_auto_on_cpu_follows_the_native_bf16_flags(flags, want):
    resolved, why = prec.resolve_precision("auto", "cpu", flags=flags)
    assert resolved == want and why


def test_explicit_settings_and_bf16_weights_are_kept_or_forced():
    assert prec.resolve_precision("bf16", "cpu", flags=set()) == ("bf16", "set explicitly")
    assert prec.resolve_precision("fp32", "cpu", flags={"amx_bf16"})[0] == "fp32"
    resolved, why = prec.resolve_precision("auto", "cpu", "bfloat16", flags={"amx_bf16"})
    assert resolved == "fp32" and "float32 master weights" in why
    with pytest.raises(ValueError, match="accepted: auto, fp32, bf16"):
        prec.resolve_precision("fp16", "cpu")


def test_the_config_keeps_auto_and_validating_it_probes_and_prints_nothing(monkeypatch, capsys):
    """Mutant killed: resolving ``auto`` in the config's validator (the note then printed for runs that
    set fp32, and before config errors)."""
    probed = []
    monkeypatch.setattr(prec, "cpu_flags", lambda cpuinfo=None: probed.append(1) or {"avx512_bf16"})
    cfg = RLConfig.model_validate({"model": {"device": "cpu"}})
    assert cfg.model.precision == "auto" and probed == []
    assert RLConfig.model_validate({"model": {"precision": "FP32"}}).model.precision == "fp32"
    assert capsys.readouterr().err == ""


def test_import_of_the_trainer_prints_nothing():
    import subprocess
    import sys

    env = {k: v for k, v in __import__("os").environ.items() if k != prec.AUTO_ENV}
    out = subprocess.run(
        [sys.executable, "-c", "import posttrain, posttrain.train.rl, posttrain.train.sft"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    assert out.stdout == "" and out.stderr == ""


def test_the_run_prints_what_it_uses_once_and_records_it(monkeypatch, capsys, tmp_path):
    import json

    from posttrain.train.rl import RLTrainer

    monkeypatch.setattr(prec, "cpu_flags", lambda cpuinfo=None: {"avx2"})
    base = {
        "model": {"name": "tiny", "device": "cpu"},
        "rollout": {"prompts_per_step": 2, "group_size": 2, "max_new_tokens": 2},
        "reward": {"num_workers": 0},
        "eval": {"at_start": False, "at_end": False},
        "steps": 1,
    }
    with RLTrainer({**base, "out_dir": str(tmp_path / "a")}) as tr:
        assert tr.precision == "fp32" and tr.cfg.model.precision == "auto"
        tr.train()
    err = capsys.readouterr().err
    assert err.count("note: computing in fp32 (model.precision auto: CPU without native bf16") == 1
    info = json.loads((tmp_path / "a" / "run.json").read_text())
    assert info["precision"] == "fp32" and info["precision_setting"] == "auto" and "no avx512_bf16" in info["cpu"]
    assert "precision: auto" in (tmp_path / "a" / "config.yaml").read_text()
    # an explicit setting is what the note says, whatever the machine could do
    monkeypatch.setattr(prec, "cpu_flags", lambda cpuinfo=None: {"avx512_bf16"})
    with RLTrainer({**base, "model": {"name": "tiny", "device": "cpu", "precision": "fp32"}, "out_dir": str(tmp_path / "b")}) as tr:
        assert tr.precision == "fp32"
    err = capsys.readouterr().err
    assert "note: computing in fp32 (model.precision fp32: set explicitly)" in err and "bf16" not in err


def test_cpu_capability_names_the_kernels_and_the_bf16_flags(monkeypatch):
    monkeypatch.setattr(prec, "cpu_flags", lambda cpuinfo=None: set())
    assert "no avx512_bf16/amx_bf16" in prec.cpu_capability()
