"""SILO-BENCH task generators, independent ground truth, case files and dependency rules."""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain_lab.benchmarks.silo import (
    TASK_IDS,
    dependency_peers,
    generate_case,
    load_case,
    min_peers_needed,
    solve,
    task_info,
    task_level,
    write_cases,
)
from posttrain_lab.benchmarks.silo.metrics import partial_correctness, success_rate
from posttrain_lab.benchmarks.silo.tasks import case_to_json, generate_parity_suite
from posttrain_lab.benchmarks.silo.tasks._base import contiguous_shards, fill_prompt
from posttrain_lab.benchmarks.silo.tasks.level2 import (
    block_hash,
    life_step,
    longest_palindrome_length,
    pattern_count,
    trapped_water,
)
from posttrain_lab.benchmarks.silo.tasks.level3 import count_components, lpt_stats, pagerank_step

SEGMENTED = {"II-11", "II-14", "II-20", "III-21"}


def shards_of(case):
    return [a["input_shard"] for a in case["agent_configs"]]


def flat(shards):
    return [x for shard in shards for x in shard]


def expected_of(case):
    return case["expected_output"]["per_agent_values"]


# --------------------------------------------------------------------------------------- catalogue


def test_catalogue():
    assert len(TASK_IDS) == 30 and len(set(TASK_IDS)) == 30
    assert TASK_IDS[:2] == ["I-01", "I-02"] and TASK_IDS[9:11] == ["I-10", "II-11"]
    assert TASK_IDS[19:21] == ["II-20", "III-21"] and TASK_IDS[-1] == "III-30"
    assert [task_level(t) for t in TASK_IDS] == [1] * 10 + [2] * 10 + [3] * 10
    assert {t for t in TASK_IDS if task_info(t).is_segmented} == SEGMENTED
    kinds = {1: "star/tree", 2: "chain", 3: "all-to-all"}
    for t in TASK_IDS:
        info = task_info(t)
        assert info.task_id == t and info.name and info.leetcode_url.startswith("https://")
        assert info.topology_kind == kinds[info.level]
        assert info.paradigm == ["Paradigm I", "Paradigm II", "Paradigm III"][info.level - 1]
    assert task_info("I-01").leetcode_ref == "LC-414" and task_info("II-18").leetcode_ref == "LC-542"
    with pytest.raises(ValueError, match=r"unknown SILO-BENCH task 'IV-31'.*known: I-01"):
        task_info("IV-31")
    with pytest.raises(ValueError, match="unknown SILO-BENCH task"):
        task_level("i-01")


# ------------------------------------------------------------------------------ ground truth vs solve


@pytest.mark.parametrize("task_id", TASK_IDS)
def test_ground_truth_equals_independent_solver(task_id):
    for n in (2, 5, 10, 20):
        for seed in (0, 1, 7):
            case = generate_case(task_id, n, seed)
            expected = expected_of(case)
            assert len(expected) == n
            assert [a["expected_output"] for a in case["agent_configs"]] == expected
            # any agent's prompt carries the task parameters; use a different one each time
            prompt = case["agent_configs"][(seed + n) % n]["user_prompt"]
            assert solve(task_id, shards_of(case), prompt) == expected, (task_id, n, seed)
            if not task_info(task_id).is_segmented:
                assert all(v == expected[0] for v in expected)


@pytest.mark.parametrize("n", [50, 100])
def test_ground_truth_large_n(n):
    tasks = (
        TASK_IDS if n == 50 else ["I-07", "II-11", "II-13", "II-14", "II-18", "III-21", "III-25", "III-29"]
    )
    for task_id in tasks:
        case = generate_case(task_id, n, 3)
        assert solve(task_id, shards_of(case), case["agent_configs"][-1]["user_prompt"]) == expected_of(case)


def test_solver_sees_a_changed_shard():
    # the solver really reads the shards: raising one value above the maximum changes I-01's answer
    case = generate_case("I-01", 4, 5)
    shards = shards_of(case)
    shards[2][0] = 5000
    assert solve("I-01", shards, case["agent_configs"][0]["user_prompt"]) == [5000] * 4
    assert expected_of(case) != [5000] * 4


