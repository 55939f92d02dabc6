"""SFT data: rows in three formats -> token ids with a loss mask.

One row is one training sequence (a JSONL file, a JSON array, parquet, arrow, or a ``datasets``
``save_to_disk`` directory: TRL's SFT formats as they are); its format is recognised by its keys
(renamed with ``data_fields``, e.g. ``{prompt: question, completion: answer}``):

``{"prompt": ..., "completion": ...}``
    the prompt is encoded exactly as the RL rollout encodes it (:class:`~posttrain.rollout.PromptFormatter`:
    ``task.prompt_template``, ``task.chat_template``), the completion is followed by EOS; loss on the
    completion tokens and the EOS.
    TRL's conversational variant (``prompt`` and ``completion`` both lists of messages) is the
    conversation ``prompt + completion`` (loss on its assistant turns, as ``messages`` below).
``{"text": ...}``
    BOS (when the tokenizer has one) + text + EOS; loss on every token after the first.
``{"messages": [{"role": ..., "content": ...}, ...]}``
    the conversation rendered with the tokenizer's chat template (or, when it has none,
    :data:`posttrain.models.CHAT_TEMPLATE`: ``<|role|>\\n`` + content + ``\\n`` per message, EOS after
    each assistant turn); loss on the assistant turns only.

Assistant tokens are found by rendering prefixes of the conversation: turn k is the text that
``render(messages[:k+1])`` adds to ``render(messages[:k], add_generation_prompt=True)``, i.e. exactly
what the model must generate after the generation prompt; the tokens of the full rendering whose
first character lies in that text (the tokenizer's offset mapping; a fast tokenizer is required)
carry the loss. Tokens after the last EOS inside a turn
(a template's newline between turns) are context, not targets, since generation stops at EOS. A
template that re-renders earlier turns differently once later turns exist (e.g. one that drops
reasoning from past turns) breaks this prefix property and is reported as an error for that row.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posttrain.utils.config import StrictModel
from posttrain.utils.data import DataFileError, iter_jsonl
from posttrain.utils.errors import PosttrainError


class SFTDataError(PosttrainError, ValueError):
    """Training data that is not what SFT expects; the message names the file and line (or row)."""


class DataFields(StrictModel):
    """Column names of the data file for each canonical field (``data_fields.prompt=question``)."""

    prompt: str = "prompt"
    completion: str = "completion"
    text: str = "text"
    messages: str = "messages"
    role: str = "role"
    """Key of a message's role inside ``messages``."""
    content: str = "content"
    """Key of a message's text inside ``messages``."""


# ------------------------------------------------------------------------------------ parsed rows
@dataclass(frozen=True)
class PromptCompletion:
    prompt: str
    completion: str
    source: str


@dataclass(frozen=True)
class Text:
    text: str
    source: str


@dataclass(frozen=True)
class Chat:
    messages: tuple[tuple[str, str], ...]  # (role, content)
    source: str


Row = PromptCompletion | Text | Chat


@dataclass(frozen=True)
class SFTExample:
    """One training sequence: ``input_ids`` and a 0/1 ``loss_mask`` of the same length; ``source``
    names where it came from (``file:line``) for error messages."""

    input_ids: list[int]
    loss_mask: list[int]
    source: str

    @property
    def n_loss_tokens(self) -> int:
        return sum(self.loss_mask)


# ---------------------------------------------------------------------------------------- parsing
def _missing(row: dict[str, Any], key: str, where: str, canonical: str, f: DataFields) -> SFTDataError:
    """A row without the column ``key`` (the field ``canonical``): the columns it has, and the
    ``data_fields`` mapping that names one of the others (``data_fields.completion=solution``)."""
    mapped = "" if key == canonical else f" (data_fields.{canonical})"
    noun = "key" if canonical in ("role", "content") else "column"  # inside a message, or of the row
    used = {f.prompt, f.completion, f.text, f.messages, f.role, f.content}
    others = sorted(str(k) for k in row if k not in used)
    if len(others) == 1:
        hint = f"if {others[0]!r} holds it, map it with data_fields.{canonical}={others[0]}"
    elif others:
        hint = f"map the {noun} that holds it with data_fields.{canonical}=<one of: {', '.join(others)}>"
    else:
        hint = f"map the {noun} that holds it with data_fields.{canonical}=<{noun}>"
    return SFTDataError(
        f"{where}: missing {noun} {key!r}{mapped}; it has {noun}s: "
        f"{', '.join(sorted(map(str, row))) or 'none'}; {hint}"
    )


def _string(row: dict[str, Any], key: str, where: str, canonical: str, f: DataFields) -> str:
    if key not in row:
        raise _missing(row, key, where, canonical, f)
    if not isinstance(row[key], str):
        raise SFTDataError(f"{where}: {key!r} must be a string, got {type(row[key]).__name__}")
    return row[key]


