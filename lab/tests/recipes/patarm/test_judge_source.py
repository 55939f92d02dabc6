"""The judge reward source under good, slow, failing and garbage judges; the endpoint path over a real
loopback HTTP server (127.0.0.1 only, bounded) and against `posttrain serve` on the tiny preset; the
PAR reward source and runner."""

from __future__ import annotations

import re
import time

import pytest
from _chat_server import ChatServer
from _postscript_case import postscript_case

from posttrain.rollout import RewardSourceContext, build_reward_source
from posttrain.tasks.base import Example
from posttrain_lab.recipes.patarm.judge import EndpointJudge, Judge, JudgeRewardSource, RandomJudge


def _ex(q: str, task_type: str | None = None) -> Example:
    return Example(id=q, prompt=q, answer="", meta={"task_type": task_type} if task_type else {})


class CorrectnessJudge(Judge):
    """Scores 9 when the response equals the sum in the question, 2 otherwise; counts prompts."""

    def __init__(self) -> None:
        self.prompts: list[str] = []

    def generate(self, prompts):
        self.prompts += prompts
        out = []
        for p in prompts:
            a, b = map(int, re.search(r"<question>(\d+)\+(\d+)=</question>", p).groups())
            r = re.search(r"<response>(.*)</response>", p).group(1)
            out.append(
                "<criteria>sum</criteria><score>9</score>" if r == str(a + b) else "<score> 2 </score>"
            )
        return out


class SlowJudge(Judge):
    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.calls = 0

    def generate(self, prompts):
        self.calls += 1
        time.sleep(self.delay)
        return ["<score>10</score>"] * len(prompts)


class RaisingJudge(Judge):
    def __init__(self, fail_times: int = 10**9) -> None:
        self.left = fail_times
        self.calls = 0

    def generate(self, prompts):
        self.calls += 1
        if self.left > 0:
            self.left -= 1
            raise RuntimeError("judge crashed")
        return ["<score>10</score>"] * len(prompts)


class GarbageJudge(Judge):
    def __init__(self, outputs) -> None:
        self.outputs = outputs
        self.calls = 0

    def generate(self, prompts):
        self.calls += 1
        return self.outputs(prompts)


def test_judge_scores_normalised_with_components_and_task_types():
    j = CorrectnessJudge()
    src = JudgeRewardSource(j, rubric_style="none", batch_size=2)
    res = src.score(["46", "45", "3"], [_ex("12+34=", "math"), _ex("12+34=", "math"), _ex("1+2=")])
    assert res.rewards == pytest.approx([8 / 9, 1 / 9, 8 / 9])
    assert res.components["judge_score"] == [9.0, 2.0, 9.0]
    assert res.components["judge_parsed"] == [1.0, 1.0, 1.0]
    assert res.timeouts == 0 and res.errors == 0
    assert j.prompts[0].startswith("<task>math</task>") and j.prompts[2].startswith("<task>chat</task>")


def test_judge_cache_by_prompt_and_response():
    j = CorrectnessJudge()
    src = JudgeRewardSource(j, rubric_style="none")
    src.score(["46", "46"], [_ex("12+34="), _ex("12+34=")])
    assert len(j.prompts) == 1  # duplicate in one batch judged once
    res = src.score(["46", "45"], [_ex("12+34="), _ex("12+34=")])
    assert len(j.prompts) == 2  # only the new response
    assert res.components["judge_cached"] == [1.0, 0.0]
    src.score(["46"], [_ex("12+34=", "math")])  # another task type is another key
    assert len(j.prompts) == 3


def test_judge_samples_mean():
    outs = iter(["<score>4</score>", "<score>8</score>"])
    src = JudgeRewardSource(GarbageJudge(lambda ps: [next(outs) for _ in ps]), samples=2, cache_size=0)
    res = src.score(["r"], [_ex("q")])
    assert res.components["judge_score"] == [6.0]
    assert res.rewards == pytest.approx([5 / 9])


def test_judge_that_times_out_is_counted_and_never_blocks():
    j = SlowJudge(delay=2.0)
    src = JudgeRewardSource(j, timeout_s=0.1, max_retries=1)
    t0 = time.perf_counter()
    res = src.score(["a", "b"], [_ex("q1"), _ex("q2")])
    assert time.perf_counter() - t0 < 1.5
    assert res.rewards == [0.0, 0.0]
    assert res.timeouts == 2 and res.errors == 0
    assert res.components["judge_failed"] == [1.0, 1.0]
    assert j.calls == 2  # one try + one capped retry
    assert src.stats["timeouts"] == 2


