"""`posttrain tasks list|show` and `posttrain bench reward-pool`."""

from __future__ import annotations

import inspect

import typer

from posttrain.cli.app import app

tasks_app = typer.Typer(help="Built-in verifiable tasks and dataset loaders.", no_args_is_help=True)
app.add_typer(tasks_app, name="tasks")


def _params(items: list[str]) -> dict:
    from posttrain.utils.config import ConfigError, parse_override

    out = {}
    for it in items:
        try:
            key, value = parse_override(it)
        except ConfigError as e:
            raise typer.BadParameter(str(e)) from None
        out[key] = value
    return out


def _signature(cls: type) -> str:
    """`cls.__init__`'s parameters as `name` or `name=default`, comma-separated."""
    return ", ".join(
        p.name if p.default is p.empty else f"{p.name}={p.default!r}"
        for p in inspect.signature(cls.__init__).parameters.values()
        if p.name != "self"
    )


@tasks_app.command("list")
def tasks_list() -> None:
    """Tasks, their default reward and parameters (with defaults); then the rewards."""
    from posttrain.rewards import REWARDS, list_rewards
    from posttrain.tasks import TASKS, list_tasks
    from posttrain.utils.tables import print_table

    rows = []
    for name in list_tasks():
        cls = TASKS.get(name)
        takes_reward = "default_reward" in inspect.signature(cls.__init__).parameters
        rows.append([name, "set by params" if takes_reward else cls.default_reward, _signature(cls)])
    print_table("tasks", ["task", "default reward", "params"], rows)
    rows = [[name, _signature(REWARDS.get(name))] for name in list_rewards()]
    print_table("rewards", ["reward", "params"], rows)


@tasks_app.command("show")
def tasks_show(
    name: str = typer.Argument(..., help="Task name, e.g. arithmetic, countdown, jsonl."),
    param: list[str] = typer.Option([], "--param", "-p", help="Task parameter key=value (repeatable)."),
    split: str = typer.Option("train", help="train | heldout."),
    n: int = typer.Option(3, help="Examples to print."),
    style: str = typer.Option("short", help="Reference completion style: short | long."),
) -> None:
    """Print split sizes and a few examples with their reference completion and its reward."""
    from posttrain.rewards import get_reward
    from posttrain.tasks import get_task

    if style not in ("short", "long"):
        raise typer.BadParameter(f"--style: expected short or long, got {style!r}")
    try:
        task = get_task(name, **_params(param))
        exs = task.split(split)  # type: ignore[arg-type]
    except (KeyError, ValueError, TypeError) as e:
        raise typer.BadParameter(str(e)) from None
    info = task.describe()
    typer.echo(f"{task!r}\nsizes: {info['sizes']}  default reward: {task.default_reward}")
    reward = get_reward(task.default_reward)
    for ex in exs[:n]:
        typer.echo(f"\n--- {ex.id}\nprompt: {ex.prompt!r}\nanswer: {ex.answer!r}")
        try:
            ref = task.reference_completion(ex, style)  # type: ignore[arg-type]
        except NotImplementedError:
            continue
        typer.echo(f"reference ({style}): {ref!r}\nreward of reference: {reward(ref, ex)}")
