"""The vLLM rollout engine's parts that need no vLLM (the main suite): registration and config-time
parameter checks, the missing-extra error, the truncated-importance-sampling math, the trainer applying the
run's one correction (``rollout.is_correction``) to a mismatched sampler, the deadline wrapper and the KV-cache sizing. vLLM itself runs in
tests_vllm/ (``make test-vllm``)."""

from __future__ import annotations

import math
import sys

import pytest
import torch

from posttrain.algos.importance import TIS_MODES, truncated_is_weights
from posttrain.rollout import ENGINES, EngineContext, HFEngine, build_engine
from posttrain.rollout.registry import check_component_params
from posttrain.rollout.vllm import vllm_engine


def test_vllm_engine_is_registered_with_checked_params():
    assert ENGINES.get("vllm") is vllm_engine
    check_component_params(ENGINES, "vllm", {"gpu_memory_utilization": 0.4, "sleep_level": 2})
    with pytest.raises(Exception, match="gpu_mem"):
        check_component_params(ENGINES, "vllm", {"gpu_mem": 0.4})


def test_building_without_vllm_names_the_extra(monkeypatch):
    from posttrain.models import load_model_and_tokenizer

    monkeypatch.setitem(sys.modules, "vllm", None)
    model, tok = load_model_and_tokenizer("tiny")
    with pytest.raises(ImportError, match=r'pip install -e "\.\[vllm\]"'):
        build_engine("vllm", {}, EngineContext(model, tok, seed=0))
    for bad, match in (
        ({"sleep_level": 3}, "sleep_level"),
        ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
    ):
        with pytest.raises(ValueError, match=match):  # checked before vLLM is imported
            build_engine("vllm", bad, EngineContext(model, tok, seed=0))


def test_truncated_is_weights_by_hand():
    trainer = torch.tensor([[-1.0, -2.0, -0.5, 0.0], [-1.0, -1.0, -3.0, -9.0]])
    sampler = torch.tensor([[-2.0, -1.0, -0.5, 5.0], [-1.2, -0.9, -2.0, 7.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 0]])
    rho = torch.exp(trainer - sampler)
    w = truncated_is_weights(trainer, sampler, mask, mode="token_truncate", cap=2.0)
    torch.testing.assert_close(w[:, :3], rho[:, :3].clamp(max=2.0))
    assert w[0, 0] == 2.0 and w[0, 1] == pytest.approx(math.exp(-1)) and w[0, 2] == 1.0
    assert bool((w[:, 3] == 1).all())  # padding: weight 1 whatever the log-probs there
    m = truncated_is_weights(trainer, sampler, mask, mode="token_mask", cap=2.0, floor=0.5)
    assert m[0, 0] == 0 and m[0, 1] == 0 and m[0, 2] == 1  # e > 2 and e^-1 < 0.5 are dropped
    assert m[1, 0] == pytest.approx(math.exp(0.2)) and m[1, 2] == 0  # e^-1 < 0.5
    s = truncated_is_weights(trainer, sampler, mask, mode="sequence_truncate", cap=5.0)
    seq = torch.exp(((trainer - sampler) * mask).sum(1))
    torch.testing.assert_close(s[:, :3], seq.clamp(max=5.0)[:, None].expand(2, 3))
    sm = truncated_is_weights(trainer, sampler, mask, mode="sequence_mask", cap=1.0, floor=0.5)
    assert seq[0] == pytest.approx(1.0) and seq[1] == pytest.approx(math.exp(-0.9))
    assert bool((sm[0, :3] == seq[0]).all()) and bool((sm[1, :3] == 0).all())  # row 1: e^-0.9 < 0.5
    with pytest.raises(ValueError, match="tis_mode must be one of"):
        truncated_is_weights(trainer, sampler, mask, mode="token")
    # no gradient flows through the weights; inf / nan log-probs still give finite weights
    t = trainer.clone().requires_grad_(True)
    assert not truncated_is_weights(t, sampler, mask).requires_grad
    bad = sampler.clone()
    bad[0, 0], bad[0, 1] = float("-inf"), float("nan")
    assert bool(torch.isfinite(truncated_is_weights(trainer, bad, mask)).all())
    assert set(TIS_MODES) == {"token_truncate", "token_mask", "sequence_truncate", "sequence_mask"}


class _MismatchedSampler(HFEngine):
    """An HF engine whose recorded sampling log-probs are 1 nat lower than the trainer's (a sampler whose
    kernels disagree with the trainer): with token-truncated IS at cap 2 every weight is min(e, 2) = 2."""

    def __init__(self, ctx: EngineContext) -> None:
        super().__init__(ctx.model, ctx.tokenizer, seed=ctx.seed, max_batch_size=ctx.max_batch_size)

    def generate(self, prompt_ids, n_per_prompt, params):
        b = super().generate(prompt_ids, n_per_prompt, params)
        b.logprobs = (b.logprobs - 1.0) * b.completion_mask
        return b


