"""`posttrain eval` through the real CLI: option guards (usage errors naming the option), run-folder
defaults (task, params, prompt template, reward, generation settings, threads; a demo folder's RL
policy), the truncation warning, and the record of which model / checkpoint was evaluated."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from _train_helpers import CLI_TINY
from typer.testing import CliRunner

from posttrain.cli import app
from posttrain.train.rl import DegenerateSettingWarning

cli = CliRunner()


def _invoke(args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateSettingWarning)
        return cli.invoke(app, args, catch_exceptions=False)


def _last_json(res):
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["--n", "0"], "--n"),
        (["--n", "-5"], "--n"),
        (["--max-new-tokens", "0"], "--max-new-tokens"),
        (["--max-new-tokens", "-3"], "--max-new-tokens"),
        (["--k", "0"], "--k"),
        (["--samples", "0"], "--samples"),
        (["--temperature", "0"], "--temperature"),
    ],
)
def test_eval_bad_numbers_are_usage_errors_naming_the_option(args, option):
    res = _invoke(["eval", "--model", "tiny", *args])
    assert res.exit_code == 2, res.output
    assert option in res.output and "Traceback" not in res.output


def test_eval_k_needs_samples():
    res = _invoke(["eval", "--model", "tiny", "--k", "3", "--samples", "2", "--n", "2"])
    assert res.exit_code == 2 and "--k 3 needs --samples >= 3" in res.output


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    run = tmp_path_factory.mktemp("evalrun") / "run"
    res = _invoke(
        [
            "rl",
            "model.name=tiny",
            "model.device=cpu",
            'task.params={digits: 1, ops: "+", n_train: 40, n_heldout: 12, format: "scratchpad"}',
            "task.prompt_template='Q: {prompt}'",
            "reward.name=numeric",
            "reward.num_workers=0",
            "rollout.prompts_per_step=2",
            "rollout.group_size=2",
            "rollout.max_new_tokens=5",
            "eval.n=2",
            "eval.at_start=false",
            "steps=2",
            "threads=1",
            f"out_dir={run}",
            "--no-progress",
        ]
    )
    assert res.exit_code == 0, res.output
    return run


def test_eval_of_a_run_folder_uses_the_runs_settings_and_records_the_checkpoint(run_dir, tmp_path):
    out = tmp_path / "ev.json"
    res = _invoke(["eval", "--model", str(run_dir), "--n", "50", "--out", str(out)])
    assert res.exit_code == 0, res.output
    ev = json.loads(out.read_text())
    s = ev["settings"]
    assert s["task"] == "arithmetic"
    assert s["task_params"] == {
        "digits": 1,
        "ops": "+",
        "n_train": 40,
        "n_heldout": 12,
        "format": "scratchpad",
    }
    assert s["prompt_template"] == "Q: {prompt}" and s["reward"] == "numeric"
    assert s["max_new_tokens"] == 5 and ev["max_new_tokens"] == 5
    assert ev["n"] == 12 and ev["n_requested"] == 50  # the run's task has 12 held-out examples
    assert (
        ev["samples"][0]["prompt"] and "Q: " not in ev["samples"][0]["prompt"]
    )  # raw prompt, template applied
    m = ev["model"]
    assert m["given"] == str(run_dir) and m["step"] == 2
    assert m["checkpoint"] == str(run_dir / "checkpoints" / "step_000002")
    assert m["path"] == str(run_dir / "checkpoints" / "step_000002" / "model")
    assert m["settings_from"] == str(run_dir / "config.yaml")
    assert "only 12 held-out examples" in res.output  # stderr note: fewer than --n


def test_eval_flags_override_the_run_settings(run_dir):
    res = _invoke(
        [
            "eval",
            "--model",
            str(run_dir / "checkpoints" / "step_000002"),  # a checkpoint folder works too
            "--n",
            "3",
            "--max-new-tokens",
            "2",
            "--task-params",
            '{"n_heldout": 5}',
            "task.prompt_template='A: {prompt}'",
        ]
    )
    assert res.exit_code == 0, res.output
    ev = _last_json(res)
    s = ev["settings"]
    assert s["max_new_tokens"] == 2 and s["prompt_template"] == "A: {prompt}"
    assert s["task_params"]["n_heldout"] == 5 and s["task_params"]["format"] == "scratchpad"  # merged
    assert ev["model"]["step"] == 2 and ev["n"] == 3

    # another task: the run's task params and reward do not carry over
    res = _invoke(
        ["eval", "--model", str(run_dir), "--task", "countdown", "--n", "2", "--max-new-tokens", "2"]
    )
    assert res.exit_code == 0, res.output
    s = _last_json(res)["settings"]
    assert s["task"] == "countdown" and s["task_params"] == {} and s["reward"] == "countdown"


def test_eval_warns_when_most_completions_are_truncated(run_dir):
    res = _invoke(["eval", "--model", str(run_dir), "--n", "4", "--max-new-tokens", "1"])
    assert res.exit_code == 0, res.output
    ev = _last_json(res)
    assert ev["truncated"] >= 0.5
    assert "warning:" in res.stderr and "--max-new-tokens=1" in res.stderr


def test_truncation_warning_threshold():
    from posttrain.train.evaluate import truncation_warning

    assert truncation_warning({"truncated": 0.4, "max_new_tokens": 8}) is None
    msg = truncation_warning({"truncated": 1.0, "max_new_tokens": 8}, option="--max-new-tokens")
    assert msg is not None and "100%" in msg and "--max-new-tokens=8" in msg


def test_eval_of_a_preset_records_no_run():
    res = _invoke(["eval", "--model", "tiny", "--n", "2", "--max-new-tokens", "2"])
    assert res.exit_code == 0, res.output
    m = _last_json(res)["model"]
    assert m == {
        "given": "tiny",
        "path": "tiny",
        "run_dir": None,
        "checkpoint": None,
        "step": None,
        "settings_from": None,
    }


def test_saved_sft_config_maps_to_the_eval_settings():
    from posttrain.train.evaluate import _eval_base

    sft = {
        "model": {"name": "tiny", "dtype": "float32", "device": "cpu", "gradient_checkpointing": False},
        "task": {"name": "arithmetic", "params": {"digits": 1}, "prompt_template": "Q: {prompt}"},
        "max_new_tokens": 40,
        "eval": {"every": 5, "n": 64, "k": 2, "samples": 4, "temperature": 0.7, "at_start": False},
        "lr": 1e-3,
        "steps": 10,
    }
    assert _eval_base(sft) == {
        "model": {"dtype": "float32", "device": "cpu"},
        "task": sft["task"],
        "rollout": {"max_new_tokens": 40},
        "eval": {"k": 2, "samples": 4, "temperature": 0.7},
    }


def test_eval_of_a_demo_folder_uses_its_rl_policy_and_the_runs_threads(tmp_path):
    demo = tmp_path / "demo"
    quick = [*CLI_TINY, "eval.at_start=false", "eval.at_end=false", "--no-progress"]
    res = _invoke(["rl", *quick, f"out_dir={demo / 'rl'}", "steps=1", "threads=2"])
    assert res.exit_code == 0, res.output
    (demo / "summary.json").write_text("{}")
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        res = _invoke(["eval", "--model", str(demo), "--n", "2", "--max-new-tokens", "2"])
        assert res.exit_code == 0, res.output
        assert torch.get_num_threads() == 2  # the run's threads, as training used
    finally:
        torch.set_num_threads(before)
    out = json.loads(res.output.strip().splitlines()[-1])
    assert out["n"] == 2


# ------------------------------------------- every key the user sets is honoured or refused (item 1)
@pytest.fixture(scope="module")
def qa_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("qa")
    for name, first in (("train.jsonl", 0), ("heldout.jsonl", 10)):
        rows = [{"question": f"{i}+1=", "answer": str(i + 1)} for i in range(first, first + 6)]
        (d / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {"path": str(d / "train.jsonl"), "heldout_path": str(d / "heldout.jsonl")}


QUICK_EVAL = ["--n", "2", "--max-new-tokens", "2"]


@pytest.mark.parametrize("reward", ["numeric", "last_number"])
def test_a_reward_override_survives_another_task(qa_files, reward):
    """The issue's case: with --task jsonl the override was replaced by the task's default reward
    (exact_match); with --task arithmetic it was honoured."""
    res = _invoke(
        [
            *["eval", "--model", "tiny", "--task", "jsonl", "--task-params", json.dumps(qa_files)],
            *[*QUICK_EVAL, f"reward.name={reward}"],
        ]
    )
    assert res.exit_code == 0, res.output
    s = _last_json(res)["settings"]
    assert s["task"] == "jsonl" and s["reward"] == reward


def test_a_run_folders_settings_give_way_to_the_users_keys_on_another_task(run_dir, qa_files):
    # the run's reward (numeric) and task params belong to its task and are dropped; the user's kept
    res = _invoke(
        [
            *["eval", "--model", str(run_dir), "--task", "jsonl", "--task-params", json.dumps(qa_files)],
            *[*QUICK_EVAL, "reward.name=last_number", "task.prompt_template='B: {prompt}'"],
        ]
    )
    assert res.exit_code == 0, res.output
    s = _last_json(res)["settings"]
    assert s["task"] == "jsonl" and s["reward"] == "last_number" and s["prompt_template"] == "B: {prompt}"
    assert s["task_params"] == qa_files  # none of the run's arithmetic params


def test_a_config_files_keys_are_honoured_with_task_and_refused_when_they_disagree(qa_files, tmp_path):
    cfg = tmp_path / "eval.yaml"
    cfg.write_text(f"task:\n  name: jsonl\n  params: {json.dumps(qa_files)}\nreward:\n  name: numeric\n")
    res = _invoke(["eval", "--model", "tiny", "--config", str(cfg), "--task", "jsonl", *QUICK_EVAL])
    assert res.exit_code == 0, res.output
    s = _last_json(res)["settings"]
    assert s["task"] == "jsonl" and s["reward"] == "numeric"
    # --task naming another task than the file's: refused, not silently replaced
    res = _invoke(["eval", "--model", "tiny", "--config", str(cfg), "--task", "countdown", *QUICK_EVAL])
    assert res.exit_code == 2 and "--task countdown and task.name=jsonl" in res.output, res.output
    assert f"--config {cfg}" in res.output
    # the same through an override
    res = _invoke(["eval", "--model", "tiny", "--task", "countdown", "task.name=arithmetic", *QUICK_EVAL])
    assert res.exit_code == 2 and "task.name=arithmetic" in res.output, res.output


def test_options_never_replace_a_key_the_user_set(run_dir):
    # eval.n set by an override is the number evaluated (the --n default replaced it)
    res = _invoke(["eval", "--model", str(run_dir), "--max-new-tokens", "2", "eval.n=3"])
    assert res.exit_code == 0, res.output
    assert _last_json(res)["n_requested"] == 3
    for args, needle in (
        (["--n", "5", "eval.n=3"], "--n 5 contradicts eval.n=3"),
        (["--max-new-tokens", "2", "rollout.max_new_tokens=3"], "--max-new-tokens 2 contradicts"),
        (
            ["--n", "2", "--task-params", '{"n_heldout": 5}', "task.params.n_heldout=4"],
            "--task-params n_heldout=5 contradicts",
        ),
    ):
        res = _invoke(["eval", "--model", str(run_dir), *args])
        assert res.exit_code == 2 and needle in res.output, (args, res.output)
        assert "the override" in res.output


def test_an_option_wins_over_the_config_files_value(tmp_path):
    """Issue 58 item 5: `eval --config tool-calling.yaml --n 4` was refused as contradicting the file's
    `eval.n: 100`; an option given explicitly is the user's latest word (an override on the same line
    that disagrees is still refused, above)."""
    cfg = tmp_path / "eval.yaml"
    cfg.write_text(
        "task: {params: {digits: 1, n_train: 20, n_heldout: 8}}\neval: {n: 100, temperature: 0.5}\n"
        "rollout: {max_new_tokens: 9}\n",
        encoding="utf-8",
    )
    args = ["eval", "--model", "tiny", "--config", cfg, "--n", "3", "--max-new-tokens", "2"]
    res = _invoke([*args, "--temperature", "0.7", "--task-params", '{"n_heldout": 6}'])
    assert res.exit_code == 0, res.output
    out = _last_json(res)
    assert out["n_requested"] == 3 and out["max_new_tokens"] == 2
    assert out["settings"]["temperature"] == 0.7 and out["settings"]["task_params"]["n_heldout"] == 6
    assert out["settings"]["task_params"]["digits"] == 1  # the file's other keys are kept
    helptext = " ".join(_invoke(["eval", "--help"]).output.split())
    assert "An option you give wins over the --config file's value of its key" in helptext


# --------------------------------------------------------------- lengths (issue 41 item 16)
def test_eval_refuses_prompts_longer_than_the_context_as_rl_does(tmp_path):
    rows = [{"question": f"{i}+1=", "answer": str(i + 1)} for i in range(4)]
    rows[2]["question"] = "9" * 4095  # the tiny model's context is 4096 tokens (one per character)
    data = tmp_path / "long.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    train = tmp_path / "train.jsonl"
    train.write_text(json.dumps({"question": "7+7=", "answer": "14"}) + "\n")
    params = json.dumps({"path": str(train), "heldout_path": str(data)})
    args = ["eval", "--model", "tiny", "--task", "jsonl", "--task-params", params, "--max-new-tokens", "2"]
    res = _invoke(args)
    assert res.exit_code == 2, res.output
    assert f"held-out split: {data} row 3" in res.output and "the prompt is 4095 tokens" in res.output
    assert "rollout.overlong_prompts=skip" in res.output and "Traceback" not in res.output
    res = _invoke([*args, "rollout.overlong_prompts=skip"])
    assert res.exit_code == 0, res.output
    assert _last_json(res)["n"] == 3 and "1 skipped" in res.output


def test_a_task_with_its_own_completion_length_gets_it_in_eval():
    """`eval --task ifbench` generated 16 tokens (93 % truncated): a task may say how long its answers
    are (Task.max_new_tokens), used unless the user sets a length."""
    from posttrain.tasks import TASKS
    from posttrain.train.evaluate import ModelLocation, evaluate_cli_settings

    assert TASKS.get("ifbench").max_new_tokens == 256
    loc = ModelLocation(given="tiny", path="tiny")
    assert evaluate_cli_settings(loc, None, [], task="ifbench").rollout.max_new_tokens == 256
    assert (
        evaluate_cli_settings(loc, None, [], task="ifbench", max_new_tokens=40).rollout.max_new_tokens == 40
    )
    over = ["rollout.max_new_tokens=50"]
    assert evaluate_cli_settings(loc, None, over, task="ifbench").rollout.max_new_tokens == 50
    assert (
        evaluate_cli_settings(loc, None, [], task="countdown").rollout.max_new_tokens == 16
    )  # none of its own
