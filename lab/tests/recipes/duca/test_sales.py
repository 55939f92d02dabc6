"""The environment interface and the rule-based ``sales`` customer: a turn naming several products
does not convert, a fitting offer converts with probability ``accept_prob``."""

from __future__ import annotations

import pytest

from posttrain.envs import ENVS, Env, StepResult, check_step, env_factory, list_envs
from posttrain.tasks.base import Example
from posttrain_lab.recipes.duca.sales import (
    CATALOG,
    CRITERIA,
    SalesEnv,
    SalesTask,
    ScriptedSeller,
    matching_products,
)

SCRIPT = [
    "Hello! How can I help?",
    "We have great products.",
    "What is your budget?",
    "Try the Titan laptop.",
    "Maybe the Echo headphones?",
    "Thanks for visiting.",
]


def _ex(need="laptop", budget=700, id_="x"):
    return Example(id=id_, prompt="p", answer="", meta={"need": need, "budget": budget})


def play(env, example, seed, turns):
    out = [env.reset(example, seed)]
    for t in turns:
        r = env.step(t)
        out.append((r.observation, r.turn_rewards, r.done, r.session_reward))
        if r.done:
            break
    return out


def test_registry_and_factory_errors():
    assert "sales" in list_envs()
    make = env_factory("sales", {"max_turns": 3})
    assert isinstance(make(), SalesEnv) and make().max_turns == 3
    with pytest.raises(ValueError, match="max_turn"):
        env_factory("sales", {"max_turn": 3})
    with pytest.raises(ValueError, match=r"unknown environment 'salez'.*sales"):
        env_factory("salez")
    with pytest.raises(ValueError, match="max_turns must be an int >= 1"):
        env_factory("sales", {"max_turns": 0})


def test_deterministic_per_seed_and_seeds_matter():
    env = SalesEnv(max_turns=6, cue_prob=0.5)
    ex = _ex()
    a = play(env, ex, 7, SCRIPT)
    b = play(SalesEnv(max_turns=6, cue_prob=0.5), ex, 7, SCRIPT)
    assert a == b
    runs = {repr(play(env, ex, s, SCRIPT)) for s in range(12)}
    assert len(runs) > 1  # the customer's wording / cue timing depends on the seed


def test_conversion_rules_and_cues():
    env = SalesEnv(max_turns=6)
    env.reset(_ex("laptop", 700), 0)
    r = env.step("I suggest the Lumo phone.")  # wrong category -> need revealed
    assert not r.done and "not a phone" in r.observation and "laptop" in r.observation.lower()
    r = env.step("Then the Titan laptop, it is great.")  # over budget -> budget revealed
    assert not r.done and "expensive" in r.observation and "$700" in r.observation
    r = env.step("The Aero laptop fits you well.")
    assert r.done and r.session_reward == 1.0 and "Aero" in r.observation
    assert env.summary()["conversion"] is True and env.summary()["sold"] == "Aero"
    assert env.summary()["offers"] == ["Lumo", "Titan", "Aero"]


def test_turn_limit_ends_without_conversion():
    env = SalesEnv(max_turns=2)
    env.reset(_ex(), 0)
    assert not env.step("Hello there.").done
    r = env.step("Nice weather today.")
    assert r.done and r.session_reward == 0.0
    with pytest.raises(RuntimeError, match="after the session ended"):
        env.step("one more")


@pytest.mark.parametrize(
    ("text", "violated"),
    [
        ("Welcome to the store. What do you need?", set()),
        ("As an AI, I can help you.", {"ai_disclosure"}),
        ("I am a language model trained to sell.", {"ai_disclosure"}),
        ("This laptop is guaranteed to last.", {"forbidden_claim"}),
        ("It is 100% risk-free!", {"forbidden_claim"}),
        ("", {"format"}),
        ("Customer: I want a phone", {"format"}),
        ("%%%% $$$$ 1234 ####", {"format"}),
        (" ".join(["word"] * 41), {"format"}),
    ],
)
def test_turn_criteria(text, violated):
    env = SalesEnv()
    env.reset(_ex(), 0)
    r = env.step(text)
    assert set(r.turn_rewards) == set(CRITERIA)
    assert {k for k, v in r.turn_rewards.items() if v < 0} == violated
    assert all(v in (0.0, -1.0) for v in r.turn_rewards.values())


def test_repetition_is_across_turns_and_sentence_level():
    env = SalesEnv()
    env.reset(_ex(), 0)
    assert env.step("Hello! What do you need?").turn_rewards["repetition"] == 0.0
    # same sentence again (different case / punctuation) inside a new turn
    assert env.step("Great. what do you NEED").turn_rewards["repetition"] == -1.0
    assert env.step("Let me show you something.").turn_rewards["repetition"] == 0.0


