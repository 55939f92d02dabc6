"""Encoder-decoder (T5-architecture) models: tiny T5 presets, a word-level tokenizer, and
:class:`Seq2SeqAdapter`, the ``"seq2seq"`` model adapter.

The adapter keeps the adapter layer's token grid (``posttrain.models.adapter``): a row's tokens before
its first ``loss_mask`` position are the encoder input (EOS appended when missing, as T5 expects), the
rest is the decoder sequence, trained by teacher forcing (decoder input = ``decoder_start_token_id``
followed by the targets shifted right); the decoder's per-token log-probs are written back at their
grid positions. So the SFT trainer (loss, micro-batching, AdamW and schedule, checkpoints, run folder,
progress) trains a T5 unchanged: ``SFTTrainer(cfg, adapter=Seq2SeqAdapter(...), pairs=[(input, target)])``.

| preset    | d_model | layers (enc + dec) | heads | d_ff | d_kv |
|-----------|---------|--------------------|-------|------|------|
| `t5-tiny` | 128     | 2 + 2              | 4     | 512  | 32   |
| `t5-mini` | 256     | 4 + 4              | 4     | 1024 | 64   |

Weights are drawn by T5's own initialiser under a private seeded RNG. A preset loaded by name gets the
character tokenizer (``posttrain.models.tokenizer``) plus ``<extra_id_0..99>``; the DSMT workflow
(the SCPG study) builds a word-level tokenizer over its corpus instead (:func:`build_word_tokenizer`).
Any local T5 / encoder-decoder directory (``save_pretrained`` layout) loads with ``local_files_only``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from posttrain.models.adapter import ADAPTERS
from posttrain.models.loading import ModelSpecError, pick_device, resolve_dtype, resolve_model_dir
from posttrain.models.logprobs import DEFAULT_CHUNK_SIZE
from posttrain.models.saving import save_model_dir
from posttrain.utils.errors import InvalidValueError


@dataclass(frozen=True)
class T5Preset:
    name: str
    d_model: int
    num_layers: int
    num_heads: int
    d_ff: int
    d_kv: int


T5_PRESETS: dict[str, T5Preset] = {
    p.name: p for p in (T5Preset("t5-tiny", 128, 2, 4, 512, 32), T5Preset("t5-mini", 256, 4, 4, 1024, 64))
}

SENTINELS = tuple(f"<extra_id_{i}>" for i in range(100))
WORD_SPECIALS = ("<pad>", "</s>", "<unk>", *SENTINELS, "<mask>")


def build_word_tokenizer(words: Iterable[str], *, model_max_length: int = 1024) -> Any:
    """Word-level ``PreTrainedTokenizerFast`` (``tokenizers`` WordLevel, no download): ``<pad>``=0,
    ``</s>``=1 (EOS), ``<unk>``=2, ``<extra_id_0..99>``, ``<mask>``, then ``words`` (first occurrence
    order). Text is split on whitespace and around ``(``, ``)`` and ``/``; decoding joins tokens with
    single spaces."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab: dict[str, int] = {}
    for w in (*WORD_SPECIALS, "(", ")", "/", *words):
        if w and w not in vocab:
            vocab[w] = len(vocab)
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Split(Regex(r"[()/]"), behavior="isolated")]
    )
    backend.add_special_tokens(list(WORD_SPECIALS))
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        eos_token="</s>",
        unk_token="<unk>",
        additional_special_tokens=list(SENTINELS),
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
    )


def t5_config(name: str, tokenizer: Any, **overrides: Any) -> Any:
    from transformers import T5Config

    if name not in T5_PRESETS:
        raise ModelSpecError(f"unknown T5 preset {name!r}; known: {', '.join(sorted(T5_PRESETS))}")
    p = T5_PRESETS[name]
    kw: dict[str, Any] = dict(
        vocab_size=len(tokenizer),
        d_model=p.d_model,
        d_kv=p.d_kv,
        d_ff=p.d_ff,
        num_layers=p.num_layers,
        num_decoder_layers=p.num_layers,
        num_heads=p.num_heads,
        dropout_rate=0.1,
        feed_forward_proj="relu",
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.pad_token_id,
    )
    kw.update(overrides)
    return T5Config(**kw)


