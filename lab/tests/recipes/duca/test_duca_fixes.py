"""DuCA / HIAN fixes (issue 26; HIAN is a proposed design): the fused turn term is re-normalised, a turn
cut at the token cap is a format violation, the sales customer declines a multi-product turn and buys
a fitting offer only with probability ``accept_prob``, and ``zero_var_frac`` looks at what the
estimator normalises."""

from __future__ import annotations

import pytest
import torch

from posttrain.models import load_model_and_tokenizer
from posttrain.rollout import PromptFormatter, SamplingParams
from posttrain.rollout.multiturn import MultiTurnRunner
from posttrain_lab.recipes.duca.advantages import hian_advantages
from posttrain_lab.recipes.duca.sales import SalesEnv, SalesTask, matching_products

from .test_runner import USER, ScriptedEngine


@pytest.fixture(scope="module")
def tok():
    return load_model_and_tokenizer("tiny", device="cpu", seed=0)[1]


def _batch(seed: int, sessions: int = 4, turns: int = 5, crit: int = 4):
    g = torch.Generator().manual_seed(seed)
    session = torch.randint(0, 2, (sessions,), generator=g).float()
    # each criterion violated (-1) on ~30 % of turns, independently: several criteria vary
    turn = [-(torch.rand(turns, crit, generator=g) < 0.3).float() for _ in range(sessions)]
    spans = [[(k, k + 1) for k in range(turns)] for _ in range(sessions)]
    return session, turn, spans


def test_fused_turn_term_has_unit_variance_however_many_criteria_vary():
    """Measured in the audit: per-criterion z-scores SUMMED gave the turn term std 1.67 against the
    session term's 0.57 on a 4-session x 5-turn batch. The default re-normalises the sum."""
    for seed in range(5):
        _, turn, spans = _batch(seed)
        gids = torch.zeros(4, dtype=torch.long)
        a_turn = hian_advantages(torch.zeros(4), gids, turn, spans, 5, w_sess=0.0)  # turn term alone
        old = hian_advantages(torch.zeros(4), gids, turn, spans, 5, w_sess=0.0, turn_norm="per_criterion")
        assert float(a_turn.flatten().std()) == pytest.approx(1.0, abs=1e-4)
        assert float(a_turn.flatten().mean()) == pytest.approx(0.0, abs=1e-5)
        assert float(old.flatten().std()) > 1.3  # the sum of ~4 unit-variance terms
    mean = hian_advantages(torch.zeros(4), gids, turn, spans, 5, w_sess=0.0, turn_norm="mean")
    torch.testing.assert_close(mean, old / 4)
    with pytest.raises(ValueError, match="turn_norm"):
        hian_advantages(torch.zeros(4), gids, turn, spans, 5, turn_norm="zscore")


def test_hian_is_invariant_to_the_session_rewards_scale():
    session, turn, spans = _batch(3)
    gids = torch.zeros(4, dtype=torch.long)
    a1 = hian_advantages(session, gids, turn, spans, 5)
    a10 = hian_advantages(10 * session, gids, turn, spans, 5)
    torch.testing.assert_close(a1, a10, atol=1e-5, rtol=0)


