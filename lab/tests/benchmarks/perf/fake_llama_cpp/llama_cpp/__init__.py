"""A stand-in for llama-cpp-python's C API (the calls LlamaCppRunner makes), for tests on machines
without the compiled package. It checks the batched-decoding protocol as llama.cpp would see it:

* a sequence exists only after it was decoded into or copied (``llama_memory_seq_cp``) from one;
* every token's position is the next one of its sequence;
* logits are read (``llama_sampler_sample``) only for batch rows that asked for them;
* the EOS ban set by the logit-bias sampler reaches the sampler (no sampled token fed back is EOS).

A model file whose name contains ``crash`` makes ``llama_decode`` kill its process with SIGSEGV, as
the AMX kernel did on the real package. ``CALLS`` records (decode batch sizes, copies)."""

from __future__ import annotations

import ctypes
import os
import signal
from types import SimpleNamespace

__version__ = "0.0-fake"
N_VOCAB, EOS = 11, 2
CALLS: dict[str, list] = {"decode": [], "seq_cp": []}


class llama_logit_bias(ctypes.Structure):
    _fields_ = [("token", ctypes.c_int32), ("bias", ctypes.c_float)]


def llama_backend_init():
    return None


def llama_log_callback(fn):
    return fn


def llama_log_set(cb, user):
    return None


def llama_model_default_params():
    return SimpleNamespace(n_gpu_layers=-1, use_extra_bufts=True)


def llama_model_load_from_file(path, params):
    if not os.path.exists(path.decode()):
        return None
    return SimpleNamespace(path=path.decode(), extra=params.use_extra_bufts)


def llama_model_get_vocab(model):
    return model


def llama_vocab_n_tokens(vocab):
    return N_VOCAB


def llama_vocab_eos(vocab):
    return EOS


def llama_context_default_params():
    return SimpleNamespace(
        kv_unified=False,
        n_ctx=0,
        n_batch=0,
        n_ubatch=0,
        n_seq_max=1,
        n_threads=0,
        n_threads_batch=0,
        no_perf=False,
    )


def llama_init_from_model(model, cp):
    return SimpleNamespace(model=model, cp=cp, pos={}, outputs=set())


def llama_batch_init(n, embd, n_seq_max):
    return SimpleNamespace(
        token=[0] * n,
        pos=[0] * n,
        n_seq_id=[0] * n,
        logits=[False] * n,
        seq_id=[[0] * n_seq_max for _ in range(n)],
        n_tokens=0,
    )


def llama_get_memory(ctx):
    return ctx


def llama_memory_clear(mem, data):
    mem.pos.clear()


def llama_memory_seq_cp(mem, src, dst, p0, p1):
    assert src in mem.pos, f"copy from sequence {src}, which holds nothing"
    assert dst < mem.cp.n_seq_max, f"sequence {dst} >= n_seq_max {mem.cp.n_seq_max}"
    mem.pos[dst] = mem.pos[src]
    CALLS["seq_cp"].append((src, dst))


def llama_decode(ctx, b):
    if "crash" in ctx.model.path:
        os.kill(os.getpid(), signal.SIGSEGV)
    assert b.n_tokens <= ctx.cp.n_batch, f"{b.n_tokens} tokens > n_batch {ctx.cp.n_batch}"
    ctx.outputs = set()
    step = all(b.seq_id[i][0] in ctx.pos for i in range(b.n_tokens))  # one sampled token per sequence
    for i in range(b.n_tokens):
        assert b.n_seq_id[i] == 1
        s = b.seq_id[i][0]
        expected = ctx.pos.get(s, -1) + 1
        assert b.pos[i] == expected, f"row {i}: sequence {s} at position {b.pos[i]}, expected {expected}"
        assert not step or b.token[i] != EOS, f"row {i}: EOS was sampled though it is banned"
        ctx.pos[s] = b.pos[i]
        if b.logits[i]:
            ctx.outputs.add(i)
    assert sum(p + 1 for p in ctx.pos.values()) <= ctx.cp.n_ctx, "KV cache overflow"
    CALLS["decode"].append(b.n_tokens)
    return 0


def llama_sampler_chain_default_params():
    return None


def llama_sampler_chain_init(params):
    return SimpleNamespace(banned=set(), n=0)


def llama_sampler_init_logit_bias(n_vocab, n, bias):
    return {bias[i].token for i in range(n) if bias[i].bias == float("-inf")}


def llama_sampler_init_dist(seed):
    return None


def llama_sampler_chain_add(chain, s):
    if isinstance(s, set):
        chain.banned |= s


def llama_sampler_sample(chain, ctx, idx):
    assert idx in ctx.outputs, f"logits of batch row {idx} were not requested"
    chain.n += 1
    tok = chain.n % N_VOCAB
    while tok in chain.banned:
        tok = (tok + 1) % N_VOCAB
    return tok


def llama_sampler_free(s):
    return None


def llama_batch_free(b):
    return None


def llama_free(ctx):
    return None


def llama_model_free(m):
    return None
