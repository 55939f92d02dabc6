"""Reward source ``judged``: a reward function gated by a judge reward source (posttrain's design).

Closed-form values of the gate in every mode, at the threshold's boundary and without a verdict;
both sources scored concurrently; the registry entry's checks; and the real call path end to end
(`posttrain rl` on the tiny preset with a judge reward source registered by a plug-in)."""

from __future__ import annotations

import json

import pytest

from posttrain.rewards.base import GUARD_MODES, flagged_score
from posttrain.rollout import (
    REWARD_SOURCES,
    JudgeGatedRewardSource,
    RewardHandle,
    RewardSource,
    RewardSourceContext,
    ScoredBatch,
    build_reward_source,
)
from posttrain.tasks.base import Example
from posttrain.utils.errors import InvalidValueError, PosttrainRuntimeError


class _Ready(RewardHandle):
    def __init__(self, sb: ScoredBatch, on_result=None) -> None:
        self.sb, self.on_result = sb, on_result

    def result(self) -> ScoredBatch:
        if self.on_result:
            self.on_result()
        return self.sb


class _Table(RewardSource):
    """Scores each completion from a table ``{completion: reward}``; optional per-completion components."""

    def __init__(self, table, components=None, log=None, name="src") -> None:
        self.table, self.components, self.log, self.name = table, components or {}, log, name
        self.closed = False

    def submit(self, completions, examples):
        if self.log is not None:
            self.log.append(f"submit {self.name}")
        comps = {k: [v[c] for c in completions] for k, v in self.components.items()}
        sb = ScoredBatch([self.table[c] for c in completions], components=comps)
        return _Ready(sb, (lambda: self.log.append(f"result {self.name}")) if self.log is not None else None)

    def close(self):
        self.closed = True


EX = Example(id="e", prompt="Write about bees.", answer=None)
TEXTS = ["a", "b", "c", "d", "e"]
BASE = {"a": 1.0, "b": 0.0, "c": 1.0, "d": -1.0, "e": 0.5}  # d: a probe already rejected it
JUDGE = {"a": 0.2, "b": 0.2, "c": 0.8, "d": 0.1, "e": 0.5}  # e: exactly at the threshold


def _gate(mode, penalty=1.0, threshold=0.5, judge_components=None):
    return JudgeGatedRewardSource(
        _Table(BASE), _Table(JUDGE, judge_components), threshold=threshold, mode=mode, penalty=penalty
    )


@pytest.mark.parametrize(
    ("mode", "penalty", "expected"),
    [
        ("veto", 1.0, [0.0, 0.0, 1.0, -1.0, 0.5]),
        ("reject", 1.0, [-1.0, -1.0, 1.0, -1.0, 0.5]),
        ("reject", 2.0, [-2.0, -2.0, 1.0, -2.0, 0.5]),
        ("penalty", 0.5, [0.5, -0.5, 1.0, -1.5, 0.5]),
    ],
)
def test_gate_closed_form_in_every_mode(mode, penalty, expected):
    sb = _gate(mode, penalty).score(TEXTS, [EX] * 5)
    assert sb.rewards == pytest.approx(expected)
    # below the threshold is flagged, at it is not (a `<=` mutant flags e)
    assert sb.components["judge_flagged"] == [1.0, 1.0, 0.0, 1.0, 0.0]
    assert sb.components["judge_reward"] == [JUDGE[t] for t in TEXTS]
    assert sb.components["judge_verdict"] == [1.0] * 5


def test_flagged_score_never_stacks_a_floor_and_names_a_bad_mode():
    assert GUARD_MODES == ("veto", "penalty", "reject")
    assert flagged_score(0.7, "veto", 1.0) == 0.0 and flagged_score(-1.0, "veto", 1.0) == -1.0
    assert flagged_score(0.7, "reject", 1.0) == -1.0 and flagged_score(-1.0, "reject", 0.5) == -1.0
    assert flagged_score(0.7, "penalty", 0.5) == pytest.approx(0.2)
    assert flagged_score(-0.3, "penalty", 0.5) == pytest.approx(-0.8)
    with pytest.raises(InvalidValueError, match="veto, penalty, reject"):
        flagged_score(1.0, "clip", 1.0)


