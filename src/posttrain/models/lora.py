"""LoRA through Hugging Face ``peft`` (``model.lora`` in the RL, SFT and judge-trainer configs).

LoRA (Hu et al., arXiv:2106.09685) freezes the base weights W and trains a low-rank update per
targeted linear layer: W' = W + (alpha / r) · B A with A (r × d_in), B (d_out × r), B = 0 at the start,
so the adapted model starts exactly at the base model. This module does not re-implement it: it
builds ``peft.LoraConfig`` / ``peft.get_peft_model`` from the typed ``model.lora`` section
(:class:`posttrain.train.config.LoRAConfig`: rank, alpha, dropout, target_modules), and uses
peft's own save format, ``disable_adapter()`` and ``merge_and_unload()``:

* :func:`prepare_model` — what a trainer does after loading: a model that carries adapters from an
  earlier run is merged first (it is the starting point), then new adapters are added when ``model.lora``
  is set (initialised under a private RNG seeded by the run's seed, so the global RNG is untouched);
* :class:`AdapterDisabledLM` — the KL reference policy: the SAME module with adapters disabled
  (``PeftModel.disable_adapter()``), i.e. the base model, with no second copy of the weights;
* checkpoints and saved models hold the adapter only (``adapter_config.json`` +
  ``adapter_model.safetensors``, peft's layout) plus ``posttrain_base.json`` (what the base model is:
  spec, seed, dtype); :func:`load_adapter_dir` rebuilds base + adapter from such a directory, so every
  loader (``posttrain eval``, ``serve``, the judge, resume) reads it like a full model directory;
* :func:`merge_to_dir` — ``posttrain export --merge``: base + adapter merged into one plain Hugging Face
  directory (``merge_and_unload``).

``peft`` is an optional dependency (``pip install -e ".[lora]"``); the error says so.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from posttrain.models.resolve import ADAPTER_CONFIG
from posttrain.utils.errors import InvalidValueError, MissingPackageError

BASE_FILE = "posttrain_base.json"
"""Sidecar of an adapter directory: ``{"model": spec, "seed": int, "dtype": str}`` of the base model."""


def require_peft() -> Any:
    """The ``peft`` module, or a :class:`MissingPackageError` that says how to install it."""
    try:
        import peft
    except ImportError as e:
        raise MissingPackageError(
            'model.lora needs the `peft` package: pip install -e ".[lora]" (or pip install peft)'
        ) from e
    return peft


@contextmanager
def quiet_peft() -> Iterator[None]:
    """Around posttrain's calls of peft that wrap a model (``get_peft_model``,
    ``PeftModel.from_pretrained``): peft 0.21 reads transformers 5's deprecated
    ``is_gradient_checkpointing`` there, and the FutureWarning it raises ("... is deprecated and will be
    removed in v6") is for peft's maintainers, not for whoever trains or exports a LoRA model."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning
        )
        yield


def is_lora(model: Any) -> bool:
    """Whether ``model`` is a peft model (carries adapters)."""
    try:
        from peft import PeftModel
    except ImportError:
        return False
    return isinstance(model, PeftModel)


def is_adapter_dir(path: str | os.PathLike) -> bool:
    """A directory holding a saved adapter (``adapter_config.json``) and no full model."""
    p = Path(path)
    return p.is_dir() and (p / ADAPTER_CONFIG).is_file() and not (p / "config.json").is_file()


def _linear_names(model: torch.nn.Module) -> list[str]:
    return sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)})


