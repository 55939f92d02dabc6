"""SFT trainer: bitwise resume, micro-batch gradient equivalence, eval.every / eval_data, the shared
optimizer config (with the old top-level keys), the adapter plug point, `posttrain sft --resume`."""

from __future__ import annotations

import json

import pytest
import torch
from _train_helpers import kill_at_step
from safetensors.torch import load_file
from typer.testing import CliRunner

from posttrain.cli import app
from posttrain.models import CausalLMAdapter, load_model_and_tokenizer
from posttrain.train.config import EvalConfig, OptimizerConfig
from posttrain.train.sft import SFTConfig, SFTDataError, SFTTrainer
from posttrain.utils.config import ConfigError, build_config
from posttrain.utils.io import read_jsonl

ROWS = [
    {"prompt": "1+1=", "completion": "2"},
    {"prompt": "12+30=", "completion": "42"},
    {"text": "the cat sat"},
    {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]},
    {
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "2*3?"},
            {"role": "assistant", "content": "6"},
            {"role": "user", "content": "and 2*4?"},
            {"role": "assistant", "content": "8"},
        ]
    },
    {"prompt": "9-4=", "completion": "5"},
    {"text": "a longer line of plain text to model"},
]


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _cfg(tmp_path, name="run", **kw):
    base = dict(
        model={"name": "tiny", "device": "cpu"},
        data=str(_write(tmp_path / "train.jsonl", ROWS)),
        steps=6,
        batch_size=3,
        micro_batch_size=2,
        optimizer={"lr": 3e-3, "schedule": "cosine", "warmup_steps": 2, "weight_decay": 0.01},
        out_dir=str(tmp_path / name),
        threads=1,
        seed=3,
        progress=False,
    )
    base.update(kw)
    return SFTConfig(**base)