def test_a_completion_without_a_verdict_keeps_its_base_reward():
    """A failed judge call or an unparsable judgment is no verdict: never flagged (its reward 0 from
    the judge would otherwise reject every answer whenever the judge is down)."""
    comps = {
        "judge_failed": {"a": 1.0, "b": 0.0, "c": 0.0, "d": 0.0, "e": 0.0},
        "judge_parsed": {"a": 1.0, "b": 0.0, "c": 1.0, "d": 1.0, "e": 1.0},
    }
    sb = _gate("reject", judge_components=comps).score(TEXTS, [EX] * 5)
    assert sb.rewards == pytest.approx([1.0, 0.0, 1.0, -1.0, 0.5])
    assert sb.components["judge_verdict"] == [0.0, 0.0, 1.0, 1.0, 1.0]
    assert sb.components["judge_flagged"] == [0.0, 0.0, 0.0, 1.0, 0.0]
    assert sb.components["judge_failed"][0] == 1.0  # the judge's own components pass through


def test_a_verdict_from_any_sample_counts():
    """A judge that scores each completion several times reports ``judge_verdicts`` (how many samples
    gave a score): one is a verdict, whatever ``judge_parsed`` (every sample parsed) and
    ``judge_failed`` (some call failed) say; none is no verdict."""
    comps = {
        "judge_failed": {"a": 1.0, "b": 0.0, "c": 0.0, "d": 0.0, "e": 0.0},
        "judge_parsed": {"a": 0.0, "b": 0.0, "c": 1.0, "d": 1.0, "e": 1.0},
        "judge_verdicts": {"a": 1.0, "b": 0.0, "c": 2.0, "d": 2.0, "e": 2.0},
    }
    sb = _gate("reject", judge_components=comps).score(TEXTS, [EX] * 5)
    assert sb.components["judge_verdict"] == [1.0, 0.0, 1.0, 1.0, 1.0]
    assert sb.components["judge_flagged"] == [1.0, 0.0, 0.0, 1.0, 0.0]
    assert sb.rewards == pytest.approx([-1.0, 0.0, 1.0, -1.0, 0.5])


def test_both_sources_are_submitted_before_either_result_is_awaited():
    log: list[str] = []
    gate = JudgeGatedRewardSource(_Table(BASE, log=log, name="base"), _Table(JUDGE, log=log, name="judge"))
    handle = gate.submit(TEXTS, [EX] * 5)
    assert log == ["submit base", "submit judge"]
    handle.result()
    assert log[2:] == ["result base", "result judge"]


def test_mismatched_lengths_and_clashing_components_are_errors():
    gate = _gate("veto")
    with pytest.raises(InvalidValueError, match="5 completions for 1 examples"):
        gate.submit(TEXTS, [EX])
    short = ScoredBatch([1.0])
    with pytest.raises(PosttrainRuntimeError, match="judge source returned 1 rewards for 5"):
        gate.combine(ScoredBatch([0.0] * 5), short, 5)
    clash = JudgeGatedRewardSource(_Table(BASE, {"x": BASE}), _Table(JUDGE, {"x": JUDGE}))
    with pytest.raises(PosttrainRuntimeError, match=r"component.* x reported twice"):
        clash.score(TEXTS, [EX] * 5)
    taken = JudgeGatedRewardSource(_Table(BASE), _Table(JUDGE, {"judge_flagged": JUDGE}))
    with pytest.raises(PosttrainRuntimeError, match="judge_flagged reported twice"):
        taken.score(TEXTS, [EX] * 5)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"mode": "clip"}, "mode must be one of veto, penalty, reject"),
        ({"threshold": 1.5}, r"threshold must be a number in \[0, 1\]"),
        ({"penalty": -1}, "penalty must be >= 0"),
    ],
)
def test_bad_gate_settings_are_named(kw, match):
    with pytest.raises(InvalidValueError, match=match):
        JudgeGatedRewardSource(_Table(BASE), _Table(JUDGE), **kw)


