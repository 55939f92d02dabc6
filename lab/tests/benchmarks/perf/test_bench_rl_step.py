"""`posttrain bench rl-step`: FLOP count (closed form and torch's FlopCounterMode), ratio bookkeeping,
EOS suppression and samplers of the floor and plain HF, the TRL reward adapter, and the whole bench on
a micro configuration."""

from __future__ import annotations

import copy
import json
import statistics

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.flop_counter import FlopCounterMode

from posttrain.models import build_char_tokenizer, load_model_and_tokenizer, preset_config
from posttrain_lab.benchmarks.perf import rl_step as rs

MICRO = rs.RLStepPreset("micro", model="tiny", num_prompts=2, group_size=2, new_tokens=2)


@pytest.fixture(scope="module")
def tiny():
    model, tok = load_model_and_tokenizer("tiny", seed=0)
    return model, tok


@pytest.fixture(scope="module")
def eager_tiny():
    from transformers import AutoModelForCausalLM

    tok = build_char_tokenizer()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(preset_config("tiny", tok), attn_implementation="eager")
    return model, tok


# ------------------------------------------------------------------ FLOP count


def test_model_shape_of_tiny_preset_closed_form(tiny):
    model, tok = tiny
    shape = rs.ModelShape.from_model(model)
    h, mlp, layers, vocab = 128, 384, 4, len(tok)
    # per layer: q, k, v, o (h x h each) + gate, up, down (h x mlp each)
    assert shape.body_params == layers * (4 * h * h + 3 * h * mlp) == 851_968
    assert shape.head_params == vocab * h
    assert (shape.num_layers, shape.attn_width) == (layers, h)


def test_forward_flops_closed_form():
    shape = rs.ModelShape(body_params=1000, head_params=50, num_layers=2, attn_width=8)
    # p=3, n=2 -> x=4 positions: 2*1000*4 + 2*50*2 + sum_{t=1..4} 4*2*8*t = 8000 + 200 + 640
    assert rs.forward_flops(shape, 3, 2) == 8000 + 200 + 640
    step = rs.step_flops(shape, [3, 3], group_size=4, new_tokens=2)
    assert step["generation"] == step["train_forward"] == 8 * 8840
    assert step["train_backward"] == 2 * 8 * 8840
    assert step["total"] == 4 * 8 * 8840
    with pytest.raises(ValueError, match="prompt_len"):
        rs.forward_flops(shape, 0, 2)


@settings(max_examples=30, deadline=None)
@given(
    p=st.integers(1, 40),
    n=st.integers(1, 40),
    body=st.integers(0, 10**6),
    head=st.integers(0, 10**5),
    layers=st.integers(1, 8),
    width=st.integers(1, 256),
)
def test_forward_flops_attention_is_causal_sum(p, n, body, head, layers, width):
    shape = rs.ModelShape(body, head, layers, width)
    x = p + n - 1
    by_position = sum(4 * layers * width * t for t in range(1, x + 1))
    assert rs.forward_flops(shape, p, n) == 2 * body * x + 2 * head * n + by_position


def test_flop_count_matches_torch_flop_counter_forward_backward(eager_tiny):
    """torch's FlopCounterMode counts full-square attention scores (the causal mask is applied after the
    matmul); apart from that convention, the count must be exact, and backward must be 2x forward."""
    model, _ = eager_tiny
    shape = rs.ModelShape.from_model(model)
    b, p, n = 3, 5, 4
    x = p + n - 1
    ids = torch.randint(4, 50, (b, x))
    with FlopCounterMode(display=False) as fwd_counter:
        logits = model(input_ids=ids, logits_to_keep=n, use_cache=False).logits
    mine = b * rs.forward_flops(shape, p, n)
    la = shape.num_layers * shape.attn_width
    full_square = mine - b * 2 * la * x * (x + 1) + b * 4 * la * x * x
    assert fwd_counter.get_total_flops() == full_square
    with FlopCounterMode(display=False) as bwd_counter:
        logits.logsumexp(-1).mean().backward()
    assert bwd_counter.get_total_flops() == 2 * fwd_counter.get_total_flops()


