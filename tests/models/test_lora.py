"""LoRA through peft (model.lora): only adapters train, the KL reference is the base model with the
adapters disabled (no copy), checkpoints hold the adapter only, resume is bitwise, `export --merge`
writes a plain HF directory whose logits equal the adapter model's."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from typer.testing import CliRunner

pytest.importorskip("peft")

from _train_helpers import FirstCharDigit  # a reward a random tiny model can learn

from posttrain.cli import app
from posttrain.models import load_model_and_tokenizer
from posttrain.models.lora import AdapterDisabledLM, is_adapter_dir, is_lora
from posttrain.rollout import FunctionRewardSource
from posttrain.train.config import load_rl_config
from posttrain.train.rl import DegenerateSettingWarning, RLTrainer
from posttrain.train.sft import SFTConfig, SFTTrainer
from posttrain.utils.config import ConfigError, build_config

BASE = [
    "model.name=tiny",
    "model.device=cpu",
    'task.params={digits: 1, ops: "+", n_train: 40, n_heldout: 10}',
    "reward.num_workers=0",
    "rollout.prompts_per_step=4",
    "rollout.group_size=4",
    "rollout.max_new_tokens=3",
    "eval.n=4",
    "eval.at_start=false",
    "optimizer.lr=1e-2",
    "threads=1",
]
LORA = ["model.lora.rank=4", "model.lora.alpha=8"]


def rl_cfg(tmp_path, *extra):
    return load_rl_config(None, [*BASE, f"out_dir={tmp_path / 'run'}", *extra])


def test_config_defaults_and_errors():
    c = load_rl_config(None, ["model.lora.rank=8"])
    assert c.model.lora.rank == 8 and c.model.lora.alpha == 32
    assert c.model.lora.target_modules == [
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"
    ]  # fmt: skip
    assert load_rl_config(None, []).model.lora is None
    with pytest.raises(ConfigError, match=r"model\.lora\.rank"):
        load_rl_config(None, ["model.lora.rank=0"])
    with pytest.raises(ConfigError, match=r"model\.lora\.target_modules"):
        load_rl_config(None, ["model.lora.target_modules=[]"])


def test_unknown_target_module_names_the_layers_there(tmp_path):
    with pytest.raises(ValueError, match=r"qkv_proj not found .* q_proj"):
        RLTrainer(rl_cfg(tmp_path, *LORA, "model.lora.target_modules=[qkv_proj]"))


def test_rl_trains_adapters_only_with_the_base_as_kl_reference(tmp_path):
    src = FunctionRewardSource(FirstCharDigit(), num_workers=0)
    cfg = rl_cfg(tmp_path, *LORA, "kl.coef=0.1", "steps=2", "eval.at_end=false", "rollout.group_size=8")
    with RLTrainer(cfg, reward_source=src) as tr:
        assert is_lora(tr.model)
        assert isinstance(tr.ref_lm, AdapterDisabledLM) and tr.ref_lm.model is tr.model  # no second copy
        before = {n: p.detach().clone() for n, p in tr.model.named_parameters()}
        trainable = {n for n, p in tr.model.named_parameters() if p.requires_grad}
        assert trainable and all("lora_" in n for n in trainable)
        opt_params = {id(p) for g in tr.optimizer.param_groups for p in g["params"]}
        assert opt_params == {id(p) for n, p in tr.model.named_parameters() if n in trainable}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DegenerateSettingWarning)
            m = tr.step()
            m2 = tr.step()
        after = dict(tr.model.named_parameters())
        changed = {n for n in before if not torch.equal(before[n], after[n])}
        assert changed and changed <= trainable  # base weights frozen
        assert any("lora_B" in n for n in changed)
        assert m["kl"] == pytest.approx(0.0, abs=1e-6)  # B = 0 at the start: policy == base
        assert abs(m2["kl"]) > 1e-7  # after an update the adapters move the policy away from the base
        # the reference really is the base model: the same module's logits with adapters disabled
        ids = torch.tensor([[5, 6, 7, 8]])
        am = torch.ones_like(ids)
        lm_mask = torch.tensor([[0, 1, 1, 1]])
        ref_lp, _ = tr.ref_lm.logprobs(ids, am, lm_mask)
        base, _ = load_model_and_tokenizer("tiny", seed=0)
        from posttrain.models import CausalLMAdapter

        base_lp, _ = CausalLMAdapter(base, tr.tokenizer).logprobs(ids, am, lm_mask)
        torch.testing.assert_close(ref_lp, base_lp, rtol=0, atol=1e-6)
        pol_lp, _ = tr.lm.logprobs(ids, am, lm_mask)
        assert (pol_lp - base_lp).abs().max() > 1e-6


def test_checkpoint_holds_the_adapter_only_and_resume_is_bitwise(tmp_path):
    extra = [*LORA, "checkpoint.every=2", "checkpoint.final=false", "eval.at_end=false", "kl.coef=0.05"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateSettingWarning)
        full = RLTrainer(rl_cfg(tmp_path / "a", "steps=4", *extra))
        full.train(progress=False)
        part = RLTrainer(rl_cfg(tmp_path / "b", "steps=2", *extra))
        part.train(progress=False)
        ckpt_model = tmp_path / "b" / "run" / "checkpoints" / "step_000002" / "model"
        assert is_adapter_dir(ckpt_model)
        assert not (ckpt_model / "model.safetensors").exists()
        from safetensors.torch import load_file

        saved = load_file(str(ckpt_model / "adapter_model.safetensors"))
        assert saved and all("lora_" in k for k in saved)
        assert json.loads((ckpt_model / "posttrain_base.json").read_text())["model"] == "tiny"
        del part
        resumed = RLTrainer(rl_cfg(tmp_path / "b", "steps=4", *extra), resume=True)
        assert resumed.step_idx == 2 and is_lora(resumed.model)
        assert isinstance(resumed.ref_lm, AdapterDisabledLM)
        resumed.train(progress=False)
    pairs = zip(full.model.named_parameters(), resumed.model.named_parameters(), strict=True)
    for (n, a), (m, b) in pairs:
        assert n == m and torch.equal(a, b), n
    full.close()
    resumed.close()


def test_sft_lora_then_export_merge_gives_the_same_logits(tmp_path):
    cfg = build_config(
        SFTConfig,
        None,
        [
            "model.name=tiny",
            "model.device=cpu",
            'task.params={digits: 1, ops: "+", n_train: 16, n_heldout: 4}',
            "steps=3",
            "batch_size=4",
            "eval.at_end=false",
            "threads=1",
            f"out_dir={tmp_path / 'sft'}",
            "model.lora.rank=4",
            "model.lora.target_modules=[q_proj, v_proj, down_proj]",
        ],
    )
    with SFTTrainer(cfg) as tr:
        tr.train()
        assert is_lora(tr.model)
    model_dir = tmp_path / "sft" / "model"
    assert is_adapter_dir(model_dir)
    # every loader reads the adapter directory (and the run folder) like a model directory
    lora_model, tok = load_model_and_tokenizer(str(tmp_path / "sft"))
    assert is_lora(lora_model)
    out = tmp_path / "merged"
    res = CliRunner().invoke(app, ["export", "--merge", str(tmp_path / "sft"), str(out)])
    assert res.exit_code == 0, res.output
    assert (out / "config.json").is_file() and not (out / "adapter_config.json").exists()
    merged, _ = load_model_and_tokenizer(str(out))
    assert not is_lora(merged)
    ids = torch.tensor([tok.encode("3+4=")])
    with torch.no_grad():
        a = lora_model(input_ids=ids).logits
        b = merged(input_ids=ids).logits
        base, _ = load_model_and_tokenizer("tiny")
        c = base(input_ids=ids).logits
    torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
    assert (a - c).abs().max() > 1e-4  # the adapters changed the model, so the check can fail
    # merging a plain model directory is refused with a message
    res = CliRunner().invoke(app, ["export", "--merge", str(out), str(tmp_path / "again")])
    assert res.exit_code == 2 and "nothing to merge" in res.output


def test_rl_from_a_lora_sft_run_merges_it_first(tmp_path):
    cfg = build_config(
        SFTConfig,
        None,
        [
            "model.name=tiny",
            "model.device=cpu",
            'task.params={digits: 1, ops: "+", n_train: 16, n_heldout: 4}',
            "steps=2",
            "batch_size=4",
            "eval.at_end=false",
            f"out_dir={tmp_path / 'sft'}",
            "model.lora.rank=4",
        ],
    )
    with SFTTrainer(cfg) as tr:
        tr.train()
        sft_model = tr.model
    ids = torch.tensor([[5, 6, 7]])
    with torch.no_grad():
        want = sft_model(input_ids=ids).logits
    # full fine-tuning from the LoRA SFT model: merged, no adapters left
    with RLTrainer(rl_cfg(tmp_path / "full", f"model.name={tmp_path / 'sft'}", "steps=0")) as tr:
        assert not is_lora(tr.model)
        with torch.no_grad():
            torch.testing.assert_close(tr.model(input_ids=ids).logits, want, rtol=1e-5, atol=1e-5)
    # new adapters on the merged SFT model: the KL reference (adapters disabled) is that model
    cfg2 = rl_cfg(tmp_path / "lora", f"model.name={tmp_path / 'sft'}", *LORA, "kl.coef=0.1", "steps=0")
    with RLTrainer(cfg2) as tr, torch.no_grad(), tr.model.disable_adapter():
        torch.testing.assert_close(tr.model(input_ids=ids).logits, want, rtol=1e-5, atol=1e-5)


def test_cli_rl_with_lora_then_eval_and_resume(tmp_path):
    """`posttrain rl model.lora.rank=4` end to end: adapter-only checkpoint, `posttrain eval --model RUN`
    loads base + adapter, `--resume` continues it."""
    run = tmp_path / "run"
    args = [
        "rl",
        *[a for a in BASE if not a.startswith("rollout.prompts")],
        "rollout.prompts_per_step=2",
        "eval.at_end=false",
        "kl.coef=0.05",
        *LORA,
        f"out_dir={run}",
    ]
    res = CliRunner().invoke(app, [*args, "steps=1"])
    assert res.exit_code == 0, res.output
    assert is_adapter_dir(run / "checkpoints" / "step_000001" / "model")
    ev = CliRunner().invoke(app, ["eval", "--model", str(run), "--n", "2", "--max-new-tokens", "2"])
    assert ev.exit_code == 0, ev.output
    res = CliRunner().invoke(app, [*args, "steps=2", "--resume"])
    assert res.exit_code == 0, res.output
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_000002"


def test_lora_and_export_merge_show_no_transformers_deprecation(tmp_path):
    """Issue 58 item 12: `export --merge` (and every LoRA run) printed transformers' "`is_gradient_
    checkpointing` is deprecated and will be removed in v6", raised inside peft when it wraps a model."""
    from posttrain.models.lora import apply_lora, write_base_file
    from posttrain.train.config import LoRAConfig

    model, _ = load_model_and_tokenizer("tiny", seed=0)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        lora = apply_lora(model, LoRAConfig(rank=2), base={"model": "tiny", "seed": 0, "dtype": "float32"})
        lora.save_pretrained(tmp_path / "adapter")
        write_base_file(lora, tmp_path / "adapter")
        res = CliRunner().invoke(app, ["export", "--merge", str(tmp_path / "adapter"), str(tmp_path / "out")])
    assert res.exit_code == 0, res.output
    deprecations = [str(w.message) for w in seen if "deprecated" in str(w.message)]
    assert not deprecations, deprecations
    assert "deprecated" not in res.output
