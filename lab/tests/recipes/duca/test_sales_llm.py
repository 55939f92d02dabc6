"""`sales-llm`: the LLM customer over real HTTP on 127.0.0.1 only. One conversation against
`posttrain serve` on the tiny preset (the replies are gibberish; the protocol is what is checked),
endpoint failures (HTTP 500 after the retries, a timeout, a refused connection) ending the
conversation cleanly with a flag, and config errors naming the param."""

from __future__ import annotations

import json
import re
import socket
import time
from pathlib import Path

import pytest
import torch
import yaml
from _chat_server import LoopbackServer, QuietHandler, send_json

from posttrain.envs import check_step, env_factory
from posttrain_lab.recipes.duca.sales import SalesEnv, SalesTask
from posttrain_lab.recipes.duca.sales_llm import CUSTOMER_PROMPT, SalesLLMEnv, endpoint_failures

SEED = 7


@pytest.fixture(scope="module")
def example():
    return SalesTask(n_train=4, n_heldout=2).split("heldout")[0]


# --------------------------------------------------------------------------- posttrain serve, tiny
@pytest.fixture(scope="module")
def served():
    pytest.importorskip("fastapi", reason="the serve extra (fastapi) is not installed")
    pytest.importorskip("uvicorn", reason="the serve extra (uvicorn) is not installed")
    from posttrain.serve import ServeConfig
    from posttrain.serve.app import create_app
    from posttrain.serve.model import ChatModel
    from posttrain.serve.server import BackgroundServer

    class RecordingModel(ChatModel):
        """The served model, recording the messages of every request it renders."""

        def __init__(self, cfg):
            super().__init__(cfg)
            self.requests: list[list[dict[str, str]]] = []

        def render(self, messages):
            self.requests.append([{"role": m.role, "content": m.text()} for m in messages])
            return super().render(messages)

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    cfg = ServeConfig(model="tiny", port=0, max_tokens=16, default_max_tokens=8)
    model = RecordingModel(cfg)
    with BackgroundServer(cfg, app=create_app(cfg, model)) as srv:
        yield srv, model
    torch.set_num_threads(n)


AGENT_TURNS = [
    "Hello! What are you looking for today?",
    "Hello! What are you looking for today? As an AI I can help.",
    "It is guaranteed to work.",
]


def test_conversation_against_posttrain_serve(served, example):
    srv, model = served
    model.requests.clear()
    make = env_factory(
        "sales-llm",
        {"base_url": srv.base_url, "model": "tiny", "max_tokens": 8, "timeout_s": 60, "max_turns": 3},
    )
    env, rules = make(), SalesEnv(max_turns=3)
    assert isinstance(env, SalesLLMEnv)
    opening = env.reset(example, SEED)
    assert opening == rules.reset(example, SEED)  # the opening is rule-based, no request
    assert model.requests == []
    system = CUSTOMER_PROMPT.format(
        customer=example.meta["customer"], need=example.meta["need"], budget=example.meta["budget"]
    )
    replies = []
    for turn, text in enumerate(AGENT_TURNS, 1):
        res = check_step(env, env.step(text), turn)
        want = rules.step(text)
        assert res.turn_rewards == want.turn_rewards  # every criterion by the rules
        assert res.done == (turn == 3) and res.done == want.done
        if not res.done:
            replies.append(res.observation)
            assert res.info["rule_reply"] == want.observation
    assert res.session_reward == 0.0 == want.session_reward
    # the criteria fired where the rules say: repetition + disclosure on turn 2, a claim on turn 3
    assert rules.counts == {"repetition": 1, "ai_disclosure": 1, "forbidden_claim": 1, "format": 0}
    # two requests (turns 1 and 2); the last turn ends the session without one
    assert len(model.requests) == 2
    first, second = model.requests
    assert first == [
        {"role": "system", "content": system},
        {"role": "assistant", "content": opening},
        {"role": "user", "content": AGENT_TURNS[0]},
    ]
    assert second == [
        *first,
        {"role": "assistant", "content": replies[0]},
        {"role": "user", "content": AGENT_TURNS[1]},
    ]
    s = env.summary()
    assert s["endpoint_failed"] is False and s["endpoint_error"] is None
    assert s["llm_replies"] == 2 and s["user"] == "llm" and s["conversion"] is False
    assert s["violations"] == rules.counts


