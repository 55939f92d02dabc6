"""model.precision: bf16 autocast over fp32 master weights. Gradient difference to fp32 on a fixed
batch is bounded; gradients, weights and AdamW state stay fp32; log-probs stay fp32; the trainer and
both engines run under the setting; config validation."""

from __future__ import annotations

import warnings

import pytest
import torch

from posttrain.models import check_precision, load_model_and_tokenizer, precision_autocast, sequence_logprobs
from posttrain.rollout import HFEngine, SamplingParams
from posttrain.train.config import load_rl_config
from posttrain.train.rl import DegenerateSettingWarning, RLTrainer

# measured on tiny / tiny-qwen2 (16 sequences x 16 tokens): relative L2 gradient error 0.0075 / 0.0070,
# max |logp diff| 0.0047 / 0.0042
GRAD_REL_MAX = 0.03
LOGP_MAX = 0.03


@pytest.fixture(scope="module", params=["tiny", "tiny-qwen2"])
def batch(request):
    torch.set_num_threads(1)
    model, tok = load_model_and_tokenizer(request.param, seed=0, padding_side="left")
    prompts = [tok.encode(s) for s in ("12+30=", "7*8=", "100-1=", "5+5=")]
    b = HFEngine(model, tok, seed=0).generate(prompts, [4] * 4, SamplingParams(max_new_tokens=16))
    ids, attn, score = b.model_inputs()
    return model, ids, attn, score


def _grads(model, ids, attn, score, precision):
    model.zero_grad(set_to_none=True)
    adv = torch.linspace(-1, 1, ids.shape[0])[:, None]
    with precision_autocast("cpu", precision):
        lp, ent = sequence_logprobs(model, ids, attn, response_mask=score)
    assert lp.dtype == ent.dtype == torch.float32  # log-softmax and what the losses see: fp32
    n = score.sum()
    loss = -(lp * adv * score).sum() / n - 0.01 * (ent * score).sum() / n
    assert loss.dtype == torch.float32
    loss.backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g.dtype == torch.float32 for g in grads)  # fp32 master weights get fp32 gradients
    return torch.cat([g.flatten() for g in grads]), lp.detach()


def test_bf16_gradient_close_to_fp32_on_a_fixed_batch(batch):
    model, ids, attn, score = batch
    g32, lp32 = _grads(model, ids, attn, score, "fp32")
    g16, lp16 = _grads(model, ids, attn, score, "bf16")
    rel = float((g16 - g32).norm() / g32.norm())
    assert rel <= GRAD_REL_MAX
    assert rel > 1e-4  # bf16 really took effect (the mutant "autocast ignored" fails here)
    d = float(((lp16 - lp32).abs() * score).max())
    assert 1e-5 < d <= LOGP_MAX
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_check_precision():
    assert check_precision("BF16") == "bf16"
    with pytest.raises(ValueError, match="fp32, bf16"):
        check_precision("fp8")


BASE = [
    "model.name=tiny",
    "model.device=cpu",
    'task.params={digits: 1, ops: "+", n_train: 60, n_heldout: 20}',
    "reward.num_workers=0",
    "rollout.prompts_per_step=4",
    "rollout.group_size=4",
    "rollout.max_new_tokens=4",
    "eval.at_start=false",
    "optimizer.lr=1e-3",
    "threads=1",
]


def test_config_rejects_bf16_precision_over_bf16_weights(tmp_path):
    with pytest.raises(ValueError, match=r"model\.dtype float32"):
        load_rl_config(None, [*BASE, f"out_dir={tmp_path}", "model.precision=bf16", "model.dtype=bf16"])
    with pytest.raises(ValueError, match="precision"):
        load_rl_config(None, [*BASE, f"out_dir={tmp_path}", "model.precision=half"])


