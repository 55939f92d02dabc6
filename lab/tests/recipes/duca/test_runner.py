"""The multi-turn runner (masks, turn indices, log-probs, truncation, a turn cut at the token cap marked
as a format violation) and the ``duca`` estimator fed by it."""

from __future__ import annotations

import warnings

import pytest
import torch

from posttrain.algos import get_advantage
from posttrain.envs import ENVS, Env, StepResult
from posttrain.models import load_model_and_tokenizer
from posttrain.rollout import HFEngine, PromptFormatter, RolloutBatch, RolloutEngine, SamplingParams
from posttrain.rollout.multiturn import MultiTurnRunner
from posttrain.rollout.registry import RunnerContext, build_runner
from posttrain_lab.recipes.duca.advantages import hian_advantages, turn_spans_from_index
from posttrain_lab.recipes.duca.sales import SalesTask, ScriptedSeller

LP = -0.25  # the scripted engine's log-prob of every token it "samples"
USER = "\nCustomer: {observation}\nSeller:"


@pytest.fixture(scope="module")
def tok():
    return load_model_and_tokenizer("tiny", device="cpu", seed=0)[1]


class ScriptedEngine(RolloutEngine):
    """Replies with ScriptedSeller's turn given the customer lines in the context (+ EOS), cut at
    max_new_tokens; records every call's contexts and completions."""

    def __init__(self, tok, *, extra: str = ""):
        self.tok, self.extra = tok, extra
        self.calls: list[tuple[list[list[int]], list[list[int]]]] = []

    @property
    def pad_token_id(self) -> int:
        return int(self.tok.pad_token_id)

    def generate(self, prompt_ids, n_per_prompt, params):
        seller, comps, reasons = ScriptedSeller(), [], []
        for p in prompt_ids:
            text = self.tok.decode(p, skip_special_tokens=True)
            obs = [ln.split(":", 1)[1].strip() for ln in text.split("\n") if ln.startswith("Customer:")]
            ids = [
                *self.tok.encode(seller.reply(obs) + self.extra, add_special_tokens=False),
                self.tok.eos_token_id,
            ]
            cut = len(ids) > params.max_new_tokens
            comps.append(ids[: params.max_new_tokens])
            reasons.append("length" if cut else "stop")
        self.calls.append(([list(p) for p in prompt_ids], comps))
        return RolloutBatch.from_token_lists(
            prompt_ids,
            comps,
            pad_token_id=self.pad_token_id,
            group_ids=list(range(len(prompt_ids))),
            finish_reasons=reasons,
            logprobs=[[LP] * len(c) for c in comps],
        )


def _runner(tok, engine=None, **kw):
    kw.setdefault("env", "sales")
    kw.setdefault("user_turn", USER)
    return MultiTurnRunner(engine or ScriptedEngine(tok), PromptFormatter(tok), **kw)


