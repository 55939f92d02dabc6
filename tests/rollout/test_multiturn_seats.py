"""Several agents in the one multi-turn runner (posttrain.envs.MultiAgentEnv, issue 39): every seat of a
session is its own row, the seats play in lock step (one batched generation per round over every
acting seat of every session), a seat that is done stops while the others go on, every row of a
session gets its session reward, per-session metrics are averaged per session (not per row), the
contract is checked, and a session that reaches the context cap is cut as a whole."""

from __future__ import annotations

import re

import pytest
from _engine_helpers import ScriptedEngine

from posttrain.envs import MultiAgentEnv, SeatsResult, StepResult, register_env
from posttrain.envs.base import ENVS
from posttrain.models import load_model_and_tokenizer
from posttrain.rollout import PromptFormatter, SamplingParams
from posttrain.rollout.multiturn import MultiTurnRunner
from posttrain.tasks import Example


class Relay(MultiAgentEnv):
    """``seats`` seats (``example.meta["seats"]``); seat k says "done" when it is finished; the session
    ends when every seat is done or at ``max_turns``; session reward = share of seats done;
    ``bad``: a contract violation to provoke."""

    criteria = ("format",)

    def __init__(self, max_turns: int = 4, bad: str = "") -> None:
        self.max_turns, self.bad = max_turns, bad

    def reset_seats(self, example, seed):
        self.n = int(example.meta["seats"])
        self.done, self.round = [False] * self.n, 0
        return [[{"role": "user", "content": f"you are seat {k} of {self.n}"}] for k in range(self.n)]

    def step_seats(self, texts):
        self.round += 1
        seats = {}
        for k, text in texts.items():
            self.done[k] = self.done[k] or text.strip() == "done"
            seats[k] = StepResult(
                f"round {self.round} ok",
                {"format": 0.0 if text.strip() in ("done", "wait") else -1.0},
                self.done[k],
            )
        if self.bad == "missing seat":
            seats.pop(max(seats))
        over = all(self.done) or self.round >= self.max_turns
        if self.bad == "no end":
            over = False
        return SeatsResult(seats, done=over, session_reward=sum(self.done) / self.n if over else None)

    def abort(self):
        return -1.0

    def metrics(self):
        return {"all_done": float(all(self.done))}

    def summary(self):
        return {"finished": all(self.done)}


register_env("test-relay")(Relay)


@pytest.fixture(scope="module")
def tok():
    return load_model_and_tokenizer("tiny", device="cpu", seed=0)[1]


def seat_k_finishes_in_round_k_plus_1(context: str) -> str:
    """Seat k says "wait" until round k + 1, then "done" (round = observations seen + 1)."""
    k = int(re.search(r"you are seat (\d+)", context).group(1))
    rnd = context.count(" ok") + 1
    return "done" if rnd >= k + 1 else "wait"


def runner_for(tok, reply, **kw) -> tuple[MultiTurnRunner, ScriptedEngine]:
    eng = ScriptedEngine(tok, reply)
    env_params = kw.pop("env_params", {})
    r = MultiTurnRunner(eng, PromptFormatter(tok, chat=False), env="test-relay", env_params=env_params, **kw)
    return r, eng


def ex(i: int, seats: int) -> Example:
    return Example(f"e{i}", "", "", {"seats": seats})


def test_seats_play_in_lock_step_and_stop_when_done(tok):
    r, eng = runner_for(tok, seat_k_finishes_in_round_k_plus_1)
    eps = r.run([ex(0, 3)], [2], SamplingParams(max_new_tokens=8))
    # rounds: 2 sessions x 3 seats act, then seats 1-2, then seat 2 only
    assert [len(prompts) for prompts, _ in eng.calls] == [6, 4, 2]
    ss = r.last_sessions
    assert [(s.seat, s.seats) for s in ss] == [(0, 3), (1, 3), (2, 3)] * 2
    assert [len(s.turn_rewards) for s in ss] == [1, 2, 3] * 2
    assert eps.rewards.tolist() == [1.0] * 6 and eps.batch.group_ids.tolist() == [0] * 6
    for i, s in enumerate(ss):  # the seat's own replies are its actions; the env's replies are not
        b = eps.batch
        n = int(b.completion_mask[i].sum())
        acted = tok.decode(
            b.completion_ids[i, :n][b.action_mask[i, :n] == 1].tolist(), skip_special_tokens=True
        )
        assert acted == "wait" * s.seat + "done"
        assert [m["role"] for m in s.messages] == ["user"] + ["assistant", "user"] * (s.seat + 1)
        assert s.messages[-1].get("final") is True


def test_per_session_metrics_are_averaged_per_session_not_per_row(tok):
    # session A: 1 seat, all done; session B: 3 seats, max_turns 2 ends it with seat 2 not done
    r, _ = runner_for(tok, seat_k_finishes_in_round_k_plus_1, env_params={"max_turns": 2})
    eps = r.run([ex(0, 1), ex(1, 3)], [1, 1], SamplingParams(max_new_tokens=8))
    assert eps.rewards.tolist() == pytest.approx([1.0, 2 / 3, 2 / 3, 2 / 3])
    assert eps.row_stats["episode_weight"].tolist() == pytest.approx([1.0, 1 / 3, 1 / 3, 1 / 3])
    assert r.step_metrics(eps) == {"all_done": 0.5}  # per row it would be 0.25
    ev = r.eval_metrics(eps)
    assert ev["session_reward_mean"] == pytest.approx((1.0 + 2 / 3) / 2)
    assert ev["finished_rate"] == pytest.approx(0.5)  # a boolean fact of summary(), per session
    # the weights follow their rows through selection (a group filter keeps session B only)
    kept = eps.select([1, 2, 3])
    assert r.step_metrics(kept) == {"all_done": 0.0}


def test_a_seat_at_the_context_cap_cuts_its_whole_session(tok):
    r, _ = runner_for(tok, lambda c: "wait", max_context=60)
    eps = r.run([ex(0, 2)], [1], SamplingParams(max_new_tokens=8))
    assert [s.truncated for s in r.last_sessions] == [True, True]
    assert eps.rewards.tolist() == [-1.0, -1.0] and eps.batch.truncated.tolist() == [True, True]


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        ("missing seat", r"answered seats \[0\], expected exactly the seats that acted \[0, 1\]"),
        ("no end", "round 4 reached max_turns=4"),
    ],
)
def test_the_multi_agent_contract_is_checked(tok, bad, match):
    r, _ = runner_for(tok, lambda c: "wait", env_params={"bad": bad})
    with pytest.raises(ValueError, match=match):
        r.run([ex(0, 2)], [1], SamplingParams(max_new_tokens=8))


def test_runner_tools_are_refused_with_a_multi_agent_environment(tok):
    with pytest.raises(ValueError, match="has several seats and brings its own tools"):
        runner_for(tok, lambda c: "wait", tools=["calculator"])
    with pytest.raises(TypeError, match="several seats: use reset_seats"):
        ENVS.get("test-relay")().reset(ex(0, 2), 0)