def test_solver_parses_parameters_from_prompt():
    case = generate_case("I-05", 3, 0)
    prompt = case["agent_configs"][0]["user_prompt"].replace("[100, 500]", "[0, 1000]")
    assert solve("I-05", shards_of(case), prompt) == [90] * 3  # every value is in [0, 1000]
    with pytest.raises(ValueError, match=r"solve\(III-25\): cannot find the initial centroids"):
        solve("III-25", shards_of(generate_case("III-25", 2, 0)), "no centroids here")
    with pytest.raises(ValueError, match="unknown SILO-BENCH task"):
        solve("X-1", [[1]], "")
    with pytest.raises(ValueError, match="non-empty list"):
        solve("I-01", [], "")


# ------------------------------------- reference values derived by hand from the task definitions


def test_reference_values_generator_functions():
    assert [sum(map(ord, f"Block_{i}_Data")) for i in range(3)] == [1107, 1108, 1109]
    h0 = block_hash(0, "Block_0_Data")
    h1 = block_hash(h0, "Block_1_Data")
    h2 = block_hash(h1, "Block_2_Data")
    assert (h0, h1, h2) == (1107, 7, 1106)
    assert life_step([0, 1, 1, 0, 1, 0, 0, 1]) == [1, 0, 0, 0, 1, 1, 1, 1]
    assert pattern_count("XAZBYYCABACDC") == 2
    ranks = pagerank_step(3, {0: [1, 2], 1: [2], 2: []})
    assert [round(r, 6) for r in ranks] == [0.05, 0.191667, 0.475]
    assert sum(ranks) < 1  # node 2 is dangling; its mass is not redistributed
    assert lpt_stats([60, 5, 3, 8, 55], 2) == {"variance": 0.25, "max_load": 66, "min_load": 65}


def test_reference_values_solvers():
    assert solve("II-20", [["Block_0_Data", "Block_1_Data"], ["Block_2_Data"]], "") == [[1107, 7], [1106]]
    assert solve("II-14", [[0, 1, 1, 0], [1, 0, 0, 1]], "Simulate ... for 1 steps.") == [
        [1, 0, 0, 0],
        [1, 1, 1, 1],
    ]
    assert solve("II-15", ["XAZBYYC", "ABACDC"], "") == [2, 2]
    prompt = "Total nodes: 3 ...\nwhere d = 0.85 (damping factor)"
    assert solve("III-28", [[[0, 1], [1, 2]], [[0, 2]]], prompt)[0] == {"0": 0.05, "1": 0.191667, "2": 0.475}
    heavy = [{"id": 0, "duration": 60}, {"id": 10, "duration": 55}]
    light = [{"id": 1, "duration": 5}, {"id": 2, "duration": 3}, {"id": 3, "duration": 8}]
    assert solve("III-29", [heavy, light], "")[1] == {"variance": 0.25, "max_load": 66, "min_load": 65}


def test_closed_form_small_cases():
    assert trapped_water([0, 1, 0, 2, 1, 0, 1, 3, 2, 1, 2, 1]) == 6  # LeetCode 42 example
    assert solve("II-16", [[0, 1, 0, 2, 1, 0], [1, 3, 2, 1, 2, 1]], "") == [6, 6]
    assert count_components(6, [[0, 1], [1, 2], [3, 4]]) == 3  # {0,1,2}, {3,4}, {5}
    assert solve("III-23", [[[0, 1], [1, 2]], [[3, 4]]], "Total nodes: 6") == [3, 3]
    bfs = solve("III-24", [[[0, 1], [1, 2]], [[3, 4]]], "Total nodes: 5")[0]
    assert bfs == {"0": 0, "1": 1, "2": 2, "3": -1, "4": -1}
    # II-18: chain 2 -> 0 -> 3 -> 1
    recs = [[{"id": 0, "next": 3}, {"id": 1, "next": -1}], [{"id": 2, "next": 0}, {"id": 3, "next": 1}]]
    assert solve("II-18", recs, "")[0] == {"2": 0, "0": 1, "3": 2, "1": 3}
    assert longest_palindrome_length("abacdfgdcaba") == 3 and solve("II-13", ["abacd", "fgdcaba"], "")[0] == 3
    assert solve("III-22", [[5, 1], [4, 2, 3]], "") == [3, 3]  # sorted [1..5][5 // 2]
    assert solve("III-30", [{"A_rows": [[1, 2]], "A_row_indices": [0], "B_matrix": [[1, 0], [2, 1]]},
                            {"A_rows": [[3, 4]], "A_row_indices": [1], "B_matrix": [[1, 0], [2, 1]]}], "")[0] == [
        [5, 2], [11, 4]
    ]  # fmt: skip
    km = "Initial centroids: [[0.0, 0.0], [10.0, 10.0], [50.0, 50.0]]\n"
    # (5, 5) is equidistant from centroids 0 and 1 -> lowest index; centroid 2 gets nothing and stays
    assert solve("III-25", [[[1.0, 1.0], [5.0, 5.0]], [[9.0, 9.0]]], km)[0] == [
        [3.0, 3.0],
        [9.0, 9.0],
        [50.0, 50.0],
    ]


