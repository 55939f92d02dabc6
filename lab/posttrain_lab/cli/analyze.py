"""`posttrain analyze consistency | intervention | forgetting` (heavy imports inside the commands)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from posttrain.cli.app import HELP, app, fail

analyze_app = typer.Typer(
    help="What instruction tuning does to a model's knowledge: consistency, intervention groups, forgetting.",
    no_args_is_help=True,
    context_settings=HELP,
)
app.add_typer(analyze_app, name="analyze")

_OVERRIDES = typer.Argument(None, help="key=value overrides, e.g. synthetic={} ift.steps=100 out_dir=runs/x")
_CONFIG = typer.Option(
    None, "--config", "-c", help="YAML config (see lab/posttrain_lab/studies/analysis/*.yaml)"
)
_JSON = typer.Option(False, "--json", help="print the results as JSON instead of a table")


def _run(model_cls: Any, runner: Any, config: Path | None, overrides: list[str] | None) -> dict[str, Any]:
    from posttrain.utils.config import ConfigError, build_config

    try:
        cfg = build_config(model_cls, config, overrides or [])
    except ConfigError as e:
        fail(str(e))
    try:
        return runner(cfg)
    except (ValueError, FileNotFoundError) as e:
        fail(str(e))
    raise AssertionError("unreachable")


def _show(title: str, res: dict[str, Any], as_json: bool, extra: str = "") -> None:
    import sys

    from rich.console import Console

    from posttrain.utils.tables import print_table

    if as_json:
        slim = {k: v for k, v in res.items() if not k.startswith("probes_")}
        typer.echo(json.dumps(slim, indent=2, default=str))
        return
    console = None if sys.stdout.isatty() else Console(width=200)  # a pipe or file: no truncated columns
    print_table(title, res["table"]["columns"], res["table"]["rows"], floatfmt=".2f", console=console)
    if extra:
        typer.echo(extra)
    typer.echo("wrote " + ", ".join(res["files"].values()) + f" ({res['wall_s']:.0f} s)")


@analyze_app.command(context_settings={"allow_extra_args": True})
def consistency(
    overrides: list[str] | None = _OVERRIDES, config: Path | None = _CONFIG, as_json: bool = _JSON
) -> None:
    """Base vs tuned model on MCQ probes: accuracies, rank consistency (x100), KL, cosine."""
    from posttrain_lab.studies.analysis.runner import ConsistencyConfig, run_consistency

    res = _run(ConsistencyConfig, run_consistency, config, overrides)
    _show("knowledge consistency", res, as_json)


@analyze_app.command(context_settings={"allow_extra_args": True})
def intervention(
    overrides: list[str] | None = _OVERRIDES, config: Path | None = _CONFIG, as_json: bool = _JSON
) -> None:
    """Knowledge-intervention groups: IFT per group, tuned accuracy vs consistency, partial correlation."""
    from posttrain_lab.studies.analysis.runner import InterventionConfig, run_intervention

    res = _run(InterventionConfig, run_intervention, config, overrides)
    pc = res.get("partial_correlation")
    extra = f"base accuracy {res['base_accuracy']:.2f}"
    if pc:
        extra += (
            f"; partial correlation rho={pc['rho']:.3f} p={pc['p_value']:.3g} over {pc['n_groups']} groups"
        )
    _show("knowledge-intervention groups", res, as_json, extra)


@analyze_app.command(context_settings={"allow_extra_args": True})
def forgetting(
    overrides: list[str] | None = _OVERRIDES, config: Path | None = _CONFIG, as_json: bool = _JSON
) -> None:
    """Restoration protocol (proposed design): forgetting and recovery gaps along an IFT run."""
    from posttrain_lab.studies.analysis.runner import ForgettingConfig, run_forgetting

    res = _run(ForgettingConfig, run_forgetting, config, overrides)
    t = res["transition_step"]
    extra = (
        f"score(M_0) {res['score_base']:.2f}; control {', '.join(f'{c:.2f}' for c in res['control_scores'])}; "
        f"epsilon {res['epsilon']:.2f}; transition step: {t if t is not None else 'none'}"
    )
    _show("pseudo vs actual forgetting", res, as_json, extra)
