"""Preference data: TRL's preference rows -> token ids of (prompt, chosen, rejected), and the pair
sources a preference trainer draws from.

Rows (a JSONL / JSON / parquet / arrow file or a ``datasets`` ``save_to_disk`` directory; column names
renamed with ``data_fields``) in TRL's four preference formats:

``{"prompt": "...", "chosen": "...", "rejected": "..."}``
    standard, explicit prompt. The prompt is encoded exactly as SFT and rollout encode it
    (:class:`~posttrain.rollout.PromptFormatter`: ``task.prompt_template``, ``task.chat_template``),
    each completion is followed by EOS (as TRL adds it).
``{"chosen": "...", "rejected": "..."}``
    standard, implicit prompt: the prompt is the longest shared prefix of the two texts (TRL's
    ``extract_prompt``: a space that ends the shared part starts the completions instead).
``{"prompt": [messages], "chosen": [messages], "rejected": [messages]}``
    conversational, explicit prompt: ``prompt`` the conversation so far (or a string: one user turn),
    ``chosen`` / ``rejected`` the assistant turn(s) that answer it.
``{"chosen": [messages], "rejected": [messages]}``
    conversational, implicit prompt: the messages both share before they differ (TRL's
    ``extract_prompt``).

Conversations are rendered with the tokenizer's chat template (or posttrain's
:data:`~posttrain.models.CHAT_TEMPLATE` when it has none, as SFT): the prompt with the generation prompt,
each completion as the tokens the full conversation adds after it (TRL 1.16's ``DPOTrainer`` does the
same), so the completion ends with the template's end-of-turn; tokens after its last EOS (a template's
newline between turns) are dropped, as SFT does not train on them.

Lengths (``max_prompt_length``, ``max_completion_length``, ``max_length`` = the model's context by
default) are checked when the data loads, with SFT's choices for a row that does not fit
(``overlong``): an error naming its file and row, ``truncate`` (the prompt keeps its end, a
completion its start) or ``skip``; both are counted and reported.

Pair sources (:class:`PairSource`): the trainer asks one for the next pairs of each step and knows
nothing else about where they come from. :class:`OfflinePairs` walks a fixed set of encoded pairs in
epoch-wise shuffled order (reference log-probs computed once, before the first step); the online source
(:class:`~posttrain.train.preference_online.OnlinePairs`: pairs sampled from the policy and ranked by a
reward each step) implements the same methods.
"""

from __future__ import annotations

import hashlib
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from posttrain.train.lengths import LengthError, LengthReport
from posttrain.train.sft_data import CHAT_ROLES, _chat_renderer
from posttrain.utils.config import StrictModel
from posttrain.utils.data import EpochShuffler
from posttrain.utils.errors import PosttrainError

Messages = tuple[tuple[str, str], ...]


class PreferenceDataError(PosttrainError, ValueError):
    """Preference data that is not what the preference trainer expects; the message names the file and
    row (and the field)."""


class PreferenceFields(StrictModel):
    """Column names of the data file (``data_fields.prompt=question``)."""

    prompt: str = "prompt"
    chosen: str = "chosen"
    rejected: str = "rejected"


@dataclass(frozen=True)
class PreferenceRow:
    """One parsed row: the prompt and both completions, as text (standard) or messages (conversational)."""

    prompt: str | Messages
    chosen: str | Messages
    rejected: str | Messages
    source: str

    @property
    def conversational(self) -> bool:
        return not isinstance(self.chosen, str)


@dataclass
class EncodedPair:
    """Token ids of one pair; ``ref_chosen`` / ``ref_rejected``: the reference policy's summed log-probs
    of each completion once computed (None until then, and for reference-free losses)."""

    prompt_ids: list[int]
    chosen_ids: list[int]
    rejected_ids: list[int]
    source: str
    ref_chosen: float | None = None
    ref_rejected: float | None = None
    meta: dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------- parsing