def test_flop_count_matches_torch_flop_counter_generation(eager_tiny):
    """KV-cache generation: the prefill is counted full-square by torch, every decode step exactly."""
    from transformers import GenerationConfig

    model, tok = eager_tiny
    shape = rs.ModelShape.from_model(model)
    b, p, n = 3, 5, 4
    gc = GenerationConfig(
        do_sample=True,
        top_k=0,
        max_new_tokens=n,
        min_new_tokens=n,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        use_cache=True,
    )
    ids = torch.randint(4, 50, (b, p))
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=gc)
    assert out.shape == (b, p + n)
    la = shape.num_layers * shape.attn_width
    expected = b * rs.forward_flops(shape, p, n) - b * 2 * la * p * (p + 1) + b * 4 * la * p * p
    assert counter.get_total_flops() == expected


def test_matmul_rate_closed_form_and_measured():
    assert rs.matmul_gflops(1000, 2.0) == pytest.approx(1.0)
    times = rs.time_matmul(64, repeats=2)
    assert len(times) == 2 and all(t > 0 for t in times)


# ------------------------------------------------------------------ ratios and presets


def test_summarize_ratios_come_from_medians():
    times = {"posttrain": [3.0, 1.0, 2.0], "trl": [4.0, 5.0, 6.0], "floor": [1.0, 2.0, 9.0]}
    out = rs.summarize(times, flops_total=4 * 10**9, matmul_size=1000, matmul_times=[0.02, 0.01, 0.04])
    assert out["posttrain_median_step_s"] == 2.0
    assert out["trl_median_step_s"] == 5.0
    assert out["floor_s"] == 2.0
    assert out["matmul_gflops"] == pytest.approx(2e9 / 0.02 / 1e9)  # median matmul time 0.02 s
    assert out["flop_limit_s"] == pytest.approx(4.0 / 100.0)
    assert out["ratio_posttrain_over_floor"] == 1.0
    assert out["ratio_posttrain_over_trl"] == pytest.approx(0.4)
    assert out["ratio_trl_over_floor"] == pytest.approx(2.5)
    assert out["ratio_floor_over_flop_limit"] == pytest.approx(50.0)
    assert out["target_pass"] is True
    # per-round ratios: posttrain/floor = [3, 0.5, 2/9] -> median 0.5; trl/floor = [4, 2.5, 6/9] -> 2.5
    assert out["paired_ratio_posttrain_over_floor"] == pytest.approx(0.5)
    assert out["paired_ratio_trl_over_floor"] == pytest.approx(2.5)
    assert out["paired_ratio_posttrain_over_trl"] == pytest.approx(1 / 3)  # [0.75, 0.2, 1/3]
    # |1.0/0.5 - 1| = 1, |0.4/(1/3) - 1| = 0.2, |2.5/2.5 - 1| = 0
    assert out["ratio_disagreement"] == pytest.approx(1.0)


def test_summarize_judges_the_target_against_the_floor_and_reports_plain_hf_beside_it():
    """Mutant: target judged against plain HF (the multinomial floor) -> target_pass True here."""
    times = {"posttrain": [1.10, 1.08], "floor": [1.0, 1.0], "plain_hf": [1.06, 1.04]}
    out = rs.summarize(times, flops_total=1, matmul_size=10, matmul_times=[1.0])
    assert out["plain_hf_median_step_s"] == pytest.approx(1.05)
    assert out["ratio_posttrain_over_floor"] == pytest.approx(1.09)
    assert out["ratio_posttrain_over_plain_hf"] == pytest.approx(1.09 / 1.05)
    assert out["ratio_floor_over_plain_hf"] == pytest.approx(1.0 / 1.05)
    assert out["paired_ratio_floor_over_plain_hf"] == pytest.approx((1 / 1.06 + 1 / 1.04) / 2)
    assert out["ratio_plain_hf_over_flop_limit"] == pytest.approx(1.05 / out["flop_limit_s"])
    assert out["target_pass"] is False  # 1.09 > 1.05, although 1.09 / 1.05 would pass


def test_summarize_without_trl_gives_none_ratios():
    out = rs.summarize(
        {"posttrain": [1.1], "trl": [], "floor": [1.0]}, flops_total=1, matmul_size=10, matmul_times=[1.0]
    )
    assert out["trl_median_step_s"] is None
    assert out["ratio_posttrain_over_trl"] is None and out["ratio_trl_over_floor"] is None
    assert out["ratio_posttrain_over_floor"] == pytest.approx(1.1)
    assert out["paired_ratio_posttrain_over_trl"] is None
    assert out["ratio_disagreement"] == pytest.approx(0.0)  # one round: paired == ratio of medians
    assert out["target_pass"] is False


