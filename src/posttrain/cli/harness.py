"""`posttrain eval --harness lm-eval --tasks ...`: lm-evaluation-harness scores of a posttrain model,
offline (posttrain.integrations.lm_eval; docs/lm-eval.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from posttrain.cli.app import fail

HARNESSES = ("lm-eval",)


def harness_eval(
    model: str,
    harness: str,
    tasks: str | None,
    *,
    limit: int | None,
    include_path: Path | None,
    out: Path | None,
    conflicting: dict[str, Any],
    write_out: Any,
) -> None:
    """Run ``tasks`` (comma-separated lm-eval task names) on ``model`` and print ``{task: metrics}``
    as one JSON line (``--out``: lm-eval's metrics per task plus what was run)."""
    if harness not in HARNESSES:
        fail(f"--harness {harness!r}: the harness posttrain wraps is {', '.join(HARNESSES)}")
    given = [flag for flag, value in conflicting.items() if value]
    if given:
        fail(
            f"--harness scores lm-eval tasks (--tasks); {', '.join(given)} belong to posttrain's own "
            "evaluation and are not used by it: drop them"
        )
    names = [t.strip() for t in (tasks or "").split(",") if t.strip()]
    if not names:
        fail("--harness lm-eval needs --tasks, e.g. --tasks posttrain_arithmetic_mc,posttrain_arithmetic")
    try:
        from posttrain.integrations import lm_eval as bridge
    except ImportError as e:
        fail(f"{e}")
    try:
        scores = bridge.run_harness(model, names, limit=limit, include_path=include_path)
    except (bridge.HarnessError, ValueError, FileNotFoundError) as e:
        fail(str(e))
    res = {"harness": harness, "model": model, "tasks": names, "limit": limit, "results": scores}
    if out is not None:
        write_out(out, res)
    typer.echo(json.dumps(res, default=str))
