"""In-process checks of posttrain.train.dist: log-probs and gradients through a DDP wrapper, the metric
reduction rules, prompt sharding, per-rank checkpoint state and the refusals of unsupported hooks."""

from __future__ import annotations

import math

import pytest
import torch

from posttrain.hooks import PromptPlan
from posttrain.hooks.base import GroupFilter, NoReplay, ReplayBuffer
from posttrain.models import load_model_and_tokenizer, sequence_logprobs
from posttrain.models.logprobs import CausalLMHidden
from posttrain.train import dist


@pytest.fixture
def one_rank_group(tmp_path):
    """A real gloo process group of world size 1 (DDP needs one), torn down afterwards."""
    torch.distributed.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    try:
        yield
    finally:
        torch.distributed.destroy_process_group()


def _batch():
    ids = torch.tensor([[0, 0, 5, 6, 7, 8, 9], [3, 4, 5, 6, 7, 8, 2]])
    am = torch.tensor([[0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]])
    resp = torch.zeros_like(am)
    resp[:, 4:] = 1
    return ids, am, resp


def test_logprobs_and_gradients_through_the_ddp_wrapper_equal_the_plain_model(one_rank_group):
    model, _ = load_model_and_tokenizer("tiny", device="cpu", seed=0)
    ids, am, resp = _batch()
    lp0, ent0 = sequence_logprobs(model, ids, am, response_mask=resp, temperature=0.7)
    (lp0.sum() + 0.1 * ent0.sum()).backward()
    g0 = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)

    ddp = torch.nn.parallel.DistributedDataParallel(CausalLMHidden(model))
    lp1, ent1 = sequence_logprobs(ddp, ids, am, response_mask=resp, temperature=0.7)
    torch.testing.assert_close(lp1, lp0)
    torch.testing.assert_close(ent1, ent0)
    (lp1.sum() + 0.1 * ent1.sum()).backward()  # through the wrapper: DDP's reducer sees every grad
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, g0[n], msg=n)
    # the head is shared, not copied, and the wrapper's module is what sequence_logprobs ran
    assert ddp.module.lm is model


def test_wrap_model_is_the_model_itself_in_one_process():
    model = torch.nn.Linear(2, 2)
    assert dist.wrap_model(model) is model
    assert dist.rank_seed(7) == 7 and dist.is_main()


def test_causal_lm_hidden_refuses_a_model_without_a_head():
    with pytest.raises(ValueError, match="no output embedding"):
        CausalLMHidden(torch.nn.Linear(2, 2))


def _as_ranks(monkeypatch, parts: list[dict], me: int = 0) -> None:
    """Pretend to be rank ``me`` of len(parts) ranks whose gathered objects are ``parts``."""
    monkeypatch.setattr(dist, "is_distributed", lambda: True)
    monkeypatch.setattr(dist, "world_size", lambda: len(parts))
    monkeypatch.setattr(dist, "rank", lambda: me)
    monkeypatch.setattr(dist, "gather", lambda obj: parts)


def _local(rewards: list[float], groups: int, numel: float) -> dict:
    r = torch.tensor(rewards, dtype=torch.float64)
    return {
        "reward_mean": float(r.mean()),
        "reward_std": float(r.std()),
        "accuracy": float((r > 0.5).double().mean()),
        "num_sequences": float(len(r)),
        "num_groups": float(groups),
        "zero_var_frac": 1.0 / groups,
        "length_max": float(len(r)),
        "group_size_min": 2.0,
        "advantage_abs_mean": 0.5,
        "advantage_numel": numel,
        "time_step": float(len(r)),
        "grad_norm": 3.0,
        "pg_loss": 7.0,
    }


def test_reduce_metrics_gives_the_global_batch_values(monkeypatch):
    a, b = [0.0, 1.0, 1.0, 0.2], [0.3, 0.9]
    parts = [_local(a, 2, 8.0), _local(b, 1, 12.0)]
    _as_ranks(monkeypatch, parts)
    mine = {k: v for k, v in parts[0].items() if k != "advantage_numel"}
    out = dist.reduce_metrics(mine, weights={"advantage_numel": 8.0}, global_keys={"pg_loss"})
    allr = torch.tensor(a + b, dtype=torch.float64)
    assert out["reward_mean"] == pytest.approx(float(allr.mean()))
    assert out["reward_std"] == pytest.approx(float(allr.std()))  # pooled, Bessel-corrected
    assert out["accuracy"] == pytest.approx(float((allr > 0.5).double().mean()))
    assert out["num_sequences"] == 6 and out["num_groups"] == 3
    assert out["zero_var_frac"] == pytest.approx((2 * 0.5 + 1 * 1.0) / 3)  # group-weighted
    assert out["length_max"] == 4 and out["time_step"] == 4 and out["group_size_min"] == 2
    assert out["advantage_abs_mean"] == pytest.approx(0.5)
    assert out["grad_norm"] == 3.0 and out["pg_loss"] == 7.0  # identical on every rank / already global
    assert "advantage_numel" not in out