@settings(max_examples=50, deadline=None)
@given(
    pt=st.lists(st.floats(1e-3, 100.0), min_size=1, max_size=9),
    fl=st.lists(st.floats(1e-3, 100.0), min_size=1, max_size=9),
)
def test_summarize_target_is_ratio_of_medians(pt, fl):
    out = rs.summarize({"posttrain": pt, "floor": fl}, flops_total=1, matmul_size=8, matmul_times=[1.0])
    ratio = statistics.median(pt) / statistics.median(fl)
    assert out["ratio_posttrain_over_floor"] == pytest.approx(ratio)
    assert out["target_pass"] == (ratio <= rs.TARGET_POSTTRAIN_OVER_FLOOR)


def test_presets_match_the_issue_and_validate():
    tiny, small = rs.get_preset("tiny"), rs.get_preset("small")
    assert (tiny.num_prompts, tiny.group_size, tiny.new_tokens, tiny.model) == (16, 8, 8, "tiny")
    assert (small.num_prompts, small.group_size, small.new_tokens, small.model) == (8, 8, 32, "small")
    assert tiny.batch_size == 128
    smol = rs.get_preset("smol")  # the real model, the CPU's native precision, fast engine
    assert (smol.model, smol.num_prompts, smol.group_size, smol.new_tokens) == ("smollm2-135m", 8, 4, 32)
    from posttrain.models.precision import resolve_precision

    assert (smol.precision, smol.engine) == (resolve_precision("auto", "cpu")[0], "fast")  # fp32 on AVX2
    assert (tiny.precision, tiny.engine) == ("fp32", "hf")  # the tiny target is unchanged
    with pytest.raises(ValueError, match="unknown precision 'fp8'"):
        rs.RLStepPreset("x", "tiny", 2, 2, 2, precision="fp8")
    with pytest.raises(ValueError, match="engine must be hf, fast or vllm"):
        rs.RLStepPreset("x", "tiny", 2, 2, 2, engine="sglang")
    assert rs.RLStepPreset("x", "tiny", 2, 2, 2, engine="vllm").engine == "vllm"
    with pytest.raises(ValueError, match="unknown rl-step preset 'huge'; known: small, smol, tiny"):
        rs.get_preset("huge")
    with pytest.raises(ValueError, match="group_size must be >= 2"):
        rs.RLStepPreset("x", "tiny", 2, 1, 2)
    with pytest.raises(ValueError, match="new_tokens must be an integer >= 1"):
        rs.RLStepPreset("x", "tiny", 2, 2, 0)


def test_token_count_check_names_the_side():
    result = {"completion_tokens": {"floor": {"min": 2, "max": 2, "count": 4}, "trl": {"min": 1, "max": 2}}}
    with pytest.raises(RuntimeError, match=r"trl: completions have 1\.\.2 tokens, expected exactly 2"):
        rs._check_token_counts(result, 2)


# ------------------------------------------------------------------ the implementations


class _PreferEOS:
    """Forward hook on the LM head: +50 on the EOS logit, so an unsuppressed sampler stops at once."""

    def __init__(self, eos: int) -> None:
        self.eos = eos

    def __call__(self, module, args, output):
        output = output.clone()
        output[..., self.eos] += 50.0
        return output


@pytest.mark.parametrize("sampler", ["draw", "multinomial"])
def test_floor_step_suppresses_eos_and_updates_weights(tiny, sampler):
    model, tok = tiny
    model = copy.deepcopy(model)
    handle = model.get_output_embeddings().register_forward_hook(_PreferEOS(tok.eos_token_id))
    try:
        with torch.no_grad():  # sanity: without suppression the hooked model stops immediately
            ids = torch.tensor([tok("1+2=")["input_ids"]])
            out = model.generate(input_ids=ids, max_new_tokens=4, do_sample=True, top_k=0)
        assert out.shape[1] == ids.shape[1] + 1 and out[0, -1] == tok.eos_token_id
        floor = rs.FloorStep(model, tok, ["1+2=", "10+20="], MICRO, sampler=sampler)
        before = [p.detach().clone() for p in model.parameters()]
        metrics = floor.step()
    finally:
        handle.remove()
    assert floor.completion_lengths == [MICRO.new_tokens] * MICRO.batch_size
    assert torch.isfinite(torch.tensor(metrics["loss"]))
    changed = sum(not torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))
    assert changed == len(before)  # AdamW moved every parameter