def _weights(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _assert_same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_n_steps_equal_half_then_resume_then_half_bitwise(tmp_path, monkeypatch):
    # 6 steps x 3 rows over 7 rows: the data order wraps into a third epoch; cosine + warmup lr
    full = SFTTrainer(_cfg(tmp_path, "full"))
    full.train()

    crashed = SFTTrainer(_cfg(tmp_path, "split", checkpoint={"every": 3}))
    kill_at_step(monkeypatch, SFTTrainer, 3)  # killed right after the step-3 checkpoint
    with pytest.raises(KeyboardInterrupt):
        crashed.train()
    monkeypatch.undo()
    assert (tmp_path / "split" / "checkpoints" / "latest").read_text().strip() == "step_000003"

    resumed = SFTTrainer(_cfg(tmp_path, "split", checkpoint={"every": 3}), resume=True)
    assert resumed.step_idx == 3 and resumed.shuffler.state_dict() == {"epoch": 1, "pos": 2}
    summary = resumed.train()
    assert summary["start_step"] == 3 and summary["steps"] == 6
    _assert_same(_weights(full.model), _weights(resumed.model))
    s_full, s_res = full.optimizer.state_dict()["state"], resumed.optimizer.state_dict()["state"]
    for i in s_full:
        for k in s_full[i]:
            assert torch.equal(torch.as_tensor(s_full[i][k]), torch.as_tensor(s_res[i][k]))

    # the metrics log has each step once, with the uninterrupted run's losses
    def loss(run):
        return [r["loss"] for r in read_jsonl(tmp_path / run / "metrics.jsonl") if r["kind"] == "step"]

    assert loss("split") == loss("full") and len(loss("full")) == 6
    # the saved final model is the same too
    a = load_file(str(tmp_path / "full" / "model" / "model.safetensors"))
    b = load_file(str(tmp_path / "split" / "model" / "model.safetensors"))
    _assert_same(a, b)


def test_resume_refuses_other_data_and_non_sft_checkpoints(tmp_path):
    cfg = _cfg(tmp_path, steps=2)
    SFTTrainer(cfg).train()
    other = _write(tmp_path / "other.jsonl", ROWS[:4])
    with pytest.raises(SFTDataError, match="trained on different data"):
        SFTTrainer(cfg.model_copy(update={"data": str(other)}), resume=True)
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        SFTTrainer(_cfg(tmp_path, "fresh"), resume=True)
    model, tok = load_model_and_tokenizer("tiny")
    with pytest.raises(ValueError, match="do not pass a model"):
        SFTTrainer(cfg, model, tok, resume=True)


def _grads(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("micro", [1, 2, 3, 5])
def test_micro_batched_gradients_equal_the_full_batch(tmp_path, micro):
    cfg = _cfg(tmp_path, model={"name": "tiny", "device": "cpu", "dtype": "float64"}, micro_batch_size=None)
    tr = SFTTrainer(cfg)
    idx = list(range(len(ROWS)))  # rows of different lengths and formats: padding differs per split
    tr.model.zero_grad(set_to_none=True)
    loss_full, n_full = tr.accumulate_gradients(idx)
    full = _grads(tr.model)

    tr.cfg.micro_batch_size = micro
    tr.model.zero_grad(set_to_none=True)
    loss_micro, n_micro = tr.accumulate_gradients(idx)
    split = _grads(tr.model)
    assert n_micro == n_full and loss_micro == pytest.approx(loss_full, rel=1e-12)
    for k in full:
        torch.testing.assert_close(split[k], full[k], rtol=1e-10, atol=1e-13)

    # normalising each micro-batch by its own token count (the classic accumulation bug) differs
    tr.model.zero_grad(set_to_none=True)
    for part in tr._micro_batches(idx):
        (
            tr._summed_nll(part)
            / sum(tr.examples[i].n_loss_tokens for i in part)
            / len(tr._micro_batches(idx))
        ).backward()
    wrong = _grads(tr.model)
    if micro < len(ROWS):
        assert max(float((wrong[k] - full[k]).abs().max()) for k in full) > 1e-6


def test_micro_batched_training_matches_full_batch_training(tmp_path):
    f64 = {"name": "tiny", "device": "cpu", "dtype": "float64"}
    a = SFTTrainer(_cfg(tmp_path, "a", model=f64, micro_batch_size=None, steps=3, save=False))
    b = SFTTrainer(_cfg(tmp_path, "b", model=f64, micro_batch_size=1, steps=3, save=False))
    a.train(), b.train()
    wa, wb = _weights(a.model), _weights(b.model)
    for k in wa:
        torch.testing.assert_close(wb[k], wa[k], rtol=1e-9, atol=1e-12)


TASK = {"name": "arithmetic", "params": {"digits": 1, "ops": "+", "n_train": 20, "n_heldout": 4}}


def test_eval_every_evaluates_the_task_heldout_periodically(tmp_path):
    cfg = SFTConfig(
        model={"name": "tiny", "device": "cpu"},
        task=TASK,
        steps=4,
        batch_size=4,
        eval={"every": 2, "n": 4},
        max_new_tokens=3,
        out_dir=str(tmp_path / "r"),
        threads=1,
        progress=False,
    )
    summary = SFTTrainer(cfg).train()
    evals = [r for r in read_jsonl(tmp_path / "r" / "metrics.jsonl") if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [2, 4]
    assert all(r["n"] == 4 and 0 <= r["accuracy"] <= 1 for r in evals)
    assert summary["eval"]["accuracy"] == evals[-1]["accuracy"]


def test_eval_data_gives_a_heldout_loss_and_eval_every_needs_it(tmp_path):
    held = _write(tmp_path / "held.jsonl", ROWS[:3])
    cfg = _cfg(tmp_path, eval_data=str(held), eval={"every": 2, "at_start": True}, steps=4)
    tr = SFTTrainer(cfg)
    before = tr.heldout_loss()
    summary = tr.train()
    evals = [r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [0, 2, 4]
    assert evals[0]["loss"] == pytest.approx(before["loss"]) and evals[0]["loss_rows"] == 3
    assert evals[-1]["loss"] < evals[0]["loss"]  # the held-out rows are also training rows here
    assert summary["eval"]["loss"] == evals[-1]["loss"]
    with pytest.raises(ValueError, match="eval_data"):
        _cfg(tmp_path, eval={"every": 2})


def test_optimizer_is_rls_optimizer_config_and_old_keys_still_work(tmp_path):
    cfg = SFTConfig()
    assert isinstance(cfg.optimizer, OptimizerConfig) and cfg.optimizer.lr == 1e-3
    old = SFTConfig(lr=3e-3, weight_decay=0.1, warmup_steps=5, schedule="cosine", grad_clip=0.5)
    assert old.optimizer.model_dump() == {
        **cfg.optimizer.model_dump(),
        **dict(lr=3e-3, weight_decay=0.1, warmup_steps=5, schedule="cosine", grad_clip=0.5),
    }
    assert build_config(SFTConfig, overrides=["optimizer.weight_decay=0.1"]).optimizer.lr == 1e-3
    yaml_file = tmp_path / "old.yaml"
    yaml_file.write_text("steps: 3\nlr: 2.0e-3\nschedule: cosine\n")
    assert build_config(SFTConfig, yaml_file).optimizer.lr == 2e-3
    # RL's section objects are taken as they are
    rl_opt, rl_eval = OptimizerConfig(weight_decay=0.2), EvalConfig(every=5)
    shared = SFTConfig(optimizer=rl_opt, eval=rl_eval)
    assert (
        shared.optimizer.model_dump() == rl_opt.model_dump()
        and shared.eval.model_dump() == rl_eval.model_dump()
    )
    with pytest.raises(ConfigError, match=r"both lr and optimizer\.lr"):
        build_config(SFTConfig, yaml_file, ["optimizer.lr=1e-4"])
    # the trainer builds RL's AdamW from it
    tr = SFTTrainer(_cfg(tmp_path, optimizer={"lr": 1e-2, "betas": [0.8, 0.9], "eps": 1e-6}, save=False))
    g = tr.optimizer.param_groups[0]
    assert isinstance(tr.optimizer, torch.optim.AdamW) and g["betas"] == (0.8, 0.9) and g["eps"] == 1e-6


def test_sft_goes_through_the_model_adapter(tmp_path):
    class Counting(CausalLMAdapter):
        calls = 0

        def logprobs(self, input_ids, attention_mask, loss_mask, **kw):
            Counting.calls += 1
            return super().logprobs(input_ids, attention_mask, loss_mask, **kw)

    model, tok = load_model_and_tokenizer("tiny")
    tr = SFTTrainer(_cfg(tmp_path, steps=2, save=False), adapter=Counting(model, tok))
    tr.train()
    assert Counting.calls == 2 * 2  # 2 steps x 2 micro-batches (3 rows, micro_batch_size 2)
    with pytest.raises(ValueError, match="not both"):
        SFTTrainer(_cfg(tmp_path, save=False), model, tok, adapter=Counting(model, tok))


runner = CliRunner()


def _sft(args):
    return runner.invoke(app, ["sft", *args], catch_exceptions=False)


def test_cli_sft_resume_continues_bitwise(tmp_path):
    data = _write(tmp_path / "d.jsonl", ROWS)
    common = [
        "model.name=tiny",
        "model.device=cpu",
        f"data={data}",
        "batch_size=3",
        "threads=1",
        "--no-progress",
    ]
    assert _sft([*common, "steps=4", f"out_dir={tmp_path / 'once'}"]).exit_code == 0
    assert _sft([*common, "steps=2", f"out_dir={tmp_path / 'twice'}"]).exit_code == 0
    res = _sft([*common, "steps=4", f"out_dir={tmp_path / 'twice'}", "--resume"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output.strip().splitlines()[-1])["start_step"] == 2
    a = load_file(str(tmp_path / "once" / "model" / "model.safetensors"))
    b = load_file(str(tmp_path / "twice" / "model" / "model.safetensors"))
    _assert_same(a, b)
    res = _sft([*common, "steps=4", f"out_dir={tmp_path / 'none'}", "--resume"])
    assert res.exit_code == 2 and "no checkpoint" in res.output


def test_cli_sft_non_utf8_data_names_file_and_line(tmp_path):
    data = tmp_path / "latin1.jsonl"
    data.write_bytes(b'{"prompt": "a", "completion": "b"}\n{"prompt": "caf\xe9", "completion": "x"}\n')
    res = _sft(["model.name=tiny", f"data={data}", "steps=1", f"out_dir={tmp_path / 's'}"])
    assert res.exit_code == 2
    assert f"{data}: line 2: not valid UTF-8 (byte 0xe9 at byte 16 of the line)" in res.output


def test_cli_sft_field_mapping_messages_and_text_rows(tmp_path):
    qa = _write(tmp_path / "qa.jsonl", [{"question": f"{i}+1=", "answer": str(i + 1)} for i in range(4)])
    common = ["model.name=tiny", "steps=2", "batch_size=2", "threads=1", "--no-progress"]
    res = _sft([*common, f"data={qa}", f"out_dir={tmp_path / 'qa'}"])
    assert (
        res.exit_code == 2 and "no known fields" in res.output and "data_fields.prompt=question" in res.output
    )
    res = _sft(
        [
            *common,
            f"data={qa}",
            "data_fields.prompt=question",
            "data_fields.completion=answer",
            f"out_dir={tmp_path / 'qa'}",
        ]
    )
    assert res.exit_code == 0, res.output
    chats = _write(tmp_path / "chats.jsonl", ROWS[2:5])  # text and messages rows
    res = _sft(
        [*common, f"data={chats}", f"eval_data={chats}", "eval.every=1", f"out_dir={tmp_path / 'chat'}"]
    )
    assert res.exit_code == 0, res.output
    out = json.loads(res.output.strip().splitlines()[-1])
    assert out["steps"] == 2 and out["eval"]["loss_rows"] == 3
    res = _sft([*common, f"data={chats}", "eval.every=1", f"out_dir={tmp_path / 'x'}"])
    assert res.exit_code == 2 and "eval_data" in res.output
