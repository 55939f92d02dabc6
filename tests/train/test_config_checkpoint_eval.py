"""Config errors name the key; checkpoints are atomic and pickle-free; pass@k; LR schedule; SFT data errors."""

from __future__ import annotations

import json
import math
import random
from math import comb
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.train.checkpoint import (
    LATEST,
    capture_rng,
    load_checkpoint,
    resolve_checkpoint,
    restore_rng,
    save_checkpoint,
)
from posttrain.train.config import load_rl_config
from posttrain.train.evaluate import pass_at_k
from posttrain.train.optim import lr_at
from posttrain.train.sft import SFTDataError, load_sft_jsonl
from posttrain.utils.config import ConfigError


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("objective.name=dgpoo", "objective.name"),
        ("objective.params={clip_lowx: 0.1}", "clip_lowx"),
        ("kl.kind=k9", "kl.kind"),
        ("advantage.name=grpoo", "advantage.name"),
        ("optimizer.schedule=linear", "optimizer.schedule"),
        ("rollout.lrr=1", "rollout.lrr"),
        ("hooks.sampler={name: nope}", "hooks.sampler: Value error, name: unknown value 'nope'"),
        ("objective.agg=token-meen", "objective.agg"),
        ("rollout.top_p=1.5", "rollout.top_p"),
    ],
)
def test_config_errors_name_the_key(override, needle):
    with pytest.raises(ConfigError) as e:
        load_rl_config(None, [override])
    assert needle in str(e.value)


def test_config_error_lists_accepted_values():
    with pytest.raises(ConfigError) as e:
        load_rl_config(None, ["objective.name=dgpoo"])
    msg = str(e.value)
    assert "did you mean 'dgpo'" in msg and "maspo" in msg
    with pytest.raises(ConfigError, match=r"accepted: .*dgpo_m"):
        load_rl_config(None, ["objective.name=dgpo", "objective.params={bogus: 1}"])
    cfg = load_rl_config(None, ["objective.name=dgpo", "objective.params={dgpo_n: 2}", "ppo_epochs=2"])
    assert cfg.objective.params == {"dgpo_n": 2} and cfg.off_policy


def test_shipped_configs_validate():
    """Every YAML the library ships is a valid RL config (the lab checks its own: lab/tests/test_configs.py)."""
    from importlib.resources import files

    names = [p.name for p in files("posttrain.configs").iterdir() if p.name.endswith(".yaml")]
    assert {"grpo-arithmetic.yaml", "qwen3-gsm8k.yaml"} <= set(names)
    for n in names:
        load_rl_config(str(files("posttrain.configs") / n))


def test_pass_at_k_closed_form():
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - comb(3, 2) / comb(5, 2))  # 0.7
    assert pass_at_k(4, 0, 2) == 0.0 and pass_at_k(4, 3, 2) == 1.0
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 30).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))))
def test_pass_at_k_matches_binomial_ratio(nck):
    n, c, k = nck
    assert pass_at_k(n, c, k) == pytest.approx(1 - comb(n - c, k) / comb(n, k), abs=1e-12)


def test_lr_schedule_closed_form():
    kw = dict(lr=1.0, total_steps=10, warmup_steps=2, min_lr_ratio=0.1)
    assert [lr_at(s, schedule="constant", **kw) for s in (0, 1, 2, 9)] == [0.5, 1.0, 1.0, 1.0]
    assert lr_at(2, schedule="cosine", **kw) == pytest.approx(1.0)
    assert lr_at(6, schedule="cosine", **kw) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert lr_at(10, schedule="cosine", **kw) == pytest.approx(0.1)


def test_rng_roundtrip_through_json():
    t, js = capture_rng()
    js = json.loads(json.dumps(js))
    a = (torch.rand(3), np.random.rand(3), random.random())
    restore_rng(t, js)
    b = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(a[0], b[0]) and np.array_equal(a[1], b[1]) and a[2] == b[2]


