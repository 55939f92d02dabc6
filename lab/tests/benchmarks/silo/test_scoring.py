"""Scoring modes (`posttrain_lab.benchmarks.silo.scoring`): the `paper` mode's semantics on hand-made answers covering
each listed edge case, the `default` mode unchanged, rescoring saved cases, the report's mode labels,
and the CLI guards of `posttrain silo run` (issue: agent counts, concurrency, protocol case)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from posttrain.cli import app
from posttrain_lab.benchmarks.silo import generate_case, metrics
from posttrain_lab.benchmarks.silo.agents import ScriptedAgent
from posttrain_lab.benchmarks.silo.agents.base import AgentReply
from posttrain_lab.benchmarks.silo.engine import EngineConfig, run_case
from posttrain_lab.benchmarks.silo.parsing import format_tool_call
from posttrain_lab.benchmarks.silo.report import compare_scorings, write_report
from posttrain_lab.benchmarks.silo.runner import AgentSpec, SweepConfig, load_rows, run_sweep
from posttrain_lab.benchmarks.silo.scoring import (
    SCORINGS,
    CaseScoreInput,
    get_scoring,
    inputs_from_results,
    paper_normalize,
    paper_partial,
)

PAPER = get_scoring("paper")
DEFAULT = get_scoring("default")


def _inp(answers, expected, level=1, **kw):
    n = len(expected)
    base = dict(
        task_id="I-01",
        level=level,
        num_agents=n,
        expected=expected,
        answers=answers,
        submitted=[a is not None for a in answers],
        input_tokens=900,
        output_tokens=300,
        rounds_executed=3,
        max_rounds=100,
        messages_code=4,
        messages_paper=6,
    )
    return CaseScoreInput(**{**base, **kw})


def _flat(text: str) -> str:
    return " ".join(text.replace("│", " ").replace("╭", " ").replace("╰", " ").split())


# ------------------------------------------------------------------------------ the paper mode, by rule


@pytest.mark.parametrize(
    ("answer", "expected", "paper", "default"),
    [
        (1, True, True, False),  # Python ==: an answer 1 for True counts
        (0, False, True, False),
        ("1", True, True, False),  # "1" -> int 1 -> == True
        (True, True, True, True),
        ("True", True, False, True),  # their strings: no Python bool names; ours reads them
        ("true", True, False, True),  # not starting with [ or {: stays the string "true"
        (" 42 ", 42, True, True),  # stripped, int
        ("42.0", 42, True, True),  # float 42.0 == 42
        (5.0, 5, True, True),
        ('"Candidate_A"', "Candidate_A", False, True),  # a quoted JSON string is not unwrapped
        ("Candidate_A ", "Candidate_A", True, True),
        ("[1, 2]", [1, 2], True, True),  # JSON for text starting with [ or {
        ("[(1, 2)]", [[1, 2]], False, False),  # a Python tuple literal is no JSON: a string, wrong
        ('{"0": 1}', {"0": 1}, True, True),
        ({0: 1}, {"0": 1}, False, True),  # their dicts are compared as they are (key types matter)
        ([1.0, True], [1, 1], True, False),
        (None, 5, False, False),
        (float("nan"), 1.5, False, False),
    ],
)
def test_paper_equality_and_string_handling(answer, expected, paper, default):
    assert PAPER.correct(answer, expected) is paper
    assert DEFAULT.correct(answer, expected) is default


def test_paper_normalize_rules():
    assert paper_normalize("  7 ") == 7 and isinstance(paper_normalize("7"), int)
    assert paper_normalize("1e3") == 1000.0
    assert paper_normalize(' {"a": "5"} ') == {"a": "5"}  # dict values are not normalised
    assert paper_normalize(["5", " x "]) == [5, "x"]  # list elements are
    assert paper_normalize("[1, oops") == "[1, oops"
    assert paper_normalize((1, 2)) == (1, 2)  # tuples are not lists in their code


def test_paper_level_one_tolerance_includes_booleans_and_integers():
    assert paper_partial(619, 620, 1) == 1.0  # 1 % of 620
    assert paper_partial(600, 620, 1) == 0.0
    assert paper_partial(1, True, 1) == 1.0 and paper_partial(False, True, 1) == 0.0
    assert paper_partial(0, 0, 1) == 1.0 and paper_partial(0.001, 0, 1) == 0.0
    assert paper_partial("619", 620, 1) == 1.0
    assert paper_partial(float("nan"), 620, 1) == 0.0
    assert paper_partial(10**400, 620.0, 1) == 0.0  # no OverflowError
    assert paper_partial("Candidate_B", "Candidate_A", 1) == 0.0


def test_paper_level_two_positional():
    assert paper_partial([1, 2, 0, 4, 5], [1, 2, 3, 4], 2) == 0.75
    assert paper_partial([1.0, True], [1, 1], 2) == 1.0  # Python == per position
    assert paper_partial("[1, 2, 3, 4]", [1, 2, 3, 4], 2) == 1.0
    assert paper_partial([], [], 2) == 1.0 and paper_partial([1], [], 2) == 0.0
    assert paper_partial(7, [7], 2) == 0.0


def test_paper_level_three_list_of_lists_does_not_raise():
    """Their map uses answer elements as dict keys, which raises for III-25 / III-27 / III-30 answers."""
    y = [[21.6, 73.44], [86.5, 57.02], [37.42, 25.93]]
    assert paper_partial(y, y, 3) == 1.0
    assert paper_partial([y[1], y[0], y[2]], y, 3) == pytest.approx(2 / 3)
    assert paper_partial([[1, 4, 2.3826], [9, 9, 9.0]], [[1, 4, 2.3826], [1, 0, 2.1707]], 3) == 0.5


def test_paper_level_three_duplicates_are_matched_in_order():
    """Their map keeps only the last index of a duplicated value: a fully correct III-21 slice with
    duplicates scores below 1 there (0.75 here; P = 0.46 at N = 100). Here it scores 1."""
    y = [3, 3, 5, 9]
    assert paper_partial(y, y, 3) == 1.0
    assert paper_partial([3, 5, 9], y, 3) == 0.75
    assert paper_partial([3, 3, 3, 3, 5, 9], y, 3) == 1.0  # surplus copies are skipped


def test_paper_c_and_d_as_their_code_beside_the_paper_formula():
    met = PAPER.score(_inp([5, 5], [5, 5]))
    assert met["C_code"] == (900 + 300) / 3 and met["C_token_consumption"] == met["C_code"]
    assert met["C_paper"] == 300 / 100
    assert met["D_code"] == 4 / 2 and met["D_communication_density"] == met["D_code"]
    assert met["D_paper"] == 6 / 2
    assert PAPER.c_columns == ("C_code", "C_paper") and PAPER.d_column == "D_code"


def test_paper_s_counts_one_answer_per_agent():
    met = PAPER.score(_inp([True, 1, None], [True, True, True]))
    assert met["S_success_rate"] == pytest.approx(2 / 3)
    assert DEFAULT.score(_inp([True, 1, None], [True, True, True]))["S_success_rate"] == pytest.approx(1 / 3)


class DoubleSubmitter(ScriptedAgent):
    """Submits the scripted answer, then (same reply) a wrong one: only the first submission counts."""

    async def reply(self, messages):
        rep = await super().reply(messages)
        if "submit_result" in rep.text:
            rep = AgentReply(rep.text + "\n" + format_tool_call("submit_result", answer="-999999"))
        return rep


def test_a_repeated_submission_counts_once():
    case = generate_case("I-01", 3)
    res = run_case(case, "bp", DoubleSubmitter(), EngineConfig(scoring="paper"))
    assert res.scoring == "paper" and res.success
    assert res.metrics["S_success_rate"] == 1.0 and res.answers == res.expected


# ------------------------------------------------------------------------------ default mode unchanged


@pytest.mark.parametrize("task_id", ["I-04", "II-11", "III-25", "III-27"])
def test_default_mode_metrics_are_the_metrics_functions(task_id):
    case = generate_case(task_id, 3)
    res = run_case(case, "sfs", ScriptedAgent())
    assert res.scoring == "default"
    exp, ans, level = res.expected, res.answers, res.level
    assert res.metrics["S_success_rate"] == metrics.success_rate(ans, exp)
    assert res.metrics["P_partial_correctness"] == metrics.partial_correctness(ans, exp, level)
    assert res.metrics["C_code"] == metrics.token_consumption_code(res.input_tokens, res.output_tokens, 3)
    assert res.metrics["C_paper"] == metrics.token_consumption_paper(res.output_tokens, 100)
    assert res.metrics["D_code"] == metrics.communication_density(3, 3)
    assert res.correct == [metrics.is_correct(a, e) for a, e in zip(ans, exp, strict=True)]


def test_rescoring_from_results_json_reproduces_the_run():
    for proto in ("p2p", "bp", "sfs"):
        res = run_case(generate_case("III-21", 4), proto, ScriptedAgent())
        doc = json.loads(json.dumps(res.results_json()))
        assert doc["scoring"] == "default" and set(doc["communication"]["messages"]) >= {"code", "paper"}
        assert DEFAULT.score(inputs_from_results(doc)) == res.metrics
        # files written before message counts were stored: recovered from the densities
        del doc["communication"]["messages"]
        assert DEFAULT.score(inputs_from_results(doc)) == res.metrics


def test_scoring_registry_and_errors():
    assert SCORINGS.names() == ["default", "paper"]
    assert get_scoring("PAPER").name == "paper"
    with pytest.raises(ValueError, match=r"unknown SILO scoring mode 'papr'.*paper"):
        get_scoring("papr")
    with pytest.raises(ValueError, match="unknown SILO scoring mode"):
        EngineConfig(scoring="nope")


# ------------------------------------------------------------------------------ sweeps and the report


class IntBools(ScriptedAgent):
    """Answers I-04 (a bool) with 1 / 0: right under the paper's Python ==, wrong under the default."""

    async def reply(self, messages):
        rep = await super().reply(messages)
        text = rep.text.replace("<answer>true</answer>", "<answer>1</answer>")
        return AgentReply(text.replace("<answer>false</answer>", "<answer>0</answer>"))


