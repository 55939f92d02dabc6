"""`/v1/completions` and chat `logprobs` over real HTTP on 127.0.0.1: the log-probs the server returns
are the trainer's recomputation (`sequence_logprobs`) of the same tokens, batching prompts does not
change them, lm-eval's `local-completions` request shapes (echo, logprobs, max_tokens 0 / 1, token-id
prompts) are answered, and the tokenizer endpoints round-trip."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi", reason="the serve extra (fastapi) is not installed: pip install -e '.[serve]'")
pytest.importorskip("uvicorn", reason="the serve extra (uvicorn) is not installed: pip install -e '.[serve]'")

import httpx
import torch

from posttrain.models import load_model_and_tokenizer, sequence_logprobs
from posttrain.serve import ServeConfig
from posttrain.serve.server import BackgroundServer

# log-prob tolerance server vs trainer: same kernels, different batch padding (docs/serve.md)
TOL = {"float32": 1e-5, "bfloat16": 2e-2}


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def served(request):
    dtype = request.param
    with BackgroundServer(ServeConfig(model="tiny", port=0, dtype=dtype)) as srv:
        model, tok = load_model_and_tokenizer("tiny", dtype=dtype, seed=0)
        with httpx.Client(timeout=60) as client:
            yield srv, client, model, tok, TOL[dtype]


def _trainer_logprobs(model, ids: list[int]) -> list[float]:
    with torch.no_grad():
        lp, _ = sequence_logprobs(model, torch.tensor([ids]))
    return lp[0, 1:].float().tolist()


def _post(client, srv, path, body, status=200):
    r = client.post(srv.base_url + path, json=body)
    assert r.status_code == status, r.text
    return r.json()


def test_echo_logprobs_equal_the_trainers_recomputation(served):
    srv, client, model, tok, tol = served
    ids = tok("12+34=46\n7*8=56", add_special_tokens=False)["input_ids"]
    body = {"prompt": [ids], "temperature": 0, "max_tokens": 1, "logprobs": 1, "echo": True, "seed": 1}
    out = _post(client, srv, "/completions", body)
    (choice,) = out["choices"]
    lp = choice["logprobs"]
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert len(lp["token_logprobs"]) == len(ids) + 1  # the prompt echoed, then one generated token
    expect = _trainer_logprobs(model, ids)
    got = lp["token_logprobs"][1:-1]
    assert max(abs(a - b) for a, b in zip(got, expect, strict=True)) < tol
    # the generated token is the greedy one: its log-prob is the top-1 value, exactly
    assert lp["token_logprobs"][-1] == max(lp["top_logprobs"][-1].values())
    for value, top in zip(lp["token_logprobs"][1:], lp["top_logprobs"][1:], strict=True):
        assert len(top) == 1 and max(top.values()) >= value - 1e-6  # the top-1 is at least the token
    assert out["usage"] == {"prompt_tokens": len(ids), "completion_tokens": 1, "total_tokens": len(ids) + 1}
    # max_tokens 0 with echo: the prompt scored, nothing generated (vLLM's prompt-logprob request)
    zero = _post(client, srv, "/completions", {"prompt": ids, "max_tokens": 0, "echo": True, "logprobs": 0})
    assert zero["choices"][0]["logprobs"]["token_logprobs"] == lp["token_logprobs"][:-1]
    assert zero["choices"][0]["text"] == tok.decode(ids)


def test_batched_prompts_score_as_single_requests(served):
    srv, client, _, tok, tol = served
    texts = ["1+1=2", "99*99=9801 and more", "7"]
    prompts = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    body = {"max_tokens": 0, "echo": True, "logprobs": 3}
    batched = _post(client, srv, "/completions", {**body, "prompt": prompts})["choices"]
    assert [c["index"] for c in batched] == [0, 1, 2]
    for p, c in zip(prompts, batched, strict=True):
        single = _post(client, srv, "/completions", {**body, "prompt": p})["choices"][0]
        a, b = c["logprobs"]["token_logprobs"][1:], single["logprobs"]["token_logprobs"][1:]
        assert len(a) == len(p) - 1
        assert all(abs(x - y) < tol for x, y in zip(a, b, strict=True))


def test_generation_with_logprobs_and_text_prompts(served):
    srv, client, model, tok, tol = served
    body = {"prompt": ["12+34=", "5+5="], "max_tokens": 6, "temperature": 0, "logprobs": 2, "n": 2}
    out = _post(client, srv, "/completions", body)
    assert [c["index"] for c in out["choices"]] == [0, 1, 2, 3]
    assert out["choices"][0]["text"] == out["choices"][1]["text"]  # greedy: n copies agree
    for c, prompt in zip(out["choices"], ["12+34="] * 2 + ["5+5="] * 2, strict=True):
        ids = tok(prompt, add_special_tokens=False)["input_ids"]
        toks = c["logprobs"]["token_logprobs"]
        assert c["logprobs"]["text_offset"][0] == 0 and all(x is not None for x in toks)
        completion = tok(c["text"], add_special_tokens=False)["input_ids"] if c["text"] else []
        if len(completion) == len(toks):  # round-trippable text: recompute from ids
            expect = _trainer_logprobs(model, ids + completion)[len(ids) - 1 :]
            assert all(abs(x - y) < tol for x, y in zip(toks, expect, strict=True))


def test_chat_logprobs_are_the_completion_tokens_scored(served):
    srv, client, model, tok, tol = served
    body = {
        "messages": [{"role": "user", "content": "2+2="}],
        "max_tokens": 5,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 3,
    }
    out = _post(client, srv, "/chat/completions", body)
    content = out["choices"][0]["logprobs"]["content"]
    assert len(content) == out["usage"]["completion_tokens"]
    prompt = tok.apply_chat_template([{"role": "user", "content": "2+2="}], add_generation_prompt=True)
    prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
    completion = [tok.convert_tokens_to_ids(e["token"]) for e in content]
    expect = _trainer_logprobs(model, prompt + completion)[len(prompt) - 1 :]
    assert all(abs(e["logprob"] - x) < tol for e, x in zip(content, expect, strict=True))
    for e in content:
        assert len(e["top_logprobs"]) == 3
        assert e["top_logprobs"][0]["logprob"] >= e["logprob"] - 1e-6
    plain = _post(client, srv, "/chat/completions", {**body, "logprobs": False, "top_logprobs": None})
    assert plain["choices"][0]["logprobs"] is None


def test_tokenizer_endpoints_and_refusals(served):
    srv, client, _, tok, _ = served
    root = srv.base_url[: -len("/v1")]
    info = client.get(root + "/tokenizer_info").json()
    assert info["eos_token"] == tok.eos_token and info["chat_template"] == tok.chat_template
    ids = client.post(root + "/tokenize", json={"prompt": "12+34=", "add_special_tokens": False}).json()
    assert ids["tokens"] == tok("12+34=", add_special_tokens=False)["input_ids"]
    assert client.post(root + "/detokenize", json={"tokens": ids["tokens"]}).json()["prompt"] == "12+34="
    err = _post(client, srv, "/completions", {"prompt": "1+1=", "max_tokens": 0}, status=400)
    assert "echo" in err["error"]["message"]
    err = _post(client, srv, "/completions", {"prompt": [10**7], "max_tokens": 1}, status=400)
    assert "vocabulary" in err["error"]["message"]
    err = _post(client, srv, "/completions", {"prompt": "x", "stream": True}, status=400)
    assert err["error"]["param"] == "stream"
    err = _post(client, srv, "/completions", {"prompt": "x", "logprobs": 21}, status=400)
    assert err["error"]["code"] == "invalid_value"
    err = _post(client, srv, "/completions", {"prompt": "x", "model": "other"}, status=404)
    assert err["error"]["code"] == "model_not_found"