def test_judge_that_raises_is_retried_then_counted():
    j = RaisingJudge()
    src = JudgeRewardSource(j, max_retries=2)
    res = src.score(["a"], [_ex("q")])
    assert res.rewards == [0.0] and res.errors == 1 and res.timeouts == 0
    assert j.calls == 3
    # failures are not cached: the next batch asks again and succeeds after one failure
    j2 = RaisingJudge(fail_times=1)
    src2 = JudgeRewardSource(j2, max_retries=1)
    res2 = src2.score(["a"], [_ex("q")])
    assert res2.rewards == [1.0] and res2.errors == 0 and j2.calls == 2


@pytest.mark.parametrize(
    "outputs",
    [
        lambda ps: ["I refuse to score."] * len(ps),
        lambda ps: ["<score>great</score>"] * len(ps),
        lambda ps: [None] * len(ps),
        lambda ps: [12345] * len(ps),
        lambda ps: ["<score>1</score>"],  # wrong length for a batch of 2
        lambda ps: "not a list",
    ],
)
def test_judge_returning_garbage_never_raises(outputs):
    src = JudgeRewardSource(GarbageJudge(outputs), max_retries=1)
    res = src.score(["a", "b"], [_ex("q1"), _ex("q2")])
    assert res.rewards == [0.0, 0.0]
    assert res.components["judge_parsed"] == [0.0, 0.0]


def test_unparsable_judgment_is_asked_again_once():
    answers = iter(["no score", "<score>7</score>"])
    j = GarbageJudge(lambda ps: [next(answers) for _ in ps])
    src = JudgeRewardSource(j, fallback=False)
    res = src.score(["a"], [_ex("q")])
    assert res.components["judge_score"] == [7.0] and j.calls == 2


def test_judge_source_is_asynchronous():
    j = SlowJudge(delay=0.3)
    src = JudgeRewardSource(j, timeout_s=5)
    t0 = time.perf_counter()
    h = src.submit(["a"], [_ex("q")])
    assert time.perf_counter() - t0 < 0.2
    assert h.result().rewards == [1.0]


def test_registered_judge_source_random_and_params_checked():
    ctx = RewardSourceContext(None, None, None, seed=3)
    src = build_reward_source("judge", {"judge": "random", "cache_size": 0}, ctx)
    res = src.score(["a"] * 50, [_ex(f"q{i}") for i in range(50)])
    assert len(set(res.components["judge_score"])) > 3
    with pytest.raises(ValueError, match="unknown"):
        build_reward_source("judge", {"judges": "random"}, ctx)
    with pytest.raises(ValueError, match=r"params\.model"):
        build_reward_source("judge", {"judge": "hf"}, ctx)


def test_random_judge_parses():
    out = RandomJudge(seed=0).generate(["p"] * 20)
    assert all(re.fullmatch(r"<score>\d+</score>", o) for o in out)


# ------------------------------------------------------------------------------ loopback endpoint
def _endpoint_source(url, **kw):
    judge_kw = {k: kw.pop(k) for k in ("timeout_s_client", "max_retries_client") if k in kw}
    j = EndpointJudge(
        url,
        "judge-model",
        api_key_env="POSTTRAIN_TEST_JUDGE_KEY",
        timeout_s=judge_kw.get("timeout_s_client", 5.0),
        max_retries=judge_kw.get("max_retries_client", 1),
        backoff_base=0.01,
        backoff_max=0.05,
    )
    return JudgeRewardSource(j, rubric_style="none", **kw), j