def _sweep(tmp_path, scoring="default"):
    cfg = SweepConfig(
        out_dir=tmp_path / "run",
        tasks=["I-01", "I-04"],
        agent_counts=[2, 3],
        protocols=["bp", "p2p"],
        progress=False,
        scoring=scoring,
    )
    run_sweep(cfg, [AgentSpec("intbools", IntBools)])
    return cfg


def test_report_rescores_saved_cases_in_the_other_mode(tmp_path):
    cfg = _sweep(tmp_path)
    run = cfg.out_dir
    rows = load_rows(run / "results.jsonl")
    assert {r["scoring"] for r in rows} == {"default"}
    assert {r["task_id"] for r in rows if not r["success"]} == {"I-04"}
    own = write_report(run, show=False, plots=False)
    assert not own["rescored"] and own["scoring"] == "default"
    assert own["table1"]["intbools"]["Average"]["SR"] == 50.0
    assert "scoring: default" in (run / "report.md").read_text()
    before = (run / "results.jsonl").read_bytes()
    paper = write_report(run, show=False, plots=False, scoring="paper")
    assert paper["rescored"] and paper["scoring"] == "paper"
    assert paper["table1"]["intbools"]["Average"]["SR"] == 100.0  # 1 for True counts there
    assert paper["failure_modes"]["intbools"]["computation_error"] == 0
    assert own["failure_modes"]["intbools"]["computation_error"] == 4  # the 4 I-04 cases
    md = (run / "report.paper.md").read_text()
    assert (
        "scoring: paper (rescored from the saved cases)" in md
        and "SR / PCS / C_code / C_paper / D_code" in md
    )
    assert (run / "results.jsonl").read_bytes() == before  # the sweep itself is untouched
    columns, body = compare_scorings(run)
    avg = next(b for b in body if b[1] == "Average")
    assert columns[2:4] == ["SR (default)", "SR (paper)"] and avg[2:4] == ["50.0", "100.0"]