@pytest.mark.filterwarnings("ignore::posttrain.train.rl.DegenerateSettingWarning")
def test_trainer_multiplies_the_loss_by_the_correction_over_the_engines_mismatch(tmp_path):
    """``rollout.is_correction`` (here token_truncate at cap 2) corrects a synchronous engine's
    sampler/trainer mismatch with the same weight as staleness: the loss doubles; ``auto`` applies none
    synchronously."""
    from posttrain.rollout.reward_source import FunctionRewardSource
    from posttrain.train.config import load_rl_config
    from posttrain.train.rl import RLTrainer

    def reward(text, example):
        return float(len(set(text)))

    losses = {}
    ENGINES.register("test-mismatch")(_MismatchedSampler)
    try:
        for tis in (False, True):
            cfg = load_rl_config(
                None,
                [
                    "model.name=tiny",
                    "model.device=cpu",
                    'task.params={digits: 1, ops: "+", n_train: 20, n_heldout: 4}',
                    "reward.num_workers=0",
                    "rollout.prompts_per_step=2",
                    "rollout.group_size=4",
                    "rollout.max_new_tokens=4",
                    "eval.at_start=false",
                    "eval.n=4",
                    f"out_dir={tmp_path / str(tis)}",
                    "rollout.engine.name=test-mismatch",
                    f"rollout.is_correction.mode={'token_truncate' if tis else 'auto'}",
                    "rollout.is_correction.cap=2.0",
                ],
            )
            tr = RLTrainer(cfg, reward_source=FunctionRewardSource(reward, num_workers=0))
            losses[tis] = tr.step()["pg_loss"]
    finally:
        ENGINES._items.pop("test-mismatch", None)
    assert losses[False] != 0
    assert losses[True] == pytest.approx(2.0 * losses[False], rel=1e-5)


# ------------------------------------------------------------------- parts that need no vLLM
def test_call_with_timeout_returns_raises_and_never_hangs():
    import threading
    import time

    from posttrain.rollout.vllm import VLLMEngineError, call_with_timeout

    assert call_with_timeout("weight sync", lambda: 7, 5.0) == 7
    t0 = time.monotonic()
    with pytest.raises(VLLMEngineError, match=r"weight sync did not finish within 0\.2 s .*sync_timeout_s"):
        call_with_timeout("weight sync", lambda: threading.Event().wait(30), 0.2)
    assert time.monotonic() - t0 < 3

    def fails():
        raise KeyError("layers.0.mlp.up_proj.weight")

    with pytest.raises(VLLMEngineError, match=r"generation failed after .*KeyError.*up_proj") as e:
        call_with_timeout("generation", fails, None)
    assert isinstance(e.value.__cause__, KeyError)
    # the call runs with the caller's torch thread count (a new thread starts with OpenMP's default,
    # which vLLM's CPU attention refuses when it differs from the count its metadata was built with)
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert call_with_timeout("generation", torch.get_num_threads, 5.0) == 1
    finally:
        torch.set_num_threads(old)


def test_kv_cache_sizing_by_hand():
    from transformers import LlamaConfig

    from posttrain.rollout.vllm import CPU_KV_CACHE_CAP, default_cpu_kv_cache_bytes, kv_cache_bytes_per_token

    # SmolLM2-135M: 30 layers, 3 KV heads of 64 dims; K and V; fp32
    cfg = LlamaConfig(num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, hidden_size=576)
    assert kv_cache_bytes_per_token(cfg, 4) == 2 * 30 * 3 * 64 * 4 == 46080
    assert kv_cache_bytes_per_token(cfg, 2) == 23040
    per = 46080
    assert default_cpu_kv_cache_bytes(per, 512, 8) == per * 512 * 8  # room for every sequence
    assert default_cpu_kv_cache_bytes(per, 8192, 256) == CPU_KV_CACHE_CAP  # capped at 2 GiB
    huge = 10**6  # a sequence bigger than the cap: still one full sequence (+256 tokens of blocks)
    assert default_cpu_kv_cache_bytes(huge, 8192, 4) == huge * (8192 + 256)


def test_vllm_timeouts_and_sizes_checked_at_config_time():
    for key in ("sync_timeout_s", "startup_timeout_s", "generate_timeout_s", "kv_cache_memory_bytes"):
        check_component_params(ENGINES, "vllm", {key: None})
    from posttrain.models import load_model_and_tokenizer

    model, tok = load_model_and_tokenizer("tiny")
    with pytest.raises(ValueError, match=r"rollout\.engine\.params\.sync_timeout_s must be > 0"):
        build_engine("vllm", {"sync_timeout_s": 0}, EngineContext(model, tok, seed=0))
