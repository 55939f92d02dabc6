"""Multiple-choice knowledge probes scored by the next-token log-probs of the option letters.

Prompt formats, byte for byte as in the authors' code of Ren et al. 2024 (arXiv 2402.18243,
`renmengjie7/Self-Aligning`, `eval/my_domain_eval.py`: `gen_prompt`, `format_example`,
`vicuna_template`, `parse_logits`):

- header: ``The following are multiple choice questions about {domain}. Please choose the correct
  answer. \\n\\n`` (note the space before the blank line);
- a question: ``{question}\\nA. {option}\\nB. {option}...\\nAnswer:``; a solved few-shot example
  appends ``{letter}. {option}\\n\\n`` directly after ``Answer:``;
- base models (``style="base"``): header + k solved dev examples + the question (k-shot in context,
  no template; the paper's analysis files use 5 shots, the script's default is 3). The k examples are
  the first k of the dev set *after* the authors' shuffle (``main``: ``random.seed(42)``, shuffle the
  index list, reorder): :func:`dev_order`; for 10 dev items 5-shot uses items [7, 3, 2, 8, 5];
- fine-tuned models (``style="vicuna"``): header + the question (0-shot) inside the Vicuna template
  ``A chat between a curious user and an artificial intelligence assistant. The assistant gives
  helpful, detailed, and polite answers to the user's questions. USER: {prompt} ASSISTANT: ``;
  ``style="chat"`` wraps the same 0-shot text with the tokenizer's own chat template instead
  (one user message, generation prompt), for models tuned in their own chat format.

Scoring: the logits of the last prompt position at the token id of each letter (the last id of
``tokenizer(letter)``, as ``parse_logits``), softmax over the letters → ``probs``; ``pred`` = argmax,
``correct``, ``golden_prob``, ``pred_prob`` (``eval_by_logits``). Prompts are scored in batches
(left padding, position ids from the attention mask), one forward per batch. Token ids: ``base``
prompts start with BOS when the tokenizer has one (as SFT's text rows, i.e. pre-training-like text);
``vicuna`` prompts are ``tokenizer(text)`` (the authors' call); ``chat`` prompts are the chat template's.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from posttrain.utils.errors import InvalidValueError

LETTERS = tuple(chr(i) for i in range(ord("A"), ord("Z")))
VICUNA_TEMPLATE = (
    "A chat between a curious user and an artificial intelligence assistant. The assistant gives helpful, "
    "detailed, and polite answers to the user's questions. USER: {} ASSISTANT: "
)
Style = Literal["base", "vicuna", "chat"]

__all__ = [
    "LETTERS",
    "MCQ",
    "VICUNA_TEMPLATE",
    "ProbeResult",
    "ProbeSet",
    "dev_order",
    "format_example",
    "header",
    "letter_token_ids",
    "load_mcqs",
    "probe",
    "probe_prompt",
    "save_mcqs",
]


@dataclass(frozen=True)
class MCQ:
    """One multiple-choice question: ``answer`` is the index of the gold option."""

    question: str
    choices: tuple[str, ...]
    answer: int
    id: str = ""
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        if not 2 <= len(self.choices) <= len(LETTERS):
            raise InvalidValueError(
                f"MCQ {self.id!r}: {len(self.choices)} choices; expected 2..{len(LETTERS)}"
            )
        if not 0 <= self.answer < len(self.choices):
            raise InvalidValueError(
                f"MCQ {self.id!r}: answer {self.answer} outside 0..{len(self.choices) - 1}"
            )

    def to_json(self) -> dict[str, Any]:
        d = {"id": self.id, "question": self.question, "choices": list(self.choices), "answer": self.answer}
        if self.meta:
            d["meta"] = self.meta
        return d


def _mcq_from_row(row: Any, where: str) -> MCQ:
    if not isinstance(row, dict):
        raise InvalidValueError(f"{where}: expected a JSON object, got {type(row).__name__}")
    missing = [k for k in ("question", "choices", "answer") if k not in row]
    if missing:
        raise InvalidValueError(f"{where}: missing key {missing[0]!r} (got keys: {', '.join(sorted(row))})")
    choices = row["choices"]
    if not isinstance(choices, list) or not all(isinstance(c, str) for c in choices):
        raise InvalidValueError(f"{where}: 'choices' must be a list of strings")
    ans = row["answer"]
    if isinstance(ans, str) and len(ans) == 1 and ans in LETTERS:
        ans = LETTERS.index(ans)
    if not isinstance(ans, int) or isinstance(ans, bool):
        raise InvalidValueError(
            f"{where}: 'answer' must be an option index (0-based) or a letter, got {ans!r}"
        )
    try:
        return MCQ(
            str(row["question"]), tuple(choices), ans, str(row.get("id", "")), dict(row.get("meta") or {})
        )
    except ValueError as e:
        raise InvalidValueError(f"{where}: {e}") from None


def load_mcqs(path: str | Path) -> list[MCQ]:
    """MCQs of a JSONL file, rows ``{"question", "choices": [...], "answer": index or letter, "id"?}``
    (the authors' data format); errors name the file and line."""
    from posttrain.utils.data import iter_jsonl

    out = []
    for line, row in iter_jsonl(path):
        out.append(_mcq_from_row(row, f"{path}: line {line}"))
    if not out:
        raise InvalidValueError(f"{path}: no questions")
    return out


def save_mcqs(path: str | Path, mcqs: Iterable[MCQ]) -> Path:
    from posttrain.utils.io import atomic_write_text

    return atomic_write_text(path, "".join(json.dumps(q.to_json()) + "\n" for q in mcqs))


# -------------------------------------------------------------------------------------- prompts
def header(domain: str) -> str:
    return (
        f"The following are multiple choice questions about {domain}. Please choose the correct answer. \n\n"
    )


def format_example(q: MCQ, include_answer: bool = True) -> str:
    """``question\\nA. x\\nB. y...\\nAnswer:`` (+ ``{letter}. {option}\\n\\n`` when solved)."""
    s = q.question
    for j, c in enumerate(q.choices):
        s += f"\n{LETTERS[j]}. {c}"
    s += "\nAnswer:"
    if include_answer:
        s += f"{LETTERS[q.answer]}. {q.choices[q.answer]}\n\n"
    return s


AUTHORS_DEV_SEED = 42
"""``random.seed(42)`` of the authors' ``my_domain_eval.py`` before shuffling the dev set."""


def dev_order(n: int, seed: int | None = AUTHORS_DEV_SEED) -> list[int]:
    """Indices of ``n`` dev items in the order the few-shot examples are taken: Python's
    ``random.seed(seed)`` + ``random.shuffle(list(range(n)))`` as the authors' ``main`` (a private
    ``random.Random(seed)`` draws the same permutation without touching the global state); ``seed=None``
    keeps the file order."""
    import random

    idx = list(range(n))
    if seed is not None:
        random.Random(seed).shuffle(idx)
    return idx


def probe_prompt(
    q: MCQ,
    *,
    domain: str,
    style: Style = "base",
    dev: Sequence[MCQ] = (),
    shots: int = 0,
    dev_seed: int | None = AUTHORS_DEV_SEED,
) -> str:
    """The prompt text of ``q`` (module docstring). ``base``: header + ``shots`` dev examples solved
    (the first ``shots`` of ``dev`` reordered by :func:`dev_order` with ``dev_seed``: the authors'
    shuffle by default, ``None`` = file order) + the question; ``vicuna``: header + question inside the
    Vicuna template; ``chat``: the 0-shot text, to be wrapped by the tokenizer's chat template
    (:func:`probe` does that)."""
    if style == "base":
        if shots > len(dev):
            raise InvalidValueError(f"{shots}-shot prompt needs {shots} dev examples, got {len(dev)}")
        picked = [dev[i] for i in dev_order(len(dev), dev_seed)[:shots]]
        return header(domain) + "".join(format_example(d) for d in picked) + format_example(q, False)
    text = header(domain) + format_example(q, False)
    if style == "vicuna":
        return VICUNA_TEMPLATE.format(text)
    if style == "chat":
        return text
    raise InvalidValueError(f"probe style must be 'base', 'vicuna' or 'chat', got {style!r}")


def letter_token_ids(tokenizer: Any, n: int) -> list[int]:
    """Token id of each of the first ``n`` letters: the last id of ``tokenizer(letter)``."""
    ids = []
    for letter in LETTERS[:n]:
        enc = tokenizer(letter)["input_ids"]
        if not enc:
            raise InvalidValueError(f"the tokenizer encodes {letter!r} as no token")
        ids.append(int(enc[-1]))
    if len(set(ids)) != n:
        raise InvalidValueError(f"the tokenizer maps option letters {LETTERS[:n]} to non-distinct ids {ids}")
    return ids


# -------------------------------------------------------------------------------------- scoring
@dataclass
class ProbeResult:
    id: str
    probs: list[float]
    pred: int
    answer: int
    correct: bool
    golden_prob: float
    pred_prob: float


@dataclass
class ProbeSet:
    """Per-question results of one model on one probe set, plus how they were obtained."""

    results: list[ProbeResult]
    style: str
    shots: int
    domain: str

    @property
    def accuracy(self) -> float:
        """Fraction correct × 100 (points)."""
        return 100.0 * sum(r.correct for r in self.results) / max(1, len(self.results))

    @property
    def probs(self) -> list[list[float]]:
        return [r.probs for r in self.results]

    def to_json(self) -> dict[str, Any]:
        return {
            "style": self.style,
            "shots": self.shots,
            "domain": self.domain,
            "accuracy": self.accuracy,
            "results": [asdict(r) for r in self.results],
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ProbeSet:
        return cls([ProbeResult(**r) for r in d["results"]], d["style"], d["shots"], d["domain"])


def _encode(tokenizer: Any, text: str, style: Style) -> list[int]:
    if style == "chat":
        if getattr(tokenizer, "chat_template", None) is None:
            raise InvalidValueError("style 'chat' needs a tokenizer with a chat template; use style 'vicuna'")
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
        )
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return [int(i) for i in ids]
    if style == "vicuna":  # the authors' call: tokenizer(text) with the tokenizer's own special tokens
        return [int(i) for i in tokenizer(text)["input_ids"]]
    ids = [int(i) for i in tokenizer.encode(text, add_special_tokens=False)]
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is not None:
        ids = [int(bos), *ids]  # as SFT text rows (pre-training-like text), and Llama's tokenizer(text)
    return ids


def probe(
    model: Any,
    tokenizer: Any,
    questions: Sequence[MCQ],
    *,
    domain: str,
    style: Style = "base",
    dev: Sequence[MCQ] = (),
    shots: int = 0,
    batch_size: int = 16,
    progress: bool | None = False,
    dev_seed: int | None = AUTHORS_DEV_SEED,
) -> ProbeSet:
    """Score every question by the next-token probabilities of its option letters (module doc).
    Works for any Hugging Face causal LM (or a :class:`~posttrain.models.ModelAdapter`'s model)."""
    import torch

    from posttrain.models.logprobs import position_ids_from_attention_mask
    from posttrain.rollout import pad_left
    from posttrain.utils.progress import progress_bar

    if hasattr(model, "model") and hasattr(model, "tokenizer") and tokenizer is None:
        model, tokenizer = model.model, model.tokenizer
    if style != "base" and shots:
        raise InvalidValueError(f"style {style!r} is 0-shot (the fine-tuned format); shots must be 0")
    device = next(model.parameters()).device
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    encoded = [
        _encode(
            tokenizer,
            probe_prompt(q, domain=domain, style=style, dev=dev, shots=shots, dev_seed=dev_seed),
            style,
        )
        for q in questions
    ]
    results: list[ProbeResult] = []
    was_training = model.training
    model.eval()
    try:
        with (
            torch.no_grad(),
            progress_bar(
                "probe", total=len(questions), enabled=bool(progress), log_every=None if progress else 0
            ) as bar,
        ):
            for s in range(0, len(questions), batch_size):
                chunk = encoded[s : s + batch_size]
                qs = questions[s : s + batch_size]
                ids, am = pad_left(chunk, pad)  # the last column is every prompt's last token
                ids, am = ids.to(device), am.to(device)
                out = model(
                    input_ids=ids, attention_mask=am, position_ids=position_ids_from_attention_mask(am)
                )
                last = out.logits[:, -1, :].float()
                for r, q in enumerate(qs):
                    letters = letter_token_ids(tokenizer, len(q.choices))
                    p = torch.softmax(last[r, letters], dim=0).cpu().tolist()
                    pred = max(range(len(p)), key=p.__getitem__)
                    results.append(
                        ProbeResult(q.id, p, pred, q.answer, pred == q.answer, p[q.answer], p[pred])
                    )
                bar.advance(len(qs))
    finally:
        model.train(was_training)
    return ProbeSet(results, style, shots, domain)