def build_t5_preset(name: str, tokenizer: Any, *, seed: int = 0, **overrides: Any) -> Any:
    """Randomly initialised ``T5ForConditionalGeneration`` of preset ``name``, deterministic in ``seed``."""
    from transformers import T5ForConditionalGeneration

    config = t5_config(name, tokenizer, **overrides)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = T5ForConditionalGeneration(config)
    gc = model.generation_config
    gc.pad_token_id, gc.eos_token_id = tokenizer.pad_token_id, tokenizer.eos_token_id
    gc.decoder_start_token_id = tokenizer.pad_token_id
    return model


def _preset_tokenizer() -> Any:
    from posttrain.models.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": list(SENTINELS)})
    return tok


def load_seq2seq(spec: str, *, dtype: Any = "float32", device: str = "cpu", seed: int = 0) -> tuple[Any, Any]:
    """(model, tokenizer) of a T5 preset or a local encoder-decoder directory / run folder."""
    if spec in T5_PRESETS:
        tok = _preset_tokenizer()
        model = build_t5_preset(spec, tok, seed=seed)
        return model.to(device=device, dtype=resolve_dtype(dtype)), tok
    from transformers import AutoConfig, AutoModelForSeq2SeqLM, AutoTokenizer

    path = Path(resolve_model_dir(spec)).expanduser()
    if not (path / "config.json").is_file():
        raise ModelSpecError(
            f"model {spec!r}: not a T5 preset ({', '.join(sorted(T5_PRESETS))}) and not a directory with "
            "config.json (hub ids are not downloaded; pass a local model directory)"
        )
    config = AutoConfig.from_pretrained(str(path), local_files_only=True)
    if not getattr(config, "is_encoder_decoder", False):
        raise ModelSpecError(
            f"model {spec!r}: {str(path)!r} is a {config.model_type!r} model, not an encoder-decoder; "
            "use the causal-lm adapter for it"
        )
    from transformers.utils import logging as hf_logging

    bar = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # the "Loading weights" bar
    try:
        tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        model = AutoModelForSeq2SeqLM.from_pretrained(
            str(path), dtype=resolve_dtype(dtype), local_files_only=True, trust_remote_code=False
        )
    except Exception as e:
        raise ModelSpecError(f"model {spec!r}: could not load a seq2seq model from {str(path)!r}: {e}") from e
    finally:
        if bar:
            hf_logging.enable_progress_bar()
    return model.to(device), tok