def test_reduce_metrics_is_the_identity_in_one_process():
    m = {"reward_mean": 0.25, "num_sequences": 4.0}
    assert dist.reduce_metrics(m) is m


def test_shard_plan_gives_each_rank_its_contiguous_block(monkeypatch):
    plan = PromptPlan(list("abcdef"), [1, 2, 3, 4, 5, 6])
    assert dist.shard_plan(plan) is plan
    blocks = []
    for r in range(3):
        _as_ranks(monkeypatch, [{}] * 3, me=r)
        p = dist.shard_plan(plan)
        blocks.append((p.examples, p.n_per_prompt))
    assert blocks == [(["a", "b"], [1, 2]), (["c", "d"], [3, 4]), (["e", "f"], [5, 6])]
    _as_ranks(monkeypatch, [{}] * 4)
    with pytest.raises(ValueError, match="6 prompts cannot be split evenly over 4 ranks"):
        dist.shard_plan(plan)


def test_checkpoint_rank_states_round_trip(monkeypatch):
    from posttrain.train.checkpoint import capture_rng

    torch.manual_seed(1)
    rng1 = capture_rng()
    gen1 = torch.Generator().manual_seed(11).get_state()
    monkeypatch.setattr(dist, "is_distributed", lambda: True)
    monkeypatch.setattr(dist, "world_size", lambda: 2)
    monkeypatch.setattr(dist, "gather", lambda mine: [mine, ({"engine.generator": gen1}, *rng1)])
    state: dict = {}
    extra = {"engine.generator": torch.Generator().manual_seed(10).get_state()}
    dist.add_rank_states(state, extra)
    assert state["dist"]["world_size"] == 2 and set(state["dist"]["rng"]) == {"1"}
    assert torch.equal(extra["rank1.engine.generator"], gen1)
    state["extra_tensors"] = extra

    monkeypatch.setattr(dist, "rank", lambda: 0)  # rank 0: its own (single-process) entries only
    assert set(dist.restore_rank_state(state)) == {"engine.generator"}
    monkeypatch.setattr(dist, "rank", lambda: 1)  # rank 1: its tensors and its torch RNG
    torch.manual_seed(99)
    got = dist.restore_rank_state(state)
    assert torch.equal(got["engine.generator"], gen1)
    assert torch.equal(torch.get_rng_state(), rng1[0]["torch_cpu"])
    monkeypatch.setattr(dist, "rank", lambda: 2)  # a rank the checkpoint does not have: keeps its seed
    assert dist.restore_rank_state(state) == {}


class _Filtering(GroupFilter):  # any group filter: extra sampling rounds
    def decide(self, outcomes, need):
        raise NotImplementedError


class _Replay(ReplayBuffer):  # any buffer but NoReplay
    def draw(self, plan, step):
        return [[] for _ in plan.examples]


def test_unsupported_multi_process_settings_are_refused(monkeypatch):
    dist.check_rl_hooks(3, object(), _Replay(), group_filter=_Filtering())  # one process: anything goes
    _as_ranks(monkeypatch, [{}, {}])
    with pytest.raises(ValueError, match="prompts_per_step=3 is not a multiple of the world size 2"):
        dist.check_rl_hooks(3, object(), NoReplay())
    with pytest.raises(ValueError, match="filters groups"):
        dist.check_rl_hooks(4, object(), NoReplay(), group_filter=_Filtering())
    with pytest.raises(ValueError, match=r"hooks\.replay _Replay: replay buffers are not supported"):
        dist.check_rl_hooks(4, object(), _Replay())
    dist.check_rl_hooks(4, object(), NoReplay())