def test_conversion_stays_rule_based_without_a_request(served, example):
    srv, model = served
    model.requests.clear()
    env = SalesLLMEnv(base_url=srv.base_url, model="tiny", max_tokens=4, timeout_s=60)
    env.reset(example, SEED)
    product = example.answer.split(",")[0]
    res = env.step(f"I recommend the {product}.")
    assert res.done and res.session_reward == 1.0 and model.requests == []
    assert env.summary()["conversion"] is True and env.summary()["sold"] == product


# ------------------------------------------------------------------------ failing endpoints
class _Stub(QuietHandler):
    mode = "500"
    hits: list[dict] = []

    def do_POST(self):
        body = self.json_body()
        type(self).hits.append({"auth": self.headers.get("Authorization"), "body": body})
        if self.mode == "sleep":
            time.sleep(1.5)
        if self.mode == "ok":
            out = json.dumps({"choices": [{"message": {"role": "assistant", "content": "Maybe."}}]})
            status = 200
        else:
            out = json.dumps({"error": {"message": "boom"}})
            status = 500
        send_json(self, status, out.encode())  # a client that timed out is ignored


@pytest.fixture
def stub():
    _Stub.hits = []
    with LoopbackServer(_Stub) as srv:
        yield srv.url, _Stub


def _fast(base_url, **kw):
    return SalesLLMEnv(base_url=base_url, model="m", backoff_base=0.0, backoff_max=0.0, **kw)


def test_http_500_after_retries_ends_cleanly(stub, example):
    url, handler = stub
    handler.mode = "500"
    before = endpoint_failures()
    env = _fast(url, max_retries=2, timeout_s=5)
    env.reset(example, SEED)
    res = check_step(env, env.step("As an AI, what do you need?"), 1)
    assert res.done and res.session_reward == 0.0
    assert res.turn_rewards["ai_disclosure"] == -1.0  # the turn is still scored by the rules
    assert len(handler.hits) == 3  # 1 + max_retries attempts
    s = env.summary()
    assert s["endpoint_failed"] is True and "HTTP 500" in s["endpoint_error"]
    assert "HTTP 500" in res.info["endpoint_error"]
    assert endpoint_failures() == before + 1


def test_timeout_ends_cleanly(stub, example):
    url, handler = stub
    handler.mode = "sleep"
    before = endpoint_failures()
    env = _fast(url, max_retries=0, timeout_s=0.2)
    env.reset(example, SEED)
    t0 = time.monotonic()
    res = env.step("Hi, what do you need?")
    assert time.monotonic() - t0 < 1.4  # bounded by timeout_s, not by the server
    assert res.done and res.session_reward == 0.0
    assert env.summary()["endpoint_failed"] is True and "timeout" in env.summary()["endpoint_error"]
    assert endpoint_failures() == before + 1


def test_refused_connection_ends_cleanly(example):
    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = _fast(f"http://127.0.0.1:{port}/v1", max_retries=1, timeout_s=2)
    env.reset(example, SEED)
    res = env.step("Hi?")
    assert res.done and env.summary()["endpoint_failed"] is True
    assert "connection error" in env.summary()["endpoint_error"]


def test_api_key_from_named_env_var_and_sampling_params(stub, example, monkeypatch):
    url, handler = stub
    handler.mode = "ok"
    monkeypatch.setenv("SALES_LLM_TEST_KEY", "sk-test")
    env = _fast(url, api_key_env="SALES_LLM_TEST_KEY", temperature=0.3, max_tokens=12)
    env.reset(example, SEED)
    res = env.step("Hi?")
    assert not res.done and res.observation == "Maybe."
    (hit,) = handler.hits
    assert hit["auth"] == "Bearer sk-test"
    assert hit["body"]["model"] == "m" and hit["body"]["temperature"] == 0.3
    assert hit["body"]["max_tokens"] == 12


