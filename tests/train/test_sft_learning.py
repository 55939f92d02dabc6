"""SFT learns: on a handful of prompt/completion pairs the tiny model's loss falls by orders of
magnitude and greedy decoding then reproduces every completion exactly (then EOS)."""

from __future__ import annotations

import torch

from posttrain.models import load_model_and_tokenizer
from posttrain.train.sft import SFTConfig, SFTTrainer

PAIRS = [("3+4=", "7"), ("12+30=", "42"), ("9+9=", "18"), ("50+7=", "57"), ("6+0=", "6")]


def _greedy(model, tok, prompt: str, max_new_tokens: int = 6) -> list[int]:
    """Plain HF greedy decoding (independent of posttrain's engine): the completion ids, EOS included."""
    ids = torch.tensor([tok.encode(prompt, add_special_tokens=False)])
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=max_new_tokens,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
        )
    return out[0, ids.shape[1] :].tolist()


def test_sft_loss_falls_and_the_model_memorises_the_set(tmp_path):
    """Mutants tried: no optimizer step (loss stays at ~log V); the completion mask shifted one token
    left (trains on the last prompt token, not on EOS) -> the completions are not reproduced."""
    model, tok = load_model_and_tokenizer("tiny", seed=0)
    before = [_greedy(model, tok, p) for p, _ in PAIRS]
    cfg = SFTConfig.model_validate(
        {
            "model": {"name": "tiny", "device": "cpu"},
            "steps": 60,
            "batch_size": len(PAIRS),
            "lr": 3e-3,
            "save": False,
            "progress": False,
            "eval": {"at_end": False},
            "out_dir": str(tmp_path / "sft"),
        }
    )
    trainer = SFTTrainer(cfg, model, tok, pairs=PAIRS)
    first = trainer.step()["loss"]
    summary = trainer.train()
    assert summary["steps"] == 60
    last = summary["last"]["loss"]
    assert first > 3.0  # a random model: about log(357) = 5.9 nats per token
    assert last < 0.01 * first, (first, last)
    model.eval()
    for (prompt, completion), was in zip(PAIRS, before, strict=True):
        want = [*tok.encode(completion, add_special_tokens=False), tok.eos_token_id]
        got = _greedy(model, tok, prompt)
        assert got == want, (prompt, tok.decode(got), completion)
        assert was != want  # not reproduced before training
