"""Load a causal LM and its tokenizer from a preset name or a local Hugging Face model directory.

A built-in real model name (`posttrain.models.builtin`, e.g. `smollm2-135m`) or a `.gguf` file is
converted once into a cached HF directory (`posttrain.models.gguf`) and loaded from there.

Nothing here contacts a hub: directories are read with `local_files_only=True` and
`trust_remote_code=False`; a spec that is neither a preset nor an existing directory with a
`config.json` is an error that names the path and the known presets.

A run folder is accepted wherever a model is (`resolve_model_dir`): an RL run folder means the model
of its latest checkpoint (`<run>/checkpoints/<latest>/model`), an SFT run folder (or the demo's
`rl/`) its saved `model/`, and a `step_*` checkpoint directory its `model/`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

from posttrain.models.errors import ModelSpecError
from posttrain.models.lora import (
    ADAPTER_CONFIG,
    is_adapter_dir,
    is_lora,
    quiet_peft,
    read_base_file,
    require_peft,
)
from posttrain.models.presets import PRESETS, build_preset_model, list_presets
from posttrain.models.resolve import resolve_model_dir
from posttrain.models.tokenizer import build_char_tokenizer, quiet_length_warning
from posttrain.utils.errors import InvalidValueError


def pick_device() -> str:
    """ "cuda" when a CUDA device is available, else "cpu"."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


DTYPE_NAMES = {
    "float32": "float32",
    "fp32": "float32",
    "float": "float32",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
    "float64": "float64",
    "fp64": "float64",
}
"""Accepted dtype names -> the torch dtype attribute they mean."""

DEVICES = ("auto", "cpu", "cuda", "cuda:N", "mps")


def resolve_dtype(dtype: Any) -> Any:
    """`torch.float32` or a name such as "bfloat16" / "bf16" / "float16" / "fp32" -> a torch dtype."""
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    if isinstance(dtype, str) and dtype.lower() in DTYPE_NAMES:
        return getattr(torch, DTYPE_NAMES[dtype.lower()])
    raise InvalidValueError(
        f"unknown dtype {dtype!r}; accepted: a torch.dtype or one of {', '.join(DTYPE_NAMES)}"
    )


def check_device(device: str, *, available: bool = True) -> str:
    """`device` if it is a device name this library accepts ("auto", "cpu", "cuda", "cuda:N", "mps")
    and, when `available`, one this machine's torch can use; else a ValueError naming the accepted
    values and what this build offers ("cuda" on a CPU-only build, "gpu", "cuda:3" with 2 GPUs)."""
    head, _, index = device.partition(":")
    if device not in ("auto", "cpu", "mps") and not (head == "cuda" and (not _ or index.isdigit())):
        raise InvalidValueError(f"unknown device {device!r}; accepted: {', '.join(DEVICES)}")
    if not available:
        return device
    import torch

    have = ["auto", "cpu"]
    if torch.cuda.is_available():
        have += ["cuda"] + [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        have.append("mps")
    if device in have:
        return device
    why = (
        f"this torch build ({torch.__version__}) has no CUDA"
        if head == "cuda" and not torch.cuda.is_available()
        else f"{device!r} is not available on this machine"
    )
    raise InvalidValueError(f"device {device!r}: {why}; available here: {', '.join(have)}")


_CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx")


def model_context_length(spec: str) -> int | None:
    """The context length (positions) of the model ``spec`` means, read without loading weights:
    a preset's, else ``config.json``'s ``max_position_embeddings`` (or ``n_positions``, ...; of
    ``text_config`` for multimodal configs). None when it cannot be told (not a model, no such key)."""
    if spec in PRESETS:
        return PRESETS[spec].max_position_embeddings
    try:
        path = Path(resolve_model_dir(spec)) / "config.json"
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ModelSpecError, OSError, ValueError):
        return None
    for tree in (data, data.get("text_config") if isinstance(data, dict) else None):
        if isinstance(tree, dict):
            for key in _CONTEXT_KEYS:
                if isinstance(tree.get(key), int) and tree[key] > 0:
                    return int(tree[key])
    return None


def ensure_pad_token(tokenizer: Any, model: Any = None) -> None:
    """Tokenizers without a pad token (Llama, some Qwen checkpoints) pad with EOS instead."""
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ModelSpecError(
                f"tokenizer {getattr(tokenizer, 'name_or_path', '')!r} has neither a pad nor an eos token; "
                "set tokenizer.pad_token before batching"
            )
        tokenizer.pad_token = tokenizer.eos_token
    if model is not None:
        gc = getattr(model, "generation_config", None)
        if gc is not None and gc.pad_token_id is None:
            gc.pad_token_id = tokenizer.pad_token_id


