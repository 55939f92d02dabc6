"""Bradley-Terry scalar reward model: the baseline TRL / OpenRLHF users expect.

A sequence-classification head (one logit r_θ(x, y), read at the last real token) on a causal LM
backbone, trained on preference pairs with the Bradley-Terry loss (Ouyang et al., arXiv 2203.02155,
eq. 1; the optional margin m as in Llama 2, arXiv 2307.09288, eq. 2):

    L = − log σ(r_θ(x, y_c) − r_θ(x, y_r) − m)

Inputs are ``{prompt}\\n{response}`` (or the chat template: user = prompt, assistant = response,
``chat_template=True``). The backbone is a preset (random init), a causal LM directory (the head is
new) or a saved BT model. Training: AdamW, ``batch_size`` pairs per step, fixed seed; the model and
tokenizer are saved with ``save_pretrained`` under ``<out_dir>/model`` and ``metrics.jsonl`` per step.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator

from posttrain.utils.config import StrictModel
from posttrain.utils.errors import InvalidValueError
from posttrain_lab.recipes.patarm.data import PreferencePair


class BTConfig(StrictModel):
    model: str = "tiny"
    """A preset, a causal LM directory (new head) or a saved BT model directory."""
    chat_template: bool = False
    steps: int = Field(300, ge=0)
    batch_size: int = Field(32, ge=1)
    lr: float = Field(1e-3, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    grad_clip: float = Field(1.0, ge=0)
    margin: float = 0.0
    max_length: int = Field(512, ge=8)
    seed: int = 0
    device: str = "auto"
    dtype: str = "float32"
    precision: str = "fp32"
    """"fp32", or "bf16" = forwards under bf16 autocast over the fp32 weights (as ``model.precision``);
    the scores and the loss are fp32."""
    out_dir: str = "runs/rm-bt"

    @field_validator("precision")
    @classmethod
    def _precision(cls, v: str) -> str:
        from posttrain.models.precision import check_precision

        return check_precision(v)


def load_bt_model(
    spec: str, *, device: str = "cpu", dtype: str = "float32", seed: int = 0
) -> tuple[Any, Any]:
    """(sequence-classification model with one label, tokenizer) from a preset or a directory."""
    import torch
    from transformers import AutoModelForSequenceClassification

    from posttrain.models.loading import ensure_pad_token, resolve_dtype, resolve_model_dir
    from posttrain.models.presets import PRESETS, preset_config
    from posttrain.models.tokenizer import build_char_tokenizer

    td = resolve_dtype(dtype)
    if spec in PRESETS:
        tok = build_char_tokenizer()
        cfg = preset_config(spec, tok)
        cfg.num_labels = 1
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = AutoModelForSequenceClassification.from_config(cfg)
        model = model.to(td)
    else:
        from transformers import AutoTokenizer, PreTrainedTokenizerFast

        from posttrain.models.loading import _GENERIC_TOKENIZER_CLASSES, _declared_tokenizer_class

        path = Path(resolve_model_dir(spec))
        if not (path / "config.json").is_file():
            raise InvalidValueError(f"BT model {spec!r}: not a preset and no config.json in {path}")
        cls = (
            PreTrainedTokenizerFast
            if _declared_tokenizer_class(path) in _GENERIC_TOKENIZER_CLASSES
            else AutoTokenizer
        )
        tok = cls.from_pretrained(str(path), local_files_only=True)
        from transformers.utils import logging as hf_logging

        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()  # "newly initialised score head" is expected here
        try:
            model = AutoModelForSequenceClassification.from_pretrained(
                str(path), num_labels=1, dtype=td, local_files_only=True
            )
        finally:
            hf_logging.set_verbosity(verbosity)
    ensure_pad_token(tok)
    model.config.pad_token_id = tok.pad_token_id
    return model.to(device), tok


class BTRewardModel:
    """Scores (prompt, response) pairs with a BT model; ``score(prompts, responses) -> list[float]``."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        chat_template: bool = False,
        max_length: int = 512,
        precision: str = "fp32",
    ) -> None:
        from posttrain.models.precision import check_precision

        self.model, self.tokenizer = model, tokenizer
        self.chat_template = chat_template
        self.max_length = max_length
        self.precision = check_precision(precision)

    def text(self, prompt: str, response: str) -> str:
        if self.chat_template:
            return self.tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}],
                tokenize=False,
            )
        return f"{prompt}\n{response}"

    def _batch(self, prompts: list[str], responses: list[str]) -> Any:
        import torch

        pad = self.tokenizer.pad_token_id
        ids = [
            self.tokenizer.encode(self.text(p, r), add_special_tokens=False)[-self.max_length :]
            for p, r in zip(prompts, responses, strict=True)
        ]
        width = max(len(x) for x in ids)
        inp = torch.full((len(ids), width), pad, dtype=torch.long)
        att = torch.zeros((len(ids), width), dtype=torch.long)
        for i, x in enumerate(ids):  # right padding: the head reads the last non-pad token
            inp[i, : len(x)] = torch.tensor(x)
            att[i, : len(x)] = 1
        dev = next(self.model.parameters()).device
        return inp.to(dev), att.to(dev)

    def forward(self, prompts: list[str], responses: list[str]) -> Any:
        """Scalar rewards (fp32), the forward in ``precision``."""
        from posttrain.models.precision import precision_autocast

        inp, att = self._batch(prompts, responses)
        with precision_autocast(inp.device, self.precision):
            return self.model(input_ids=inp, attention_mask=att).logits[:, 0].float()

    def score(self, prompts: list[str], responses: list[str], *, batch_size: int = 64) -> list[float]:
        import torch

        self.model.eval()
        out: list[float] = []
        with torch.no_grad():
            for s in range(0, len(prompts), batch_size):
                out += [
                    float(v) for v in self.forward(prompts[s : s + batch_size], responses[s : s + batch_size])
                ]
        return out


