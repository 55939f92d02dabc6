"""`dialogue-events`: abnormal-event detection in customer-service dialogues, with an OOD business.

The setting of APARL (arXiv:2507.01327, §3 problem formulation as summarised there): the state is a
sliding window of the dialogue's last turns, the action one of **M = 20** event types, the reward an
accuracy term minus a format penalty. The paper's data (Meituan food-delivery dialogues) is not public,
so this module generates dialogues from templates — or loads real ones from JSONL.

Generator (deterministic per ``seed``): each dialogue belongs to one *business* (``food``, ``grocery``,
``pharmacy``); every business has its own vocabulary (items, staff, units) and its own customer
templates for every event type, so no template string is shared between businesses. A dialogue is a
few noise turns (greetings, order numbers, agent boilerplate, from the business's own noise set),
then the customer turn that reveals the event (a template with slot values), then maybe an agent
reply. The prompt is the last ``window`` turns (the sliding window) followed by ``event:``; the gold
answer is the event label, e.g. ``late``.

Splits: ``train`` and ``heldout`` (in-domain: the training businesses, disjoint prompts) and ``ood``
(the held-out business ``ood_business``, never seen in training). The task interface's split names
are extended with ``ood`` (:data:`posttrain.tasks.base.OPTIONAL_SPLITS`).

Reward (``event_label``, :mod:`posttrain_lab.recipes.aparl.events_reward`): 1 for the gold label, 0 for another valid
label, ``−format_penalty`` (default 1, λ_fmt of APARL's reward ``R = acc − λ_fmt·1[format invalid]``)
when the first line of the completion is not one of the 20 labels. :func:`classification_scores`
gives accuracy and macro-F1 (the paper's metric) from predictions; :func:`posttrain_lab.recipes.aparl.event_eval.evaluate_event_detection`
runs a policy greedily on the in-domain and OOD splits.

JSONL (``path=...``; read like the ``jsonl`` task's files, so ``.json`` arrays and ``.parquet`` work
too): one object per row with ``dialogue`` (a string with turns separated by
newlines, or a list of turn strings), ``label`` (one of :data:`EVENTS`, or any label when ``labels``
is given) and ``business``; rows of ``ood_business`` form the ``ood`` split, the others are split
into train / heldout by ``heldout_fraction``. Bad rows raise :class:`DatasetError` naming the file,
the 1-based row and the key.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from posttrain.tasks.base import Example, Task, check_split_sizes, register_task
from posttrain.tasks.jsonl import DatasetError, read_raw_rows
from posttrain.utils.errors import InvalidValueError

#: The 20 event types (short labels: the tiny presets are character-level).
EVENTS: tuple[str, ...] = (
    "late",
    "missing",
    "wrong",
    "damaged",
    "cancel",
    "refund",
    "dblcharge",
    "payfail",
    "address",
    "notrecvd",
    "rude",
    "coupon",
    "quality",
    "safety",
    "account",
    "invoice",
    "overprice",
    "nocontact",
    "resched",
    "praise",
)

#: Per business: vocabulary (slot values) and noise turns. Slots: {item}, {who}, {n}, {t}.
VOCAB: dict[str, dict[str, list[str]]] = {
    "food": {
        "item": ["pizza", "noodles", "burger", "sushi", "curry", "salad", "tacos", "dumplings"],
        "who": ["rider", "courier"],
        "t": ["lunch", "dinner"],
    },
    "grocery": {
        "item": ["milk", "eggs", "apples", "rice", "bread", "coffee", "yogurt", "bananas"],
        "who": ["driver", "shopper"],
        "t": ["morning slot", "evening slot"],
    },
    "pharmacy": {
        "item": ["insulin", "vitamins", "inhaler", "bandages", "eye drops", "cough syrup", "pills"],
        "who": ["pharmacist", "delivery agent"],
        "t": ["refill", "prescription"],
    },
}

NOISE: dict[str, list[str]] = {
    "food": [
        "A: hi, food support here",
        "C: hello",
        "A: which order is it?",
        "C: order {n}",
        "A: let me check the restaurant",
        "C: ok thanks",
    ],
    "grocery": [
        "A: welcome to grocery help",
        "C: hey there",
        "A: may I have the basket id?",
        "C: basket {n}",
        "A: one moment please",
        "C: sure",
    ],
    "pharmacy": [
        "A: pharmacy care, how can I help",
        "C: good day",
        "A: your script number please",
        "C: script {n}",
        "A: checking your record",
        "C: alright",
    ],
}

AGENT_REPLY: dict[str, list[str]] = {
    "food": ["A: sorry about that", "A: I will look into it"],
    "grocery": ["A: apologies for this", "A: let me fix it"],
    "pharmacy": ["A: I understand your concern", "A: I will escalate this"],
}

#: Customer templates: event -> business -> templates. No string is shared between businesses.
TEMPLATES: dict[str, dict[str, list[str]]] = {
    "late": {
        "food": ["C: my {item} is {n} min late", "C: still waiting for {item}, it is late"],
        "grocery": ["C: the {t} passed and no {item} yet", "C: groceries are late by {n} min"],
        "pharmacy": ["C: my {item} should have come {n} hours ago", "C: the {t} delivery is late"],
    },
    "missing": {
        "food": ["C: the {item} is missing from my bag", "C: you forgot my {item}"],
        "grocery": ["C: no {item} in the basket", "C: {item} missing from my groceries"],
        "pharmacy": ["C: the {item} was not in the package", "C: one box of {item} is missing"],
    },
    "wrong": {
        "food": ["C: I got someone else's {item}", "C: this is the wrong order"],
        "grocery": ["C: I ordered {item} but got something else", "C: wrong brand of {item}"],
        "pharmacy": ["C: this is not my {item}", "C: wrong dose of {item} sent"],
    },
    "damaged": {
        "food": ["C: the {item} box was crushed", "C: food spilled all over the bag"],
        "grocery": ["C: the {item} arrived broken", "C: half the {item} are smashed"],
        "pharmacy": ["C: the {item} pack is torn open", "C: the {item} bottle leaked"],
    },
    "cancel": {
        "food": ["C: please cancel my {item}", "C: cancel the order now"],
        "grocery": ["C: I want to cancel the basket", "C: stop my {t} order"],
        "pharmacy": ["C: cancel my {t} please", "C: I no longer need the {item}, cancel it"],
    },
    "refund": {
        "food": ["C: I want my money back for the {item}", "C: refund me please"],
        "grocery": ["C: give me a refund for the {item}", "C: when do I get my refund"],
        "pharmacy": ["C: I need a refund on the {item}", "C: refund the {t} charge"],
    },
    "dblcharge": {
        "food": ["C: I was charged twice for {item}", "C: two charges on my card"],
        "grocery": ["C: my card got billed two times", "C: double payment for the basket"],
        "pharmacy": ["C: the {t} was charged twice", "C: I see a duplicate charge"],
    },
    "payfail": {
        "food": ["C: payment keeps failing", "C: my card was declined at checkout"],
        "grocery": ["C: checkout error when I pay", "C: cannot pay for the basket"],
        "pharmacy": ["C: payment for the {t} did not go through", "C: the pay button gives an error"],
    },
    "address": {
        "food": ["C: wrong address, send it to my office", "C: change the drop off address"],
        "grocery": ["C: please deliver to my new flat", "C: update my delivery address"],
        "pharmacy": ["C: ship the {item} to my other home", "C: my address changed, fix it"],
    },
    "notrecvd": {
        "food": ["C: app says delivered but no {item}", "C: I never got the food"],
        "grocery": ["C: marked delivered, nothing at my door", "C: the basket never arrived"],
        "pharmacy": ["C: I did not receive the {item}", "C: says dropped off but I have nothing"],
    },
    "rude": {
        "food": ["C: the {who} yelled at me", "C: your {who} was very rude"],
        "grocery": ["C: the {who} was impolite", "C: the {who} insulted me"],
        "pharmacy": ["C: the {who} was rude on the phone", "C: the {who} was disrespectful"],
    },
    "coupon": {
        "food": ["C: my coupon did not apply", "C: the promo code is not working"],
        "grocery": ["C: voucher was rejected", "C: the discount code failed"],
        "pharmacy": ["C: my coupon for {item} was refused", "C: the savings code does not work"],
    },
    "quality": {
        "food": ["C: the {item} was cold and soggy", "C: the {item} tastes bad"],
        "grocery": ["C: the {item} is stale", "C: the {item} went off already"],
        "pharmacy": ["C: the {item} looks expired", "C: the {item} seal looks old"],
    },
    "safety": {
        "food": ["C: I found a hair in my {item}", "C: I got sick after the {item}"],
        "grocery": ["C: there was glass in the {item}", "C: the {item} made my kid ill"],
        "pharmacy": ["C: I had a reaction to the {item}", "C: the {item} caused a rash"],
    },
    "account": {
        "food": ["C: I cannot log in to my account", "C: my account got locked"],
        "grocery": ["C: password reset does not work", "C: someone hacked my profile"],
        "pharmacy": ["C: I am locked out of my patient login", "C: my profile shows wrong name"],
    },
    "invoice": {
        "food": ["C: I need a receipt for the {item}", "C: send me an invoice"],
        "grocery": ["C: please email the bill", "C: where is my receipt for the basket"],
        "pharmacy": ["C: I need a receipt for insurance", "C: send the {t} invoice"],
    },
    "overprice": {
        "food": ["C: the {item} cost more than the menu", "C: I was overcharged {n} cents"],
        "grocery": ["C: the {item} price was higher at checkout", "C: you billed more than shown"],
        "pharmacy": ["C: the {item} cost more than quoted", "C: my copay was too high"],
    },
    "nocontact": {
        "food": ["C: I cannot reach the {who}", "C: the {who} does not answer"],
        "grocery": ["C: the {who} never picks up", "C: no way to call the {who}"],
        "pharmacy": ["C: the {who} is not answering calls", "C: I tried the {who} {n} times"],
    },
    "resched": {
        "food": ["C: can you bring it at {n} pm instead", "C: deliver the {item} later please"],
        "grocery": ["C: move my basket to the {t}", "C: change my delivery slot"],
        "pharmacy": ["C: move the {t} to next week", "C: deliver the {item} on friday instead"],
    },
    "praise": {
        "food": ["C: the {who} was great, thanks", "C: the {item} was perfect"],
        "grocery": ["C: the {who} was so helpful", "C: fresh {item}, great job"],
        "pharmacy": ["C: the {who} was very kind", "C: fast {t}, thank you"],
    },
}

BUSINESSES: tuple[str, ...] = tuple(VOCAB)


# ---------------------------------------------------------------------------------------- scoring
def parse_label(completion: str, labels: Sequence[str] = EVENTS) -> str | None:
    """The predicted label: the completion's first line, stripped; None when it is not a valid label."""
    got = completion.lstrip("\n").split("\n", 1)[0].strip()
    return got if got in labels else None


