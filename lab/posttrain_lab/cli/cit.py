"""`posttrain cit run | report`: continual instruction tuning over a task stream (docs/cit.md)."""

from __future__ import annotations

from pathlib import Path

import typer

from posttrain.cli.app import HELP, app, fail

cit_app = typer.Typer(
    help="Continual instruction tuning: task streams, forgetting metrics, replay baselines, KPIG-style.",
    no_args_is_help=True,
    context_settings=HELP,
)
app.add_typer(cit_app, name="cit")


def _print(out_dir: Path) -> None:
    from posttrain.utils.tables import print_table
    from posttrain_lab.studies.cit.report import COLUMNS, table_rows, write_report

    agg = write_report(out_dir)
    print_table(f"CIT {out_dir}", COLUMNS, table_rows(agg))
    typer.echo(f"wrote {out_dir / 'report.md'}, report.json, report.png")


@cit_app.command("run")
def run_cmd(
    overrides: list[str] | None = typer.Argument(
        None, help="key=value overrides, e.g. sft.steps=100 seeds=[0,1]"
    ),
    config: Path | None = typer.Option(None, "--config", "-c", help="CIT config (studies/cit/*.yaml)"),
) -> None:
    """Train the stream's tasks in order for every method and seed, evaluate all tasks after each stage
    (a rerun resumes after the last finished stage), then write the report."""
    from posttrain.utils.config import ConfigError, build_config
    from posttrain_lab.studies.cit.data import CITDataError
    from posttrain_lab.studies.cit.runner import CITConfig, run_cit

    try:
        cfg = build_config(CITConfig, config, list(overrides or []))
    except ConfigError as e:
        fail(str(e))

    def progress(method: str, seed: int, stage: int, rec: dict) -> None:
        accs = " ".join(f"{t}={100 * v['acc']:.0f}" for t, v in rec["eval"].items())
        typer.echo(f"[{method} seed{seed}] stage {stage} ({rec['wall_s']:.0f}s): {accs}", err=True)

    try:
        run_cit(cfg, progress)
    except CITDataError as e:
        fail(str(e))
    _print(Path(cfg.out_dir))


@cit_app.command("report")
def report_cmd(out_dir: Path = typer.Argument(..., help="the out_dir of `posttrain cit run`")) -> None:
    """Table, report.json, report.md and report.png (accuracy heatmaps, forgetting curves) of a run."""
    try:
        _print(out_dir)
    except FileNotFoundError as e:
        fail(str(e))