def load_model_and_tokenizer(
    spec: str,
    *,
    dtype: Any = "float32",
    device: str = "cpu",
    seed: int = 0,
    padding_side: Literal["left", "right"] | None = None,
) -> tuple[Any, Any]:
    """(model, tokenizer) for `spec`: a preset name (`list_presets()`) or a local HF model directory.

    - preset: the character tokenizer (`build_char_tokenizer`) and a randomly initialised model,
      deterministic in `seed` (the global RNG is not touched);
    - directory (e.g. a downloaded Qwen3-0.6B, or a preset saved with `save_pretrained`):
      `AutoModelForCausalLM` / `AutoTokenizer` with `local_files_only=True`; `seed` is unused;
    - run folder or checkpoint directory: the model it holds (see `resolve_model_dir`).

    A tokenizer without a pad token pads with its EOS token. `padding_side` overrides the
    tokenizer's own side when given (batched generation needs "left"). The model is returned in
    eval mode (as `from_pretrained` does) on `device` with parameters in `dtype`.
    """
    torch_dtype = resolve_dtype(dtype)
    if isinstance(device, str):
        check_device(device)
    if spec in PRESETS:
        tokenizer = build_char_tokenizer()
        model = build_preset_model(spec, tokenizer, seed=seed, dtype=torch_dtype)
    else:
        local = resolve_model_dir(spec)
        if is_adapter_dir(local):  # a LoRA adapter: its base model with the adapter on top
            model, tokenizer = load_adapter_dir(local, dtype=torch_dtype)
        else:
            model, tokenizer = _load_local_dir(local, torch_dtype)
        check_tokenizer_matches(model, tokenizer, spec)
    ensure_pad_token(tokenizer, model)
    quiet_length_warning(tokenizer)  # posttrain refuses overlong inputs itself, naming the row
    if padding_side is not None:
        if padding_side not in ("left", "right"):
            raise InvalidValueError(f"padding_side must be 'left' or 'right', got {padding_side!r}")
        tokenizer.padding_side = padding_side
    model = model.to(device)
    model.eval()
    return model, tokenizer


VOCAB_PADDING = 1024
"""How many more embedding rows than tokenizer entries a model may have: checkpoints pad the
embedding to a multiple of 64 / 128 (Qwen2.5: 151,936 rows for 151,665 tokens)."""


def _ids(value: Any) -> set[int]:
    if isinstance(value, int):
        return {value}
    if isinstance(value, list | tuple):
        return {int(v) for v in value if isinstance(v, int)}
    return set()


def check_tokenizer_matches(model: Any, tokenizer: Any, spec: str = "") -> None:
    """Refuse a tokenizer that does not belong to the model: more token ids than embedding rows
    (an ``IndexError`` deep in the forward pass), far fewer (the model samples ids the tokenizer
    cannot decode, so every answer scores 0), or an EOS id the model was not trained to stop with."""
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    rows = int(emb.weight.shape[0]) if emb is not None else getattr(model.config, "vocab_size", None)
    if not rows:
        return
    n_tok = len(tokenizer)
    where = f"model {spec!r}: " if spec else ""
    fix = "; use the tokenizer saved with these weights (the same directory as config.json)"
    if n_tok > rows:
        raise ModelSpecError(
            f"{where}the tokenizer has {n_tok} tokens but the model's embedding has {rows} rows: token ids "
            f">= {rows} cannot be embedded{fix}"
        )
    if rows - n_tok > VOCAB_PADDING:
        raise ModelSpecError(
            f"{where}the model's embedding has {rows} rows but the tokenizer only {n_tok} tokens: the "
            f"model would generate ids the tokenizer cannot decode (more than {VOCAB_PADDING} rows of "
            f"padding){fix}"
        )
    model_eos = _ids(getattr(model.config, "eos_token_id", None))
    model_eos |= _ids(getattr(getattr(model, "generation_config", None), "eos_token_id", None))
    tok_eos = getattr(tokenizer, "eos_token_id", None)
    if model_eos and isinstance(tok_eos, int) and tok_eos not in model_eos:
        raise ModelSpecError(
            f"{where}the tokenizer's EOS token id is {tok_eos} ({tokenizer.eos_token!r}) but the model's "
            f"config stops at {sorted(model_eos)}: generations would not end where the model was trained "
            f"to end{fix}"
        )


