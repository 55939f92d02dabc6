"""`posttrain demo tools` (issue 43 item 4): the warm start's scripted conversations are rendered as the
runner renders a tool episode, and the demo runs end to end on the tiny preset, resumable per arm."""

from __future__ import annotations

import json
import warnings

import pytest
from _engine_helpers import ScriptedEngine, by_tool_round

from posttrain.models import load_model_and_tokenizer
from posttrain.rollout import PromptFormatter, SamplingParams
from posttrain.rollout.multiturn import MultiTurnRunner
from posttrain.tasks import get_task
from posttrain.tools import get_tool
from posttrain.train.rl import DegenerateSettingWarning
from posttrain_lab.demos import tools as demo

TINY = [
    "model.name=tiny",
    "rollout.group_size=2",
    "rollout.prompts_per_step=2",
    "rollout.max_new_tokens=16",
    "threads=1",
    "micro_batch_size=4",
]


@pytest.mark.parametrize("model", ["tiny", "smollm2-135m"])
def test_the_scripted_conversation_is_what_the_runner_would_have_produced(model):
    tok = load_model_and_tokenizer(model, device="cpu", seed=0)[1]
    ex = get_task("word_problems", steps=2, max_value=9999, n_train=4, n_heldout=1).split("train")[0]
    calc = get_tool("calculator")
    row = demo.tool_transcript(ex, [calc.schema])
    msgs = row["messages"]
    assert calc.call({"expression": ex.meta["expression"]}) == ex.answer == msgs[-1]["content"]
    eng = ScriptedEngine(tok, by_tool_round([msgs[2]["content"], msgs[4]["content"]]))
    r = MultiTurnRunner(
        eng, PromptFormatter(tok, chat=True), env="answer", system=False, tools=["calculator"]
    )
    eps = r.run([ex], [1], SamplingParams(max_new_tokens=400))
    assert eps.rewards.tolist() == [1.0] and r.last_sessions[0].tool_valid == 1
    b = eps.batch
    ids = (
        b.prompt_ids[0][b.prompt_mask[0].bool()].tolist()
        + b.completion_ids[0][b.completion_mask[0].bool()].tolist()
    )
    # SFT renders the same conversation with the chat template; the runner's row is its prefix (the
    # template adds only the newline after the last end-of-turn)
    sft_text = tok.apply_chat_template(msgs, tokenize=False)
    assert sft_text.startswith(tok.decode(ids, skip_special_tokens=False))
    assert len(sft_text) - len(tok.decode(ids, skip_special_tokens=False)) <= 1


def test_demo_tools_end_to_end_on_tiny_and_resumes_per_arm(tmp_path):
    out = tmp_path / "d"
    kw = {"n_eval": 4, "sft_steps": 2, "rl_steps": 1, "seeds": 2, "overrides": TINY, "progress": False}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateSettingWarning)
        s = demo.run_tools_demo(out, **kw)
        assert set(s["arms"]) == set(demo.ARMS) and set(s["paired"]) == {f"{a}-{b}" for a, b in demo.PAIRS}
        assert s["seeds"] == [0, 1] and s["rl_gate"]["temperature"] == demo.DEMO_TEMPERATURE
        arm_files = [out / "no_tool.json", out / "tool_untrained.json"] + [
            out / f"seed{k}" / f"{a}.json" for k in (0, 1) for a in ("tool_sft", "tool_rl")
        ]
        per = {p: json.loads(p.read_text()) for p in arm_files}
        for a in per.values():
            assert a["n"] == 4 and len(a["correct"]) == 4 and 0.0 <= a["tool_call_rate"] <= 1.0
        assert s["arms"]["no_tool"]["tool_calls_mean"] == 0.0
        # the trained arms are the mean over the seeds; the pooled pair averages verdicts over seeds
        rl = [per[out / f"seed{k}" / "tool_rl.json"] for k in (0, 1)]
        sft = [per[out / f"seed{k}" / "tool_sft.json"] for k in (0, 1)]
        assert s["arms"]["tool_rl"]["accuracy"] == pytest.approx((rl[0]["accuracy"] + rl[1]["accuracy"]) / 2)
        d = [
            (a0 + a1 - b0 - b1) / 2
            for a0, a1, b0, b1 in zip(
                rl[0]["correct"], rl[1]["correct"], sft[0]["correct"], sft[1]["correct"], strict=True
            )
        ]
        pooled = s["paired"]["tool_rl-tool_sft"]
        assert pooled["diff"] == pytest.approx(sum(d) / 4)
        by_seed = [s["paired_by_seed"][k]["tool_rl-tool_sft"]["diff"] for k in ("0", "1")]
        assert pooled["by_seed"] == {"0": by_seed[0], "1": by_seed[1]}
        assert pooled["se_seeds"] == pytest.approx(abs(by_seed[0] - by_seed[1]) / 2)
        assert s["rl_gate"]["steps"] == 2 and 0.0 <= s["rl_gate"]["mixed_groups_mean"] <= 1.0
        for k in (0, 1):
            assert (out / f"seed{k}" / "sft" / "model" / "config.json").is_file()
            assert (out / f"seed{k}" / "rl" / "model").is_dir()
        # resume: every finished arm is kept (no evaluation runs again)
        (out / "seed1" / "tool_rl.json").unlink()
        kept = [p for p in arm_files if p != out / "seed1" / "tool_rl.json"]
        stamps = {p: p.stat().st_mtime_ns for p in kept}
        demo.run_tools_demo(out, resume=True, **kw)
        assert {p: p.stat().st_mtime_ns for p in kept} == stamps
        assert (out / "seed1" / "tool_rl.json").is_file()
        with pytest.raises(ValueError, match="already holds a demo tools"):
            demo.run_tools_demo(out, **kw)
    # through the CLI (its run-folder lock file is not "a previous demo")
    from typer.testing import CliRunner

    from posttrain.cli import app

    res = CliRunner().invoke(app, ["demo", "tools", "--help"])
    assert res.exit_code == 0 and "--sft-steps" in res.output
    fresh = tmp_path / "cli"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateSettingWarning)
        res = CliRunner().invoke(
            app,
            [
                "demo",
                "tools",
                "--out",
                str(fresh),
                "--n-eval",
                "2",
                "--sft-steps",
                "1",
                "--rl-steps",
                "1",
                "--no-progress",
                *TINY,
            ],
        )
    assert res.exit_code == 0, res.output
    assert json.loads((fresh / "summary.json").read_text())["arms"]["tool_rl"]["n"] == 2