def test_a_paper_scored_sweep_and_resume_guard(tmp_path):
    cfg = _sweep(tmp_path, scoring="paper")
    rows = load_rows(cfg.out_dir / "results.jsonl")
    assert all(r["scoring"] == "paper" and r["success"] for r in rows)
    with pytest.raises(ValueError, match="scored with --scoring paper; resume with --scoring paper"):
        run_sweep(SweepConfig(**{**cfg.__dict__, "scoring": "default"}), [AgentSpec("intbools", IntBools)])
    back = write_report(cfg.out_dir, show=False, plots=False, scoring="default")
    assert back["rescored"] and back["table1"]["intbools"]["Average"]["SR"] == 50.0


def test_rescoring_needs_the_saved_cases(tmp_path):
    cfg = SweepConfig(
        out_dir=tmp_path / "run", tasks=["I-01"], agent_counts=[2], protocols=["bp"], progress=False,
        save_cases=False,
    )  # fmt: skip
    run_sweep(cfg, [AgentSpec("scripted", ScriptedAgent)])
    with pytest.raises(FileNotFoundError, match="--no-save-cases"):
        write_report(cfg.out_dir, show=False, plots=False, scoring="paper")


def test_cli_report_scoring_both(tmp_path):
    cfg = _sweep(tmp_path)
    r = CliRunner().invoke(app, ["silo", "report", str(cfg.out_dir), "--no-plots", "--scoring", "both"])
    assert r.exit_code == 0, r.output
    assert (cfg.out_dir / "report.md").exists() and (cfg.out_dir / "report.paper.md").exists()
    text = (cfg.out_dir / "scoring_comparison.md").read_text()
    assert "SR (default)" in text and "SR (paper)" in text
    r = CliRunner().invoke(app, ["silo", "report", str(cfg.out_dir), "--scoring", "exact"])
    assert r.exit_code == 2 and "unknown SILO scoring mode 'exact'" in _flat(r.output)


