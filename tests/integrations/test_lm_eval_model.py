"""posttrain as an lm-eval model (posttrain.integrations.lm_eval.PosttrainLM) on the tiny preset:
log-likelihoods equal a direct log-softmax over the model's logits, batching changes nothing,
rolling log-likelihood is the whole string's, generation is the engine's greedy text cut at `until`;
the shipped tasks run offline and a Hub task is refused naming its dataset, while the same task
repointed at local files (`dataset_path: json`) runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("lm_eval", reason="lm-eval is not installed: pip install -e '.[lm-eval]'")

import torch
from lm_eval.api.instance import Instance

from posttrain.integrations import lm_eval as bridge
from posttrain.integrations.lm_eval_tasks import utils as task_utils


@pytest.fixture(scope="module")
def lm():
    return bridge.PosttrainLM("tiny", batch_size=4)


def _direct(model, ctx: list[int], cont: list[int]) -> tuple[float, bool]:
    """Sum of log_softmax(logits) at the continuation tokens, and whether each is the argmax."""
    ids = torch.tensor([ctx + cont])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0].double(), dim=-1)
    pos = range(len(ctx) - 1, len(ctx) + len(cont) - 1)
    total = sum(float(logp[p, t]) for p, t in zip(pos, cont, strict=True))
    greedy = all(int(logp[p].argmax()) == t for p, t in zip(pos, cont, strict=True))
    return total, greedy


def _pairs(lm):
    texts = [("12+34=", "46"), ("7*8=", "56"), ("What is 2+2? ", "four"), ("a", "bcdefghij"), ("99-1=", "98")]
    return [(lm.tok_encode(c), lm.tok_encode(x)) for c, x in texts]


def test_loglikelihood_equals_direct_log_softmax(lm):
    pairs = _pairs(lm)
    got = lm._loglikelihood_tokens([(None, c, x) for c, x in pairs])
    for (ctx, cont), (lp, greedy) in zip(pairs, got, strict=True):
        ref, ref_greedy = _direct(lm.model, ctx, cont)
        assert lp == pytest.approx(ref, abs=1e-4)
        assert greedy == ref_greedy
    # a continuation made of the argmax tokens is greedy, judged on token ids
    ctx = pairs[0][0]
    cont = []
    for _ in range(3):
        with torch.no_grad():
            cont.append(int(lm.model(torch.tensor([ctx + cont])).logits[0, -1].argmax()))
    assert lm._loglikelihood_tokens([(None, ctx, cont)])[0][1] is True


def test_batching_and_order_do_not_change_results(lm):
    pairs = _pairs(lm) * 2
    reqs = [(None, c, x) for c, x in pairs]
    one = bridge.PosttrainLM(lm=lm.lm, batch_size=1)._loglikelihood_tokens(reqs)
    many = bridge.PosttrainLM(lm=lm.lm, batch_size=7)._loglikelihood_tokens(reqs)
    rev = bridge.PosttrainLM(lm=lm.lm, batch_size=3)._loglikelihood_tokens(reqs[::-1])[::-1]
    for a, b, c in zip(one, many, rev, strict=True):
        assert a[0] == pytest.approx(b[0], abs=1e-5) and a[0] == pytest.approx(c[0], abs=1e-5)
        assert a[1] == b[1] == c[1]


def test_loglikelihood_rolling_is_the_whole_strings(lm):
    text = "The sum 12+34 is 46. The product 7*8 is 56."
    (total,) = lm.loglikelihood_rolling([Instance("loglikelihood_rolling", {}, (text,), 0)])
    ref, _ = _direct(lm.model, [lm.prefix_token_id], lm.tok_encode(text))
    assert total == pytest.approx(ref, abs=1e-4)


def test_generate_until_is_the_engines_greedy_text_batched_or_not(lm):
    prompts = ["12+34=", "7*8=", "1+1=", "99-1=", "5*5="]
    kwargs = {"until": ["\n", "9"], "max_gen_toks": 8, "do_sample": False}
    reqs = [Instance("generate_until", {}, (p, dict(kwargs)), i) for i, p in enumerate(prompts)]
    batched = lm.generate_until(reqs)
    single = bridge.PosttrainLM(lm=lm.lm, batch_size=1).generate_until(reqs)
    assert batched == single
    from posttrain.rollout.base import SamplingParams

    engine = bridge.build_generation_engine(lm.model, lm.tokenizer)
    for p, text in zip(prompts, batched, strict=True):
        out = engine.generate([lm.tok_encode(p)], [1], SamplingParams(temperature=0, max_new_tokens=8))
        full = lm.tok_decode(out.completion_lists()[0])
        cut = min([i for i in (full.find("\n"), full.find("9")) if i >= 0], default=len(full))
        assert text == full[:cut]
        assert "\n" not in text and "9" not in text


def test_shipped_mc_file_is_what_the_generator_writes():
    lines = task_utils.MC_FILE.read_text(encoding="utf-8").splitlines()
    docs = task_utils.mc_docs()
    assert [json.loads(x) for x in lines] == docs
    for d in docs:
        a, b = d["question"].rstrip("=").split("+")
        assert len(set(d["choices"])) == 4 and d["choices"][d["label"]] == str(int(a) + int(b))


def test_hub_task_is_refused_naming_its_dataset_and_runs_from_local_files(tmp_path: Path):
    with pytest.raises(bridge.HarnessError, match=r"allenai/ai2_arc.*offline"):
        bridge.run_harness("tiny", ["arc_easy"], limit=2)
    from lm_eval.tasks import TaskManager

    only_posttrains = TaskManager(include_path=[str(bridge.TASKS_DIR)], include_defaults=False)
    with pytest.raises(bridge.HarnessError, match=r"unknown lm-eval task.*posttrain_arithmetic"):
        bridge.check_offline_tasks(only_posttrains, ["no_such_task_here"])
    rows = [
        {"id": f"q{i}", "question": f"{i}+1=?", "answerKey": "B",
         "choices": {"text": [str(i), str(i + 1), str(i + 2)], "label": ["A", "B", "C"]}}
        for i in range(3)
    ]  # fmt: skip
    data = tmp_path / "arc_local.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    arc_yaml = Path(__import__("lm_eval").__file__).parent / "tasks" / "arc" / "arc_easy.yaml"
    (tmp_path / "arc_local.yaml").write_text(
        f"include: {arc_yaml}\ntask: arc_easy_local\ntag: []\ndataset_path: json\ndataset_name: null\n"
        f"dataset_kwargs:\n  data_files:\n    test: {data}\n"
        "training_split: null\nvalidation_split: null\ntest_split: test\n",
        encoding="utf-8",
    )
    res = bridge.run_harness("tiny", ["arc_easy_local"], include_path=tmp_path)
    assert res["arc_easy_local"]["sample_len"] == 3
    assert 0.0 <= res["arc_easy_local"]["acc,none"] <= 1.0


def test_chat_template_is_the_tokenizers(lm):
    turns = [{"role": "user", "content": "12+34="}]
    text = lm.apply_chat_template(turns)
    assert text == lm.tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)
    assert "12+34=" in text and text != "12+34="  # the template wrapped the turn
    # a final assistant turn is continued (lm-eval's multiple-choice chat requests), not closed
    cont = lm.apply_chat_template(
        [*turns, {"role": "assistant", "content": "4"}], add_generation_prompt=False
    )
    assert cont.rstrip().endswith("4")
