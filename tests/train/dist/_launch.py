"""Worker script the multi-process tests launch with torchrun (``python -m torch.distributed.run``).

    python -m torch.distributed.run --nproc_per_node N tests/distributed/_launch.py OUT_DIR [key=value ...]
        [--resume] [--kill-after-save STEP] [--sft [--strategy fsdp]] [--report-shards]

Trains the tiny preset with :class:`RLTrainer` (reward: the share of digits in the completion, so
groups rarely tie; reward workers 0). The rollout engine :func:`prompt_seeded_engine` samples each prompt's group with a seed derived from
the prompt's token ids and the call count only, so a prompt gets the same completions whichever rank
samples it: one process and N processes then train on the same global batch, and the test can compare
their weights. ``--kill-after-save STEP`` SIGKILLs every rank right after the checkpoint of STEP is on
disk (a crash, not a clean exit). ``--report-shards`` makes every rank write ``OUT_DIR.rank<r>.json``:
the number of parameter elements it holds locally and in the whole model (FSDP2 shards them).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import zlib

import torch

from posttrain.rollout import FunctionRewardSource, HFEngine, RolloutBatch
from posttrain.train.config import load_rl_config
from posttrain.train.rl import RLTrainer
from posttrain.train.sft import SFTConfig, SFTTrainer

BASE = [
    "model.name=tiny",
    "model.device=cpu",
    'task.params={digits: 1, ops: "+", n_train: 60, n_heldout: 20}',
    "reward.num_workers=0",
    "rollout.engine.name=_launch:prompt_seeded_engine",  # by import path: no registry entry leaks
    "rollout.prompts_per_step=4",
    "rollout.group_size=4",
    "rollout.max_new_tokens=4",
    "micro_batch_size=3",  # gradient accumulation under DDP (an all-reduce in every backward)
    "eval.at_start=false",
    "eval.at_end=false",
    "logging.progress=false",
    "threads=1",
    # eps = 1 makes AdamW's update ~ lr * (momentum of the gradient), SGD-like: the weights then depend
    # on the gradient's SCALE (plain Adam is scale invariant and would hide a wrong 1/W factor), and
    # float noise in near-zero gradients is not blown up into +-lr steps; no clipping, for the same reason
    "optimizer.lr=0.5",
    "optimizer.eps=1.0",
    "optimizer.grad_clip=0",
    "kl.coef=0.1",
]


class DigitShare:
    """Reward: the fraction of the completion's characters that are digits."""

    name = "digit_share"

    def __call__(self, completion, example) -> float:
        return sum(c.isdigit() for c in completion) / max(len(completion), 1)


class PromptSeededEngine(HFEngine):
    """HFEngine sampling each prompt's group alone, seeded by (prompt ids, call number): rank-invariant."""

    calls = 0

    def generate(self, prompt_ids, n_per_prompt, params):
        parts = []
        for p, n in zip(prompt_ids, n_per_prompt, strict=True):
            seed = zlib.crc32(str(p).encode()) * 1000 + self.calls
            parts.append(super().generate([p], [n], dataclasses.replace(params, seed=seed)))
        self.calls += 1
        batch = RolloutBatch.concat(parts)
        batch.group_ids = torch.repeat_interleave(torch.arange(len(prompt_ids)), torch.tensor(n_per_prompt))
        return batch

    def state_dict(self):
        return {"calls": torch.tensor([self.calls])}

    def load_state_dict(self, state):
        self.calls = int(state["calls"][0])


def prompt_seeded_engine(ctx):
    return PromptSeededEngine(ctx.model, ctx.tokenizer, seed=ctx.seed, max_batch_size=ctx.max_batch_size)


def report_shards(model, out: str) -> None:
    """Write this rank's local and the model's total parameter element counts to ``OUT.rank<r>.json``."""
    from torch.distributed.tensor import DTensor

    params = list(model.parameters())
    local = sum((p.to_local() if isinstance(p, DTensor) else p).numel() for p in params)
    rank = int(os.environ.get("RANK", "0"))
    with open(f"{out}.rank{rank}.json", "w") as f:
        json.dump({"local": local, "total": sum(p.numel() for p in params)}, f)


def sft(out: str, strategy: str = "ddp", shards: bool = False) -> None:
    """Two SFT steps of 8 sequences (SGD-like AdamW as above) from the arithmetic task's completions."""
    cfg = SFTConfig(
        model={"name": "tiny", "device": "cpu"},
        task={"params": {"digits": 1, "ops": "+", "n_train": 40, "n_heldout": 8}},
        steps=2,
        batch_size=8,
        micro_batch_size=3,
        optimizer={"lr": 0.5, "eps": 1.0, "grad_clip": 0},
        eval={"at_end": False},
        threads=1,
        progress=False,
        out_dir=out,
        distributed={"strategy": strategy},
    )
    with SFTTrainer(cfg) as trainer:
        if shards:
            report_shards(trainer.model, out)
        trainer.train()


def rl(
    out: str,
    overrides: list[str],
    *,
    resume: bool = False,
    kill_after_save: int | None = None,
    shards: bool = False,
) -> None:
    cfg = load_rl_config(None, [*BASE, f"out_dir={out}", *overrides])
    trainer = RLTrainer(cfg, resume=resume, reward_source=FunctionRewardSource(DigitShare(), num_workers=0))
    if shards:
        report_shards(trainer.model, out)
    if kill_after_save is not None:
        save = trainer.save

        def save_then_crash():
            path = save()
            if trainer.step_idx == kill_after_save:
                os.kill(os.getpid(), signal.SIGKILL)
            return path

        trainer.save = save_then_crash
    with trainer:
        trainer.train()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("overrides", nargs="*")
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--kill-after-save", type=int, default=None)
    ap.add_argument("--sft", action="store_true", help="train SFT (task completions) instead of RL")
    ap.add_argument("--strategy", default="ddp", help="SFT's distributed.strategy (RL: an override)")
    ap.add_argument("--report-shards", action="store_true")
    args = ap.parse_args()
    if args.sft:
        sft(args.out, args.strategy, args.report_shards)
        return
    rl(
        args.out,
        args.overrides,
        resume=args.resume,
        kill_after_save=args.kill_after_save,
        shards=args.report_shards,
    )


if __name__ == "__main__":
    main()
