"""`posttrain rl | sft | eval | demo | plot` (heavy imports happen inside the commands)."""

from __future__ import annotations

import contextlib
import json
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, Optional

import typer

from posttrain.cli.app import app, fail, run_folder_lock


def _load(model_cls, config: Optional[Path], overrides: list[str]):  # noqa: UP045
    from posttrain.utils.config import ConfigError, build_config

    try:
        cfg = build_config(model_cls, config, overrides)
    except ConfigError as e:
        fail(str(e))
    _check_device(cfg.model.device)
    _check_packages(cfg)
    return cfg


def _check_packages(cfg: Any) -> None:
    """The optional packages the config needs (peft for ``model.lora``, tensorboard, wandb, Ray for
    ``rollout.max_staleness`` > 0) are installed: else one line naming the extra, before any model is
    loaded or run folder is locked."""
    from posttrain.models.lora import require_peft
    from posttrain.train.logger import logging_packages

    if getattr(cfg.model, "lora", None) is not None:
        require_peft()
    if getattr(getattr(cfg, "rollout", None), "max_staleness", 0):
        from posttrain.train.async_rollout import require_ray

        require_ray()
    log = getattr(cfg, "logging", None)
    if log is not None:
        logging_packages(tensorboard=log.tensorboard, wandb=log.wandb)


def _check_device(device: str) -> None:
    """model.device must exist on this machine (a GPU config validates anywhere; it runs only here)."""
    from posttrain.models.loading import check_device

    try:
        check_device(device)
    except ValueError as e:
        fail(f"model.device: {e}")


_RESUME = typer.Option(
    False, "--resume", help="continue from the last checkpoint in out_dir (its checkpoints/latest)"
)
_OVERWRITE = typer.Option(
    False, "--overwrite", help="out_dir holds a previous run: delete its run files and start again"
)
_ALLOW_CHANGE = typer.Option(
    False,
    "--allow-config-change",
    help="with --resume: accept config changes that alter the run (model, task, objective, lr, ...)",
)


def _check_run_dir(cfg: Any, *, resume: bool, overwrite: bool, allow_config_change: bool) -> None:
    """Run-folder rules before any model is loaded (a refusal costs nothing): what a resume would
    load and change, or a fresh run refused in a folder holding a previous one."""
    from posttrain.train.run_dir import check_resume, prepare_run_dir

    try:
        if resume:
            info = check_resume(
                cfg.out_dir,
                cfg.model_dump(mode="json"),
                allow_config_change=allow_config_change,
                defaults=type(cfg)().model_dump(mode="json"),
            )
            typer.echo(info.describe(cfg.steps), err=True)
        if not overwrite or resume:  # --overwrite deletes only once the model has loaded (in train)
            prepare_run_dir(cfg.out_dir, overwrite=overwrite, resume=resume)
    except ValueError as e:
        fail(str(e))


class Terminated(KeyboardInterrupt):
    """SIGTERM (what Slurm, Kubernetes and ``kill`` send) while training: handled as Ctrl-C is."""


#: Set by SIGTERM inside :func:`_sigterm_as_interrupt`: a library that catches the ``Terminated`` and
#: raises a plain ``KeyboardInterrupt`` of its own (Ray's ``ray.get`` does) still reports SIGTERM.
_SIGTERM_RECEIVED = threading.Event()


def terminated(exc: BaseException) -> bool:
    """Whether the interrupt ``exc`` came from SIGTERM (not Ctrl-C), also when a library re-raised it."""
    return isinstance(exc, Terminated) or _SIGTERM_RECEIVED.is_set()


