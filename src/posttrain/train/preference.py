"""Preference optimization (DPO, IPO, SimPO, ORPO, KTO) on pairs of completions: ``posttrain dpo``.

One step: the next ``batch_size`` pairs from the :class:`~posttrain.train.preference_data.PairSource`
(offline: a preference file, shuffled epoch by epoch), per micro-batch one forward over the chosen and
rejected sequences together, summed completion log-probs l_w, l_l and lengths n_w, n_l, the loss
``loss.name`` of :mod:`posttrain.algos.preference` with the whole batch's pair and chosen-token counts
as normalisers (so the gradient does not depend on ``micro_batch_size``), clip, AdamW. The metrics are
the loss's on the whole batch (``rewards/chosen``, ``rewards/rejected``, ``rewards/margins``,
``rewards/accuracies``, ``logps/chosen``, ``logps/rejected``, TRL's names) plus ``loss``,
``grad_norm``, ``lr``, ``tokens``, ``epoch``.

Reference: the initial policy. Its log-probs of every training and held-out completion are computed
ONCE, before the first step, and stored with every checkpoint (``checkpoints/step_*/rng.safetensors``,
``extra.ref_*``), so a resumed run reads them instead of loading the reference again; reference-free
losses (simpo, orpo) compute none. With ``model.lora`` the reference is the same module with its
adapters off (:class:`~posttrain.models.lora.AdapterDisabledLM`), never a second copy. kto also needs
the reference each step for its KL completions (prompt i with the completions of pair i+1): a frozen
copy (or, LoRA, the adapters off) is kept for it.

Held-out preference accuracy (``eval.*``): on ``eval_data`` (a preference file) or the last
``eval_holdout`` rows of ``data``: the loss and its metrics on those pairs, ``preference_accuracy`` =
the fraction whose implicit reward ranks the chosen completion above the rejected one.

Runs through the run loop every trainer shares (:mod:`posttrain.train.loop`): run folder and its
lock, checkpoints, bitwise resume (``PreferenceTrainer(cfg, resume=True)`` / ``posttrain dpo
--resume``), the metrics log. One process (no torchrun); causal-LM adapters.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import Field, field_validator, model_validator

from posttrain.algos import PreferenceInputs, get_preference_loss
from posttrain.models.logprobs import DEFAULT_CHUNK_SIZE, pad_right
from posttrain.models.precision import precision_autocast
from posttrain.train.config import CheckpointConfig, ModelConfig, OptimizerConfig
from posttrain.train.loop import LoopSpec, RunLoop, RunLoopTrainer
from posttrain.train.preference_data import (
    EncodedPair,
    OfflinePairs,
    PairSource,
    PreferenceDataError,
    PreferenceFields,
    bound_pairs,
    encode_pair,
    pairs_fingerprint,
    parse_preference_row,
    read_preference_file,
)
from posttrain.train.preference_online import OnlineConfig, OnlinePairs
from posttrain.utils.config import StrictModel
from posttrain.utils.errors import InvalidValueError

__all__ = ["PreferenceConfig", "PreferenceTrainer"]


class PreferenceLossConfig(StrictModel):
    name: str = "dpo"
    """A loss of ``posttrain.algos.list_preference_losses()`` (dpo, ipo, simpo, orpo, kto) or a plug-in
    ``package.module:fn`` registered with ``register_preference_loss``."""
    params: dict[str, Any] = Field(default_factory=dict)
    """The loss's parameters, e.g. ``{beta: 0.1, label_smoothing: 0.1}`` (docs/preference.md)."""

    @model_validator(mode="after")
    def _known(self) -> PreferenceLossConfig:
        try:
            loss = get_preference_loss(self.name)
            loss.check_params(dict(self.params))
        except (KeyError, TypeError, ValueError) as e:
            msg = str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e)
            raise InvalidValueError(f"loss: {msg}") from None
        return self


class PreferenceOptimizerConfig(OptimizerConfig):
    """RL's ``OptimizerConfig`` with TRL ``DPOConfig``'s learning rate (1e-6)."""

    lr: float = Field(1e-6, gt=0)


class PreferenceEvalConfig(StrictModel):
    every: int = Field(0, ge=0)
    """Held-out preference accuracy every this many steps (0 = only at the end)."""
    at_start: bool = False
    at_end: bool = True


