"""Datasets as users have them: a `datasets` save_to_disk directory, parquet, arrow and JSON lines as a
task (column mapping, dotted nested columns); TRL's formats (prompt as text or chat messages,
prompt/completion, messages) and verl's RL parquet layout read as they are; bad rows named by file,
row and column. (TRL's preference format: lab/tests/recipes/patarm/test_core.py.)"""

from __future__ import annotations

import json
import pickle

import pytest
from typer.testing import CliRunner

from posttrain.models import build_char_tokenizer
from posttrain.rollout import PromptFormatter
from posttrain.tasks import get_task
from posttrain.tasks.base import ChatPrompt
from posttrain.tasks.jsonl import DatasetError
from posttrain.train.sft_data import SFTDataError, read_sft_file

datasets = pytest.importorskip("datasets")

ROWS = [{"q": f"{a}+{a}=", "sol": str(2 * a)} for a in range(10)]


def _write_all(tmp_path, rows):
    """The same rows as JSON lines, parquet, arrow and a save_to_disk directory."""
    ds = datasets.Dataset.from_list(rows)
    paths = {"jsonl": tmp_path / "d.jsonl", "parquet": tmp_path / "d.parquet", "disk": tmp_path / "saved"}
    paths["jsonl"].write_text("".join(json.dumps(r) + "\n" for r in rows))
    ds.to_parquet(str(paths["parquet"]))
    ds.save_to_disk(str(paths["disk"]))
    paths["arrow"] = next(paths["disk"].glob("*.arrow"))
    return paths


def test_every_local_source_gives_the_same_task(tmp_path):
    paths = _write_all(tmp_path, ROWS)
    tasks = {
        k: get_task("jsonl", path=str(p), prompt_field="q", answer_field="sol", heldout_fraction=0.2)
        for k, p in paths.items()
    }
    want = [(e.prompt, e.answer) for e in tasks["jsonl"].split("train")]
    assert len(want) == 8
    for k, t in tasks.items():
        assert [(e.prompt, e.answer) for e in t.split("train")] == want, k
    assert {e.meta["row"] for e in tasks["disk"].split("train")} <= set(range(1, 11))


def test_datasetdict_directory_needs_a_split(tmp_path):
    dd = datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(ROWS), "test": datasets.Dataset.from_list(ROWS[:3])}
    )
    dd.save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(DatasetError, match=r"splits train, test; pass one split's directory"):
        get_task("jsonl", path=str(tmp_path / "dd"), prompt_field="q", answer_field="sol")
    t = get_task(
        "jsonl",
        path=str(tmp_path / "dd" / "train"),
        heldout_path=str(tmp_path / "dd" / "test"),
        prompt_field="q",
        answer_field="sol",
    )
    assert len(t.split("heldout")) == 3 and len(t.split("train")) == 7
    with pytest.raises(DatasetError, match="is a directory but not a dataset"):
        get_task("jsonl", path=str(tmp_path), prompt_field="q", answer_field="sol")


def _verl_rows():
    return [
        {
            "data_source": "openai/gsm8k",
            "prompt": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": f"What is {a}+{a}?"},
            ],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(2 * a)},
            "extra_info": {"split": "train", "index": a},
        }
        for a in range(6)
    ]


def test_verl_parquet_layout_reads_as_it_is(tmp_path):
    path = tmp_path / "train.parquet"
    datasets.Dataset.from_list(_verl_rows()).to_parquet(str(path))
    t = get_task("jsonl", path=str(path), layout="verl", heldout_fraction=0.0)
    ex = t.split("train")[0]
    assert ex.answer == "0" and ex.meta["data_source"] == "openai/gsm8k"
    assert ex.meta["extra_info"]["index"] == 0 and ex.meta["ability"] == "math"
    assert isinstance(ex.prompt, ChatPrompt)
    assert ex.prompt.messages == (("system", "Be brief."), ("user", "What is 0+0?"))
    # the conversation reaches the model through the chat template, system turn included; the
    # task's prompt_template wraps the last user message
    tok = build_char_tokenizer()
    fmt = PromptFormatter(tok, template="Q: {prompt}", chat=False)
    text = tok.decode(fmt.encode(ex.prompt))
    assert "Be brief." in text and "Q: What is 0+0?" in text and text.index("Be brief.") < text.index("Q:")
    turns = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Q: What is 0+0?"}]
    want = tok.apply_chat_template(turns, add_generation_prompt=True, tokenize=True)
    want = want["input_ids"] if not isinstance(want, list) else want
    assert fmt.encode(ex.prompt) == list(want)
    # reward workers receive examples pickled: the conversation survives
    back = pickle.loads(pickle.dumps(ex))
    assert isinstance(back.prompt, ChatPrompt) and back.prompt.messages == ex.prompt.messages