def bt_loss(r_c: Any, r_r: Any, margin: float = 0.0) -> Any:
    import torch.nn.functional as F

    return -F.logsigmoid(r_c - r_r - margin).mean()


def train_bt(cfg: BTConfig, pairs: list[PreferencePair], *, progress: bool = False) -> dict[str, Any]:
    """Train a BT model on ``pairs``; returns the summary (final loss, train accuracy, wall time)."""
    import torch

    from posttrain.models import pick_device

    if not pairs:
        raise InvalidValueError("train_bt: no preference pairs")
    dev = pick_device() if cfg.device == "auto" else cfg.device
    model, tok = load_bt_model(cfg.model, device=dev, dtype=cfg.dtype, seed=cfg.seed)
    rm = BTRewardModel(
        model, tok, chat_template=cfg.chat_template, max_length=cfg.max_length, precision=cfg.precision
    )
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    rng = random.Random(cfg.seed)
    order: list[int] = []
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    last: dict[str, float] = {}
    with open(out / "metrics.jsonl", "w", encoding="utf-8") as log:
        for step in range(cfg.steps):
            model.train()
            if len(order) < cfg.batch_size:
                more = list(range(len(pairs)))
                rng.shuffle(more)
                order += more
            idx, order = order[: cfg.batch_size], order[cfg.batch_size :]
            b = [pairs[i] for i in idx]
            r = rm.forward([p.prompt for p in b] * 2, [p.chosen for p in b] + [p.rejected for p in b])
            r_c, r_r = r[: len(b)], r[len(b) :]
            loss = bt_loss(r_c, r_r, cfg.margin)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            opt.step()
            last = {
                "step": step + 1,
                "loss": float(loss.detach()),
                "accuracy": float((r_c > r_r).float().mean()),
            }
            log.write(json.dumps(last) + "\n")
            if progress and (step + 1) % 50 == 0:
                print(f"bt step {step + 1}: loss {last['loss']:.4f} acc {last['accuracy']:.2f}", flush=True)
    model.save_pretrained(str(out / "model"))
    tok.save_pretrained(str(out / "model"))
    (out / "config.json").write_text(json.dumps(cfg.model_dump(), indent=2), encoding="utf-8")
    return {"steps": cfg.steps, "last": last, "wall_s": time.perf_counter() - t0, "model": str(out / "model")}
