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

Endpoint rewrites keep the two splits apart (posttrain's design, not in the KPIG paper): the training
rewrites and the P-score's held-out rewrites are asked with different prompts (:data:`REWRITE_PROMPT`,
:data:`HELDOUT_REWRITE_PROMPT`) and different request seeds, and an answer that adds a word only the
OTHER split's rules add (:func:`split_vocabulary`) falls back to its own split's rule, so the rule
wordings never cross. Free-text answers of one model can still resemble each other: only the prompts,
the seeds and the rule words are kept apart, not every phrasing.
"""

from __future__ import annotations

import re
import zlib
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
"""Prompt of the TRAINING rewrites (the ``kpig`` arm's diversified rows)."""
_HOW = {
    "concretizing": "replace general concepts inside the key parts with more specific ones",
    "reasoning": "make the multi-step reasoning explicit where the key parts allow it",
    "constraint": "add exactly one extra requirement that does not change the answer",
    "breadth": "rewrite only the general description, keeping the length and the key parts",
}

HELDOUT_REWRITE_PROMPT = (
    "You paraphrase task instructions for an evaluation set. Paraphrase goal ({template}): {how}. "
    "Spans inside double square brackets, [[like this]], must stay inside double square brackets. "
    "Answer with nothing but the new instruction.\n\nOriginal: {instruction}"
)
"""Prompt of the P-score's HELD-OUT rewrites: worded unlike :data:`REWRITE_PROMPT` (posttrain's design)."""
_HOW_HELDOUT = {
    "concretizing": "make the bracketed spans more precise without changing what they ask for",
    "reasoning": "ask the reader to reason through the bracketed spans before answering",
    "constraint": "attach one further condition on the answer that leaves the correct answer unchanged",
    "breadth": "word the sentence around the bracketed spans differently, at a similar length",
}

PROMPTS = {"train": (REWRITE_PROMPT, _HOW), "heldout": (HELDOUT_REWRITE_PROMPT, _HOW_HELDOUT)}
"""Endpoint prompt and strategy wording per rule set (``RuleSet.name``)."""


def _words(s: str) -> set[str]:
    return set(re.findall(r"[a-z]+", s.lower()))


def added_words(before: str, after: str) -> set[str]:
    """Words (lower-case letters) of ``after`` that ``before`` does not have."""
    return _words(after) - _words(before)


def rule_vocabulary(rules: RuleSet, concrete: Mapping[str, str]) -> set[str]:
    """Every word ``rules`` (with the concretizing table ``concrete``) can add to an instruction."""
    out = _words(rules.fallback.format(k="")) | _words(rules.reasoning.format(keys=""))
    out |= _words(rules.reasoning_plain) | _words(rules.join) | _words(rules.constraint)
    out |= {w for k, v in rules.breadth.items() for w in added_words(k, v)}
    return out | {w for k, v in concrete.items() for w in added_words(k, v)}


FUNCTION_WORDS = frozenset({"a", "an", "the", "in", "on", "at", "to", "of", "for", "by", "with", "and", "or"})
FUNCTION_WORDS |= {"as", "is", "be", "it", "me", "then", "which", "all", "this", "that"}
"""Words no split owns: an endpoint rewrite may add them whatever the rules add."""


def split_vocabulary(rules: RuleSet) -> set[str]:
    """Words an endpoint rewrite for ``rules`` must not add (posttrain's design): those only the other
    split's rules and table add (training: :data:`TRAIN_RULES` + ``CONCRETE``; held-out:
    :data:`HELDOUT_RULES` + ``HELDOUT_CONCRETE``), less :data:`FUNCTION_WORDS`. Words both splits add
    are allowed."""
    from posttrain_lab.studies.cit.world import CONCRETE, HELDOUT_CONCRETE

    train = rule_vocabulary(TRAIN_RULES, CONCRETE)
    held = rule_vocabulary(HELDOUT_RULES, HELDOUT_CONCRETE)
    return (held - train if rules.name == "train" else train - held) - FUNCTION_WORDS


def request_seed(seed: int | str, rules: RuleSet, template: str) -> int:
    """The ``seed`` sent with an endpoint rewrite: distinct per split, template and caller's seed."""
    return zlib.crc32(f"{rules.name}:{template}:{seed}".encode()) & 0x7FFFFFFF


class EndpointRewriter:
    """Rewrites through an OpenAI-compatible chat endpoint (``base_url``, ``model``, API key from the
    environment variable ``api_key_env``). The split decides the prompt (``rules.name``:
    :data:`PROMPTS`) and the request ``seed`` (:func:`request_seed` of ``seed``, the split and the
    template). Answers without exactly as many ``[[...]]`` key parts as the original, or adding a word
    only the other split's rules add (:func:`split_vocabulary`), fall back to :func:`rewrite_rules`
    with ``rules`` (``fallbacks``; ``crossed`` counts the second kind)."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key_env: str | None = None,
        concurrency: int = 8,
        seed: int | str = 0,
        temperature: float = 0.7,
        max_tokens: int = 256,
        timeout_s: float = 120.0,
        max_retries: int = 2,
    ) -> None:
        self.base_url, self.model, self.seed = base_url, model, seed
        self._client_kw = {
            "api_key_env": api_key_env,
            "temperature": temperature,
            "max_tokens": max_tokens,
            "concurrency": concurrency,
            "timeout_s": timeout_s,
            "max_retries": max_retries,
        }
        self.fallbacks = 0
        self.crossed = 0

    def _generate(self, prompts: list[str], seed: int) -> list[str | None]:
        from posttrain.clients import EndpointGenerator

        client = EndpointGenerator(self.base_url, self.model, extra_body={"seed": seed}, **self._client_kw)
        return client.generate(prompts)

    def rewrite(
        self,
        examples: Sequence[InstructionExample],
        template: str,
        concrete: Mapping[str, str] | None = None,
        rules: RuleSet = TRAIN_RULES,
        *,
        seed: int | str | None = None,
    ) -> list[InstructionExample]:
        if rules.name not in PROMPTS:
            raise InvalidValueError(
                f"no endpoint prompt for rule set {rules.name!r}; known: {', '.join(PROMPTS)}"
            )
        prompt, how = PROMPTS[rules.name]
        prompts = [
            prompt.format(template=template, how=how[template], instruction=ex.marked()) for ex in examples
        ]
        forbidden = split_vocabulary(rules)
        answers = self._generate(prompts, request_seed(self.seed if seed is None else seed, rules, template))
        out = []
        for ex, ans in zip(examples, answers, strict=True):
            try:
                if ans is None:
                    raise CITDataError("no answer")
                text, spans = parse_markup(ans.strip(), "endpoint rewrite")
                if len(spans) != len(ex.key_spans):
                    raise CITDataError("key parts lost")
                if added_words(ex.instruction, text) & forbidden:
                    self.crossed += 1
                    raise CITDataError("the other split's wording")
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
    seed: int | str | None = None,
) -> dict[str, list[InstructionExample]]:
    """``{template: rewritten examples}`` for every template (``rules``, or ``rewriter`` when given,
    with the prompt of ``rules``' split and ``seed``, falling back to ``rules``)."""
    for t in templates:
        if t not in TEMPLATES:
            raise InvalidValueError(f"unknown rewrite template {t!r}; known: {', '.join(TEMPLATES)}")
    if rewriter is not None:
        return {t: rewriter.rewrite(examples, t, concrete, rules, seed=seed) for t in templates}
    return {t: [rewrite_rules(ex, t, concrete, rules) for ex in examples] for t in templates}
