"""Engine and protocol semantics on hand cases (the authors' engine and protocol tools; D counts; SFS last
writer; submitted agents)."""

from __future__ import annotations

import asyncio
import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain_lab.benchmarks.silo.agents.base import Agent, AgentReply
from posttrain_lab.benchmarks.silo.engine import (
    EngineConfig,
    SiloEngine,
    char_token_count,
    regex_token_count,
    run_case,
)
from posttrain_lab.benchmarks.silo.parsing import format_tool_call as tc
from posttrain_lab.benchmarks.silo.parsing import parse_tool_results
from posttrain_lab.benchmarks.silo.prompts import CORRECTIVE_MESSAGE, system_prompt

WAIT = tc("wait")


class Puppet(Agent):
    """Replies from a script {(agent_id, round): text}; default `default`. Records every call."""

    name = "puppet"

    def __init__(self, script: dict[tuple[int, int], str], default: str = WAIT, usage=None) -> None:
        self.script, self.default, self.usage = script, default, usage
        self.calls: list[tuple[int, int, list[dict]]] = []

    async def reply(self, messages):
        me = int(re.search(r"agent ID is:\s*(\d+)", messages[0]["content"]).group(1))
        rnd = 1 + sum(m["role"] == "assistant" for m in messages)
        self.calls.append((me, rnd, messages))
        return AgentReply(self.script.get((me, rnd), self.default), self.usage)


def results(res, agent: int, rnd: int) -> list:
    """Tool results of agent `agent`'s round-`rnd` reply, as (tool, result), from the transcript."""
    for row in res.transcript:
        if row["agent_id"] == agent and row["round"] == rnd:
            return [(x["tool"], x["result"]) for x in row["results"]]
    raise KeyError((agent, rnd))


def seen_results(agent: Puppet, who: int, rnd: int) -> list:
    """The same results as the agent saw them: parsed from the user message of its next call."""
    for me, r, msgs in agent.calls:
        if me == who and r == rnd + 1:
            return parse_tool_results(msgs[-1]["content"])
    raise KeyError((who, rnd))


def hand_case(n: int, expected=7, task_id: str = "I-01") -> dict:
    return {
        "case_id": f"{task_id}_hand",
        "agent_configs": [{"agent_id": i, "user_prompt": f"hand task, agent {i}"} for i in range(n)],
        "expected_output": {"per_agent_values": [expected] * n},
    }


def run(n, script, protocol="p2p", max_rounds=5, **kw):
    agent = Puppet(script, **{k: v for k, v in kw.items() if k in ("default", "usage")})
    cfg = EngineConfig(max_rounds=max_rounds, **{k: v for k, v in kw.items() if k in ("max_calls_per_turn",)})
    res = run_case(hand_case(n), protocol, agent, cfg)
    return agent, res


def test_p2p_round_lag_and_receive_never_returns_current_round():
    send = tc("send_message", target_id=1, content="hello")
    recv = tc("receive_messages")
    # agent 0 sends in round 1; agent 1 (applied after 0 in the same round) receives in rounds 1 and 2
    agent, res = run(2, {(0, 1): send + WAIT, (1, 1): recv + WAIT, (1, 2): recv + WAIT}, max_rounds=3)
    assert results(res, 1, 1)[0] == ("receive_messages", {"messages": []})
    assert results(res, 1, 2)[0] == (
        "receive_messages",
        {"messages": [{"from": 0, "content": "hello", "timestamp": 1}]},
    )
    assert results(res, 0, 1)[0] == ("send_message", {"success": True, "message": "Message sent to agent 1"})
    assert seen_results(agent, 1, 1) == results(res, 1, 1)  # the agent saw exactly the transcript's results
    # marked read: a later receive gets nothing
    assert res.metrics["D_code"] == pytest.approx(1 / 2)


def test_p2p_fifo_by_round_then_send_sequence():
    s = lambda c: tc("send_message", target_id=1, content=c)  # noqa: E731
    script = {
        (0, 1): s("a") + s("b") + WAIT,
        (2, 1): s("c") + WAIT,
        (0, 2): s("d") + WAIT,
        (2, 2): s("e") + WAIT,
        (1, 3): tc("receive_messages") + WAIT,
    }
    _agent, res = run(3, script, max_rounds=3)
    msgs = results(res, 1, 3)[0][1]["messages"]
    assert [(m["from"], m["content"], m["timestamp"]) for m in msgs] == [
        (0, "a", 1),
        (0, "b", 1),
        (2, "c", 1),
        (0, "d", 2),
        (2, "e", 2),
    ]
    assert res.metrics["D_code"] == pytest.approx(5 / 6)
    assert res.sent == [3, 0, 2] and res.received == [0, 5, 0]