def test_verl_bad_rows_are_named_by_file_row_and_column(tmp_path):
    rows = _verl_rows()
    rows[2] = {**rows[2], "reward_model": {"style": "rule"}}
    path = tmp_path / "bad.parquet"
    datasets.Dataset.from_list(rows).to_parquet(str(path))
    # parquet fills a missing struct field with null: named as such
    with pytest.raises(
        DatasetError,
        match=r"bad\.parquet: row 3: field 'reward_model\.ground_truth' must be a string or an integer, got null",
    ):
        get_task("jsonl", path=str(path), layout="verl")
    (tmp_path / "bad.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(
        DatasetError,
        match=r"bad\.jsonl: row 3: missing field 'reward_model\.ground_truth' \(no 'ground_truth' in 'reward_model', which has: style",
    ):
        get_task("jsonl", path=str(tmp_path / "bad.jsonl"), layout="verl")
    rows = _verl_rows()
    rows[4]["prompt"] = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x"}]
    path = tmp_path / "bad.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DatasetError, match=r"bad\.jsonl: row 5: field 'prompt': the conversation ends with"):
        get_task("jsonl", path=str(path), layout="verl")
    rows[4]["prompt"] = [{"role": "user"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DatasetError, match=r"bad\.jsonl: row 5: field 'prompt'\[0\]: expected an object"):
        get_task("jsonl", path=str(path), layout="verl")


def test_trl_prompt_only_text_and_conversational(tmp_path):
    rows = [
        {"prompt": "1+1=", "solution": "2"},
        {"prompt": [{"role": "user", "content": "2+2="}], "solution": "4"},
    ]
    path = tmp_path / "trl.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    t = get_task(
        "jsonl", path=str(path), prompt_field="prompt", answer_field="solution", heldout_fraction=0.0
    )
    a, b = t.split("train")
    assert a.prompt == "1+1=" and not isinstance(a.prompt, ChatPrompt)
    assert b.prompt == "2+2=" and b.prompt.messages == (("user", "2+2="),)


def test_trl_sft_formats_from_every_source(tmp_path):
    conv = {
        "prompt": [{"role": "user", "content": "1+1="}],
        "completion": [{"role": "assistant", "content": "2"}],
    }
    for name, rows in {
        "pc": [{"prompt": "1+1=", "completion": "2"}],
        "conv": [conv],
        "messages": [{"messages": conv["prompt"] + conv["completion"]}],
        "text": [{"text": "1+1=2"}],
    }.items():
        ds = datasets.Dataset.from_list(rows)
        ds.save_to_disk(str(tmp_path / name))
        ds.to_parquet(str(tmp_path / f"{name}.parquet"))
        for src in (tmp_path / name, tmp_path / f"{name}.parquet"):
            (row,) = read_sft_file(src)
            if name in ("conv", "messages"):
                assert row.messages == (("user", "1+1="), ("assistant", "2")), src
            elif name == "pc":
                assert (row.prompt, row.completion) == ("1+1=", "2")
            else:
                assert row.text == "1+1=2"
    bad = datasets.Dataset.from_list([{"prompt": "ok", "completion": "2"}, {"prompt": "x", "completion": ""}])
    bad.to_parquet(str(tmp_path / "bad.parquet"))
    with pytest.raises(SFTDataError, match=r"bad\.parquet: row 2: 'completion' is empty"):
        read_sft_file(tmp_path / "bad.parquet")
    mixed = [{"prompt": [{"role": "user", "content": "a"}], "completion": "b"}]
    (tmp_path / "mixed.jsonl").write_text(json.dumps(mixed[0]) + "\n")
    with pytest.raises(SFTDataError, match=r"mixed\.jsonl: line 1: 'completion' must be a list of messages"):
        read_sft_file(tmp_path / "mixed.jsonl")


def test_rl_cli_on_a_verl_parquet_end_to_end(tmp_path):
    from posttrain.cli import app

    rows = [
        {
            "data_source": "toy",
            "prompt": [{"role": "user", "content": f"{a}+{a}="}],
            "reward_model": {"ground_truth": str(2 * a)},
        }
        for a in range(12)
    ]
    path = tmp_path / "train.parquet"
    datasets.Dataset.from_list(rows).to_parquet(str(path))
    res = CliRunner().invoke(
        app,
        [
            "rl",
            "model.name=tiny",
            "model.device=cpu",
            "task.name=jsonl",
            f"task.params={{path: {path}, layout: verl, heldout_fraction: 0.25}}",
            "reward.num_workers=0",
            "rollout.prompts_per_step=2",
            "rollout.group_size=2",
            "rollout.max_new_tokens=3",
            "eval.n=3",
            "steps=1",
            "threads=1",
            f"out_dir={tmp_path / 'run'}",
        ],
    )
    assert res.exit_code == 0, res.output
    recs = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["kind"] for r in recs].count("step") == 1


def test_sft_cli_on_a_saved_trl_conversational_dataset(tmp_path):
    from posttrain.cli import app

    rows = [
        {
            "prompt": [{"role": "user", "content": f"{a}+{a}="}],
            "completion": [{"role": "assistant", "content": str(2 * a)}],
        }
        for a in range(6)
    ]
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "sft"))
    res = CliRunner().invoke(
        app,
        [
            "sft",
            "model.name=tiny",
            "model.device=cpu",
            f"data={tmp_path / 'sft'}",
            "steps=2",
            "batch_size=3",
            "eval.at_end=false",
            "threads=1",
            f"out_dir={tmp_path / 'run'}",
        ],
    )
    assert res.exit_code == 0, res.output
    recs = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs if r["kind"] == "step"] == [1, 2]
