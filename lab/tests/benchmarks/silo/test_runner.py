"""Runner (resume after a kill, torn tail, errors retried), report artefacts, and the CLI commands."""

from __future__ import annotations

import csv
import json

import pytest
from typer.testing import CliRunner

from posttrain.cli import app
from posttrain_lab.benchmarks.silo.agents import ScriptedAgent
from posttrain_lab.benchmarks.silo.report import table1, write_report
from posttrain_lab.benchmarks.silo.runner import (
    AgentSpec,
    SweepConfig,
    load_rows,
    repair_jsonl,
    row_key,
    run_sweep,
)

TASKS = ["I-01", "II-11", "III-21"]


class Killed(BaseException):
    """Stands in for SIGKILL / Ctrl-C: not an Exception, so the runner does not catch it."""


class Counting(ScriptedAgent):
    def __init__(self, die_after: int | None = None, fail_task: str | None = None):
        self.replies = 0
        self.die_after, self.fail_task = die_after, fail_task

    async def reply(self, messages):
        self.replies += 1
        if self.die_after is not None and self.replies > self.die_after:
            raise Killed
        if self.fail_task and f"**Task: {self.fail_task}" in messages[1]["content"]:
            raise RuntimeError("endpoint down")
        return await super().reply(messages)


def cfg(tmp_path, **kw):
    base = dict(
        out_dir=tmp_path / "run",
        tasks=TASKS,
        agent_counts=[2, 3],
        protocols=["p2p", "bp", "sfs"],
        progress=False,
    )
    return SweepConfig(**{**base, **kw})


def test_resume_after_kill_with_torn_tail_redoes_nothing(tmp_path):
    c = cfg(tmp_path)
    with pytest.raises(Killed):
        run_sweep(c, [AgentSpec("scripted", lambda: Counting(die_after=40))])
    results = c.out_dir / "results.jsonl"
    before = load_rows(results)
    assert 0 < len(before) < 18
    with open(results, "a") as f:
        f.write('{"task_id": "I-0')  # the writer died mid-line
    second = Counting()
    s = run_sweep(c, [AgentSpec("scripted", lambda: second)])
    assert s.total == 18 and s.skipped == len(before) and s.ran == 18 - len(before) and s.errors == 0
    lines = results.read_text().splitlines()
    rows = [json.loads(x) for x in lines]  # every line valid: the torn tail was cut
    assert len(rows) == 18 and len({row_key(r) for r in rows}) == 18
    assert {row_key(r) for r in before} <= {row_key(r) for r in rows}
    # a third run does nothing at all
    third = Counting()
    s3 = run_sweep(c, [AgentSpec("scripted", lambda: third)])
    assert s3.ran == 0 and s3.skipped == 18 and third.replies == 0
    with open(c.out_dir / "results.csv") as f:
        csv_rows = list(csv.DictReader(f))
    assert len(csv_rows) == 18
    need = {"task_id", "level", "protocol", "num_agents", "agent", "seed", "S", "P", "C_code", "C_paper",
            "D_code", "D_paper", "success", "rounds", "premature_submission", "consensus_failure",
            "computation_error", "wall_s"}  # fmt: skip
    assert need <= set(csv_rows[0])
    assert all(r["success"] == "True" for r in csv_rows)
    case_dir = c.out_dir / "cases" / "scripted" / "sfs" / "III-21_n3_s42"
    assert json.loads((case_dir / "results.json").read_text())["success"] is True
    assert (case_dir / "transcript.jsonl").stat().st_size > 0


#: `posttrain silo run` in a child process whose scripted agent takes 50 ms a reply (5-7 replies a case)
SLOW_SILO = """
import asyncio, sys
from posttrain_lab.benchmarks.silo.agents import ScriptedAgent
real = ScriptedAgent.reply
async def reply(self, messages):
    await asyncio.sleep(0.05)
    return await real(self, messages)
ScriptedAgent.reply = reply
from posttrain.cli import app
app(sys.argv[1:], prog_name="posttrain")
"""


