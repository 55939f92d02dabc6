"""Trainer assembly (posttrain.train.builder): the builder returns every part complete, each built
once from the parts before it, and the trainers only keep them: their constructors stay short,
nothing is patched after it is built, and the trainer has no forwarding properties or trampolines
(the collector's components are reached as ``trainer.collector.<part>``)."""

from __future__ import annotations

import ast
import inspect
import textwrap
import warnings
from dataclasses import fields

import pytest

from posttrain.train.builder import RLParts, SFTParts, build_rl_parts, build_sft_parts
from posttrain.train.config import load_rl_config
from posttrain.train.rl import RLTrainer
from posttrain.train.sft import SFTConfig, SFTTrainer
from posttrain.utils.config import build_config

TINY = [
    "model.name=tiny",
    "model.device=cpu",
    'task.params={digits: 1, ops: "+", n_train: 16, n_heldout: 4}',
    "reward.num_workers=0",
    "rollout.prompts_per_step=2",
    "rollout.group_size=2",
    "rollout.max_new_tokens=3",
    "threads=1",
]


def _lines(fn) -> int:
    node = ast.parse(textwrap.dedent(inspect.getsource(fn))).body[0]
    return node.end_lineno - node.lineno + 1


@pytest.mark.parametrize("cls", [RLTrainer, SFTTrainer])
def test_trainer_constructors_only_keep_what_the_builder_built(cls):
    assert _lines(cls.__init__) <= 40


def test_rl_trainer_has_no_forwarding_properties_or_trampolines():
    for name in ("sampler", "replay", "group_filter", "runner", "reward_source", "_rollout", "_outcomes"):
        assert not hasattr(RLTrainer, name), name
    assert not [n for n, v in vars(RLTrainer).items() if isinstance(v, property)]


def test_rl_parts_are_complete_and_wired_to_each_other(tmp_path):
    """Every part is set (only the reference and the checkpoint may be absent), and the parts that use
    each other hold the same objects: the collector got the formatter, engine, runner and reward
    source when it was built (it used to be built with formatter=None, engine=None and patched)."""
    cfg = load_rl_config(None, [*TINY, "kl.coef=0.1", f"out_dir={tmp_path / 'run'}"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        p = build_rl_parts(cfg)
    try:
        assert isinstance(p, RLParts)
        missing = [f.name for f in fields(p) if getattr(p, f.name) is None]
        assert missing == ["checkpoint"]
        c = p.collector
        src = c.source  # synchronous: the local runner over the trainer's engine
        assert src.formatter is p.formatter and src.pad_token_id == p.engine.pad_token_id
        assert c.runner is src.runner and c.runner.engine is p.engine and c.runner.formatter is p.formatter
        assert p.spec.precision == p.precision and p.formatter.template == p.spec.template
        assert type(p.weight_sync).__name__ == "SharedWeights"  # the engine generates with the module
        assert c.sampler.examples == p.train_examples and c.group_filter is None  # 'none' is inactive
        assert c.warn is p.warn
        assert p.train_lm is p.lm and p.ref_lm.model is not p.lm.model  # one process: no wrapper
        assert {id(x) for g in p.optimizer.param_groups for x in g["params"]} == {
            id(x) for x in p.lm.model.parameters()
        }
    finally:
        if p.owns_reward_source:
            c.reward_source.close()


def test_the_trainer_keeps_the_parts_as_plain_attributes(tmp_path):
    cfg = load_rl_config(None, [*TINY, "eval.at_start=false", f"out_dir={tmp_path / 'run'}"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tr = RLTrainer(cfg)
    try:
        assert tr.model is tr.lm.model and tr.tokenizer is tr.lm.tokenizer
        assert tr.collector.source.formatter is tr.formatter and tr.collector.runner.engine is tr.engine
        assert tr.hooks()[:3] == [tr.collector.sampler, tr.collector.group_filter, tr.collector.replay]
        assert tr.is_weights[0].replay() is tr.collector.replay  # swapping the buffer reaches the weights
    finally:
        tr.close()


def test_sft_parts_load_the_task_only_when_the_rows_come_from_it(tmp_path):
    cfg = build_config(SFTConfig, None, ["model.name=tiny", "model.device=cpu", f"out_dir={tmp_path}"])
    from_task = build_sft_parts(cfg)
    assert isinstance(from_task, SFTParts) and from_task.task is not None and from_task.examples
    assert from_task.shuffler.n == len(from_task.examples) and from_task.eval_examples is None
    given = build_sft_parts(cfg, pairs=[("1+1=", "2"), ("2+2=", "4")])
    assert given.task is None and len(given.examples) == 2
    tr = SFTTrainer(cfg, pairs=[("1+1=", "2")])
    assert tr._task is None and tr.task.split("train")  # loaded on first use (evaluation)
