"""N = 1 oracle baseline (posttrain_lab.benchmarks.silo.oracle), oracle sweeps and the Table-2 / RCC report."""

from __future__ import annotations

import json
import math
from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from posttrain.cli import app
from posttrain_lab.benchmarks.silo import TASK_IDS, generate_case, load_case, solve, task_info
from posttrain_lab.benchmarks.silo.agents import ScriptedAgent
from posttrain_lab.benchmarks.silo.agents.base import Agent, AgentReply
from posttrain_lab.benchmarks.silo.engine import run_case
from posttrain_lab.benchmarks.silo.metrics import relative_coordination_cost
from posttrain_lab.benchmarks.silo.oracle import (
    LISTED_TASKS,
    OracleError,
    merge_shards,
    normalise_oracle,
    oracle_case,
    oracle_expected,
    oracle_input,
    read_oracle_input,
)
from posttrain_lab.benchmarks.silo.parsing import format_tool_call, parse_tool_calls
from posttrain_lab.benchmarks.silo.protocols import make_protocol
from posttrain_lab.benchmarks.silo.report import RCC_UNDEFINED, table2, table2_rows, write_report
from posttrain_lab.benchmarks.silo.runner import AgentSpec, SweepConfig, load_rows, row_key, run_sweep
from posttrain_lab.benchmarks.silo.tasks.cases import case_to_json

KS = (2, 5)
SEGMENTED = {"II-11", "II-14", "II-20", "III-21"}


def _truth(case):
    """Ground truth over the ORIGINAL k shards: the global value, or the slices concatenated."""
    shards = [c["input_shard"] for c in case["agent_configs"]]
    per_agent = solve(case["case_id"], shards, case["agent_configs"][0]["user_prompt"])
    if task_info(case["case_id"]).is_segmented:
        return [x for part in per_agent for x in part]
    assert all(v == per_agent[0] for v in per_agent)
    return per_agent[0]


@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("task_id", TASK_IDS)
def test_oracle_expected_is_ground_truth_over_original_shards(task_id, k):
    case = generate_case(task_id, k, seed=7)
    o = oracle_case(case)
    assert o["expected_output"] == _truth(case)
    assert o["metadata"]["oracle_of"] == k and o["metadata"]["num_agents"] == 1
    assert len(o["agent_configs"]) == 1 and o["case_id"] == f"{task_id}_n1_oracle{k}"
    # the oracle's own input and prompt determine the same answer: merging did not change the task
    prompt = o["agent_configs"][0]["user_prompt"]
    held = o["agent_configs"][0]["input_shard"]
    assert held == oracle_input(task_id, [c["input_shard"] for c in case["agent_configs"]])
    assert len(held) == (k if task_id in LISTED_TASKS else 1)
    assert read_oracle_input(prompt) == held  # what the prompt shows is exactly the whole input
    assert solve(task_id, held, prompt)[0] == o["expected_output"]
    # no per-agent placeholder or communication instruction is left
    for frag in ("{agent_id}", "{input_shard}", "{num_agents}", "{max_id}", "**Communication Protocol"):
        assert frag not in prompt
    assert "ONLY agent" in prompt and f"oracle of the {k}-agent case" in prompt
    if task_id in SEGMENTED:
        assert "Each agent submits" not in prompt and "**Output:**" in prompt


def test_oracle_files_load_through_load_case_as_baselines(tmp_path):
    for task_id in ("I-07", "II-14", "III-27", "III-29", "III-30"):
        o = oracle_case(generate_case(task_id, 5, seed=3))
        path = tmp_path / f"{task_id}_oracle.json"
        path.write_text(case_to_json(o), encoding="utf-8")
        loaded = load_case(path)
        assert loaded["metadata"]["num_agents"] == 1 and loaded["metadata"]["oracle_of"] == 5
        assert loaded["expected_output"]["per_agent_values"] == [o["expected_output"]]
        assert loaded["expected_output"] == normalise_oracle(o)["expected_output"]
        res = run_case(loaded, "p2p", ScriptedAgent())
        assert res.success and res.rounds_executed == 1