def test_sigterm_mid_run_keeps_the_finished_cases_and_resume_runs_the_rest(tmp_path):
    """Issue 58 item 10: `silo run` showed no progress and a SIGTERM left the folder empty. SIGTERM to
    a running sweep once two cases are done: exit 143, the finished cases in results.jsonl, results.csv
    and cases/, one progress line per finished case; a rerun is refused without --resume; --resume
    runs the rest. (A child process: a signal handled in pytest's own process can leave CPython 3.11's
    AST state broken for the rest of the session.)"""
    import signal
    import subprocess
    import sys

    out = tmp_path / "run"
    args = ["silo", "run", "--agents", "2", "--tasks", "I-01", "II-11", "--out", str(out)]
    proc = subprocess.Popen(
        [sys.executable, "-c", SLOW_SILO, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines = []
    for line in proc.stdout:  # the progress line of a case comes once its row is written
        lines.append(line)
        if line.startswith("silo 2/6"):
            break
    proc.send_signal(signal.SIGTERM)
    output = "".join(lines) + proc.communicate(timeout=60)[0]
    text = " ".join(output.split())
    assert proc.returncode == 143, output
    rows = load_rows(out / "results.jsonl")
    assert 2 <= len(rows) < 6, output
    assert f"SIGTERM received: {len(rows)} finished case(s) kept in" in text and "with --resume" in text
    assert "silo 1/6 (17%) case=I-01 N=2 p2p scripted seed 42 success" in text
    assert "silo 2/6 (33%) case=I-01 N=2 bp scripted seed 42 success" in text and "6/6" not in text
    assert "Traceback" not in output and "never retrieved" not in output
    with open(out / "results.csv") as f:
        assert [x["protocol"] for x in csv.DictReader(f)] == [x["protocol"] for x in rows]
    assert (out / "cases" / "scripted" / "bp" / "I-01_n2_s42" / "results.json").exists()
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 2 and f"holds {len(rows)} finished case(s)" in " ".join(r.output.split())
    r = CliRunner().invoke(app, [*args, "--resume"])
    assert r.exit_code == 0, r.output
    assert f"6 cases in grid: {len(rows)} already done, {6 - len(rows)} run, 0 errors" in r.output
    assert len(load_rows(out / "results.jsonl")) == 6


def test_failed_cases_are_logged_and_retried(tmp_path):
    c = cfg(tmp_path, tasks=["I-01", "II-11"], agent_counts=[2], protocols=["bp"])
    s = run_sweep(c, [AgentSpec("scripted", lambda: Counting(fail_task="Prefix Sum"))])
    assert s.ran == 1 and s.errors == 1
    err = json.loads((c.out_dir / "errors.jsonl").read_text().splitlines()[0])
    assert err["key"] == "II-11|2|bp|scripted|42" and "endpoint down" in err["error"]
    s = run_sweep(c, [AgentSpec("scripted", Counting)])
    assert s.ran == 1 and s.skipped == 1 and len(load_rows(c.out_dir / "results.jsonl")) == 2


def test_repair_jsonl(tmp_path):
    p = tmp_path / "r.jsonl"
    p.write_text('{"a": 1}\n{"b": 2}')  # complete row, newline missing -> kept
    assert repair_jsonl(p) == 0 and p.read_text() == '{"a": 1}\n{"b": 2}\n'
    p.write_text('{"a": 1}\n{"b": ')
    assert repair_jsonl(p) == len('{"b": ') and p.read_text() == '{"a": 1}\n'


def test_report_table1_and_artefacts(tmp_path):
    c = cfg(tmp_path, tasks=["I-01", "II-12"], agent_counts=[2, 4])
    run_sweep(c, [AgentSpec("scripted", ScriptedAgent)])
    rows = load_rows(c.out_dir / "results.jsonl")
    t1 = table1(rows)["scripted"]
    assert list(t1) == ["BP", "P2P", "SFS", "Level I", "Level II", "N=2", "N=4", "Average"]
    assert t1["Average"]["SR"] == 100.0 and t1["Average"]["PCS"] == 100.0 and t1["Average"]["cases"] == 12
    # P2P star: D = 2(N-1)/(N(N-1)) = 2/N -> mean over N=2,4 = (1 + 0.5)/2
    assert t1["P2P"]["D_code"] == pytest.approx(0.75)
    summary = write_report(c.out_dir, show=False)
    assert summary["cases"] == 12 and summary["failure_modes"]["scripted"]["success"] == 12
    for name in ("report.md", "report.json", "success_vs_n.png", "heatmap_task_protocol.png"):
        assert (c.out_dir / name).stat().st_size > 0
    for name in ("success_vs_n.png", "heatmap_task_protocol.png"):
        assert (c.out_dir / name).read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert not list(c.out_dir.glob(".*.tmp"))  # atomic writes leave no temporaries behind
    md = (c.out_dir / "report.md").read_text()
    assert "| Average | 100.0 / 100.0 /" in md


def test_cli_generate_run_report_and_bench(tmp_path):
    runner = CliRunner()
    cases = tmp_path / "cases"
    r = runner.invoke(
        app,
        [
            "silo",
            "generate",
            "--agents",
            "2",
            "3",
            "--seed",
            "42",
            "--out",
            str(cases),
            "--tasks",
            "I-01",
            "III-30",
        ],
    )
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in cases.iterdir()) == [
        "I-01_n2.json",
        "I-01_n3.json",
        "III-30_n2.json",
        "III-30_n3.json",
    ]
    # the documented example, exactly as written (30 tasks x N in 2 5 10 x 3 protocols)
    out = tmp_path / "run"
    args = [
        "silo",
        "run",
        "--agent",
        "scripted",
        "--protocols",
        "p2p",
        "bp",
        "sfs",
        "--agents",
        "2",
        "5",
        "10",
        "--tasks",
        "all",
        "--seed",
        "42",
        "--out",
    ]
    r = runner.invoke(app, [*args, str(out)])
    assert r.exit_code == 0, r.output
    rows = load_rows(out / "results.jsonl")
    assert len(rows) == 270 and all(x["success"] for x in rows)
    assert "270 cases in grid: 0 already done, 270 run" in r.output
    # published files through --cases, paper prompt set
    out2 = tmp_path / "run2"
    r = runner.invoke(app, ["silo", "run", "--cases", str(cases), "--agents", "2,3", "--tasks", "I-01", "III-30",
                            "--protocols", "sfs", "--prompt-set", "paper", "--out", str(out2), "--no-save-cases"])  # fmt: skip
    assert r.exit_code == 0, r.output
    assert len(load_rows(out2 / "results.jsonl")) == 4 and not (out2 / "cases").exists()
    assert all(x["success"] for x in load_rows(out2 / "results.jsonl"))
    # scaffolds (arXiv 2603.01045 App. H) are a separate population in the results
    r = runner.invoke(app, ["silo", "run", "--agents", "2", "--tasks", "I-01", "--protocols", "p2p",
                            "--scaffold", "reminder", "planning", "--out", str(out2), "--resume"])  # fmt: skip
    assert r.exit_code == 0, r.output
    assert {x["agent"] for x in load_rows(out2 / "results.jsonl")} == {
        "scripted",
        "scripted+reminder+planning",
    }
    r = runner.invoke(app, ["silo", "run", "--scaffold", "hope", "--out", str(out2)])
    assert r.exit_code != 0 and "unknown 'hope'" in r.output
    r = runner.invoke(app, ["silo", "report", str(out2)])
    assert r.exit_code == 0 and "Table 1" in r.output and (out2 / "report.md").exists()
    # bad input: clear errors
    r = runner.invoke(app, ["silo", "run", "--tasks", "IV-99", "--out", str(tmp_path / "x")])
    assert r.exit_code != 0 and "unknown task 'IV-99'" in r.output
    r = runner.invoke(app, ["silo", "run", "--protocols", "smoke", "--out", str(tmp_path / "x")])
    assert r.exit_code != 0 and "smoke" in r.output
    r = runner.invoke(app, ["silo", "run", "--agent", "openai", "--out", str(tmp_path / "x")])
    assert r.exit_code != 0 and "--base-url" in r.output
    r = runner.invoke(
        app, ["silo", "generate", "--agents", "1", "--tasks", "I-01", "--out", str(tmp_path / "g")]
    )
    assert r.exit_code == 2 and "agent counts must be integers" in r.output
    r = runner.invoke(app, ["bench", "silo", "--agents", "2", "--tasks", "I-01", "--max-rounds", "0"])
    assert r.exit_code == 2 and "max_rounds must be >= 1" in r.output
    r = runner.invoke(app, ["silo", "run", "--agent", "wizard", "--out", str(tmp_path / "x")])
    assert r.exit_code == 2 and "unknown agent kind 'wizard'" in r.output
    assert r.exception is None or isinstance(r.exception, SystemExit)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "results.jsonl").write_text('{"task_id": "I-01"}\n')
    r = runner.invoke(app, ["silo", "run", "--agents", "2", "--tasks", "I-01", "--out", str(bad)])
    assert r.exit_code == 2 and "lacks the key field 'num_agents'" in r.output
    (bad / "results.jsonl").write_text('{"x"\n{"y": 1}\n')
    r = runner.invoke(app, ["silo", "run", "--agents", "2", "--tasks", "I-01", "--out", str(bad)])
    assert r.exit_code == 2 and "line 1: invalid JSON" in r.output
    r = runner.invoke(app, ["silo", "report", str(tmp_path / "nothing")])
    assert r.exit_code != 0 and "does not exist" in r.output
    # bench on a small grid
    js = tmp_path / "bench.json"
    r = runner.invoke(
        app, ["bench", "silo", "--agents", "2", "5", "--tasks", "I-01", "II-14", "--json", str(js)]
    )
    assert r.exit_code == 0, r.output
    res = json.loads(js.read_text())
    assert res["cases"] == 12 and res["success_rate"] == 1.0 and res["peak_rss_mb"] > 0
    assert res["engine_us_per_agent_round"] > 0 and set(res["per_n"]) == {"2", "5"}


class Sleepy(ScriptedAgent):
    """Scripted policy behind an awaited delay, like an LLM endpoint; records replies in flight."""

    def __init__(self):
        self.inflight = self.max_inflight = 0

    async def reply(self, messages):
        import asyncio

        self.inflight += 1
        self.max_inflight = max(self.max_inflight, self.inflight)
        await asyncio.sleep(0.005)
        self.inflight -= 1
        return await super().reply(messages)


@pytest.mark.parametrize(("concurrency", "bound"), [(1, 2), (3, 6)])
def test_case_concurrency_limit(tmp_path, concurrency, bound):
    """N = 2: one case has at most 2 replies in flight, `concurrency` cases at most 2 x concurrency."""
    agent = Sleepy()
    c = cfg(
        tmp_path, tasks=["I-01", "I-02", "I-03"], agent_counts=[2], concurrency=concurrency, save_cases=False
    )
    s = run_sweep(c, [AgentSpec("sleepy", lambda: agent)])
    assert s.ran == 9 and all(r["success"] for r in s.rows)
    assert agent.max_inflight == bound