def apply_lora(model: torch.nn.Module, cfg: Any, *, base: dict[str, Any], seed: int = 0) -> Any:
    """``peft.get_peft_model`` with ``cfg``; ``base`` (spec, seed, dtype) is kept on the model and
    written next to the adapter on save. A target module the model does not have is an error naming
    the linear layers it does have."""
    peft = require_peft()
    have = _linear_names(model)
    missing = [t for t in cfg.target_modules if t not in have]
    if missing:
        raise InvalidValueError(
            f"model.lora.target_modules: {', '.join(missing)} not found in {type(model).__name__}; its linear "
            f"layers: {', '.join(have)}"
        )
    lcfg = peft.LoraConfig(
        r=cfg.rank,
        lora_alpha=cfg.alpha,
        lora_dropout=cfg.dropout,
        target_modules=list(cfg.target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )
    with torch.random.fork_rng(devices=[]):  # adapter init from the run's seed, global RNG untouched
        torch.manual_seed(seed)
        with quiet_peft():
            peft_model = peft.get_peft_model(model, lcfg)
    peft_model.posttrain_base = dict(base)
    return peft_model


def prepare_model(model: torch.nn.Module, model_cfg: Any, *, seed: int, resumed: bool) -> torch.nn.Module:
    """The model a trainer trains, from its ``model`` config section (``model_cfg.lora``, ``.name``,
    ``.dtype``) and the run's ``seed``. Resumed: as loaded (a LoRA checkpoint already holds base +
    adapter). Otherwise a model carrying adapters from an earlier run is merged (it is the starting
    point) and, with ``model.lora`` set, new adapters are added on top (the KL reference is then that
    merged model)."""
    if resumed:
        return model
    if is_lora(model):
        model = model.merge_and_unload().requires_grad_(True)  # peft froze the base weights
    if model_cfg.lora is None:
        return model
    return apply_lora(model, model_cfg.lora, base=base_spec(model_cfg, seed), seed=seed)


def base_spec(model_cfg: Any, seed: int) -> dict[str, Any]:
    """What ``posttrain_base.json`` records for a trainer's ``model`` section: its ``name`` (a preset,
    or the absolute model directory it resolves to, so a run folder that moves on later still means the
    same weights), the run's ``seed`` (a preset's weights depend on it) and its ``dtype``. A model
    passed to a trainer in memory is recorded as ``model.name`` too: pass the matching name."""
    from posttrain.models.resolve import resolve_model_dir

    spec = resolve_model_dir(model_cfg.name)
    if Path(spec).expanduser().is_dir():
        spec = str(Path(spec).expanduser().resolve())
    return {"model": spec, "seed": int(seed), "dtype": model_cfg.dtype}


class AdapterDisabledLM:
    """The base model of a peft policy as a model adapter: ``logprobs`` runs the policy's own module
    under ``disable_adapter()`` (no gradient), so the KL reference costs no second copy of the weights."""

    def __init__(self, lm: Any) -> None:
        if not is_lora(lm.model):
            raise InvalidValueError("AdapterDisabledLM: the policy has no LoRA adapters")
        self.lm = lm
        self.model = lm.model
        self.tokenizer = lm.tokenizer
        self.kind = lm.kind

    @property
    def device(self) -> torch.device:
        return self.lm.device

    def logprobs(self, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.no_grad(), self.lm.model.disable_adapter():
            return self.lm.logprobs(*args, **kwargs)


def write_base_file(model: Any, path: str | os.PathLike) -> None:
    """``posttrain_base.json`` next to a saved adapter (nothing for a model without adapters)."""
    base = getattr(model, "posttrain_base", None)
    if is_lora(model) and base is not None:
        (Path(path) / BASE_FILE).write_text(json.dumps(base, indent=1) + "\n", encoding="utf-8")


def read_base_file(path: str | os.PathLike) -> dict[str, Any]:
    p = Path(path) / BASE_FILE
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        cfg = Path(path) / ADAPTER_CONFIG
        try:
            name = json.loads(cfg.read_text(encoding="utf-8")).get("base_model_name_or_path")
        except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
            raise InvalidValueError(f"{cfg}: not a readable adapter config ({e})") from None
        if not name:
            raise InvalidValueError(
                f"{p}: missing, and {cfg} names no base_model_name_or_path; cannot tell which base model "
                "the adapter belongs to"
            ) from None
        return {"model": name, "seed": 0, "dtype": "float32"}
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InvalidValueError(f"{p}: not valid JSON ({e})") from None
    if not isinstance(data, dict) or not isinstance(data.get("model"), str):
        raise InvalidValueError(f"{p}: expected an object with a string 'model' (the base model spec)")
    return data