@pytest.mark.parametrize("protocol", ["bp", "p2p", "sfs"])
def test_scripted_agent_solves_every_oracle_in_round_one(protocol):
    for k in KS:
        for task_id in TASK_IDS:
            res = run_case(
                normalise_oracle(oracle_case(generate_case(task_id, k))), protocol, ScriptedAgent()
            )
            assert res.success and res.metrics["S_success_rate"] == 1.0, (task_id, k, protocol)
            assert res.metrics["P_partial_correctness"] == 1.0
            assert res.num_agents == 1 and res.rounds_executed == 1 and res.submit_rounds == [1]
            assert res.metrics["D_code"] == 0.0 and res.metrics["D_paper"] == 0.0
            assert not any(res.failure_modes[m] for m in ("premature_submission", "consensus_failure"))


def test_wrong_oracle_answer_scores_zero_with_level_partial_credit():
    o = normalise_oracle(oracle_case(generate_case("II-11", 2, seed=1)))
    full = o["expected_output"]["per_agent_values"][0]
    bad = [*full[:-1], full[-1] + 1]

    class Once(Agent):
        async def reply(self, messages):
            return AgentReply(format_tool_call("submit_result", answer=json.dumps(bad)))

    res = run_case(o, "bp", Once())
    assert res.metrics["S_success_rate"] == 0.0 and not res.success
    assert res.metrics["P_partial_correctness"] == pytest.approx((len(full) - 1) / len(full))


def _call(name, **params):
    (call,) = parse_tool_calls(format_tool_call(name, **params))
    return call


def test_protocols_with_a_single_agent():
    p2p = make_protocol("p2p", 1)
    r = p2p.execute(0, 1, _call("send_message", target_id=0, content="x"))
    assert r["success"] is False and "yourself" in r["error"]
    r = p2p.execute(0, 1, _call("send_message", target_id=1, content="x"))
    assert r["success"] is False and "[0, 0]" in r["error"]
    assert p2p.execute(0, 2, _call("receive_messages")) == {"messages": []}
    bp = make_protocol("bp", 1)
    r = bp.execute(0, 1, _call("broadcast_message", content="hello"))
    assert r["success"] is True and "0 agents" in r["message"]
    assert bp.execute(0, 2, _call("receive_messages")) == {"messages": []}  # own broadcast not echoed
    assert bp.execute(0, 2, _call("list_agents")) == {"agent_ids": [0], "total": 1}
    sfs = make_protocol("sfs", 1)
    sfs.begin_round(1)
    sfs.execute(0, 1, _call("write_file", path="a", content=1))
    sfs.end_round(1)
    sfs.begin_round(2)
    assert sfs.execute(0, 2, _call("read_file", path="a"))["content"] == 1
    assert sfs.paper_message_count() == 0  # own reads are not communication


def test_broadcast_to_nobody_then_submit_through_the_engine():
    o = normalise_oracle(oracle_case(generate_case("I-01", 2, seed=2)))
    answer = o["expected_output"]["per_agent_values"][0]

    class Chatty(Agent):
        async def reply(self, messages):
            if len(messages) == 2:
                return AgentReply(
                    format_tool_call("broadcast_message", content="anyone?") + format_tool_call("wait")
                )
            return AgentReply(format_tool_call("submit_result", answer=str(answer)))

    res = run_case(o, "bp", Chatty())
    assert res.success and res.rounds_executed == 2 and res.sent == [1] and res.received == [0]
    assert res.metrics["D_code"] == 0.0  # N = 1: D = m / (N (N - 1)) is defined as 0


def test_listed_and_merged_inputs_and_notes():
    case = generate_case("III-29", 3, seed=0)
    prompt = oracle_case(case)["agent_configs"][0]["user_prompt"]
    assert "Shard 2: " in prompt and "3 machines" in prompt and "over all 3 agents" in prompt
    c30 = generate_case("III-30", 3, seed=0)
    merged = merge_shards("III-30", [c["input_shard"] for c in c30["agent_configs"]])
    assert (
        merged["A_row_indices"] == [0, 1, 2]
        and merged["B_matrix"] == c30["agent_configs"][0]["input_shard"]["B_matrix"]
    )
    p30 = oracle_case(c30)["task_description"]
    assert "- B_matrix: the complete matrix B" in p30  # format notes of the data section are kept
    assert "(each edge is a pair [u, v])" in oracle_case(generate_case("III-23", 2))["task_description"]
    assert merge_shards("II-13", ["ab", "cba"]) == "abcba"
    assert read_oracle_input(generate_case("I-01", 2)["agent_configs"][0]["user_prompt"]) is None