@ADAPTERS.register("seq2seq")
class Seq2SeqAdapter:
    """Encoder-decoder model (T5 architecture) on the adapter grid (module docstring); beam search by
    :meth:`beam_search`. RL rollouts (``engine``/``generate``) are not supported."""

    kind = "seq2seq"

    def __init__(self, model: torch.nn.Module, tokenizer: Any) -> None:
        if tokenizer is None:
            raise InvalidValueError("Seq2SeqAdapter: pass the tokenizer together with the model")
        if not getattr(getattr(model, "config", None), "is_encoder_decoder", False):
            raise InvalidValueError(f"Seq2SeqAdapter: {type(model).__name__} is not an encoder-decoder model")
        self.model = model
        self.tokenizer = tokenizer

    @classmethod
    def load(
        cls, spec: str, *, dtype: Any = "float32", device: str = "auto", seed: int = 0
    ) -> Seq2SeqAdapter:
        dev = pick_device() if device == "auto" else device
        model, tok = load_seq2seq(spec, dtype=dtype, device=dev, seed=seed)
        return cls(model, tok)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def eos_id(self) -> int:
        return int(self.tokenizer.eos_token_id)

    def split_rows(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, loss_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[int]]:
        """Grid -> (encoder ids, encoder mask, labels with -100 padding, first target column per row)."""
        pad = int(self.tokenizer.pad_token_id or 0)
        enc, dec, starts = [], [], []
        for r in range(input_ids.shape[0]):
            n = int(attention_mask[r].sum())
            nz = torch.nonzero(loss_mask[r, :n]).flatten()
            f = int(nz[0]) if len(nz) else n
            if len(nz) and int(nz[-1]) - f + 1 != len(nz):
                raise InvalidValueError(
                    f"Seq2SeqAdapter: row {r} has several loss spans; one prompt + one target per row"
                )
            e = input_ids[r, :f].tolist()
            if not e or e[-1] != self.eos_id:
                e.append(self.eos_id)
            enc.append(e)
            dec.append(input_ids[r, f:n].tolist())
            starts.append(f)
        we, wd = max(len(e) for e in enc), max(1, max(len(d) for d in dec))
        enc_ids = torch.full((len(enc), we), pad, dtype=torch.long)
        enc_mask = torch.zeros((len(enc), we), dtype=torch.long)
        labels = torch.full((len(enc), wd), -100, dtype=torch.long)
        for r, (e, d) in enumerate(zip(enc, dec, strict=True)):
            enc_ids[r, : len(e)] = torch.tensor(e)
            enc_mask[r, : len(e)] = 1
            if d:
                labels[r, : len(d)] = torch.tensor(d)
        dev = input_ids.device
        return enc_ids.to(dev), enc_mask.to(dev), labels.to(dev), starts

    def logprobs(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        loss_mask: torch.Tensor,
        *,
        temperature: float = 1.0,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(logp, entropy) on the grid, nonzero only where ``loss_mask`` is 1; differentiable."""
        enc_ids, enc_mask, labels, starts = self.split_rows(input_ids, attention_mask, loss_mask)
        out = self.model(input_ids=enc_ids, attention_mask=enc_mask, labels=labels)
        logits = out.logits.float() / temperature
        logsm = torch.log_softmax(logits, dim=-1)
        safe = labels.clamp_min(0)
        lp = logsm.gather(-1, safe.unsqueeze(-1)).squeeze(-1)
        ent = -(logsm.exp() * logsm).sum(-1)
        logp = torch.zeros(input_ids.shape, dtype=lp.dtype, device=input_ids.device)
        entropy = torch.zeros_like(logp)
        for r, f in enumerate(starts):
            k = int((labels[r] != -100).sum())
            logp[r, f : f + k] = lp[r, :k]
            entropy[r, f : f + k] = ent[r, :k]
        m = loss_mask.to(logp.dtype)
        return logp * m, entropy * m

    @torch.no_grad()
    def beam_search(
        self,
        texts: list[str],
        *,
        num_beams: int = 5,
        min_length: int = 5,
        max_length: int = 256,
        no_repeat_ngram_size: int = 3,
        length_penalty: float = 1.0,
        batch_size: int = 32,
        max_input_length: int | None = None,
    ) -> list[str]:
        """Deterministic beam search (no sampling) over input ``texts``; returns decoded outputs
        without special tokens other than task markers (``<sep>``, ``<tgt>`` stay)."""
        was = self.model.training
        self.model.eval()
        outs: list[str] = []
        try:
            for s in range(0, len(texts), batch_size):
                chunk = texts[s : s + batch_size]
                ids = [
                    self.tokenizer.encode(t, add_special_tokens=False)[: max_input_length or None]
                    for t in chunk
                ]
                ids = [i if i and i[-1] == self.eos_id else [*i, self.eos_id] for i in ids]
                w = max(len(i) for i in ids)
                pad = int(self.tokenizer.pad_token_id or 0)
                enc = torch.full((len(ids), w), pad, dtype=torch.long)
                am = torch.zeros((len(ids), w), dtype=torch.long)
                for r, i in enumerate(ids):
                    enc[r, : len(i)] = torch.tensor(i)
                    am[r, : len(i)] = 1
                gen = self.model.generate(
                    input_ids=enc.to(self.device),
                    attention_mask=am.to(self.device),
                    num_beams=num_beams,
                    do_sample=False,
                    min_length=min_length,
                    max_length=max_length,
                    no_repeat_ngram_size=no_repeat_ngram_size,
                    length_penalty=length_penalty,
                    early_stopping=True,
                )
                outs += self.tokenizer.batch_decode(gen, skip_special_tokens=True)
        finally:
            self.model.train(was)
        return [" ".join(o.split()) for o in outs]

    def save(self, path: str | Path) -> Path:
        return save_model_dir(self.model, self.tokenizer, path)
