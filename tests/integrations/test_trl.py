"""posttrain.integrations.trl: a posttrain policy loss inside TRL's GRPOTrainer on the tiny preset
(skipped, visibly, when TRL is not installed: pip install -e '.[trl]')."""

from __future__ import annotations

import importlib
import sys
import warnings

import pytest
import torch

from posttrain.algos import get_policy_loss


def test_import_without_trl_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "trl", None)
    monkeypatch.delitem(sys.modules, "posttrain.integrations.trl", raising=False)
    with pytest.raises(ImportError, match=r'pip install -e "\.\[trl\]"'):
        importlib.import_module("posttrain.integrations.trl")
    monkeypatch.delitem(sys.modules, "posttrain.integrations.trl", raising=False)


def _trainer(tmp_path, loss="dgpo", **kw):
    pytest.importorskip("trl", reason="TRL is not installed (pip install -e '.[trl]')")
    pytest.importorskip("datasets", reason="datasets is not installed (pip install -e '.[trl]')")
    from datasets import Dataset
    from trl import GRPOConfig

    from posttrain.integrations.trl import PosttrainGRPOTrainer
    from posttrain.models import load_model_and_tokenizer

    model, tok = load_model_and_tokenizer("tiny", seed=0)
    data = Dataset.from_list([{"prompt": f"{a}+{a}="} for a in range(4)])

    def reward(completions, **_):  # varied rewards, so advantages are nonzero
        return [float(len(set(c))) for c in completions]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        args = GRPOConfig(
            output_dir=str(tmp_path),
            use_cpu=True,
            bf16=False,
            fp16=False,
            activation_checkpointing=False,
            seed=0,
            max_steps=1,
            per_device_train_batch_size=8,
            gradient_accumulation_steps=1,
            num_generations=4,
            max_completion_length=6,
            temperature=1.0,
            beta=0.0,
            learning_rate=1e-3,
            logging_strategy="steps",
            logging_steps=1,
            save_strategy="no",
            report_to=[],
            disable_tqdm=True,
            use_vllm=False,
            dataloader_num_workers=0,
            remove_unused_columns=False,
            **kw,
        )
        return PosttrainGRPOTrainer(
            model=model,
            reward_funcs=[reward],
            args=args,
            train_dataset=data,
            processing_class=tok,
            loss=loss,
            loss_params={"dgpo_n": 2} if loss == "dgpo" else None,
        )


@pytest.mark.slow
def test_trl_grpo_step_with_a_posttrain_objective_on_the_tiny_preset(tmp_path):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a 1M-parameter model: more threads only contend on a busy CPU
    try:
        _one_step(tmp_path)
    finally:
        torch.set_num_threads(threads)


def _one_step(tmp_path):
    trainer = _trainer(tmp_path, "dgpo")
    before = [p.detach().clone() for p in trainer.model.parameters()]
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = trainer.train()
    assert out.global_step == 1
    moved = sum(
        not torch.equal(a, b.detach()) for a, b in zip(before, trainer.model.parameters(), strict=True)
    )
    assert moved > 0
    logged = {k for row in trainer.state.log_history for k in row}
    assert {"posttrain/weight_mean", "posttrain/clipfrac", "posttrain/approx_kl"} <= logged


def test_loss_is_posttrains_on_trls_tensors(tmp_path):
    """_compute_loss on a hand-made TRL batch (old log-probs differ from the current ones) equals
    get_policy_loss('dgpo', dgpo_n=2) on the same log-probs, and differs from n = 1."""
    trainer = _trainer(tmp_path, "dgpo")
    g = torch.Generator().manual_seed(1)
    b, p, t = 4, 5, 6
    inputs = {
        "prompt_ids": torch.randint(4, 90, (b, p), generator=g),
        "prompt_mask": torch.ones(b, p, dtype=torch.long),
        "completion_ids": torch.randint(4, 90, (b, t), generator=g),
        "completion_mask": torch.tensor([[1] * 6, [1] * 4 + [0] * 2, [1] * 6, [1] * 2 + [0] * 4]),
        "advantages": torch.tensor([1.0, -1.5, -0.5, 2.0]),
    }
    trainer.model.train()
    with torch.no_grad():
        logp, _, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model,
            torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1),
            torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1),
            t,
        )
    inputs["old_per_token_logps"] = logp + torch.randn(b, t, generator=g) * 0.5
    got = trainer._compute_loss(trainer.model, inputs)
    args = (logp, inputs["old_per_token_logps"], inputs["advantages"], inputs["completion_mask"])
    want, _ = get_policy_loss("dgpo")(*args, dgpo_n=2)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(got, get_policy_loss("dgpo")(*args, dgpo_n=1)[0])
    assert trainer._metrics["train"]["posttrain/clipfrac"]


def test_bad_loss_settings_are_clear_errors(tmp_path):
    with pytest.raises(KeyError, match="dgpoo"):
        _trainer(tmp_path, "dgpoo")
