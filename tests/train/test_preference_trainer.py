"""PreferenceTrainer on the tiny preset: a kill and resume trains the same weights bit for bit as an
uninterrupted run (reference log-probs read back from the checkpoint, not recomputed); the reference
is the initial policy (LoRA: the adapters off); the gradient does not depend on the micro-batch split;
every registered loss trains, reference-free ones with no reference at all; held-out accuracy."""

from __future__ import annotations

from importlib.resources import files

import pytest
import torch

from posttrain import PreferenceConfig, PreferenceTrainer
from posttrain.algos import list_preference_losses
from posttrain.train.preference_data import PreferenceDataError

DATA = str(files("posttrain") / "configs" / "preference" / "preferences-arithmetic.jsonl")


def cfg(tmp_path, name="run", **kw):
    base = {
        "model": {"name": "tiny", "precision": "fp32"},
        "data": DATA,
        "eval_holdout": 4,
        "steps": 4,
        "batch_size": 4,
        "optimizer": {"lr": 1e-3},
        "out_dir": str(tmp_path / name),
        "progress": False,
        "checkpoint": {"every": 2},
    }
    for k, v in kw.items():
        base[k] = {**base[k], **v} if isinstance(v, dict) and isinstance(base.get(k), dict) else v
    return PreferenceConfig(**base)


def weights(trainer):
    return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


class Killed(KeyboardInterrupt):
    pass


def test_kill_and_resume_is_bitwise_the_uninterrupted_run(tmp_path, monkeypatch):
    with PreferenceTrainer(cfg(tmp_path, "full")) as t:
        t.train()
        full = weights(t)
        refs = [(p.ref_chosen, p.ref_rejected) for p in t.train_pairs]

    c = cfg(tmp_path, "killed")
    t = PreferenceTrainer(c)
    step = t.step

    def dies_at_step_3():
        if t.step_idx == 2:
            raise Killed
        return step()

    t.step = dies_at_step_3
    with pytest.raises(Killed):
        t.train()
    assert t.step_idx == 2

    calls = []
    monkeypatch.setattr(
        PreferenceTrainer, "_fill_reference", lambda self, pairs, ref: calls.append(len(pairs))
    )
    with PreferenceTrainer(c, resume=True) as r:
        assert r.step_idx == 2 and calls == []  # the reference log-probs came from the checkpoint
        assert [(p.ref_chosen, p.ref_rejected) for p in r.train_pairs] == refs
        r.train()
        resumed = weights(r)
    assert resumed.keys() == full.keys()
    assert all(torch.equal(resumed[k], full[k]) for k in full)


def test_resume_refuses_other_data(tmp_path):
    c = cfg(tmp_path, steps=2)
    with PreferenceTrainer(c) as t:
        t.train()
    other = cfg(tmp_path, steps=3, max_examples=20)
    with pytest.raises(PreferenceDataError, match="trained on different pairs"):
        PreferenceTrainer(other, resume=True)


def test_reference_is_the_initial_policy_and_stays_fixed(tmp_path):
    c = cfg(tmp_path, steps=2, checkpoint={"every": 0})
    t = PreferenceTrainer(c)
    lw, ll, _, _ = t._pair_logps(t.lm, t.train_pairs)
    assert torch.allclose(lw, torch.tensor([p.ref_chosen for p in t.train_pairs]), rtol=0, atol=1e-5)
    assert torch.allclose(ll, torch.tensor([p.ref_rejected for p in t.train_pairs]), rtol=0, atol=1e-5)
    before = [p.ref_chosen for p in t.train_pairs]
    t.train()
    assert [p.ref_chosen for p in t.train_pairs] == before
    after, _, _, _ = t._pair_logps(t.lm, t.train_pairs)
    assert not torch.allclose(after, lw)  # the policy moved; the reference did not


def test_lora_reference_is_the_base_with_adapters_off(tmp_path):
    from posttrain.models.lora import AdapterDisabledLM

    c = cfg(tmp_path, steps=2, model={"lora": {"rank": 4}}, loss={"name": "kto"}, optimizer={"lr": 5e-2})
    with PreferenceTrainer(c) as t:
        assert isinstance(t.reference, AdapterDisabledLM)  # kto keeps one; no second copy of the weights
        t.train()
        base_w, _, _, _ = t._pair_logps(t.reference, t.train_pairs)
        policy_w, _, _, _ = t._pair_logps(t.lm, t.train_pairs)
    assert torch.allclose(base_w, torch.tensor([p.ref_chosen for p in t.train_pairs]), rtol=0, atol=1e-5)
    assert not torch.allclose(policy_w, base_w)


@pytest.mark.parametrize("loss", ["orpo", "kto"])
def test_micro_batches_give_the_same_gradient(tmp_path, monkeypatch, loss):
    """The whole batch's pair and chosen-token counts normalise every micro-batch (orpo's token-mean
    NLL, kto's z0 from the whole batch), so the accumulated gradient does not depend on the split."""
    import posttrain.train.optim as optim

    grads, step = [], optim.clip_and_step

    def record(model, opt, clip):
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
        return step(model, opt, clip)

    monkeypatch.setattr(optim, "clip_and_step", record)
    metrics = []
    for mb in (None, 1, 3):
        c = cfg(tmp_path, f"mb{mb}", steps=1, micro_batch_size=mb, save=False, loss={"name": loss})
        with PreferenceTrainer(c) as t:
            metrics.append(t.step())
    for other in grads[1:]:
        assert all(torch.allclose(grads[0][k], other[k], rtol=1e-4, atol=1e-7) for k in grads[0])
    for m in metrics[1:]:
        assert m["loss"] == pytest.approx(metrics[0]["loss"], rel=1e-5)
        assert m["rewards/margins"] == pytest.approx(metrics[0]["rewards/margins"], rel=1e-5, abs=1e-7)


@pytest.mark.parametrize("name", list_preference_losses())
def test_every_registered_loss_trains_and_logs_trl_metrics(tmp_path, name):
    c = cfg(tmp_path, steps=2, loss={"name": name}, save=False)
    with PreferenceTrainer(c) as t:
        s = t.train()
        free = not t.loss_fn.needs_reference
        assert all((p.ref_chosen is None) == free for p in t.train_pairs + t.eval_pairs)
        assert (t.reference is not None) == t.loss_fn.needs_kl
    last = s["last"]
    for key in (
        "loss",
        "rewards/chosen",
        "rewards/rejected",
        "rewards/margins",
        "rewards/accuracies",
        "logps/chosen",
        "logps/rejected",
    ):
        assert key in last and last[key] == last[key], key  # present and not nan
    assert 0.0 <= s["eval"]["preference_accuracy"] <= 1.0 and s["eval"]["n"] == 4


def test_no_data_and_unknown_loss_are_named(tmp_path):
    with pytest.raises(ValueError, match="no training pairs: set data="):
        PreferenceTrainer(cfg(tmp_path, data=None))
    with pytest.raises(ValueError, match=r"loss: .*'dpoo'.*Did you mean 'dpo'"):
        cfg(tmp_path, loss={"name": "dpoo"})
    with pytest.raises(ValueError, match=r"loss: .*'betta'"):
        cfg(tmp_path, loss={"name": "dpo", "params": {"betta": 1}})