def event_reward(
    completion: str, gold: str, *, labels: Sequence[str] = EVENTS, format_penalty: float = 1.0
) -> float:
    """APARL's reward (arXiv:2507.01327, as summarised): ``1[pred = gold] − λ_fmt·1[format invalid]``."""
    pred = parse_label(completion, labels)
    if pred is None:
        return -float(format_penalty)
    return 1.0 if pred == gold else 0.0


def classification_scores(preds: Sequence[str | None], golds: Sequence[str]) -> dict[str, float]:
    """Accuracy, macro-F1 and the invalid share of label predictions (None = invalid format).

    Macro-F1 is the unweighted mean of per-label F1 over the labels that occur as gold or as a valid
    prediction (an invalid prediction is a miss for its gold label and a false positive for none)."""
    if len(preds) != len(golds):
        raise InvalidValueError(
            f"classification_scores: {len(preds)} predictions for {len(golds)} gold labels"
        )
    if not golds:
        raise InvalidValueError("classification_scores: no examples")
    labels = sorted({*golds, *(p for p in preds if p is not None)})
    f1s = []
    for lab in labels:
        tp = sum(p == lab and g == lab for p, g in zip(preds, golds, strict=True))
        fp = sum(p == lab and g != lab for p, g in zip(preds, golds, strict=True))
        fn = sum(p != lab and g == lab for p, g in zip(preds, golds, strict=True))
        f1s.append(2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0)
    return {
        "accuracy": sum(p == g for p, g in zip(preds, golds, strict=True)) / len(golds),
        "macro_f1": sum(f1s) / len(f1s),
        "invalid": sum(p is None for p in preds) / len(golds),
        "n": float(len(golds)),
    }