def _brute_palindrome(s: str) -> int:
    return max(
        (j - i for i in range(len(s)) for j in range(i + 1, len(s) + 1) if s[i:j] == s[i:j][::-1]), default=0
    )


@settings(max_examples=150, deadline=None)
@given(st.text(alphabet="abc", max_size=30), st.integers(1, 4))
def test_palindrome_three_ways(text, parts):
    shards = contiguous_shards(text, parts) if len(text) >= parts else [text]
    assert longest_palindrome_length(text) == _brute_palindrome(text) == solve("II-13", shards, "")[0]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 1), min_size=1, max_size=40), st.integers(0, 6))
def test_life_list_vs_bitmask(cells, steps):
    ref = cells
    for _ in range(steps):
        ref = life_step(ref)
    got = solve("II-14", [cells], f"for {steps} steps")
    assert got == [ref]


@settings(max_examples=150, deadline=None)
@given(st.text(alphabet="ABCX", max_size=40))
def test_pattern_machine_vs_regex(text):
    assert pattern_count(text) == solve("II-15", [text], "")[0]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 10), max_size=40))
def test_rain_arrays_vs_two_pointers(heights):
    assert trapped_water(heights) == solve("II-16", [heights], "")[0]


@settings(max_examples=100, deadline=None)
@given(st.permutations(list(range(12))), st.randoms(use_true_random=False))
def test_list_ranking_pointer_jumping(order, r):
    nxt = {v: (order[i + 1] if i + 1 < len(order) else -1) for i, v in enumerate(order)}
    recs = [{"id": v, "next": w} for v, w in nxt.items()]
    r.shuffle(recs)
    ranks = solve("II-18", [recs[:5], recs[5:]], "")[0]
    assert ranks == {str(v): i for i, v in enumerate(order)}


@settings(max_examples=100, deadline=None)
@given(
    st.integers(1, 12).flatmap(
        lambda v: st.tuples(
            st.just(v), st.lists(st.tuples(st.integers(0, v - 1), st.integers(0, v - 1)), max_size=20)
        )
    )
)
def test_components_union_find_vs_bfs(graph):
    v, edges = graph
    edges = [[a, b] for a, b in edges if a != b]
    assert count_components(v, edges) == solve("III-23", [edges], f"Total nodes: {v}")[0]


# ----------------------------------------------------------------------------------- determinism


def test_deterministic_and_seed_sensitive():
    for task_id in TASK_IDS:
        a, b = generate_case(task_id, 5, 11), generate_case(task_id, 5, 11)
        assert case_to_json(a) == case_to_json(b)
        if task_id != "II-20":  # II-20's blocks are "Block_{i}_Data": no randomness at all
            assert shards_of(generate_case(task_id, 5, 12)) != shards_of(a), task_id
    assert shards_of(generate_case("II-20", 3, 1)) == shards_of(generate_case("II-20", 3, 2))


def test_global_random_state_untouched(tmp_path):
    random.seed(1234)
    before = random.getstate()
    for task_id in TASK_IDS:
        case = generate_case(task_id, 3)
        solve(task_id, shards_of(case), case["agent_configs"][0]["user_prompt"])
    write_cases(tmp_path, (2,), tasks=["I-01"])
    generate_parity_suite((2,))
    assert random.getstate() == before