def test_p2p_rejects_bad_targets():
    bad = [
        "<tool_call><tool>send_message</tool><parameters><target_id>5</target_id><content>x</content></parameters></tool_call>",
        tc("send_message", target_id=0, content="me"),
        tc("send_message", target_id=-1, content="x"),
        tc("send_message", target_id="abc", content="x"),
        tc("send_message", content="x"),
    ]
    _agent, res = run(2, {(0, 1): "".join(bad) + WAIT}, max_rounds=2)
    out = results(res, 0, 1)
    assert [r[1]["success"] for r in out[:5]] == [False] * 5
    assert "must be in [0, 1]" in out[0][1]["error"] and "yourself" in out[1][1]["error"]
    assert "target_id" in out[4][1]["error"]
    assert res.metrics["D_code"] == 0.0


def test_broadcast_semantics_and_density_variants():
    b = lambda c: tc("broadcast_message", content=c)  # noqa: E731
    recv = tc("receive_messages")
    script = {
        (0, 1): b("x0") + recv + WAIT,
        (1, 1): b("x1") + WAIT,
        (2, 1): tc("list_agents") + WAIT,
        (0, 2): recv + WAIT,
        (1, 2): recv + WAIT,
        (1, 3): recv + WAIT,
        (2, 3): recv + WAIT,
    }
    _agent, res = run(3, script, protocol="bp", max_rounds=3)
    assert results(res, 0, 1)[1] == ("receive_messages", {"messages": []})
    assert results(res, 0, 2)[0][1]["messages"] == [{"from": 1, "content": "x1", "timestamp": 1}]  # not own
    assert results(res, 1, 2)[0][1]["messages"] == [{"from": 0, "content": "x0", "timestamp": 1}]
    assert results(res, 1, 3)[0][1]["messages"] == []  # nothing new: no duplicates
    assert [m["from"] for m in results(res, 2, 3)[0][1]["messages"]] == [0, 1]
    assert results(res, 2, 1)[0] == ("list_agents", {"agent_ids": [0, 1, 2], "total": 3})
    assert res.metrics["D_code"] == pytest.approx(2 / 6)  # one per broadcast (code)
    assert res.metrics["D_bp_recipient_weighted"] == pytest.approx(2 * 2 / 6)


def test_sfs_lagged_reads_last_writer_wins_and_density():
    w = lambda p, c: tc("write_file", path=p, content=c)  # noqa: E731
    r = lambda p: tc("read_file", path=p)  # noqa: E731
    script = {
        (0, 1): w("k", "from0") + r("k") + WAIT,
        (1, 1): w("k", "from1") + w("only1", 5) + WAIT,
        (0, 2): w("k", "new0") + r("k") + tc("list_files") + WAIT,
        (1, 2): r("k") + r("only1") + WAIT,
        (0, 3): r("k") + tc("delete_file", path="only1") + tc("list_files", prefix="on") + WAIT,
        (1, 3): r("nope") + WAIT,
        (1, 4): tc("list_files") + WAIT,
    }
    _agent, res = run(2, script, protocol="sfs", max_rounds=4)
    assert results(res, 0, 1)[1] == ("read_file", {"success": False, "error": "Key not found: k"})
    # round 2: the state as of round 1, where agent 1 (higher index) won the same-key write
    k2 = results(res, 0, 2)[1][1]
    assert k2 == {"success": True, "content": "from1", "metadata": {"modified_by": 1, "modified_at_round": 1}}
    files = results(res, 0, 2)[2][1]["files"]
    assert files == [
        {"path": "k", "modified_by": 1, "modified_at_round": 1},
        {"path": "only1", "modified_by": 1, "modified_at_round": 1},
    ]
    assert results(res, 1, 2)[0][1]["content"] == "from1"  # agent 0's round-2 write not visible yet
    assert results(res, 0, 3)[0][1]["content"] == "new0"
    assert results(res, 0, 3)[2][1]["files"] == [{"path": "only1", "modified_by": 1, "modified_at_round": 1}]
    assert results(res, 1, 4)[0][1]["files"] == [{"path": "k", "modified_by": 0, "modified_at_round": 2}]
    # code D: round 1 -> keys {k, only1} (k counted once although two agents wrote it); round 2 -> {k}
    assert res.metrics["D_code"] == pytest.approx(3 / 2)
    # paper D: successful reads of another agent's file: (0,r2,k by 1), (1,r2,k by 1)? no: own file
    # reads of others: agent0 r2 k(by1), agent0 r3 k(by0: own, not counted), agent1 r2 k(by1: own), only1(own)
    assert res.metrics["D_paper"] == pytest.approx(1 / 2)


