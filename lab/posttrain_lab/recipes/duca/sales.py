"""Built-in environment ``sales``: a rule-based simulated customer for a multi-turn sales agent.

The setting follows DuCA (arXiv 2603.01481): a sales agent is trained over whole conversations with
turn-level rewards (fluency/format, compliance, no repetition, never disclosing that it is a bot) and a
session-level reward (conversion). The paper's simulator is an LLM; this one is a small rule-based
customer so that runs are cheap, deterministic per seed and checkable.

Scenario (a :class:`SalesTask` example): a customer with a hidden **need** (a product category) and a
**budget**. The store sells :data:`CATALOG` (two products per category, a cheap and a premium one).

Customer rules, per agent turn (deterministic given the reset seed):

0. The agent names MORE than one distinct product in a turn (``multi_offer: decline``, default):
   the customer declines ("Please recommend just one."), reveals nothing and buys nothing. Before the 2026-12-01 fixes
   (``multi_offer: allow``) naming the whole catalogue (it is in the prompt) converted every scenario
   on the first turn.
1. The agent names one product (``Aero``, ``Titan``, ...): if it is of the needed category and within
   the budget, the customer buys it with probability ``accept_prob`` — **conversion**, ``done``,
   session reward 1 — else hesitates ("I'm not sure about the Aero yet.", the offer may be repeated
   on a later turn). ``accept_prob < 1`` is the noise that lets a competent seller convert only
   sometimes. Otherwise the customer declines and reveals the cue that rules it out (wrong category
   -> the need; too expensive -> the budget).
2. Otherwise, if the agent asks a question (``?``), the customer reveals the next hidden cue (need
   first, then budget); without a question a cue is revealed with probability ``cue_prob``, else a
   non-committal reply.
3. On turn ``max_turns`` the session ends without conversion (session reward 0) unless rule 1 sold.

Turn criteria (0 = fine, −1 = violated; all four every turn):

=================== =====================================================================
``repetition``      a sentence of this turn repeats a sentence of an earlier agent turn
``ai_disclosure``   the agent says it is an AI / bot / language model / virtual assistant
``forbidden_claim`` a non-compliant claim (guarantees, "100%", "risk-free", "best in the world", ...)
``format``          empty, longer than ``max_words`` words, a role marker (``Customer:``), or
                    mostly non-letters (fluency/format check)
=================== =====================================================================
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any

from posttrain.envs.base import Env, StepResult, register_env
from posttrain.tasks.base import Example, Task, check_split_sizes
from posttrain.utils.errors import InvalidValueError, PosttrainRuntimeError


@dataclass(frozen=True)
class Product:
    name: str
    category: str
    price: int


CATALOG: tuple[Product, ...] = (
    Product("Aero", "laptop", 600),
    Product("Titan", "laptop", 1400),
    Product("Lumo", "phone", 300),
    Product("Zenith", "phone", 900),
    Product("Echo", "headphones", 80),
    Product("Sonic", "headphones", 250),
    Product("Snap", "camera", 400),
    Product("Vista", "camera", 1100),
)
CATEGORIES: tuple[str, ...] = ("laptop", "phone", "headphones", "camera")
CRITERIA: tuple[str, ...] = ("repetition", "ai_disclosure", "forbidden_claim", "format")
MULTI_OFFER: tuple[str, ...] = ("decline", "allow")
STORE_PROMPT = "Store: " + ", ".join(f"{p.name} {p.category} ${p.price}" for p in CATALOG) + ". Sell one."
"""The scenario prompt every sales example carries (what the agent knows about the store)."""

_NAMES = ("Ana", "Ben", "Chen", "Dara", "Eli", "Fay", "Gus", "Hana", "Ivo", "Jun")
_OPENINGS = ("Hi, I want to buy something.", "Hello, I need help shopping.", "Hi there, just looking.")
_NEED_CUES = {
    "laptop": ("I need a laptop for work.", "My old laptop broke."),
    "phone": ("I need a new phone.", "My phone screen cracked."),
    "headphones": ("I want headphones for music.", "I need headphones for the gym."),
    "camera": ("I want a camera for travel.", "I need a camera for photos."),
}
_BUDGET_CUES = ("My budget is ${b}.", "I can spend up to ${b}.")
_FILLERS = ("Hmm, tell me more.", "Okay.", "I see.")

_PRODUCT_RE = re.compile(r"\b(" + "|".join(p.name for p in CATALOG) + r")\b", re.IGNORECASE)
AI_RE = re.compile(
    r"\b(i am|i'm|im|as)\s+an?\s+(ai|bot|chatbot|robot|language model|virtual assistant|assistant program)\b"
    r"|\bartificial intelligence\b|\blanguage model\b|\bi am not (a )?human\b",
    re.IGNORECASE,
)
FORBIDDEN_RE = re.compile(
    r"\bguarantee[ds]?\b|\b100\s?%|\brisk[- ]free\b|\bbest in the world\b|\bnever breaks\b"
    r"|\blifetime free\b|\bno risk\b",
    re.IGNORECASE,
)
_ROLE_RE = re.compile(r"(customer|seller|agent|user|assistant)\s*:|<\|", re.IGNORECASE)
_SENT_SPLIT = re.compile(r"[.!?\n]+")


def sentences(text: str) -> list[str]:
    """Normalised sentences (lower case, letters/digits/spaces only, at least 2 characters)."""
    out = []
    for s in _SENT_SPLIT.split(text):
        norm = " ".join(re.sub(r"[^a-z0-9 ]+", " ", s.lower()).split())
        if len(norm) >= 2:
            out.append(norm)
    return out


def format_ok(text: str, max_words: int) -> bool:
    """Fluency/format check: non-empty, at most ``max_words`` words, no role marker, mostly letters."""
    stripped = text.strip()
    if not stripped or len(stripped.split()) > max_words or _ROLE_RE.search(stripped):
        return False
    visible = [c for c in stripped if not c.isspace()]
    letters = sum(c.isalpha() for c in visible)
    return letters >= 0.5 * len(visible)


def matching_products(need: str, budget: int) -> list[str]:
    return [p.name for p in CATALOG if p.category == need and p.price <= budget]


@register_env("sales")
class SalesEnv(Env):
    """Rule-based simulated customer (see the module docstring). ``max_turns``: turn limit;
    ``cue_prob``: chance a cue is revealed on a turn without a question; ``max_words``: the format
    check's word limit; ``multi_offer``: ``decline`` (a turn naming several products is declined)
    or ``allow`` (before the 2026-12-01 fixes); ``accept_prob``: chance a fitting offer is bought; ``conversion_reward``: the session reward of a
    sale (1; e.g. 10 to test an estimator's sensitivity to the session reward's scale)."""

    criteria = CRITERIA

    def __init__(
        self,
        *,
        max_turns: int = 6,
        cue_prob: float = 0.3,
        max_words: int = 40,
        multi_offer: str = "decline",
        accept_prob: float = 1.0,
        conversion_reward: float = 1.0,
    ) -> None:
        if isinstance(conversion_reward, bool) or not isinstance(conversion_reward, int | float):
            raise InvalidValueError(
                f"environment 'sales': conversion_reward must be a number, got {conversion_reward!r}"
            )
        self.conversion_reward = float(conversion_reward)
        if multi_offer not in MULTI_OFFER:
            raise InvalidValueError(
                f"environment 'sales': multi_offer must be one of {list(MULTI_OFFER)}, got {multi_offer!r}"
            )
        if (
            isinstance(accept_prob, bool)
            or not isinstance(accept_prob, int | float)
            or not 0 < accept_prob <= 1
        ):
            raise InvalidValueError(
                f"environment 'sales': accept_prob must be in (0, 1], got {accept_prob!r}"
            )
        self.multi_offer, self.accept_prob = multi_offer, float(accept_prob)
        if isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1:
            raise InvalidValueError(f"environment 'sales': max_turns must be an int >= 1, got {max_turns!r}")
        if not 0.0 <= float(cue_prob) <= 1.0:
            raise InvalidValueError(f"environment 'sales': cue_prob must be in [0, 1], got {cue_prob!r}")
        if isinstance(max_words, bool) or not isinstance(max_words, int) or max_words < 1:
            raise InvalidValueError(f"environment 'sales': max_words must be an int >= 1, got {max_words!r}")
        self.max_turns = max_turns
        self.cue_prob = float(cue_prob)
        self.max_words = max_words
        self._rng = random.Random(0)
        self.need, self.budget, self.turn = "", 0, 0

    def reset(self, example: Any, seed: int) -> str:
        meta = getattr(example, "meta", None) or {}
        need, budget = meta.get("need"), meta.get("budget")
        if need not in CATEGORIES or isinstance(budget, bool) or not isinstance(budget, int):
            raise InvalidValueError(
                f"environment 'sales': example {getattr(example, 'id', '?')!r} needs meta.need in "
                f"{list(CATEGORIES)} and an int meta.budget, got need={need!r}, budget={budget!r}"
            )
        self._rng = random.Random(seed)
        self.need, self.budget = need, budget
        self.turn = 0
        self.converted = False
        self.sold: str | None = None
        self.revealed: list[str] = []
        self.past: set[str] = set()
        self.counts = dict.fromkeys(CRITERIA, 0)
        self.offers: list[str] = []
        self.multi_offers = 0
        return self._rng.choice(_OPENINGS)

    # ------------------------------------------------------------------------------------- cues
    def _cue(self, which: str) -> str:
        if which not in self.revealed:
            self.revealed.append(which)
        if which == "need":
            return self._rng.choice(_NEED_CUES[self.need])
        return self._rng.choice(_BUDGET_CUES).replace("{b}", str(self.budget))

    def _next_cue(self) -> str:
        for which in ("need", "budget"):
            if which not in self.revealed:
                return self._cue(which)
        return self._rng.choice(("I told you what I need.", "So, what do you suggest?"))

    # ------------------------------------------------------------------------------------- step
    def turn_rewards(self, text: str) -> dict[str, float]:
        """The four criteria for agent turn ``text`` given the earlier agent turns (0 fine, −1 not)."""
        sents = sentences(text)
        return {
            "repetition": -1.0 if any(s in self.past for s in sents) else 0.0,
            "ai_disclosure": -1.0 if AI_RE.search(text) else 0.0,
            "forbidden_claim": -1.0 if FORBIDDEN_RE.search(text) else 0.0,
            "format": 0.0 if format_ok(text, self.max_words) else -1.0,
        }

    def step(self, agent_text: str) -> StepResult:
        if self.turn >= self.max_turns or self.converted:
            raise PosttrainRuntimeError("environment 'sales': step() after the session ended; call reset()")
        self.turn += 1
        rewards = self.turn_rewards(agent_text)
        for k, v in rewards.items():
            self.counts[k] += int(v < 0)
        self.past.update(sentences(agent_text))
        named = [m.group(1).capitalize() for m in _PRODUCT_RE.finditer(agent_text)]
        self.offers.extend(named)
        good = set(matching_products(self.need, self.budget))
        obs = ""
        if self.multi_offer == "decline" and len(set(named)) > 1:
            self.multi_offers += 1
            obs = "That is a lot of products. Please recommend just one."
        elif named:
            hit = next((n for n in named if n in good), None)
            if hit is not None and (self.accept_prob >= 1.0 or self._rng.random() < self.accept_prob):
                self.converted, self.sold = True, hit
                return StepResult(
                    f"Great, I'll take the {hit}.", rewards, True, self.conversion_reward, {"sold": hit}
                )
            if hit is not None:
                obs = f"I'm not sure about the {hit} yet."
            elif (offered := next(p for p in CATALOG if p.name == named[0])).category != self.need:
                obs = f"No, not a {offered.category}. " + self._cue("need")
            else:
                obs = "That is too expensive. " + self._cue("budget")
        elif "?" in agent_text or self._rng.random() < self.cue_prob:
            obs = self._next_cue()
        else:
            obs = self._rng.choice(_FILLERS)
        if rewards["ai_disclosure"] < 0:
            obs = "Oh, you are a bot? " + obs
        if self.turn >= self.max_turns:
            return StepResult("I'll think about it. Bye.", rewards, True, 0.0)
        return StepResult(obs, rewards, False)

    def abort(self) -> float:
        return 0.0

    def summary(self) -> dict[str, Any]:
        return {
            "need": self.need,
            "budget": self.budget,
            "conversion": self.converted,
            "sold": self.sold,
            "offers": list(self.offers),
            "multi_offer_turns": self.multi_offers,
            "violations": dict(self.counts),
        }


class ScriptedSeller:
    """A deterministic rule-based seller (the SFT warm-start teacher and a test opponent): asks for
    the need, then the budget, then offers the cheapest product of the stated category within the
    stated budget. ``reply(observations)`` gets every customer message so far."""

    def reply(self, observations: list[str]) -> str:
        text = " ".join(observations).lower()
        need = next((c for c, cues in _NEED_CUES.items() if any(q.lower() in text for q in cues)), None)
        budgets = [int(b) for b in re.findall(r"\$(\d+)", text)]
        if need is None:
            return "Welcome! What are you looking for?"
        if not budgets:
            return f"A {need}, good choice. What is your budget?"
        fits = [p for p in CATALOG if p.category == need and p.price <= budgets[-1]]
        if not fits:
            return f"Sorry, no {need} fits that budget. Could you stretch it?"
        p = fits[-1]
        return f"I recommend the {p.name} {need} for ${p.price}."


class SalesTask(Task):
    """Sales scenarios for ``SalesEnv``: a customer name, a hidden need and a budget per example.

    ``prompt`` is :data:`STORE_PROMPT` (the store's catalogue; the customer speaks through the
    environment), ``answer`` the comma-separated matching products, ``meta`` ``{need, budget,
    customer}``. Train and held-out scenarios never share a (customer, need, budget) triple."""

    name = "sales"
    default_reward = "exact_match"

    BUDGETS = (100, 300, 500, 700, 900, 1000, 1200, 1500)

    def __init__(self, n_train: int = 200, n_heldout: int = 40, seed: int = 0) -> None:
        super().__init__()
        check_split_sizes("sales", n_train=n_train, n_heldout=n_heldout)
        combos = [
            (name, need, b)
            for name in _NAMES
            for need in CATEGORIES
            for b in self.BUDGETS
            if matching_products(need, b)  # every scenario can convert
        ]
        if n_train + n_heldout > len(combos):
            raise InvalidValueError(
                f"task 'sales': n_train + n_heldout = {n_train + n_heldout} exceeds the {len(combos)} "
                "distinct scenarios"
            )
        self.n_train, self.n_heldout, self.seed = n_train, n_heldout, seed
        self._combos = combos

    def params(self) -> dict[str, Any]:
        return {"n_train": self.n_train, "n_heldout": self.n_heldout, "seed": self.seed}

    def _build_splits(self) -> dict[str, list[Example]]:
        combos = list(self._combos)
        random.Random(self.seed).shuffle(combos)
        out: dict[str, list[Example]] = {}
        for split, chunk in (
            ("heldout", combos[: self.n_heldout]),
            ("train", combos[self.n_heldout : self.n_heldout + self.n_train]),
        ):
            out[split] = [
                Example(
                    id=f"sales-{split}-{i:04d}",
                    prompt=STORE_PROMPT,
                    answer=",".join(matching_products(need, b)),
                    meta={"customer": name, "need": need, "budget": b},
                )
                for i, (name, need, b) in enumerate(chunk)
            ]
        return out
