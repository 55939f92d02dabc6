import json

import pytest

from posttrain.rewards import get_reward
from posttrain.tasks import get_task
from posttrain_lab.recipes.aparl.dialogue_events import (
    BUSINESSES,
    EVENTS,
    NOISE,
    TEMPLATES,
    VOCAB,
    DatasetError,
    classification_scores,
    parse_label,
)


def test_twenty_events_every_business_has_templates():
    assert len(EVENTS) == 20 == len(set(EVENTS))
    assert set(TEMPLATES) == set(EVENTS)
    for ev in EVENTS:
        assert set(TEMPLATES[ev]) == set(BUSINESSES) and len(BUSINESSES) >= 3


def test_generator_deterministic_per_seed():
    a = get_task("dialogue-events", n_train=50, n_heldout=20, n_ood=20, seed=3)
    b = get_task("dialogue-events", n_train=50, n_heldout=20, n_ood=20, seed=3)
    c = get_task("dialogue-events", n_train=50, n_heldout=20, n_ood=20, seed=4)
    for s in ("train", "heldout", "ood"):
        assert a.split(s) == b.split(s)
    assert a.split("train") != c.split("train")


def test_ood_business_shares_no_template_or_noise_with_training():
    t = get_task("dialogue-events", n_train=300, n_heldout=50, n_ood=100, ood_business="pharmacy")
    train_templates = {
        TEMPLATES[e][b][k] for e in EVENTS for b in BUSINESSES if b != "pharmacy" for k in range(2)
    }
    ood_templates = {tpl for e in EVENTS for tpl in TEMPLATES[e]["pharmacy"]}
    assert not train_templates & ood_templates
    assert not set(NOISE["pharmacy"]) & {n for b in BUSINESSES if b != "pharmacy" for n in NOISE[b]}
    assert {e.meta["business"] for e in t.split("train") + t.split("heldout")} == {"food", "grocery"}
    assert {e.meta["business"] for e in t.split("ood")} == {"pharmacy"}
    # the OOD key turns are the OOD business's templates (its items), never a training one
    ood_items = [
        i for i in VOCAB["pharmacy"]["item"] if i not in VOCAB["food"]["item"] + VOCAB["grocery"]["item"]
    ]
    assert any(any(i in e.prompt for i in ood_items) for e in t.split("ood"))
    assert not set(t.split("train")[0].prompt.split("\n")) & {x.prompt for x in t.split("ood")}


def test_splits_disjoint_sizes_and_short_prompts():
    t = get_task("dialogue-events", n_train=400, n_heldout=100, n_ood=50)
    tr, ho, ood = t.split("train"), t.split("heldout"), t.split("ood")
    assert (len(tr), len(ho), len(ood)) == (400, 100, 50)
    assert not {e.prompt for e in tr} & {e.prompt for e in ho}
    assert all(e.answer in EVENTS and e.prompt.endswith("\nevent:") for e in tr + ho + ood)
    assert max(len(e.prompt) for e in tr + ho + ood) < 120  # char-level tiny preset
    assert len({e.answer for e in tr}) == 20
    assert t.describe()["sizes"] == {"train": 400, "heldout": 100, "ood": 50}


def test_other_tasks_have_no_ood_split():
    with pytest.raises(ValueError, match="unknown split 'ood'; accepted: train, heldout"):
        get_task("arithmetic").split("ood")


def test_reward_correct_minus_format_penalty():
    t = get_task("dialogue-events", n_train=5, n_heldout=1, n_ood=1)
    ex = t.split("train")[0]
    other = next(e for e in EVENTS if e != ex.answer)
    r = get_reward("event_label")
    assert r(ex.answer, ex) == 1.0
    assert r(f" {ex.answer}\nmore", ex) == 1.0
    assert r(other, ex) == 0.0
    assert r("banana", ex) == -1.0 and r("", ex) == -1.0
    assert get_reward("event_label", format_penalty=0.5)("??", ex) == -0.5
    assert t.default_reward == "event_label"


def test_classification_scores_closed_form():
    golds = ["a", "a", "b", "c"]
    preds = ["a", "b", "b", None]
    s = classification_scores(
        preds,
        golds,
    )
    # F1: a = 2/(2+0+1) = 2/3; b = 2/(2+1+0) = 2/3; c = 0 -> macro 4/9
    assert s["accuracy"] == pytest.approx(0.5)
    assert s["macro_f1"] == pytest.approx(4 / 9)
    assert s["invalid"] == pytest.approx(0.25)
    assert parse_label("late\nxx") == "late" and parse_label("later") is None


def _write(tmp_path, rows):
    p = tmp_path / "d.jsonl"
    p.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return p


def test_jsonl_loader(tmp_path):
    rows = [
        {"dialogue": f"C: hi {i}\nC: my order is late", "label": "late", "business": "food"}
        for i in range(40)
    ] + [{"dialogue": ["C: hello", "C: refund me"], "label": "refund", "business": "hotel"}]
    t = get_task(
        "dialogue-events", path=str(_write(tmp_path, rows)), ood_business="hotel", heldout_fraction=0.3
    )
    assert len(t.split("train")) + len(t.split("heldout")) == 40 and t.split("heldout")
    assert t.split("ood")[0].prompt == "C: hello\nC: refund me\nevent:"
    assert t.split("ood")[0].answer == "refund"


@pytest.mark.parametrize(
    ("row", "msg"),
    [
        ("{not json", "row 2: invalid JSON"),
        ('["x"]', "row 2: expected a JSON object"),
        ({"dialogue": "C: x", "label": "late"}, "row 2: missing key 'business'"),
        ({"dialogue": 5, "label": "late", "business": "food"}, "row 2: key 'dialogue' must be"),
        ({"dialogue": "C: x", "label": "nope", "business": "food"}, "row 2: key 'label' must be one of"),
        ({"dialogue": "C: x", "label": "late", "business": ""}, "row 2: key 'business'"),
    ],
)
def test_jsonl_bad_rows_named(tmp_path, row, msg):
    good = {"dialogue": "C: y", "label": "late", "business": "pharmacy"}
    p = _write(tmp_path, [good, row])
    with pytest.raises(DatasetError, match=msg) as e:
        get_task("dialogue-events", path=str(p)).split("train")
    assert str(p) in str(e.value)
