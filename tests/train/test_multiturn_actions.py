"""Action masks: a scripted two-turn episode (prompt, policy turn 1, environment tokens, policy turn 2).

The environment's tokens are attended to by the policy but carry no loss and no metrics; the
training log-probs of the policy tokens equal those of one plain forward over the whole
conversation; one RL step through ``RLTrainer(runner=...)`` trains on the policy tokens only."""

from __future__ import annotations

import copy
import warnings
from dataclasses import replace

import pytest
import torch
from _train_helpers import Constant

from posttrain.algos import get_advantage
from posttrain.rollout import EpisodeRunner, Episodes, FunctionRewardSource, RolloutBatch
from posttrain.train.config import load_rl_config
from posttrain.train.rl import DegenerateSettingWarning, RLTrainer

T1, T2 = 3, 2  # policy tokens per turn (EOS is suppressed, so turns have exactly these lengths)

BASE = [
    "model.name=tiny",
    "model.device=cpu",
    'task.params={digits: 1, ops: "+", n_train: 60, n_heldout: 20}',
    "reward.num_workers=0",
    "rollout.prompts_per_step=3",
    "rollout.group_size=2",
    f"rollout.max_new_tokens={T1 + T2}",
    "eval.at_start=false",
    "optimizer.grad_clip=0",
    "optimizer.lr=1e-3",
]


class TwoTurnRunner(EpisodeRunner):
    """prompt -> policy turn 1 -> environment reply (length differs per row) -> policy turn 2.

    Scores its own episodes (alternating 0/1 inside each group, so every group has reward variance)."""

    def __init__(self, engine, formatter, *, env_text=("ok", "no, again", "x")):
        self.engine, self.formatter = engine, formatter
        self.env_text = env_text
        self.last: Episodes | None = None

    def env_tokens(self, row: int) -> list[int]:
        tok = self.formatter.tokenizer
        return [
            int(i)
            for i in tok.encode(f"\n{self.env_text[row % len(self.env_text)]}\n", add_special_tokens=False)
        ]

    def run(self, examples, n_per_prompt, params):
        prompts = [self.formatter.encode(ex.prompt) for ex in examples]
        b1 = self.engine.generate(
            prompts, n_per_prompt, replace(params, max_new_tokens=T1, min_new_tokens=T1)
        )
        turn1 = b1.completion_lists()
        groups = b1.group_ids.tolist()
        env = [self.env_tokens(i) for i in range(len(b1))]
        contexts = [prompts[g] + t + e for g, t, e in zip(groups, turn1, env, strict=True)]
        b2 = self.engine.generate(
            contexts, [1] * len(contexts), replace(params, max_new_tokens=T2, min_new_tokens=T2)
        )
        turn2 = b2.completion_lists()
        comps, actions, lps = [], [], []
        for i in range(len(b1)):
            comps.append(turn1[i] + env[i] + turn2[i])
            actions.append([1] * T1 + [0] * len(env[i]) + [1] * T2)
            lps.append(b1.logprobs[i, :T1].tolist() + [0.0] * len(env[i]) + b2.logprobs[i, :T2].tolist())
        batch = RolloutBatch.from_token_lists(
            [prompts[g] for g in groups],
            comps,
            pad_token_id=self.engine.pad_token_id,
            group_ids=groups,
            finish_reasons=b2.finish_reasons,
            actions=actions,
            logprobs=lps,
        )
        texts = self.formatter.tokenizer.batch_decode(comps, skip_special_tokens=True)
        rewards = torch.tensor([float(i % 2) for i in range(len(comps))])
        self.last = Episodes(batch, list(texts), [examples[g] for g in groups], rewards=rewards)
        return self.last


def two_turn_trainer(tmp_path, *extra) -> RLTrainer:
    cfg = load_rl_config(None, [*BASE, f"out_dir={tmp_path / 'run'}", *extra])
    tr = RLTrainer(cfg, reward_source=FunctionRewardSource(Constant(), num_workers=0))
    tr.collector.runner = TwoTurnRunner(tr.engine, tr.formatter)
    return tr


def _conversation(batch: RolloutBatch, i: int) -> tuple[list[int], int, torch.Tensor]:
    """Row i unpadded: (prompt + completion ids, prompt length, action mask over the completion)."""
    p = batch.prompt_ids[i][batch.prompt_mask[i].bool()].tolist()
    n = int(batch.lengths[i])
    return p + batch.completion_ids[i, :n].tolist(), len(p), batch.action_mask[i, :n].bool()


def _plain_forward(model, conv: list[int], temperature: float) -> torch.Tensor:
    """log softmax(logits / τ) predicting conv[1:], from ONE plain forward over the whole sequence."""
    logits = model(input_ids=torch.tensor([conv])).logits[0, :-1].float() / temperature
    return torch.log_softmax(logits, -1)