def _messages(value: Any, where: str) -> Messages:
    if not isinstance(value, list) or not value:
        raise PreferenceDataError(f"{where}: expected a non-empty list of {{'role', 'content'}} messages")
    out = []
    for j, m in enumerate(value):
        if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
            raise PreferenceDataError(f"{where}[{j}]: expected an object with string 'role' and 'content'")
        if m["role"] not in CHAT_ROLES:
            raise PreferenceDataError(
                f"{where}[{j}]: unknown role {m['role']!r}; accepted roles: {', '.join(CHAT_ROLES)}"
            )
        out.append((m["role"], m["content"]))
    return tuple(out)


def _is_conversation(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(m, dict) for m in value)


def _shared_prefix(a: Any, b: Any) -> int:
    """TRL's ``extract_prompt``: the index where ``a`` and ``b`` first differ; for text, a space just
    before it belongs to the completions."""
    n = min(len(a), len(b))
    idx = next((i for i in range(n) if a[i] != b[i]), n)
    if isinstance(a, str) and idx > 0 and a[idx - 1] == " ":
        idx -= 1
    return idx


def parse_preference_row(row: Any, where: str, fields: PreferenceFields | None = None) -> PreferenceRow:
    """One row in any of the four formats -> :class:`PreferenceRow`; errors name ``where`` and the field."""
    f = fields or PreferenceFields()
    if not isinstance(row, dict):
        raise PreferenceDataError(f"{where}: expected a JSON object, got {type(row).__name__}")
    for key in (f.chosen, f.rejected):
        if row.get(key) is None:
            raise PreferenceDataError(
                f"{where}: missing field {key!r} (expected {f.prompt!r} (optional), {f.chosen!r}, {f.rejected!r}; "
                f"got keys: {', '.join(sorted(row)) or 'none'}); rename columns with data_fields, e.g. "
                "data_fields.chosen=better"
            )
    ch, rj, pr = row[f.chosen], row[f.rejected], row.get(f.prompt)
    if _is_conversation(ch) or _is_conversation(rj):
        chosen = _messages(ch, f"{where}: {f.chosen!r}")
        rejected = _messages(rj, f"{where}: {f.rejected!r}")
        if pr is None:  # implicit prompt: the messages both share
            k = _shared_prefix(chosen, rejected)
            prompt: str | Messages = chosen[:k]
            chosen, rejected = chosen[k:], rejected[k:]
            if not prompt:
                raise PreferenceDataError(
                    f"{where}: no {f.prompt!r} field and {f.chosen!r} / {f.rejected!r} share no messages "
                    "(TRL's implicit prompt); add a prompt"
                )
        else:
            prompt = (
                _messages(pr, f"{where}: {f.prompt!r}")
                if isinstance(pr, list)
                else (("user", _text(pr, where, f.prompt)),)
            )
        for key, msgs in ((f.chosen, chosen), (f.rejected, rejected)):
            if not msgs or msgs[-1][0] != "assistant":
                raise PreferenceDataError(
                    f"{where}: {key!r} must end with an 'assistant' message (the completion), got "
                    f"{msgs[-1][0] if msgs else 'nothing'!r}"
                )
        return PreferenceRow(prompt, chosen, rejected, where)
    chosen_t, rejected_t = _text(ch, where, f.chosen), _text(rj, where, f.rejected)
    if pr is None:
        k = _shared_prefix(chosen_t, rejected_t)
        prompt_t, chosen_t, rejected_t = chosen_t[:k], chosen_t[k:], rejected_t[k:]
        if not prompt_t:
            raise PreferenceDataError(
                f"{where}: no {f.prompt!r} field and {f.chosen!r} / {f.rejected!r} share no prefix (TRL's "
                "implicit prompt); add a prompt"
            )
    elif isinstance(pr, list):
        raise PreferenceDataError(
            f"{where}: {f.prompt!r} is a list of messages but {f.chosen!r} is text; use one format per row "
            "(standard: all strings; conversational: all message lists)"
        )
    else:
        prompt_t = _text(pr, where, f.prompt)
    for key, text in ((f.chosen, chosen_t), (f.rejected, rejected_t)):
        if not text:
            raise PreferenceDataError(f"{where}: {key!r} is empty (after the shared prompt)")
    return PreferenceRow(prompt_t, chosen_t, rejected_t, where)


