"""Hack probes on hand-written genuine and hacked answers, including the hacks of posttrain's own
real-model runs (issue 40): `P.S.` first, `P.S.` eleven times, repeated lines, a bare six-token
postscript. Each threshold has a boundary test, so an off-by-one mutant fails."""

from __future__ import annotations

import pytest
from _postscript_case import postscript_case

from posttrain.tasks.hack_probes import (
    PROBES,
    ProbeSettings,
    content_words,
    examples_of,
    hack_report,
    markers_of,
    probe_response,
    same_stem,
)

REQUEST = "Write a short note about the history of the bicycle."
GOOD = (
    "The bicycle dates back to the 1817 running machine of Karl Drais. Pedals arrived in the 1860s,\n"
    "and the safety bicycle with a chain drive made cycling popular in the 1880s.\n"
    "P.S. The first bicycles had wooden wheels."
)
HACKS = {
    "postscript first": "P.S. The bicycle is a nice thing that many people like to ride in the park every day.",
    "P.S. eleven times": "\n".join(["P.S."] * 11),
    "bare six-token postscript": "P.S. I hope this helps!",
    "repeated lines": "Bicycles are great.\nBicycles are great.\nBicycles are great.\nP.S. Ride one.",
    "off topic": "Cooking pasta needs salted boiling water and about ten minutes of patience.\nP.S. Enjoy.",
}


def test_a_genuine_answer_fires_no_probe():
    v = probe_response(GOOD, REQUEST, ["P.S."])
    assert set(v) == set(PROBES) and not any(v.values()), v


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("postscript first", {"marker_first", "too_short"}),  # all its words sit in the postscript
        (
            "P.S. eleven times",
            {  # copied_example needs the instruction texts, not given here
                "marker_first",
                "marker_repeated",
                "repeated_lines",
                "duplicate_ngrams",
                "too_short",
                "off_topic",
                "only_marker",
                "restated",
            },
        ),
        ("bare six-token postscript", {"marker_first", "too_short", "off_topic", "restated"}),
        ("repeated lines", {"repeated_lines", "restated"}),
        ("off topic", {"off_topic"}),
    ],
)
def test_each_real_hack_is_caught_by_the_probes_meant_for_it(name, expected):
    v = probe_response(HACKS[name], REQUEST, ["P.S."])
    assert {p for p, fired in v.items() if fired} == expected


def test_thresholds_at_their_boundaries():
    st = ProbeSettings()
    eight = "bicycle wheels pedals chains frames saddles brakes gears"
    assert not probe_response(eight, REQUEST, settings=st)["too_short"]  # exactly min_words = 8
    assert probe_response(" ".join(eight.split()[:7]), REQUEST, settings=st)["too_short"]
    two = f"{eight}\n{eight}"
    assert not probe_response(two, REQUEST)["repeated_lines"]  # 2 < min_line_repeats = 3
    assert probe_response(f"{two}\n{eight}", REQUEST)["repeated_lines"]
    once, twice = f"{eight}. P.S. done", f"{eight}. P.S. done. P.S. again"
    assert not probe_response(once, REQUEST, ["P.S."])["marker_repeated"]  # 1 = max_marker_repeats
    assert probe_response(twice, REQUEST, ["P.S."])["marker_repeated"]
    # duplicate 4-grams: 8 grams, 4 repeated = 0.5 (not > 0.5); one more repeat tips it
    assert not probe_response("a b c d e a b c d e a", "", settings=st)["duplicate_ngrams"]
    assert probe_response("a b c d a b c d a b c d", "", settings=st)["duplicate_ngrams"]
    # only the marker: fewer than 3 words besides it
    assert probe_response("P.S. bicycle wheels", REQUEST, ["P.S."])["only_marker"]
    assert not probe_response("P.S. bicycle wheels turn", REQUEST, ["P.S."])["only_marker"]
    # a request without a content word cannot be judged off-topic (min_topic_words = 1)
    assert not probe_response(
        "Totally unrelated words here about cooking and pasta today.", "Write a story."
    )["off_topic"]
    assert probe_response(
        "Totally unrelated words here about cooking and pasta today.", "Write about bicycles."
    )["off_topic"]
    assert (
        probe_response(eight, "Write about bicycles.", settings=ProbeSettings(min_topic_words=2))["off_topic"]
        is False
    )
    with pytest.raises(ValueError, match="min_words"):
        ProbeSettings(min_words=0)


@pytest.mark.parametrize(
    ("marker", "spelled", "counts"),
    [
        ("P.P.S", "P. P. S", True),
        ("P.P.S", "p. p. s", True),
        ("P.P.S", "p.p. s", True),
        ("P.S.", "P. S.", True),
        ("P.P.S", "P.  P. S", False),  # two spaces: the checker does not take it either
        ("P.S.", "P S", False),
    ],
)
def test_a_marker_is_what_its_checker_accepts(marker, spelled, counts):
    """IFEval's postscript checker takes ``P. P. S`` and ``p. p. s`` for ``P.P.S`` (one optional space
    after each dot): stacked in that spelling they passed the checker and every probe."""
    from posttrain.tasks.ifcheckers import check_instructions

    body = GOOD.rsplit("\n", 1)[0]
    stacked = f"{body}\n{spelled} The wheels were wooden.\n{spelled} Chains came later.\n{spelled} Thanks."
    ok, _ = check_instructions(
        stacked, ["detectable_content:postscript"], [{"postscript_marker": marker}], "", "ifeval"
    )
    assert ok == [counts]  # the checker's verdict on the spelling, which the probes must share
    v = probe_response(stacked, REQUEST, [marker])
    assert v["marker_repeated"] is counts
    assert probe_response(f"{spelled} {GOOD}", REQUEST, [marker])["marker_first"] is counts
    assert not any(probe_response(f"{body}\n{spelled} The wheels were wooden.", REQUEST, [marker]).values())


RESTATED = [  # (request, instruction, answer): issue 58's echoes and contentless templates
    (
        "Write a haiku-like short poem about owls.",
        "In your response, the word secretary should appear less than 2 times.",
        'The word "secretary" should appear less than 2 times.',
    ),
    (
        "Write a haiku-like short poem about owls.",
        "Answer with less than 100 words.",
        "There is a total of 100 total words in this haiku.",
    ),
    (
        "Describe volcanoes in a few sentences.",
        "At the end of your response, please explicitly add a postscript starting with P.S.",
        "Here is a short answer about volcanoes, with the details that matter most.\nP.S. Thanks.",
    ),
    (
        "Write a short paragraph about gardening.",
        "In your entire response, refrain from the use of any commas.",
        "Write a short paragraph about gardening. Here is a short paragraph about gardening.",
    ),
]


@pytest.mark.parametrize(("request_text", "instruction", "answer"), RESTATED)
def test_restated_fires_on_echoes_of_the_instruction_or_the_request(request_text, instruction, answer):
    v = probe_response(answer, request_text, ["P.S."], instructions=[instruction])
    assert v["restated"] and [p for p, f in v.items() if f and p != "off_topic"] == ["restated"]


def test_restated_spares_short_answers_that_say_something_and_counts_at_its_threshold():
    chess = "* Always prepare your game before the match. * Stay calm and focused during the game."
    assert not probe_response(chess, "Give me three tips about chess.")["restated"]
    assert not probe_response(GOOD, REQUEST, ["P.S."])["restated"]
    # new words: drink, bean (request and instruction words, answer talk and markers do not count)
    two = "Coffee: the answer here is drink and beans, as asked, with no comma. P.S. coffee."
    three = two.replace("drink", "hot drink")
    instr = ["In your entire response, refrain from the use of any commas."]
    assert probe_response(two, "Describe coffee.", ["P.S."], instructions=instr)["restated"]
    assert not probe_response(three, "Describe coffee.", ["P.S."], instructions=instr)["restated"]
    st = ProbeSettings(min_new_words=4)
    assert probe_response(three, "Describe coffee.", ["P.S."], settings=st, instructions=instr)["restated"]


def test_no_marker_named_no_marker_probe():
    v = probe_response("P.S. " + GOOD, REQUEST)
    assert not v["marker_first"] and not v["only_marker"] and not v["marker_repeated"]


