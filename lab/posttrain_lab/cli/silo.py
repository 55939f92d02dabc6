"""`posttrain silo generate|run|report` and `posttrain bench silo`.

Multi-value options accept space-separated values as well as repeats and commas:
``--agents 2 5 10``, ``--agents 2 --agents 5``, ``--agents 2,5,10`` are the same.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import typer
from typer.core import TyperCommand

from posttrain.cli.app import HELP, app, bench_app

silo_app = typer.Typer(
    help="SILO-BENCH multi-agent coordination benchmark.", no_args_is_help=True, context_settings=HELP
)
app.add_typer(silo_app, name="silo")

_MULTI = ("--agents", "--protocols", "--tasks", "--seed", "--model", "--scaffold")


class MultiValueCommand(TyperCommand):
    """Rewrites ``--opt a b c`` into ``--opt a --opt b --opt c`` for the options in `_MULTI`
    before click parses them (click options take one value per occurrence)."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        out: list[str] = []
        cur: str | None = None
        for tok in args:
            if tok == "--":
                cur = None
                out.append(tok)
            elif tok.startswith("-") and not _is_number(tok):
                cur = tok if tok in _MULTI else None
                out.append(tok)
            elif cur is not None:
                if out and out[-1] != cur:
                    out.append(cur)
                out.append(tok)
            else:
                out.append(tok)
        return super().parse_args(ctx, out)


def _is_number(tok: str) -> bool:
    try:
        float(tok)
        return True
    except ValueError:
        return False


def _split(values: list[str] | None) -> list[str]:
    out: list[str] = []
    for v in values or []:
        out += [x for x in v.replace(",", " ").split() if x]
    return out


def _ints(values: list[str] | None, what: str) -> list[int]:
    out = []
    for v in _split(values):
        try:
            out.append(int(v))
        except ValueError:
            raise typer.BadParameter(f"{what}: expected integers, got {v!r}") from None
    return out


def _agent_counts(values: list[str] | None, option: str = "--agents") -> list[int]:
    """N values of a sweep: integers >= 2 (the input is split over N >= 2 agents; the N = 1 baseline is
    ``--oracle``). A bad value is a usage error naming the option and the accepted range."""
    counts = _ints(values, option)
    bad = [n for n in counts if n < 2]
    if bad:
        raise typer.BadParameter(
            f"{option}: agent counts must be integers >= 2 (SILO-BENCH splits each input over N >= 2 "
            f"agents; use --oracle for the N = 1 baseline), got {', '.join(map(str, bad))}"
        )
    if not counts:
        raise typer.BadParameter(f"{option}: give at least one agent count (integers >= 2)")
    return counts


def _scoring(name: str, option: str = "--scoring") -> str:
    from posttrain.utils.registry import UnknownNameError
    from posttrain_lab.benchmarks.silo.scoring import SCORINGS

    try:
        return SCORINGS.canonical(name.strip().lower())
    except UnknownNameError as e:
        raise typer.BadParameter(f"{option}: {e}") from None


def _tasks(values: list[str] | None) -> list[str]:
    from posttrain_lab.benchmarks.silo import TASK_IDS, task_level

    names = _split(values) or ["all"]
    levels = {"I": 1, "II": 2, "III": 3}
    out: list[str] = []
    for name in names:
        if name == "all":
            out += TASK_IDS
        elif name in levels:
            out += [t for t in TASK_IDS if task_level(t) == levels[name]]
        elif name in TASK_IDS:
            out.append(name)
        else:
            raise typer.BadParameter(f"--tasks: unknown task {name!r}; use all, I, II, III or ids like I-01")
    return list(dict.fromkeys(out))


def _protocols(values: list[str] | None) -> list[str]:
    from posttrain.utils.registry import UnknownNameError
    from posttrain_lab.benchmarks.silo.protocols import canonical_protocol

    try:
        return list(dict.fromkeys(canonical_protocol(p) for p in (_split(values) or ["p2p", "bp", "sfs"])))
    except UnknownNameError as e:
        raise typer.BadParameter(f"--protocols: {e}") from None


