"""KPIG rewrites through an OpenAI-compatible endpoint, against a stub server (issue 41 item 9): the
training rewrites (a method's ``diversify`` endpoint) and the P-score's held-out rewrites
(``eval.p_score_endpoint``) are asked with different prompts and seeds, an answer that adds the other
split's rule wording falls back to its own split's rule, the method's training endpoint never writes
the held-out rows, and every method is scored on the same held-out rewrites."""

from __future__ import annotations

import json
import re
import threading

import pytest
from _chat_server import LoopbackServer, QuietHandler, send_json

from posttrain_lab.studies.cit.diversify import (
    HELDOUT_REWRITE_PROMPT,
    HELDOUT_RULES,
    REWRITE_PROMPT,
    TEMPLATES,
    TRAIN_RULES,
    EndpointRewriter,
    diversify,
    split_vocabulary,
)
from posttrain_lab.studies.cit.world import CONCRETE, HELDOUT_CONCRETE, make_task, make_world

TRAIN_HEAD = REWRITE_PROMPT.split("{", 1)[0]  # "Rewrite the instruction below with the '"
HELD_HEAD = HELDOUT_REWRITE_PROMPT.split("{", 1)[0]


def _answer_neutral(content: str) -> str:
    """A valid rewrite that adds only a word no rule set owns ("Kindly")."""
    instr = re.split(r"\n\n(?:Instruction|Original): ", content, maxsplit=1)[1]
    return f"Kindly: {instr}"


class _Stub(QuietHandler):
    answer = staticmethod(_answer_neutral)
    hits: list[dict] = []
    lock = threading.Lock()

    def do_POST(self):
        body = self.json_body()
        with type(self).lock:
            type(self).hits.append(body)
        text = type(self).answer(body["messages"][-1]["content"])
        out = json.dumps({"choices": [{"message": {"role": "assistant", "content": text}}]})
        send_json(self, 200, out.encode())


@pytest.fixture
def stub():
    _Stub.hits = []
    _Stub.answer = staticmethod(_answer_neutral)
    with LoopbackServer(_Stub) as srv:
        yield srv.url, _Stub


def _content(hit: dict) -> str:
    return hit["messages"][-1]["content"]


def _rows(task: str = "lookup_upper", n: int = 3):
    world = make_world(0, 20)
    return make_task(task, n, world=world, seed=0, split="test")


def test_training_and_heldout_rewrites_use_different_prompts_and_seeds(stub):
    url, handler = stub
    rw = EndpointRewriter(url, "m", seed=0, max_retries=0)
    exs = _rows()
    train = rw.rewrite(exs, "constraint", CONCRETE, TRAIN_RULES, seed="0-1")
    train_hits, handler.hits = handler.hits, []
    held = rw.rewrite(exs, "constraint", HELDOUT_CONCRETE, HELDOUT_RULES)
    held_hits = handler.hits
    assert rw.fallbacks == 0
    assert [x.instruction for x in train] == [x.instruction for x in held]  # the stub answers alike
    assert all(_content(h).startswith(TRAIN_HEAD) for h in train_hits)
    assert all(_content(h).startswith(HELD_HEAD) for h in held_hits)
    # the prompts differ beyond the instruction they carry
    strip = lambda h: _content(h).rsplit("\n\n", 1)[0]  # noqa: E731
    assert {strip(h) for h in train_hits}.isdisjoint({strip(h) for h in held_hits})
    seeds_train, seeds_held = {h["seed"] for h in train_hits}, {h["seed"] for h in held_hits}
    assert len(seeds_train) == len(seeds_held) == 1 and seeds_train != seeds_held
    # another stage's training rewrites are sampled with another seed
    handler.hits = []
    rw.rewrite(exs, "constraint", CONCRETE, TRAIN_RULES, seed="0-2")
    assert {h["seed"] for h in handler.hits}.isdisjoint(seeds_train | seeds_held)


def test_an_answer_with_the_other_splits_wording_falls_back_to_its_own_rule(stub):
    url, handler = stub
    assert {"tell", "step", "only"} <= split_vocabulary(HELDOUT_RULES)
    assert {"provide", "brief", "reflect"} <= split_vocabulary(TRAIN_RULES)
    exs = _rows()

    def other_split(content: str) -> str:
        instr = re.split(r"\n\n(?:Instruction|Original): ", content, maxsplit=1)[1]
        if content.startswith(HELD_HEAD):
            return f"Think step by step. {instr}"  # the training rules' reasoning cue
        return f"{instr} Be brief."  # the held-out rules' constraint

    handler.answer = staticmethod(other_split)
    rw = EndpointRewriter(url, "m", max_retries=0)
    held = rw.rewrite(exs, "reasoning", HELDOUT_CONCRETE, HELDOUT_RULES)
    assert [x.instruction for x in held] == [
        x.instruction
        for x in diversify(exs, ["reasoning"], concrete=HELDOUT_CONCRETE, rules=HELDOUT_RULES)["reasoning"]
    ]
    train = rw.rewrite(exs, "constraint", CONCRETE, TRAIN_RULES)
    assert all(x.instruction.endswith("Answer with one word only.") for x in train)
    assert rw.fallbacks == rw.crossed == 2 * len(exs)


def _cfg(tmp_path, url, **eval_kw):
    from posttrain_lab.studies.cit.runner import CITConfig

    return CITConfig(
        stream={"n_train": 8, "n_test": 3, "tasks": ["lookup", "format"], "heldout": ["lookup_upper"]},
        methods=[
            "sequential",
            {
                "name": "kpig",
                "replay": {"kind": "kpig"},
                "diversify": {"ratio": 1.0, "base_url": url, "model": "m"},
            },
        ],
        eval=eval_kw,
        out_dir=str(tmp_path / "cit"),
    )


