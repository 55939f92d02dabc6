"""``model.precision: auto`` (the default) resolves to bf16 only where the hardware computes bf16
natively (a CPU with AVX512-BF16 or AMX, a CUDA GPU with bf16), fp32 elsewhere, and says why once."""

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
    monkeypatch.setattr(prec, "cpu_flags", lambda cpuinfo=None: {"amx_bf16"})
    monkeypatch.setenv(prec.AUTO_ENV, "fp32")
    assert RLConfig.model_validate({"model": {"device": "cpu"}}).model.precision == "fp32"
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


def test_the_config_default_resolves_per_machine_and_records_it(monkeypatch, capsys):
    monkeypatch.setattr(prec, "_announced", set())
    monkeypatch.setattr(prec, "cpu_flags", lambda cpuinfo=None: {"avx2"})
    cfg = RLConfig.model_validate({"model": {"device": "cpu"}})
    assert cfg.model.precision == "fp32"
    RLConfig.model_validate({"model": {"device": "cpu"}})  # printed once per process and choice
    err = capsys.readouterr().err
    assert err.count("model.precision auto -> fp32") == 1 and "no avx512_bf16/amx_bf16" in err
    monkeypatch.setattr(prec, "cpu_flags", lambda cpuinfo=None: {"avx512_bf16"})
    assert RLConfig.model_validate({"model": {"device": "cpu"}}).model.precision == "bf16"
    assert (
        RLConfig.model_validate({"model": {"device": "cpu", "precision": "fp32"}}).model.precision == "fp32"
    )


def test_cpu_capability_names_the_kernels_and_the_bf16_flags(monkeypatch):
    monkeypatch.setattr(prec, "cpu_flags", lambda cpuinfo=None: set())
    assert "no avx512_bf16/amx_bf16" in prec.cpu_capability()