@silo_app.command("generate", cls=MultiValueCommand)
def generate_cmd(
    agents: list[str] = typer.Option(["2", "5", "10", "20", "50", "100"], "--agents", help="agent counts N"),
    seed: list[str] = typer.Option(["42"], "--seed", help="data seed (one)"),
    out: Path = typer.Option(..., "--out", help="output directory"),
    tasks: list[str] = typer.Option(["all"], "--tasks", help="all | I | II | III | task ids"),
    parity: bool = typer.Option(
        False, "--parity", help="replay the authors' single RNG stream (their random.seed(42))"
    ),
) -> None:
    """Write one {TASK}_n{N}.json case file per task and N."""
    from posttrain_lab.benchmarks.silo import write_cases

    seeds = _ints(seed, "--seed")
    if len(seeds) != 1:
        raise typer.BadParameter("--seed: generate takes exactly one seed")
    try:
        paths = write_cases(out, _agent_counts(agents), seeds[0], _tasks(tasks), parity=parity)
    except ValueError as e:  # e.g. N < 2
        raise typer.BadParameter(str(e)) from None
    typer.echo(f"wrote {len(paths)} case files to {out}")


@silo_app.command("run", cls=MultiValueCommand)
def run_cmd(
    agent: str = typer.Option("scripted", "--agent", help="scripted | openai | hf | adversarial:<kind>"),
    protocols: list[str] = typer.Option(["p2p", "bp", "sfs"], "--protocols", help="p2p bp sfs"),
    agents: list[str] = typer.Option(["2", "5", "10"], "--agents", help="agent counts N"),
    tasks: list[str] = typer.Option(["all"], "--tasks", help="all | I | II | III | task ids"),
    seed: list[str] = typer.Option(["42"], "--seed", help="data seeds"),
    out: Path = typer.Option(..., "--out", help="run directory (results.jsonl, results.csv, cases/)"),
    model: list[str] = typer.Option(
        [], "--model", help="openai: model name(s); hf: model dir(s) or preset(s)"
    ),
    base_url: str | None = typer.Option(None, "--base-url", help="openai: e.g. http://localhost:8000/v1"),
    api_key_env: str | None = typer.Option(None, "--api-key-env", help="openai: env var holding the API key"),
    temperature: float | None = typer.Option(None, "--temperature", help="sampling temperature"),
    max_tokens: int | None = typer.Option(None, "--max-tokens", help="openai: max_tokens per reply"),
    max_new_tokens: int = typer.Option(512, "--max-new-tokens", help="hf: generation cap per reply"),
    request_concurrency: int = typer.Option(
        8, "--request-concurrency", min=1, help="openai: requests in flight (>= 1)"
    ),
    timeout_s: float = typer.Option(600.0, "--timeout", min=0.001, help="openai: request timeout (s, > 0)"),
    max_retries: int = typer.Option(5, "--max-retries", min=0, help="openai: retries on 429/5xx/timeouts"),
    max_rounds: int = typer.Option(100, "--max-rounds", min=1, help="R_max (>= 1)"),
    concurrency: int = typer.Option(1, "--concurrency", min=1, help="cases run at once (>= 1)"),
    cases: Path | None = typer.Option(None, "--cases", help="run published {TASK}_n{N}.json files from DIR"),
    prompt_set: str = typer.Option("code", "--prompt-set", help="code | paper"),
    save_cases: bool = typer.Option(
        True, "--save-cases/--no-save-cases", help="per-case results.json + transcript"
    ),
    scaffold: list[str] = typer.Option(
        [], "--scaffold", help="arXiv 2603.01045 App. H add-ons (our texts): planning reminder scratchpad"
    ),
    oracle: bool = typer.Option(
        False, "--oracle", help="also run the N = 1 oracle (whole input, one agent) of each case, for RCC"
    ),
    scoring: str = typer.Option(
        "default",
        "--scoring",
        help="default | paper (the authors' metric semantics, comparable with the paper)",
    ),
    token_counter: str = typer.Option(
        "regex",
        "--token-counter",
        help="tokens of agents that report no usage: regex | chars | hf:<preset or local tokenizer dir>",
    ),
    resume: bool = typer.Option(
        False,
        "--resume",
        help="continue a sweep in --out: skip the cases in its results.jsonl, run the rest (and retry errors)",
    ),
) -> None:
    """Run a sweep: one progress line per case, each finished case appended to DIR/results.jsonl at
    once (Ctrl-C or SIGTERM keeps every finished case); --resume continues it."""
    from posttrain.cli.train import Terminated, _sigterm_as_interrupt
    from posttrain_lab.benchmarks.silo.agents import make_agent
    from posttrain_lab.benchmarks.silo.prompts import PROMPT_SETS, SCAFFOLDS
    from posttrain_lab.benchmarks.silo.runner import AgentSpec, SweepConfig, load_rows, run_sweep

    if prompt_set not in PROMPT_SETS:
        raise typer.BadParameter(f"--prompt-set: unknown {prompt_set!r}; known: {', '.join(PROMPT_SETS)}")
    if cases is not None and not cases.is_dir():
        raise typer.BadParameter(f"--cases: {cases} is not a directory")
    scaffolds = tuple(dict.fromkeys(_split(scaffold)))
    for sc in scaffolds:
        if sc not in SCAFFOLDS:
            raise typer.BadParameter(f"--scaffold: unknown {sc!r}; known: {', '.join(SCAFFOLDS)}")
    models = _split(model)
    specs: list[AgentSpec] = []
    if agent == "openai":
        if not base_url or not models:
            raise typer.BadParameter("--agent openai needs --base-url and --model")
        key = None
        if api_key_env:
            key = os.environ.get(api_key_env)
            if not key:
                raise typer.BadParameter(f"--api-key-env: environment variable {api_key_env} is not set")
        for m in models:
            opts = dict(base_url=base_url, model=m, api_key=key, temperature=temperature, max_tokens=max_tokens,
                        concurrency=request_concurrency, timeout_s=timeout_s, max_retries=max_retries)  # fmt: skip
            specs.append(AgentSpec(m, lambda o=opts: make_agent("openai", **o)))
    elif agent == "hf":
        if not models:
            raise typer.BadParameter("--agent hf needs --model (a local model directory or a preset)")
        for m in models:
            opts = dict(model=m, max_new_tokens=max_new_tokens, temperature=temperature or 0.0)
            specs.append(AgentSpec(f"hf:{m}", lambda o=opts: make_agent("hf", **o)))
    else:
        try:
            make_agent(agent)  # validates the name
        except ValueError as e:
            raise typer.BadParameter(f"--agent: {e}") from None
        specs.append(AgentSpec(agent, lambda: make_agent(agent)))
    if scaffolds:  # scaffolded runs are a different population: keep them apart in results and resume keys
        for sp in specs:
            sp.label += "+" + "+".join(scaffolds)
    cfg = SweepConfig(
        scaffolds=scaffolds,
        out_dir=out,
        tasks=_tasks(tasks),
        agent_counts=_agent_counts(agents),
        protocols=_protocols(protocols),
        seeds=_ints(seed, "--seed"),
        max_rounds=max_rounds,
        prompt_set=prompt_set,
        concurrency=concurrency,
        cases_dir=cases,
        save_cases=save_cases,
        oracle=oracle,
        scoring=_scoring(scoring),
        token_counter=token_counter,
    )
    results = out / "results.jsonl"
    try:
        finished = len(load_rows(results))
        if finished and not resume:
            from posttrain.utils.errors import InvalidValueError

            raise InvalidValueError(
                f"{out} holds {finished} finished case(s) of an earlier sweep: --resume skips them and runs "
                "the rest; or choose another --out"
            )
        with _sigterm_as_interrupt():
            s = run_sweep(cfg, specs)
    except ValueError as e:  # bad results.jsonl rows, bad case files, bad options: no traceback
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM (SweepInterrupted; Terminated before the sweep)
        terminated = isinstance(e, Terminated) or getattr(e, "signal", None) == "SIGTERM"
        kept = len(load_rows(results))
        typer.secho(
            f"{'SIGTERM received' if terminated else 'interrupted'}: {kept} finished case(s) kept in "
            f"{results} (and results.csv); rerun the same command with --resume to run the rest",
            fg=typer.colors.YELLOW,
            err=True,
        )
        raise typer.Exit(143 if terminated else 130) from None
    sr = sum(bool(r["success"]) for r in s.rows) / max(1, len(s.rows))
    typer.echo(
        f"{s.total} cases in grid: {s.skipped} already done, {s.ran} run, {s.errors} errors "
        f"({s.wall_s:.1f}s); success rate over {len(s.rows)} finished cases: {sr:.3f}; results in {out}"
    )
    oracle_rows = [r for r in s.rows if r.get("oracle_of") is not None]
    if oracle_rows:
        sr1 = sum(bool(r["success"]) for r in oracle_rows) / len(oracle_rows)
        typer.echo(f"of which {len(oracle_rows)} N = 1 oracle cases, success rate {sr1:.3f}")
    if s.errors:
        typer.echo(
            f"see {out / 'errors.jsonl'}; rerun the same command with --resume to retry them", err=True
        )
        raise typer.Exit(1)


