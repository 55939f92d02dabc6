"""`posttrain serve` over real HTTP on 127.0.0.1: valid requests and usage, streaming, every 4xx (a
non-finite temperature named as such), the body-size bound (declared and chunked), the in-flight
bound under concurrent clients, a client that goes away stopping its generation, "serving on" only
once the model has loaded, and the bounded loopback load test. (The lab's HTTP clients against this
server: lab/tests/benchmarks/silo/test_agents.py, lab/tests/recipes/patarm/test_judge_source.py.)"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time

import pytest

pytest.importorskip("fastapi", reason="the serve extra (fastapi) is not installed: pip install -e '.[serve]'")
pytest.importorskip("uvicorn", reason="the serve extra (uvicorn) is not installed: pip install -e '.[serve]'")

import httpx
import torch

from posttrain.serve import ServeConfig
from posttrain.serve.app import create_app
from posttrain.serve.model import ChatModel, _cut_at_stop
from posttrain.serve.server import BackgroundServer

HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)  # a 1M-parameter model: more threads only contend on a busy CPU
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def cfg():
    return ServeConfig(
        model="tiny",
        port=0,
        max_prompt_tokens=4000,
        max_tokens=128,
        default_max_tokens=8,
        max_n=4,
        max_request_bytes=64 * 1024,
        max_messages=16,
    )


@pytest.fixture(scope="module")
def model(cfg):
    return ChatModel(cfg)


@pytest.fixture(scope="module")
def srv(cfg, model):
    with BackgroundServer(cfg, app=create_app(cfg, model)) as s:
        yield s


def post(srv, body=None, **kw):
    if body is not None:
        kw["json"] = body
    return httpx.post(f"{srv.base_url}/chat/completions", timeout=60, **kw)


def assert_error(r, status, code=None, match=None):
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    e = r.json()["error"]
    assert set(e) == {"message", "type", "param", "code"} and e["message"]
    if code is not None:
        assert e["code"] == code, e
    if match is not None:
        assert match in e["message"], e["message"]
    return e


# ------------------------------------------------------------------------------------------ valid
def test_models_and_health(srv):
    data = httpx.get(f"{srv.base_url}/models").json()
    assert data["object"] == "list" and [m["id"] for m in data["data"]] == ["tiny"]
    assert data["data"][0]["max_prompt_tokens"] == 4000
    assert httpx.get(f"http://127.0.0.1:{srv.port}/health").json()["status"] == "ok"


def test_chat_completion_usage_counts_real_tokens(srv, model):
    msgs = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "2+2?"}]},
    ]
    r = post(srv, {"model": "tiny", "messages": msgs, "max_tokens": 12, "n": 3, "seed": 1})
    assert r.status_code == 200, r.text
    d = r.json()
    assert d["object"] == "chat.completion" and d["model"] == "tiny" and len(d["choices"]) == 3
    from posttrain.serve.config import ChatMessage

    prompt = model.render([ChatMessage(**m) for m in msgs])
    u = d["usage"]
    assert u["prompt_tokens"] == len(prompt)
    assert (
        3 <= u["completion_tokens"] <= 36 and u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
    )
    for c in d["choices"]:
        assert c["message"]["role"] == "assistant" and isinstance(c["message"]["content"], str)
        assert c["finish_reason"] in ("stop", "length")
    # max_completion_tokens is the newer spelling of max_tokens; omitted -> default_max_tokens (8)
    r = post(srv, {"messages": HI, "max_completion_tokens": 2, "temperature": 0})
    assert r.json()["usage"]["completion_tokens"] <= 2
    assert post(srv, {"messages": HI}).json()["usage"]["completion_tokens"] <= 8


def test_special_token_strings_in_content_are_sent_as_text(srv):
    """Issue 41 item 19 over HTTP: "<eos>" typed by a client is five characters of the prompt (the tiny
    model's tokenizer is per character), not the end-of-sequence token."""

    def prompt_tokens(text):
        r = post(srv, {"messages": [{"role": "user", "content": text}], "max_tokens": 1, "seed": 0})
        assert r.status_code == 200, r.text
        return r.json()["usage"]["prompt_tokens"]

    assert prompt_tokens("ab<eos>") == prompt_tokens("ab") + len("<eos>")


def test_same_seed_same_text_and_stream_matches(srv):
    body = {"messages": HI, "max_tokens": 16, "seed": 5, "temperature": 1.0}
    a, b = post(srv, body).json(), post(srv, body).json()
    assert a["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"]
    r = post(srv, {**body, "stream": True, "stream_options": {"include_usage": True}})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = [line[6:] for line in r.text.split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == a["choices"][0]["message"]["content"]
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == a["choices"][0][
        "finish_reason"
    ]
    assert chunks[-1]["usage"] == a["usage"]


def test_stop_sequences_cut_text():
    assert _cut_at_stop("abc<END>def", ["zz", "<END>"]) == ("abc", True)
    assert _cut_at_stop("a.b;c", [";", "."]) == ("a", True)
    assert _cut_at_stop("abc", ["x"]) == ("abc", False)
    assert _cut_at_stop("abc", None) == ("abc", False)


# ------------------------------------------------------------------------------------------- 4xx
def test_malformed_json_and_bad_fields_are_400(srv):
    assert_error(
        post(srv, content=b'{"messages": [', headers={"content-type": "application/json"}),
        400,
        "invalid_json",
        "malformed JSON",
    )
    assert_error(post(srv, content=b"[1, 2]"), 400, "invalid_json", "JSON object")
    assert_error(post(srv, content=b"\xff\xfe"), 400, "invalid_json")
    e = assert_error(post(srv, {"messages": []}), 400, "invalid_value", "messages")
    assert e["param"] == "messages"
    assert_error(post(srv, {"messages": [{"role": "wizard", "content": "x"}]}), 400, match="messages.0.role")
    assert_error(post(srv, {"messages": HI, "temperature": 3}), 400, match="temperature")
    assert_error(post(srv, {"messages": HI, "top_p": 0}), 400, match="top_p")
    assert_error(post(srv, {"messages": HI, "max_tokens": "ten"}), 400, match="max_tokens")
    assert_error(post(srv, {"messages": HI, "stop": ["a", "b", "c", "d", "e"]}), 400, match="at most 4")
    img = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]
    assert_error(post(srv, {"messages": img}), 400, match="messages.0.content")


@pytest.mark.parametrize("value", ["NaN", "Infinity"])
def test_a_non_finite_temperature_is_named_as_such(srv, value):
    body = '{"messages": [{"role": "user", "content": "hi"}], "temperature": ' + value + "}"
    r = post(srv, content=body, headers={"content-type": "application/json"})
    e = assert_error(r, 400)
    assert "temperature" in e["message"] and "finite number" in e["message"] and "<= 2" not in e["message"]


def test_server_bounds_are_400_404_405(srv):
    assert_error(post(srv, {"messages": HI, "max_tokens": 129}), 400, match="at most 128")
    assert_error(post(srv, {"messages": HI, "n": 5}), 400, match="max_n")
    assert_error(post(srv, {"messages": HI * 17}), 400, match="max_messages")
    assert_error(post(srv, {"model": "gpt-4", "messages": HI}), 404, "model_not_found", "'tiny'")
    long = [{"role": "user", "content": "x" * 4100}]
    assert_error(post(srv, {"messages": long}), 400, "context_length_exceeded", "4000")
    assert_error(httpx.get(f"{srv.base_url}/chat/completions"), 405)
    assert_error(httpx.get(f"{srv.base_url}/nothing"), 404, match="/v1/nothing")


def test_oversized_body_is_413_declared_or_chunked(srv):
    big = {"messages": [{"role": "user", "content": "y" * (70 * 1024)}]}
    assert_error(post(srv, big), 413, "request_too_large", "65536")

    def chunks():  # no Content-Length: chunked transfer encoding, so only the read-side count stops it
        for _ in range(80):
            yield b" " * 1024

    assert_error(post(srv, content=chunks()), 413, "request_too_large")
    assert post(srv, {"messages": HI, "max_tokens": 2}).status_code == 200  # still serving


# ----------------------------------------------------------------------------------- concurrency
def test_clients_beyond_the_limit_get_429_and_the_rest_are_served(cfg, model):
    tight = cfg.model_copy(update={"max_concurrent_requests": 2})
    with BackgroundServer(tight, app=create_app(tight, model)) as s:

        async def burst(k):
            async with httpx.AsyncClient(timeout=60) as http:
                body = {"messages": HI, "max_tokens": 128, "temperature": 1.0}
                return await asyncio.gather(
                    *(http.post(f"{s.base_url}/chat/completions", json=body) for _ in range(k))
                )

        rs = asyncio.run(burst(8))
        codes = sorted(r.status_code for r in rs)
        assert set(codes) <= {200, 429} and codes.count(200) >= 2 and codes.count(429) >= 1, codes
        for r in rs:
            if r.status_code == 429:
                assert_error(r, 429, "too_many_requests", "max_concurrent_requests")
                assert r.headers["retry-after"] == "1"
        health = httpx.get(f"http://127.0.0.1:{s.port}/health").json()
        assert health["inflight"] == 0 and health["rejected"] == codes.count(429)
        assert (
            httpx.post(f"{s.base_url}/chat/completions", json={"messages": HI, "max_tokens": 2}).status_code
            == 200
        )


def test_a_client_that_goes_away_stops_its_generation(caplog):
    cfg = ServeConfig(model="tiny", port=0, max_tokens=3000, max_prompt_tokens=100)
    model = ChatModel(cfg)
    lengths = []
    real = model.engine.generate

    def no_eos(prompts, n, params):  # the tiny model may stop early: make it run to max_tokens
        out = real(prompts, n, dataclasses.replace(params, suppress_eos=True))
        lengths.append(int(out.completion_ids.shape[1]))
        return out

    model.engine.generate = no_eos
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3000}
    with BackgroundServer(cfg, app=create_app(cfg, model)) as srv:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{srv.base_url}/chat/completions", json=body, timeout=0.5)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            health = httpx.get(srv.base_url.removesuffix("/v1") + "/health", timeout=10).json()
            if health["cancelled"]:
                break
            time.sleep(0.1)
        r = httpx.post(f"{srv.base_url}/chat/completions", json={**body, "max_tokens": 2}, timeout=60)
        assert r.status_code == 200, r.text
    assert health["cancelled"] == 1
    assert lengths[0] < 3000  # stopped when the client left, not after all 3000 tokens
    drops = [r for r in caplog.records if "client went away" in r.getMessage()]
    assert len(drops) == 1  # one line per drop
    assert [r.getMessage() for r in caplog.records if r.levelno >= 40] == []  # no tracebacks logged