def _parse_prompt_completion(row: dict[str, Any], where: str, f: DataFields) -> Row:
    if isinstance(row.get(f.prompt), list) or isinstance(row.get(f.completion), list):
        # TRL's conversational prompt-completion: both lists of messages -> one conversation
        for key, canonical in ((f.prompt, "prompt"), (f.completion, "completion")):
            if key not in row:
                raise _missing(row, key, where, canonical, f)
            if not isinstance(row.get(key), list):
                raise SFTDataError(
                    f"{where}: {key!r} must be a list of messages like the other of "
                    f"{f.prompt!r}/{f.completion!r} (conversational format), got {type(row.get(key)).__name__}"
                )
        return _parse_messages({f.messages: row[f.prompt] + row[f.completion]}, where, f)
    prompt = _string(row, f.prompt, where, "prompt", f)
    completion = _string(row, f.completion, where, "completion", f)
    if not completion:
        raise SFTDataError(f"{where}: {f.completion!r} is empty")
    return PromptCompletion(prompt, completion, where)


def _parse_text(row: dict[str, Any], where: str, f: DataFields) -> Row:
    text = _string(row, f.text, where, "text", f)
    if not text:
        raise SFTDataError(f"{where}: {f.text!r} is empty")
    return Text(text, where)


CHAT_ROLES = ("system", "user", "assistant", "tool", "developer")
"""Roles a ``messages`` row may use (the same as ``posttrain serve`` accepts); loss is on
``assistant`` turns, so a misspelled one would silently train on nothing."""