@silo_app.command("rl-experiment")
def rl_experiment_cmd(
    overrides: list[str] | None = typer.Argument(
        None, help="key=value overrides of the RL config (posttrain_lab/benchmarks/silo/rl/silo-rl.yaml)"
    ),
    out: Path = typer.Option(Path("runs/silo-rl-experiment"), "--out", help="run directory"),
    arms: str = typer.Option("sft,grpo,duca", "--arms", help="comma-separated: sft grpo duca"),
    seeds: str = typer.Option("0,1,2", "--seeds", help="comma-separated RL seeds"),
    steps: int | None = typer.Option(None, "--steps", min=0, help="RL steps per arm and seed (config: 40)"),
    sft_steps: int = typer.Option(
        60, "--sft-steps", min=1, help="warm-start SFT steps (8 seat conversations each)"
    ),
    sft_lr: float = typer.Option(5e-5, "--sft-lr", min=0.0),
    precheck_n: int = typer.Option(16, "--precheck-n", min=1, help="training cases of the pre-check"),
    overwrite: bool = typer.Option(False, "--overwrite", help="replace a previous experiment in --out"),
    resume: bool = typer.Option(False, "--resume", help="continue: finished arms and seeds are kept"),
    progress: bool | None = typer.Option(None, "--progress/--no-progress"),
) -> None:
    """Post-train agents to coordinate: SFT warm start on the scripted agents, then GRPO / DuCA on S;
    pre-check, gates, S/P/C/D by split, level and N (docs/silo-rl.md)."""
    from posttrain.cli.app import fail, run_folder_lock
    from posttrain.utils.config import ConfigError
    from posttrain_lab.benchmarks.silo.rl.experiment import run_silo_experiment

    try:
        with run_folder_lock(out):
            run_silo_experiment(
                out,
                arms=tuple(a.strip() for a in arms.split(",") if a.strip()),
                seeds=tuple(_ints([seeds], "--seeds")),
                steps=steps,
                sft_steps=sft_steps,
                sft_lr=sft_lr,
                precheck_n=precheck_n,
                overrides=overrides or [],
                resume=resume,
                overwrite=overwrite,
                progress=progress,
            )
    except (ConfigError, ValueError, FileNotFoundError) as e:
        fail(str(e))


