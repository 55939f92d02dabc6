"""Supervised fine-tuning: next-token loss on the target tokens only (warm starts for RL, chat tuning).

Every training sequence i is token ids x_i with a 0/1 loss mask m_i (completion tokens, assistant
turns, or all tokens of a text row; see :mod:`posttrain.train.sft_data`). The loss of a batch B is the
token-mean negative log-likelihood over its target tokens:

    L(B) = − Σ_{i∈B} Σ_t m_it · log π(x_it | x_i,<t) / N_B,     N_B = Σ_{i∈B} Σ_t m_it

Micro-batching splits B into B_1..B_K (``micro_batch_size`` sequences each) and back-propagates
L_k = − Σ_{i∈B_k} Σ_t m_it · log π(x_it | x_i,<t) / N_B for each, the denominator being the token
count of the WHOLE batch; then Σ_k ∇L_k = ∇L(B) exactly, whatever the split (only rounding differs).

One step: lr from the schedule (``optimizer``: the same ``OptimizerConfig``, AdamW and schedule as RL),
the next ``batch_size`` examples of an epoch-wise shuffled pass (:class:`~posttrain.utils.data.EpochShuffler`,
``"stream"`` order), forward/backward per micro-batch, clip the global gradient norm, AdamW update.

Checkpoints (``checkpoint.every``, ``checkpoint.final``) hold the model, the AdamW state, the RNG
states, the step and the position in the data order (:mod:`posttrain.train.checkpoint`: safetensors
and JSON, written atomically); ``SFTTrainer(cfg, resume=True)`` / ``posttrain sft --resume`` continues
bitwise-identically to an uninterrupted run. The run loop, its evaluation and checkpoint schedules,
checkpoint writing and resume are RL's, one component (:mod:`posttrain.train.loop`). Held-out evaluation (``eval.every``, ``eval.at_start``,
``eval.at_end``): greedy accuracy on the task's held-out split when training from a task, and the
loss on ``eval_data`` when given. The model is reached only through a
:class:`~posttrain.models.ModelAdapter` (load, log-probs, generate, save).

Under ``torchrun`` (docs/distributed.md) every rank draws the same batch, trains on its contiguous
block of ``batch_size / W`` sequences through DDP or FSDP2 with the WHOLE batch's N_B as denominator
and the loss multiplied by W (both average gradients), so the update equals the single-process one;
rank 0 evaluates and writes the run folder. Causal-LM adapters only.
"""

from __future__ import annotations

import hashlib
from array import array
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import torch

from posttrain.models.precision import precision_autocast
from posttrain.tasks import get_task
from posttrain.train import dist
from posttrain.train.builder import build_sft_parts, task_pairs
from posttrain.train.config import SFTConfig, SFTEvalConfig, SFTOptimizerConfig
from posttrain.train.loop import LoopSpec, RunLoop, RunLoopTrainer
from posttrain.train.sft_data import DataFields, SFTDataError, SFTExample, read_sft_file
from posttrain.utils.errors import InvalidValueError

__all__ = [
    "DataFields",
    "SFTConfig",
    "SFTDataError",
    "SFTEvalConfig",
    "SFTOptimizerConfig",
    "SFTTrainer",
    "load_sft_jsonl",
    "task_pairs",
]

load_sft_jsonl = read_sft_file
"""Parsed rows of an SFT JSONL file (any of the three formats); errors name the file and line."""

def _fingerprint(examples: list[SFTExample]) -> str:
    """SHA-256 over every example's token ids and loss mask, in order (stored in checkpoints)."""
    h = hashlib.sha256()
    for ex in examples:
        h.update(array("q", [len(ex.input_ids), *ex.input_ids]).tobytes())
        h.update(bytes(ex.loss_mask))
    return h.hexdigest()


