"""Limits checked before a run starts, through the real CLI (each refusal exits 2 with a message naming
the setting, no traceback, and leaves no run folder): groups of one completion for group-relative
advantages, ``max_new_tokens`` against the model's context, a tokenizer that does not fit the model,
SFT rows and RL prompts longer than the context (refused naming file and line, or truncated / skipped
and counted only when asked), and empty splits (refused before the model loads)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
from _train_helpers import CLI_TINY
from typer.testing import CliRunner

from posttrain.cli import app
from posttrain.train.rl import DegenerateSettingWarning

runner = CliRunner()
QUICK = [*CLI_TINY, "eval.at_start=false", "eval.at_end=false", "--no-progress"]


def _invoke(args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateSettingWarning)
        return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


def _refused(res, *needles):
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    for n in needles:
        assert n in res.output, res.output


# ------------------------------------------------------------------------ groups of one completion
@pytest.mark.parametrize("adv", ["grpo", "dr_grpo", "rloo"])
def test_group_size_one_is_refused_for_group_relative_advantages(tmp_path, adv):
    res = _invoke(
        ["rl", *QUICK, f"out_dir={tmp_path / 'r'}", "rollout.group_size=1", f"advantage.name={adv}"]
    )
    _refused(res, "rollout.group_size", f"group-relative advantage {adv!r}", "reinforce_pp")
    assert not (tmp_path / "r").exists()


def test_group_size_one_is_accepted_with_a_batch_baseline(tmp_path):
    from posttrain.train.config import load_rl_config

    cfg = load_rl_config(None, ["rollout.group_size=1", "advantage.name=reinforce_pp"])
    assert cfg.rollout.group_size == 1


# ------------------------------------------------------------------------ max_new_tokens vs context
def test_max_new_tokens_beyond_the_models_context_is_refused_at_config_time(tmp_path):
    res = _invoke(["rl", *QUICK, f"out_dir={tmp_path / 'r'}", "rollout.max_new_tokens=1e9"])
    _refused(res, "rollout.max_new_tokens", "does not fit the context of model 'tiny' (4096 tokens")
    res = _invoke(["eval", "--model", "tiny", "--n", "2", "--max-new-tokens", "5000"])
    _refused(res, "does not fit the context of model 'tiny'")


def test_context_of_a_model_directory_is_read_from_its_config(tmp_path):
    from posttrain.models.loading import model_context_length

    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "llama", "max_position_embeddings": 64}))
    assert model_context_length(str(d)) == 64
    (d / "config.json").write_text(json.dumps({"text_config": {"n_positions": 32}}))
    assert model_context_length(str(d)) == 32
    assert model_context_length(str(tmp_path / "missing")) is None


# ------------------------------------------------------------------------ tokenizer/model mismatch
def _bpe_tokenizer(size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE(unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    corpus = [f"{a} + {b} = {a + b} and some words {a * b}" for a in range(60) for b in range(60)]
    backend.train_from_iterator(
        corpus,
        trainers.BpeTrainer(
            vocab_size=size,
            special_tokens=["<pad>", "<eos>", "<unk>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )


@pytest.fixture(scope="module")
def mismatched(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM

    from posttrain.models import load_model_and_tokenizer

    root = tmp_path_factory.mktemp("mismatch")
    model, char_tok = load_model_and_tokenizer("tiny")
    bigger = _bpe_tokenizer(600)  # more tokens than the tiny model's 357 embedding rows
    assert len(bigger) > 357
    a = root / "tiny-weights-bpe-tokenizer"
    model.save_pretrained(a)
    bigger.save_pretrained(a)
    big = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=5000,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            eos_token_id=char_tok.eos_token_id,
            pad_token_id=char_tok.pad_token_id,
            bos_token_id=char_tok.bos_token_id,
        )
    )
    b = root / "big-weights-char-tokenizer"
    big.save_pretrained(b)
    char_tok.save_pretrained(b)
    c = root / "tiny-weights-other-eos"
    model.config.eos_token_id = 7
    model.generation_config.eos_token_id = 7
    model.save_pretrained(c)
    char_tok.save_pretrained(c)
    return a, b, c


def test_a_tokenizer_with_more_tokens_than_the_model_is_refused(mismatched):
    res = _invoke(["eval", "--model", mismatched[0], "--n", "2", "--max-new-tokens", "2"])
    _refused(res, "the tokenizer has", "but the model's embedding has 357 rows", "use the tokenizer saved")


def test_a_model_with_far_more_rows_than_the_tokenizer_is_refused(tmp_path, mismatched):
    res = _invoke(["rl", *QUICK, f"out_dir={tmp_path / 'r'}", f"model.name={mismatched[1]}", "steps=1"])
    _refused(res, "the model's embedding has 5000 rows but the tokenizer only 357 tokens")


def test_a_tokenizer_eos_the_model_does_not_stop_at_is_refused(mismatched):
    res = _invoke(["eval", "--model", mismatched[2], "--n", "2", "--max-new-tokens", "2"])
    _refused(res, "EOS token id", "stops at [7]")


def test_a_matching_saved_model_still_loads(tmp_path):
    from posttrain.models import load_model_and_tokenizer

    model, tok = load_model_and_tokenizer("tiny")
    model.save_pretrained(tmp_path / "ok")
    tok.save_pretrained(tmp_path / "ok")
    m2, t2 = load_model_and_tokenizer(str(tmp_path / "ok"))
    assert len(t2) == m2.get_input_embeddings().weight.shape[0]


# ------------------------------------------------------------------------ length bounds at load
def _sft(tmp_path, data, *extra):
    return _invoke(
        [
            "sft",
            "model.name=tiny",
            "model.device=cpu",
            f"data={data}",
            "steps=1",
            "batch_size=2",
            "threads=1",
            f"out_dir={tmp_path / 'sft'}",
            "--no-progress",
            *extra,
        ]
    )


def _rows(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_sft_row_longer_than_the_context_is_refused_naming_file_and_line(tmp_path):
    data = _rows(
        tmp_path / "d.jsonl",
        [{"prompt": "1+1=", "completion": "2"}, {"prompt": "x" * 5000, "completion": "y"}],
    )
    res = _sft(tmp_path, data)
    _refused(
        res, f"{data}: line 2: the row encodes to 5,00", "longer than max_length=4096", "overlong=truncate"
    )
    assert not (tmp_path / "sft").exists()


def test_sft_huge_row_is_refused_before_tokenizing(tmp_path):
    data = _rows(tmp_path / "d.jsonl", [{"text": "z" * 300_000}, {"prompt": "1+1=", "completion": "2"}])
    res = _sft(tmp_path, data, "max_length=64")
    _refused(res, f"{data}: line 1: the row has 300,000 characters, longer than max_length=64")


@pytest.mark.parametrize(("policy", "word"), [("truncate", "1 truncated"), ("skip", "1 skipped")])
def test_sft_overlong_rows_are_truncated_or_skipped_only_when_asked_and_counted(tmp_path, policy, word):
    data = _rows(
        tmp_path / "d.jsonl",
        [
            {"prompt": "1+1=", "completion": "2"},
            {"prompt": "3+4=", "completion": "7"},
            {"prompt": "9+", "completion": "1" * 100},
        ],
    )
    res = _sft(tmp_path, data, "max_length=32", f"overlong={policy}")
    assert res.exit_code == 0, res.output
    assert f"note: {data}: rows longer than 32 tokens: {word} (overlong={policy})" in res.output


def test_rl_prompt_longer_than_the_context_is_refused_or_skipped(tmp_path):
    rows = [{"question": f"{i}+1=", "answer": str(i + 1)} for i in range(6)]
    rows[3]["question"] = "9" * 4095  # < 4096: no transformers length warning
    data = _rows(tmp_path / "t.jsonl", rows)
    task = ["task.name=jsonl", f"task.params={{path: {data}, heldout_fraction: 0.3}}"]
    res = _invoke(["rl", *QUICK, *task, f"out_dir={tmp_path / 'r'}", "steps=1"])
    # the file's row (issue 41 item 23: it named the row's place in the shuffled split)
    _refused(
        res,
        f"task 'jsonl': train split: {data} row 4 (id ",
        "the prompt is 4095 tokens",
        "rollout.overlong_prompts=skip",
    )
    res = _invoke(
        ["rl", *QUICK, *task, f"out_dir={tmp_path / 'r2'}", "steps=1", "rollout.overlong_prompts=skip"]
    )
    assert res.exit_code == 0, res.output
    assert "rows longer than 4093 tokens: 1 skipped (rollout.overlong_prompts=skip)" in res.output


# ------------------------------------------------------------------------ empty splits
PLUGINS = str(Path(__file__).resolve().parents[1] / "helpers")


@pytest.fixture
def fresh_plugins(monkeypatch):
    """tests/helpers on sys.path; ``my_plugins`` forgotten afterwards (its decorators register into
    registries that conftest restores after each test, so a later importer must run them again)."""
    import sys

    monkeypatch.syspath_prepend(PLUGINS)
    yield
    sys.modules.pop("my_plugins", None)


@pytest.mark.parametrize(
    ("n_heldout", "needle"),
    [(0, "the held-out split is empty, but the run evaluates on it"), (7, "the train split is empty")],
)
def test_empty_splits_are_refused_before_the_model_loads(
    tmp_path, monkeypatch, fresh_plugins, n_heldout, needle
):
    import posttrain.models.adapter as adapter_mod

    loads = []
    real = adapter_mod.load_model_and_tokenizer
    monkeypatch.setattr(
        adapter_mod, "load_model_and_tokenizer", lambda *a, **k: loads.append(a) or real(*a, **k)
    )
    run = tmp_path / "r"
    tiny = [a for a in CLI_TINY if not a.startswith("task.")]
    args = ["rl", *tiny, "--no-progress", f"out_dir={run}", "steps=1", "task.name=my_plugins:CountTask"]
    res = _invoke([*args, f"task.params={{n_heldout: {n_heldout}}}", "reward.num_workers=1"])
    _refused(res, f"task 'count': {needle}")
    assert "EOFError" not in res.output
    assert loads == []  # refused before any model was loaded
    assert not run.exists()  # and nothing was left behind (no config.yaml)