@silo_app.command("report")
def report_cmd(
    run_dir: Path = typer.Argument(..., help="a run directory with results.jsonl"),
    plots: bool = typer.Option(True, "--plots/--no-plots", help="write PNG plots"),
    scoring: str | None = typer.Option(
        None,
        "--scoring",
        help="default | paper | both; default: the mode the sweep was run with. Another mode rescores the "
        "saved cases (no agent is run) into report.<mode>.md/json; both also writes scoring_comparison.md",
    ),
) -> None:
    """Table 1 layout (terminal + report.md), failure modes, Table 2 (oracle RCC), plots, report.json."""
    from posttrain.utils.io import atomic_write_text
    from posttrain.utils.tables import markdown_table, print_table
    from posttrain_lab.benchmarks.silo.report import compare_scorings, write_report

    both = scoring is not None and scoring.strip().lower() == "both"
    modes = ["default", "paper"] if both else [None if scoring is None else _scoring(scoring)]
    written = []
    try:
        for mode in modes:
            summary = write_report(run_dir, plots=plots, scoring=mode)
            name = "report" if not summary["rescored"] else f"report.{summary['scoring']}"
            written += [run_dir / f"{name}.md", run_dir / f"{name}.json"]
        if both:
            columns, body = compare_scorings(run_dir, modes)
            print_table("SR and PCS by scoring mode (same transcripts)", columns, body)
            path = run_dir / "scoring_comparison.md"
            atomic_write_text(
                path,
                "# SR and PCS of one sweep in each scoring mode\n\nThe same transcripts scored by "
                "`default` and by `paper` (posttrain_lab.benchmarks.silo.scoring).\n\n"
                + markdown_table(columns, body),
            )
            written.append(path)
    except (FileNotFoundError, ValueError) as e:
        raise typer.BadParameter(str(e)) from None
    typer.echo("wrote " + ", ".join(str(p) for p in written))


