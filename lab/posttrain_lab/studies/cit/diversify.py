"""Instruction diversification with the four KPIG rewrite templates (He et al., arXiv 2403.10056;
template names after secondary summaries of the paper), keeping key parts tagged.

| template | rewrite |
|---|---|
| ``concretizing`` | replace general concepts inside key parts with more specific ones |
| ``reasoning`` | make multi-step reasoning explicit where the key parts allow it |
| ``constraint`` | add one extra requirement |
| ``breadth`` | rewrite only the general description, keeping length and key parts |

``rewrite_rules`` does it offline by rules (proposed design): concretizing maps each key part through
a dictionary (the built-in world's :data:`~posttrain_lab.studies.cit.world.CONCRETE`); reasoning prefixes a
step-by-step cue naming the key parts (tagged too); constraint appends "Answer with one word only."; breadth swaps
the words outside key parts through a small synonym table. Two rule sets: :data:`TRAIN_RULES` rewrite
the ``kpig`` arm's training rows, :data:`HELDOUT_RULES` (with
:data:`~posttrain_lab.studies.cit.world.HELDOUT_CONCRETE`) rewrite the held-out tasks for the P-score, in wordings
no training rewrite uses, so no arm has trained on the phrasings it is scored on. :class:`EndpointRewriter` asks any
OpenAI-compatible model instead (the rm judge's client), keeping the ``[[...]]`` tags; an answer that
loses or changes a key part falls back to the rule rewrite.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from posttrain.utils.errors import InvalidValueError
from posttrain_lab.studies.cit.data import CITDataError, InstructionExample, parse_markup

TEMPLATES = ("concretizing", "reasoning", "constraint", "breadth")

BREADTH_SYNONYMS = {
    "Give": "Tell me",
    "Who is": "Name who is",
    "Rewrite": "Write it",
    "Pick": "Choose",
    "one": "item",
}


@dataclass(frozen=True)
class RuleSet:
    """The wording of the offline rewrite rules: ``fallback`` concretizes a key part missing from the
    ``concrete`` table (``{k}`` = the key part), ``reasoning`` is the cue put before the instruction
    (``{keys}`` = the tagged key parts joined by ``join``; ``reasoning_plain`` without key parts),
    ``constraint`` the appended requirement, ``breadth`` the synonym table outside key parts."""

    name: str
    fallback: str
    reasoning: str
    reasoning_plain: str
    join: str
    constraint: str
    breadth: Mapping[str, str]


TRAIN_RULES = RuleSet(
    name="train",
    fallback="exactly {k}",
    reasoning="Think step by step about {keys}.",
    reasoning_plain="Think step by step.",
    join=" and ",
    constraint="Answer with one word only.",
    breadth=BREADTH_SYNONYMS,
)
"""Rules of the training-time rewrites (the ``kpig`` arm's ``diversify.ratio`` rows)."""

HELDOUT_RULES = RuleSet(
    name="heldout",
    fallback="specifically {k}",
    reasoning="Reflect carefully on {keys}, then respond:",
    reasoning_plain="Reflect carefully, then respond:",
    join=", ",
    constraint="Be brief.",
    breadth={
        "Give": "Provide",
        "Who is": "Which individual is",
        "Rewrite": "Restate",
        "Pick": "Select",
        "one": "entry",
    },
)
"""Rules of the P-score's held-out rewrites: same four templates, wordings no training rule uses."""

RULE_SETS = {r.name: r for r in (TRAIN_RULES, HELDOUT_RULES)}


def _concretizing(ex: InstructionExample, concrete: Mapping[str, str], rules: RuleSet = TRAIN_RULES) -> str:
    out, last, text = [], 0, ex.instruction
    for a, b in ex.key_spans:
        k = text[a:b]
        out += [text[last:a], "[[", concrete.get(k, rules.fallback.format(k=k)), "]]"]
        last = b
    return "".join([*out, text[last:]])


def _breadth(ex: InstructionExample, rules: RuleSet = TRAIN_RULES) -> str:
    out, last, text = [], 0, ex.instruction
    syn = rules.breadth
    pat = re.compile("|".join(re.escape(k) for k in sorted(syn, key=len, reverse=True)))

    def swap(s: str) -> str:
        return pat.sub(lambda m: syn[m.group(0)], s)

    for a, b in ex.key_spans:
        out += [swap(text[last:a]), "[[", text[a:b], "]]"]
        last = b
    return "".join([*out, swap(text[last:])])


def rewrite_rules(
    ex: InstructionExample,
    template: str,
    concrete: Mapping[str, str] | None = None,
    rules: RuleSet = TRAIN_RULES,
) -> InstructionExample:
    """``ex`` with its instruction rewritten by ``template`` (offline ``rules``; module docstring)."""
    if template == "concretizing":
        marked = _concretizing(ex, concrete or {}, rules)
    elif template == "reasoning":
        keys = rules.join.join(f"[[{k}]]" for k in ex.key_parts)
        cue = rules.reasoning.format(keys=keys) if keys else rules.reasoning_plain
        marked = f"{cue} {ex.marked()}"
    elif template == "constraint":
        marked = f"{ex.marked()} {rules.constraint}"
    elif template == "breadth":
        marked = _breadth(ex, rules)
    else:
        raise InvalidValueError(f"unknown rewrite template {template!r}; known: {', '.join(TEMPLATES)}")
    text, spans = parse_markup(marked, f"{ex.source}: {template} rewrite")
    return InstructionExample(text, ex.input, ex.output, ex.task, spans, ex.source, ex.meta)


REWRITE_PROMPT = (
    "Rewrite the instruction below with the '{template}' strategy: {how}. Key parts are marked "
    "[[like this]]; keep every key part marked with [[ ]] in your rewrite. Reply with the rewritten "
    "instruction only.\n\nInstruction: {instruction}"
)
_HOW = {
    "concretizing": "replace general concepts inside the key parts with more specific ones",
    "reasoning": "make the multi-step reasoning explicit where the key parts allow it",
    "constraint": "add exactly one extra requirement that does not change the answer",
    "breadth": "rewrite only the general description, keeping the length and the key parts",
}


class EndpointRewriter:
    """Rewrites through an OpenAI-compatible chat endpoint (``base_url``, ``model``, API key from the
    environment variable ``api_key_env``); answers without exactly as many ``[[...]]`` key parts as the
    original fall back to :func:`rewrite_rules`."""

    def __init__(
        self, base_url: str, model: str, *, api_key_env: str | None = None, concurrency: int = 8
    ) -> None:
        from posttrain.clients import EndpointGenerator

        self.client = EndpointGenerator(
            base_url, model, api_key_env=api_key_env, temperature=0.7, max_tokens=256, concurrency=concurrency
        )
        self.fallbacks = 0

    def rewrite(
        self,
        examples: Sequence[InstructionExample],
        template: str,
        concrete: Mapping[str, str] | None = None,
        rules: RuleSet = TRAIN_RULES,
    ) -> list[InstructionExample]:
        prompts = [
            REWRITE_PROMPT.format(template=template, how=_HOW[template], instruction=ex.marked())
            for ex in examples
        ]
        out = []
        for ex, ans in zip(examples, self.client.generate(prompts), strict=True):
            try:
                if ans is None:
                    raise CITDataError("no answer")
                text, spans = parse_markup(ans.strip(), "endpoint rewrite")
                if len(spans) != len(ex.key_spans):
                    raise CITDataError("key parts lost")
                out.append(InstructionExample(text, ex.input, ex.output, ex.task, spans, ex.source, ex.meta))
            except CITDataError:
                self.fallbacks += 1
                out.append(rewrite_rules(ex, template, concrete, rules))
        return out


def diversify(
    examples: Sequence[InstructionExample],
    templates: Sequence[str] = TEMPLATES,
    *,
    concrete: Mapping[str, str] | None = None,
    rewriter: EndpointRewriter | None = None,
    rules: RuleSet = TRAIN_RULES,
) -> dict[str, list[InstructionExample]]:
    """``{template: rewritten examples}`` for every template (``rules``, or ``rewriter`` when given,
    falling back to ``rules``)."""
    for t in templates:
        if t not in TEMPLATES:
            raise InvalidValueError(f"unknown rewrite template {t!r}; known: {', '.join(TEMPLATES)}")
    if rewriter is not None:
        return {t: rewriter.rewrite(examples, t, concrete, rules) for t in templates}
    return {t: [rewrite_rules(ex, t, concrete, rules) for ex in examples] for t in templates}