def test_turn_ends_at_first_wait_or_submit_and_later_calls_do_not_run():
    s = tc("send_message", target_id=1, content="late")
    agent, res = run(
        2,
        {(0, 1): tc("submit_result", answer=7) + s + tc("submit_result", answer=8), (1, 1): WAIT + s},
        max_rounds=3,
        default=tc("receive_messages") + WAIT,
    )
    assert res.answers[0] == 7 and res.submit_rounds[0] == 1
    assert res.metrics["D_code"] == 0.0  # neither send ran
    # submitted agent 0 is never called again; agent 1 is called every round and never submits
    assert sorted(r for a, r, _ in agent.calls if a == 0) == [1]
    assert sorted(r for a, r, _ in agent.calls if a == 1) == [1, 2, 3]
    assert res.answers[1] is None and res.correct == [True, False]
    assert res.metrics["S_success_rate"] == 0.5 and not res.success and res.rounds_executed == 3


def test_corrective_message_unknown_tool_and_missing_answer():
    _agent, res = run(
        2,
        {(0, 1): "I think the answer is 7", (1, 1): tc("fly") + tc("submit_result") + WAIT},
        max_rounds=2,
    )
    assert results(res, 0, 1) == [("system", {"error": CORRECTIVE_MESSAGE})]
    out = results(res, 1, 1)
    assert (
        out[0][0] == "fly" and "Unknown tool" in out[0][1]["error"] and "send_message" in out[0][1]["error"]
    )
    assert out[1] == ("submit_result", {"success": False, "error": "Missing parameter: answer"})
    assert out[2] == ("wait", {"status": "waiting"})