def test_setup_is_a_no_op_without_torchrun(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert dist.setup("cpu") == "cpu" and not dist.is_distributed()
    monkeypatch.setenv("WORLD_SIZE", "x")
    with pytest.raises(ValueError, match="WORLD_SIZE='x' is not an integer"):
        dist.setup("cpu")


def test_on_main_and_main_only_in_one_process():
    assert dist.on_main(lambda: 41 + 1) == 42
    logger = dist.main_only(lambda: "the logger")
    assert logger == "the logger"
    assert math.isfinite(dist.global_sum(torch.tensor(2.0)).item())


def test_multi_process_sft_needs_a_causal_lm_adapter_and_an_even_batch(monkeypatch):
    from posttrain.models import CausalLMAdapter

    lm = CausalLMAdapter(torch.nn.Linear(2, 2), tokenizer=object())
    assert dist.wrap_adapter(lm, batch_size=3) is lm  # one process: the adapter itself
    _as_ranks(monkeypatch, [{}, {}])
    with pytest.raises(ValueError, match="batch_size=3 is not a multiple of the world size 2"):
        dist.wrap_adapter(lm, batch_size=3)
    with pytest.raises(ValueError, match="causal-LM adapters only, got object"):
        dist.wrap_adapter(object(), batch_size=4)
    assert dist.shard(list(range(6))) == [0, 1, 2]


def test_unknown_strategy_is_refused_and_fsdp_helpers_are_no_ops_without_fsdp():
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match=r"distributed\.strategy: unknown value .zero3."):
        dist.wrap_model(model, "zero3")
    assert dist.wrap_model(model, "fsdp") is model  # one process: nothing to shard
    assert not dist.is_sharded(model)
    with dist.full_params(model):
        pass
    opt = torch.optim.AdamW(model.parameters())
    assert dist.full_state_dicts(model, opt) == (None, None)
    assert dist.optimizer_loader(model, opt) is None


def test_fsdp2_pieces_on_one_rank_equal_the_plain_model(one_rank_group):
    """FSDP2 on a 1-rank gloo mesh (the sharding code paths; 2 ranks: test_fsdp_processes.py): log-probs,
    gradients, clipping, generation inside full_params and the gathered state dicts."""
    import copy

    from torch.distributed.tensor import DTensor

    from posttrain.train.optim import clip_and_step

    plain, _ = load_model_and_tokenizer("tiny", device="cpu", seed=0)
    model = copy.deepcopy(plain)
    root = dist._fully_shard(model)
    assert dist.is_sharded(model) and isinstance(model.lm_head.weight, DTensor)
    assert isinstance(root, CausalLMHidden) and root.lm is model
    ids, am, resp = _batch()
    opts = [torch.optim.AdamW(m.parameters(), lr=0.1) for m in (plain, model)]
    norms = []
    for m, opt in zip((plain, root), opts, strict=True):
        lp, ent = sequence_logprobs(m, ids, am, response_mask=resp, temperature=0.7)
        (lp.sum() + 0.1 * ent.sum()).backward()
        norms.append(clip_and_step(m if m is plain else model, opt, 0.5))
    assert norms[0] == pytest.approx(norms[1], rel=1e-5) and norms[0] > 0.5  # the clip was active
    for (n, p), q in zip(plain.named_parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(q.full_tensor(), p.detach(), msg=n)

    prompt = torch.tensor([[5, 6, 7]])
    with dist.full_params(model):
        assert not isinstance(model.lm_head.weight, DTensor)
        out = model.generate(
            prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=4, do_sample=False
        )
    ref = plain.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=4, do_sample=False)
    assert torch.equal(out, ref)
    assert isinstance(model.lm_head.weight, DTensor)  # sharded again

    msd, osd = dist.full_state_dicts(model, opts[1])
    ref_sd = plain.state_dict()
    assert msd.keys() == ref_sd.keys()
    for k, v in ref_sd.items():
        torch.testing.assert_close(msd[k], v, msg=k)
    sd0 = opts[0].state_dict()  # the one-process layout: parameters numbered, not named
    assert osd["param_groups"] == sd0["param_groups"] and osd["state"].keys() == sd0["state"].keys()
    for i, st in sd0["state"].items():
        for k, v in st.items():
            torch.testing.assert_close(osd["state"][i][k], v, msg=f"{i}.{k}")

    model.zero_grad(set_to_none=True)  # as at resume: torch initialises the state only without grads
    fresh = torch.optim.AdamW(model.parameters(), lr=0.1)
    dist.optimizer_loader(model, fresh)(sd0)  # a one-process checkpoint's optimizer into FSDP2
    _, again = dist.full_state_dicts(model, fresh)
    for i, st in sd0["state"].items():
        torch.testing.assert_close(again["state"][i]["exp_avg"], st["exp_avg"], msg=str(i))
