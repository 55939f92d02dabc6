"""A PAR rule that rewards discrimination, evaluation as the benchmarks define it, thinking judges,
and two wrong versions of the code that the other PaTaRM tests let pass.

Mutants verified by hand (applied to the source, the named test failed, reverted):
* ``PARRunner.judge_prompt`` with chosen and rejected swapped
  (``response = pair.rejected if side == "chosen" else pair.chosen``) ->
  ``test_par_runner_judges_each_side_under_its_own_response`` and
  ``test_par_runner_and_source_reward_a_judge_that_prefers_the_chosen_side`` fail;
* the PAR mean replaced by the median (``_mean`` returning ``statistics.median``) ->
  ``test_par_uses_the_mean_of_the_other_side_not_the_median`` fails.
"""

from __future__ import annotations

import itertools
import json

import pytest

from posttrain_lab.recipes.patarm.data import PreferencePair, load_preferences, subset_task_type
from posttrain_lab.recipes.patarm.evaluate import (
    REWARDBENCH_EXAMPLE_COUNTS,
    evaluate_pairwise,
    evaluate_pointwise,
    rewardbench_sections,
    table,
)
from posttrain_lab.recipes.patarm.par import par_rewards
from posttrain_lab.recipes.patarm.prompts import parse_preference, parse_score, pointwise_prompt


# ------------------------------------------------------------------------------ finding 1: PAR rule
def _expected_mean_reward(dist_c, dist_r, n, rule):
    """Exact expected PAR reward per judgment (mean over the 2n judgments of a pair) when the n chosen
    judgments are i.i.d. ``dist_c`` and the n rejected ones i.i.d. ``dist_r`` ({score: prob})."""
    total = 0.0
    sc, pc = zip(*dist_c.items(), strict=True)
    sr, pr = zip(*dist_r.items(), strict=True)
    for ic in itertools.product(range(len(sc)), repeat=n):
        p_c = 1.0
        for i in ic:
            p_c *= pc[i]
        for ir in itertools.product(range(len(sr)), repeat=n):
            p = p_c
            for i in ir:
                p *= pr[i]
            rc, rr = par_rewards([sc[i] for i in ic], [sr[i] for i in ir], rule=rule)
            total += p * (sum(rc) + sum(rr)) / (2 * n)
    return total


@pytest.mark.parametrize("q", [0.1, 0.3, 0.5, 0.7, 0.9])
def test_expected_par_reward_of_a_judge_that_cannot_discriminate(q):
    """A judge scoring 8 with probability q and 3 otherwise, whichever side it reads (n = 4):
    the indicator rule pays 1/2[q(1-q^4) + (1-q)(1-(1-q)^4)] (maximal at q = 1/2: GRPO pushes the
    judge toward spreading scores), the antisymmetric rule pays exactly 0."""
    dist = {8: q, 3: 1 - q}
    formula = 0.5 * (q * (1 - q**4) + (1 - q) * (1 - (1 - q) ** 4))
    assert _expected_mean_reward(dist, dist, 4, "indicator") == pytest.approx(formula, abs=1e-12)
    assert _expected_mean_reward(dist, dist, 4, "antisymmetric") == pytest.approx(0.0, abs=1e-12)


def test_indicator_rule_pays_most_for_spread_antisymmetric_for_discrimination():
    def f(q):
        d = {8: q, 3: 1 - q}
        return _expected_mean_reward(d, d, 4, "indicator")

    assert f(0.5) > f(0.3) > f(0.1) and f(0.5) > f(0.9)
    # any side-independent distribution, three score values, n = 3: still exactly 0
    d3 = {2: 0.2, 5: 0.5, 9: 0.3}
    assert _expected_mean_reward(d3, d3, 3, "antisymmetric") == pytest.approx(0.0, abs=1e-12)
    # a judge that tells the sides apart earns more than any non-discriminating one
    good = _expected_mean_reward({8: 0.9, 3: 0.1}, {8: 0.1, 3: 0.9}, 4, "antisymmetric")
    bad = _expected_mean_reward({8: 0.1, 3: 0.9}, {8: 0.9, 3: 0.1}, 4, "antisymmetric")
    assert good > 0.5 and bad < -0.5 and good == pytest.approx(-bad)


