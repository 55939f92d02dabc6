"""Supervised fine-tuning on completion tokens only (warm starts for RL).

For a prompt x and target completion y (followed by EOS), the loss is the token-mean negative
log-likelihood over the completion tokens of the batch:

    L = − Σ_i Σ_t m_it · log π(y_it | x_i, y_i,<t) / Σ_i Σ_t m_it

(prompt tokens are context only, m = 1 exactly on completion tokens). Data comes from a task's
reference completions (``Task.reference_completion``) or a JSONL file of
``{"prompt": ..., "completion": ...}`` rows. Prompts are encoded with the same
:class:`~posttrain.rollout.PromptFormatter` the RL rollout uses, so SFT and RL see identical prompts.
"""

from __future__ import annotations

import json
import math
import random
import time
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import Field

from posttrain.train.config import EvalConfig, ModelConfig, TaskConfig
from posttrain.utils.config import StrictModel


class SFTDataError(ValueError):
    """A training file whose rows are not what SFT expects; the message names file, line and key."""


class SFTConfig(StrictModel):
    model: ModelConfig = ModelConfig()
    task: TaskConfig = TaskConfig()
    """Source of reference completions (when ``data`` is None) and of the held-out evaluation."""
    data: str | None = None
    """JSONL file of {"prompt", "completion"} rows (overrides the task's reference completions)."""
    style: Literal["short", "long"] = "short"
    max_examples: int | None = Field(None, ge=1)
    steps: int = Field(200, ge=0)
    batch_size: int = Field(32, ge=1)
    lr: float = Field(1e-3, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    warmup_steps: int = Field(0, ge=0)
    schedule: Literal["constant", "cosine"] = "constant"
    grad_clip: float = Field(1.0, ge=0)
    seed: int = 0
    threads: int | None = Field(None, ge=1)
    """torch intra-op CPU threads (None = torch's default); see ``RLConfig.threads``."""
    out_dir: str = "runs/sft"
    eval: EvalConfig = EvalConfig(at_start=False)
    max_new_tokens: int = Field(16, ge=1)
    """Generation length for the held-out evaluation."""
    save: bool = True
    progress: bool | None = None


def load_sft_jsonl(path: str | Path) -> list[tuple[str, str]]:
    """(prompt, completion) pairs from a JSONL file; every bad row raises :class:`SFTDataError`
    naming the file, the line and what was expected."""
    path = Path(path)
    if not path.is_file():
        raise SFTDataError(f"{path}: file not found (expected a JSONL file of prompt/completion rows)")
    pairs: list[tuple[str, str]] = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise SFTDataError(f"{path}: line {i}: invalid JSON ({e.msg})") from None
            if not isinstance(row, dict):
                raise SFTDataError(f"{path}: line {i}: expected a JSON object with keys prompt, completion")
            for key in ("prompt", "completion"):
                if key not in row:
                    raise SFTDataError(
                        f"{path}: line {i}: missing key {key!r} (expected keys: prompt, completion; "
                        f"got: {', '.join(sorted(row)) or 'none'})"
                    )
                if not isinstance(row[key], str):
                    raise SFTDataError(
                        f"{path}: line {i}: {key!r} must be a string, got {type(row[key]).__name__}"
                    )
            if not row["completion"]:
                raise SFTDataError(f"{path}: line {i}: 'completion' is empty")
            pairs.append((row["prompt"], row["completion"]))
    if not pairs:
        raise SFTDataError(f"{path}: no rows (expected JSONL with prompt/completion objects)")
    return pairs


def task_pairs(task: Any, *, style: str = "short", max_examples: int | None = None) -> list[tuple[str, str]]:
    """(prompt, reference completion) for the task's training split."""
    exs = task.split("train")[:max_examples]
    return [(ex.prompt, task.reference_completion(ex, style=style)) for ex in exs]


class SFTTrainer:
    """Completion-only SFT. ``SFTTrainer(cfg).train()`` or, with a model in hand,
    ``SFTTrainer(cfg, model, tokenizer, pairs=[...]).train()``."""

    def __init__(self, cfg: SFTConfig, model: Any = None, tokenizer: Any = None, *, pairs=None) -> None:
        from posttrain.models import load_model_and_tokenizer, pick_device
        from posttrain.rollout import PromptFormatter
        from posttrain.train.rl import seed_everything

        self.cfg = cfg
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        seed_everything(cfg.seed)
        if model is None:
            device = pick_device() if cfg.model.device == "auto" else cfg.model.device
            model, tokenizer = load_model_and_tokenizer(
                cfg.model.name, dtype=cfg.model.dtype, device=device, seed=cfg.seed
            )
        self.model, self.tokenizer = model, tokenizer
        self.device = next(model.parameters()).device
        self.formatter = PromptFormatter(
            tokenizer, template=cfg.task.prompt_template, chat=cfg.task.chat_template
        )
        self._task = None
        if pairs is None:
            pairs = (
                load_sft_jsonl(cfg.data)
                if cfg.data
                else task_pairs(self.task, style=cfg.style, max_examples=cfg.max_examples)
            )
        if cfg.max_examples:
            pairs = pairs[: cfg.max_examples]
        self.encoded = [(self.formatter.encode(p), self.formatter.encode_completion(c)) for p, c in pairs]
        if not self.encoded:
            source = cfg.data or f"task {cfg.task.name!r} (train split)"
            raise SFTDataError(f"{source}: no training examples")
        for i, (p, _) in enumerate(self.encoded):
            if not p:
                raise SFTDataError(f"example {i}: the prompt encodes to zero tokens")
        self.optimizer = torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad],
            lr=cfg.lr,
            weight_decay=cfg.weight_decay,
            foreach=True,
        )
        self.rng = random.Random(cfg.seed)
        self._order: list[int] = []
        self.step_idx = 0

    @property
    def task(self) -> Any:
        if self._task is None:
            from posttrain.tasks import get_task

            self._task = get_task(self.cfg.task.name, **self.cfg.task.params)
        return self._task

    def _next_batch(self) -> list[int]:
        out = []
        while len(out) < self.cfg.batch_size:
            if not self._order:
                self._order = list(range(len(self.encoded)))
                self.rng.shuffle(self._order)
            out.append(self._order.pop())
        return out

    def collate(self, idx: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Right-padded (input_ids, attention_mask, completion_mask)."""
        seqs = [self.encoded[i] for i in idx]
        width = max(len(p) + len(c) for p, c in seqs)
        pad = self.tokenizer.pad_token_id or 0
        ids = torch.full((len(seqs), width), pad, dtype=torch.long)
        am = torch.zeros((len(seqs), width), dtype=torch.long)
        cm = torch.zeros((len(seqs), width), dtype=torch.long)
        for r, (p, c) in enumerate(seqs):
            ids[r, : len(p) + len(c)] = torch.tensor(p + c)
            am[r, : len(p) + len(c)] = 1
            cm[r, len(p) : len(p) + len(c)] = 1
        return ids.to(self.device), am.to(self.device), cm.to(self.device)

    def step(self) -> dict[str, float]:
        from posttrain.models import sequence_logprobs
        from posttrain.train.optim import lr_at, set_lr

        cfg = self.cfg
        lr = lr_at(
            self.step_idx,
            lr=cfg.lr,
            total_steps=max(1, cfg.steps),
            schedule=cfg.schedule,
            warmup_steps=cfg.warmup_steps,
            min_lr_ratio=0.0,
        )
        set_lr(self.optimizer, lr)
        self.model.train()
        ids, am, cm = self.collate(self._next_batch())
        logp, _ = sequence_logprobs(self.model, ids, am, response_mask=cm)
        n_tok = cm.sum().clamp(min=1)
        loss = -(logp * cm).sum() / n_tok
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(
            self.model.parameters(), cfg.grad_clip if cfg.grad_clip > 0 else math.inf, foreach=True
        )
        self.optimizer.step()
        self.step_idx += 1
        return {
            "step": self.step_idx,
            "loss": float(loss.detach()),
            "grad_norm": float(norm),
            "lr": lr,
            "tokens": float(n_tok),
        }

    def evaluate(self, n: int | None = None) -> dict[str, Any]:
        from posttrain.rewards import get_reward
        from posttrain.rollout import FunctionRewardSource
        from posttrain.train.evaluate import evaluate

        src = FunctionRewardSource(get_reward(self.task.default_reward), num_workers=0)
        try:
            return evaluate(
                self.model,
                self.tokenizer,
                self.task.split("heldout")[: n or self.cfg.eval.n],
                src,
                formatter=self.formatter,
                max_new_tokens=self.cfg.max_new_tokens,
            )
        finally:
            src.close()

    def train(self, *, overwrite: bool = False) -> dict[str, Any]:
        from posttrain.train.checkpoint import save_model_dir
        from posttrain.train.logger import MetricsLogger
        from posttrain.train.run_dir import prepare_run_dir
        from posttrain.utils.progress import progress_bar

        cfg = self.cfg
        out = Path(cfg.out_dir)
        if cfg.save:  # refuse a folder holding a previous run (``overwrite``: delete its run files)
            prepare_run_dir(out, overwrite=overwrite, can_resume=False)
        logger = MetricsLogger(out) if cfg.save else None
        t0 = time.perf_counter()
        last: dict[str, float] = {}
        try:
            with progress_bar("sft", total=cfg.steps, enabled=cfg.progress) as bar:
                while self.step_idx < cfg.steps:
                    last = self.step()
                    if logger:
                        logger.log_step(last)
                    bar.advance(loss=last["loss"])
            summary: dict[str, Any] = {
                "steps": self.step_idx,
                "wall_s": time.perf_counter() - t0,
                "last": last,
            }
            if cfg.eval.at_end and cfg.data is None:
                ev = self.evaluate()
                summary["eval"] = {k: v for k, v in ev.items() if k != "samples"}
                if logger:
                    logger.log_eval(self.step_idx, ev)
            if cfg.save:
                summary["model_dir"] = str(save_model_dir(self.model, self.tokenizer, out / "model"))
        finally:
            if logger:
                logger.close()
        return summary