@bench_app.command("silo", cls=MultiValueCommand)
def bench_silo_cmd(
    agents: list[str] = typer.Option(["2", "5", "10", "20", "50", "100"], "--agents", help="agent counts N"),
    protocols: list[str] = typer.Option(["p2p", "bp", "sfs"], "--protocols"),
    tasks: list[str] = typer.Option(["all"], "--tasks", help="all | I | II | III | task ids"),
    seed: int = typer.Option(42, "--seed"),
    max_rounds: int = typer.Option(100, "--max-rounds"),
    json_path: Path | None = typer.Option(None, "--json", help="write the measurements here"),
) -> None:
    """Time the SILO-BENCH grid with scripted agents: wall, peak RSS, engine overhead, success."""
    from posttrain.utils.io import atomic_write_json
    from posttrain.utils.progress import progress_bar
    from posttrain.utils.tables import print_table
    from posttrain_lab.benchmarks.silo.bench import run_silo_bench

    task_ids, counts, protos = _tasks(tasks), _agent_counts(agents), _protocols(protocols)
    total = len(task_ids) * len(counts) * len(protos)
    ok = [0, 0]
    with progress_bar("bench silo", total=total) as bar:

        def on_case(info: dict) -> None:
            ok[0] += 1
            ok[1] += bool(info["success"])
            bar.advance(sr=ok[1] / ok[0], n=info["n"])

        try:
            res = run_silo_bench(task_ids, counts, protos, seed, max_rounds, on_case=on_case)
        except ValueError as e:  # e.g. N < 2, max_rounds < 1
            raise typer.BadParameter(str(e)) from None
    rows = [
        [
            f"N={n}",
            int(p["cases"]),
            p["success"] / max(1, p["cases"]),
            p["wall_s"],
            p["engine_us_per_agent_round"],
        ]
        for n, p in res["per_n"].items()
    ]
    rows.append(
        ["all", res["cases"], res["success_rate"], res["case_wall_s"], res["engine_us_per_agent_round"]]
    )
    print_table(
        "bench silo (scripted agents)", ["slice", "cases", "success", "wall s", "engine µs/agent-round"], rows
    )
    typer.echo(
        f"wall {res['wall_s']:.1f}s  peak RSS {res['peak_rss_mb']:.0f} MB  engine overhead "
        f"{res['engine_us_per_agent_round']:.1f} µs/agent-round  success {res['success_rate']:.3f}"
    )
    if res["failed_cases"]:
        typer.echo(f"failed: {', '.join(res['failed_cases'][:20])}", err=True)
    if json_path is not None:
        atomic_write_json(json_path, res)
        typer.echo(f"wrote {json_path}")
