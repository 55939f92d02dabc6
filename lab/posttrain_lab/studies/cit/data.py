"""Instruction rows with inline key-part markup -> token ids, loss mask and key-part token mask.

A row is ``{"instruction": ..., "input": ..., "output": ..., "task": ...}`` (JSONL; ``input`` may be
empty or absent). Key parts of the instruction — the words whose change changes the correct output
(KPIG, He et al., arXiv 2403.10056) — are marked inline with double square brackets::

    {"instruction": "Give the [[city]].", "input": "Bax 31 Oslo red", "output": "Oslo", "task": "lookup"}

The brackets are removed from the text the model sees; their character spans are kept
(:class:`InstructionExample.key_spans`). Markup rules: spans do not nest, ``[[`` needs a matching
``]]``, a span is not empty; a literal ``[[`` cannot be written (no escape). Bad rows raise
:class:`CITDataError` naming the file and line.

The prompt is ``prompt_format`` (default ``"{instruction}\\n{input}\\n"``) encoded by the SFT
:class:`~posttrain.rollout.PromptFormatter` (optionally wrapped in the tokenizer's chat template);
the response is ``output`` + EOS and is the only part that carries the loss. After tokenisation a
prompt token is a key token when its character range (the fast tokenizer's offset mapping) overlaps a
key span, so the spans survive any tokenizer (character-level presets, BPE, chat templates).
The masked instruction ``I^m`` replaces every key span by ``mask`` (default ``"_"``, one token of the
presets' tokenizer; ``mask=""`` deletes the span).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from posttrain.train.sft_data import SFTExample
from posttrain.utils.data import DataFileError, iter_jsonl
from posttrain.utils.errors import InvalidValueError, PosttrainError

OPEN, CLOSE = "[[", "]]"
DEFAULT_PROMPT_FORMAT = "{instruction}\n{input}\n"
DEFAULT_MASK = "_"


class CITDataError(PosttrainError, ValueError):
    """Instruction data that is not what CIT expects; the message names the file and line (or row)."""


@dataclass(frozen=True)
class InstructionExample:
    """One instruction sample: ``instruction`` is plain text (markup removed), ``key_spans`` the
    character spans ``[start, end)`` of its key parts; ``source`` names where it came from."""

    instruction: str
    input: str
    output: str
    task: str
    key_spans: tuple[tuple[int, int], ...] = ()
    source: str = ""
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def key_parts(self) -> list[str]:
        return [self.instruction[a:b] for a, b in self.key_spans]

    def marked(self) -> str:
        """The instruction with its key parts marked again (``parse_markup`` inverts it)."""
        out, last = [], 0
        for a, b in self.key_spans:
            out += [self.instruction[last:a], OPEN, self.instruction[a:b], CLOSE]
            last = b
        return "".join([*out, self.instruction[last:]])

    def masked_instruction(self, mask: str = DEFAULT_MASK) -> str:
        """``I^m``: every key span replaced by ``mask`` (``""`` deletes it)."""
        out, last = [], 0
        for a, b in self.key_spans:
            out += [self.instruction[last:a], mask]
            last = b
        return "".join([*out, self.instruction[last:]])

    def with_instruction(self, marked: str) -> InstructionExample:
        text, spans = parse_markup(marked, self.source)
        return replace(self, instruction=text, key_spans=spans)


def parse_markup(marked: str, where: str = "instruction") -> tuple[str, tuple[tuple[int, int], ...]]:
    """``"Give the [[city]]."`` -> ``("Give the city.", ((9, 13),))``; errors name ``where``."""
    text: list[str] = []
    spans: list[tuple[int, int]] = []
    pos, n = 0, 0  # position in marked, length of text so far
    while True:
        i = marked.find(OPEN, pos)
        j = marked.find(CLOSE, pos)
        if i < 0:
            if j >= 0:
                raise CITDataError(f"{where}: ']]' at character {j} without an opening '[['")
            text.append(marked[pos:])
            break
        if 0 <= j < i:
            raise CITDataError(f"{where}: ']]' at character {j} without an opening '[['")
        seg = marked[pos:i]
        text.append(seg)
        n += len(seg)
        k = marked.find(CLOSE, i + 2)
        if k < 0:
            raise CITDataError(f"{where}: '[[' at character {i} is never closed with ']]'")
        inner = marked[i + 2 : k]
        if OPEN in inner:
            raise CITDataError(f"{where}: key parts do not nest ('[[' inside the span at character {i})")
        if not inner:
            raise CITDataError(f"{where}: empty key part '[[]]' at character {i}")
        text.append(inner)
        spans.append((n, n + len(inner)))
        n += len(inner)
        pos = k + 2
    return "".join(text), tuple(spans)


_FIELDS = ("instruction", "input", "output", "task")


def parse_instruction_row(row: Any, where: str, default_task: str | None = None) -> InstructionExample:
    if not isinstance(row, dict):
        raise CITDataError(f"{where}: expected a JSON object, got {type(row).__name__}")
    got = ", ".join(sorted(row)) or "none"
    for key in ("instruction", "output"):
        if key not in row:
            raise CITDataError(
                f"{where}: missing key {key!r} (expected {', '.join(_FIELDS)}; got keys: {got})"
            )
    if "task" not in row and default_task is None:
        raise CITDataError(f"{where}: missing key 'task' (expected {', '.join(_FIELDS)}; got keys: {got})")
    vals = {k: row.get(k, "" if k == "input" else default_task) for k in _FIELDS}
    for k, v in vals.items():
        if not isinstance(v, str):
            raise CITDataError(f"{where}: {k!r} must be a string, got {type(v).__name__}")
    if not vals["output"]:
        raise CITDataError(f"{where}: 'output' is empty (nothing to train on)")
    if not vals["task"]:
        raise CITDataError(f"{where}: 'task' is empty")
    text, spans = parse_markup(vals["instruction"], f"{where}: instruction")
    return InstructionExample(text, vals["input"], vals["output"], vals["task"], spans, where)


def read_instruction_file(path: str | Path, default_task: str | None = None) -> list[InstructionExample]:
    """Every row of a JSONL instruction file; any bad row raises :class:`CITDataError` naming the file
    and line."""
    rows = []
    try:
        for i, row in iter_jsonl(path, what="instruction/input/output/task rows"):
            rows.append(parse_instruction_row(row, f"{path}: line {i}", default_task))
    except DataFileError as e:
        raise CITDataError(str(e)) from None
    if not rows:
        raise CITDataError(f"{path}: no rows (expected JSONL with instruction, input, output, task)")
    return rows


# ------------------------------------------------------------------------------------ rendering
def render_prompt(
    ex: InstructionExample, prompt_format: str = DEFAULT_PROMPT_FORMAT, *, masked: str | None = None
) -> tuple[str, tuple[tuple[int, int], ...]]:
    """(prompt text, key spans in it). ``masked`` (a mask string) renders ``I^m`` instead (no spans)."""
    parts = re.split(r"(\{instruction\}|\{input\})", prompt_format)
    if parts.count("{instruction}") != 1 or parts.count("{input}") > 1:
        raise InvalidValueError(
            f"prompt_format must contain '{{instruction}}' once and '{{input}}' at most once, got {prompt_format!r}"
        )
    instr = ex.instruction if masked is None else ex.masked_instruction(masked)
    out, off = [], 0
    for p in parts:
        if p == "{instruction}":
            off = sum(len(s) for s in out)
            out.append(instr)
        elif p == "{input}":
            out.append(ex.input)
        else:
            out.append(p)
    spans = () if masked is not None else tuple((a + off, b + off) for a, b in ex.key_spans)
    return "".join(out), spans


@dataclass(frozen=True)
class EncodedInstruction:
    """Token ids of one sample: ``prompt_ids`` with ``key_mask`` (1 on key-part tokens),
    ``masked_prompt_ids`` (``I^m``), ``response_ids`` (output + EOS, the loss targets)."""

    prompt_ids: list[int]
    key_mask: list[int]
    masked_prompt_ids: list[int]
    response_ids: list[int]
    source: str

    def sft_example(self, masked: bool = False) -> SFTExample:
        p = self.masked_prompt_ids if masked else self.prompt_ids
        return SFTExample(p + self.response_ids, [0] * len(p) + [1] * len(self.response_ids), self.source)


def key_token_mask(
    tokenizer: Any, text: str, spans: Iterable[tuple[int, int]], *, chat: bool = False, where: str = ""
) -> tuple[list[int], list[int]]:
    """(ids, key mask) of a prompt: token t is a key token when its character range overlaps a span.
    With ``chat`` the text is the user message of the tokenizer's chat template (spans shifted to the
    message's place in the rendering); ids equal :class:`~posttrain.rollout.PromptFormatter`'s."""
    from posttrain.rollout import PromptFormatter

    if not getattr(tokenizer, "is_fast", False):
        raise CITDataError(
            f"{where}: key-part offsets need a fast tokenizer; {type(tokenizer).__name__} is not one"
        )
    full, shift = text, 0
    if chat:
        full = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
        )
        shift = full.find(text)
        if shift < 0:
            raise CITDataError(f"{where}: the chat template does not contain the prompt text verbatim")
    enc = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    ids = [int(i) for i in enc["input_ids"]]
    want = PromptFormatter(tokenizer, chat=chat).encode(text)
    if ids != want:
        raise CITDataError(
            f"{where}: tokenising the rendered prompt with offsets gives other ids than the prompt "
            "formatter (a chat template that adds special tokens itself?); key parts cannot be located"
        )
    sp = [(a + shift, b + shift) for a, b in spans]
    mask = [int(any(s < b and e > a for a, b in sp)) for s, e in enc["offset_mapping"]]
    return ids, mask


def encode_instruction(
    ex: InstructionExample,
    tokenizer: Any,
    *,
    prompt_format: str = DEFAULT_PROMPT_FORMAT,
    chat: bool = False,
    mask: str = DEFAULT_MASK,
) -> EncodedInstruction:
    """Tokenise one sample (module docstring); the key mask has one entry per prompt token."""
    from posttrain.rollout import PromptFormatter

    fmt = PromptFormatter(tokenizer, chat=chat)
    text, spans = render_prompt(ex, prompt_format)
    ids, kmask = key_token_mask(tokenizer, text, spans, chat=chat, where=ex.source)
    if not ids:
        raise CITDataError(f"{ex.source}: the prompt encodes to zero tokens")
    if spans and not any(kmask):
        raise CITDataError(f"{ex.source}: the key parts encode to zero tokens")
    mtext, _ = render_prompt(ex, prompt_format, masked=mask)
    return EncodedInstruction(ids, kmask, fmt.encode(mtext), fmt.encode_completion(ex.output), ex.source)


def prompt_text(ex: InstructionExample, prompt_format: str = DEFAULT_PROMPT_FORMAT) -> str:
    return render_prompt(ex, prompt_format)[0]