def test_endpoint_judge_over_loopback(monkeypatch):
    monkeypatch.setenv("POSTTRAIN_TEST_JUDGE_KEY", "sk-loop")

    def behaviour(prompt):
        if "<response>good</response>" in prompt:
            return 200, "<criteria>c</criteria><score>9</score>", 0
        if "<response>bad</response>" in prompt:
            return 200, "<score>3</score>", 0
        if "<response>garbage</response>" in prompt:
            return 200, "RAW:not json at all", 0
        if "<response>slow</response>" in prompt:
            return 200, "<score>10</score>", 3.0
        return 500, "", 0

    with ChatServer(behaviour) as srv:
        src, judge = _endpoint_source(srv.url, timeout_s_client=0.3, max_retries_client=1)
        t0 = time.perf_counter()
        res = src.score(
            ["good", "bad", "garbage", "slow", "error"], [_ex("q", "chat")] * 4 + [_ex("q2", "chat")]
        )
        assert time.perf_counter() - t0 < 5.0
    assert res.rewards[:2] == pytest.approx([8 / 9, 2 / 9])
    assert res.rewards[2:] == [0.0, 0.0, 0.0]
    assert res.components["judge_failed"] == [0.0, 0.0, 1.0, 1.0, 1.0]
    assert res.errors == 3  # the client's capped retries ran out on each failing item
    assert srv.requests[0]["auth"] == "Bearer sk-loop"
    assert srv.requests[0]["body"]["model"] == "judge-model"
    assert srv.requests[0]["body"]["messages"][0]["content"].startswith("<task>chat</task>")
    assert judge.last_errors and all("failed after 2 attempts" in e for e in judge.last_errors)


def test_endpoint_whole_call_timeout_of_the_source():
    with ChatServer(lambda p: (200, "<score>10</score>", 2.0)) as srv:
        src, _ = _endpoint_source(srv.url, timeout_s=0.2, max_retries=0)
        t0 = time.perf_counter()
        res = src.score(["x"], [_ex("q")])
        assert time.perf_counter() - t0 < 1.5
    assert res.timeouts == 1 and res.rewards == [0.0]


@pytest.fixture(scope="module")
def served_tiny():
    """`posttrain serve` on the tiny preset over real HTTP (127.0.0.1, a free port); needs the serve extra."""
    pytest.importorskip(
        "fastapi", reason="the serve extra (fastapi) is not installed: pip install -e '.[serve]'"
    )
    pytest.importorskip(
        "uvicorn", reason="the serve extra (uvicorn) is not installed: pip install -e '.[serve]'"
    )
    from posttrain.serve import ServeConfig
    from posttrain.serve.app import create_app
    from posttrain.serve.model import ChatModel
    from posttrain.serve.server import BackgroundServer

    cfg = ServeConfig(model="tiny", port=0, max_prompt_tokens=4000, max_tokens=128, default_max_tokens=8)
    with BackgroundServer(cfg, app=create_app(cfg, ChatModel(cfg))) as srv:
        yield srv


def test_endpoint_judge_against_posttrain_serve(served_tiny):
    """The PaTaRM judge reward source over real HTTP against `posttrain serve`: every judgment is
    answered (no failed calls, no timeouts); an untrained tiny model writes no score tag, so each is
    counted unparsable (asked once more) and scored at the bottom of the scale, never raising."""
    judge = EndpointJudge(served_tiny.base_url, "tiny", max_tokens=8, timeout_s=60, max_retries=0)
    src = JudgeRewardSource(judge, rubric_style="none")
    ex = Example(id="q0", prompt="2+2=", answer="4")
    res = src.score(["4", "5"], [ex, ex])
    assert res.timeouts == 0 and res.errors == 0 and not judge.last_errors
    assert res.components["judge_failed"] == [0.0, 0.0]
    assert res.rewards == [0.0, 0.0] and res.components["judge_parsed"] == [0.0, 0.0]
    assert src.stats["calls"] >= 1 and src.stats["unparsable"] == 2


