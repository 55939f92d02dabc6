"""Knowledge-intervention data groups (Ren et al. 2024, arXiv 2402.18243, §3; the authors' groups in
`renmengjie7/Self-Aligning` `data/group/<model>/<domain>/*.jsonl` and `eval/analyse/partial_correlation.py`).

From a base model's probe results on an item pool (:func:`posttrain_lab.studies.analysis.probe`, few-shot, no
template), each item becomes an instruction example "MCQ -> target answer + explanation":

| group | items (base model) | target | explanation |
|---|---|---|---|
| ``consistent-correct-exp-sample`` | answered correctly | gold | of the gold answer |
| ``inconsistent-golden-exp`` | answered wrongly | gold | of the gold answer (knowledge the model lacks) |
| ``inconsistent-predict-model-exp`` | answered wrongly | the model's own prediction | of that prediction |
| ``consistent_wrong{r}-inconsistent_golden-exp`` | answered wrongly | a fraction r own prediction, 1 − r gold | as above |

All groups have the same size (the smaller of the correct and wrong counts, capped by ``size``); the
wrong-item groups share the same items and differ only in their targets; r = 0 is the golden group and
r = 1 the predict group. Explanations come from a template (``explain="template"``: a string with the
fields ``{question}``, ``{answer}``, ``{letter}`` and the MCQ's ``meta`` keys) or from the model itself
(``explain="model"``: sampled with T = 0.7, top-p 0.8, ≤ 256 new tokens — the sampling settings of the
authors' `eval/chat.py` ``generate`` — from the prompt ``The following is a multi choice question about
{domain}.\\n\\n{question and options}\\n\\nThe answer is "{answer}". Please explain why.\\n``, the text
between ``` fences kept when present, as their ``parse_exp``). That prompt is **posttrain's own**
(proposed design): no file of the authors' repository contains it, and where their gold explanations
come from is not in the repository. The authors' prompt for own-prediction explanations (a URIAL-style
in-context prompt, `eval/chat.py` ``build_input2``) is not reproduced either.

A group item becomes a chat row ``{"messages": [user: header + question + options + "Answer:",
assistant: "{letter}. {option}\\n{explanation}"]}``; the first assistant token is the option letter,
which the tuned-model probe scores (assistant text layout: a proposed design; the authors' conversion
of group items into conversations is not in their repository).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from posttrain.utils.errors import InvalidValueError
from posttrain_lab.studies.analysis.probe import LETTERS, MCQ, ProbeSet, format_example, header

CORRECT = "consistent-correct-exp-sample"
GOLDEN = "inconsistent-golden-exp"
PREDICT = "inconsistent-predict-model-exp"
DEFAULT_RATIOS = (0.05, 0.1, 0.2, 0.4, 0.6, 0.8)
DEFAULT_TEMPLATE = 'The answer is "{answer}".'


def mixture_name(r: float) -> str:
    return f"consistent_wrong{r:g}-inconsistent_golden-exp"


def group_ratio(name: str) -> float | None:
    """Share of own-prediction targets of a wrong-item group (0 golden, 1 predict), None otherwise."""
    if name == GOLDEN:
        return 0.0
    if name == PREDICT:
        return 1.0
    if name.startswith("consistent_wrong") and name.endswith("-inconsistent_golden-exp"):
        return float(name[len("consistent_wrong") : -len("-inconsistent_golden-exp")])
    return None


def group_names(ratios: Sequence[float] = DEFAULT_RATIOS) -> list[str]:
    return [CORRECT, GOLDEN, *(mixture_name(r) for r in ratios), PREDICT]


@dataclass(frozen=True)
class GroupItem:
    mcq: MCQ
    target: int
    explanation: str

    @property
    def own_prediction(self) -> bool:
        return self.target != self.mcq.answer


def template_explainer(template: str = DEFAULT_TEMPLATE) -> Callable[[MCQ, int], str]:
    def explain(q: MCQ, target: int) -> str:
        fields = {**q.meta, "question": q.question, "answer": q.choices[target], "letter": LETTERS[target]}
        try:
            return template.format(**fields)
        except KeyError as e:
            raise InvalidValueError(
                f"explanation template {template!r}: unknown field {e}; known: {', '.join(sorted(fields))}"
            ) from None

    return explain


def explanation_prompt(q: MCQ, target: int, domain: str) -> str:
    """posttrain's own explanation prompt (proposed design; not the authors', see the module docstring)."""
    body = format_example(q, include_answer=False)[: -len("\nAnswer:")]
    return (
        f"The following is a multi choice question about {domain}.\n\n{body}\n\n"
        f'The answer is "{q.choices[target]}". Please explain why.\n'
    )


def _fenced(text: str) -> str:
    if "```" in text:
        parts = text.split("```")
        if len(parts) >= 2 and parts[1].strip():
            return parts[1].strip()
    return text.strip()


def model_explanations(
    model: Any,
    tokenizer: Any,
    requests: Sequence[tuple[MCQ, int]],
    *,
    domain: str,
    max_new_tokens: int = 256,
    seed: int = 0,
    batch_size: int = 16,
) -> list[str]:
    """Explanations sampled from ``model`` (T = 0.7, top-p 0.8), one per (question, target)."""
    from posttrain.models import CausalLMAdapter
    from posttrain.rollout import SamplingParams, generate_completions

    lm = CausalLMAdapter(model, tokenizer)
    params = SamplingParams(
        temperature=0.7, top_p=0.8, max_new_tokens=max_new_tokens, seed=seed, logprobs=False
    )
    out: list[str] = []
    for s in range(0, len(requests), batch_size):
        chunk = requests[s : s + batch_size]
        ids = [
            [int(i) for i in tokenizer.encode(explanation_prompt(q, t, domain), add_special_tokens=False)]
            for q, t in chunk
        ]
        batch = generate_completions(lm, ids, params, seed=seed + s)
        for r in range(len(chunk)):
            toks = batch.completion_ids[r][batch.completion_mask[r].bool()].tolist()
            out.append(_fenced(tokenizer.decode(toks, skip_special_tokens=True)))
    return out


def build_groups(
    pool: Sequence[MCQ],
    base: ProbeSet,
    *,
    groups: Sequence[str] | None = None,
    ratios: Sequence[float] = DEFAULT_RATIOS,
    size: int | None = None,
    seed: int = 0,
    explain: Callable[[Sequence[tuple[MCQ, int]]], list[str]] | None = None,
) -> dict[str, list[GroupItem]]:
    """The intervention groups (module docstring) of ``pool`` given the base model's results on it
    (``base.results[i]`` belongs to ``pool[i]``). ``explain`` maps (question, target) pairs to
    explanations (default: :func:`template_explainer`)."""
    if len(base.results) != len(pool):
        raise InvalidValueError(f"{len(base.results)} probe results for {len(pool)} pool questions")
    for q, r in zip(pool, base.results, strict=True):
        if r.id != q.id:
            raise InvalidValueError(
                f"probe result {r.id!r} does not belong to question {q.id!r} (same order expected)"
            )
    names = list(groups) if groups is not None else group_names(ratios)
    rng = random.Random(seed)
    correct = [(q, r) for q, r in zip(pool, base.results, strict=True) if r.correct]
    wrong = [(q, r) for q, r in zip(pool, base.results, strict=True) if not r.correct]
    need_correct = CORRECT in names
    need_wrong = any(group_ratio(n) is not None for n in names)
    for n in names:
        if n != CORRECT and group_ratio(n) is None:
            raise InvalidValueError(f"unknown group {n!r}; known: {', '.join(group_names(ratios))}")
    caps = [len(correct)] * need_correct + [len(wrong)] * need_wrong + ([size] if size else [])
    n_items = min(caps) if caps else 0
    if n_items == 0:
        raise InvalidValueError(
            f"cannot build equal-size groups: the base model answered {len(correct)} of {len(pool)} pool "
            "questions correctly and the groups need both correct and wrong ones"
        )
    chosen_correct = rng.sample(correct, n_items) if need_correct else []
    chosen_wrong = rng.sample(wrong, n_items) if need_wrong else []
    order = list(range(n_items))
    rng.shuffle(order)  # mixture r: the first round(r n) items of this order take the own prediction
    plan: dict[str, list[tuple[MCQ, int]]] = {}
    for n in names:
        if n == CORRECT:
            plan[n] = [(q, q.answer) for q, _ in chosen_correct]
        else:
            k = round(group_ratio(n) * n_items)
            own = set(order[:k])
            plan[n] = [(q, r.pred if i in own else q.answer) for i, (q, r) in enumerate(chosen_wrong)]
    explain = explain or (lambda reqs: [template_explainer()(q, t) for q, t in reqs])
    uniq = sorted(
        {(q.id, t): (q, t) for reqs in plan.values() for q, t in reqs}.values(), key=lambda x: (x[0].id, x[1])
    )
    texts = dict(zip([(q.id, t) for q, t in uniq], explain(uniq), strict=True))
    return {n: [GroupItem(q, t, texts[(q.id, t)]) for q, t in reqs] for n, reqs in plan.items()}


def chat_row(item: GroupItem, domain: str) -> dict[str, Any]:
    q, t = item.mcq, item.target
    user = header(domain) + format_example(q, include_answer=False)
    reply = f"{LETTERS[t]}. {q.choices[t]}" + (f"\n{item.explanation}" if item.explanation else "")
    return {"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]}


def group_row_json(item: GroupItem, domain: str) -> dict[str, Any]:
    """A group item as saved: the MCQ, the target, the explanation and its chat row."""
    return {
        **item.mcq.to_json(),
        "target": item.target,
        "own_prediction": item.own_prediction,
        "explanation": item.explanation,
        **chat_row(item, domain),
    }