def test_checkpoint_atomic_layout_optimizer_roundtrip_and_pruning(tmp_path):
    from posttrain.models import load_model_and_tokenizer

    model, tok = load_model_and_tokenizer("tiny", seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(input_ids=torch.tensor([[5, 6, 7]])).logits.sum().backward()
    opt.step()
    root = tmp_path / "checkpoints"
    for step in (1, 2, 3):
        save_checkpoint(
            root,
            step,
            model=model,
            tokenizer=tok,
            optimizer=opt,
            trainer_state={"sampler": {"pos": step}},
            keep=2,
        )
    assert sorted(p.name for p in root.iterdir()) == [LATEST, "step_000002", "step_000003"]
    ck = resolve_checkpoint(tmp_path)
    assert ck.name == "step_000003"
    assert (ck / "model" / "model.safetensors").is_file() and (ck / "optimizer.safetensors").is_file()
    assert not list(ck.rglob("*.pt")) and not list(ck.rglob("*.bin")) and not list(ck.rglob("*.pkl"))
    opt2 = torch.optim.AdamW(model.parameters(), lr=5.0)
    state = load_checkpoint(ck, optimizer=opt2)
    assert state["step"] == 3 and state["sampler"] == {"pos": 3}
    s1, s2 = opt.state_dict(), opt2.state_dict()
    assert s2["param_groups"][0]["lr"] == 1e-3
    for i in s1["state"]:
        for k, v in s1["state"][i].items():
            assert torch.equal(v, s2["state"][i][k])
    # a torn save (a crash before the rename) is invisible: latest still points to the last good one
    (root / ".tmp-step_000004-crashed").mkdir()
    assert resolve_checkpoint(tmp_path).name == "step_000003"
    (root / LATEST).write_text("step_000009\n")
    with pytest.raises(FileNotFoundError, match="not a complete checkpoint"):
        resolve_checkpoint(tmp_path)
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        resolve_checkpoint(tmp_path / "nowhere")


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ('{"prompt": "a", "completion": "b"}\n{"prompt": "c"}\n', "line 2: missing column 'completion'"),
        ('{"prompt": 1, "completion": "b"}\n', "line 1: 'prompt' must be a string, got int"),
        ('{"prompt": "a", "completion": "b"}\nnot json\n', "line 2: invalid JSON"),
        ("[1, 2]\n", "line 1: expected a JSON object"),
        ("\n", "no rows"),
    ],
)
def test_sft_jsonl_errors_name_file_line_and_key(tmp_path, content, needle):
    p = tmp_path / "data.jsonl"
    p.write_text(content)
    with pytest.raises(SFTDataError) as e:
        load_sft_jsonl(p)
    assert str(p) in str(e.value) and needle in str(e.value)


def test_sft_without_examples_is_a_clear_error():
    from posttrain.models import load_model_and_tokenizer
    from posttrain.train.sft import SFTConfig, SFTTrainer

    model, tok = load_model_and_tokenizer("tiny")
    with pytest.raises(SFTDataError, match="no training examples"):
        SFTTrainer(SFTConfig(), model, tok, pairs=[])


def test_resaving_a_step_replaces_it_and_a_crash_keeps_the_old_copy(tmp_path, monkeypatch):
    import posttrain.train.checkpoint as ckpt_mod
    from posttrain.models import load_model_and_tokenizer

    model, _ = load_model_and_tokenizer("tiny", seed=0)
    root = tmp_path / "checkpoints"

    def save(pos):
        return save_checkpoint(
            root, 3, model=model, tokenizer=None, optimizer=None, trainer_state={"sampler": {"pos": pos}}
        )

    save(1)
    save(2)
    assert load_checkpoint(resolve_checkpoint(root))["sampler"] == {"pos": 2}
    assert sorted(p.name for p in root.iterdir()) == [LATEST, "step_000003"]

    real_replace = ckpt_mod.os.replace

    def crash_on_install(src, dst):
        if Path(src).name.startswith(".tmp-"):
            raise OSError("simulated crash")
        real_replace(src, dst)

    monkeypatch.setattr(ckpt_mod.os, "replace", crash_on_install)
    with pytest.raises(OSError, match="simulated crash"):
        save(3)
    (old,) = [p for p in root.iterdir() if p.name.startswith(".old-step_000003")]
    assert json.loads((old / "trainer_state.json").read_text())["sampler"] == {"pos": 2}
