"""SILO-BENCH as an RL environment (issue 39): a scripted policy played through the multi-turn runner
produces the benchmark engine's own transcript (same messages per seat, same tool results, same S);
only the policy's tokens are trained on; a solved case gets S = 1 through the trainer; the turn
criteria, the context cap and the task's splits."""

from __future__ import annotations

import asyncio
import json
import warnings
from importlib.resources import files

import pytest

from posttrain.models import load_model_and_tokenizer
from posttrain.rollout import PromptFormatter, SamplingParams
from posttrain.rollout.base import RolloutBatch, RolloutEngine
from posttrain.rollout.multiturn import MultiTurnRunner
from posttrain.train.rl import DegenerateSettingWarning
from posttrain_lab.benchmarks.silo import generate_case
from posttrain_lab.benchmarks.silo.agents import ScriptedAgent
from posttrain_lab.benchmarks.silo.env import SiloEnv, SiloTask, scripted_conversations

CFG = str(files("posttrain_lab.benchmarks.silo.rl") / "silo-rl.yaml")


class SeatPolicy(RolloutEngine):
    """Finds, for every context it is asked to continue, the live session seat whose benchmark messages
    the chat template renders to exactly that context (so a drift between the runner's tokens and the
    engine's messages fails the lookup), and answers with ``policy(messages)`` + EOS."""

    def __init__(self, tok, live: list[SiloEnv], policy):
        self.tok, self.live, self.policy = tok, live, policy
        self.contexts: list[str] = []
        self.batches: list[int] = []  # contexts per generate call

    @property
    def pad_token_id(self) -> int:
        return int(self.tok.pad_token_id)

    def _messages(self, context: str) -> list[dict]:
        for env in self.live:
            st = env.state
            for i in range(st.engine.n):
                if st.submitted[i]:
                    continue
                rendered = self.tok.apply_chat_template(
                    st.messages(i), add_generation_prompt=True, tokenize=False
                )
                if rendered == context:
                    return st.messages(i)
        raise AssertionError("no live seat renders to this context: the runner's tokens drifted")

    def generate(self, prompt_ids, n_per_prompt, params):
        self.batches.append(len(prompt_ids))
        comps = []
        for p in prompt_ids:
            context = self.tok.decode(p, skip_special_tokens=False)
            self.contexts.append(context)
            text = self.policy(self._messages(context))
            comps.append([*self.tok.encode(text, add_special_tokens=False), self.tok.eos_token_id])
        return RolloutBatch.from_token_lists(
            prompt_ids,
            comps,
            pad_token_id=self.pad_token_id,
            group_ids=list(range(len(prompt_ids))),
            finish_reasons=["stop"] * len(comps),
            logprobs=[[-0.5] * len(c) for c in comps],
        )


def scripted(messages: list[dict]) -> str:
    return asyncio.run(ScriptedAgent().reply(messages)).text


def track(runner: MultiTurnRunner, live: list[SiloEnv]) -> None:
    """Every environment the runner makes from now on is appended to ``live``."""
    make = runner.make_env

    def tracked():
        env = make()
        live.append(env)
        return env

    runner.make_env = tracked


def _runner(tok, live, policy, **kw):
    eng = SeatPolicy(tok, live, policy)
    params = {"max_rounds": 8, **kw.pop("env_params", {})}
    max_context = kw.pop("max_context", 20000)
    r = MultiTurnRunner(
        eng, PromptFormatter(tok, chat=True), env="silo", env_params=params, max_context=max_context
    )
    track(r, live)
    return r, eng


@pytest.fixture(scope="module")
def tok():
    return load_model_and_tokenizer("tiny", device="cpu", seed=0)[1]


