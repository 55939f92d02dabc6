"""The same numbers three ways on the tiny preset: lm-eval's in-process `posttrain` model, lm-eval's
`local-completions` client against `posttrain serve` (127.0.0.1), and `posttrain eval` (the generation
task is its arithmetic held-out split), with every non-loopback connection refused: the harness
never reaches the network."""

from __future__ import annotations

import ipaddress
import socket

import pytest

pytest.importorskip("lm_eval", reason="lm-eval is not installed: pip install -e '.[lm-eval]'")
pytest.importorskip("fastapi", reason="the serve extra (fastapi) is not installed: pip install -e '.[serve]'")

from posttrain.integrations import lm_eval as bridge
from posttrain.serve import ServeConfig
from posttrain.serve.server import BackgroundServer

LIMIT = 6
TASKS = ["posttrain_arithmetic_mc", "posttrain_arithmetic"]


class NetworkAttempt(AssertionError):
    pass


def _loopback(address) -> bool:
    if not isinstance(address, tuple):  # AF_UNIX path
        return True
    host = address[0]
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@pytest.fixture
def no_network(monkeypatch):
    real_connect, real_connect_ex = socket.socket.connect, socket.socket.connect_ex

    def connect(self, address):
        if not _loopback(address):
            raise NetworkAttempt(f"network connection attempted to {address!r}")
        return real_connect(self, address)

    def connect_ex(self, address):
        if not _loopback(address):
            raise NetworkAttempt(f"network connection attempted to {address!r}")
        return real_connect_ex(self, address)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)
    with pytest.raises(NetworkAttempt):  # the guard is live
        socket.create_connection(("192.0.2.1", 80), timeout=1)


def _per_doc(results: dict, task: str) -> list:
    return [s["filtered_resps"] for s in sorted(results["samples"][task], key=lambda s: s["doc_id"])]


def test_in_process_server_and_posttrain_eval_agree(no_network):
    from lm_eval import simple_evaluate

    from posttrain.train.evaluate import evaluate_cli_settings, evaluate_run, locate_model

    inproc = bridge.run_harness("tiny", TASKS, limit=LIMIT, log_samples=True, full=True)
    with BackgroundServer(ServeConfig(model="tiny", port=0)) as srv:
        served = simple_evaluate(
            model="local-completions",
            model_args={"base_url": srv.base_url + "/completions", "model": "tiny", "max_retries": 1},
            tasks=TASKS,
            limit=LIMIT,
            task_manager=bridge.task_manager(),
            bootstrap_iters=0,
            log_samples=True,
        )
    for task in TASKS:
        assert inproc["results"][task]["acc,none"] == served["results"][task]["acc,none"]
    mc_in, mc_srv = _per_doc(inproc, TASKS[0]), _per_doc(served, TASKS[0])
    assert len(mc_in) == LIMIT
    for doc_in, doc_srv in zip(mc_in, mc_srv, strict=True):
        for (ll_a, greedy_a), (ll_b, greedy_b) in zip(doc_in, doc_srv, strict=True):
            assert ll_a == pytest.approx(ll_b, abs=1e-4)
            assert bool(greedy_a) == bool(greedy_b)
    gen_in = [r[0] for r in _per_doc(inproc, TASKS[1])]
    gen_srv = [r[0] for r in _per_doc(served, TASKS[1])]
    assert gen_in == gen_srv
    assert any(gen_in)  # the texts compared are real generations, not all empty

    loc = locate_model("tiny")
    own = evaluate_run(loc, evaluate_cli_settings(loc, None, [], n=LIMIT, task="arithmetic"))
    assert own["accuracy"] == inproc["results"][TASKS[1]]["acc,none"]
    for i, sample in enumerate(own["samples"]):
        assert sample["completion"].split("\n")[0] == gen_in[i]