@contextlib.contextmanager
def _sigterm_as_interrupt():
    """While training, SIGTERM raises :class:`Terminated` in the main thread (a ``KeyboardInterrupt``),
    so a scheduler's stop prints where the run stopped and how to resume instead of dying silently;
    the previous handler is restored afterwards. (Signals reach only the main thread.)"""
    import signal

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raise_terminated(signum: int, frame: Any) -> None:
        _SIGTERM_RECEIVED.set()
        raise Terminated

    _SIGTERM_RECEIVED.clear()
    previous = signal.signal(signal.SIGTERM, raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _interrupted(
    command: str,
    cfg: Any,
    step: int,
    config: Path | None,
    overrides: list[str],
    exc: BaseException | None = None,
) -> NoReturn:
    """Ctrl-C or SIGTERM: say where training stopped, the last checkpoint and the exact command to
    resume; exit 130 for Ctrl-C, 143 (128 + SIGTERM) for SIGTERM, as a shell reports them."""
    from posttrain.train.run_dir import interrupted_message, resume_command

    cmd = resume_command(command, config, overrides)
    msg = interrupted_message(cfg.out_dir, step, cfg.steps, resume_command=cmd)
    by_sigterm = terminated(exc) if exc is not None else False
    if by_sigterm:
        msg = f"SIGTERM received: {msg}"
    typer.secho(msg, fg=typer.colors.YELLOW, err=True)
    raise typer.Exit(code=143 if by_sigterm else 130)


def _eval_interrupted(exc: BaseException, out: Path | None) -> NoReturn:
    """Ctrl-C or SIGTERM during ``posttrain eval``: nothing was written (an evaluation does not resume:
    the same command starts it again); exit 130 / 143 as for training."""
    by_sigterm = terminated(exc)
    written = f"{out} was not written" if out is not None else "no result"
    msg = f"evaluation interrupted; {written} (run the same command again to evaluate)"
    typer.secho(f"SIGTERM received: {msg}" if by_sigterm else msg, fg=typer.colors.YELLOW, err=True)
    raise typer.Exit(code=143 if by_sigterm else 130)


def _write_failed(
    command: str, cfg: Any, config: Path | None, overrides: list[str], e: Exception
) -> NoReturn:
    """A run file or checkpoint that could not be written (disk full, read-only): its one-line message,
    with the exact command that continues from the last good checkpoint when there is one."""
    from posttrain.train.checkpoint import last_good_checkpoint
    from posttrain.train.run_dir import resume_command

    msg = str(e)
    if last_good_checkpoint(Path(cfg.out_dir) / "checkpoints") is not None:
        msg += f" ({resume_command(command, config, overrides)})"
    fail(msg)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": False})
def rl(
    overrides: list[str] | None = typer.Argument(
        None, help="key=value overrides, e.g. steps=50 objective.name=dgpo"
    ),
    config: Path | None = typer.Option(
        None,
        "--config",
        "-c",
        help="YAML config (src/posttrain/configs/ or a recipe's folder)",
    ),
    resume: bool = _RESUME,
    overwrite: bool = _OVERWRITE,
    allow_config_change: bool = _ALLOW_CHANGE,
    progress: Optional[bool] = typer.Option(None, "--progress/--no-progress"),  # noqa: UP045
) -> None:
    """GRPO-family RL: rollout -> reward -> advantage -> policy update, with eval and checkpoints."""
    from posttrain.rewards.failures import RewardFailureError
    from posttrain.train.checkpoint import CheckpointError, CheckpointWriteError, RunWriteError
    from posttrain.train.config import RLConfig
    from posttrain.train.run_dir import RunDirError

    cfg = _load(RLConfig, config, overrides or [])
    with run_folder_lock(cfg):
        _check_run_dir(cfg, resume=resume, overwrite=overwrite, allow_config_change=allow_config_change)
        from posttrain.train.rl import RLTrainer

        try:
            trainer = RLTrainer(cfg, resume=resume)
        except (ValueError, FileNotFoundError) as e:
            fail(str(e))
        with trainer:
            try:
                with _sigterm_as_interrupt():
                    summary = trainer.train(
                        progress=progress, overwrite=overwrite, allow_config_change=allow_config_change
                    )
            except KeyboardInterrupt as e:
                _interrupted("posttrain rl", cfg, trainer.step_idx, config, overrides or [], e)
            except (CheckpointWriteError, RunWriteError) as e:
                _write_failed("posttrain rl", cfg, config, overrides or [], e)
            except (RunDirError, CheckpointError, RewardFailureError) as e:
                fail(str(e))
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


def run_training_command(
    command: str,
    cfg: Any,
    make_trainer: Callable[[], Any],
    *,
    config: Path | None,
    overrides: list[str],
    resume: bool,
    overwrite: bool,
    allow_config_change: bool,
) -> dict[str, Any]:
    """Check and lock ``cfg.out_dir`` (when ``cfg.save``), build the trainer with ``make_trainer()``,
    train it; return the run summary. Bad input ends the command with ``error: ...`` (exit 2); an
    interrupt prints where it stopped and the exact resume command (exit 130 / 143)."""
    from posttrain.train.checkpoint import CheckpointError, CheckpointWriteError, RunWriteError
    from posttrain.train.run_dir import RunDirError

    with run_folder_lock(cfg) if cfg.save else contextlib.nullcontext():
        if cfg.save:
            _check_run_dir(cfg, resume=resume, overwrite=overwrite, allow_config_change=allow_config_change)
        try:
            trainer = make_trainer()
        except (ValueError, FileNotFoundError) as e:
            fail(str(e))
        with trainer:
            try:
                with _sigterm_as_interrupt():
                    return trainer.train(overwrite=overwrite, allow_config_change=allow_config_change)
            except KeyboardInterrupt as e:
                _interrupted(command, cfg, trainer.step_idx, config, overrides, e)
            except (CheckpointWriteError, RunWriteError) as e:
                _write_failed(command, cfg, config, overrides, e)
            except (RunDirError, CheckpointError, ValueError, FileNotFoundError) as e:
                fail(str(e))


@app.command()
def sft(
    overrides: list[str] | None = typer.Argument(
        None, help="key=value overrides, e.g. steps=100 data=train.jsonl"
    ),
    config: Optional[Path] = typer.Option(None, "--config", "-c"),  # noqa: UP045
    resume: bool = _RESUME,
    overwrite: bool = _OVERWRITE,
    allow_config_change: bool = _ALLOW_CHANGE,
    progress: Optional[bool] = typer.Option(None, "--progress/--no-progress"),  # noqa: UP045
) -> None:
    """Supervised fine-tuning on target tokens: task reference completions or a JSONL file of
    prompt/completion, text or chat (messages, loss on assistant turns) rows; see docs/sft.md."""
    from posttrain.train.sft import SFTConfig, SFTTrainer

    cfg = _load(SFTConfig, config, overrides or [])
    if progress is not None:
        cfg.progress = progress
    summary = run_training_command(
        "posttrain sft",
        cfg,
        lambda: SFTTrainer(cfg, resume=resume),
        config=config,
        overrides=overrides or [],
        resume=resume,
        overwrite=overwrite,
        allow_config_change=allow_config_change,
    )
    typer.echo(
        json.dumps({k: v for k, v in summary.items() if k != "last"} | {"loss": summary["last"].get("loss")})
    )


def _positive(option: str):
    def check(value: float | None) -> float | None:
        if value is not None and not value > 0:
            raise typer.BadParameter(f"{value} is not > 0", param_hint=f"'{option}'")
        return value

    return check


def _out_problem(out: Path) -> str | None:
    """Why the result JSON could not be written to ``out`` (None when it can), found before the
    evaluation runs so an unwritable ``--out`` does not cost a finished evaluation. Probes the nearest
    existing folder on the way with a temporary file (what the atomic write does), creating nothing."""
    if out.is_dir():
        return f"--out {out} is a directory; give a file path such as {out / 'eval.json'}"
    folder = out.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        return f"--out {out}: {folder} is a file, not a folder"
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        return f"--out {out}: cannot write in {folder} ({e.strerror or e})"
    return None


def _write_out(out: Path, res: dict[str, Any]) -> None:
    """Write the result JSON to ``out``; when that fails after all (disk full, the folder changed during
    the evaluation), print the whole result on stdout first, then the error: the result is not lost."""
    from posttrain.utils.io import atomic_write_json

    try:
        atomic_write_json(out, res)
    except OSError as e:
        typer.echo(json.dumps(res, default=str))
        fail(f"could not write --out {out} ({e.strerror or e}); the result is the JSON line above")


def _options_over_the_config_file(
    options: dict[str, Any], config: Path | None, overrides: list[str]
) -> list[str]:
    """``overrides`` with each option given (``{"eval.n": 4}`` for ``--n 4``) whose key the ``--config``
    file sets appended as ``key=value``: an option given explicitly is the user's latest word and wins
    over the file's value. An option whose key a ``key=value`` override on the same command line also
    sets is not appended, so a disagreement between the two is refused (by ``evaluate_cli_settings``)."""
    from posttrain.train.run_dir import flatten
    from posttrain.utils.config import ConfigError, load_yaml, parse_override

    try:
        in_file = flatten(load_yaml(config)) if config is not None else {}
        on_line = [parse_override(ov)[0] for ov in overrides]
    except ConfigError as e:
        fail(str(e))
    out = list(overrides)
    for key, value in options.items():
        if value is None or key not in in_file or any(key == k or key.startswith(k + ".") for k in on_line):
            continue
        out.append(f"{key}={json.dumps(value)}")
    return out


@app.command("eval", context_settings={"allow_extra_args": True, "ignore_unknown_options": False})
def eval_cmd(
    overrides: list[str] | None = typer.Argument(
        None,
        help="key=value overrides of the RL config it evaluates with, e.g. rollout.engine.name=hf "
        "reward.source.name=my_lab.judges:Judge",
    ),
    model: str = typer.Option(
        ..., "--model", "-m", help="preset name, model directory, or RL/SFT run directory"
    ),
    config: Optional[Path] = typer.Option(  # noqa: UP045
        None, "--config", "-c", help="RL config YAML (task, reward, rollout.engine/runner, reward.source)"
    ),
    task: Optional[str] = typer.Option(None, "--task", help="task (default: the run's, else arithmetic)"),  # noqa: UP045
    task_params: Optional[str] = typer.Option(  # noqa: UP045
        None, "--task-params", help="JSON merged into the run's task params, e.g. '{\"digits\": 1}'"
    ),
    n: Optional[int] = typer.Option(  # noqa: UP045
        None, "--n", min=1, help="held-out examples (the first n; default: eval.n if you set it, else 100)"
    ),
    k: Optional[int] = typer.Option(None, "--k", min=1, help="pass@k (needs --samples >= k)"),  # noqa: UP045
    samples: Optional[int] = typer.Option(None, "--samples", min=1),  # noqa: UP045
    temperature: Optional[float] = typer.Option(  # noqa: UP045
        None, "--temperature", callback=_positive("--temperature"), help="sampling temperature of pass@k"
    ),
    max_new_tokens: Optional[int] = typer.Option(  # noqa: UP045
        None,
        "--max-new-tokens",
        min=1,
        help="default: the run's rollout.max_new_tokens; for another task, its own length (ifbench: 256), else 16",
    ),
    out: Optional[Path] = typer.Option(None, "--out", help="write the result JSON here"),  # noqa: UP045
    harness: Optional[str] = typer.Option(  # noqa: UP045
        None, "--harness", help="lm-eval: score lm-evaluation-harness --tasks instead (docs/lm-eval.md)"
    ),
    tasks: Optional[str] = typer.Option(  # noqa: UP045
        None, "--tasks", help="with --harness: lm-eval tasks, comma-separated (--n: documents per task)"
    ),
    include_path: Optional[Path] = typer.Option(  # noqa: UP045
        None, "--include-path", help="with --harness: a folder of more lm-eval task YAMLs"
    ),
) -> None:
    """Greedy pass@1 (and sampled pass@k) on a task's held-out split.

    A run directory is evaluated with the run's own settings (task and params, prompt template,
    reward, max_new_tokens, engine, runner, reward source); --config, key=value overrides and the
    options listed below override them, in that order. An option you give wins over the --config
    file's value of its key (--n 4 over eval.n: 100); an option that contradicts a key=value override
    on the same command line, or --task another task.name, is an error. Another task drops only the
    run's task params and reward."""
    from posttrain.train.evaluate import (
        evaluate_cli_settings,
        evaluate_run,
        locate_model,
        reward_failure_warning,
        truncation_warning,
    )
    from posttrain.utils.config import ConfigError

    problem = _out_problem(out) if out is not None else None
    if problem:
        fail(problem)
    if harness is not None or tasks is not None:
        from posttrain.cli.harness import harness_eval

        own = {"--task": task, "--task-params": task_params, "--config": config, "key=value": overrides}
        own |= {
            "--k": k,
            "--samples": samples,
            "--temperature": temperature,
            "--max-new-tokens": max_new_tokens,
        }
        harness_eval(
            model,
            harness or "lm-eval",
            tasks,
            limit=n,
            include_path=include_path,
            out=out,
            conflicting=own,
            write_out=_write_out,
        )
        return
    flags: dict[str, object] = {}
    if task_params is not None:
        try:
            params = json.loads(task_params)
        except json.JSONDecodeError as e:
            fail(f"--task-params: invalid JSON ({e.msg}); expected an object like '{{\"digits\": 1}}'")
        if not isinstance(params, dict):
            fail(
                f"--task-params: expected a JSON object like '{{\"digits\": 1}}', got {type(params).__name__}"
            )
        flags["task_params"] = params
    for key, value in (
        ("task", task),
        ("k", k),
        ("samples", samples),
        ("temperature", temperature),
        ("max_new_tokens", max_new_tokens),
    ):
        if value is not None:
            flags[key] = value
    try:
        loc = locate_model(model)
    except (FileNotFoundError, ValueError) as e:
        fail(str(e))
    keys = {"eval.n": n, "eval.k": k, "eval.samples": samples, "eval.temperature": temperature}
    keys["rollout.max_new_tokens"] = max_new_tokens
    keys |= {f"task.params.{name}": v for name, v in (flags.get("task_params") or {}).items()}
    overrides = _options_over_the_config_file(keys, config, overrides or [])
    try:
        cfg = evaluate_cli_settings(loc, config, overrides, n=n, **flags)
    except (ConfigError, ValueError) as e:
        fail(str(e))
    try:
        with _sigterm_as_interrupt():
            res = evaluate_run(loc, cfg)
    except (ValueError, FileNotFoundError) as e:
        fail(str(e))
    except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM: the reward workers are closed on the way out
        _eval_interrupted(e, out)
    failed = reward_failure_warning(res)
    if failed:
        typer.secho(f"warning: {failed}", fg=typer.colors.YELLOW, err=True)
    warning = truncation_warning(res, option="--max-new-tokens")
    if warning:
        typer.secho(f"warning: {warning}", fg=typer.colors.YELLOW, err=True)
    if res["n"] < res["n_requested"]:
        typer.secho(
            f"note: task {cfg.task.name!r} has only {res['n']} held-out examples; evaluated all {res['n']}",
            err=True,
        )
    if out is not None:
        _write_out(out, res)
    if isinstance(res.get("report"), dict) and res["report"].get("table"):
        from posttrain.utils.tables import print_table

        table = res["report"]["table"]
        print_table(table["title"], table["columns"], table["rows"])
    shown = {k_: v for k_, v in res.items() if k_ != "samples"}
    if isinstance(shown.get("report"), dict):  # per-prompt verdicts and the table: in --out only
        shown["report"] = {k_: v for k_, v in shown["report"].items() if k_ not in ("items", "table")}
    typer.echo(json.dumps(shown))


@app.command()
def plot(
    run_dir: Path = typer.Argument(..., help="a run directory with metrics.jsonl"),
    out: Optional[Path] = typer.Option(None, "--out", help="PNG path (default RUN_DIR/curves.png)"),  # noqa: UP045
) -> None:
    """Learning curves (PNG) from a run's metrics.jsonl."""
    from posttrain.train.plot import plot_run

    try:
        path = plot_run(run_dir, out)
    except (OSError, ValueError) as e:  # no metrics, nothing to plot, an unwritable --out
        fail(str(e))
    typer.echo(str(path))