def test_masks_cover_exactly_the_policy_turns_and_turn_index_aligns(tok):
    eng = ScriptedEngine(tok)
    r = _runner(tok, eng, env_params={"max_turns": 5})
    exs = SalesTask(n_train=3, n_heldout=1).split("train")
    eps = r.run(exs, [2, 1, 3], SamplingParams(max_new_tokens=64))
    b = eps.batch
    assert b.group_ids.tolist() == [0, 0, 1, 2, 2, 2] and len(eng.calls) == 3  # 3 turns, all rows batched
    assert len(eng.calls[0][0]) == 6  # every active conversation in ONE generate call per turn
    ti, num = eps.advantage_inputs["turn_index"], eps.advantage_inputs["num_turns"]
    assert num.tolist() == [3] * 6 and eps.rewards.tolist() == [1.0] * 6  # the scripted seller converts
    for i in range(len(b)):
        n = int(b.lengths[i])
        row = b.completion_ids[i, :n].tolist()
        act = b.action_mask[i, :n].bool()
        # the policy tokens, in order, are exactly what the engine produced at each turn for this row
        prompt = b.prompt_ids[i][b.prompt_mask[i].bool()].tolist()
        turns = [_sampled(call, prompt + row[:s]) for call, s in zip(eng.calls, _starts(ti[i]), strict=True)]
        assert [t for tt in turns for t in tt] == [row[j] for j in range(n) if act[j]]
        # turn_index: k on turn k's tokens (contiguous), 0 on environment tokens and padding
        assert torch.equal(ti[i] > 0, b.action_mask[i].bool())
        for k, (s, e) in enumerate(turn_spans_from_index(ti[i : i + 1], num[i : i + 1])[0], start=1):
            assert e - s == len(turns[k - 1]) and (ti[i, s:e] == k).all()
        # environment tokens are the customer's replies rendered with user_turn
        env_text = tok.decode([row[j] for j in range(n) if not act[j]])
        assert env_text.count("\nCustomer: ") == 2 and env_text.endswith("\nSeller:")
        # sampling log-probs on every policy token, 0 elsewhere
        assert (b.logprobs[i, :n][act] == LP).all() and (b.logprobs[i][~b.action_mask[i].bool()] == 0).all()
    assert b.truncated.tolist() == [False] * 6
    assert eps.advantage_inputs["turn_rewards"].shape == (6, 5, 4)


def _sampled(call, context):
    """What the engine returned for ``context`` in one generate call."""
    contexts, completions = call
    return completions[contexts.index(context)]


def _starts(ti_row):
    """Completion offsets where each turn starts (the context length at that turn)."""
    out, prev = [], 0
    for t, k in enumerate(ti_row.tolist()):
        if k > 0 and k != prev:
            out.append(t)
        prev = k if k > 0 else prev
    return out


def test_truncation_is_flagged_not_silent(tok):
    exs = SalesTask(n_train=2, n_heldout=1).split("train")
    probe = _runner(tok).run(exs[:1], [1], SamplingParams(max_new_tokens=64))
    p_len = int(probe.batch.prompt_mask[0].sum())
    # room for the first turn only: the second turn would overflow the context cap
    r = _runner(tok, max_context=p_len + 64 + 30)
    eps = r.run(exs, [1, 1], SamplingParams(max_new_tokens=64))
    assert eps.batch.finish_reasons == ["length", "length"] and eps.batch.truncated.all()
    assert eps.advantage_inputs["num_turns"].tolist() == [1, 1]
    assert eps.rewards.tolist() == [0.0, 0.0]  # Env.abort()
    m = r.eval_metrics(eps)
    assert m["truncated_rate"] == 1.0 and m["avg_turns"] == 1.0
    assert all(t["truncated"] for t in m["transcripts"])
    # a turn cut by max_new_tokens gets an EOS environment token (not an action)
    eps = _runner(tok).run(exs[:1], [1], SamplingParams(max_new_tokens=5))
    b = eps.batch
    assert b.completion_ids[0, 5] == tok.eos_token_id and b.action_mask[0, 5] == 0
    with pytest.raises(ValueError, match="last run"):
        r.eval_metrics(eps)


def test_rewards_modes_and_turn_inputs_off(tok):
    exs = SalesTask(n_train=1, n_heldout=1).split("train")
    eng = ScriptedEngine(tok, extra=" As an AI, it is guaranteed.")
    sess = _runner(tok, eng).run(exs, [2], SamplingParams(max_new_tokens=80))
    tr = sess.advantage_inputs["turn_rewards"]
    assert tr[:, :3, 1:3].eq(-1).all()  # disclosure + forbidden claim every turn
    summed = _runner(
        tok, ScriptedEngine(tok, extra=" As an AI, it is guaranteed."), reward="sum", turn_inputs=False
    )
    eps = summed.run(exs, [2], SamplingParams(max_new_tokens=80))
    assert eps.advantage_inputs == {}
    torch.testing.assert_close(eps.rewards, sess.rewards + tr.sum(dim=(1, 2)))
    adv = get_advantage("grpo")(eps.rewards, eps.batch.group_ids)  # grpo needs no turn inputs
    assert adv.shape == (2,)
    with pytest.raises(TypeError, match="unknown parameter 'turn_index'"):
        get_advantage("grpo")(sess.rewards, sess.batch.group_ids, **sess.advantage_inputs)
    with pytest.raises(ValueError, match="reward must be one of"):
        _runner(tok, reward="mean")