def test_bad_cases_give_clear_errors():
    case = generate_case("I-01", 2)
    with pytest.raises(OracleError, match="already an oracle"):
        oracle_case(oracle_case(case))
    broken = json.loads(json.dumps(case))
    broken["task_description"] = "no placeholder here"
    with pytest.raises(OracleError, match=r"task_description.*input_shard"):
        oracle_case(broken)
    broken = json.loads(json.dumps(case))
    broken["expected_output"]["per_agent_values"][1] = 12345
    with pytest.raises(OracleError, match=r"per_agent_values\[1\] differs"):
        oracle_expected(broken)
    broken = json.loads(json.dumps(case))
    broken["agent_configs"] = broken["agent_configs"][:1]
    with pytest.raises(OracleError, match="N >= 2"):
        oracle_case(broken)
    c30 = generate_case("III-30", 2)
    shards = [c["input_shard"] for c in c30["agent_configs"]]
    shards[1] = {**shards[1], "B_matrix": [[0]]}
    with pytest.raises(OracleError, match="different B_matrix"):
        merge_shards("III-30", shards)
    with pytest.raises(OracleError, match="no merge rule"):
        merge_shards("I-01", [[1], {"a": 1}])
    with pytest.raises(OracleError, match=r"expected 'Shard 1:'"):
        read_oracle_input(
            "**Your Data (the WHOLE input, listed shard by shard):**\nShard 0: [1]\nShard 2: [2]"
        )


@settings(max_examples=40, deadline=None)
@given(
    task_id=st.sampled_from(["I-01", "I-06", "I-08", "II-11", "II-17", "II-19", "III-21", "III-22"]),
    data=st.lists(st.integers(0, 999), min_size=2, max_size=40),
    cuts=st.lists(st.integers(0, 40), min_size=1, max_size=6),
)
def test_merging_never_changes_the_answer(task_id, data, cuts):
    """solve over the k shards (global value, or slices concatenated) == solve over the merged input,
    for arbitrary (uneven, even empty-middle) partitions of the same global list."""
    if task_id == "II-19":
        data = sorted(data)
    bounds = sorted({min(c, len(data)) for c in cuts} | {0, len(data)})
    shards = [data[a:b] for a, b in pairwise(bounds)]
    shards = [s for s in shards if s] if task_id in ("I-01",) else shards
    if len(shards) < 2:
        shards = [data[:1], data[1:]]
    per_agent = solve(task_id, shards, "")
    whole = [x for p in per_agent for x in p] if task_id in SEGMENTED else per_agent[0]
    assert solve(task_id, [merge_shards(task_id, shards)], "")[0] == whole


# ------------------------------------------------------------------------------------------- RCC / Table 2


def _row(task, level, n, ok, *, oracle_of=None, protocol="bp", agent="m", seed=42):
    return {"task_id": task, "level": level, "num_agents": n, "oracle_of": oracle_of, "protocol": protocol,
            "agent": agent, "seed": seed, "success": ok}  # fmt: skip


def test_table2_on_hand_rows():
    rows = [
        # Level I, k = 2: oracle 2/2, multi 1/2 -> SR 100 / 50, RCC 0.5
        _row("I-01", 1, 2, True), _row("I-01", 1, 1, True, oracle_of=2),
        _row("I-02", 1, 2, False), _row("I-02", 1, 1, True, oracle_of=2),
        # Level II, k = 2: oracle 0/1 -> RCC undefined
        _row("II-11", 2, 2, True), _row("II-11", 2, 1, False, oracle_of=2),
        # Level I, k = 5: oracle 1/2, multi 0/2 -> RCC 1
        _row("I-01", 1, 5, False), _row("I-01", 1, 1, True, oracle_of=5),
        _row("I-02", 1, 5, False), _row("I-02", 1, 1, False, oracle_of=5),
        # unpaired: an oracle without its N = k row, and an N = k row without oracle -> ignored
        _row("I-03", 1, 1, False, oracle_of=2), _row("I-04", 1, 2, False),
    ]  # fmt: skip
    t2 = table2(rows)["m"]
    c = t2["Level I"]["2"]
    assert (c["SR_1"], c["SR_k"], c["pairs"]) == (100.0, 50.0, 2) and c["RCC"] == pytest.approx(0.5)
    assert c["RCC"] == relative_coordination_cost(50.0, 100.0) == relative_coordination_cost(0.5, 1.0)
    u = t2["Level II"]["2"]
    assert u["SR_1"] == 0.0 and u["RCC"] is None and u["RCC_note"] == RCC_UNDEFINED
    assert math.isnan(relative_coordination_cost(100.0, 0.0))
    assert t2["Level I"]["5"]["RCC"] == pytest.approx(1.0) and t2["Level I"]["5"]["SR_1"] == 50.0
    a = t2["All"]["2"]  # 3 pairs: oracle 2/3, multi 2/3 -> RCC 0
    assert a["pairs"] == 3 and a["SR_1"] == pytest.approx(200 / 3) and a["RCC"] == pytest.approx(0.0)
    assert "Level III" not in t2
    cols, body = table2_rows(table2(rows))
    assert cols == ["agent", "k", "Level I", "Level II", "All", "pairs"]
    assert body[0] == ["m", "2", "100.0 / 50.0 / 50.0%", "0.0 / 100.0 / undefined", "66.7 / 66.7 / 0.0%", "3"]
    assert body[1][:4] == ["m", "5", "50.0 / 0.0 / 100.0%", "-"]
    assert table2([r for r in rows if r["oracle_of"] is None]) == {}