@pytest.mark.parametrize(
    ("task_id", "protocol", "n"),
    [("I-01", "p2p", 3), ("I-06", "bp", 2), ("I-01", "sfs", 2), ("II-12", "p2p", 2)],
)
def test_a_scripted_policy_through_the_runner_gives_the_engines_transcript(tok, task_id, protocol, n):
    case = generate_case(task_id, n, 7)
    ex = SiloTask(tasks=[task_id], agents=[n], protocols=[protocol], n_train=1, n_heldout=0)._examples(
        [task_id], [n], [protocol], [7]
    )[0]
    live: list[SiloEnv] = []
    runner, eng = _runner(tok, live, scripted)
    eps = runner.run([ex, ex], [1, 1], SamplingParams(max_new_tokens=4000))
    ref_contexts, ref = scripted_conversations(case, protocol, SiloEnv(max_rounds=8).cfg)
    assert ref.success and len(live) == 2
    sessions = runner.last_sessions
    assert len(sessions) == 2 * n and [s.seat for s in sessions] == [*range(n), *range(n)]
    for s in sessions:
        got = [{"role": m["role"], "content": m["content"]} for m in s.messages]
        assert got == ref_contexts[s.seat]  # the seat's whole chat is the engine's
    for env in live:
        res = env.case_result()
        assert res.transcript == ref.transcript and res.metrics == ref.metrics
    assert eps.rewards.tolist() == [1.0] * (2 * n)  # S = 1 on every seat's row
    # a GRPO group holds every seat of a case's sessions
    assert eps.batch.group_ids.tolist() == [0] * n + [1] * n
    # trained tokens: the policy's replies (and their EOS), never the engine's messages
    b = eps.batch
    for i, s in enumerate(sessions):
        k = int(b.completion_mask[i].sum())
        acted = b.completion_ids[i, :k][b.action_mask[i, :k] == 1].tolist()
        env_part = b.completion_ids[i, :k][b.action_mask[i, :k] == 0].tolist()
        replies = [m["content"] for m in s.messages if m["role"] == "assistant"]
        assert tok.decode(acted, skip_special_tokens=True) == "".join(replies)
        assert "<tool_result>" in tok.decode(env_part) and "<tool_result>" not in tok.decode(acted)
    m = runner.step_metrics(eps)
    assert m["silo_success"] == 1.0 and m["silo_solved"] == 1.0 and m["silo_valid_calls"] == 1.0
    assert m["silo_messages_per_agent"] == pytest.approx(ref.message_counts["code"] / n)
    # one batched generation per round: every acting seat of both sessions in the same call
    acting = [sum(x["round"] == r for x in ref.transcript) for r in range(1, ref.rounds_executed + 1)]
    assert eng.batches == [2 * a for a in acting]


def test_turn_criteria_premature_answers_replies_without_a_call_and_the_reward_s_or_p(tok):
    ex = SiloTask(tasks=["I-01"], agents=[2], n_train=1, n_heldout=0).split("train")[0]
    right = ex.meta["case"]["expected_output"]["per_agent_values"][0]
    assert abs(right) >= 100  # so right + 1 is within the 1 % of level I's partial credit

    def submit(answer):
        return f"<tool_call><tool>submit_result</tool><parameters><answer>{answer}</answer></parameters></tool_call>"

    def lazy(messages):
        seat = int(messages[0]["content"].split("agent ID is: ")[1].split("\n")[0])
        if seat == 0:  # answers at once, without hearing from agent 1: premature (protocol -1)
            return submit(right)
        rnd = sum(m["role"] == "assistant" for m in messages) + 1
        # no tool call (format -1) in rounds 1-2; then a close but wrong answer, also premature
        return "I think the answer is 7." if rnd < 3 else submit(right + 1)

    live: list[SiloEnv] = []
    runner, _ = _runner(tok, live, lazy, env_params={"max_rounds": 4})
    eps = runner.run([ex], [1], SamplingParams(max_new_tokens=4000))
    s0, s1 = runner.last_sessions
    names = runner.criteria
    assert [dict(zip(names, t, strict=True)) for t in s0.turn_rewards] == [{"format": 0.0, "protocol": -1.0}]
    assert [dict(zip(names, t, strict=True)) for t in s1.turn_rewards] == [
        {"format": -1.0, "protocol": 0.0},
        {"format": -1.0, "protocol": 0.0},
        {"format": 0.0, "protocol": -1.0},
    ]
    res = live[0].case_result()
    assert res.rounds_executed == 3 and res.answers == [right, right + 1]
    # S: the share of agents with the right answer (the paper's S); the case is not solved
    assert eps.rewards.tolist() == [0.5, 0.5]
    m = runner.step_metrics(eps)
    assert m["silo_success"] == 0.5 and m["silo_solved"] == 0.0 and m["silo_partial"] == 1.0
    assert m["silo_submitted"] == 1.0 and m["silo_valid_calls"] == 0.5  # 2 of 4 replies had a valid call
    # partial credit: the session reward is P (right + 1 is within 1 %)
    live2: list[SiloEnv] = []
    runner2, _ = _runner(tok, live2, lazy, env_params={"max_rounds": 4, "partial_credit": True})
    assert runner2.run([ex], [1], SamplingParams(max_new_tokens=4000)).rewards.tolist() == [1.0, 1.0]