def test_antisymmetric_reference_example_ties_and_graded():
    rc, rr = par_rewards([8, 7, 5, 9], [6, 7, 4, 8], rule="antisymmetric")
    assert rc == [1.0, 1.0, -1.0, 1.0] and rr == [1.0, 1.0, 1.0, -1.0]
    assert par_rewards([5, 5], [5, 5]) == ([0.0, 0.0], [0.0, 0.0])  # default rule; ties earn 0
    assert par_rewards([8], [3]) == ([1.0], [1.0])
    assert par_rewards([3], [8]) == ([-1.0], [-1.0])
    rc, _ = par_rewards([9, 2], [3, 3], rule="antisymmetric", graded=True)
    assert rc[0] == pytest.approx(1.5) and rc[1] == pytest.approx(-(1 + 0.5 / 2.25))
    with pytest.raises(ValueError, match="PAR rule"):
        par_rewards([1], [2], rule="median")


def test_par_uses_the_mean_of_the_other_side_not_the_median():
    """chosen [1, 9, 9]: mean 6.33, median 9. A rejected judgment of 7 is above the chosen mean, so
    it is on the wrong side (median: it would look right)."""
    _, rr = par_rewards([1, 9, 9], [7, 7, 7], rule="indicator")
    assert rr == [0.0, 0.0, 0.0]
    _, rr = par_rewards([1, 9, 9], [7, 7, 7], rule="antisymmetric")
    assert rr == [-1.0, -1.0, -1.0]
    rc, _ = par_rewards([6.5, 6.5], [1, 9, 9], rule="antisymmetric")  # rejected mean 6.33 < 6.5 < 9
    assert rc == [1.0, 1.0]


# ---------------------------------------------------------------------- finding 5: judge_prompt swap
class _CharTok:
    eos_token_id = 0
    pad_token_id = 0

    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]

    def batch_decode(self, rows, skip_special_tokens=True):
        return ["".join(chr(i) for i in r if i) for r in rows]


class _PreferGoodEngine:
    """Scores 9 when the judged response contains GOOD, else 2; ``cut`` rows end by length."""

    def __init__(self, cut=()):
        self.cut = set(cut)

    def generate(self, prompts, counts, params):
        from posttrain.rollout.base import RolloutBatch

        comps, gids, fin, pr = [], [], [], []
        row = 0
        for g, (p, n) in enumerate(zip(prompts, counts, strict=True)):
            text = "".join(chr(i) for i in p)
            response = text.split("<response>")[1].split("</response>")[0]
            for _ in range(n):
                out = "<score>9</score>" if "GOOD" in response else "<score>2</score>"
                comps.append([ord(c) for c in out])
                gids.append(g)
                pr.append(list(p))
                fin.append("length" if row in self.cut else "stop")
                row += 1
        return RolloutBatch.from_token_lists(pr, comps, pad_token_id=0, group_ids=gids, finish_reasons=fin)


def _runner(**kw):
    from posttrain.rollout import PromptFormatter
    from posttrain_lab.recipes.patarm.par_rl import PARRunner

    return PARRunner(_PreferGoodEngine(**kw), PromptFormatter(_CharTok()), rubric_style="none")


def _pair_examples(n=1):
    from posttrain_lab.recipes.patarm.preference_task import pair_example

    pairs = [
        PreferencePair(f"q{i}", f"GOOD answer {i}", f"poor answer {i}", "math", "s", str(i)) for i in range(n)
    ]
    return [pair_example(p, i) for i, p in enumerate(pairs)]


def test_par_runner_judges_each_side_under_its_own_response():
    pair = PreferencePair("q", "GOOD answer", "poor answer", "math")
    r = _runner()
    assert "<response>GOOD answer</response>" in r.judge_prompt(pair, "chosen")
    assert "<response>poor answer</response>" in r.judge_prompt(pair, "rejected")
    assert "poor answer" not in r.judge_prompt(pair, "chosen")


def test_par_runner_and_source_reward_a_judge_that_prefers_the_chosen_side():
    from posttrain.rollout.base import SamplingParams
    from posttrain_lab.recipes.patarm.par_rl import PARRewardSource

    eps = _runner().run(_pair_examples(2), [3, 3], SamplingParams(temperature=1.0, max_new_tokens=20))
    sides = [e.meta["par_side"] for e in eps.examples]
    assert sides == ["chosen"] * 3 + ["rejected"] * 3 + ["chosen"] * 3 + ["rejected"] * 3
    for e, t in zip(eps.examples, eps.texts, strict=True):
        assert (e.meta["par_side"] == "chosen") == ("GOOD" in e.prompt)
        assert t == ("<score>9</score>" if e.meta["par_side"] == "chosen" else "<score>2</score>")
    res = PARRewardSource(rule="antisymmetric").score(eps.texts, eps.examples)
    assert res.rewards == [1.0] * 12
    assert res.components["par_pair_correct"] == [1.0] * 12