def test_same_instance_in_a_fresh_process_with_another_hash_seed():
    code = (
        "import hashlib; from posttrain_lab.benchmarks.silo.tasks import generate_case, case_to_json;"
        "print(hashlib.sha256(''.join(case_to_json(generate_case(t, 4, 9)) for t in "
        "('I-08', 'II-18', 'III-27')).encode()).hexdigest())"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    here = "".join(case_to_json(generate_case(t, 4, 9)) for t in ("I-08", "II-18", "III-27"))
    assert out.stdout.strip() == hashlib.sha256(here.encode()).hexdigest()


def test_num_agents_and_seed_validation():
    for bad in (1, 0, -3):
        with pytest.raises(ValueError, match=r"num_agents must be >= 2"):
            generate_case("I-01", bad)
    for bad in (2.0, "2", True):
        with pytest.raises(ValueError, match="num_agents must be an integer"):
            generate_case("I-01", bad)
    with pytest.raises(ValueError, match="seed must be an integer"):
        generate_case("I-01", 2, seed="x")
    with pytest.raises(ValueError, match="unknown SILO-BENCH task 'Z'"):
        generate_case("Z", 2)


# ------------------------------------------------------------------------------ shards and schema

PER_AGENT = {"I-01": 20, "I-02": 30, "I-03": 25, "I-04": 15, "I-05": 30, "I-06": 20, "I-07": 25, "I-08": 30,
             "I-09": 30, "I-10": 30, "II-11": 15, "II-12": 15, "II-13": 15, "II-14": 10, "II-15": 20,
             "II-16": 10, "II-17": 15, "II-18": 8, "II-19": 15, "II-20": 5, "III-21": 20, "III-22": 25,
             "III-25": 20, "III-26": 30}  # fmt: skip


@pytest.mark.parametrize("n", [2, 3, 7])
def test_shard_sizes(n):
    for task_id, size in PER_AGENT.items():
        assert [len(s) for s in shards_of(generate_case(task_id, n, 4))] == [size] * n, task_id
    for task_id in ("III-23", "III-24", "III-28"):  # edge lists: chunk = E // N, last takes the remainder
        sizes = [len(s) for s in shards_of(generate_case(task_id, n, 4))]
        e = sum(sizes)
        assert sizes == [e // n] * (n - 1) + [e - (n - 1) * (e // n)], task_id
        assert all(
            len(edge) == 2 and edge[0] != edge[1]
            for s in shards_of(generate_case(task_id, n, 4))
            for edge in s
        )
    cf = shards_of(generate_case("III-27", n, 4))
    assert [len(s["users"]) + len(s["items"]) for s in cf] == [6] * n
    assert sorted(int(k) for s in cf for k in s["users"]) == list(range(3 * n))
    lb = shards_of(generate_case("III-29", n, 4))
    assert [t["id"] for t in lb[0]] == list(range(0, 20 * n, 10))
    assert all(50 <= t["duration"] <= 100 for t in lb[0])
    light = 18 * n // (n - 1)
    assert [len(s) for s in lb[1:]] == [light] * (n - 2) + [18 * n - light * (n - 2)]
    assert sorted(t["id"] for s in lb for t in s) == list(range(20 * n))
    mm = shards_of(generate_case("III-30", n, 4))
    assert [s["A_row_indices"] for s in mm] == [[i] for i in range(n)]
    assert all(s["B_matrix"] == mm[0]["B_matrix"] and len(s["A_rows"][0]) == n for s in mm)
    lr = shards_of(generate_case("II-18", n, 4))
    assert sorted(r["id"] for s in lr for r in s) == list(range(8 * n))
    nexts = [r["next"] for s in lr for r in s]
    assert nexts.count(-1) == 1 and len(set(nexts)) == 8 * n  # one tail, every other pointer distinct
    assert len(set(range(8 * n)) - set(nexts)) == 1  # exactly one head


def test_contiguous_rule_with_remainder():
    assert contiguous_shards(list(range(7)), 3) == [[0, 1], [2, 3], [4, 5, 6]]
    assert contiguous_shards("abcdefg", 2) == ["abc", "defg"]


def test_input_generation_facts():
    n = 4
    i02 = flat(shards_of(generate_case("I-02", n, 2)))
    assert all(i02[i] == "apple" for i in range(0, len(i02), 10))
    i03 = generate_case("I-03", n, 2)
    votes = flat(shards_of(i03))
    assert all(votes[i] == votes[0] for i in range(0, len(votes), 2)) and expected_of(i03)[0] == votes[0]
    assert any("racecar" in "".join(shards_of(generate_case("II-13", n, s))) for s in range(3))
    assert all("racecar" in "".join(shards_of(generate_case("II-13", n, s))) for s in range(5))
    i04 = [expected_of(generate_case("I-04", n, s))[0] for s in range(40)]
    assert 5 < sum(i04) < 35  # an ERROR line is planted with p = 0.5
    ii19 = flat(shards_of(generate_case("II-19", n, 2)))
    assert ii19 == sorted(ii19)
    ii16 = flat(shards_of(generate_case("II-16", n, 2)))
    assert all(ii16[i] <= 3 for i in range(1, len(ii16) - 1, 5))
    assert expected_of(generate_case("III-25", n, 2))[0].__len__() == 3
    assert len(expected_of(generate_case("II-12", n, 2))[0]) == 15 * n - 2
    assert len(expected_of(generate_case("II-17", n, 2))[0]) == 15 * n - 1
    assert expected_of(generate_case("III-21", n, 2)) == contiguous_shards(
        sorted(flat(shards_of(generate_case("III-21", n, 2)))), n
    )


def test_case_schema_and_json():
    for task_id in TASK_IDS:
        case = generate_case(task_id, 3, 8)
        assert json.loads(json.dumps(case)) == case  # JSON-native
        assert json.loads(case_to_json(case)) == case
        assert set(case) >= {"case_id", "case_name", "paradigm", "leetcode", "metadata", "task_description",
                             "agent_configs", "expected_output", "evaluation_metrics"}  # fmt: skip
        meta = case["metadata"]
        assert meta["num_agents"] == 3 and meta["output_type"] == "distributed"
        assert meta["is_segmented"] == case["expected_output"]["is_segmented"] == (task_id in SEGMENTED)
        assert meta["optimal_topology"] and meta["optimal_message_count"] and meta["theoretical_complexity"]
        exp = case["expected_output"]
        assert exp["type"] == "distributed" and "verification_logic" not in exp
        assert isinstance(exp["verification_logic_hint"], str) and exp["format_description"]
        assert "{input_shard}" in case["task_description"]
        for i, agent in enumerate(case["agent_configs"]):
            assert set(agent) == {
                "agent_id",
                "system_prompt",
                "user_prompt",
                "input_shard",
                "expected_output",
            }
            assert agent["agent_id"] == i
            prompt = agent["user_prompt"]
            for ph in ("{agent_id}", "{num_agents}", "{max_id}", "{input_shard}"):
                assert ph not in prompt, (task_id, ph)
            shard = agent["input_shard"]
            assert (shard if isinstance(shard, str) else json.dumps(shard)) in prompt
            assert "Topology:" in prompt and "submit_result(" in prompt
        value = exp["per_agent_values"][0]
        if isinstance(value, dict):
            assert all(isinstance(k, str) for k in value)
    assert "Star/Tree" in generate_case("I-06", 2)["agent_configs"][0]["user_prompt"]
    assert "Chain (0 → 1" in generate_case("II-20", 2)["agent_configs"][0]["user_prompt"]


def test_fill_prompt_is_plain_replacement():
    template = 'Agent {agent_id} of {num_agents} (max {max_id}) holds {input_shard}; example {"a": 1} {K}'
    out = fill_prompt(template, agent_id=2, num_agents=4, input_shard=[{"x": "{agent_id}"}])
    assert out == 'Agent 2 of 4 (max 3) holds [{"x": "{agent_id}"}]; example {"a": 1} {K}'
    assert fill_prompt("{input_shard}", agent_id=0, num_agents=2, input_shard="abc") == "abc"


# ------------------------------------------------------------------------------ files and loading


def test_write_and_load_round_trip(tmp_path):
    paths = write_cases(tmp_path, agent_counts=(2, 5), seed=3, tasks="II")
    assert [p.name for p in paths] == [f"{t}_n{n}.json" for n in (2, 5) for t in TASK_IDS[10:20]]
    assert not [p for p in tmp_path.iterdir() if p.suffix != ".json"]  # no temp files left behind
    for p in paths:
        case = load_case(p)
        task_id, n = p.stem.split("_n")
        assert case == generate_case(task_id, int(n), 3)
    assert [p.name for p in write_cases(tmp_path, (2,), tasks="I-01,III-30")] == [
        "I-01_n2.json",
        "III-30_n2.json",
    ]
    with pytest.raises(ValueError, match="num_agents must be >= 2"):
        write_cases(tmp_path, (1,))
    with pytest.raises(ValueError, match="unknown SILO-BENCH task 'IV'"):
        write_cases(tmp_path, (2,), tasks="IV")


def _authors_style(case):
    """What the authors' generator writes for the same case: an exec-able verification_logic string,
    Python-str shards in the prompt, no 'reference' / level keys."""
    out = json.loads(json.dumps(case))
    out["expected_output"]["verification_logic"] = "__import__('os').system('touch /tmp/silo_pwned')"
    out["leetcode"].pop("reference")
    for key in ("level", "topology_kind", "seed", "rng", "generator"):
        out["metadata"].pop(key)
    return out


def test_load_authors_file_and_baseline(tmp_path):
    case = generate_case("III-29", 3, 1)
    path = tmp_path / "III-29_n3.json"
    path.write_text(json.dumps(_authors_style(case)))
    loaded = load_case(path)
    assert loaded["expected_output"]["per_agent_values"] == expected_of(case)
    assert isinstance(loaded["expected_output"]["verification_logic"], str)  # kept as inert text
    assert not Path("/tmp/silo_pwned").exists()
    baseline = {"case_id": "I-01", "task_description": "find the max of [1, 5, 3]", "expected_output": 5}
    (tmp_path / "b.json").write_text(json.dumps(baseline))
    loaded = load_case(tmp_path / "b.json")
    assert loaded["expected_output"]["per_agent_values"] == [5] and loaded["metadata"]["num_agents"] == 1
    one = {"case_id": "I-01", "agent_configs": [{"agent_id": 0, "user_prompt": "p", "input_shard": [1]}],
           "expected_output": {"value": 1}}  # fmt: skip
    (tmp_path / "one.json").write_text(json.dumps(one))
    assert load_case(tmp_path / "one.json")["expected_output"]["per_agent_values"] == [{"value": 1}]


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda c: c.pop("case_id"), r"key 'case_id': expected a non-empty string, missing"),
        (lambda c: c.pop("expected_output"), r"key 'expected_output': expected the ground truth"),
        (lambda c: c["expected_output"]["per_agent_values"].pop(), r"per_agent_values': expected a list with one value per agent \(2\)"),
        (lambda c: c["agent_configs"][1].update(agent_id=5), r"agent_configs\[1\].agent_id': expected the integer 1"),
        (lambda c: c["agent_configs"][0].pop("user_prompt"), r"agent_configs\[0\].user_prompt': expected a string, missing"),
        (lambda c: c["agent_configs"][0].pop("input_shard"), r"agent_configs\[0\].input_shard'"),
        (lambda c: c.update(agent_configs="x"), r"key 'agent_configs': expected a list of agent objects"),
        (lambda c: c["metadata"].update(num_agents=7), r"'metadata.num_agents' is 7 but agent_configs has 2"),
        (lambda c: c["expected_output"].update(is_segmented="no"), r"is_segmented': expected a boolean"),
    ],
)  # fmt: skip
def test_load_errors_name_file_and_key(tmp_path, mutate, message):
    case = generate_case("I-02", 2, 0)
    mutate(case)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(case))
    with pytest.raises(ValueError, match=message) as err:
        load_case(path)
    assert str(path) in str(err.value)