def _text(value: Any, where: str, key: str) -> str:
    if not isinstance(value, str):
        raise PreferenceDataError(
            f"{where}: {key!r} must be a string or a list of messages, got {type(value).__name__}"
        )
    return value


def read_preference_file(path: str | Path, fields: PreferenceFields | None = None) -> list[PreferenceRow]:
    """Every row of a preference file, parsed (JSONL, JSON, parquet, arrow, ``save_to_disk``
    directory); a bad row raises :class:`PreferenceDataError` naming the file and row."""
    from posttrain.tasks.jsonl import DatasetError, read_raw_rows

    p = Path(path)
    try:
        raw = read_raw_rows(p)
    except DatasetError as e:
        raise PreferenceDataError(str(e)) from None
    rows = []
    kind = "line" if p.suffix.lower() == ".jsonl" else "row"
    for i, row in raw:
        if isinstance(row, DatasetError):
            raise PreferenceDataError(str(row))
        rows.append(parse_preference_row(row, f"{path}: {kind} {i}", fields))
    if not rows:
        raise PreferenceDataError(f"{path}: no rows (expected prompt/chosen/rejected preference rows)")
    return rows


# ----------------------------------------------------------------------------------- tokenizing
def _ids(tokenizer: Any, text: str) -> list[int]:
    return [int(i) for i in tokenizer.encode(text, add_special_tokens=False)]


def _encode_conversation(row: PreferenceRow, tokenizer: Any) -> tuple[list[int], list[int], list[int]]:
    render = _chat_renderer(tokenizer)
    as_dicts = lambda msgs: [{"role": r, "content": c} for r, c in msgs]  # noqa: E731
    try:
        head = render(as_dicts(row.prompt), True)
        fulls = [render(as_dicts((*row.prompt, *side)), False) for side in (row.chosen, row.rejected)]
    except Exception as e:  # a template that rejects the conversation
        raise PreferenceDataError(
            f"{row.source}: the chat template failed on this conversation: {e}"
        ) from None
    prompt_ids = _ids(tokenizer, head)
    out = []
    for name, full in zip(("chosen", "rejected"), fulls, strict=True):
        if not full.startswith(head):
            raise PreferenceDataError(
                f"{row.source}: the chat template renders the prompt differently once the {name!r} answer is "
                "added, so the completion cannot be located; use standard (text) rows instead"
            )
        full_ids = _ids(tokenizer, full)
        # the completion: what the whole conversation adds after the prompt's tokens (TRL 1.16); when the
        # tokenizer merges across the boundary, the text after the prompt encoded on its own
        comp = (
            full_ids[len(prompt_ids) :]
            if full_ids[: len(prompt_ids)] == prompt_ids
            else _ids(tokenizer, full[len(head) :])
        )
        eos = tokenizer.eos_token_id
        if eos is not None and eos in comp:  # template glue after the turn's EOS is not a target (as SFT)
            comp = comp[: len(comp) - comp[::-1].index(eos)]
        out.append(comp)
    return prompt_ids, out[0], out[1]


def encode_pair(row: PreferenceRow, tokenizer: Any, formatter: Any) -> EncodedPair:
    """A parsed row -> token ids (module docstring); a side that encodes to nothing is an error."""
    if row.conversational:
        p, c, r = _encode_conversation(row, tokenizer)
    else:
        p = formatter.encode(row.prompt)
        c, r = formatter.encode_completion(row.chosen), formatter.encode_completion(row.rejected)
    for name, ids in (("prompt", p), ("chosen", c), ("rejected", r)):
        if not ids:
            raise PreferenceDataError(f"{row.source}: the {name} encodes to zero tokens")
    return EncodedPair(p, c, r, row.source)


