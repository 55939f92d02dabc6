"""The vLLM engine's LoRA path against a FAKE ``vllm`` module, in the main suite (which has no vLLM; the
same path runs on real vLLM in tests_vllm/, ``make test-vllm``): what posttrain hands to vLLM is checked —
the base weights under Hugging Face names with no adapter tensors, ``enable_lora`` with a large-enough
rank, an adapter-only directory and a new LoRARequest per sync, the base reloaded only after a sleep
that discarded it (sleep is a GPU feature: the fake platform here says "not CPU")."""

from __future__ import annotations

import sys
import types

import pytest
import torch
from safetensors.torch import load_file

pytest.importorskip("peft")

from posttrain.models import load_model_and_tokenizer
from posttrain.models.lora import apply_lora
from posttrain.rollout import EngineContext, SamplingParams, build_engine
from posttrain.rollout.vllm import lora_base_state_dict, vllm_lora_rank
from posttrain.train.config import LoRAConfig


class FakeLLM:
    instances: list[FakeLLM] = []

    def __init__(self, **kw) -> None:
        self.kw = kw
        self.loads: list[dict[str, torch.Tensor]] = []  # reload_weights calls (collective_rpc)
        self.requests: list = []
        self.llm_engine = types.SimpleNamespace(engine_core=types.SimpleNamespace(shutdown=lambda: None))
        FakeLLM.instances.append(self)

    def collective_rpc(self, method, kwargs=None):
        assert method == "reload_weights" and kwargs["is_checkpoint_format"] is True
        self.loads.append(dict(kwargs["weights_iterator"]))

    def generate(self, prompts, sampling_params, use_tqdm=False, lora_request=None):
        self.requests.append(lora_request)
        out = []
        for sp in sampling_params:
            comp = types.SimpleNamespace(token_ids=[5, 6], finish_reason="length", logprobs=None)
            out.append(types.SimpleNamespace(outputs=[comp] * sp.n))
        return out

    def sleep(self, level):
        pass

    def wake_up(self, tags=None):
        pass

    def reset_prefix_cache(self):
        pass


@pytest.fixture
def fake_vllm(monkeypatch):
    vllm = types.ModuleType("vllm")
    vllm.LLM = FakeLLM
    vllm.SamplingParams = lambda **kw: types.SimpleNamespace(**kw)
    lora_mod = types.ModuleType("vllm.lora")
    req_mod = types.ModuleType("vllm.lora.request")

    class LoRARequest:
        def __init__(self, name, int_id, path):
            self.lora_name, self.lora_int_id, self.lora_path = name, int_id, path

    req_mod.LoRARequest = LoRARequest
    platforms = types.ModuleType("vllm.platforms")
    platforms.current_platform = types.SimpleNamespace(is_cpu=lambda: False)
    for name, mod in (
        ("vllm", vllm),
        ("vllm.lora", lora_mod),
        ("vllm.lora.request", req_mod),
        ("vllm.platforms", platforms),
    ):
        monkeypatch.setitem(sys.modules, name, mod)
    FakeLLM.instances.clear()
    return vllm


def test_rank_rounding():
    assert [vllm_lora_rank(r) for r in (1, 4, 8, 9, 300)] == [1, 8, 8, 16, 320]
    with pytest.raises(ValueError, match="largest"):
        vllm_lora_rank(1024)


def test_lora_policy_syncs_the_adapter_only(fake_vllm, tmp_path):
    base, tok = load_model_and_tokenizer("tiny")
    plain = {k: v.clone() for k, v in base.state_dict().items()}
    model = apply_lora(base, LoRAConfig(rank=4), base={"model": "tiny", "seed": 0, "dtype": "float32"})
    engine = build_engine("vllm", {"sleep_level": 2}, EngineContext(model, tok, seed=0))
    llm = FakeLLM.instances[0]
    assert llm.kw["enable_lora"] is True and llm.kw["max_lora_rank"] == 8 and llm.kw["max_loras"] == 1
    # vLLM was built from the frozen base under HF names: exactly the plain model's tensors
    import glob

    written = load_file(glob.glob(f"{llm.kw['model']}/*.safetensors")[0])
    assert set(written) == set(plain)
    for k, v in written.items():
        assert torch.equal(v, plain[k]), k
    assert lora_base_state_dict(model).keys() == plain.keys()

    params = SamplingParams(temperature=1.0, max_new_tokens=2)
    engine.generate([[3, 4]], [2], params)
    first = llm.requests[-1]
    assert first is not None and first.lora_int_id == 1
    adapter = load_file(f"{first.lora_path}/adapter_model.safetensors")
    assert adapter and all("lora_" in k for k in adapter)
    assert llm.loads == []  # first sync: the base is already in place

    with torch.no_grad():  # an "update": the next sync must carry it
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.add_(0.5)
    engine.sync_weights(model)  # after generate's level-2 sleep: base reloaded once, new adapter
    assert len(llm.loads) == 1 and set(llm.loads[0]) == set(plain)
    engine.generate([[3, 4]], [1], params)
    second = llm.requests[-1]
    assert second.lora_int_id == 2 and second.lora_path != first.lora_path
    import os

    assert not os.path.exists(first.lora_path)  # the previous adapter directory is removed
    new = load_file(f"{second.lora_path}/adapter_model.safetensors")
    changed = [k for k in new if "lora_B" in k and not torch.equal(new[k], adapter[k])]
    assert changed
