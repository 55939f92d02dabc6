"""One registry style across SILO-BENCH (tasks, solvers, agents, protocols, prompt sets, token
counters, scoring modes all `posttrain.utils.registry.Registry`), and the `hf:` token counter."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from posttrain.cli import app
from posttrain.utils.registry import Registry, UnknownNameError
from posttrain_lab.benchmarks.silo import TASK_IDS, generate_case
from posttrain_lab.benchmarks.silo.agents import AGENTS, AdversarialAgent, ScriptedAgent, make_agent
from posttrain_lab.benchmarks.silo.engine import (
    EngineConfig,
    load_tokenizer,
    resolve_token_counter,
    run_case,
    token_counters,
)
from posttrain_lab.benchmarks.silo.prompts import prompt_sets
from posttrain_lab.benchmarks.silo.protocols import canonical_protocol, protocols
from posttrain_lab.benchmarks.silo.runner import load_rows
from posttrain_lab.benchmarks.silo.scoring import SCORINGS
from posttrain_lab.benchmarks.silo.tasks._base import TASKS
from posttrain_lab.benchmarks.silo.tasks.solvers import SOLVERS


def test_every_silo_lookup_table_is_a_registry():
    for reg in (TASKS, SOLVERS, AGENTS, protocols, prompt_sets, token_counters, SCORINGS):
        assert isinstance(reg, Registry), reg
    assert TASKS.names() == sorted(TASK_IDS) and SOLVERS.names() == sorted(TASK_IDS)
    assert AGENTS.names() == ["adversarial", "hf", "openai", "scripted"]


def test_registry_lookups_and_errors():
    assert isinstance(AGENTS.get("scripted")(), ScriptedAgent)
    assert isinstance(make_agent("adversarial:never_submit"), AdversarialAgent)
    with pytest.raises(UnknownNameError, match="SILO-BENCH task 'I-99'"):
        TASKS.get("I-99")
    with pytest.raises(ValueError, match="unknown agent kind 'wizard'"):
        make_agent("wizard")
    with pytest.raises(ValueError, match="registered"):
        TASKS.register("I-01")(TASKS.get("I-01"))  # one name, one entry


@pytest.mark.parametrize(("name", "canon"), [("P2P", "p2p"), ("msg", "p2p"), (" BP ", "bp"), ("Sfs", "sfs")])
def test_protocol_names_are_case_insensitive(name, canon):
    assert canonical_protocol(name) == canon


def test_hf_token_counter_is_wired():
    """``token_counter="hf:<preset>"`` counts with that tokenizer (the tiny preset's character tokenizer:
    one token per character), for agents that report no usage."""
    text = "send_message(1, [3, 4])"
    count = resolve_token_counter("hf:tiny")
    assert count(text) == len(load_tokenizer("tiny")(text, add_special_tokens=False)["input_ids"])
    assert count(text) == len(text)
    cfg = EngineConfig(token_counter="hf:tiny")
    assert callable(cfg.token_counter)  # loaded once for the whole config
    res_hf = run_case(generate_case("I-01", 2), "bp", ScriptedAgent(), cfg)
    res_re = run_case(generate_case("I-01", 2), "bp", ScriptedAgent())
    assert res_hf.output_tokens == sum(count(t["reply"]) for t in res_hf.transcript)
    assert res_hf.output_tokens > res_re.output_tokens  # characters, not words
    with pytest.raises(ValueError, match="neither a model preset"):
        EngineConfig(token_counter="hf:/no/such/dir")
    with pytest.raises(ValueError, match="unknown token counter 'words'"):
        EngineConfig(token_counter="words")


def test_cli_token_counter(tmp_path):
    out = tmp_path / "run"
    args = ["silo", "run", "--agents", "2", "--tasks", "I-01", "--protocols", "bp", "--no-save-cases"]
    r = CliRunner().invoke(app, [*args, "--out", str(out), "--token-counter", "hf:tiny"])
    assert r.exit_code == 0, r.output
    assert load_rows(out / "results.jsonl")[0]["input_tokens"] > 0
    bad = tmp_path / "bad"
    r = CliRunner().invoke(app, [*args, "--out", str(bad), "--token-counter", "hf:/no/such/dir"])
    assert r.exit_code == 2 and "neither a model preset" in r.output and not bad.exists()


def test_scripted_answer_styles():
    """``scripted:python`` writes answers with str() (a dict / list of strings is then no JSON and
    scores 0 in both modes); ``scripted:int-bools`` answers I-04 with 1 / 0 (paper mode only)."""
    assert make_agent("scripted:python").name == "scripted:python"
    with pytest.raises(ValueError, match="answer style"):
        make_agent("scripted:yaml")
    i04, ii18 = generate_case("I-04", 2), generate_case("II-18", 2)
    py = make_agent("scripted:python")
    assert run_case(i04, "bp", py).success  # str(True) == "True", read as a bool by the parser
    assert not run_case(ii18, "bp", py).success
    assert not run_case(ii18, "bp", py, EngineConfig(scoring="paper")).success
    ib = make_agent("scripted:int-bools")
    assert not run_case(i04, "bp", ib).success
    assert run_case(i04, "bp", ib, EngineConfig(scoring="paper")).success
