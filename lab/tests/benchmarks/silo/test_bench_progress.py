"""`posttrain bench silo` progress counts cases and stops at 100 % (counting agents once showed
`210/60 (350%)`)."""

from __future__ import annotations

import re

from typer.testing import CliRunner

from posttrain.cli import app
from posttrain.utils.progress import progress_bar


def test_bench_silo_progress_counts_cases_not_agents():
    r = CliRunner().invoke(
        app, ["bench", "silo", "--agents", "2", "3", "--tasks", "I-01", "I-02", "--protocols", "p2p"]
    )
    assert r.exit_code == 0, r.output
    done = [(int(a), int(b)) for a, b in re.findall(r"bench silo (\d+)/(\d+)", r.output)]
    assert done and done[-1] == (4, 4)
    assert all(a <= b for a, b in done)
    assert "n=3" in r.output  # the agent count is still shown, as a metric


def test_a_metric_named_n_does_not_advance_the_bar(capsys):
    with progress_bar("x", total=2, enabled=False, log_every=1) as bar:
        bar.advance(n=50)
        bar.advance(n=50)
    assert "x 2/2 (100%) n=50" in capsys.readouterr().err