def bound_pairs(
    pairs: list[EncodedPair],
    *,
    max_prompt_length: int | None,
    max_completion_length: int | None,
    max_length: int | None,
    overlong: str,
    source: str,
) -> tuple[list[EncodedPair], LengthReport]:
    """Pairs within the length limits; a pair that is not: :class:`LengthError` naming its row
    (``overlong="error"``), truncated (the prompt keeps its last tokens, each completion its first), or
    skipped; truncated and skipped pairs are counted."""
    report = LengthReport()
    kept = []
    for pair in pairs:
        p, c, r = pair.prompt_ids, pair.chosen_ids, pair.rejected_ids
        problems = []
        if max_prompt_length and len(p) > max_prompt_length:
            problems.append(f"the prompt is {len(p)} tokens (max_prompt_length={max_prompt_length})")
        if max_completion_length and max(len(c), len(r)) > max_completion_length:
            problems.append(
                f"a completion is {max(len(c), len(r))} tokens (max_completion_length={max_completion_length})"
            )
        if max_length and len(p) + max(len(c), len(r)) > max_length:
            problems.append(
                f"prompt + completion is {len(p) + max(len(c), len(r))} tokens (max_length={max_length}, "
                "default: the model's context)"
            )
        if not problems:
            kept.append(pair)
            continue
        if overlong == "skip":
            report.skipped += 1
            continue
        if overlong == "error":
            raise LengthError(
                f"{pair.source}: {'; '.join(problems)}. Shorten the row, or set overlong=truncate (the prompt "
                "keeps its end, a completion its start) or overlong=skip"
            )
        if max_prompt_length:
            p = p[-max_prompt_length:]
        if max_completion_length:
            c, r = c[:max_completion_length], r[:max_completion_length]
        if max_length:
            room = max_length - len(p)
            if room < 1:
                raise LengthError(
                    f"{pair.source}: the prompt alone is {len(p)} tokens, no room for a completion within "
                    f"max_length={max_length}; set max_prompt_length below it, or overlong=skip"
                )
            c, r = c[:room], r[:room]
        report.truncated += 1
        kept.append(EncodedPair(p, c, r, pair.source, meta=pair.meta))
    if not kept:
        raise LengthError(f"{source}: no pairs left within the length limits ({report.skipped} skipped)")
    return kept, report


def pairs_fingerprint(pairs: list[EncodedPair]) -> str:
    """SHA-256 over every pair's token ids, in order (checkpoints and the reference cache hold it)."""
    h = hashlib.sha256()
    for pr in pairs:
        for ids in (pr.prompt_ids, pr.chosen_ids, pr.rejected_ids):
            h.update(array("q", [len(ids), *ids]).tobytes())
    return h.hexdigest()


# ------------------------------------------------------------------------------------- pair sources
class PairSource(Protocol):
    """Where a preference trainer's pairs come from. ``next_pairs(n)`` returns the next ``n`` pairs of
    the training stream (any with ``ref_chosen`` None get reference log-probs from the trainer);
    ``state_dict()`` / ``load_state_dict()`` hold the position (JSON-able) for bitwise resume;
    ``fingerprint`` names the data, so a checkpoint refuses to resume on other data. Optional:
    ``step_metrics()`` (numbers about the last ``next_pairs``, logged with the step) and ``close()``
    (called by the trainer for a source it built itself, e.g. the online source's reward workers)."""

    fingerprint: str

    def next_pairs(self, n: int) -> list[EncodedPair]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class OfflinePairs:
    """A fixed list of encoded pairs in epoch-wise shuffled order (:class:`EpochShuffler`, ``stream``
    order, as SFT)."""

    def __init__(self, pairs: list[EncodedPair], *, seed: int = 0) -> None:
        self.pairs = pairs
        self.shuffler = EpochShuffler(len(pairs), seed=seed, order="stream")
        self.fingerprint = pairs_fingerprint(pairs)

    def next_pairs(self, n: int) -> list[EncodedPair]:
        return [self.pairs[i] for i in self.shuffler.take(n)]

    @property
    def epoch(self) -> float:
        return self.shuffler.epoch + self.shuffler.pos / self.shuffler.n

    def state_dict(self) -> dict[str, Any]:
        return {"shuffler": self.shuffler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.shuffler.load_state_dict(state["shuffler"])