def _plain_logp_entropy(model, conv: list[int], temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log-prob and entropy of conv[1:] from one plain forward."""
    logp_all = _plain_forward(model, conv, temperature)
    lp = logp_all.gather(1, torch.tensor(conv[1:])[:, None]).squeeze(1)
    ent = -(logp_all.exp() * logp_all).sum(-1)
    return lp, ent


def test_env_tokens_are_attended_but_not_scored_and_logprobs_equal_one_plain_forward(tmp_path):
    tr = two_turn_trainer(tmp_path)
    ro = tr.rollout()
    b = ro.batch
    # environment tokens exist (completion_mask) but are not actions; rows differ in env length
    assert (b.completion_mask.sum(1) > b.action_mask.sum(1)).all()
    assert b.action_mask.sum(1).tolist() == [T1 + T2] * len(b)
    assert len(set(b.lengths.tolist())) > 1
    # the model attends to them: attention covers prompt + every completion token
    assert torch.equal(ro.attention_mask[:, ro.prompt_width :], b.completion_mask)
    assert torch.equal(ro.actions, b.action_mask.float())
    with torch.no_grad():
        lp, ent = tr._policy_forward(tr.lm, ro, torch.arange(len(b)), False)
    for i in range(len(b)):
        conv, p, act = _conversation(b, i)
        with torch.no_grad():
            ref_lp, ref_ent = _plain_logp_entropy(tr.model, conv, ro.temperature)
        n = len(act)
        # completion token j sits at position p + j and is predicted from position p + j - 1
        torch.testing.assert_close(lp[i, :n][act], ref_lp[p - 1 : p - 1 + n][act], rtol=0, atol=2e-5)
        torch.testing.assert_close(ent[i, :n][act], ref_ent[p - 1 : p - 1 + n][act], rtol=0, atol=2e-5)
        assert (lp[i, :n][~act] == 0).all() and (ent[i, :n][~act] == 0).all()  # env: not scored
        # what the engine recorded while sampling each turn (KV cache, left padding, EOS suppressed so
        # the turns have fixed lengths) is the same distribution renormalised without EOS
        with torch.no_grad():
            logp_all = _plain_forward(tr.model, conv, ro.temperature)[p - 1 : p - 1 + n]
        no_eos = ref_lp[p - 1 : p - 1 + n] - torch.log1p(-logp_all[:, tr.tokenizer.eos_token_id].exp())
        torch.testing.assert_close(b.logprobs[i, :n][act], no_eos[act], rtol=0, atol=2e-5)


def test_one_rl_step_trains_on_policy_tokens_only(tmp_path):
    tr = two_turn_trainer(tmp_path)
    ro = tr.rollout()
    fw = tr.forward_without_rewards(ro)
    scores = tr.score(ro)
    before = copy.deepcopy(tr.model)
    upd = tr.update(ro, fw, scores)
    metrics = tr.report(ro, fw, scores, upd, t_start=0.0)

    # independent gradient: on-policy PPO (ratio 1, inside the clip) with token-mean aggregation is
    # −Σ_{policy tokens} A_i ∇logp / #policy tokens, from plain forwards over the whole conversations
    b = ro.batch
    adv = get_advantage("grpo")(torch.tensor([float(i % 2) for i in range(len(b))]), b.group_ids.cpu())
    torch.testing.assert_close(scores.advantages, adv)
    policy_terms, env_terms, ent_sum = [], [], 0.0
    for i in range(len(b)):
        conv, p, act = _conversation(b, i)
        lp, ent = _plain_logp_entropy(before, conv, ro.temperature)
        lp, ent = lp[p - 1 : p - 1 + len(act)], ent[p - 1 : p - 1 + len(act)]
        policy_terms.append(-adv[i] * lp[act].sum())
        env_terms.append(-adv[i] * lp[~act].sum())
        ent_sum += float(ent[act].detach().sum())
    n_act = float(b.action_mask.sum())
    before.zero_grad()
    (torch.stack(policy_terms).sum() / n_act).backward(retain_graph=True)
    expected = {n: p.grad.clone() for n, p in before.named_parameters() if p.grad is not None}
    got = {n: p.grad for n, p in tr.model.named_parameters() if p.grad is not None}
    assert expected.keys() == got.keys()
    for n in expected:
        torch.testing.assert_close(got[n], expected[n], rtol=1e-4, atol=1e-7)

    # the check is sensitive: had the environment tokens carried loss, the gradient would differ
    before.zero_grad()
    n_all = float(b.completion_mask.sum())
    ((torch.stack(policy_terms).sum() + torch.stack(env_terms).sum()) / n_all).backward()
    wrong = {n: p.grad for n, p in before.named_parameters() if p.grad is not None}
    assert any(not torch.allclose(got[n], wrong[n], rtol=1e-3, atol=1e-6) for n in got)

    # metrics count policy tokens only
    assert metrics["length_mean"] == metrics["length_max"] == T1 + T2
    assert metrics["entropy"] == pytest.approx(ent_sum / n_act, rel=1e-4)
    assert metrics["ratio_mean"] == pytest.approx(1.0) and metrics["clipfrac"] == 0.0
    assert 0 < metrics["rollout_logp_diff"] < 0.1  # only the suppressed EOS mass differs (first test)
    assert metrics["reward_mean"] == 0.5 and metrics["zero_var_frac"] == 0.0
    assert tr.step_idx == 1


def test_two_turn_runner_through_step_with_kl_entropy_and_micro_batches(tmp_path):
    """The same episodes through the whole step with every per-token term on (KL to a reference,
    entropy bonus, micro-batches of uneven size): finite metrics, env tokens never counted."""
    tr = two_turn_trainer(tmp_path, "kl.coef=0.1", "entropy_coef=0.01", "micro_batch_size=4")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateSettingWarning)
        m1 = tr.step()
        m2 = tr.step()
    assert m1["kl"] == pytest.approx(0.0, abs=1e-6)  # the reference is the initial policy
    assert m2["kl"] != 0.0
    for m in (m1, m2):
        assert all(torch.isfinite(torch.tensor(v)) for v in m.values())
        assert m["length_mean"] == T1 + T2