# ------------------------------------------------------------------------------ CLI guards


@pytest.mark.parametrize("n", ["0", "1", "-2"])
def test_run_rejects_agent_counts_below_two(tmp_path, n):
    out = tmp_path / "x"
    r = CliRunner().invoke(app, ["silo", "run", "--agents", n, "--tasks", "I-01", "--out", str(out)])
    text = _flat(r.output)
    assert r.exit_code == 2, r.output
    assert "--agents: agent counts must be integers >= 2" in text and f"got {n}" in text
    assert not out.exists()  # nothing ran


def test_run_rejects_concurrency_zero(tmp_path):
    out = tmp_path / "x"
    r = CliRunner().invoke(
        app, ["silo", "run", "--agents", "2", "--tasks", "I-01", "--concurrency", "0", "--out", str(out)]
    )
    assert r.exit_code == 2 and "--concurrency" in _flat(r.output) and not out.exists()


def test_run_accepts_protocols_in_any_case(tmp_path):
    out = tmp_path / "x"
    r = CliRunner().invoke(
        app,
        ["silo", "run", "--agents", "2", "--tasks", "I-01", "--protocols", "P2P", "Bp", "SFS",
         "--no-save-cases", "--out", str(out), "--scoring", "Paper"],
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    rows = load_rows(out / "results.jsonl")
    assert sorted(r["protocol"] for r in rows) == ["bp", "p2p", "sfs"]
    assert {r["scoring"] for r in rows} == {"paper"}