class SFTTrainer(RunLoopTrainer):
    """``SFTTrainer(cfg).train()``; with a model in hand ``SFTTrainer(cfg, model, tokenizer,
    pairs=[(prompt, completion), ...]).train()`` or ``rows=[{"messages": [...]}, {"text": ...}]``;
    ``SFTTrainer(cfg, resume=True)`` continues from ``<out_dir>/checkpoints/latest``; ``adapter=`` takes
    any :class:`~posttrain.models.ModelAdapter` instead of model and tokenizer; ``heldout=`` (task
    examples) replaces the task's held-out split in the evaluation (a calibration set for
    ``eval.stop_at``).

    ``extra_loss(trainer, idx, logp, loss_mask, batch_rows) -> scalar tensor`` (optional) adds a term
    to each micro-batch's loss: ``idx`` are the micro-batch's example indices, ``logp``/``loss_mask``
    its (B, T) token log-probs (differentiable) and target mask from the same forward, ``batch_rows``
    the whole batch's row count (normalise per-row terms by it to stay micro-batch invariant). Its
    value is logged as ``extra_loss``; ``loss`` stays the NLL."""

    def __init__(
        self,
        cfg: SFTConfig,
        model: Any = None,
        tokenizer: Any = None,
        *,
        pairs: list[tuple[str, str]] | None = None,
        rows: list[Any] | None = None,
        resume: bool = False,
        adapter: Any = None,
        extra_loss: Any = None,
        heldout: list[Any] | None = None,
    ) -> None:
        self._heldout = list(heldout) if heldout is not None else None
        p = build_sft_parts(cfg, model, tokenizer, pairs=pairs, rows=rows, resume=resume, adapter=adapter)
        self.cfg, self.extra_loss, self.run_dir, self.device = cfg, extra_loss, Path(cfg.out_dir), p.device
        self.lm, self.model, self.tokenizer = p.lm, p.lm.model, p.lm.tokenizer
        self.formatter, self._task = p.formatter, p.task
        self.precision, self.precision_reason = p.precision, p.precision_reason
        self.examples, self.eval_examples = p.examples, p.eval_examples
        self.train_lm, self.optimizer, self.shuffler = p.train_lm, p.optimizer, p.shuffler
        self.step_idx = 0
        self.loop = RunLoop(self)  # run loop, checkpoints and resume, shared with RL (train/loop.py)
        if p.checkpoint is not None:
            self._restore(p.checkpoint)

    @property
    def task(self) -> Any:
        """The task (loaded on first use when the training rows did not come from it)."""
        if self._task is None:
            self._task = get_task(self.cfg.task.name, **self.cfg.task.params)
        return self._task

    # ------------------------------------------------------------------------------------ one step
    def collate(self, idx: list[int], examples: list[SFTExample] | None = None) -> tuple[torch.Tensor, ...]:
        """Right-padded (input_ids, attention_mask, loss_mask) of ``examples[i]`` for i in ``idx``."""
        from posttrain.models import pad_right

        seqs = [(examples or self.examples)[i] for i in idx]
        pad = self.tokenizer.pad_token_id or 0
        ids, am, lm = pad_right([s.input_ids for s in seqs], pad, [s.loss_mask for s in seqs])
        return ids.to(self.device), am.to(self.device), lm.to(self.device)

    def _micro_batches(self, idx: list[int]) -> list[list[int]]:
        size = self.cfg.micro_batch_size or len(idx)
        return [idx[s : s + size] for s in range(0, len(idx), size)]

    def _summed_nll(
        self, idx: list[int], examples: list[SFTExample] | None = None, adapter: Any = None
    ) -> torch.Tensor:
        """− Σ m · log π over the rows ``idx`` (one forward, through ``adapter``, default ``self.lm``)."""
        logp, lm = self._token_logprobs(idx, examples, adapter)
        return -(logp * lm).sum()

    def _token_logprobs(
        self, idx: list[int], examples: list[SFTExample] | None = None, adapter: Any = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(log π, target mask), each (B, T), of the rows ``idx``: one forward through ``adapter``, in
        ``model.precision`` (bf16: autocast over the fp32 weights; log-softmax in fp32, as in RL)."""
        ids, am, lm = self.collate(idx, examples)
        with precision_autocast(self.device, self.precision):
            logp, _ = (adapter or self.lm).logprobs(ids, am, lm, chunk_size=self.cfg.logprob_chunk_size)
        return logp, lm

    def accumulate_gradients(self, idx: list[int]) -> tuple[float, int]:
        """Add ∇L(batch ``idx``) to the parameters' ``.grad``, one forward/backward per micro-batch,
        each normalised by the WHOLE batch's target-token count (module docstring). Returns
        (loss, target tokens)."""
        n_tok = sum(self.examples[i].n_loss_tokens for i in idx)
        loss = extra = 0.0
        # distributed: this rank's block of the batch, DDP backward x world size (dist.backward)
        for part in self._micro_batches(dist.shard(idx)):
            logp, lm = self._token_logprobs(part, adapter=self.train_lm)
            part_loss = -(logp * lm).sum() / n_tok
            if self.extra_loss is None:
                dist.backward(part_loss)
            else:
                term = self.extra_loss(self, part, logp, lm, len(idx))
                dist.backward(part_loss + term)
                extra += float(term.detach())
            loss += float(part_loss.detach())
        if self.extra_loss is not None:
            self.last_extra_loss = float(dist.global_sum(torch.tensor(extra, dtype=torch.float64)))
        return float(dist.global_sum(torch.tensor(loss, dtype=torch.float64))), n_tok

    def step(self) -> dict[str, float]:
        """One optimizer step on the next ``batch_size`` examples; returns its metrics."""
        from posttrain.train.optim import clip_and_step, scheduled_lr, set_lr

        cfg = self.cfg
        lr = scheduled_lr(cfg.optimizer, self.step_idx, cfg.schedule_steps or cfg.steps)
        set_lr(self.optimizer, lr)
        self.model.train()
        idx = self.shuffler.take(cfg.batch_size)
        self.optimizer.zero_grad(set_to_none=True)
        loss, n_tok = self.accumulate_gradients(idx)
        norm = clip_and_step(self.model, self.optimizer, cfg.optimizer.grad_clip)
        self.step_idx += 1
        out = {
            "step": self.step_idx,
            "loss": loss,
            "grad_norm": norm,
            "lr": lr,
            "tokens": float(n_tok),
            "epoch": self.shuffler.epoch + self.shuffler.pos / self.shuffler.n,
        }
        if self.extra_loss is not None:
            out["extra_loss"] = self.last_extra_loss
        return out

    # ---------------------------------------------------------------------------------- evaluation
    def evaluate(self, n: int | None = None) -> dict[str, Any]:
        """Greedy accuracy (and mean reward, length) on the task's held-out split (or ``heldout``)."""
        from posttrain.rewards import get_reward
        from posttrain.rollout import FunctionRewardSource
        from posttrain.train.evaluate import evaluate

        src = FunctionRewardSource(get_reward(self.task.default_reward), num_workers=0)
        try:
            ev = evaluate(
                self.model,
                self.tokenizer,
                (self._heldout if self._heldout is not None else self.task.split("heldout"))[
                    : n or self.cfg.eval.n
                ],
                src,
                formatter=self.formatter,
                max_new_tokens=self.cfg.max_new_tokens,
                batch_size=self.cfg.eval.batch_cap(),  # eval.max_batch_size, as in RL
                precision=self.precision,
            )
        finally:
            src.close()
        if self._heldout is not None:
            ev["split"] = "calibration"  # the metrics log and the progress line say which set it was
        return ev

    @torch.no_grad()
    def heldout_loss(self) -> dict[str, float]:
        """Token-mean loss on ``eval_data`` (the training loss's formula, no update)."""
        if not self.eval_examples:
            raise InvalidValueError("heldout_loss: no eval_data configured")
        was_training = self.model.training
        self.model.eval()
        try:
            idx = list(range(len(self.eval_examples)))
            size = self.cfg.micro_batch_size or self.cfg.batch_size
            total = sum(
                float(self._summed_nll(idx[s : s + size], self.eval_examples))
                for s in range(0, len(idx), size)
            )
        finally:
            self.model.train(was_training)
        n_tok = sum(ex.n_loss_tokens for ex in self.eval_examples)
        return {"loss": total / n_tok, "loss_tokens": float(n_tok), "loss_rows": float(len(idx))}

    @property
    def has_heldout(self) -> bool:
        """Whether there is anything to evaluate: the task (training from it) or ``eval_data``."""
        return self.cfg.data is None or bool(self.eval_examples) or bool(self._heldout)

    def _evaluate_all(self) -> dict[str, Any]:
        with dist.full_params(self.model):  # FSDP2: gathered weights, so rank 0 can run forwards alone
            return dist.on_main(self._evaluate_here)  # distributed: rank 0 evaluates, every rank gets it

    def _evaluate_here(self) -> dict[str, Any]:
        ev: dict[str, Any] = {}
        if self.cfg.data is None or self._heldout:
            ev.update(self.evaluate())
        if self.eval_examples:
            ev.update(self.heldout_loss())
        return ev

    # ------------------------------------------------------------------------------ checkpointing
    @cached_property
    def data_fingerprint(self) -> str:
        return _fingerprint(self.examples)

    def save(self) -> Path:
        """Checkpoint of the current step under ``<out_dir>/checkpoints`` (atomic; see module doc):
        :meth:`RunLoop.save_checkpoint` with the data fingerprint and the position in the data order."""
        state = {
            "trainer": "sft",
            "data": {"n": len(self.examples), "sha256": self.data_fingerprint},
            "shuffler": self.shuffler.state_dict(),
        }
        return self.loop.save_checkpoint(state)

    def _save_model(self, path: Path) -> Path:
        """The adapter's ``save`` on rank 0; FSDP2: the full state dict gathered on rank 0 instead. A
        write that fails (disk full) is one :class:`~posttrain.train.checkpoint.RunWriteError` naming
        the folder and the checkpoint that holds the same weights (the save is atomic: nothing partial,
        an earlier ``model/`` untouched)."""
        from posttrain.models.saving import save_model_dir
        from posttrain.train.checkpoint import io_failure, run_write_failed

        msd, _ = dist.full_state_dicts(self.model, None)  # a collective under FSDP2; (None, None) otherwise
        try:
            if msd is None:
                return dist.on_main(lambda: self.lm.save(path))
            return dist.on_main(lambda: save_model_dir(self.model, self.tokenizer, path, state_dict=msd))
        except Exception as e:
            if io_failure(e) is None:
                raise
            kept = f"no partial {path.name}/ was kept (an earlier one is unchanged)"
            if self.loop.checkpointed_step == self.step_idx:
                kept += f"; the final checkpoint holds the trained weights of step {self.step_idx}"
            raise run_write_failed(
                f"write the trained model to {path}", e, kept, self.run_dir / "checkpoints"
            ) from e

    def _restore(self, ckpt: Path) -> None:
        def restore_state(state: dict[str, Any]) -> None:
            if "shuffler" not in state or "data" not in state:
                raise InvalidValueError(
                    f"{ckpt}: not an SFT checkpoint (it has no data position to resume from)"
                )
            data = state["data"]
            if data.get("sha256") != self.data_fingerprint:
                raise SFTDataError(
                    f"{ckpt}: the checkpoint was trained on different data ({data.get('n')} sequences then, "
                    f"{len(self.examples)} now, or the same count with other tokens); resuming would not "
                    "continue the same run. Use the same data, prompt template and tokenizer, or start a "
                    "new out_dir"
                )
            self.shuffler.load_state_dict(state["shuffler"])

        self.loop.restore(ckpt, restore_state)

    # ------------------------------------------------------------------------------------ full run
    def train(self, *, overwrite: bool = False, allow_config_change: bool = False) -> dict[str, Any]:
        """Run until ``cfg.steps`` (from the resumed step) through the shared run loop
        (:class:`~posttrain.train.loop.RunLoop`: logging, evaluation, checkpoints). Returns ``steps``,
        ``wall_s``, ``last`` (metrics of the last step), ``eval`` / ``eval_start`` when evaluated and
        ``model_dir`` when saved.

        The run folder follows the RL trainer's rules (:func:`posttrain.train.run_dir.start_run`): a
        fresh run refuses an ``out_dir`` holding a previous run unless ``overwrite``; a resumed run
        refuses config changes that break it unless ``allow_config_change``."""
        spec = LoopSpec(
            name="sft",
            step=self.step,
            evaluate=self._evaluate_all if self.has_heldout else None,
            save=self.save,
            live={"loss": "loss"},
            write=self.cfg.save,
            progress=self.cfg.progress,
            finish=lambda: {"model_dir": str(self._save_model(self.run_dir / "model"))},
            end_eval_key="eval",
            eval_fresh_zero_steps=True,
        )
        return self.loop.run(spec, overwrite=overwrite, allow_config_change=allow_config_change)

    def close(self) -> None:
        """Leave the torchrun process group if this process joined it (no-op in one process); every
        rank must call it, or gloo aborts the process at exit."""
        dist.teardown()


def sft_warm_start(
    cfg: Any,
    model: Any,
    tok: Any,
    *,
    steps: int,
    lr: float = 3e-3,
    style: str | None = None,
    seed: int = 0,
    out_dir: str | Path,
    progress: bool | None = None,
    save: bool = True,
    pairs: list[tuple[str, str]] | None = None,
    rows: list[Any] | None = None,
    batch_size: int = 32,
    overwrite: bool = False,
    stop_at: float | None = None,
    check_every: int = 25,
    calibration: int = 200,
    overlong: Literal["error", "truncate", "skip"] = "error",
) -> dict[str, Any]:
    """An SFT warm start for an RL config, in place on ``model``: batch ``batch_size`` (32) on the
    reference completions of the RL config's task (scratchpad tasks in the ``long`` style), ``steps``
    steps at ``lr``. The tiny demo, the objectives ablation, the APARL experiment and the tools demo
    start RL from it. ``pairs`` (``(prompt, completion)``) or ``rows`` (``{"messages": [...]}`` and the
    other :class:`SFTTrainer` row formats) replace the task's reference completions as the SFT set;
    ``overwrite`` replaces a previous run in ``out_dir``; ``overlong`` is ``SFTConfig.overlong`` (rows
    longer than the model's context).

    ``stop_at`` (posttrain's design, issue 41): a warm start to a target accuracy rather than a step
    count, so that RL starts from the same competence whatever the CPU's kernels do to an early, steep
    SFT curve. The last ``calibration`` train examples are held back from the SFT rows; every
    ``check_every`` steps their greedy accuracy is measured, and SFT stops at the first check that
    reaches ``stop_at`` (``steps`` stays the limit; the summary's ``stopped_at`` says where it
    stopped, absent when it never reached it). The task's held-out split is never looked at."""

    sft_cfg = SFTConfig(
        model=cfg.model,
        task=cfg.task,
        steps=steps,
        batch_size=batch_size,
        lr=lr,
        style=style or ("long" if cfg.task.params.get("format") == "scratchpad" else "short"),
        threads=cfg.threads,
        seed=seed,
        out_dir=str(out_dir),
        max_new_tokens=cfg.rollout.max_new_tokens,
        progress=progress,
        save=save,
        overlong=overlong,
    )
    sft_cfg.eval.at_end = False
    heldout = None
    if stop_at is not None:
        if pairs is not None or rows is not None:
            raise InvalidValueError(
                "sft_warm_start: stop_at holds back task examples; it takes no pairs/rows"
            )
        task = get_task(cfg.task.name, **cfg.task.params)
        train = task.split("train")
        if not 0 < calibration < len(train):
            raise InvalidValueError(
                f"sft_warm_start: calibration must be between 1 and {len(train) - 1} (the task's train split "
                f"has {len(train)} examples), got {calibration}"
            )
        pairs = task_pairs(task, style=sft_cfg.style)[:-calibration]
        heldout = train[-calibration:]
        sft_cfg.eval.every, sft_cfg.eval.n, sft_cfg.eval.stop_at = check_every, calibration, stop_at
    return SFTTrainer(sft_cfg, model, tok, pairs=pairs, rows=rows, heldout=heldout).train(overwrite=overwrite)