def test_floor_samples_with_posttrains_draw_and_plain_hf_with_multinomial(tiny, monkeypatch):
    """The floor must draw every token with posttrain's inverse-CDF sampler (`posttrain.rollout.hf._draw`,
    from its own generator) and plain HF with HF's `torch.multinomial`.
    Mutant (the old floor): the floor samples with `generate(do_sample=True)` -> `_draw` is never called
    and the global torch RNG advances."""
    import posttrain.rollout.hf as hf

    model, tok = tiny
    calls = {"draw": 0, "multinomial": 0}
    real_draw, real_multinomial = hf._draw, torch.multinomial

    def counting_draw(probs, generator):
        calls["draw"] += 1
        return real_draw(probs, generator)

    def counting_multinomial(*args, **kwargs):
        calls["multinomial"] += 1
        return real_multinomial(*args, **kwargs)

    monkeypatch.setattr(hf, "_draw", counting_draw)
    monkeypatch.setattr(torch, "multinomial", counting_multinomial)
    runs = {}
    for sampler in ("draw", "multinomial"):
        calls.update(draw=0, multinomial=0)
        floor = rs.FloorStep(copy.deepcopy(model), tok, ["1+2=", "10+20="], MICRO, sampler=sampler, seed=3)
        rng = torch.get_rng_state()
        floor.step()
        runs[sampler] = (dict(calls), torch.equal(rng, torch.get_rng_state()), floor.name)
    # one draw per decode step for the whole batch; the global RNG untouched
    assert runs["draw"] == ({"draw": MICRO.new_tokens, "multinomial": 0}, True, "floor")
    assert runs["multinomial"] == ({"draw": 0, "multinomial": MICRO.new_tokens}, False, "plain_hf")
    with pytest.raises(ValueError, match="unknown sampler 'gumbel'; known: draw, multinomial"):
        rs.FloorStep(model, tok, ["1+2="], MICRO, sampler="gumbel")


TRL_SKIP_REASON = "TRL is not installed (the TRL side needs `pip install -e '.[bench]'`)"


def _require_trl() -> None:
    if rs.trl_versions() is None:
        pytest.skip(TRL_SKIP_REASON)


def test_posttrain_side_suppresses_eos(tiny, tmp_path):
    """posttrain's trainer, configured by the bench, generates exactly new_tokens even when EOS dominates."""
    model, tok = tiny
    params, _, _ = rs.bench_task(MICRO)
    pt_model = copy.deepcopy(model)
    pt_model.get_output_embeddings().register_forward_hook(_PreferEOS(tok.eos_token_id))
    pt = rs.PosttrainStep(
        pt_model, copy.deepcopy(tok), MICRO, params, seed=0, steps=1, out_dir=str(tmp_path / "pt")
    )
    try:
        metrics = pt.step()
    finally:
        pt.close()
    assert pt.completion_lengths == [MICRO.new_tokens] * MICRO.batch_size
    assert metrics["length_mean"] == MICRO.new_tokens


def test_trl_side_suppresses_eos(tiny, tmp_path):
    """TRL's GRPOTrainer, configured by the bench, generates exactly new_tokens even when EOS dominates."""
    _require_trl()
    model, tok = tiny
    _, examples, reward_fn = rs.bench_task(MICRO)
    trl_model = copy.deepcopy(model)
    trl_model.get_output_embeddings().register_forward_hook(_PreferEOS(tok.eos_token_id))
    trl = rs.TRLRun(
        trl_model,
        copy.deepcopy(tok),
        examples,
        reward_fn,
        MICRO,
        total_steps=1,
        seed=0,
        output_dir=str(tmp_path),
    )
    steps = []
    trl.run(lambda i, dt: steps.append((i, dt)))
    assert [i for i, _ in steps] == [0] and steps[0][1] > 0
    assert trl.reward.completion_lengths == [MICRO.new_tokens] * MICRO.batch_size