# -------------------------------------------------------------------------------------------- task
@register_task("dialogue-events", aliases=("dialogue_events",))
class DialogueEventsTask(Task):
    """Event detection in dialogues; splits ``train``, ``heldout`` (in-domain) and ``ood``."""

    name = "dialogue-events"
    default_reward = "event_label"
    splits = ("train", "heldout", "ood")

    def __init__(
        self,
        n_train: int = 2000,
        n_heldout: int = 200,
        n_ood: int = 200,
        seed: int = 0,
        ood_business: str = "pharmacy",
        window: int = 2,
        max_noise: int = 2,
        path: str | None = None,
        heldout_fraction: float = 0.1,
        labels: list[str] | None = None,
    ) -> None:
        super().__init__()
        check_split_sizes("dialogue-events", n_train=n_train, n_heldout=n_heldout, n_ood=n_ood)
        if not isinstance(window, int) or window < 1:
            raise InvalidValueError(f"task 'dialogue-events': window must be an integer >= 1, got {window!r}")
        if not isinstance(max_noise, int) or max_noise < 0:
            raise InvalidValueError(
                f"task 'dialogue-events': max_noise must be an integer >= 0, got {max_noise!r}"
            )
        if path is None and ood_business not in BUSINESSES:
            raise InvalidValueError(
                f"task 'dialogue-events': ood_business must be one of {', '.join(BUSINESSES)}, got {ood_business!r}"
            )
        if not 0 < heldout_fraction < 1:
            raise InvalidValueError(
                f"task 'dialogue-events': heldout_fraction must lie in (0, 1), got {heldout_fraction!r}"
            )
        self.n_train, self.n_heldout, self.n_ood, self.seed = n_train, n_heldout, n_ood, seed
        self.ood_business, self.window, self.max_noise = ood_business, window, max_noise
        self.path, self.heldout_fraction = path, heldout_fraction
        self.labels: tuple[str, ...] = tuple(labels) if labels else EVENTS

    def params(self) -> dict[str, Any]:
        return {
            "n_train": self.n_train,
            "n_heldout": self.n_heldout,
            "n_ood": self.n_ood,
            "seed": self.seed,
            "ood_business": self.ood_business,
            "window": self.window,
            "max_noise": self.max_noise,
            "path": self.path,
            "heldout_fraction": self.heldout_fraction,
        }

    # -- generation ---------------------------------------------------------------------------
    def dialogue(self, rng: random.Random, business: str, event: str) -> tuple[list[str], int]:
        """(turns, template index) of one generated dialogue."""
        vocab = VOCAB[business]

        def fill(t: str) -> str:
            return t.format(
                item=rng.choice(vocab["item"]),
                who=rng.choice(vocab["who"]),
                t=rng.choice(vocab["t"]),
                n=rng.randint(10, 99),
            )

        k = rng.randrange(len(TEMPLATES[event][business]))
        noise = [fill(rng.choice(NOISE[business])) for _ in range(rng.randint(0, self.max_noise))]
        turns = [*noise, fill(TEMPLATES[event][business][k])]
        if rng.random() < 0.5:
            turns.append(rng.choice(AGENT_REPLY[business]))
        return turns, k

    def _example(self, turns: list[str], label: str, business: str, id: str, **meta: Any) -> Example:
        prompt = "\n".join(turns[-self.window :]) + "\nevent:"
        if self.labels != EVENTS:
            meta["labels"] = list(self.labels)
        return Example(id=id, prompt=prompt, answer=label, meta={"business": business, **meta})

    def _generate(self, businesses: list[str], n: int, tag: str, seen: set[str]) -> list[Example]:
        rng = random.Random(f"dialogue-events:{self.seed}:{tag}")
        out: list[Example] = []
        tries = 0
        while len(out) < n:
            tries += 1
            if tries > 50 * n + 1000:
                raise InvalidValueError(
                    f"task 'dialogue-events': cannot draw {n} distinct {tag} dialogues (lower n_{tag} or raise window)"
                )
            business = businesses[len(out) % len(businesses)] if tries % 2 else rng.choice(businesses)
            event = rng.choice(EVENTS)
            turns, k = self.dialogue(rng, business, event)
            ex = self._example(turns, event, business, f"dialogue-events-{tag}-{len(out)}", template=k)
            if ex.prompt in seen:
                continue
            seen.add(ex.prompt)
            out.append(ex)
        return out

    def _build_splits(self) -> dict[str, list[Example]]:
        if self.path is not None:
            return self._load()
        inside = [b for b in BUSINESSES if b != self.ood_business]
        seen: set[str] = set()
        heldout = self._generate(inside, self.n_heldout, "heldout", seen)  # first: independent of n_train
        train = self._generate(inside, self.n_train, "train", seen)
        ood = self._generate([self.ood_business], self.n_ood, "ood", set())
        return {"train": train, "heldout": heldout, "ood": ood}

    def reference_completion(self, example: Example, style: str = "short") -> str:
        return example.answer

    # -- JSONL --------------------------------------------------------------------------------
    def _load(self) -> dict[str, list[Example]]:
        path = Path(self.path)  # type: ignore[arg-type]
        if not path.is_file():
            raise DatasetError(f"{path}: no such file (task 'dialogue-events', param 'path')")
        rows: list[tuple[list[str], str, str]] = []
        for i, obj in read_raw_rows(path):
            if isinstance(obj, DatasetError):
                raise obj
            where = f"{path}: row {i}"
            if not isinstance(obj, dict):
                raise DatasetError(f"{where}: expected a JSON object, got {type(obj).__name__}")
            for key in ("dialogue", "label", "business"):
                if key not in obj:
                    raise DatasetError(f"{where}: missing key {key!r} (expected dialogue, label, business)")
            d = obj["dialogue"]
            if isinstance(d, str):
                turns = [t for t in d.split("\n") if t.strip()]
            elif isinstance(d, list) and all(isinstance(t, str) for t in d):
                turns = [t for t in d if t.strip()]
            else:
                raise DatasetError(f"{where}: key 'dialogue' must be a string or a list of strings")
            if not turns:
                raise DatasetError(f"{where}: key 'dialogue' is empty")
            label, business = obj["label"], obj["business"]
            if not isinstance(label, str) or label not in self.labels:
                raise DatasetError(
                    f"{where}: key 'label' must be one of {', '.join(self.labels)} (or set the task's "
                    f"'labels'), got {label!r}"
                )
            if not isinstance(business, str) or not business.strip():
                raise DatasetError(f"{where}: key 'business' must be a non-empty string, got {business!r}")
            rows.append((turns, label, business))
        if not rows:
            raise DatasetError(f"{path}: no rows")
        ood = [r for r in rows if r[2] == self.ood_business]
        inside = [r for r in rows if r[2] != self.ood_business]
        if not ood:
            found = sorted({r[2] for r in rows})
            raise DatasetError(
                f"{path}: no row of ood_business {self.ood_business!r}; businesses found: {', '.join(found)}"
            )

        def held(turns: list[str]) -> bool:  # seeded, per prompt: a prompt never lands in both splits
            key = f"{self.seed}:" + "\n".join(turns[-self.window :])
            return int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) / 16**8 < self.heldout_fraction

        def mk(part: list[tuple[list[str], str, str]], tag: str) -> list[Example]:
            return [
                self._example(t, lab, b, f"dialogue-events-{tag}-{j}") for j, (t, lab, b) in enumerate(part)
            ]

        return {
            "train": mk([r for r in inside if not held(r[0])], "train"),
            "heldout": mk([r for r in inside if held(r[0])], "heldout"),
            "ood": mk(ood, "ood"),
        }


def __getattr__(name: str) -> Any:
    """``evaluate_event_detection`` moved to :mod:`posttrain_lab.recipes.aparl.event_eval` (a task does not import
    the trainer: layers point down); the old name works for one release with a DeprecationWarning."""
    if name == "evaluate_event_detection":
        import importlib
        import warnings

        warnings.warn(
            "posttrain_lab.recipes.aparl.dialogue_events.evaluate_event_detection moved to "
            "posttrain_lab.recipes.aparl.event_eval.evaluate_event_detection",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.import_module("posttrain_lab.recipes.aparl.event_eval").evaluate_event_detection
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
