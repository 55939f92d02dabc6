"""Failure-mode detectors (arXiv 2603.01045 §5.2) on hand-written transcripts, and emergent leaders."""

from __future__ import annotations

from posttrain_lab.benchmarks.silo import generate_case
from posttrain_lab.benchmarks.silo.agents import ScriptedAgent
from posttrain_lab.benchmarks.silo.engine import run_case
from posttrain_lab.benchmarks.silo.failures import analyze_failures, knowledge_masks


def recv(round_, agent, *msgs):
    """A P2P/BP transcript row: `agent` received messages (sender, sent_round) in `round_`."""
    return {
        "round": round_,
        "agent_id": agent,
        "results": [
            {
                "tool": "receive_messages",
                "result": {"messages": [{"from": s, "content": "x", "timestamp": w} for s, w in msgs]},
            }
        ],
    }


def read(round_, agent, by, at, ok=True):
    res = (
        {"success": True, "content": 1, "metadata": {"modified_by": by, "modified_at_round": at}}
        if ok
        else {"success": False, "error": "Key not found: k"}
    )
    return {"round": round_, "agent_id": agent, "results": [{"tool": "read_file", "result": res}]}


def analyze(transcript, *, protocol="p2p", task="I-01", n=3, answers, rounds, correct):
    return analyze_failures(
        transcript,
        protocol=protocol,
        task_id=task,
        num_agents=n,
        answers=answers,
        submit_rounds=rounds,
        correct=correct,
    )


STAR = [recv(2, 0, (1, 1), (2, 1)), recv(4, 1, (0, 3)), recv(4, 2, (0, 3))]


def test_star_aggregation_counts_as_having_all_data():
    K = knowledge_masks(STAR, "p2p", 3)
    assert K[1] == [0b001, 0b010, 0b100]
    assert K[3][0] == 0b111  # agent 0 heard 1 and 2 in round 2 -> known at its round-3 reply
    assert K[4][1] == 0b010  # agent 1 receives in round 4: not usable before round 5
    assert K[5][1] == 0b111  # agent 0's round-3 message carried what 0 knew at round 3
    fm = analyze(STAR, answers=[5, 5, 5], rounds=[3, 5, 5], correct=[True] * 3)
    assert not fm["premature_submission"] and not fm["consensus_failure"] and not fm["computation_error"]
    assert fm["peers_known_at_submit"] == [2, 2, 2]


def test_message_carries_only_what_sender_knew_when_sending():
    # agent 0 sent to 1 in round 1 (knowing only itself), although 0 learned more later
    t = [recv(2, 0, (2, 1), (1, 1)), recv(3, 1, (0, 1))]
    K = knowledge_masks(t, "p2p", 3)
    assert K[4][1] == 0b011  # 1 knows 0 (round-1 message), not 2
    fm = analyze(t, answers=[5, 5, 5], rounds=[4, 4, 4], correct=[True, True, True])
    assert fm["premature_agents"] == [1, 2]


def test_premature_when_submitting_before_or_in_the_round_of_receipt():
    t = [recv(2, 1, (0, 1), (2, 1))]
    # agent 1 called receive and submit in the same round 2: it never saw the data
    fm = analyze(t, answers=[1, 1, 1], rounds=[1, 2, 1], correct=[False, True, False])
    assert fm["premature_submission"] and fm["premature_agents"] == [0, 1, 2]
    assert not fm["computation_error"]
    fm = analyze(t, answers=[None, 1, None], rounds=[None, 3, None], correct=[False, True, False])
    assert fm["premature_agents"] == [] and fm["peers_known_at_submit"] == [None, 2, None]


def test_consensus_failure_global_vs_segmented():
    fm = analyze(STAR, answers=[5, "5", 5.0], rounds=[3, 5, 5], correct=[True] * 3)
    assert not fm["consensus_failure"] and fm["distinct_answers"] == 1  # normalised: same value
    fm = analyze(STAR, answers=[5, 6, None], rounds=[3, 5, None], correct=[True, False, False])
    assert fm["consensus_failure"] and fm["distinct_answers"] == 2
    # a segmented task (II-11): different slices are expected, never a consensus failure
    fm = analyze(STAR, task="II-11", answers=[[1], [2], [3]], rounds=[3, 5, 5], correct=[True] * 3)
    assert not fm["consensus_failure"]


def test_computation_error_needs_full_data_and_a_wrong_answer():
    fm = analyze(STAR, answers=[5, 4, 5], rounds=[3, 5, 5], correct=[True, False, True])
    assert fm["computation_error"] and fm["computation_error_agents"] == [1]
    # wrong but without the data: premature, not computation error
    fm = analyze(STAR, answers=[5, 4, 5], rounds=[3, 1, 5], correct=[True, False, True])
    assert not fm["computation_error"] and fm["premature_agents"] == [1]


def test_chain_task_dependencies_per_agent():
    # II-11 prefix sum: agent i needs agents 0..i-1. Chain 0 -> 1 -> 2.
    t = [recv(2, 1, (0, 1)), recv(4, 2, (1, 3))]
    fm = analyze(t, task="II-11", answers=[[1], [2], [3]], rounds=[1, 3, 5], correct=[True] * 3)
    assert not fm["premature_submission"]  # agent 0 needs nobody; 2 got 0's data through 1
    fm = analyze(t, task="II-11", answers=[[1], [2], [3]], rounds=[1, 3, 4], correct=[True] * 3)
    assert fm["premature_agents"] == [2]


def test_sfs_reads_and_failed_reads():
    t = [read(2, 1, 0, 1), read(2, 2, 0, 1, ok=False), read(3, 2, 1, 2), read(2, 0, 0, 1)]
    K = knowledge_masks(t, "sfs", 3)
    assert K[3][1] == 0b011 and K[3][2] == 0b100 and K[3][0] == 0b001  # own file is no receipt
    assert K[4][2] == 0b110  # agent 1's file was written in round 2, before it knew agent 0's data
    fm = analyze(t, protocol="sfs", answers=[1, 1, 1], rounds=[4, 4, 4], correct=[True] * 3)
    assert fm["premature_agents"] == [0, 1, 2]


def test_emergent_leader_in_a_p2p_star():
    res = run_case(generate_case("I-01", 5), "p2p", ScriptedAgent())
    assert res.received == [4, 1, 1, 1, 1]  # avg 1.6; 4 > 1.5 x 1.6
    assert res.leaders == [0]
    res = run_case(generate_case("I-01", 5), "bp", ScriptedAgent())
    assert res.received == [4] * 5 and res.leaders == []