# ------------------------------------------------------------------ finding 4: thinking, truncation
def test_cut_off_thinking_is_never_a_verdict():
    # a judgment cut off inside <think>: today's fallback read the last number (9) as the score
    assert parse_score("<think>The response looks like a 9", fallback=True) is None
    assert parse_score("<think>I would give <score>9</score> but wait", fallback=True) is None
    assert parse_score("<think>maybe 3</think><criteria>ok</criteria><score>7</score>") == 7.0
    assert parse_score("<think>a <score>2</score></think> final answer 6", fallback=True) == 6.0
    assert parse_score("<think>a <score>2</score></think> no number", fallback=True) is None
    assert parse_score("reasoning</think><score>4</score>") == 4.0  # <think> was in the prompt
    assert parse_preference("<think>A is better... <preferred>A</preferred>") is None
    assert parse_preference("<think>hm</think><preferred>B</preferred>") == "B"


def test_par_runner_marks_truncated_judgments_and_source_scores_none():
    from posttrain.rollout.base import SamplingParams
    from posttrain_lab.recipes.patarm.par_rl import PARRewardSource

    eps = _runner(cut={0}).run(_pair_examples(1), [2], SamplingParams(temperature=1.0, max_new_tokens=20))
    assert [bool(e.meta.get("par_truncated")) for e in eps.examples] == [True, False, False, False]
    assert eps.texts[0] == "<score>9</score>"  # the text is kept for the logs ...
    res = PARRewardSource(rule="antisymmetric", format_penalty=0.1).score(eps.texts, eps.examples)
    assert res.components["par_parsed"] == [0.0, 1.0, 1.0, 1.0]  # ... but never scored
    assert res.components["par_truncated"] == [1.0, 0.0, 0.0, 0.0]
    assert res.rewards == [-0.1, 1.0, 1.0, 1.0]


class _ChatTok(_CharTok):
    def __init__(self):
        self.calls = []

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=True, **kw):
        self.calls.append(kw)
        return [ord(c) for c in "<|user|>" + messages[0]["content"] + "<|assistant|>"]


def test_enable_thinking_reaches_the_chat_template():
    from posttrain.rollout import PromptFormatter
    from posttrain.rollout.registry import REWARD_SOURCES, RUNNERS, check_component_params
    from posttrain_lab.recipes.patarm.judge import JudgeFormatter
    from posttrain_lab.recipes.patarm.par_rl import PARRunner

    tok = _ChatTok()
    JudgeFormatter(tok, chat=True, enable_thinking=False).encode("x")
    assert tok.calls[-1] == {"enable_thinking": False}
    JudgeFormatter(tok, chat=True).encode("x")  # None: not passed (the template's default)
    assert tok.calls[-1] == {}
    r = PARRunner(_PreferGoodEngine(), PromptFormatter(tok, chat=True), enable_thinking=False)
    r._encode("judge this")
    assert tok.calls[-1] == {"enable_thinking": False}
    check_component_params(RUNNERS, "par", {"enable_thinking": False, "rubric_style": "full"})
    check_component_params(REWARD_SOURCES, "judge", {"enable_thinking": False, "chat_template": True})
    check_component_params(REWARD_SOURCES, "par", {"rule": "indicator"})


def test_hf_judge_returns_no_verdict_for_a_judgment_cut_off_at_max_new_tokens():
    from posttrain.models import load_model_and_tokenizer
    from posttrain_lab.recipes.patarm.judge import HFJudge

    model, tok = load_model_and_tokenizer("tiny", device="cpu", seed=0)
    judge = HFJudge(model_obj=model, tokenizer=tok, temperature=0.0, max_new_tokens=1, device="cpu")
    out = judge.generate(["<task>math</task>\n<question>1+1</question>\n<response>7</response>\n"] * 3)
    # an untrained tiny LM does not end within one token: three cut-off judgments, none scored
    assert judge.truncated == sum(1 for t in out if t == "") and judge.truncated >= 1


def test_qwen3_judge_config_turns_thinking_off_and_never_falls_back():
    from importlib.resources import files

    import yaml

    cfg = yaml.safe_load((files("posttrain_lab.recipes.patarm") / "rm-qwen3-judge.yaml").read_text())
    assert cfg["rollout"]["runner"]["params"]["enable_thinking"] is False
    assert cfg["reward"]["source"]["params"]["fallback"] is False
    assert cfg["reward"]["source"]["params"]["rule"] in ("antisymmetric", "indicator")


# ---------------------------------------------------------------- finding 2: evaluation definitions
def _pairs(subsets):
    return [PreferencePair(f"q{i}", f"c{i}", f"r{i}", "chat", s, str(i)) for i, s in enumerate(subsets)]


