"""Plain-text tables (posttrain.utils.tables): in a pipe (no terminal width) every header is printed
whole, however many columns there are, instead of being cut at 80 columns."""

from __future__ import annotations

from posttrain.utils.tables import print_table


def test_tables_in_a_pipe_keep_every_header_whole(capsys):
    cols = [
        "agent",
        "cases",
        "success",
        "premature",
        "consensus",
        "computation",
        "other failure",
        "with leader",
    ]
    cols += ["a rather long extra column header"]
    print_table("t", cols, [["scripted", 1, 1, 0, 0, 0, 0, 0, 0]])
    out = capsys.readouterr().out
    for c in cols:
        assert c in out, out
