"""`posttrain rl | sft | eval | demo | plot` (heavy imports happen inside the commands)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from posttrain.cli.app import app


def _fail(msg: str) -> None:
    typer.secho(f"error: {msg}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code=2)


def _load(model_cls, config: Optional[Path], overrides: list[str]):  # noqa: UP045
    from posttrain.utils.config import ConfigError, build_config

    try:
        return build_config(model_cls, config, overrides)
    except ConfigError as e:
        _fail(str(e))


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": False})
def rl(
    overrides: list[str] | None = typer.Argument(
        None, help="key=value overrides, e.g. steps=50 objective.name=dgpo"
    ),
    config: Path | None = typer.Option(
        None, "--config", "-c", help="YAML config (see src/posttrain/configs/)"
    ),
    resume: bool = typer.Option(False, "--resume", help="continue from <out_dir>/checkpoints/latest"),
    progress: Optional[bool] = typer.Option(None, "--progress/--no-progress"),  # noqa: UP045
) -> None:
    """GRPO-family RL: rollout -> reward -> advantage -> policy update, with eval and checkpoints."""
    from posttrain.train.config import RLConfig

    cfg = _load(RLConfig, config, overrides or [])
    from posttrain.train.rl import RLTrainer

    try:
        trainer = RLTrainer(cfg, resume=resume)
    except (ValueError, FileNotFoundError) as e:
        _fail(str(e))
    with trainer:
        summary = trainer.train(progress=progress)
    last = summary.get("last") or {}
    typer.echo(
        json.dumps(
            {
                "steps": summary["steps"],
                "wall_s": round(summary["wall_s"], 2),
                "reward_mean": last.get("reward_mean"),
                "eval_start": summary.get("eval_start", {}).get("accuracy"),
                "eval_end": summary.get("eval_end", {}).get("accuracy"),
                "run_dir": str(cfg.out_dir),
            }
        )
    )


@app.command()
def sft(
    overrides: list[str] | None = typer.Argument(
        None, help="key=value overrides, e.g. steps=100 data=train.jsonl"
    ),
    config: Optional[Path] = typer.Option(None, "--config", "-c"),  # noqa: UP045
    resume: bool = typer.Option(False, "--resume", help="continue from <out_dir>/checkpoints/latest"),
    progress: Optional[bool] = typer.Option(None, "--progress/--no-progress"),  # noqa: UP045
) -> None:
    """Supervised fine-tuning on target tokens: task reference completions or a JSONL file of
    prompt/completion, text or chat (messages, loss on assistant turns) rows; see docs/sft.md."""
    from posttrain.train.sft import SFTConfig, SFTDataError, SFTTrainer

    cfg = _load(SFTConfig, config, overrides or [])
    if progress is not None:
        cfg.progress = progress
    try:
        summary = SFTTrainer(cfg, resume=resume).train()
    except (SFTDataError, ValueError, FileNotFoundError) as e:
        _fail(str(e))
    typer.echo(
        json.dumps({k: v for k, v in summary.items() if k != "last"} | {"loss": summary["last"].get("loss")})
    )


@app.command("eval")
def eval_cmd(
    model: str = typer.Option(
        ..., "--model", "-m", help="preset name, model directory, or RL/SFT run directory"
    ),
    task: str = typer.Option("arithmetic", "--task"),
    task_params: str = typer.Option("{}", "--task-params", help="JSON, e.g. '{\"digits\": 1}'"),
    n: int = typer.Option(100, "--n", help="held-out examples"),
    k: int = typer.Option(1, "--k", help="pass@k (needs --samples >= k)"),
    samples: int = typer.Option(1, "--samples"),
    temperature: float = typer.Option(1.0, "--temperature"),
    max_new_tokens: int = typer.Option(16, "--max-new-tokens"),
    out: Optional[Path] = typer.Option(None, "--out", help="write the result JSON here"),  # noqa: UP045
) -> None:
    """Greedy pass@1 (and sampled pass@k) on a task's held-out split."""
    from posttrain.models import load_model_and_tokenizer
    from posttrain.rewards import get_reward
    from posttrain.rollout import FunctionRewardSource
    from posttrain.tasks import get_task
    from posttrain.train.checkpoint import resolve_checkpoint
    from posttrain.train.evaluate import evaluate
    from posttrain.utils.io import atomic_write_json

    try:
        params = json.loads(task_params)
    except json.JSONDecodeError as e:
        _fail(f"--task-params: invalid JSON ({e.msg}); expected an object like '{{\"digits\": 1}}'")
    if not isinstance(params, dict):
        _fail(f"--task-params: expected a JSON object like '{{\"digits\": 1}}', got {type(params).__name__}")
    if k > samples:
        _fail(f"--k {k} needs --samples >= {k}")
    spec = model
    p = Path(model)
    if p.is_dir() and not (p / "config.json").exists():
        if (p / "model" / "config.json").exists():  # SFT run dir
            spec = str(p / "model")
        else:
            try:
                spec = str(resolve_checkpoint(p) / "model")
            except FileNotFoundError as e:
                _fail(str(e))
    try:
        t = get_task(task, **params)
        m, tok = load_model_and_tokenizer(spec, device="cpu")
    except ValueError as e:
        _fail(str(e))
    src = FunctionRewardSource(get_reward(t.default_reward), num_workers=0)
    try:
        res = evaluate(
            m,
            tok,
            t.split("heldout")[:n],
            src,
            max_new_tokens=max_new_tokens,
            k=k,
            samples=samples,
            temperature=temperature,
        )
    finally:
        src.close()
    if out is not None:
        atomic_write_json(out, res)
    typer.echo(json.dumps({k_: v for k_, v in res.items() if k_ != "samples"}))


