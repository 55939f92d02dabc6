"""Every command's --help reads whole in an 80-column terminal: no option's help is cut with "…"
(issue 58 item 12: `rl`/`sft --help` cut `--resume`'s at `<out_dir>/checkpoints/l…`), and `eval
--help` points at its options where they are."""

from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

from posttrain.cli import app


def _commands(cmd, path=()):
    """The library's own commands (a plug-in's come from its own package, tested there)."""
    subs = getattr(cmd, "commands", None)
    if subs is None:
        if cmd.callback.__module__.startswith("posttrain."):
            yield list(path)
        return
    for name, sub in subs.items():
        yield from _commands(sub, (*path, name))


COMMANDS = list(_commands(typer.main.get_command(app)))


@pytest.mark.parametrize("path", COMMANDS, ids=[" ".join(p) for p in COMMANDS])
def test_help_fits_80_columns_without_cutting_words(path):
    res = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "80"}, terminal_width=80)
    assert res.exit_code == 0, res.output
    cut = [line for line in res.output.splitlines() if "\u2026" in line]
    assert not cut, "\n".join(cut)


def test_the_commands_that_resume_are_among_those_checked():
    assert ["rl"] in COMMANDS and ["sft"] in COMMANDS


def test_eval_help_points_below_at_its_options():
    text = " ".join(CliRunner().invoke(app, ["eval", "--help"], terminal_width=80).output.split())
    assert "options above" not in text and "the options listed below override them" in text