class PreferenceConfig(StrictModel):
    model: ModelConfig = ModelConfig()
    data: str | None = None
    """Preference rows (TRL's standard or conversational format, explicit or implicit prompt): a JSONL /
    JSON / parquet / arrow file or a ``datasets`` ``save_to_disk`` directory."""
    data_fields: PreferenceFields = PreferenceFields()
    """Column names in ``data`` / ``eval_data``, e.g. ``{chosen: better, rejected: worse}``."""
    eval_data: str | None = None
    """Held-out preference rows (same formats) for the held-out accuracy."""
    eval_holdout: int = Field(0, ge=0)
    """Hold out the last this many rows of ``data`` as the held-out set (when ``eval_data`` is None)."""
    max_examples: int | None = Field(None, ge=1)
    loss: PreferenceLossConfig = Field(default_factory=PreferenceLossConfig)
    prompt_template: str = "{prompt}"
    """Text around a standard row's prompt (must contain ``{prompt}``), as ``task.prompt_template``."""
    chat_template: bool = False
    """Wrap a standard row's prompt as one user turn with the tokenizer's chat template (conversational
    rows always use it)."""
    max_prompt_length: int | None = Field(None, ge=1)
    max_completion_length: int | None = Field(None, ge=1)
    max_length: int | None = Field(None, ge=2)
    """Longest prompt + completion in tokens; None = the model's context."""
    overlong: Literal["error", "truncate", "skip"] = "error"
    """A pair over a limit: an error naming its file and row, truncate (the prompt keeps its end, a
    completion its start), or skip (both counted and reported)."""
    steps: int = Field(100, ge=0)
    batch_size: int = Field(8, ge=1)
    """Pairs per optimizer step."""
    micro_batch_size: int | None = Field(None, ge=1)
    """Pairs per forward/backward (gradient accumulation); None = the whole batch."""
    optimizer: PreferenceOptimizerConfig = Field(default_factory=PreferenceOptimizerConfig)
    logprob_chunk_size: int = Field(DEFAULT_CHUNK_SIZE, ge=1)
    seed: int = 0
    threads: int | None = Field(None, ge=1)
    out_dir: str = "runs/dpo"
    eval: PreferenceEvalConfig = Field(default_factory=PreferenceEvalConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    save: bool = True
    progress: bool | None = None
    online: OnlineConfig = Field(default_factory=OnlineConfig)
    """Online pairs (``online.enabled=true``): each step samples groups from the current policy on
    ``online.task``'s prompts, scores them with ``online.reward`` and trains on each group's best vs
    worst completion (:mod:`posttrain.train.preference_online`); ``data`` is then not read."""

    @field_validator("prompt_template")
    @classmethod
    def _has_field(cls, v: str) -> str:
        if "{prompt}" not in v:
            raise InvalidValueError("must contain the field '{prompt}'")
        return v

    @model_validator(mode="after")
    def _one_source(self) -> PreferenceConfig:
        """Online pairs replace the preference file: refuse a config that sets both."""
        if self.online.enabled and (self.data or self.eval_holdout or self.max_examples):
            key = "data" if self.data else ("eval_holdout" if self.eval_holdout else "max_examples")
            raise InvalidValueError(
                f"{key}: set together with online.enabled=true, whose pairs come from online.task's prompts "
                "sampled each step, not from a file; drop it (held-out pairs for preference accuracy: eval_data)"
            )
        return self


class PreferenceTrainer(RunLoopTrainer):
    """``PreferenceTrainer(cfg).train()``; ``rows=[{"prompt", "chosen", "rejected"}, ...]`` instead of
    ``cfg.data``; ``source=`` any :class:`~posttrain.train.preference_data.PairSource` (its pairs get
    reference log-probs when they arrive without them); ``model=`` / ``tokenizer=`` a causal LM in
    memory; ``resume=True`` continues from ``<out_dir>/checkpoints/latest``."""

    def __init__(
        self,
        cfg: PreferenceConfig,
        model: Any = None,
        tokenizer: Any = None,
        *,
        rows: list[Any] | None = None,
        source: PairSource | None = None,
        eval_rows: list[Any] | None = None,
        resume: bool = False,
    ) -> None:
        from posttrain.rollout import PromptFormatter
        from posttrain.train.builder import load_policy, resolve_run_precision, setup_process
        from posttrain.train.checkpoint import resolve_checkpoint
        from posttrain.train.lengths import model_context

        self.cfg = cfg
        self.loss_fn = get_preference_loss(cfg.loss.name)
        self.device = setup_process(cfg.threads, cfg.seed, cfg.model.device)
        ckpt = resolve_checkpoint(Path(cfg.out_dir)) if resume else None
        self.lm = load_policy(cfg, model, tokenizer, ckpt, self.device)
        self.model, self.tokenizer, self.device = self.lm.model, self.lm.tokenizer, self.lm.device
        self.run_dir = Path(cfg.out_dir)
        self.precision, self.precision_reason = resolve_run_precision(cfg, self.lm)
        self.formatter = PromptFormatter(self.tokenizer, template=cfg.prompt_template, chat=cfg.chat_template)
        ctx = model_context(self.model)
        if cfg.max_length and ctx and cfg.max_length > ctx:
            raise PreferenceDataError(
                f"max_length: {cfg.max_length} is longer than the model's context ({ctx} tokens)"
            )
        self._limit = cfg.max_length or ctx
        online = source is None and cfg.online.enabled
        if online and rows is not None:
            raise InvalidValueError(
                "PreferenceTrainer: rows= given with online.enabled=true; online pairs are sampled from "
                "online.task's prompts, pass one or the other"
            )
        train_pairs, eval_pairs = self._load_pairs(rows, eval_rows, source, online=online)
        self.eval_pairs = eval_pairs
        self.train_pairs = train_pairs
        if online:  # pairs sampled from this policy each step (train/preference_online.py)
            source = OnlinePairs.from_config(cfg.online, self.lm, precision=self.precision, seed=cfg.seed)
        self.owns_source = online
        self._streamed = source is not None  # pairs that arrive during the run, without reference log-probs
        self.source: PairSource = source if source is not None else OfflinePairs(train_pairs, seed=cfg.seed)
        try:  # an online source's reward workers are released if the rest fails
            self._prepare(ckpt)
        except BaseException:
            self.close()
            raise

    def _prepare(self, ckpt: Path | None) -> None:
        """The reference, the optimizer, the checkpoint's state, the reference log-probs of the pairs."""
        from posttrain.models.lora import AdapterDisabledLM, is_lora
        from posttrain.train.builder import reference_policy
        from posttrain.train.optim import build_adamw

        cfg, train_pairs, eval_pairs = self.cfg, self.train_pairs, self.eval_pairs
        lora = is_lora(self.model)
        # the reference each step (kto's KL completions; an online source's new pairs): kept for the run
        self.reference: Any = None
        if self.loss_fn.needs_reference and (self.loss_fn.needs_kl or self._streamed):
            self.reference = reference_policy(cfg, self.lm, ckpt, self.device)
        self.optimizer = build_adamw(self.model, cfg.optimizer)
        self.step_idx = 0
        self.loop = RunLoop(self)
        if ckpt is not None:
            self._restore(ckpt)
        if self.loss_fn.needs_reference:
            missing = [p for p in train_pairs + eval_pairs if p.ref_chosen is None]
            if missing:
                ref = self.reference
                if ref is None:  # fresh: the policy before its first step IS the reference
                    ref = AdapterDisabledLM(self.lm) if lora else (self.lm if ckpt is None else None)
                if ref is None:  # resumed from a checkpoint without them: the initial model again
                    ref = reference_policy(cfg, self.lm, ckpt, self.device)
                self._fill_reference(missing, ref)

    # ------------------------------------------------------------------------------------ data
    def _load_pairs(
        self, rows: list[Any] | None, eval_rows: list[Any] | None, source: PairSource | None, *, online: bool
    ) -> tuple[list[EncodedPair], list[EncodedPair]]:
        cfg = self.cfg
        if rows is not None:
            parsed, where = (
                [parse_preference_row(r, f"rows[{i}]", cfg.data_fields) for i, r in enumerate(rows)],
                "rows",
            )
        elif cfg.data:
            parsed, where = read_preference_file(cfg.data, cfg.data_fields), cfg.data
        elif source is not None or online:
            parsed, where = [], "source"
        else:
            raise InvalidValueError(
                "PreferenceTrainer: no training pairs: set data=<preference file> (or pass rows=), or sample "
                "them from the policy with online.enabled=true"
            )
        parsed = parsed[: cfg.max_examples]
        held: list[Any] = []
        if eval_rows is not None:
            held = [
                parse_preference_row(r, f"eval_rows[{i}]", cfg.data_fields) for i, r in enumerate(eval_rows)
            ]
        elif cfg.eval_data:
            held = read_preference_file(cfg.eval_data, cfg.data_fields)
        elif cfg.eval_holdout:
            if cfg.eval_holdout >= len(parsed):
                raise InvalidValueError(
                    f"eval_holdout: {cfg.eval_holdout} rows held out of {len(parsed)} leaves none to train on"
                )
            parsed, held = parsed[: -cfg.eval_holdout], parsed[-cfg.eval_holdout :]
        train = self._encode(parsed, where) if parsed else []
        heldout = self._encode(held, cfg.eval_data or f"{where} (held out)") if held else []
        return train, heldout

    def _encode(self, parsed: list[Any], where: str) -> list[EncodedPair]:
        cfg = self.cfg
        pairs = [encode_pair(r, self.tokenizer, self.formatter) for r in parsed]
        pairs, report = bound_pairs(
            pairs,
            max_prompt_length=cfg.max_prompt_length,
            max_completion_length=cfg.max_completion_length,
            max_length=self._limit,
            overlong=cfg.overlong,
            source=where,
        )
        note = report.note(where, self._limit or 0)
        if note:
            print(f"note: {note} (overlong={cfg.overlong})", file=sys.stderr, flush=True)
        return pairs

    # ------------------------------------------------------------------------------ log-probs
    def _sequence_logps(
        self, lm: Any, prompts: list[list[int]], comps: list[list[int]]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(Σ_t log π over each completion, its length): one forward of the sequences prompt + completion
        through ``lm``, in ``model.precision``."""
        seqs = [p + c for p, c in zip(prompts, comps, strict=True)]
        masks = [[0] * len(p) + [1] * len(c) for p, c in zip(prompts, comps, strict=True)]
        ids, am, lmask = pad_right(seqs, self.tokenizer.pad_token_id or 0, masks)
        ids, am, lmask = ids.to(self.device), am.to(self.device), lmask.to(self.device)
        with precision_autocast(self.device, self.precision):
            logp, _ = lm.logprobs(ids, am, lmask, chunk_size=self.cfg.logprob_chunk_size)
        return (logp.float() * lmask).sum(-1), lmask.sum(-1).float()

    def _pair_logps(self, lm: Any, pairs: list[EncodedPair]) -> tuple[torch.Tensor, ...]:
        """(l_w, l_l, n_w, n_l) of ``pairs``: chosen and rejected in one forward."""
        prompts = [p.prompt_ids for p in pairs] * 2
        comps = [p.chosen_ids for p in pairs] + [p.rejected_ids for p in pairs]
        sums, lens = self._sequence_logps(lm, prompts, comps)
        b = len(pairs)
        return sums[:b], sums[b:], lens[:b], lens[b:]

    @torch.no_grad()
    def _fill_reference(self, pairs: list[EncodedPair], ref: Any) -> None:
        """The reference's summed log-probs of each pair's completions, stored on the pairs."""
        was = self.model.training
        self.model.eval()
        try:
            size = self.cfg.micro_batch_size or self.cfg.batch_size
            for s in range(0, len(pairs), size):
                part = pairs[s : s + size]
                lw, ll, _, _ = self._pair_logps(ref, part)
                for p, a, b in zip(part, lw.tolist(), ll.tolist(), strict=True):
                    p.ref_chosen, p.ref_rejected = a, b
        finally:
            self.model.train(was)

    @torch.no_grad()
    def _kl_logps(self, pairs: list[EncodedPair]) -> tuple[torch.Tensor, torch.Tensor]:
        """kto's KL completions: prompt i with the chosen and rejected completions of pair i+1 (mod B),
        under the policy and the reference (no gradient)."""
        b = len(pairs)
        prompts = [p.prompt_ids for p in pairs] * 2
        comps = [pairs[(i + 1) % b].chosen_ids for i in range(b)] + [
            pairs[(i + 1) % b].rejected_ids for i in range(b)
        ]
        pol, _ = self._sequence_logps(self.lm, prompts, comps)
        ref, _ = self._sequence_logps(self.reference, prompts, comps)
        return pol, ref

    def _inputs(
        self, pairs: list[EncodedPair], logps: tuple[torch.Tensor, ...], kl: Any = None
    ) -> PreferenceInputs:
        lw, ll, nw, nl = logps
        refs: tuple[Any, Any] = (None, None)
        if self.loss_fn.needs_reference:
            refs = tuple(
                torch.tensor([getattr(p, k) for p in pairs], dtype=lw.dtype, device=lw.device)
                for k in ("ref_chosen", "ref_rejected")
            )  # type: ignore[assignment]
        kl_pol, kl_ref = kl if kl is not None else (None, None)
        return PreferenceInputs(lw, ll, nw, nl, refs[0], refs[1], kl_pol, kl_ref)

    # ------------------------------------------------------------------------------------ one step
    def step(self) -> dict[str, float]:
        from posttrain.train.optim import clip_and_step, scheduled_lr, set_lr

        cfg = self.cfg
        lr = scheduled_lr(cfg.optimizer, self.step_idx, cfg.steps)
        set_lr(self.optimizer, lr)
        self.model.train()
        pairs = self.source.next_pairs(cfg.batch_size)
        source_metrics = getattr(self.source, "step_metrics", dict)()
        if not pairs:  # an online step whose groups all lacked a margin: nothing to learn from, no update
            self.step_idx += 1
            return {
                "step": self.step_idx,
                "loss": 0.0,
                "grad_norm": 0.0,
                "lr": lr,
                "rewards/margins": 0.0,
                "update_skipped": 1.0,
                **source_metrics,
            }
        if self.loss_fn.needs_reference:
            fresh = [p for p in pairs if p.ref_chosen is None]
            if fresh:  # an online source's new pairs
                self._fill_reference(fresh, self.reference)
        kl = self._kl_logps(pairs) if self.loss_fn.needs_kl else None
        # normalisers of the whole batch: pairs (kto: its desirable + undesirable examples), chosen tokens
        n_rows = 2 * len(pairs) if not self.loss_fn.paired else len(pairs)
        n_tok = float(sum(len(p.chosen_ids) for p in pairs))
        self.optimizer.zero_grad(set_to_none=True)
        size = cfg.micro_batch_size or len(pairs)
        loss_total, detached = 0.0, []
        for s in range(0, len(pairs), size):
            part = pairs[s : s + size]
            logps = self._pair_logps(self.lm, part)
            loss, _ = self.loss_fn(
                self._inputs(part, logps, kl), global_pairs=n_rows, global_tokens=n_tok, **cfg.loss.params
            )
            loss.backward()
            loss_total += float(loss.detach())
            detached.append(tuple(t.detach() for t in logps))
        norm = clip_and_step(self.model, self.optimizer, cfg.optimizer.grad_clip)
        self.step_idx += 1
        whole = tuple(torch.cat([d[i] for d in detached]) for i in range(4))
        with torch.no_grad():  # the loss's metrics on the whole batch (micro-batch invariant)
            _, metrics = self.loss_fn(self._inputs(pairs, whole, kl), **cfg.loss.params)
        out = {"step": self.step_idx, "loss": loss_total, "grad_norm": norm, "lr": lr}
        out.update({k: float(v) for k, v in metrics.items()})
        out["tokens"] = float(whole[2].sum() + whole[3].sum())
        epoch = getattr(self.source, "epoch", None)
        if epoch is not None:
            out["epoch"] = float(epoch)
        out.update(source_metrics)
        return out

    # ---------------------------------------------------------------------------------- evaluation
    @torch.no_grad()
    def evaluate(self) -> dict[str, Any]:
        """The loss and its metrics on the held-out pairs; ``preference_accuracy`` = ``rewards/accuracies``
        (the fraction of pairs whose implicit reward ranks the chosen completion first), ``n`` pairs."""
        pairs = self.eval_pairs
        was = self.model.training
        self.model.eval()
        try:
            size = self.cfg.micro_batch_size or self.cfg.batch_size
            parts = [self._pair_logps(self.lm, pairs[s : s + size]) for s in range(0, len(pairs), size)]
        finally:
            self.model.train(was)
        logps = tuple(torch.cat([p[i] for p in parts]) for i in range(4))
        kl = None
        if self.loss_fn.needs_kl:
            kl = self._kl_logps(pairs)
        loss, metrics = self.loss_fn(self._inputs(pairs, logps, kl), **self.cfg.loss.params)
        ev = {"loss": float(loss), "n": len(pairs), **{k: float(v) for k, v in metrics.items()}}
        ev["preference_accuracy"] = ev.get("rewards/accuracies", 0.0)
        return ev

    def close(self) -> None:
        """Release the online source's reward workers and engine (a source passed in is the caller's)."""
        if self.owns_source:
            self.source.close()  # type: ignore[attr-defined]

    # ------------------------------------------------------------------------------ checkpointing
    def _ref_tensors(self) -> dict[str, torch.Tensor]:
        if not self.loss_fn.needs_reference:
            return {}
        out = {}
        for name, pairs in (("train", self.train_pairs), ("eval", self.eval_pairs)):
            for side in ("chosen", "rejected"):
                out[f"ref_{name}_{side}"] = torch.tensor(
                    [getattr(p, f"ref_{side}") for p in pairs], dtype=torch.float64
                )
        return out

    def save(self) -> Path:
        """Checkpoint: the shared part (model, AdamW, RNG, step) plus the data fingerprint, the pair
        source's position and the cached reference log-probs."""
        state = {
            "trainer": "preference",
            "data": {
                "n": len(self.train_pairs),
                "sha256": self.source.fingerprint,
                "eval_sha256": pairs_fingerprint(self.eval_pairs),
            },
            "source": self.source.state_dict(),
        }
        return self.loop.save_checkpoint(state, self._ref_tensors())

    def _restore(self, ckpt: Path) -> None:
        def restore_state(state: dict[str, Any]) -> None:
            data = state.get("data")
            if state.get("trainer") != "preference" or not isinstance(data, dict):
                raise InvalidValueError(f"{ckpt}: not a preference-optimization checkpoint")
            if data.get("sha256") != self.source.fingerprint or data.get("eval_sha256") != pairs_fingerprint(
                self.eval_pairs
            ):
                raise PreferenceDataError(
                    f"{ckpt}: the checkpoint was trained on different pairs ({data.get('n')} then, "
                    f"{len(self.train_pairs)} now, or other tokens, or another online.* pair source); resuming "
                    "would not continue the same run. Use the same data (or online settings), templates and "
                    "tokenizer, or start a new out_dir"
                )
            self.source.load_state_dict(state["source"])
            extra = state.get("extra_tensors", {})
            for name, pairs in (("train", self.train_pairs), ("eval", self.eval_pairs)):
                for side in ("chosen", "rejected"):
                    t = extra.get(f"ref_{name}_{side}")
                    if t is not None and len(t) == len(pairs):
                        for p, v in zip(pairs, t.tolist(), strict=True):
                            setattr(p, f"ref_{side}", v)

        self.loop.restore(ckpt, restore_state)

    # ------------------------------------------------------------------------------------ full run
    def train(self, *, overwrite: bool = False, allow_config_change: bool = False) -> dict[str, Any]:
        """Run to ``cfg.steps`` through the shared run loop; returns its summary (``eval`` holds the
        final held-out preference accuracy when there is a held-out set)."""
        spec = LoopSpec(
            name="dpo",
            step=self.step,
            evaluate=self.evaluate if self.eval_pairs else None,
            save=self.save,
            live={"loss": "loss", "margin": "rewards/margins"},
            write=self.cfg.save,
            progress=self.cfg.progress,
            finish=lambda: {"model_dir": str(self.lm.save(self.run_dir / "model"))},
            end_eval_key="eval",
        )
        return self.loop.run(spec, overwrite=overwrite, allow_config_change=allow_config_change)
