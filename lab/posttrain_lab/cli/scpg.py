"""`posttrain scpg pretrain | finetune | eval`: DSMT pre-training and syntactically controlled
paraphrase generation (docs/scpg.md). Heavy libraries are imported inside the commands."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import typer

from posttrain.cli.app import app, fail

scpg_app = typer.Typer(
    help="DSMT syntax-oriented T5 pre-training and SCPG fine-tuning / evaluation (docs/scpg.md).",
    no_args_is_help=True,
)
app.add_typer(scpg_app, name="scpg")

_OVERRIDES = typer.Argument(None, help="key=value overrides, e.g. stage1.steps=100 model.name=t5-tiny")
_CONFIG = typer.Option(
    None, "--config", "-c", help="YAML config (lab/posttrain_lab/studies/scpg/scpg-*.yaml)"
)
_PROGRESS = typer.Option(None, "--progress/--no-progress")


def _load(model_cls: Any, config: Path | None, overrides: list[str], progress: bool | None) -> Any:
    from posttrain.models.loading import check_device
    from posttrain.utils.config import ConfigError, build_config

    try:
        cfg = build_config(model_cls, config, overrides)
        check_device(cfg.model.device)
    except (ConfigError, ValueError) as e:
        fail(str(e))
    if progress is not None:
        cfg.progress = progress
    return cfg


def _run(fn: Any, cfg: Any) -> dict[str, Any]:
    from posttrain.models.loading import ModelSpecError
    from posttrain.train.run_dir import RunDirError

    try:
        return fn(cfg)
    except (ModelSpecError, RunDirError, ValueError, FileNotFoundError) as e:
        fail(str(e))
    raise AssertionError("unreachable")


@scpg_app.command("pretrain")
def pretrain_cmd(
    overrides: Optional[list[str]] = _OVERRIDES,  # noqa: UP045
    config: Optional[Path] = _CONFIG,  # noqa: UP045
    progress: Optional[bool] = _PROGRESS,  # noqa: UP045
) -> None:
    """Stage 1 (structure tasks on label-randomised trees) and stage 2 (syntax multi-task) -> <out_dir>/model."""
    from posttrain.utils.tables import print_table
    from posttrain_lab.studies.scpg.run import PretrainConfig, pretrain

    cfg = _load(PretrainConfig, config, overrides or [], progress)
    s = _run(pretrain, cfg)
    rows = [
        [f"stage {i}", s[f"stage{i}"].get("steps"), s[f"stage{i}"].get("loss"), s[f"stage{i}"].get("wall_s")]
        for i in (1, 2)
    ]
    print_table("DSMT pre-training", ["stage", "steps", "final loss", "wall s"], rows)
    typer.echo(json.dumps(s))


@scpg_app.command("finetune")
def finetune_cmd(
    overrides: Optional[list[str]] = _OVERRIDES,  # noqa: UP045
    config: Optional[Path] = _CONFIG,  # noqa: UP045
    progress: Optional[bool] = _PROGRESS,  # noqa: UP045
) -> None:
    """SCPG fine-tuning in one input format (format=t5_prefix|aesop|...|triplet_nooutputtree)."""
    from posttrain_lab.studies.scpg.run import FinetuneConfig, finetune

    cfg = _load(FinetuneConfig, config, overrides or [], progress)
    typer.echo(json.dumps(_run(finetune, cfg)))


@scpg_app.command("eval")
def eval_cmd(
    overrides: Optional[list[str]] = _OVERRIDES,  # noqa: UP045
    config: Optional[Path] = _CONFIG,  # noqa: UP045
    progress: Optional[bool] = _PROGRESS,  # noqa: UP045
) -> None:
    """Beam-search paraphrases; BLEU-4, TED-R/TED-E, template match, tree F1 (overall, hardest, few-shot)."""
    from posttrain.utils.tables import print_table
    from posttrain_lab.studies.scpg.run import METRIC_COLUMNS, EvalConfig, evaluate, report_rows

    cfg = _load(EvalConfig, config, overrides or [], progress)
    r = _run(evaluate, cfg)
    print_table(
        f"SCPG {r['format']} on {r['split']}", ["subset", *METRIC_COLUMNS], report_rows(r), floatfmt=".2f"
    )
    typer.echo(json.dumps({"out": r["out"], "subsets": r["subsets"], "wall_s": r["wall_s"]}))