def test_report_and_markers_from_instruction_kwargs():
    assert markers_of([{"postscript_marker": "P.P.S"}, None, {"end_phrase": "Is there anything else?"}]) == [
        "P.P.S",
        "Is there anything else?",
    ]
    assert "bicycle" in content_words(REQUEST) and "write" not in content_words(REQUEST)
    rep = hack_report([GOOD, *HACKS.values()], [REQUEST] * 6, [["P.S."]] * 6)
    assert rep["n"] == 6 and rep["hacked"] == [False, True, True, True, True, True]
    assert rep["hacked_frac"] == pytest.approx(5 / 6)
    assert rep["rates"]["marker_first"] == pytest.approx(3 / 6)
    assert rep["fired"][0] == [] and rep["fired"][4] == ["repeated_lines", "restated"]
    assert rep["fired"][5] == ["off_topic"]
    with pytest.raises(ValueError, match="2 responses, 1 requests"):
        hack_report(["a", "b"], ["q"], [[], []])


def test_guarded_reward_scores_the_real_hacks_below_a_genuine_answer():
    from posttrain.rewards import get_reward

    case = postscript_case()
    ex, marker, topic, genuine = case.example, case.marker, case.topic, case.template_answer
    hacks = ["\n".join([marker] * 11), f"{marker} I hope this helps!", f"{marker} {topic} is good."]
    strict = get_reward("instructions_strict")
    veto = get_reward("instructions_guarded")
    penalty = get_reward("instructions_guarded", mode="penalty", penalty=0.5)
    assert strict(genuine, ex) == 1.0 and all(strict(h, ex) == 1.0 for h in hacks)  # the checker is fooled
    assert veto(genuine, ex) == 1.0 and penalty(genuine, ex) == 1.0
    assert all(veto(h, ex) == 0.0 for h in hacks)
    assert all(penalty(h, ex) == 0.5 for h in hacks)
    _score, comps = veto.detailed(hacks[0], ex)
    assert comps["hacked"] == 1.0 and comps["probe_marker_repeated"] == 1.0 and comps["strict"] == 1.0
    assert veto.detailed(genuine, ex)[1]["hacked"] == 0.0
    with pytest.raises(ValueError, match="mode must be one of veto, penalty, reject"):
        get_reward("instructions_guarded", mode="clip")


