"""TRL-style inputs to RLTrainer (issue 41 item 20): ``task=`` a list of row dicts, a list of Example,
a ``datasets.Dataset`` / ``DatasetDict`` (the jsonl task's column mapping, TRL's column names found),
and ``reward=`` a TRL-signature function ``(completions, **kwargs) -> list[float]``, through one real
step of the tiny model; anything else is refused in one line before a model loads."""

from __future__ import annotations

import pytest
from _train_helpers import RL_BASE

from posttrain import Example
from posttrain.rewards.callables import TRLReward, as_reward_fn
from posttrain.tasks import ExamplesTask, RowsTask, as_task
from posttrain.train.config import load_rl_config
from posttrain.train.rl import RLTrainer
from posttrain.utils.errors import InvalidTypeError, InvalidValueError

pytestmark = pytest.mark.filterwarnings("ignore::posttrain.train.rl.DegenerateSettingWarning")

TRL_ROWS = [{"prompt": f"{i}+1=", "answer": str(i + 1), "level": i % 3} for i in range(20)]


def trl_reward(completions, answer, **kwargs):
    """TRL's reward signature: a batch in, a list of floats out; dataset columns as keyword lists."""
    return [float(c.strip().startswith(a)) for c, a in zip(completions, answer, strict=True)]


seen_kwargs: list[dict] = []


def recording_reward(prompts, completions, **kwargs):
    seen_kwargs.append({"prompts": prompts, "completions": completions, **kwargs})
    return [0.5]


def _cfg(tmp_path):
    return load_rl_config(None, [*RL_BASE, "steps=1", "eval.at_end=false", f"out_dir={tmp_path / 'run'}"])


def test_rows_and_a_trl_reward_train_one_step(tmp_path):
    with RLTrainer(_cfg(tmp_path), task=TRL_ROWS, reward=trl_reward) as tr:
        assert isinstance(tr.task, RowsTask) and isinstance(tr.reward_fn, TRLReward)
        train, held = tr.task.split("train"), tr.task.split("heldout")
        assert len(train) + len(held) == 20 and len(held) == 2  # the jsonl task's 10 % held out
        assert tr.train(progress=False)["steps"] == 1


def test_a_datasets_dataset_and_dataset_dict_are_tasks(tmp_path):
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_list(TRL_ROWS)
    t = as_task(ds)
    assert isinstance(t, RowsTask) and t.split("train")[0].answer in {r["answer"] for r in TRL_ROWS}
    dd = datasets.DatasetDict({"train": ds, "test": datasets.Dataset.from_list(TRL_ROWS[:3])})
    with pytest.warns(UserWarning, match="removed 3 train row"):
        t = as_task(dd)
    assert len(t.split("heldout")) == 3 and len(t.split("train")) == 17  # test prompts left out of train
    with RLTrainer(_cfg(tmp_path), task=ds, reward=trl_reward) as tr:
        assert tr.train(progress=False)["steps"] == 1


def test_a_reward_name_is_a_reward():
    from posttrain.rewards import get_reward

    assert type(as_reward_fn("numeric")) is type(get_reward("numeric"))


def test_a_list_of_examples_is_a_task():
    exs = [Example(id=f"e{i}", prompt=f"{i}+2=", answer=str(i + 2)) for i in range(10)]
    t = as_task(exs)
    assert isinstance(t, ExamplesTask)
    train, held = t.split("train"), t.split("heldout")
    assert len(held) == 1 and {e.id for e in train} | {e.id for e in held} == {e.id for e in exs}


def test_a_trl_reward_gets_the_rows_columns_as_keyword_lists():
    seen_kwargs.clear()
    ex = as_task(TRL_ROWS).split("train")[0]
    assert as_reward_fn(recording_reward)("done", ex) == 0.5
    (kw,) = seen_kwargs
    assert kw["prompts"] == [ex.prompt] and kw["completions"] == ["done"]
    assert kw["answer"] == [ex.answer] and kw["level"] == [int(ex.prompt.split("+")[0]) % 3]
    # a reward returning more (or fewer) values than completions: named
    with pytest.raises(InvalidValueError, match="expected a list of one value"):
        as_reward_fn(lambda completions, **kw: [1.0, 0.0])("x", ex)


@pytest.mark.parametrize(
    ("kw", "error", "needle"),
    [
        ({"task": 42}, InvalidTypeError, "RLTrainer(task=...): expected a posttrain.tasks.Task, a list"),
        ({"task": []}, InvalidValueError, "RLTrainer(task=...): an empty list"),
        (
            {"task": [{"prompt": "1+1="}]},
            InvalidValueError,
            "the rows have no answer column (columns: prompt)",
        ),
        ({"task": [{"text": "x", "answer": "1"}]}, InvalidValueError, "the rows have no prompt column"),
        ({"task": [TRL_ROWS[0], "2+2="]}, InvalidTypeError, "item 1 is str where item 0 is dict"),
        ({"reward": 3}, InvalidTypeError, "RLTrainer(reward=...): expected a callable"),
        ({"reward": lambda text: 1.0}, InvalidTypeError, "cannot be called as (completion, example)"),
    ],
)
def test_other_inputs_are_refused_in_one_line_before_a_model_loads(tmp_path, monkeypatch, kw, error, needle):
    from posttrain.train import builder

    def no_model(*a, **k):
        raise AssertionError("a model was loaded before the refusal")

    monkeypatch.setattr(builder, "load_policy", no_model)
    with pytest.raises(error) as e:
        RLTrainer(_cfg(tmp_path), **kw)
    assert needle in str(e.value) and "\n" not in str(e.value)