def test_a_turn_cut_at_the_token_cap_is_a_format_violation(tok):
    exs = SalesTask(n_train=2, n_heldout=1).split("train")
    runner = MultiTurnRunner(ScriptedEngine(tok), PromptFormatter(tok), env="sales", user_turn=USER)
    fmt = runner.criteria.index("format")
    eps = runner.run(exs[:1], [1], SamplingParams(max_new_tokens=5))  # every turn is cut
    n = int(eps.advantage_inputs["num_turns"][0])
    assert n >= 1 and runner.last_sessions[0].turns_cut == n
    assert eps.advantage_inputs["turn_rewards"][0, :n, fmt].tolist() == [-1.0] * n
    assert runner.eval_metrics(eps)["format_rate"] == 1.0
    # a turn that ends with its own EOS is not marked; null keeps the behaviour before the fix
    eps = runner.run(exs[:1], [1], SamplingParams(max_new_tokens=64))
    assert runner.last_sessions[0].turns_cut == 0
    assert (
        eps.advantage_inputs["turn_rewards"][0, :, fmt].tolist()
        == [0.0] * eps.advantage_inputs["turn_rewards"].shape[1]
    )
    off = MultiTurnRunner(
        ScriptedEngine(tok), PromptFormatter(tok), env="sales", user_turn=USER, cut_violation=None
    )
    eps = off.run(exs[:1], [1], SamplingParams(max_new_tokens=5))
    assert eps.advantage_inputs["turn_rewards"][0, :, fmt].max() == 0.0
    with pytest.raises(ValueError, match="cut_violation 'tone'"):
        MultiTurnRunner(
            ScriptedEngine(tok), PromptFormatter(tok), env="sales", user_turn=USER, cut_violation="tone"
        )


def _scenario(need="laptop", budget=700):
    from posttrain.tasks import Example

    return Example(id="s", prompt="p", answer="", meta={"need": need, "budget": budget})


def test_naming_the_whole_catalogue_does_not_convert():
    catalogue = "We have Aero, Titan, Lumo, Zenith, Echo, Sonic, Snap and Vista."
    for need, budget in (("laptop", 700), ("phone", 300), ("camera", 1500)):
        env = SalesEnv()
        env.reset(_scenario(need, budget), seed=0)
        res = env.step(catalogue)
        assert not res.done and not env.converted and "just one" in res.observation
        assert env.summary()["multi_offer_turns"] == 1
        old = SalesEnv(multi_offer="allow")  # the exploit before the fix
        old.reset(_scenario(need, budget), seed=0)
        assert old.step(catalogue).done and old.converted
    # the same product twice is one offer
    env = SalesEnv()
    env.reset(_scenario(), seed=0)
    assert env.step("The Aero is light. Aero it is.").done
    with pytest.raises(ValueError, match="multi_offer"):
        SalesEnv(multi_offer="maybe")


def test_a_fitting_offer_converts_only_sometimes_with_accept_prob():
    good = matching_products("laptop", 700)[0]
    first = []
    for seed in range(200):
        env = SalesEnv(accept_prob=0.4, conversion_reward=10.0)
        env.reset(_scenario(), seed=seed)
        res = env.step(f"I recommend the {good}.")
        first.append(res.done)
        if res.done:
            assert res.session_reward == 10.0
        else:
            assert good in res.observation and not env.converted
    assert 0.3 < sum(first) / len(first) < 0.5
    env = SalesEnv()  # default 1.0: always
    env.reset(_scenario(), seed=0)
    assert env.step(f"I recommend the {good}.").session_reward == 1.0
    with pytest.raises(ValueError, match="accept_prob"):
        SalesEnv(accept_prob=0.0)


def test_zero_variance_counts_what_hian_normalises():
    """Equal session rewards but a varying turn criterion: HIAN still has a signal (not zero-variance);
    a group where nothing varies, or a single session, is."""
    from posttrain_lab.recipes.duca.advantages import hian_zero_variance_groups

    gids = torch.tensor([0, 0, 1, 1, 2])
    session = torch.tensor([0.0, 0.0, 0.0, 0.0, 1.0])
    turns = torch.zeros(5, 3, 2)
    turns[0, 1, 0] = -1.0  # group 0: one violation
    turns[3, 2, 1] = -1.0  # group 1: beyond session 3's last turn: ignored
    num = torch.tensor([3, 3, 2, 2, 3])
    got = hian_zero_variance_groups(session, gids, turns, num)
    assert got.tolist() == [False, True, True]
    session[2] = 1.0
    assert hian_zero_variance_groups(session, gids, turns, num).tolist() == [False, False, True]