# ------------------------------------------------------------------------------------ load test
def test_bench_serve_command_reports_throughput_and_latency(tmp_path):
    from typer.testing import CliRunner

    from posttrain.cli import app

    out = tmp_path / "serve.json"
    r = CliRunner().invoke(
        app,
        [
            "bench",
            "serve",
            "--requests",
            "6",
            "--clients",
            "3",
            "--max-tokens",
            "4",
            "--warmup",
            "1",
            "--json",
            str(out),
        ],
    )
    assert r.exit_code == 0, r.output
    assert "req/s" in r.output and "p99" in r.output
    res = json.loads(out.read_text())
    assert res["ok"] == 6 and res["status_counts"] == {"200": 6}
    assert 0 < res["latency_p50_s"] <= res["latency_p99_s"] <= res["latency_max_s"]
    assert res["completion_tokens"] <= 24 and res["requests_per_s"] > 0


def test_percentile_nearest_rank():
    from posttrain.serve.loadtest import percentile

    v = [float(x) for x in range(1, 101)]
    assert percentile(v, 50) == 50 and percentile(v, 99) == 99 and percentile(v, 100) == 100
    assert percentile([3.0], 99) == 3.0


def test_serve_cli_errors(monkeypatch):
    from typer.testing import CliRunner

    from posttrain.cli import app

    r = CliRunner().invoke(app, ["serve", "tiny", "--max-tokens", "4", "--default-max-tokens", "9"])
    assert r.exit_code != 0 and "default_max_tokens (9) must be <= max_tokens (4)" in r.output
    monkeypatch.setitem(__import__("sys").modules, "uvicorn", None)
    r = CliRunner().invoke(app, ["serve", "tiny"])
    assert r.exit_code == 2 and 'install the serve extra (pip install -e ".[serve]")' in r.output


def test_serving_is_announced_only_after_the_model_loaded(tmp_path):
    from typer.testing import CliRunner

    from posttrain.cli import app

    res = CliRunner().invoke(app, ["serve", str(tmp_path / "no-such-model"), "--port", "0"])
    assert res.exit_code == 2
    assert "error: model" in res.output and "on http://" not in res.output  # no "serving ... on ..."