def test_strict_and_tie_half_side_by_side():
    pairs = _pairs(["a"] * 4)
    scores = {"chosen": [9, 5, 5, 1], "rejected": [2, 5, 5, 7]}
    o = evaluate_pointwise(pairs, lambda ps, side: scores[side], n_boot=100)["overall"]
    assert o["accuracy"] == 0.25 and o["tie"] == 0.5
    assert o["accuracy_tie_half"] == pytest.approx(0.5)
    assert o["ci95_tie_half"][0] <= 0.5 <= o["ci95_tie_half"][1]


def test_pairwise_tie_half_counts_an_order_disagreement_half():
    pairs = _pairs(["a"] * 2)
    res = evaluate_pairwise(pairs, lambda items: ["A" for _ in items], n_boot=50)  # always A
    assert res["overall"]["accuracy"] == 0.0
    assert res["overall"]["accuracy_tie_half"] == pytest.approx(0.5)


def test_official_rewardbench_section_weights():
    assert REWARDBENCH_EXAMPLE_COUNTS["math-prm"] == 984
    assert sum(v for k, v in REWARDBENCH_EXAMPLE_COUNTS.items() if k.startswith("hep-")) == 984
    rb = rewardbench_sections({"math-prm": 1.0, "hep-python": 0.0, "hep-go": 0.0, "alpacaeval-easy": 0.5})
    assert rb["sections"]["Reasoning"] == pytest.approx(984 / (984 + 2 * 164))
    assert rb["score"] == pytest.approx((984 / (984 + 328) + 0.5) / 2)
    assert rewardbench_sections({"custom": 1.0}) == {}


def test_summary_reports_official_sections_not_pair_pooled():
    # two pairs per subset: pooling pairs gives Reasoning 0.5, the official weights 984/(984+164)
    pairs = _pairs(["math-prm", "math-prm", "hep-js", "hep-js"])
    scores = {"chosen": [9, 9, 1, 5], "rejected": [1, 1, 9, 5]}
    res = evaluate_pointwise(pairs, lambda ps, side: scores[side], n_boot=50)
    assert res["categories"]["Reasoning"]["accuracy"] == 0.5
    assert res["rewardbench"]["strict"]["sections"]["Reasoning"] == pytest.approx(984 / 1148)
    assert res["rewardbench"]["tie_half"]["sections"]["Reasoning"] == pytest.approx((984 + 0.25 * 164) / 1148)
    assert "tie=1/2" in table({"m": res})


def test_k_sampled_judgments_at_temperature_one_are_averaged():
    from posttrain_lab.recipes.patarm.demo import judge_scorer

    class _Seq:
        def __init__(self):
            self.k = 0

        def generate(self, prompts):
            self.k += 1
            return [f"<score>{2 if self.k % 2 else 8}</score>" for _ in prompts]

    score = judge_scorer(None, None, judge=_Seq(), samples=4)
    assert score(_pairs(["a"]), "chosen") == [5.0]  # 2, 8, 2, 8


# ------------------------------------------------------------------------ finding 3: task types
def test_benchmark_subsets_get_their_task_type_and_rubric(tmp_path):
    assert subset_task_type("math-prm") == "math"
    assert subset_task_type("hep-rust") == "code"
    assert subset_task_type("xstest-should-respond") == "safety"
    assert subset_task_type("llmbar-adver-GPTOut") == "chat"
    assert subset_task_type("normal") is None
    f = tmp_path / "rb.jsonl"
    rows = [
        {"prompt": "p", "chosen": "a", "rejected": "b", "subset": "math-prm"},
        {"prompt": "p", "chosen": "a", "rejected": "b", "subset": "hep-python"},
        {"prompt": "p", "chosen": "a", "rejected": "b", "subset": "donotanswer"},
        {
            "prompt": "p",
            "chosen": "a",
            "rejected": "b",
            "subset": "hep-go",
            "task_type": "chat",
        },  # explicit wins
        {
            "prompt": "p",
            "chosen": ["a", "a2", "a3"],
            "rejected": ["b", "b2", "b3"],
            "domain": "safety-refuse",
        },
    ]
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    pairs = load_preferences(f, default_task_type="chat")
    assert [p.task_type for p in pairs[:4]] == ["math", "code", "safety", "chat"]
    assert {p.task_type for p in pairs[4:]} == {"safety"}
    prompt = pointwise_prompt(pairs[1].prompt, pairs[1].chosen, pairs[1].task_type)
    assert "<task>code</task>" in prompt and "Functional correctness" in prompt


def test_rm_eval_scorer_passes_enable_thinking():
    from posttrain_lab.recipes.patarm.scorers import build_scorer

    sc = build_scorer("hf:tiny", enable_thinking=False, device="cpu")
    assert sc.obj.judge.formatter.enable_thinking is False