def test_oracle_sweep_resumes_and_gives_rcc_zero_for_scripted(tmp_path):
    cfg = SweepConfig(out_dir=tmp_path / "run", tasks=list(TASK_IDS), agent_counts=[2, 5], protocols=["bp"],
                      oracle=True, save_cases=False, progress=False)  # fmt: skip
    s = run_sweep(cfg, [AgentSpec("scripted", ScriptedAgent)])
    assert s.total == 120 and s.ran == 120 and s.errors == 0
    rows = load_rows(tmp_path / "run" / "results.jsonl")
    oracle = [r for r in rows if r["oracle_of"] is not None]
    assert len(oracle) == 60 and all(r["num_agents"] == 1 and r["success"] for r in oracle)
    assert {r["oracle_of"] for r in oracle} == {2, 5} and len({row_key(r) for r in rows}) == 120
    again = run_sweep(cfg, [AgentSpec("scripted", ScriptedAgent)])
    assert again.skipped == 120 and again.ran == 0
    summary = write_report(tmp_path / "run", show=False, plots=False)
    assert summary["cases"] == 60 and summary["oracle_cases"] == 60
    assert summary["table1"]["scripted"]["Average"]["cases"] == 60  # oracles kept out of Table 1
    for level in ("Level I", "Level II", "Level III", "All"):
        for k in ("2", "5"):
            cell = summary["table2"]["scripted"][level][k]
            assert cell["SR_1"] == 100.0 and cell["SR_k"] == 100.0 and cell["RCC"] == 0.0


def test_cli_run_oracle_then_report_shows_table2(tmp_path):
    out = tmp_path / "run"
    runner = CliRunner()
    args = ["silo", "run", "--agent", "scripted", "--protocols", "bp", "--agents", "2", "--tasks", "I-01", "II-11",
            "--oracle", "--out", str(out)]  # fmt: skip
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    assert "4 cases in grid: 0 already done, 4 run, 0 errors" in r.output
    assert "of which 2 N = 1 oracle cases, success rate 1.000" in r.output
    csv_text = (out / "results.csv").read_text()
    assert csv_text.splitlines()[0].split(",")[3:5] == ["num_agents", "oracle_of"]
    assert (out / "cases" / "scripted" / "bp" / "II-11_n1_oracle2_s42" / "results.json").exists()
    r = runner.invoke(app, [*args, "--resume"])
    assert "4 already done, 0 run" in r.output
    r = runner.invoke(app, ["silo", "report", str(out), "--no-plots"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert "paper Table 2" in r.output and "100.0 / 100.0 / 0.0%" in r.output
    md = (out / "report.md").read_text()
    assert "## N = 1 oracle vs N = k (paper Table 2; scoring: default)" in md
    assert "| scripted | 2 | 100.0 / 100.0 / 0.0% | 100.0 / 100.0 / 0.0% | 100.0 / 100.0 / 0.0% | 2 |" in md
    rep = json.loads((out / "report.json").read_text())
    assert rep["table2"]["scripted"]["Level II"]["2"]["pairs"] == 1