def test_load_errors_file_level(tmp_path):
    (tmp_path / "torn.json").write_text('{"case_id": "I-01",\n "agent_configs": [')
    with pytest.raises(ValueError, match=r"torn.json: invalid JSON at line 2"):
        load_case(tmp_path / "torn.json")
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="expected a JSON object at the top level, got list"):
        load_case(tmp_path / "list.json")
    (tmp_path / "full.json").write_text('{"metadata": {}, "cases": []}')
    with pytest.raises(ValueError, match="combined benchmark file"):
        load_case(tmp_path / "full.json")
    with pytest.raises(ValueError, match="cannot read case file"):
        load_case(tmp_path / "missing.json")


# ------------------------------------------------------------------------------------ parity mode


def test_parity_mode_replays_one_stream(tmp_path):
    suite = generate_parity_suite((2, 5))
    assert list(suite)[:3] == [("I-01", 2), ("I-02", 2), ("I-03", 2)] and len(suite) == 60
    assert case_to_json(suite[("I-01", 2)]) != case_to_json(generate_case("I-01", 2, 42))
    rng = random.Random(42)
    first = generate_case("I-01", 2, 42, rng=rng)
    assert shards_of(first) == shards_of(suite[("I-01", 2)])
    # the authors' I-01 at N = 2 is the first draw of random.Random(42): 40 randint(-1000, 1000)
    r = random.Random(42)
    assert flat(shards_of(first)) == [r.randint(-1000, 1000) for _ in range(40)]
    for (task_id, _n), case in suite.items():
        assert solve(task_id, shards_of(case), case["agent_configs"][0]["user_prompt"]) == expected_of(case)
    paths = write_cases(tmp_path, (2,), tasks="I", parity=True)
    assert json.loads(paths[3].read_text())["metadata"]["parity_mode"] is True
    assert json.loads(paths[3].read_text()) == suite[("I-04", 2)]