def test_floor_batch_is_left_padded_and_grouped(tiny):
    model, tok = tiny
    floor = rs.FloorStep(model, tok, ["1+2=", "10+20="], MICRO)
    assert floor.input_ids.shape == (4, 6)
    assert floor.attention_mask.tolist() == [[0, 0, 1, 1, 1, 1]] * 2 + [[1] * 6] * 2
    assert floor.input_ids[0, 0] == tok.pad_token_id
    assert floor.input_ids[2].tolist() == tok("10+20=")["input_ids"]


def test_trl_reward_adapter_scores_through_posttrain_reward():
    from posttrain.rewards import get_reward
    from posttrain.tasks import get_task

    task = get_task("arithmetic", n_train=3, n_heldout=2)
    examples = task.split("train")
    adapter = rs._TRLRewardAdapter(get_reward("exact_match"), examples)
    assert adapter.__name__ == "exact_match"
    completions = [examples[0].answer, "nope", examples[2].answer]
    ids = [[5, 6], [7], [8, 9]]
    rewards = adapter(
        prompts=[e.prompt for e in examples],
        completions=completions,
        completion_ids=ids,
        example_id=[e.id for e in examples],
        trainer_state=None,
    )
    assert rewards == [1.0, 0.0, 1.0]
    assert adapter.completion_lengths == [2, 1, 2]


# ------------------------------------------------------------------ end to end


REQUIRED_KEYS = {
    "preset",
    "posttrain_median_step_s",
    "trl_median_step_s",
    "floor_s",
    "flop_limit_s",
    "matmul_gflops",
    "ratio_posttrain_over_floor",
    "ratio_posttrain_over_trl",
    "ratio_trl_over_floor",
    "ratio_floor_over_flop_limit",
    "target_posttrain_over_floor",
    "target_pass",
    "step_times_s",
    "flops",
    "completion_tokens",
}


def _check_result(result: dict, *, with_trl: bool, repeats: int) -> None:
    assert set(result) >= REQUIRED_KEYS
    times = result["step_times_s"]
    med = {side: statistics.median(v) for side, v in times.items() if v}
    assert len(times["posttrain"]) == len(times["floor"]) == repeats
    assert result["posttrain_median_step_s"] == pytest.approx(med["posttrain"])
    assert result["floor_s"] == pytest.approx(med["floor"])
    assert result["ratio_posttrain_over_floor"] == pytest.approx(med["posttrain"] / med["floor"])
    mm = statistics.median(result["matmul_times_s"])
    gflops = 2 * result["matmul_size"] ** 3 / mm / 1e9
    assert result["matmul_gflops"] == pytest.approx(gflops)
    assert result["flop_limit_s"] == pytest.approx(result["flops"]["total"] / (gflops * 1e9))
    assert result["ratio_floor_over_flop_limit"] == pytest.approx(med["floor"] / result["flop_limit_s"])
    assert len(times["plain_hf"]) == repeats
    assert result["plain_hf_median_step_s"] == pytest.approx(med["plain_hf"])
    assert result["ratio_floor_over_plain_hf"] == pytest.approx(med["floor"] / med["plain_hf"])
    n = result["config"]["new_tokens"]
    sides = ("posttrain", "floor", "plain_hf") + (("trl",) if with_trl else ())
    expected_count = (repeats + result["warmup"]) * result["config"]["batch_size"]
    for side in sides:  # EOS suppressed: every completion of every step has exactly new_tokens tokens
        stats = result["completion_tokens"][side]
        assert stats == {"min": n, "max": n, "count": expected_count}, side
    if with_trl:
        assert len(times["trl"]) == repeats
        assert result["trl_median_step_s"] == pytest.approx(med["trl"])
        assert result["ratio_posttrain_over_trl"] == pytest.approx(med["posttrain"] / med["trl"])
        assert result["ratio_trl_over_floor"] == pytest.approx(med["trl"] / med["floor"])
        assert result["trl_skipped_reason"] is None
    else:
        assert result["trl_median_step_s"] is None and result["ratio_trl_over_floor"] is None
        assert result["trl_skipped_reason"]


