"""The SILO-BENCH report (posttrain_lab.benchmarks.silo.report): every failed case lands in a failure
column (one without a mode is "other failure"), and the heatmap is saved with its colorbar label
inside the PNG. (Tables keep their headers whole: tests/utils/test_tables.py.)"""

from __future__ import annotations

from posttrain_lab.benchmarks.silo.report import failure_summary, plot_heatmap


def _row(success, **modes):
    base = {"agent": "a", "success": success, "premature_submission": False, "consensus_failure": False}
    return {**base, "computation_error": False, **modes}


def test_a_failed_case_without_a_mode_is_counted_as_other_failure():
    rows = [_row(True), _row(False, consensus_failure=True), _row(False), _row(False)]
    d = failure_summary(rows)["a"]
    assert d["other_failure"] == 2 and d["consensus_failure"] == 1
    assert d["success"] + d["consensus_failure"] + d["other_failure"] == d["cases"]
    assert d["share"]["other_failure"] == 0.5


def test_heatmap_is_saved_with_its_colorbar_label(tmp_path, monkeypatch):
    import matplotlib.figure

    seen = {}
    real = matplotlib.figure.Figure.savefig

    def spy(self, *a, **k):
        seen.update(k)
        return real(self, *a, **k)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", spy)
    rows = [{"agent": "a", "task_id": "I-01", "protocol": "p2p", "success": True}]
    plot_heatmap(rows, tmp_path / "h.png")
    assert seen.get("bbox_inches") == "tight" and (tmp_path / "h.png").stat().st_size > 0