# ------------------------------------------------------------------------------- config errors
@pytest.mark.parametrize(
    ("params", "names"),
    [
        ({"timeout_s": 0}, "timeout_s"),
        ({"max_retries": -1}, "max_retries"),
        ({"temperature": 3.0}, "temperature"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"base_url": "127.0.0.1:8000/v1"}, "base_url"),
        ({"model": ""}, "model"),
        ({"api_key_env": "SALES_LLM_SURELY_UNSET_VAR"}, "api_key_env"),
        ({"max_turns": 0}, "max_turns"),
    ],
)
def test_config_errors_name_the_param(params, names):
    full = {"base_url": "http://127.0.0.1:9/v1", "model": "m", **params}
    with pytest.raises(ValueError, match=names):
        env_factory("sales-llm", full)


def test_missing_endpoint_param_is_named():
    with pytest.raises(ValueError, match=r"missing required parameter.*'model'"):
        env_factory("sales-llm", {"base_url": "http://127.0.0.1:9/v1"})


# ---------------------------------------------------------------------------------------- docs
DOC = Path(__file__).resolve().parents[4] / "docs" / "multi-turn.md"


def _section() -> str:
    text = DOC.read_text()
    return text.split("## The `sales-llm` environment")[1].split("\n## ")[0]


def test_docs_print_the_customer_prompt():
    block = re.search(r"```text\n(.*?)```", _section(), re.S).group(1)
    assert " ".join(block.split()) == " ".join(CUSTOMER_PROMPT.split())


def test_docs_example_config_builds_the_env():
    yaml_text = re.search(r"```yaml\n(.*?)```", _section(), re.S).group(1)
    params = yaml.safe_load(yaml_text)["rollout"]["runner"]["params"]
    assert params["env"] == "sales-llm"
    env = env_factory(params["env"], params["env_params"])()
    assert isinstance(env, SalesLLMEnv) and env.max_turns == params["env_params"]["max_turns"]


# -------------------------------------------------------------------------------- the runner
def test_runner_survives_a_failing_endpoint_and_reports_the_rate(stub, example):
    """A training-step rollout over a 500-only endpoint: no exception, every conversation ends after
    its first turn with reward 0, and the evaluation reports ``endpoint_failed_rate`` = 1."""
    from posttrain.models import load_model_and_tokenizer
    from posttrain.rollout import PromptFormatter, RolloutBatch, SamplingParams
    from posttrain.rollout.multiturn import MultiTurnRunner

    url, handler = stub
    handler.mode = "500"
    tok = load_model_and_tokenizer("tiny", device="cpu", seed=0)[1]

    class Say:
        pad_token_id = int(tok.pad_token_id)

        def generate(self, prompt_ids, n_per_prompt, params):
            ids = [*tok.encode("What do you need?", add_special_tokens=False), tok.eos_token_id]
            n = len(prompt_ids)
            return RolloutBatch.from_token_lists(
                prompt_ids,
                [ids] * n,
                pad_token_id=self.pad_token_id,
                group_ids=list(range(n)),
                finish_reasons=["stop"] * n,
                logprobs=[[-1.0] * len(ids)] * n,
            )

    runner = MultiTurnRunner(
        Say(),
        PromptFormatter(tok),
        env="sales-llm",
        env_params={"base_url": url, "model": "m", "max_retries": 0, "timeout_s": 5, "max_turns": 4},
    )
    before = endpoint_failures()
    eps = runner.run([example], [2], SamplingParams(max_new_tokens=32))
    assert eps.advantage_inputs["num_turns"].tolist() == [1, 1]
    assert eps.rewards.tolist() == [0.0, 0.0]
    m = runner.eval_metrics(eps)
    assert m["endpoint_failed_rate"] == 1.0
    assert endpoint_failures() == before + 2