def test_bench_micro_end_to_end_with_trl():
    """All four sides; every side's sample count is checked (the old check looked at the last side of
    the loop only, a leftover loop variable). Skipped, with the reason, when TRL is not installed."""
    _require_trl()
    result = rs.run_rl_step_bench(
        MICRO, repeats=1, warmup=1, with_trl=True, matmul_size=128, matmul_repeats=2, threads=1
    )
    _check_result(result, with_trl=True, repeats=1)
    assert result["torch_threads"] == 1
    assert result["prompt_tokens"] and all(p > 0 for p in result["prompt_tokens"])


def test_cli_rl_step_writes_json(tmp_path):
    """Every side's completion count is checked. Mutant tried: posttrain's recorded lengths cut to the
    first step -> fails here; the old check (the leftover loop variable, i.e. the last side only) passed."""
    from typer.testing import CliRunner

    from posttrain.cli import app

    out = tmp_path / "rl_step.json"
    args = ["bench", "rl-step", "--preset", "tiny", "--prompts", "2", "--group-size", "2"]
    args += ["--new-tokens", "2", "--repeats", "2", "--warmup", "0", "--no-trl", "--matmul-size", "128"]
    args += ["--threads", "1", "--json", str(out), "--quiet"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "posttrain / floor" in res.output and "FLOP limit" in res.output
    assert "posttrain / plain HF" in res.output and "floor / plain HF" in res.output
    result = json.loads(out.read_text())
    _check_result(result, with_trl=False, repeats=2)
    assert result["preset"] == "tiny" and result["config"]["num_prompts"] == 2


def test_cli_rl_step_rejects_unknown_preset():
    from typer.testing import CliRunner

    from posttrain.cli import app

    res = CliRunner().invoke(app, ["bench", "rl-step", "--preset", "huge"], env={"COLUMNS": "200"})
    assert res.exit_code == 2
    assert "unknown rl-step preset 'huge'; known: small, smol, tiny" in res.output


def test_cli_rl_step_without_trl_prints_the_install_hint_verbatim(monkeypatch):
    """Through the real CLI with TRL unavailable: the hint names the extra, `./lab[bench]`.
    Mutant (the old code): rich markup ate `[bench]` and printed `pip install 'posttrain'`."""
    from typer.testing import CliRunner

    from posttrain.cli import app

    monkeypatch.setattr(rs, "trl_versions", lambda: None)
    args = ["bench", "rl-step", "--preset", "tiny", "--prompts", "2", "--group-size", "2"]
    args += ["--new-tokens", "2", "--repeats", "1", "--warmup", "0", "--matmul-size", "64"]
    args += ["--threads", "1", "--quiet"]
    res = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert 'TRL skipped: trl is not installed (pip install -e "./lab[bench]")' in res.output


def test_bench_micro_bf16_fast_engine_records_precision_figures():
    """The real-model preset's settings (bf16 on every side, posttrain on the fast engine) on the micro
    configuration: the bf16 matmul rate and FLOP limit, the load average, posttrain's mismatch metrics."""
    import dataclasses

    micro = dataclasses.replace(MICRO, precision="bf16", engine="fast")
    result = rs.run_rl_step_bench(
        micro, repeats=1, warmup=1, with_trl=False, matmul_size=128, matmul_repeats=2, threads=1
    )
    _check_result(result, with_trl=False, repeats=1)
    mm16 = statistics.median(result["matmul_times_bf16_s"])
    assert result["matmul_gflops_bf16"] == pytest.approx(2 * 128**3 / mm16 / 1e9)
    assert result["flop_limit_bf16_s"] == pytest.approx(
        result["flops"]["total"] / (result["matmul_gflops_bf16"] * 1e9)
    )
    assert result["ratio_posttrain_over_flop_limit_bf16"] == pytest.approx(
        result["posttrain_median_step_s"] / result["flop_limit_bf16_s"]
    )
    assert len(result["loadavg_start"]) == 3 and len(result["loadavg_rounds"]) == 2
    assert 0 <= result["posttrain_rollout_logp_diff"] < 0.05
    assert result["posttrain_rollout_ratio_mean"] == pytest.approx(1.0, abs=0.05)
    assert result["config"]["precision"] == "bf16" and result["config"]["engine"] == "fast"


def test_phase_breakdown_closed_form():
    """Medians per phase, shares of the median step, `other` = the step time no timer covers, and the
    training row = forwards before rewards + update judged on the train FLOPs. Mutants: the train FLOPs
    put on the update row alone (its first micro-batch forward runs before the rewards), or `other`
    left out, change these numbers."""
    metrics = [
        {
            "time_step": 10.0,
            "time_generation": 6.0,
            "time_forward_overlap": 1.0,
            "time_reward_wait": 0.5,
            "time_update": 2.0,
        },
        {
            "time_step": 12.0,
            "time_generation": 7.0,
            "time_forward_overlap": 1.0,
            "time_reward_wait": 0.5,
            "time_update": 3.0,
        },
        {
            "time_step": 11.0,
            "time_generation": 6.5,
            "time_forward_overlap": 1.0,
            "time_reward_wait": 0.5,
            "time_update": 2.5,
        },
    ]
    flops = {"generation": 65 * 10**9, "train_forward": 10 * 10**9, "train_backward": 20 * 10**9}
    rows = {r["phase"].split(" ")[0]: r for r in rs.phase_breakdown(metrics, flops, gflops_rate=100.0)}
    gen, upd, fw, other, train = (
        rows["generation"],
        rows["update"],
        rows["forwards"],
        rows["other"],
        rows["training"],
    )
    assert gen["median_s"] == 6.5 and gen["share"] == pytest.approx(6.5 / 11.0)
    assert gen["gflop"] == pytest.approx(65.0) and gen["achieved_gflops"] == pytest.approx(10.0)
    assert gen["x_limit"] == pytest.approx(6.5 / 0.65)
    assert upd["gflop"] is None and fw["gflop"] is None and fw["median_s"] == 1.0
    assert train["median_s"] == pytest.approx(3.5) and train["gflop"] == pytest.approx(30.0)
    assert train["x_limit"] == pytest.approx(3.5 / 0.30)
    assert other["median_s"] == pytest.approx(0.5)  # 10-9.5, 12-11.5, 11-10.5
    assert rs.phase_breakdown([], flops, 1.0) == []


def test_cli_rl_step_profile_prints_phases_and_top_ops(tmp_path):
    from typer.testing import CliRunner

    from posttrain.cli import app

    out = tmp_path / "rl_step.json"
    args = ["bench", "rl-step", "--preset", "tiny", "--prompts", "2", "--group-size", "2"]
    args += ["--new-tokens", "2", "--repeats", "1", "--warmup", "0", "--no-trl", "--matmul-size", "64"]
    args += ["--threads", "1", "--quiet", "--profile", "--json", str(out)]
    res = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "where posttrain's step goes" in res.output and "top operators" in res.output
    result = json.loads(out.read_text())
    phases = result["posttrain_phases"]
    assert [p["phase"].split(" ")[0] for p in phases] == [
        "generation",
        "forwards",
        "reward",
        "update",
        "other",
        "training",
    ]
    assert sum(p["share"] for p in phases[:5]) == pytest.approx(1.0, abs=0.05)
    ops = result["posttrain_profile"]
    assert ops and all(o["calls"] >= 1 and o["self_s"] > 0 for o in ops)
    assert [o["self_s"] for o in ops] == sorted((o["self_s"] for o in ops), reverse=True)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_bf16_matmul_rate_timed_only_for_a_bf16_run(monkeypatch, precision):
    """The bf16 FLOP rate is the limit of a bf16 run only; on a CPU without native bf16 a 2048^2 bf16
    matmul takes seconds each, and an fp32 run (precision auto there) timed it every round anyway."""
    import dataclasses

    import torch

    dtypes = []
    real = rs.time_matmul

    def spy(size, repeats=3, dtype=None):
        dtypes.append(dtype or torch.float32)
        return real(16, repeats=1, dtype=dtype)

    monkeypatch.setattr(rs, "time_matmul", spy)
    preset = dataclasses.replace(MICRO, precision=precision)
    out = rs.run_rl_step_bench(preset, repeats=1, warmup=0, with_trl=False, matmul_size=16, matmul_repeats=1)
    assert (torch.bfloat16 in dtypes) == (precision == "bf16")
    assert out["config"]["precision"] == precision
