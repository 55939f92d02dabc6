"""`posttrain serve` nits a new user met (issue 30, item 15): a NaN temperature named as such, and
"serving on" printed only once the model has loaded."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi", reason="the serve extra (fastapi) is not installed: pip install -e '.[serve]'")
pytest.importorskip("uvicorn", reason="the serve extra (uvicorn) is not installed: pip install -e '.[serve]'")

import httpx
from typer.testing import CliRunner

from posttrain.cli import app
from posttrain.serve import ServeConfig
from posttrain.serve.app import create_app
from posttrain.serve.model import ChatModel
from posttrain.serve.server import BackgroundServer


@pytest.mark.parametrize("value", ["NaN", "Infinity"])
def test_a_non_finite_temperature_is_named_as_such(value):
    cfg = ServeConfig(model="tiny", port=0, default_max_tokens=2)
    with BackgroundServer(cfg, app=create_app(cfg, ChatModel(cfg))) as srv:
        body = '{"messages": [{"role": "user", "content": "hi"}], "temperature": ' + value + "}"
        r = httpx.post(
            f"{srv.base_url}/chat/completions",
            content=body,
            headers={"content-type": "application/json"},
            timeout=60,
        )
    assert r.status_code == 400, r.text
    msg = r.json()["error"]["message"]
    assert "temperature" in msg and "finite number" in msg and "<= 2" not in msg


def test_serving_is_announced_only_after_the_model_loaded(tmp_path):
    res = CliRunner().invoke(app, ["serve", str(tmp_path / "no-such-model"), "--port", "0"])
    assert res.exit_code == 2
    assert "error: model" in res.output and "on http://" not in res.output  # no "serving ... on ..."


def test_a_client_that_goes_away_stops_its_generation(caplog):
    import dataclasses
    import time

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