@app.command()
def demo(
    overrides: list[str] | None = typer.Argument(
        None, help="key=value overrides of the RL config (configs/demo.yaml)"
    ),
    out: Path = typer.Option(Path("runs/demo"), "--out", help="run directory"),
    objective: str = typer.Option("dgpo", "--objective", help="policy loss for the RL stage"),
    quick: bool = typer.Option(False, "--quick", help="a few steps only (smoke test)"),
    sft_steps: Optional[int] = typer.Option(None, "--sft-steps"),  # noqa: UP045
    rl_steps: Optional[int] = typer.Option(None, "--rl-steps"),  # noqa: UP045
    seed: int = typer.Option(0, "--seed"),
    progress: Optional[bool] = typer.Option(None, "--progress/--no-progress"),  # noqa: UP045
) -> None:
    """Tiny model: short SFT warm start, RL (DGPO by default), held-out accuracy before/after."""
    from posttrain.algos import list_policy_losses

    if objective not in list_policy_losses(include_aliases=True):
        _fail(f"--objective: unknown value {objective!r}; accepted: {', '.join(list_policy_losses())}")
    from posttrain.train.demo import run_demo
    from posttrain.utils.config import ConfigError

    try:
        run_demo(
            out,
            objective=objective,
            quick=quick,
            sft_steps=sft_steps,
            rl_steps=rl_steps,
            seed=seed,
            progress=progress,
            overrides=overrides or [],
        )
    except ConfigError as e:
        _fail(str(e))


@app.command()
def plot(
    run_dir: Path = typer.Argument(..., help="a run directory with metrics.jsonl"),
    out: Optional[Path] = typer.Option(None, "--out", help="PNG path (default RUN_DIR/curves.png)"),  # noqa: UP045
) -> None:
    """Learning curves (PNG) from a run's metrics.jsonl."""
    from posttrain.train.plot import plot_run

    try:
        path = plot_run(run_dir, out)
    except (FileNotFoundError, ValueError) as e:
        _fail(str(e))
    typer.echo(str(path))