def _check_role(role: str, at: str, f: DataFields) -> None:
    if role in CHAT_ROLES:
        return
    import difflib

    close = difflib.get_close_matches(role.lower(), CHAT_ROLES, n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise SFTDataError(f"{at}: unknown {f.role!r} {role!r}{hint}; accepted roles: {', '.join(CHAT_ROLES)}")


def _parse_messages(row: dict[str, Any], where: str, f: DataFields) -> Row:
    msgs = row[f.messages]
    if not isinstance(msgs, list) or not msgs:
        raise SFTDataError(
            f"{where}: {f.messages!r} must be a non-empty list of {{{f.role!r}, {f.content!r}}} objects"
        )
    out = []
    for j, m in enumerate(msgs):
        at = f"{where}: {f.messages}[{j}]"
        if not isinstance(m, dict):
            raise SFTDataError(f"{at}: expected an object with keys {f.role!r}, {f.content!r}")
        role = _string(m, f.role, at, "role", f)
        _check_role(role, at, f)
        out.append((role, _string(m, f.content, at, "content", f)))
    if not any(role == "assistant" for role, _ in out):
        raise SFTDataError(f"{where}: no message with role 'assistant' (nothing to train on)")
    return Chat(tuple(out), where)


_FORMATS: dict[str, tuple[Callable[[DataFields], tuple[str, ...]], Callable[..., Row]]] = {
    "messages": (lambda f: (f.messages,), _parse_messages),
    "text": (lambda f: (f.text,), _parse_text),
    "prompt/completion": (lambda f: (f.prompt, f.completion), _parse_prompt_completion),
}
"""Row format -> (the keys that announce it, parser)."""


def parse_row(row: Any, where: str, fields: DataFields | None = None) -> Row:
    """A JSON row in one of the three formats -> a typed row; errors name ``where``."""
    f = fields or DataFields()
    if not isinstance(row, dict):
        raise SFTDataError(f"{where}: expected a JSON object, got {type(row).__name__}")
    found = [name for name, (keys, _) in _FORMATS.items() if any(k in row for k in keys(f))]
    if len(found) > 1:
        raise SFTDataError(f"{where}: the row mixes formats {' and '.join(found)}; use one per row")
    if not found:
        raise SFTDataError(
            f"{where}: no known fields (expected {f.prompt!r}+{f.completion!r}, {f.text!r} or "
            f"{f.messages!r}; got keys: {', '.join(sorted(row)) or 'none'}); rename columns with "
            f"data_fields, e.g. data_fields.prompt=question"
        )
    return _FORMATS[found[0]][1](row, where, f)


def read_sft_file(path: str | Path, fields: DataFields | None = None) -> list[Row]:
    """Every row of a JSONL file, parsed; any bad row raises :class:`SFTDataError` naming the file and
    line (also for bytes that are not UTF-8)."""
    rows: list[Row] = []
    p = Path(path)
    if p.is_dir() or p.suffix.lower() in (".parquet", ".arrow", ".json"):
        # a `datasets` save_to_disk directory, parquet, arrow or a JSON array (tasks.jsonl's reader)
        from posttrain.tasks.jsonl import DatasetError, read_raw_rows

        try:
            for i, row in read_raw_rows(p):
                if isinstance(row, DatasetError):
                    raise SFTDataError(str(row))
                rows.append(parse_row(row, f"{path}: row {i}", fields))
        except DatasetError as e:
            raise SFTDataError(str(e)) from None
    else:
        try:
            for i, row in iter_jsonl(path, what="prompt/completion, text or messages rows"):
                rows.append(parse_row(row, f"{path}: line {i}", fields))
        except DataFileError as e:
            raise SFTDataError(str(e)) from None
    if not rows:
        raise SFTDataError(f"{path}: no rows (expected JSONL with prompt/completion, text or messages rows)")
    return rows


# ----------------------------------------------------------------------------------- tokenizing
def _text_ids(tokenizer: Any, text: str) -> list[int]:
    return [int(i) for i in tokenizer.encode(text, add_special_tokens=False)]


def _encode_prompt_completion(row: PromptCompletion, tokenizer: Any, formatter: Any) -> SFTExample:
    p = formatter.encode(row.prompt)
    if not p:
        raise SFTDataError(f"{row.source}: the prompt encodes to zero tokens (nothing to condition on)")
    c = formatter.encode_completion(row.completion)
    return SFTExample(p + c, [0] * len(p) + [1] * len(c), row.source)


def _encode_text(row: Text, tokenizer: Any, formatter: Any) -> SFTExample:
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    ids = ([int(bos)] if bos is not None else []) + _text_ids(tokenizer, row.text)
    ids += [int(eos)] if eos is not None else []
    if len(ids) < 2:
        raise SFTDataError(f"{row.source}: the text encodes to fewer than 2 tokens (nothing to predict)")
    return SFTExample(ids, [0] + [1] * (len(ids) - 1), row.source)


def _chat_renderer(tokenizer: Any) -> Callable[[list[dict[str, str]], bool], str]:
    from posttrain.models.tokenizer import CHAT_TEMPLATE

    template = None if getattr(tokenizer, "chat_template", None) else CHAT_TEMPLATE

    def render(messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
        return tokenizer.apply_chat_template(
            messages,
            chat_template=template,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
        )

    return render


def _encode_chat(row: Chat, tokenizer: Any, formatter: Any) -> SFTExample:
    if not getattr(tokenizer, "is_fast", False):
        raise SFTDataError(
            f"{row.source}: messages rows need a fast tokenizer (character offsets locate the "
            f"assistant turns); {type(tokenizer).__name__} is not one"
        )
    render = _chat_renderer(tokenizer)
    msgs = [{"role": r, "content": c} for r, c in row.messages]
    try:
        full = render(msgs, False)
        spans = []  # character span of each assistant turn in the rendered conversation
        for k, (role, _) in enumerate(row.messages):
            if role != "assistant":
                continue
            start, end = render(msgs[:k], True), render(msgs[: k + 1], False)
            if not (end.startswith(start) and full.startswith(end)):
                raise SFTDataError(
                    f"{row.source}: message {k}: the chat template does not render the conversation "
                    "turn by turn (an earlier part changes once later turns are added), so the "
                    "assistant tokens cannot be located; use prompt/completion rows instead"
                )
            spans.append((len(start), len(end)))
        enc = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    except SFTDataError:
        raise
    except Exception as e:  # a template that rejects the conversation (roles it does not know, ...)
        raise SFTDataError(f"{row.source}: the chat template failed on this conversation: {e}") from None
    ids = [int(i) for i in enc["input_ids"]]
    starts = [int(o[0]) for o in enc["offset_mapping"]]
    mask = [0] * len(ids)
    eos = tokenizer.eos_token_id
    for a, b in spans:
        turn = [t for t in range(len(ids)) if a <= starts[t] < b]
        ends_with_eos = [t for t in turn if ids[t] == eos]
        if ends_with_eos:  # template glue after the turn's EOS is not a target
            turn = [t for t in turn if t <= ends_with_eos[-1]]
        for t in turn:
            mask[t] = 1
    mask[0] = 0  # position 0 has no context
    if not any(mask):
        raise SFTDataError(f"{row.source}: the assistant turns encode to zero tokens")
    return SFTExample(ids, mask, row.source)


_ENCODERS: dict[type, Callable[[Any, Any, Any], SFTExample]] = {
    PromptCompletion: _encode_prompt_completion,
    Text: _encode_text,
    Chat: _encode_chat,
}


def encode_rows(rows: list[Row], tokenizer: Any, formatter: Any) -> list[SFTExample]:
    """Typed rows -> token ids and loss masks (see the module docstring for each format)."""
    return [_ENCODERS[type(r)](r, tokenizer, formatter) for r in rows]


def iter_rows(items: list[Any], what: str, fields: DataFields | None = None) -> Iterator[Row]:
    """In-memory rows: (prompt, completion) pairs or dicts in any of the three formats."""
    for i, item in enumerate(items):
        where = f"{what}[{i}]"
        if isinstance(item, tuple | list) and len(item) == 2:
            item = {"prompt": item[0], "completion": item[1]}
            yield parse_row(item, where)
        else:
            yield parse_row(item, where, fields)