def test_the_context_cap_cuts_the_whole_session(tok):
    ex = SiloTask(tasks=["I-01"], agents=[2], n_train=1, n_heldout=0).split("train")[0]
    live: list[SiloEnv] = []
    opening = len(
        tok.apply_chat_template(
            scripted_conversations(ex.meta["case"], "p2p")[0][0][:2], add_generation_prompt=True
        )
    )
    runner, _ = _runner(tok, live, scripted, max_context=opening + 400)
    eps = runner.run([ex], [1], SamplingParams(max_new_tokens=300))
    assert all(s.truncated for s in runner.last_sessions) and eps.batch.truncated.tolist() == [True, True]
    assert eps.rewards.tolist() == [0.0, 0.0]  # scored as the benchmark scores the unfinished case


def test_the_task_splits_never_share_a_case_and_ood_holds_new_tasks_and_n():
    t = SiloTask(
        tasks=["I-01", "I-06"], agents=[2], n_train=3, n_heldout=2, heldout_tasks=["I-05"], heldout_agents=[3]
    )
    tr, he, ood = t.split("train"), t.split("heldout"), t.split("ood")
    assert len(tr) == 6 and len(he) == 4 and len(ood) == 2
    cases = lambda xs: {json.dumps(x.meta["case"]["agent_configs"], sort_keys=True) for x in xs}  # noqa: E731
    assert not cases(tr) & cases(he) and not cases(tr) & cases(ood)
    assert {x.meta["task_id"] for x in ood} == {"I-05"} and {x.meta["n"] for x in ood} == {3}
    with pytest.raises(ValueError, match="unknown SILO-BENCH task 'I-99'"):
        SiloTask(tasks=["I-99"])
    with pytest.raises(ValueError, match="reminder"):
        SiloEnv(scaffolds=["reminder"])


@pytest.mark.slow
def test_a_solved_case_gets_s_1_through_the_trainer(tmp_path):
    from posttrain.train.config import load_rl_config
    from posttrain.train.rl import RLTrainer

    small = [
        "model.name=tiny",
        "rollout.group_size=2",
        "rollout.prompts_per_step=1",
        "rollout.max_new_tokens=400",
        "rollout.runner.params.max_context=20000",
        "eval.at_start=false",
        "eval.at_end=false",
        "checkpoint.every=0",
        "threads=1",
        "micro_batch_size=2",
        f"out_dir={tmp_path / 'run'}",
    ]
    tr = RLTrainer(load_rl_config(CFG, small))
    runner = tr.collector.runner
    live: list[SiloEnv] = []
    track(runner, live)
    runner.engine = SeatPolicy(runner.tokenizer, live, scripted)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateSettingWarning)
        m = tr.step()
    assert m["silo_success"] == 1.0 and m["reward_mean"] == 1.0 and m["accuracy"] == 1.0
    assert all(env.case_result().success for env in live)


@pytest.mark.slow
def test_the_bar_silo_rl_yaml_on_tiny_logs_silo_success_every_step(tmp_path):
    from typer.testing import CliRunner

    from posttrain.cli import app

    small = [
        "model.name=tiny",
        "steps=2",
        "rollout.group_size=2",
        "rollout.prompts_per_step=1",
        "rollout.max_new_tokens=16",
        "rollout.runner.params.env_params.max_rounds=2",
        "eval.at_start=false",
        "eval.at_end=false",
        "checkpoint.every=0",
        "threads=1",
        f"out_dir={tmp_path / 'run'}",
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DegenerateSettingWarning)
        res = CliRunner().invoke(app, ["rl", "--config", CFG, *small], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r.get("kind") == "step"]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:
        assert 0.0 <= r["silo_success"] <= 1.0 and r["silo_rounds"] <= 2
    # the trained policy through the unchanged benchmark: posttrain silo run --agent hf --model RUN
    res = CliRunner().invoke(
        app,
        ["silo", "run", "--agent", "hf", "--model", str(tmp_path / "run"), "--tasks", "I-01", "--agents", "2",
         "--protocols", "p2p", "--seed", "3", "--max-rounds", "1", "--max-new-tokens", "4",
         "--out", str(tmp_path / "bench")],
        catch_exceptions=False,
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    rows = [json.loads(x) for x in (tmp_path / "bench" / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 1 and rows[0]["agent"] == f"hf:{tmp_path / 'run'}" and rows[0]["rounds"] == 1