def _instructions(sets):
    return {tmpl: {t: [x.instruction for x in exs] for t, exs in by.items()} for tmpl, by in sets.items()}


def test_the_methods_training_endpoint_never_writes_the_heldout_rows(stub, tmp_path):
    """A kpig arm with a diversify endpoint: its training rows are rewritten through it (training
    prompt); its P-score rows are the offline held-out rules, the same as the sequential arm's. Before,
    the held-out rows were asked from the same endpoint with the same prompt as the training rows."""
    from posttrain_lab.studies.cit.runner import StreamRun

    url, handler = stub
    cfg = _cfg(tmp_path, url)
    seq, kpig = (StreamRun(cfg, m, 0) for m in cfg.methods)
    div = kpig._diversified(1, kpig.train["lookup"])
    assert handler.hits and all(_content(h).startswith(TRAIN_HEAD) for h in handler.hits)
    assert all(x.instruction.startswith("Kindly") for x in div)
    handler.hits = []
    held = kpig.p_score_sets("heldout")
    assert not any(_content(h).startswith(TRAIN_HEAD) for h in handler.hits)
    assert _instructions(held) == _instructions(seq.p_score_sets("heldout"))
    rules = diversify(seq.test["lookup_upper"], TEMPLATES, concrete=HELDOUT_CONCRETE, rules=HELDOUT_RULES)
    assert _instructions(held) == {k: {"lookup_upper": [x.instruction for x in v]} for k, v in rules.items()}
    assert kpig.p_source() == seq.p_source() == {"kind": "rules"}


def test_the_p_score_endpoint_is_asked_once_with_the_heldout_prompt_for_every_method(stub, tmp_path):
    from posttrain_lab.studies.cit.runner import StreamRun

    url, handler = stub
    cfg = _cfg(tmp_path, url, p_score_endpoint={"base_url": url, "model": "judge", "seed": 3})
    seq, kpig = (StreamRun(cfg, m, 0) for m in cfg.methods)
    held = seq.p_score_sets("heldout")
    assert len(handler.hits) == len(TEMPLATES) * 3  # 4 templates x 3 held-out rows, once
    assert all(_content(h).startswith(HELD_HEAD) and h["model"] == "judge" for h in handler.hits)
    assert all(x.instruction.startswith("Kindly") for by in held.values() for exs in by.values() for x in exs)
    cache = json.loads((tmp_path / "cit" / "p_score_rewrites.json").read_text())
    assert cache["source"] == {"kind": "endpoint", "base_url": url, "model": "judge", "seed": 3}
    handler.hits = []
    again = kpig.p_score_sets("heldout")  # another method: the same rows, no new request
    assert handler.hits == [] and _instructions(again) == _instructions(held)
    for tmpl, by in again.items():
        for t, exs in by.items():
            for a, b in zip(kpig.test[t], exs, strict=True):
                assert (b.input, b.output, len(b.key_spans)) == (a.input, a.output, len(a.key_spans)), tmpl
    # the diagnostic with the training rules stays offline
    assert kpig.p_score_sets("train") == seq.p_score_sets("train") and handler.hits == []
    # another seed is another source: asked again
    cfg2 = _cfg(tmp_path, url, p_score_endpoint={"base_url": url, "model": "judge", "seed": 4})
    StreamRun(cfg2, cfg2.methods[0], 0).p_score_sets("heldout")
    assert len(handler.hits) == len(TEMPLATES) * 3


def test_cit_run_with_endpoints_end_to_end(stub, tmp_path):
    """``posttrain cit run`` with a kpig arm rewriting its training rows through the stub and the
    P-score through ``eval.p_score_endpoint``: both arms record the same source and P-score rows."""
    from typer.testing import CliRunner

    from posttrain.cli import app

    url, handler = stub
    out = tmp_path / "cit"
    args = [
        "sft.steps=2",
        "sft.batch_size=4",
        "stream.n_train=8",
        "stream.n_test=4",
        "stream.tasks=[lookup,format]",
        "stream.heldout=[lookup_upper]",
        "eval.max_new_tokens=4",
        f"methods=[sequential,{{name: kpig, replay: {{kind: kpig}}, diversify: {{ratio: 0.5, base_url: '{url}', model: m}}}}]",
        f"eval.p_score_endpoint={{base_url: '{url}', model: judge}}",
        f"out_dir={out}",
    ]
    r = CliRunner().invoke(app, ["cit", "run", *args])
    assert r.exit_code == 0, r.output
    train_hits = [h for h in handler.hits if _content(h).startswith(TRAIN_HEAD)]
    held_hits = [h for h in handler.hits if _content(h).startswith(HELD_HEAD)]
    assert len(train_hits) == 2 * 4  # two stages, half of 8 rows each
    assert len(held_hits) == len(TEMPLATES) * 4  # once for the whole study
    assert len(train_hits) + len(held_hits) == len(handler.hits)
    recs = [json.loads((out / m / "seed0" / "p_score.json").read_text()) for m in ("sequential", "kpig")]
    assert (
        recs[0]["source"]
        == recs[1]["source"]
        == {"kind": "endpoint", "base_url": url, "model": "judge", "seed": 0}
    )
    assert set(recs[0]["by_rewrite"]) == set(recs[1]["by_rewrite"]) == set(TEMPLATES)
