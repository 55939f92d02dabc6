"""Tool-calling RL end to end (issue 43): the shipped tool-calling.yaml through `posttrain rl` on the tiny
preset logs tool_call_rate / tool_valid_rate at every step; through the trainer, an agent that calls the
calculator gets its calls counted, its tool results out of the loss and its update computed."""

from __future__ import annotations

import json
import warnings
from importlib.resources import files

import torch
from _engine_helpers import ScriptedEngine
from typer.testing import CliRunner

from posttrain.cli import app
from posttrain.train.config import load_rl_config
from posttrain.train.rl import DegenerateSettingWarning, RLTrainer

CFG = str(files("posttrain") / "configs" / "tool-calling.yaml")
SMALL = [
    "model.name=tiny",
    "rollout.group_size=2",
    "rollout.prompts_per_step=2",
    "rollout.max_new_tokens=24",
    "eval.at_start=false",
    "eval.at_end=false",
    "checkpoint.every=0",
    "threads=1",
    "micro_batch_size=4",
]


def test_the_bar_tool_calling_yaml_on_tiny_logs_tool_metrics_every_step(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateSettingWarning)
        res = CliRunner().invoke(
            app,
            ["rl", "--config", CFG, *SMALL, "steps=2", f"out_dir={tmp_path / 'run'}"],
            catch_exceptions=False,
        )
    assert res.exit_code == 0, res.output
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r.get("kind") == "step"]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        assert 0.0 <= r["tool_call_rate"] <= 1.0 and 0.0 <= r["tool_valid_rate"] <= 1.0


def call_then_answer(context: str) -> str:
    """Round 1: a calculator call; round 2: the number the tool returned."""
    if "\n</tool_response>" in context:
        return context.rsplit("<tool_response>\n", 1)[1].split("\n</tool_response>")[0]
    return '<tool_call>{"name": "calculator", "arguments": {"expression": "2*3+4"}}</tool_call>'


def test_a_step_with_tool_calls_counts_them_and_trains_only_the_agent_tokens(tmp_path):
    cfg = load_rl_config(CFG, [*SMALL, "rollout.max_new_tokens=120", f"out_dir={tmp_path / 'run'}"])
    tr = RLTrainer(cfg)
    runner = tr.collector.runner
    runner.engine = ScriptedEngine(runner.tokenizer, call_then_answer, logprob=-1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateSettingWarning)
        m = tr.step()
    assert m["tool_call_rate"] == 1.0 and m["tool_valid_rate"] == 1.0 and m["tool_calls_mean"] == 1.0
    eps = runner._last
    b = eps.batch
    for i in range(len(b)):
        n = int(b.completion_mask[i].sum())
        text_env = runner.tokenizer.decode(
            b.completion_ids[i, :n][b.action_mask[i, :n] == 0].tolist(), skip_special_tokens=False
        )
        text_act = runner.tokenizer.decode(
            b.completion_ids[i, :n][b.action_mask[i, :n] == 1].tolist(), skip_special_tokens=True
        )
        assert "<tool_response>\n10\n</tool_response>" in text_env  # the tool's output: not trained
        assert "<tool_response>" not in text_act and text_act.endswith("10")
    assert torch.isfinite(torch.tensor(m["pg_loss"]))
    assert m["length_mean"] == float(b.action_lengths.float().mean())  # tool output not counted