def test_judge_gates_the_guarded_instruction_reward():
    """Issue 40, item 2: the instruction checker, the hack probes and a PaTaRM endpoint judge in one
    reward (`reward.source: judged` over `instructions_guarded`). The real hacks are rejected by the
    probes; a vacuous answer that passes both the checker and the probes is rejected by the judge
    (which rates its filler low); a genuine answer keeps 1.0; an honest failure keeps 0."""
    pytest.importorskip("if_verifiable")
    from posttrain.rewards import get_reward

    case = postscript_case()
    t, ex, marker, topic, vacuous = case.task, case.example, case.marker, case.topic, case.template_answer
    genuine = (
        f"On {topic}: the first records go back centuries, and each age added its own methods "
        f"and tools.\n{marker} Ask me for sources."
    )
    honest_fail = f"On {topic}: the first records go back centuries, and each age added its own tools."
    hacks = ["\n".join([marker] * 11), f"{marker} I hope this helps!"]
    ctx = RewardSourceContext(
        reward_fn=get_reward("instructions_guarded", mode="reject"), task=t, tokenizer=None, num_workers=0
    )
    with ChatServer(lambda p: (200, f"<score>{2 if 'worth exploring' in p else 9}</score>", 0)) as srv:
        params = {"judge": "endpoint", "base_url": srv.url, "model": "judge", "rubric_style": "none"}
        src = build_reward_source(
            "judged", {"judge": {"name": "judge", "params": params}, "mode": "reject"}, ctx
        )
        res = src.score([genuine, honest_fail, vacuous, *hacks], [ex] * 5)
        src.close()
    assert res.rewards == [1.0, 0.0, -1.0, -1.0, -1.0]
    assert res.components["strict"] == [1.0, 0.0, 1.0, 1.0, 1.0]  # the checker alone is fooled thrice
    assert res.components["hacked"] == [0.0, 0.0, 0.0, 1.0, 1.0]  # the probes catch the hacks
    assert res.components["judge_flagged"] == [0.0, 0.0, 1.0, 0.0, 0.0]  # the judge, the filler
    assert res.components["judge_score"] == [9.0, 9.0, 2.0, 9.0, 9.0] and len(srv.requests) == 5


def test_the_gate_decides_per_sample_when_one_judgment_is_unparsable():
    """Issue 58 item 15: with ``samples: 2`` one unparsable judgment made the whole item "no verdict",
    so the other sample's low score was ignored and the base reward kept. A verdict from any sample
    counts: the low score flags the answer; an item whose every judgment is unparsable has none."""
    from posttrain.rollout import FunctionRewardSource, JudgeGatedRewardSource

    calls = []

    def outputs(prompts):  # the first call scores, every later one (the second sample, its retry) not
        calls.append(len(prompts))
        return ["<score>2</score>" if len(calls) == 1 else "I cannot rate this."] * len(prompts)

    judge = JudgeRewardSource(GarbageJudge(outputs), rubric_style="none", samples=2, cache_size=0)
    gate = JudgeGatedRewardSource(
        FunctionRewardSource(lambda c, e: 1.0, num_workers=0), judge, threshold=0.5, mode="reject"
    )
    res = gate.score(["an answer"], [_ex("q", "chat")])
    assert len(calls) == 3  # sample 1, sample 2, sample 2 re-asked
    assert res.rewards == [-1.0] and res.components["judge_reward"] == pytest.approx([1 / 9])
    assert res.components["judge_verdict"] == [1.0] and res.components["judge_flagged"] == [1.0]
    assert res.components["judge_parsed"] == [0.0] and res.components["judge_verdicts"] == [1.0]
    never = JudgeRewardSource(GarbageJudge(lambda p: ["no score"] * len(p)), rubric_style="none", samples=2)
    res = JudgeGatedRewardSource(FunctionRewardSource(lambda c, e: 1.0, num_workers=0), never).score(
        ["an answer"], [_ex("q", "chat")]
    )
    assert res.components["judge_verdicts"] == [0.0] and res.components["judge_verdict"] == [0.0]
    assert res.rewards == [1.0]


# --------------------------------------------------------------------------------------- PAR source
def test_par_reward_source_pairs_sides():
    from posttrain_lab.recipes.patarm.par_rl import PARRewardSource

    def ex(pair, side):
        return Example(id=f"{pair}/{side}", prompt="p", answer="", meta={"par_pair": pair, "par_side": side})

    texts = ["<score>8</score>", "<score>7</score>", "<score>5</score>", "<score>9</score>"]
    texts += ["<score>6</score>", "<score>7</score>", "<score>4</score>", "<score>8</score>"]
    exs = [ex("a", "chosen")] * 4 + [ex("a", "rejected")] * 4
    texts += ["<score>3</score>", "junk"]
    exs += [ex("b", "chosen"), ex("c", "rejected")]  # partners missing
    res = PARRewardSource(fallback=False, rule="indicator").score(texts, exs)
    assert res.rewards == [1, 1, 0, 1, 1, 1, 1, 0, 0, 0]
    assert res.components["par_pair_correct"][:8] == [1.0] * 8
    assert res.components["par_unpaired"] == [0.0] * 8 + [1.0, 1.0]
    assert res.components["par_parsed"][-1] == 0.0
    assert res.errors == 2
    with pytest.raises(ValueError, match="runner 'par'"):
        PARRewardSource().score(["x"], [_ex("q")])