def test_all_submit_stops_early_and_results_json_shape(tmp_path):
    sub = tc("submit_result", answer=7)
    agent = Puppet({(0, 2): sub, (1, 1): sub})
    eng = SiloEngine(hand_case(2), "bp", agent, EngineConfig(max_rounds=50))
    res = asyncio.run(eng.run(transcript_path=tmp_path / "t.jsonl"))
    assert res.rounds_executed == 2 and res.success and res.submit_rounds == [2, 1]
    rows = [json.loads(x) for x in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert [(r["round"], r["agent_id"]) for r in rows] == [(1, 0), (1, 1), (2, 0)]
    assert rows[1]["calls"] == [{"tool": "submit_result", "params": {"answer": 7}}]
    assert rows[1]["results"] == [{"tool": "submit_result", "result": {"status": "submitted"}}]
    res.save(tmp_path / "case")
    doc = json.loads((tmp_path / "case" / "results.json").read_text())
    assert doc["submissions"] == [
        {"agent_id": 0, "answer": 7, "correct": True, "round": 2},
        {"agent_id": 1, "answer": 7, "correct": True, "round": 1},
    ]
    for k in ("S_success_rate", "P_partial_correctness", "C_code", "C_paper", "D_code", "D_paper",
              "C_token_consumption", "D_communication_density"):  # fmt: skip
        assert k in doc["metrics"]
    assert doc["success"] is True and doc["ground_truth"] == [7, 7]
    assert len((tmp_path / "case" / "transcript.jsonl").read_text().splitlines()) == 3


def test_token_accounting_incremental_equals_full_recount_and_usage_wins():
    script = {
        (0, 1): tc("send_message", target_id=1, content="a b c") + WAIT,
        (1, 2): tc("receive_messages") + WAIT,
    }
    agent, res = run(2, script, max_rounds=3)
    # recount every call's full context from scratch; must equal the engine's running sums
    exp_in = sum(sum(regex_token_count(m["content"]) for m in msgs) for _, _, msgs in agent.calls)
    assert res.input_tokens == exp_in
    rows = res.transcript
    assert sum(r["input_tokens"] for r in rows) == exp_in
    assert res.output_tokens == sum(regex_token_count(r["reply"]) for r in rows)
    assert res.metrics["C_code"] == pytest.approx((res.input_tokens + res.output_tokens) / 3)
    assert res.metrics["C_paper"] == pytest.approx(res.output_tokens / 3)  # R_max = 3
    # API usage replaces the counter when given
    _agent2, res2 = run(2, script, max_rounds=3, usage={"prompt_tokens": 100, "completion_tokens": 10})
    assert res2.input_tokens == 100 * 6 and res2.output_tokens == 10 * 6
    # a char counter
    res3 = run_case(hand_case(2), "p2p", Puppet(script), EngineConfig(max_rounds=1, token_counter="chars"))
    assert res3.output_tokens == len(script[(0, 1)]) + len(WAIT)
    assert char_token_count("ab c") == 4 and regex_token_count("max(a, b)=7") == 8


def test_call_cap_and_bad_case_errors():
    flood = "".join(tc("send_message", target_id=1, content=str(i)) for i in range(10))
    _agent, res = run(2, {(0, 1): flood}, max_rounds=1, max_calls_per_turn=3)
    out = results(res, 0, 1)
    assert len(out) == 4 and "limit of 3" in out[3][1]["error"]
    assert res.metrics["D_code"] == pytest.approx(3 / 2)
    with pytest.raises(ValueError, match="per_agent_values"):
        SiloEngine({"case_id": "I-01", "agent_configs": [{}], "expected_output": {}}, "p2p", Puppet({}))
    with pytest.raises(ValueError, match="unknown SILO protocol"):
        SiloEngine(hand_case(2), "smoke-signals", Puppet({}))
    with pytest.raises(ValueError, match="task id"):
        SiloEngine({**hand_case(2), "case_id": "weird"}, "p2p", Puppet({}))
    with pytest.raises(ValueError, match="max_rounds"):
        EngineConfig(max_rounds=0)


def test_prompt_sets_state_identity_and_tools():
    for proto, tools in {
        "p2p": ["send_message", "receive_messages"],
        "bp": ["broadcast_message", "receive_messages", "list_agents"],
        "sfs": ["list_files", "read_file", "write_file", "delete_file"],
    }.items():
        for ps in ("code", "paper"):
            text = system_prompt(proto, 3, 7, ps)
            assert "agent ID is: 3" in text and "IDs 0 to 6" in text
            for t in [*tools, "wait", "submit_result"]:
                assert f"**{t}**" in text
            assert "NEXT round" in text and "<tool_call>" in text
    assert "no single agent has enough information" in system_prompt("p2p", 0, 2, "paper")
    # the paper prompt set runs end to end too
    res = run_case(
        hand_case(2),
        "sfs",
        Puppet({}, default=tc("submit_result", answer=7)),
        EngineConfig(prompt_set="paper"),
    )
    assert res.success


@settings(max_examples=60, deadline=None)
@given(
    st.text(
        alphabet=st.sampled_from([*list("ab_Z09 ,.[]{}\"'\n\t\r\x00\x1f\x7f"), "é", "€", "🙂", "\u2028"]),
        max_size=60,
    )
)
def test_fast_token_count_matches_regex_definition(chunk):
    """The vectorised path for long texts counts exactly what the regex counts."""
    from posttrain_lab.benchmarks.silo.engine import _TOKEN_RE

    long_text = (chunk + " ") * (2100 // (len(chunk) + 1) + 1)
    assert len(long_text) >= 2048
    assert regex_token_count(long_text) == len(_TOKEN_RE.findall(long_text))
    assert regex_token_count(chunk) == len(_TOKEN_RE.findall(chunk))


def test_scaffolds_inject_notes_and_keep_token_sums_exact():
    from posttrain_lab.benchmarks.silo.prompts import PLANNING_NOTE, SCRATCHPAD_NOTE, reminder_note

    agent = Puppet({(1, 2): tc("submit_result", answer=7)}, default=WAIT)
    cfg = EngineConfig(max_rounds=3, scaffolds=("planning", "reminder", "scratchpad"))
    res = run_case(hand_case(2), "sfs", agent, cfg)
    first = agent.calls[0][2]
    assert first[1]["content"].count(PLANNING_NOTE) == 1 and SCRATCHPAD_NOTE in first[1]["content"]
    assert first[1]["content"].endswith("\n\n" + reminder_note("sfs"))
    later = next(msgs for a, r, msgs in agent.calls if a == 0 and r == 3)
    assert later[-1]["content"].startswith("<tool_result>") and "[Reminder]" in later[-1]["content"]
    assert [m["role"] for m in later] == ["system", "user", "assistant", "user", "assistant", "user"]
    exp_in = sum(sum(regex_token_count(m["content"]) for m in msgs) for _, _, msgs in agent.calls)
    assert res.input_tokens == exp_in
    with pytest.raises(ValueError, match="unknown scaffold"):
        EngineConfig(scaffolds=("telepathy",))
    with pytest.raises(ValueError, match="unknown prompt_set"):
        EngineConfig(prompt_set="poetry")