@pytest.mark.parametrize("engine", ["hf", "fast"])
def test_trainer_step_in_bf16(tmp_path, engine):
    metrics = {}
    for prec in ("fp32", "bf16"):
        cfg = load_rl_config(
            None,
            [
                *BASE,
                f"out_dir={tmp_path / prec}",
                f"model.precision={prec}",
                f"rollout.engine={{name: {engine}}}",
            ],
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DegenerateSettingWarning)
            tr = RLTrainer(cfg)
            seen = []
            gen = tr.engine.generate

            def spy(*a, _gen=gen, _seen=seen, **k):
                _seen.append(torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu"))
                return _gen(*a, **k)

            tr.engine.generate = spy
            metrics[prec] = tr.step()
        assert seen and all(s == (torch.bfloat16 if prec == "bf16" else False) for s in seen)
        assert all(p.dtype == torch.float32 for p in tr.model.parameters())
        for st in tr.optimizer.state.values():
            assert st["exp_avg"].dtype == st["exp_avg_sq"].dtype == torch.float32
        tr.close()
    # rollout and training forward run in the same precision: their log-probs agree (fp32: exactly up to
    # float noise; bf16: within the bf16 bound and visibly above fp32 noise)
    assert metrics["fp32"]["rollout_logp_diff"] < 1e-5
    assert metrics["bf16"]["rollout_logp_diff"] < 0.01
    # the training forward ran in bf16: the same seed gives a visibly different entropy
    assert abs(metrics["bf16"]["entropy"] - metrics["fp32"]["entropy"]) > 1e-5


# ------------------------------------------------------- the precision outside the RL trainer
def test_hf_engine_honours_the_context_precision_outside_any_autocast(batch):
    """``build_engine("hf", ctx(precision=bf16))`` samples in bf16 by itself (before 2026-12-02 only the
    fast engine did; evaluations that forgot the caller-side autocast ran fp32): its log-probs equal
    those of the same engine under an explicit autocast, and differ from fp32."""
    from posttrain.rollout.registry import EngineContext, build_engine

    model, ids, _, _ = batch
    prompts = [ids[i, :4].tolist() for i in range(0, ids.shape[0], 4)]
    params = SamplingParams(max_new_tokens=6, temperature=1.0)

    def run(precision, outer):
        eng = build_engine("hf", {}, EngineContext(model, _tok_of(model), seed=3, precision=precision))
        assert eng.precision == precision
        with precision_autocast("cpu", outer):
            return eng.generate(prompts, [2] * len(prompts), params)

    own, outer, fp32 = run("bf16", "fp32"), run("fp32", "bf16"), run("fp32", "fp32")
    assert torch.equal(own.completion_ids, outer.completion_ids)
    assert torch.allclose(own.logprobs, outer.logprobs, atol=0, rtol=0)
    assert float((own.logprobs - fp32.logprobs).abs().max()) > 1e-5  # bf16 really on
    with pytest.raises(ValueError, match="precision"):
        HFEngine(model, _tok_of(model), precision="fp8")


def _tok_of(model):
    name = "tiny-qwen2" if "qwen" in type(model).__name__.lower() else "tiny"
    return load_model_and_tokenizer(name, seed=0, padding_side="left")[1]


def test_evaluate_generates_in_the_given_precision():
    """``evaluate(..., precision=)`` reaches the engine (the smol demo's and the PaTaRM demo's
    evaluations pass their run's precision instead of wrapping autocast themselves)."""
    from posttrain.rewards import get_reward
    from posttrain.rollout import FunctionRewardSource
    from posttrain.tasks import get_task
    from posttrain.train import evaluate as ev_mod

    model, tok = load_model_and_tokenizer("tiny", seed=0, padding_side="left")
    task = get_task("arithmetic", digits=1, ops="+", n_train=4, n_heldout=4)
    seen = []
    real = HFEngine._generate_rows

    def spy(self, rows, params):
        seen.append(self.precision)
        return real(self, rows, params)

    src = FunctionRewardSource(get_reward(task.default_reward), num_workers=0)
    try:
        HFEngine._generate_rows = spy
        for prec in ("fp32", "bf16"):
            ev_mod.evaluate(model, tok, task.split("heldout"), src, max_new_tokens=2, precision=prec)
    finally:
        HFEngine._generate_rows = real
        src.close()
    assert seen == ["fp32", "bf16"]


def _sft_grad(tmp_path, precision):
    from posttrain.train.sft import SFTConfig, SFTTrainer

    cfg = SFTConfig(steps=1, batch_size=8, seed=0, threads=1, out_dir=str(tmp_path / precision), save=False)
    cfg.model.name = "tiny"
    cfg.model.device = "cpu"
    cfg.model.precision = precision
    cfg.task.params = {"digits": 1, "ops": "+", "n_train": 16, "n_heldout": 4}
    tr = SFTTrainer(cfg)
    tr.model.zero_grad(set_to_none=True)
    tr.accumulate_gradients(list(range(8)))
    g = torch.cat([p.grad.flatten() for p in tr.model.parameters() if p.grad is not None])
    assert g.dtype == torch.float32 and all(p.dtype == torch.float32 for p in tr.model.parameters())
    tr.close()
    return g


def test_sft_trains_in_model_precision(tmp_path):
    """SFT honours ``model.precision`` (before 2026-12-02 it accepted the key and trained in fp32): the
    bf16 gradient on a fixed batch differs from fp32's, within the same bound as RL's."""
    g32, g16 = _sft_grad(tmp_path, "fp32"), _sft_grad(tmp_path, "bf16")
    rel = float((g16 - g32).norm() / g32.norm())
    assert 1e-4 < rel <= GRAD_REL_MAX