# ------------------------------------------------------------------------ duca through the runner
class _Scores(Env):
    """Plays back fixed per-turn scores and a session reward (one script per reset, in order)."""

    criteria = ("score",)
    max_turns = 3
    scripts: list[tuple[list[float], float]] = []
    _next = 0

    def reset(self, example, seed):
        cls = type(self)
        self.turns, self.sess = cls.scripts[cls._next % len(cls.scripts)]
        cls._next += 1
        self.k = 0
        return "hi"

    def step(self, agent_text):
        self.k += 1
        done = self.k == len(self.turns)
        return StepResult("ok", {"score": self.turns[self.k - 1]}, done, self.sess if done else None)


@pytest.fixture
def scores_env():
    ENVS.register("test-scores")(_Scores)
    _Scores._next = 0
    yield _Scores
    ENVS._items.pop("test-scores")


def test_duca_reproduces_the_hian_reference_example_through_runner_inputs(tok, scores_env):
    # HIAN reference example (proposed design; option (a), unbiased std, eps = 1e-6): sessions [1, 0],
    # turn rewards s1 = [0.8, 0.6], s2 = [0.4, 0.9, 0.5]
    scores_env.scripts = [([0.8, 0.6], 1.0), ([0.4, 0.9, 0.5], 0.0)]
    r = _runner(tok, env="test-scores")
    scores_env._next = 0
    eps = r.run(SalesTask(n_train=1, n_heldout=1).split("train"), [2], SamplingParams(max_new_tokens=64))
    a = get_advantage("duca")(eps.rewards, eps.batch.group_ids, **eps.advantage_inputs)
    b = eps.batch
    assert a.shape == b.completion_ids.shape
    ti = eps.advantage_inputs["turn_index"]
    expect = {0: [1.4787, 0.5142], 1: [-1.8645, 0.5467, -1.3822]}
    for i, vals in expect.items():
        for k, v in enumerate(vals, start=1):
            torch.testing.assert_close(
                a[i][ti[i] == k], torch.full_like(a[i][ti[i] == k], v), atol=1e-4, rtol=0
            )
        assert (a[i][ti[i] == 0] == 0).all()  # environment tokens and padding carry no advantage
    # per-turn grouping and weights pass through to HIAN unchanged
    spans = turn_spans_from_index(ti, eps.advantage_inputs["num_turns"])
    turns = [torch.tensor([0.8, 0.6]), torch.tensor([0.4, 0.9, 0.5])]
    ref = hian_advantages(
        eps.rewards, b.group_ids, turns, spans, ti.shape[1], turn_grouping="turn_index", w_sess=0.5
    )
    got = get_advantage("duca")(
        eps.rewards, b.group_ids, **eps.advantage_inputs, turn_grouping="turn_index", w_sess=0.5
    )
    torch.testing.assert_close(got, ref)


