"""The run loop every trainer shares: one implementation of everything around the training step.

:class:`RunLoop` is what ``RLTrainer.train()`` and ``SFTTrainer.train()`` both run, and what their
``save()`` and resume go through. A trainer supplies only what differs — one optimizer step
(``step() -> metrics``), an evaluation (``evaluate() -> dict``, or None when there is nothing to
evaluate), its own part of a checkpoint (hook states, data position) — in a :class:`LoopSpec`. The loop
owns:

* **the run folder**: :func:`~posttrain.train.run_dir.start_run` before the first step (the folder's
  lock, a fresh run refuses a previous run unless ``overwrite``, a resumed run refuses breaking config
  changes unless ``allow_config_change``, ``config.yaml``) and :func:`~posttrain.train.run_dir.end_run`
  after the last, also when a step raises; ``run.json`` records what the configuration left to the
  machine (:func:`write_run_info`: the compute precision ``auto`` resolved to, and why; the CPU);
* **the step loop** with a progress bar (rich, or plain ``step/total … elapsed … ETA`` lines when
  stderr is not a terminal) showing the trainer's live metrics;
* **logging**: every step's metrics and every evaluation to ``metrics.jsonl`` (TensorBoard / W&B when
  the trainer's logging config enables them; ``samples.jsonl`` every ``samples_every`` steps);
* **the evaluation schedule**: before the first step of a fresh run (``eval.at_start``), after every
  ``eval.every``-th step except the last, after the last step (``eval.at_end``; only when this call
  ran steps, or for a fresh zero-step run when the trainer asks);
* **the checkpoint schedule**: after every ``checkpoint.every``-th step and after the last one
  (``checkpoint.final``, unless that step is already on disk), and the part of every checkpoint that
  all trainers share (:meth:`RunLoop.save_checkpoint`: model, tokenizer, AdamW state, RNG states,
  step, config; written atomically by :mod:`posttrain.train.checkpoint`, by rank 0 under torchrun,
  the last ``checkpoint.keep`` kept) and its restore (:meth:`RunLoop.restore`: resume from the last
  checkpoint continues bitwise like an uninterrupted run);
* **the summary** ``train()`` returns: ``start_step``, ``steps``, ``wall_s`` (the whole call: steps,
  evaluations and checkpoints), ``last`` (the last step's metrics) and the evaluations without their
  sample completions.

The evaluation batch cap is one setting for every trainer: ``eval.max_batch_size``
(:meth:`posttrain.train.config.EvalConfig.batch_cap`, default 512 sequences per generate call).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

from posttrain.train import dist

_T = TypeVar("_T", bound="RunLoopTrainer")


class LoopTrainer(Protocol):
    """What :class:`RunLoop` reads from its trainer: the config (``steps``, ``eval``, ``checkpoint``),
    the run folder, the step counter (advanced by the trainer's ``step()``) and what a checkpoint
    holds."""

    cfg: Any
    run_dir: Path
    step_idx: int
    model: Any
    tokenizer: Any
    optimizer: Any


@dataclass
class LoopSpec:
    """What one trainer's run loop does that another's does not.

    ``step`` runs one optimizer step (advancing ``trainer.step_idx``) and returns its metrics;
    ``evaluate`` returns an evaluation (None: nothing to evaluate, every evaluation is skipped);
    ``save`` writes a checkpoint (the trainer's ``save()``, which calls :meth:`RunLoop.save_checkpoint`).
    ``live`` maps progress-bar labels to metric keys; ``write`` False runs without a run folder, logs or
    checkpoints; ``logging`` are :class:`~posttrain.train.logger.MetricsLogger` options (tensorboard,
    wandb, wandb_project); ``samples(logger)`` logs the step's samples; ``finish()`` runs after the
    final checkpoint when ``write`` and returns entries for the summary (SFT: ``model_dir``).
    ``end_eval_key`` names the final evaluation in the summary; ``eval_fresh_zero_steps`` also
    evaluates at the end of a fresh run of zero steps. ``release()`` runs when the run ends in any
    way, before the run folder's lock is released (RL: the asynchronous generation workers stop, so
    the lock covers them).
    """

    name: str
    step: Callable[[], dict[str, float]]
    evaluate: Callable[[], dict[str, Any]] | None
    save: Callable[[], Path]
    live: Mapping[str, str] = field(default_factory=dict)
    write: bool = True
    progress: bool | None = None
    log_every: int | None = None
    logging: Mapping[str, Any] = field(default_factory=dict)
    samples: Callable[[Any], None] | None = None
    finish: Callable[[], dict[str, Any]] | None = None
    end_eval_key: str = "eval_end"
    eval_fresh_zero_steps: bool = False
    release: Callable[[], None] | None = None


class RunLoop:
    """The run loop, checkpoint save/restore and evaluation schedule of one trainer (module doc).

    ``checkpointed_step`` is the step of the checkpoint on disk that matches the weights (-1: none),
    so the final checkpoint is not written twice; ``resume_info`` what
    :func:`~posttrain.train.run_dir.start_run` found when this run resumed (None otherwise)."""

    def __init__(self, trainer: LoopTrainer) -> None:
        self.trainer = trainer
        self.checkpointed_step = -1
        self.resume_info: Any = None

    # ------------------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, state: dict[str, Any], extra: dict[str, Any] | None = None) -> Path:
        """Checkpoint of the trainer's current step under ``<run_dir>/checkpoints``: model, tokenizer,
        AdamW state and RNG states, plus the trainer's ``state`` (JSON) and ``extra`` tensors; the
        config is added to ``state``. FSDP2: the full state is gathered on rank 0, which writes (DDP:
        its replica is the full state)."""
        from posttrain.train.checkpoint import save_checkpoint

        t = self.trainer
        state = {"config": t.cfg.model_dump(mode="json"), **state}
        msd, osd = dist.full_state_dicts(t.model, t.optimizer)
        path = dist.on_main(
            lambda: save_checkpoint(
                t.run_dir / "checkpoints",
                t.step_idx,
                model=t.model,
                tokenizer=t.tokenizer,
                optimizer=t.optimizer,
                trainer_state=state,
                extra_tensors=extra,
                keep=t.cfg.checkpoint.keep,
                model_state=msd,
                optimizer_state=osd,
            )
        )
        self.checkpointed_step = t.step_idx
        return path

    def restore(self, ckpt: Path, restore_state: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
        """Load the AdamW and RNG states of ``ckpt`` (the model was loaded from it already), hand its
        trainer state to ``restore_state`` (which checks and restores the trainer's own part), then
        continue from its step. Returns the trainer state."""
        from posttrain.train.checkpoint import load_checkpoint

        t = self.trainer
        load = dist.optimizer_loader(t.model, t.optimizer)  # FSDP2: shards the full state
        state = load_checkpoint(ckpt, optimizer=t.optimizer, load_optimizer=load)
        restore_state(state)
        t.step_idx = self.checkpointed_step = int(state["step"])
        return state

    # ---------------------------------------------------------------------------------- the run
    def run(
        self, spec: LoopSpec, *, overwrite: bool = False, allow_config_change: bool = False
    ) -> dict[str, Any]:
        """Run from the trainer's step to ``cfg.steps`` with logging, evaluation and checkpoints;
        returns the summary (module doc)."""
        from posttrain.train.logger import MetricsLogger
        from posttrain.train.run_dir import end_run, start_run
        from posttrain.utils.progress import progress_bar

        t, cfg = self.trainer, self.trainer.cfg
        logger = None
        if spec.write:  # distributed: rank 0 checks and writes the run folder and logs
            self.resume_info = dist.on_main(
                lambda: start_run(
                    t.run_dir,
                    cfg.model_dump(mode="json"),
                    step=t.step_idx,
                    overwrite=overwrite,
                    allow_config_change=allow_config_change,
                    defaults=type(cfg)().model_dump(mode="json"),
                )
            )
            try:  # the lock start_run took is released if the logger or run.json cannot be set up
                logger = dist.main_only(
                    lambda: MetricsLogger(
                        t.run_dir,
                        config=cfg.model_dump(mode="json"),
                        truncate_after=t.step_idx,
                        **spec.logging,
                    )
                )
                dist.on_main(lambda: write_run_info(t))
            except BaseException:
                dist.on_main(lambda: end_run(t.run_dir))
                raise
        t0 = time.perf_counter()
        start = t.step_idx
        summary: dict[str, Any] = {"start_step": start}
        last: dict[str, float] = {}
        main = dist.is_main()  # other ranks print nothing
        try:
            if start == 0 and cfg.eval.at_start:
                self._evaluate(spec, logger, summary, "eval_start")
            elif start > 0 and logger is not None:
                # a resumed run reports the evaluation its first part made at step 0 (from the log)
                logged = logger.logged_eval(0)
                if logged is not None:
                    summary["eval_start"] = logged
                # ... and does not train on when its part before stopped early (eval.stop_at)
                reached = logger.logged_eval(start)
                if reached is not None and self._reached(reached):
                    summary["stopped_at"] = start
                    summary[spec.end_eval_key] = {k: v for k, v in reached.items() if k != "samples"}
            with progress_bar(
                spec.name,
                total=cfg.steps,
                enabled=spec.progress if main else False,
                completed=start,
                log_every=spec.log_every if main else 0,
            ) as bar:
                while t.step_idx < cfg.steps and "stopped_at" not in summary:
                    last = spec.step()
                    if logger:
                        logger.log_step(last)
                        if spec.samples is not None:
                            spec.samples(logger)
                    bar.advance(**{label: last[key] for label, key in spec.live.items()})
                    s = t.step_idx
                    if cfg.eval.every and s % cfg.eval.every == 0 and s < cfg.steps:
                        ev = self._evaluate(spec, logger)
                        if ev is not None and self._reached(ev):  # early stopping (eval.stop_at)
                            summary["stopped_at"] = s
                            summary[spec.end_eval_key] = {k: v for k, v in ev.items() if k != "samples"}
                    if spec.write and cfg.checkpoint.every and s % cfg.checkpoint.every == 0:
                        spec.save()
            fresh_end = t.step_idx > start or (spec.eval_fresh_zero_steps and start == 0)
            if cfg.eval.at_end and fresh_end and "stopped_at" not in summary:
                self._evaluate(spec, logger, summary, spec.end_eval_key)
            if spec.write:
                if cfg.checkpoint.final and self.checkpointed_step != t.step_idx:
                    spec.save()
                if spec.finish is not None:
                    summary.update(spec.finish())
        finally:
            try:
                if spec.release is not None:
                    spec.release()
            finally:
                if logger:
                    logger.close()
                end_run(t.run_dir)  # the run folder's lock (taken by start_run)
        summary.update(steps=t.step_idx, wall_s=time.perf_counter() - t0, last=last)
        return summary

    def _evaluate(
        self, spec: LoopSpec, logger: Any, summary: dict[str, Any] | None = None, key: str = ""
    ) -> dict[str, Any] | None:
        """One scheduled evaluation (none when the trainer has nothing to evaluate): logged at the
        current step, and kept in ``summary[key]`` without its sample completions when given."""
        if spec.evaluate is None:
            return None
        ev = spec.evaluate()
        if logger:
            logger.log_eval(self.trainer.step_idx, ev)
        if summary is not None:
            summary[key] = {k: v for k, v in ev.items() if k != "samples"}
        return ev

    def _reached(self, ev: dict[str, Any]) -> bool:
        """Whether an evaluation reached ``eval.stop_at`` (early stopping)."""
        stop = getattr(self.trainer.cfg.eval, "stop_at", None)
        return stop is not None and "accuracy" in ev and float(ev["accuracy"]) >= stop


class RunLoopTrainer:
    """Base of the trainers that run through a :class:`RunLoop` (``RLTrainer``, ``SFTTrainer``):
    ``resume_info`` and the ``with`` statement, which calls the trainer's ``close()`` on the way out and
    then releases the optimizer state: a trainer is a graph of reference cycles (its run loop, bound
    methods in hooks), freed only by Python's cyclic collector, so a process that trains several runs
    one after another (a benchmark's arms) kept every finished run's AdamW state, ~1 GB for a 135 M
    model, until a full collection happened to run. (The real-model bench grew ~2 GB per arm; with this
    release it still reached 10.5 GB in its third arm: the rest is not traced.)"""

    loop: RunLoop

    @property
    def resume_info(self) -> Any:
        """What the run folder's resume check found (:attr:`RunLoop.resume_info`; None: not resumed)."""
        return self.loop.resume_info

    def close(self) -> None:
        """Release what the trainer holds (reward workers, the torchrun process group)."""

    def __enter__(self: _T) -> _T:
        return self

    def __exit__(self, *exc: Any) -> None:
        import gc

        self.close()
        opt = getattr(self, "optimizer", None)
        if opt is not None and hasattr(opt, "state"):
            opt.state.clear()  # the run is over: its moments are not needed (checkpoints hold them)
        gc.collect()  # free earlier trainers' cycles now, not at the next full collection


def write_run_info(trainer: Any) -> None:
    """``run.json`` in the run folder: what the run resolved at start that ``config.yaml`` leaves to the
    machine: ``precision`` (what ``model.precision`` resolved to) and ``precision_reason``, the CPU's
    kernel level and bf16 flags, torch's version. Rewritten at every (re)start: a resumed run on
    another machine records that machine. Trainers without a resolved precision write none."""
    import torch

    if getattr(trainer, "precision", None) is None:
        return
    from posttrain.models.precision import cpu_capability
    from posttrain.utils.io import atomic_write_json

    info = {
        "precision": trainer.precision,
        "precision_reason": getattr(trainer, "precision_reason", None),
        "precision_setting": trainer.cfg.model.precision,
        "cpu": cpu_capability(),
        "torch": torch.__version__,
        "start_step": trainer.step_idx,
    }
    atomic_write_json(Path(trainer.run_dir) / "run.json", info)