def test_close_closes_both_even_when_the_base_fails():
    base, judge = _Table(BASE), _Table(JUDGE)

    def boom():
        raise RuntimeError("base close failed")

    base.close = boom
    with pytest.raises(RuntimeError, match="base close failed"):
        JudgeGatedRewardSource(base, judge).close()
    assert judge.closed


def _register_stub_judge(threshold_word: str = "bee") -> list[int]:
    """A judge reward source for tests: 1.0 when the completion contains ``threshold_word``, else 0.0."""
    calls: list[int] = []

    class StubJudge(RewardSource):
        def __init__(self, ctx, *, word: str = threshold_word) -> None:
            self.word = word

        def submit(self, completions, examples):
            calls.append(len(completions))
            return _Ready(ScoredBatch([float(self.word in c) for c in completions]))

    REWARD_SOURCES.register("stub-judge")(StubJudge)
    return calls


def test_registered_source_builds_the_judge_from_its_spec():
    calls = _register_stub_judge()
    ctx = RewardSourceContext(reward_fn=lambda c, ex: 1.0, task=None, tokenizer=None, num_workers=0)
    src = build_reward_source(
        "judged", {"judge": {"name": "stub-judge", "params": {"word": "bee"}}, "mode": "reject"}, ctx
    )
    sb = src.score(["bees hum", "P.S. P.S."], [EX, EX])
    assert sb.rewards == [1.0, -1.0] and calls == [2]
    src.close()
    for bad, match in [
        ({"judge": "stub-judge"}, r"params.judge must be a reward source spec"),
        ({"judge": {"name": "stub-judge", "param": {}}}, "unknown key.*param"),
        ({"judge": {"name": "stub-judge", "params": {"words": "x"}}}, "words"),
        ({"judge": {"name": "no-such-judge"}}, "no-such-judge"),
    ]:
        with pytest.raises(Exception, match=match):
            build_reward_source("judged", bad, ctx)


def test_rl_run_with_a_judged_reward_logs_the_gate(tmp_path, monkeypatch):
    """End to end through `posttrain rl` (tiny preset): every completion passes the base reward, the
    plug-in judge rejects every one (the tiny model never writes its word), so under ``reject`` every
    reward is -1 and the step logs reward/judge_flagged = 1."""
    import sys

    from typer.testing import CliRunner

    from posttrain.cli import app

    plugin = tmp_path / "gate_plugin.py"
    plugin.write_text(
        "from posttrain.rollout import RewardSource, ScoredBatch\n"
        "from posttrain.rollout.reward_source import _Ready\n"
        "class WordJudge(RewardSource):\n"
        "    def __init__(self, ctx, *, word: str = 'zzzzzz') -> None:\n"
        "        self.word = word\n"
        "    def submit(self, completions, examples):\n"
        "        return _Ready(ScoredBatch([float(self.word in c) for c in completions]))\n"
        "class Always:\n"
        "    name = 'always'\n"
        "    def __call__(self, completion, example):\n"
        "        return 1.0\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "run"
    args = [
        "rl",
        "model.name=tiny",
        "reward.name=gate_plugin:Always",
        "reward.num_workers=0",
        "reward.source={name: judged, params: {judge: {name: 'gate_plugin:WordJudge'}, mode: reject}}",
        "rollout.prompts_per_step=2",
        "rollout.group_size=2",
        "rollout.max_new_tokens=4",
        "eval.at_start=false",
        "eval.at_end=false",
        "steps=1",
        f"out_dir={out}",
        "--no-progress",
    ]
    res = CliRunner().invoke(app, args, catch_exceptions=False)
    sys.modules.pop("gate_plugin", None)
    assert res.exit_code == 0, res.output
    row = next(json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if '"step": 1' in x)
    assert row["reward/judge_flagged"] == 1.0 and row["reward/judge_verdict"] == 1.0
    assert row["reward/judge_reward"] == 0.0
    assert row["reward_mean"] == -1.0