_GENERIC_TOKENIZER_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")


def _declared_tokenizer_class(path: Path) -> str | None:
    cfg = path / "tokenizer_config.json"
    if not cfg.is_file():
        return None
    try:
        data = json.loads(cfg.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ModelSpecError(f"{cfg}: not valid JSON ({e})") from e
    return data.get("tokenizer_class") if isinstance(data, dict) else None


def _load_local_dir(spec: str, torch_dtype: Any) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from posttrain.models.builtin import BUILTIN_MODELS

    known = ", ".join([*list_presets(), *sorted(BUILTIN_MODELS)])
    path = Path(spec).expanduser()
    if not path.exists():
        raise ModelSpecError(
            f"model {spec!r}: not a known preset ({known}) and no local directory {str(path)!r} exists "
            "(hub ids are not downloaded; pass the path of a local model directory)"
        )
    if not path.is_dir():
        raise ModelSpecError(
            f"model {spec!r}: {str(path)!r} is a file; expected a preset ({known}) or a model directory "
            "containing config.json"
        )
    if not (path / "config.json").is_file():
        raise ModelSpecError(
            f"model {spec!r}: directory {str(path)!r} has no config.json; expected a Hugging Face model "
            f"directory (save_pretrained output) or a preset ({known})"
        )
    try:
        tokenizer_cls = AutoTokenizer
        if _declared_tokenizer_class(path) in _GENERIC_TOKENIZER_CLASSES:
            # AutoTokenizer would pick the class mapped to config.json's model_type (e.g. Qwen2Tokenizer
            # for a saved `tiny-qwen2`), which rebuilds the tokenizer with that model's pre-tokenizer and
            # silently changes the encoding; a generic tokenizer.json must load exactly as saved.
            from transformers import PreTrainedTokenizerFast

            tokenizer_cls = PreTrainedTokenizerFast
        tokenizer = tokenizer_cls.from_pretrained(str(path), local_files_only=True, trust_remote_code=False)
    except ModelSpecError:
        raise
    except Exception as e:  # surface the path with whatever transformers complained about
        raise ModelSpecError(f"model {spec!r}: could not load a tokenizer from {str(path)!r}: {e}") from e
    from transformers.utils import logging as hf_logging

    bar = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # the "Loading weights" bar: noise in logs, instant for small models
    try:
        model = AutoModelForCausalLM.from_pretrained(
            str(path), dtype=torch_dtype, local_files_only=True, trust_remote_code=False
        )
    except Exception as e:
        raise ModelSpecError(f"model {spec!r}: could not load a causal LM from {str(path)!r}: {e}") from e
    finally:
        if bar:
            hf_logging.enable_progress_bar()
    return model, tokenizer


# ------------------------------------------------------------------------------ LoRA adapter folders
def load_adapter_dir(
    path: str | os.PathLike, *, dtype: Any = None, device: str = "cpu", trainable: bool = True
) -> tuple[Any, Any]:
    """(peft model, tokenizer) from an adapter directory: its base model (``posttrain_base.json``:
    a preset rebuilt from its seed, a local directory, or another adapter directory, merged) with the
    adapter loaded on top (``PeftModel.from_pretrained``)."""
    peft = require_peft()
    base = read_base_file(path)
    model, tokenizer = load_model_and_tokenizer(
        base["model"],
        dtype=base.get("dtype", "float32") if dtype is None else dtype,
        device="cpu",
        seed=int(base.get("seed", 0)),
    )
    if is_lora(model):
        model = model.merge_and_unload()
    with quiet_peft():
        peft_model = peft.PeftModel.from_pretrained(model, str(path), is_trainable=trainable)
    peft_model.posttrain_base = base
    return peft_model.to(device), tokenizer


def merged_model(spec: str, *, dtype: Any = None) -> tuple[Any, Any]:
    """``posttrain export --merge``: (model, tokenizer) of ``spec`` (an adapter directory, a LoRA run
    folder or checkpoint) with its adapters merged into the weights (``merge_and_unload``): a plain
    Hugging Face model to ``save_pretrained``."""
    src = resolve_model_dir(spec)
    if not is_adapter_dir(src):
        raise InvalidValueError(
            f"{spec!r} ({src}) holds no LoRA adapter (no {ADAPTER_CONFIG}); it is already a plain model "
            "directory, nothing to merge"
        )
    model, tokenizer = load_adapter_dir(src, dtype=dtype, trainable=False)
    return model.merge_and_unload(), tokenizer
