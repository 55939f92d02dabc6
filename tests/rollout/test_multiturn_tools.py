"""Tools in the multi-turn runner (issue 43 items 1-2): calls executed and returned as tool turns that are
attended but never trained on, malformed calls returned as errors, the call budget, the step metrics,
and token identity between generation and training under a template that re-renders earlier turns."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from _engine_helpers import ScriptedEngine, by_tool_round

from posttrain.models import load_model_and_tokenizer
from posttrain.rollout import PromptFormatter, SamplingParams
from posttrain.rollout.multiturn import MultiTurnRunner
from posttrain.tasks.base import Example

LP = -0.5


@pytest.fixture(scope="module")
def tok():
    return load_model_and_tokenizer("tiny", device="cpu", seed=0)[1]


def call(expr: str, name: str = "calculator") -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": {"expression": expr}}) + "</tool_call>"


def scripted_agent(tok, script: list[str]) -> ScriptedEngine:
    """Turn r of a conversation (r = tool responses already in its context) is ``script[r]`` + EOS."""
    return ScriptedEngine(tok, by_tool_round(script), logprob=LP)


def ex(answer: int = 7006652) -> Example:
    return Example(id="q0", prompt="What is 1234 times 5678?", answer=str(answer))


def runner(tok, engine, *, chat=True, **kw):
    kw.setdefault("env", "answer")
    kw.setdefault("system", False)
    kw.setdefault("tools", ["calculator"])
    return MultiTurnRunner(engine, PromptFormatter(tok, chat=chat), **kw)


def spans(mask: list[int]) -> list[tuple[int, int]]:
    out, start = [], None
    for i, m in enumerate([*mask, 0]):
        if m and start is None:
            start = i
        if not m and start is not None:
            out.append((start, i))
            start = None
    return out


@pytest.mark.parametrize("chat", [True, False])
def test_a_call_runs_its_result_is_a_tool_turn_and_only_generated_tokens_are_trained(tok, chat):
    eng = scripted_agent(tok, [f"I will compute. {call('1234*5678')}", "The answer is 7006652."])
    r = runner(tok, eng, chat=chat)
    eps = r.run([ex()], [2], SamplingParams(max_new_tokens=200))
    b = eps.batch
    assert eps.rewards.tolist() == [1.0, 1.0] and len(eng.calls) == 2  # one batched call per round
    assert eps.row_stats["tool_calls"].tolist() == [1.0, 1.0]
    assert eps.row_stats["tool_valid_calls"].tolist() == [1.0, 1.0]
    for i in range(2):
        n = int(b.completion_mask[i].sum())
        comp = b.completion_ids[i, :n].tolist()
        act = b.action_mask[i, :n].tolist()
        # the trained tokens are exactly the two generated rounds, in order
        gen = [eng.calls[k][1][i] for k in range(2)]
        sp = spans(act)
        assert [comp[a:e] for a, e in sp] == gen
        # between them: the tool's result, attended (completion mask 1), never trained (action 0)
        tool_text = tok.decode(comp[sp[0][1] : sp[1][0]], skip_special_tokens=False)
        assert "<tool_response>\n7006652\n</tool_response>" in tool_text
        assert b.logprobs[i, :n][torch.tensor(act) == 0].abs().sum() == 0
        # the context the engine extended in round 2 is the training row's prefix (token identity)
        ctx2 = eng.calls[1][0][i]
        assert ctx2 == (b.prompt_ids[i][b.prompt_mask[i].bool()].tolist() + comp)[: len(ctx2)]
        ti = eps.advantage_inputs["turn_index"][i, :n].tolist()
        assert {t for t, a in zip(ti, act, strict=True) if a} == {1}  # tool rounds stay in turn 1
        assert all(t == 0 for t, a in zip(ti, act, strict=True) if not a)
    # the action lengths (length metrics, length penalties) count the agent's tokens only
    assert b.action_lengths.tolist() == [
        sum(len(c) for c in (eng.calls[0][1][i], eng.calls[1][1][i])) for i in range(2)
    ]
    m = r.step_metrics(eps)
    assert m == {"tool_call_rate": 1.0, "tool_valid_rate": 1.0, "tool_calls_mean": 1.0, "tool_timeouts": 0.0}
    # the fallback format describes the tools in the prompt
    assert "calculator" in tok.decode(eng.calls[0][0][0]) and "<tool_call>" in tok.decode(eng.calls[0][0][0])


@pytest.mark.parametrize(
    ("first", "error"),
    [
        ('<tool_call>{"name": "calculator", "arguments": {"expression": </tool_call>', "malformed tool call"),
        (call("1+1", name="search"), "unknown tool 'search'"),
        ('<tool_call>{"name": "calculator", "arguments": {"expr": "1+1"}}</tool_call>', "unknown argument"),
        ('<tool_call>{"name": "calculator", "arguments": {"expression": "1+', "without its closing"),
    ],
)
def test_a_bad_call_is_returned_to_the_model_as_an_error_and_the_episode_goes_on(tok, first, error):
    eng = scripted_agent(tok, [first, "7006652"])
    r = runner(tok, eng)
    eps = r.run([ex()], [1], SamplingParams(max_new_tokens=200))
    assert eps.rewards.tolist() == [1.0]  # the episode went on to its answer
    assert eps.row_stats["tool_calls"].tolist() == [1.0] and eps.row_stats["tool_valid_calls"].tolist() == [
        0.0
    ]
    ctx2 = tok.decode(eng.calls[1][0][0])
    assert "<tool_response>\nerror: " in ctx2 and error in ctx2
    msgs = r.last_sessions[0].messages
    assert msgs[-2]["role"] == "tool" and msgs[-2]["ok"] is False
    assert r.step_metrics(eps)["tool_valid_rate"] == 0.0 and r.step_metrics(eps)["tool_call_rate"] == 1.0


def test_the_call_budget_ends_the_tool_loop(tok):
    eng = scripted_agent(tok, [f"{call('1+1')}{call('2+2')}{call('3+3')}", call("4+4")])
    r = runner(tok, eng, max_tool_calls=2)
    eps = r.run([ex(2)], [1], SamplingParams(max_new_tokens=300))
    # round 1: three calls, two run, the third is refused (budget); round 2 goes to the environment
    assert len(eng.calls) == 2
    assert eps.row_stats["tool_calls"].tolist() == [2.0] and eps.row_stats["tool_valid_calls"].tolist() == [
        2.0
    ]
    ctx2 = tok.decode(eng.calls[1][0][0])
    assert ctx2.count("\n</tool_response>") == 3 and "budget of 2 spent" in ctx2
    assert r.last_sessions[0].messages[-1] == {
        "role": "assistant",
        "content": call("4+4"),
        "turn_rewards": {"format": 0.0},
    }
    assert eps.rewards.tolist() == [0.0]  # the last number of the unexecuted call is 4, not 2
    # max_tool_calls=0 is no tool loop at all; a negative budget is refused
    eng0 = scripted_agent(tok, [call("1+1")])
    assert runner(tok, eng0, max_tool_calls=0).run(
        [ex(1)], [1], SamplingParams(max_new_tokens=200)
    ).row_stats["tool_calls"].tolist() == [0.0]
    with pytest.raises(ValueError, match="max_tool_calls must be an int >= 0"):
        runner(tok, eng0, max_tool_calls=-1)


def test_a_round_cut_at_the_token_cap_is_closed_by_an_env_eos_and_marks_the_turn(tok):
    eng = scripted_agent(tok, [call("1234*5678"), "7006652"])
    r = runner(tok, eng)
    eps = r.run([ex()], [1], SamplingParams(max_new_tokens=20))  # the call is cut: unclosed tag
    s = r.last_sessions[0]
    assert s.turns_cut == 1 and s.tool_calls == 1 and s.tool_valid == 0
    n = int(eps.batch.completion_mask[0].sum())
    comp, act = eps.batch.completion_ids[0, :n].tolist(), eps.batch.action_mask[0, :n].tolist()
    first = spans(act)[0]
    assert comp[first[1]] == tok.eos_token_id and act[first[1]] == 0  # the EOS is not the policy's
    assert s.turn_rewards == [[-1.0]]  # the turn had a cut round: a format violation


# a Qwen3-like template: earlier assistant turns lose their <think> block when re-rendered, tools are
# rendered natively (hermes), tool results become <tool_response> blocks in a user turn
STRIP_THINK = (
    "{% if tools %}<|system|>\n# Tools\n<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools>\n"
    "Call with <tool_call>{}</tool_call>\n{% endif %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'assistant' %}{% set c = m['content'] %}"
    "{% if not loop.last and '</think>' in c %}{% set c = c.split('</think>')[-1] %}{% endif %}"
    "{{ '<|assistant|>\n' + c + eos_token + '\n' }}"
    "{% elif m['role'] == 'tool' %}"
    "{% if loop.previtem is defined and loop.previtem['role'] != 'tool' %}{{ '<|user|>\n' }}{% endif %}"
    "{{ '<tool_response>\n' + m['content'] + '\n</tool_response>\n' }}"
    "{% else %}{{ '<|' + m['role'] + '|>\n' + m['content'] + '\n' }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)


@pytest.mark.parametrize("template", ["plain-chat", "strip-think"])
def test_token_identity_between_generation_and_training_under_two_templates(tok, template):
    tk = copy.deepcopy(tok)  # the same tokenizer under another template
    if template == "strip-think":
        tk.chat_template = STRIP_THINK
    eng = scripted_agent(tk, [f"<think>multiply</think>{call('1234*5678')}", "<think>done</think>7006652"])
    r = runner(tk, eng)
    assert r.tool_format == ("hermes" if template == "strip-think" else "fallback")
    eps = r.run([ex()], [1], SamplingParams(max_new_tokens=200))
    b, s = eps.batch, r.last_sessions[0]
    row = (
        b.prompt_ids[0][b.prompt_mask[0].bool()].tolist()
        + b.completion_ids[0][b.completion_mask[0].bool()].tolist()
    )
    # every generation call saw a prefix of the training row and produced the tokens that follow it
    for ctxs, comps in eng.calls:
        assert row[: len(ctxs[0])] == ctxs[0] and row[len(ctxs[0]) : len(ctxs[0]) + len(comps[0])] == comps[0]
    assert eps.rewards.tolist() == [1.0]
    text = tk.decode(row, skip_special_tokens=False)
    assert "<think>multiply</think>" in text  # the generated thinking stays in the trained tokens
    if template == "strip-think":
        # re-rendering the conversation with the template would have dropped it: the drift avoided
        msgs = [{k: v for k, v in m.items() if k in ("role", "content")} for m in s.messages]
        rerendered = tk.apply_chat_template(msgs, tools=r.tool_schemas, tokenize=False)
        assert "<think>multiply</think>" not in rerendered
        assert "<tools>" in tk.decode(eng.calls[0][0][0])  # tools rendered by the template itself
        assert "<|user|>\n<tool_response>\n7006652\n</tool_response>" in text


def test_tools_off_changes_nothing_and_bad_params_are_refused(tok):
    eng = scripted_agent(tok, [call("1+1")])
    r = runner(tok, eng, tools=None)
    eps = r.run([ex(1)], [1], SamplingParams(max_new_tokens=200))
    assert eps.row_stats == {} and r.step_metrics(eps) == {} and len(eng.calls) == 1
    assert eps.rewards.tolist() == [1.0]  # the call text is the answer (last number 1)
    with pytest.raises(ValueError, match="tool call format must be one of"):
        runner(tok, eng, tool_format="xml")
    with pytest.raises(ValueError, match="tool_turn must contain"):
        runner(tok, eng, tool_turn="Tool:")


def test_row_stats_follow_their_rows_and_a_bad_shape_is_refused(tok):
    from posttrain.rollout.episodes import Episodes

    eng = scripted_agent(tok, [call("1+1"), "2"])
    eps = runner(tok, eng).run([ex(2), ex(3)], [2, 1], SamplingParams(max_new_tokens=200))
    eps.row_stats["tool_calls"] = torch.tensor([1.0, 2.0, 3.0])
    sel = eps.select([2, 0])
    assert sel.row_stats["tool_calls"].tolist() == [3.0, 1.0]
    both = Episodes.concat([sel, eps.select([1])])
    assert both.row_stats["tool_calls"].tolist() == [3.0, 1.0, 2.0]
    with pytest.raises(ValueError, match=r"row_stats\['x'\] must be a \(3,\) tensor"):
        Episodes(eps.batch, eps.texts, eps.examples, row_stats={"x": torch.zeros(2)})


# a Llama-3-like template: tools are rendered by the template, results come back as ipython turns
LLAMA3 = (
    "{% if tools %}<|start_header_id|>system<|end_header_id|>\n\nTools: {% for t in tools %}{{ t['name'] }} "
    "{% endfor %}<|eot_id|>{% endif %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'tool' %}{{ '<|start_header_id|>ipython<|end_header_id|>\n\n' + m['content'] + '<|eot_id|>' }}"
    "{% elif m['role'] == 'assistant' %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' + m['content'] + eos_token }}"
    "{% else %}{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\n\n' + m['content'] + '<|eot_id|>' }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)


@pytest.mark.parametrize("fmt", ["hermes", "llama3"])
def test_several_tool_results_of_one_turn_render_under_each_native_format(tok, fmt):
    """A turn with two calls gets both results back, in call order, as the template's own tool turns
    (hermes: <tool_response> blocks; llama3: ipython turns), in one environment reply after the turn;
    the agent goes on in the same turn and every generation saw a prefix of the training row."""
    tk = copy.deepcopy(tok)
    tk.chat_template = STRIP_THINK if fmt == "hermes" else LLAMA3
    if fmt == "hermes":
        first = call("1+1") + call("2*3")
        marker = "\n</tool_response>"
    else:
        calls = [{"name": "calculator", "parameters": {"expression": e}} for e in ("1+1", "2*3")]
        first = "<|python_tag|>" + "; ".join(json.dumps(c) for c in calls)
        marker = "<|start_header_id|>ipython"

    def reply(context: str) -> str:
        return first if context.count(marker) == 0 else "The answers are 2 and 6."

    eng = ScriptedEngine(tk, reply, logprob=LP)
    r = runner(tk, eng)
    assert r.tool_format == fmt and r.native_tools
    eps = r.run([ex(6)], [1], SamplingParams(max_new_tokens=300))
    s = r.last_sessions[0]
    assert s.tool_calls == 2 and s.tool_valid == 2 and s.turn_rewards and len(eng.calls) == 2
    assert [m["content"] for m in s.messages if m["role"] == "tool"] == ["2", "6"]
    b = eps.batch
    row = (
        b.prompt_ids[0][b.prompt_mask[0].bool()].tolist()
        + b.completion_ids[0][b.completion_mask[0].bool()].tolist()
    )
    for ctxs, comps in eng.calls:
        assert row[: len(ctxs[0])] == ctxs[0] and row[len(ctxs[0]) : len(ctxs[0]) + len(comps[0])] == comps[0]
    # the environment tokens between the two agent rounds are exactly the template's rendering of the two
    # tool messages after an agent turn
    between = tk.decode(eng.calls[1][0][0][len(eng.calls[0][0][0]) + len(eng.calls[0][1][0]) :])
    if fmt == "hermes":
        want = "\n<|user|>\n<tool_response>\n2\n</tool_response>\n<tool_response>\n6\n</tool_response>\n"
        assert between == want + "<|assistant|>\n"
    else:
        want = "".join(f"<|start_header_id|>ipython<|end_header_id|>\n\n{v}<|eot_id|>" for v in ("2", "6"))
        assert between == want + "<|start_header_id|>assistant<|end_header_id|>\n\n"
    acts = b.action_mask[0][b.completion_mask[0].bool()].tolist()
    assert len(spans(acts)) == 2  # two agent rounds trained, the tool turns between them not


def test_a_hanging_custom_tool_ends_at_its_deadline_counted_and_the_episode_goes_on(tok):
    """A custom tool that sleeps past ``tool_timeout_s`` answers the model with a timeout error within the
    deadline (its worker is killed), the call counts as a timeout (row_stats, step metrics) and not as
    valid, and the agent's next round answers the question."""
    import time

    hang = "<tool_call>" + json.dumps({"name": "sleepy", "arguments": {"seconds": 600}}) + "</tool_call>"
    eng = scripted_agent(tok, [hang, "The answer is 7006652."])
    r = runner(tok, eng, tools=["_tool_helpers:sleepy"], tool_timeout_s=1.0)
    t0 = time.monotonic()
    eps = r.run([ex()], [1], SamplingParams(max_new_tokens=200))
    assert time.monotonic() - t0 < 1.0 + 10.0  # the deadline, plus a loaded machine's slack
    s = r.last_sessions[0]
    assert s.tool_calls == 1 and s.tool_valid == 0 and s.tool_timeouts == 1
    tool_msgs = [m for m in s.messages if m["role"] == "tool"]
    assert len(tool_msgs) == 1 and "timed out after 1 s" in tool_msgs[0]["content"]
    assert eps.rewards.tolist() == [1.0]  # the episode went on to the answer
    m = r.step_metrics(eps)
    assert m["tool_timeouts"] == 1.0 and m["tool_valid_rate"] == 0.0