def test_duca_zscores_each_criterion_and_rejects_missing_inputs(tok):
    ti = torch.tensor([[1, 1, 0, 2], [1, 0, 2, 2]])
    tr = torch.tensor([[[0.0, 10.0], [-1.0, 30.0], [0.0, 0.0]], [[-1.0, 20.0], [0.0, 40.0], [0.0, 0.0]]])
    num = torch.tensor([2, 2])
    # turn_norm=per_criterion: the plain sum of the per-criterion z-scores (the behaviour before the 2026-12-01 fixes)
    a = get_advantage("duca")(
        torch.zeros(2),
        torch.tensor([0, 0]),
        turn_index=ti,
        turn_rewards=tr,
        num_turns=num,
        turn_norm="per_criterion",
    )
    c1, c2 = torch.tensor([0.0, -1.0, -1.0, 0.0]), torch.tensor([10.0, 30.0, 20.0, 40.0])
    z = (c1 - c1.mean()) / (c1.std() + 1e-6) + (c2 - c2.mean()) / (c2.std() + 1e-6)
    torch.testing.assert_close(a[0], torch.stack([z[0], z[0], torch.tensor(0.0), z[1]]), atol=1e-5, rtol=0)
    torch.testing.assert_close(a[1], torch.stack([z[2], torch.tensor(0.0), z[3], z[3]]), atol=1e-5, rtol=0)
    # default turn_norm=fused: that sum z-scored again over the same pool
    f = get_advantage("duca")(
        torch.zeros(2), torch.tensor([0, 0]), turn_index=ti, turn_rewards=tr, num_turns=num
    )
    zf = (z - z.mean()) / (z.std() + 1e-6)
    torch.testing.assert_close(f[0], torch.stack([zf[0], zf[0], torch.tensor(0.0), zf[1]]), atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="needs the per-turn inputs"):
        get_advantage("duca")(torch.zeros(2), torch.tensor([0, 0]))
    with pytest.raises(ValueError, match="not contiguous"):
        get_advantage("duca")(
            torch.zeros(2),
            torch.tensor([0, 0]),
            turn_index=torch.tensor([[1, 0, 1, 2], [1, 0, 2, 2]]),
            turn_rewards=tr,
            num_turns=num,
        )


def test_registered_runner_with_hf_engine_and_chat_template(tok):
    """The registry-built runner over the real engine and the model's chat template: env tokens are the
    template's user turn between the agent's EOS and the next generation prompt."""
    model, tok2 = load_model_and_tokenizer("tiny", device="cpu", seed=0)
    eng = HFEngine(model, tok2, seed=1)
    ctx = RunnerContext(eng, PromptFormatter(tok2, chat=True), tok2, seed=5)
    r = build_runner("multi-turn", {"env": "sales", "env_params": {"max_turns": 2}, "max_context": 400}, ctx)
    exs = SalesTask(n_train=2, n_heldout=1).split("train")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        eps = r.run(exs, [2, 2], SamplingParams(temperature=1.0, max_new_tokens=12))
    b = eps.batch
    assert b.logprobs is not None
    for i in range(len(b)):
        n = int(b.lengths[i])
        act = b.action_mask[i, :n].bool()
        env_ids = b.completion_ids[i, :n][~act].tolist()
        text = tok2.decode(env_ids, skip_special_tokens=False)
        assert "<|user|>\n" in text and text.replace("<eos>", "").endswith("<|assistant|>\n")
        assert (b.logprobs[i, :n][act] < 0).all()
        assert torch.equal(eps.advantage_inputs["turn_index"][i] > 0, b.action_mask[i].bool())
    # the same seed gives the same customers (environment seeds derive from the runner seed)
    r2 = build_runner("multi-turn", {"env": "sales", "env_params": {"max_turns": 2}, "max_context": 400}, ctx)
    s1 = [s.seed for s in r.last_sessions]
    r2.run(exs, [2, 2], SamplingParams(temperature=1.0, max_new_tokens=4))
    assert [s.seed for s in r2.last_sessions] == s1


def test_a_turn_cut_at_the_token_cap_is_a_format_violation(tok):
    exs = SalesTask(n_train=2, n_heldout=1).split("train")
    runner = MultiTurnRunner(ScriptedEngine(tok), PromptFormatter(tok), env="sales", user_turn=USER)
    fmt = runner.criteria.index("format")
    eps = runner.run(exs[:1], [1], SamplingParams(max_new_tokens=5))  # every turn is cut
    n = int(eps.advantage_inputs["num_turns"][0])
    assert n >= 1 and runner.last_sessions[0].turns_cut == n
    assert eps.advantage_inputs["turn_rewards"][0, :n, fmt].tolist() == [-1.0] * n
    assert runner.eval_metrics(eps)["format_rate"] == 1.0
    # a turn that ends with its own EOS is not marked; cut_violation=None marks nothing
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