def test_disclosure_makes_the_customer_notice():
    env = SalesEnv()
    env.reset(_ex(), 0)
    assert env.step("I am a bot, hello.").observation.startswith("Oh, you are a bot?")


def test_scripted_seller_converts_every_heldout_scenario():
    task = SalesTask(n_train=20, n_heldout=20)
    seller, env = ScriptedSeller(), SalesEnv(max_turns=5)
    for ex in task.split("heldout"):
        obs = [env.reset(ex, 1)]
        while True:
            r = env.step(seller.reply(obs))
            if r.done:
                break
            obs.append(r.observation)
        assert r.session_reward == 1.0, ex
        assert env.summary()["violations"] == dict.fromkeys(CRITERIA, 0)


def test_sales_task_splits_disjoint_and_convertible():
    task = SalesTask(n_train=100, n_heldout=30, seed=3)
    tr, he = task.split("train"), task.split("heldout")
    key = lambda e: (e.meta["customer"], e.meta["need"], e.meta["budget"])  # noqa: E731
    assert len(tr) == 100 and len(he) == 30 and not {key(e) for e in tr} & {key(e) for e in he}
    prices = {p.name: p for p in CATALOG}
    for e in tr + he:
        names = e.answer.split(",")
        assert names and all(
            prices[n].category == e.meta["need"] and prices[n].price <= e.meta["budget"] for n in names
        )
    assert SalesTask(n_train=100, n_heldout=30, seed=3).split("train") == tr
    with pytest.raises(ValueError, match="exceeds"):
        SalesTask(n_train=10_000)


def test_reset_rejects_examples_without_scenario():
    with pytest.raises(ValueError, match=r"meta\.need"):
        SalesEnv().reset(Example(id="q1", prompt="p", answer=""), 0)


class _NeverDone(Env):
    criteria = ("x",)
    max_turns = 1

    def reset(self, example, seed):
        return "hi"

    def step(self, agent_text):
        return StepResult("more", {"x": 0.0}, False)


def test_check_step_enforces_the_contract():
    env = _NeverDone()
    with pytest.raises(ValueError, match="did not return done=True"):
        check_step(env, env.step("a"), 1)
    with pytest.raises(ValueError, match="expected exactly its criteria"):
        check_step(env, StepResult("o", {"y": 0.0}, False), 0)
    with pytest.raises(ValueError, match="needs a finite session_reward"):
        check_step(env, StepResult("o", {"x": 0.0}, True), 1)
    with pytest.raises(TypeError, match="must return a StepResult"):
        check_step(env, ("o", {}, True), 1)
    ENVS.register("test-never-done")(_NeverDone)
    try:
        assert isinstance(env_factory("test-never-done")(), _NeverDone)
    finally:
        ENVS._items.pop("test-never-done")


def test_naming_the_whole_catalogue_does_not_convert():
    catalogue = "We have Aero, Titan, Lumo, Zenith, Echo, Sonic, Snap and Vista."
    for need, budget in (("laptop", 700), ("phone", 300), ("camera", 1500)):
        env = SalesEnv()
        env.reset(_ex(need, budget), seed=0)
        res = env.step(catalogue)
        assert not res.done and not env.converted and "just one" in res.observation
        assert env.summary()["multi_offer_turns"] == 1
        old = SalesEnv(multi_offer="allow")  # the exploit: name everything, one product fits
        old.reset(_ex(need, budget), seed=0)
        assert old.step(catalogue).done and old.converted
    # the same product twice is one offer
    env = SalesEnv()
    env.reset(_ex(), seed=0)
    assert env.step("The Aero is light. Aero it is.").done
    with pytest.raises(ValueError, match="multi_offer"):
        SalesEnv(multi_offer="maybe")


def test_a_fitting_offer_converts_only_sometimes_with_accept_prob():
    good = matching_products("laptop", 700)[0]
    first = []
    for seed in range(200):
        env = SalesEnv(accept_prob=0.4, conversion_reward=10.0)
        env.reset(_ex(), seed=seed)
        res = env.step(f"I recommend the {good}.")
        first.append(res.done)
        if res.done:
            assert res.session_reward == 10.0
        else:
            assert good in res.observation and not env.converted
    assert 0.3 < sum(first) / len(first) < 0.5
    env = SalesEnv()  # default 1.0: always
    env.reset(_ex(), seed=0)
    assert env.step(f"I recommend the {good}.").session_reward == 1.0
    with pytest.raises(ValueError, match="accept_prob"):
        SalesEnv(accept_prob=0.0)