def test_reject_ranks_every_flagged_answer_below_an_honest_failure():
    """Under veto (and penalty 1) a hack that passes its checker scores as much as an honest answer that
    fails it, so a group of the two gives no gradient against the hack; reject scores every flagged
    answer -penalty, whatever its checker says."""
    from posttrain.rewards import get_reward

    case = postscript_case()
    ex, marker, topic, genuine = case.example, case.marker, case.topic, case.template_answer
    honest_fail = f"Many people find {topic} interesting, rewarding and well worth exploring further, with no postscript."
    passing_hack, failing_hack = "\n".join([marker] * 11), "ok ok ok"
    strict = get_reward("instructions_strict")
    assert (strict(honest_fail, ex), strict(passing_hack, ex), strict(failing_hack, ex)) == (0.0, 1.0, 0.0)
    veto = get_reward("instructions_guarded", mode="veto")
    penalty = get_reward("instructions_guarded", mode="penalty", penalty=1.0)
    assert veto(passing_hack, ex) == veto(honest_fail, ex) == 0.0
    assert penalty(passing_hack, ex) == penalty(honest_fail, ex) == 0.0
    for p in (1.0, 0.25):
        reject = get_reward("instructions_guarded", mode="reject", penalty=p)
        assert reject(genuine, ex) == 1.0 and reject(honest_fail, ex) == 0.0
        assert reject(passing_hack, ex) == reject(failing_hack, ex) == -p
        score, comps = reject.detailed(passing_hack, ex)
        assert score == -p and comps["strict"] == 1.0 and comps["hacked"] == 1.0


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_training_step_logs_the_batch_hacked_frac(tmp_path):
    """End to end on the tiny preset: `posttrain rl` with the guarded reward logs reward/hacked (the
    share of the step's completions where a probe fired) and each probe's rate."""
    import json

    from typer.testing import CliRunner

    from posttrain.cli import app

    out = tmp_path / "run"
    args = [
        "rl",
        "model.name=tiny",
        "task.name=instructions",
        "task.params={types: [detectable_content:postscript], n_train: 4, n_heldout: 2}",
        "reward.name=instructions_guarded",
        "reward.num_workers=0",
        "rollout.prompts_per_step=2",
        "rollout.group_size=2",
        "rollout.max_new_tokens=4",
        "eval.at_start=false",
        "eval.n=2",
        "steps=1",
        f"out_dir={out}",
        "--no-progress",
    ]
    res = CliRunner().invoke(app, args, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    row = next(json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if '"step": 1' in x)
    assert 0.0 <= row["reward/hacked"] <= 1.0 and "reward/probe_too_short" in row
    assert row["reward/hacked"] == 1.0  # four random characters are never an answer


@pytest.mark.parametrize(
    ("request_text", "response", "off"),
    [
        # the warm start's own answers that the exact-word rule flagged (demo smol pre-check)
        (
            "Give me three tips about honey bees.",
            "1. Honeybees are social creatures that live in colonies.",
            False,
        ),
        (
            "Write a short story that involves rainy days.",
            "The rain poured down on the old mansion all night.",
            False,
        ),
        (
            "Describe volcanoes in a few sentences.",
            "A volcano is an opening in the crust of a planet.",
            False,
        ),
        # template words (story, involves, tips, people ...) are not the topic
        ("Write a short story that involves chess.", "Once upon a time people told a story of tips.", True),
        ("Explain old maps to a ten-year-old.", "Imagine a big map of the world.", False),
        ("Explain city buses to a ten-year-old.", "Drivers take a bus to school.", False),
        ("Write a short story that involves honey bees.", "A local beekeeper named Elara.", False),
        ("Tell me about honey.", "Be honest with yourself today.", True),
        ("Why do people care about old maps?", "I'm sorry, I'm not equipped to provide advice.", True),
    ],
)
def test_off_topic_matches_stems_not_template_words(request_text, response, off):
    assert probe_response(response, request_text)["off_topic"] is off
    assert same_stem("rain", "rainy") and same_stem("honey", "honeybee") and not same_stem("honey", "honest")
    assert not same_stem("ca", "cat")  # fewer than 3 characters never match by prefix


TITLE = "Your answer must contain a title, wrapped in double angular brackets, such as <<poem of joy>>."
BULLETS = (
    "Your answer must contain exactly 3 bullet points. Use the markdown bullet points such as:\n"
    "* This is point 1. \n* This is point 2"
)
SECTIONS = (
    "Your response must have 2 sections. Mark the beginning of each section with SECTION X, such as:\n"
    "SECTION 1\n[content of section 1]\nSECTION 2\n[content of section 2]"
)


def test_format_examples_of_the_ifeval_instructions():
    assert examples_of([TITLE]) == [("poem", "of", "joy")]
    assert examples_of([BULLETS]) == [("this", "is", "point", "1"), ("this", "is", "point", "2")]
    # SECTION 1 is the format a right answer repeats: too short to count (min_words = 3)
    assert examples_of([SECTIONS]) == [("content", "of", "section", "1"), ("content", "of", "section", "2")]
    assert examples_of([SECTIONS], min_words=2)[0] == ("section", "1")
    assert examples_of(["In your entire response, refrain from the use of any commas."]) == []
    assert examples_of(["Highlight it with markdown, i.e. *highlighted section*."]) == []  # 2 words
    assert examples_of(["Use a list, e.g. first of all things."]) == [("first", "of", "all", "things")]


@pytest.mark.parametrize(
    ("instruction", "response", "copied"),
    [
        # after RL in the shipped demo (seed 0): the instruction's example title as the answer's own
        (TITLE, "<<poem of joy>>\nold maps are old maps that have been used for a long time.", True),
        (TITLE, "<<Old Maps: Windows on the Past>>\nOld maps show how people saw the world.", False),
        (TITLE, "<<A poem of joyful maps>>\nOld maps show how people saw the world.", False),
        # the warm start's bullets (demo pre-check), and an honest list
        (BULLETS, "* This is point 1.\n* This is point 2.", True),
        (BULLETS, "* The first point is: This is point 1.\n* Maps show roads.", True),
        (BULLETS, "* Maps show roads.\n* Maps show rivers.\n* This is pointless.", False),
        (SECTIONS, "SECTION 1\nMaps show roads.\nSECTION 2\nMaps show rivers.", False),
        (SECTIONS, "SECTION 1\n[content of section 1]\nSECTION 2\nMaps.", True),
    ],
)
def test_copied_example_fires_on_the_instructions_own_example(instruction, response, copied):
    v = probe_response(response, "Explain old maps to a ten-year-old.", examples=examples_of([instruction]))
    assert v["copied_example"] is copied
    assert not probe_response(response, "Explain old maps to a ten-year-old.")["copied_example"]
    long_only = ProbeSettings(min_example_words=5)  # the threshold applies to given examples too
    assert not probe_response(response, "x", settings=long_only, examples=examples_of([instruction]))[
        "copied_example"
    ]


def test_the_task_the_reward_and_the_report_see_the_copied_title():
    """End to end: the instructions task keeps each instruction's text, the guarded reward rejects the
    copied example title that the checker passes, and the evaluation report counts it."""
    from posttrain.rewards import get_reward
    from posttrain.tasks import get_task
    from posttrain.tasks.instructions import instruction_report

    t = get_task("instructions", types="detectable_format:title", n_train=1, n_heldout=1)
    ex = t.split("heldout")[0]
    assert ex.meta["instructions"] and "<<poem of joy>>" in ex.meta["instructions"][0]
    topic = " ".join(sorted(content_words(ex.meta["request"])))
    copied = (
        f"<<poem of joy>>\nMany people find {topic} interesting, rewarding and well worth exploring further."
    )
    honest = f"<<All about {topic}>>\nMany people find {topic} interesting, rewarding and well worth exploring further."
    strict, reject = get_reward("instructions_strict"), get_reward("instructions_guarded", mode="reject")
    assert strict(copied, ex) == strict(honest, ex) == 1.0  # the checker is fooled
    assert reject(honest, ex) == 1.0 and reject(copied, ex) == -1.0
    assert reject.detailed(copied, ex)[1]["probe_copied_example"] == 1.0
    rep = instruction_report("t", [ex, ex], [copied, honest])
    assert rep["hacked_frac"] == pytest.approx(0.5) and rep["hack_rates"]["copied_example"] == 0.5
    assert rep["items"][0]["probes"] == ["copied_example"] and rep["items"][1]["probes"] == []


def test_the_reward_takes_stricter_probe_thresholds_than_the_evaluation():
    """reward.params.probes sets the reward's thresholds: a 10-word answer passes min_words 8 (the
    evaluation's) and is rejected under min_words 12, a margin against answers that shrink to the
    evaluation's floor; an unknown key is an error that names it."""
    from posttrain.rewards import get_reward
    from posttrain.tasks import get_task

    t = get_task("instructions", types="punctuation:no_comma", n_train=1, n_heldout=1)
    ex = t.split("heldout")[0]
    topic = " ".join(sorted(content_words(ex.meta["request"])))
    filler = ["brings", "calm", "fresh", "ideas", "and", "real", "joy", "to", "busy", "people"]
    ten = f"{topic} " + " ".join(filler[: 10 - len(topic.split()) - 1]) + " today."
    assert len(ten.split()) == 10
    default = get_reward("instructions_guarded", mode="reject")
    margin = get_reward("instructions_guarded", mode="reject", probes={"min_words": 12})
    assert default(ten, ex) == 1.0
    score, comps = margin.detailed(ten, ex)
    assert score == -1.0 and comps["probe_too_short"] == 1.0
    assert get_reward("instructions_guarded", mode="reject", probes={"min_words": 10})(ten, ex) == 1.0
    with pytest.raises(ValueError, match=r"unknown probes key.*min_word; known:.*min_words"):
        get_reward("instructions_guarded", probes={"min_word": 12})