# ------------------------------------------------------------------------- dependency rules


def test_dependency_rules():
    assert min_peers_needed("I-01", 5) == 4 and min_peers_needed("III-27", 10) == 9
    assert min_peers_needed("II-12", 6) == 5  # global answer of a chain task: everything, via the chain
    assert dependency_peers("II-11", 4, 0) == [] and dependency_peers("II-11", 4, 3) == [0, 1, 2]
    assert min_peers_needed("II-20", 4) == 0 and min_peers_needed("II-20", 4, agent_id=2) == 2
    assert dependency_peers("II-14", 5, 0) == [1] and dependency_peers("II-14", 5, 2) == [1, 3]
    assert min_peers_needed("II-14", 5) == 1 and min_peers_needed("II-14", 2) == 1
    assert dependency_peers("III-21", 3, 1) == [0, 2]
    with pytest.raises(ValueError, match=r"agent_id must be an integer in \[0, 2\]"):
        dependency_peers("I-01", 3, 3)
    with pytest.raises(ValueError, match="unknown SILO-BENCH task"):
        min_peers_needed("nope", 3)


def test_segmented_dependencies_match_the_data():
    # II-14: changing agent 0's shard changes agents 0 and 1 but never agent 3's answer (5 steps < 10 cells)
    case = generate_case("II-14", 4, 6)
    shards, prompt = shards_of(case), case["agent_configs"][0]["user_prompt"]
    flipped = [list(s) for s in shards]
    flipped[0] = [1 - b for b in flipped[0]]
    a, b = solve("II-14", shards, prompt), solve("II-14", flipped, prompt)
    assert a[3] == b[3] and a[2] == b[2] and (a[0], a[1]) != (b[0], b[1])


# ------------------------------------------------------------------- end to end (scripted agents)


@pytest.mark.parametrize("task_id", ["I-07", "II-11", "II-18", "III-25", "III-30"])
def test_end_to_end_scripted_agents(tmp_path, task_id):
    """Write a case, load it, let each scripted agent 'gather' every shard, solve from its own prompt and
    submit; score with the metrics. Then one agent submits a corrupted answer."""
    path = write_cases(tmp_path, (4,), seed=21, tasks=[task_id])[0]
    case = load_case(path)
    shards = [a["input_shard"] for a in case["agent_configs"]]
    answers = [solve(task_id, shards, a["user_prompt"])[a["agent_id"]] for a in case["agent_configs"]]
    expected = case["expected_output"]["per_agent_values"]
    level = task_level(task_id)
    assert success_rate(answers, expected) == 1.0 and partial_correctness(answers, expected, level) == 1.0
    answers[2] = None
    assert success_rate(answers, expected) == 0.75
