"""A real, self-contained character-level fast tokenizer for the tiny presets.

Built with the `tokenizers` library (no download): a BPE model with an empty merge list, so every
character is its own token. The vocabulary is

    <pad>=0, <bos>=1, <eos>=2, <unk>=3, then the 95 printable ASCII characters (space .. '~'),
    '\\n' and '\\t', then the 256 byte-fallback tokens <0x00> .. <0xFF>.

Characters outside that set (e.g. 'é') are encoded as their UTF-8 bytes through the byte-fallback
tokens, so `decode(encode(s)) == s` for any string that does not contain the special-token
strings themselves. No BOS/EOS is added by `encode` (raw prompts stay raw; append `eos_token_id` to
completions yourself, as the RL tasks do).
"""

from __future__ import annotations

import string
from typing import Any, Literal

from posttrain.utils.errors import InvalidValueError

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] }}"
    "{% if message['role'] == 'assistant' %}{{ eos_token }}{% endif %}"
    "{{ '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)
"""Simple chat template: `<|role|>\\ncontent\\n` per message, assistant turns end with `<eos>`."""

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")
CHARS = (*(c for c in string.printable if c.isprintable()), "\n", "\t")


def char_vocab() -> dict[str, int]:
    """The token -> id map of the character tokenizer (specials, characters, byte fallbacks)."""
    vocab: dict[str, int] = {}
    for tok in (*SPECIAL_TOKENS, *CHARS, *(f"<0x{b:02X}>" for b in range(256))):
        if tok not in vocab:
            vocab[tok] = len(vocab)
    return vocab


LENGTH_WARNING = "sequence-length-is-longer-than-the-specified-maximum"
"""The key under which a transformers tokenizer records that it gave its too-long-input warning."""


def quiet_length_warning(tokenizer: Any) -> None:
    """Silence the tokenizer's "Token indices sequence length is longer than the specified maximum
    sequence length for this model (N > M). Running this sequence through the model will result in
    indexing errors": transformers logs it (once per tokenizer) when a text encodes to more than
    ``model_max_length`` tokens, and it printed before posttrain's own refusal of the same input.
    posttrain checks every length itself (``train.lengths``: SFT rows, RL and evaluation prompts;
    ``posttrain serve``: its prompt limit) and names the row and what to do, so the tokenizers it loads
    are marked as having warned already. A tokenizer without that record is left as it is."""
    warned = getattr(tokenizer, "deprecation_warnings", None)
    if isinstance(warned, dict):
        warned[LENGTH_WARNING] = True


def build_char_tokenizer(padding_side: Literal["left", "right"] = "right", model_max_length: int = 4096):
    """Character-level `PreTrainedTokenizerFast` with `<pad>`, `<bos>`, `<eos>`, `<unk>` and a chat template.

    `padding_side="left"` is what batched generation of prompts needs (the RL rollout sets it);
    it can also be changed later with `tok.padding_side = "left"`. Saves and reloads with
    `save_pretrained` / `AutoTokenizer.from_pretrained`.
    """
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    if padding_side not in ("left", "right"):
        raise InvalidValueError(f"padding_side must be 'left' or 'right', got {padding_side!r}")
    backend = Tokenizer(models.BPE(vocab=char_vocab(), merges=[], unk_token="<unk>", byte_fallback=True))
    backend.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Fuse()])
    backend.add_special_tokens(list(SPECIAL_TOKENS))
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<pad>",
        bos_token="<bos>",
        eos_token="<eos>",
        unk_token="<unk>",
        padding_side=padding_side,
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok
