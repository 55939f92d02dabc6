"""Lazy registration and entry points in posttrain.utils.registry.Registry."""

from __future__ import annotations

import sys
import textwrap

import pytest

from posttrain.utils.registry import PluginError, Registry, UnknownNameError, subclass_of


def _module(tmp_path, monkeypatch, name: str, body: str) -> None:
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(body))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)


def test_lazy_name_is_listed_without_import_and_imported_on_first_get(tmp_path, monkeypatch):
    _module(tmp_path, monkeypatch, "lazy_mod_a", "IMPORTED = True\ndef thing():\n    return 42\n")
    reg: Registry = Registry("widget")
    reg.register_lazy("answer", "lazy_mod_a:thing", aliases=("ans",))
    assert "answer" in reg and "ans" in reg and reg.names() == ["answer"] and reg.is_lazy("answer")
    assert "lazy_mod_a" not in sys.modules  # listing imported nothing
    assert reg.get("ans")() == 42 and "lazy_mod_a" in sys.modules
    assert not reg.is_lazy("answer") and reg.canonical("ans") == "answer"


def test_did_you_mean_lists_lazy_names():
    reg: Registry = Registry("widget")
    reg.register_lazy("judge", "nowhere_mod:judge")
    with pytest.raises(UnknownNameError, match="Did you mean 'judge'"):
        reg.get("jduge")
    with pytest.raises(ValueError, match=r"did you mean 'judge'"):
        reg.check("judgee")


def test_lazy_module_that_registers_itself(tmp_path, monkeypatch):
    reg: Registry = Registry("widget")
    monkeypatch.setitem(sys.modules, "_reg_holder", type(sys)("_reg_holder"))
    sys.modules["_reg_holder"].REG = reg
    _module(
        tmp_path,
        monkeypatch,
        "lazy_mod_b",
        """
        from _reg_holder import REG
        @REG.register("self-reg")
        class SelfReg:
            pass
        @REG.register("sibling")
        class Sibling:
            pass
        """,
    )
    reg.register_lazy("self-reg", "lazy_mod_b:SelfReg")
    reg.register_lazy("sibling", "lazy_mod_b:Sibling")
    assert reg.get("self-reg").__name__ == "SelfReg"
    assert not reg.is_lazy("sibling") and reg.get("sibling").__name__ == "Sibling"


def test_lazy_entry_of_the_wrong_kind_names_the_target(tmp_path, monkeypatch):
    _module(tmp_path, monkeypatch, "lazy_mod_c", "VALUE = 3\n")
    reg: Registry = Registry("widget")
    reg.accept(subclass_of(Exception), "a subclass of Exception")
    reg.register_lazy("bad", "lazy_mod_c:VALUE")
    with pytest.raises(PluginError, match=r"widget 'bad' \(lazy_mod_c:VALUE\) is a int; expected a subclass"):
        reg.get("bad")


def test_lazy_registration_rejects_duplicates_and_bad_targets():
    reg: Registry = Registry("widget")
    reg.register("x")(1)
    with pytest.raises(ValueError, match="already registered"):
        reg.register_lazy("x", "m:x")
    with pytest.raises(ValueError, match=r"must be 'package\.module:attr'"):
        reg.register_lazy("y", "no_colon")


def test_entry_points_of_the_group_are_lazy_entries(tmp_path, monkeypatch):
    """An installed distribution's ``[project.entry-points."posttrain.samplers"]`` adds a name."""
    dist = tmp_path / "my_lab_plugins-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: my-lab-plugins\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[posttrain.test_widgets]\nmy-widget = lazy_mod_ep:Widget\n")
    _module(tmp_path, monkeypatch, "lazy_mod_ep", "class Widget:\n    pass\n")
    reg: Registry = Registry("widget", group="posttrain.test_widgets")
    assert "my-widget" in reg and reg.is_lazy("my-widget")
    assert "lazy_mod_ep" not in sys.modules
    assert reg.get("my-widget").__name__ == "Widget"


def test_core_hook_registries_read_their_entry_point_group(tmp_path, monkeypatch):
    from posttrain.hooks import SAMPLERS, UniformSampler

    dist = tmp_path / "lab_sampler-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: lab-sampler\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[posttrain.samplers]\nlab-uniform = lazy_mod_s:LabSampler\n")
    _module(
        tmp_path,
        monkeypatch,
        "lazy_mod_s",
        "from posttrain.hooks import UniformSampler\nclass LabSampler(UniformSampler):\n    pass\n",
    )
    SAMPLERS.reload_entry_points()
    assert "lab-uniform" in SAMPLERS.names()
    assert issubclass(SAMPLERS.get("lab-uniform"), UniformSampler)


def test_snapshot_restore_drops_later_registrations_but_keeps_resolved_lazy():
    reg: Registry = Registry("widget")
    reg.register_lazy("os-path", "os:path")
    snap = reg.snapshot()
    reg.register("temp")(1)
    reg.get("os-path")
    reg.restore(snap)
    assert "temp" not in reg and "os-path" in reg and not reg.is_lazy("os-path")
