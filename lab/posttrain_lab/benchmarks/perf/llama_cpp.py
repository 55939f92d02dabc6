"""llama.cpp beside the torch engines in `posttrain bench generate` (docs/bench-generate.md).

:class:`LlamaCppRunner` drives llama.cpp's C API through ``llama-cpp-python`` the way llama.cpp's own
``batched`` example does: the prompt is decoded once as sequence 0, its KV cache is copied to the other
B-1 sequences (``llama_memory_seq_cp``), then every step decodes one ``llama_batch`` holding one token of
each of the B sequences. Each token is drawn by llama.cpp's sampler chain (EOS banned by a logit bias,
then ``dist``: softmax at temperature 1 over the full vocabulary, no top-k/top-p), the same rule the
torch cells use, so every completion has exactly ``new_tokens`` tokens.

:class:`LlamaCppWorker` runs the runner in a separate process (``spawn``): a crash inside llama.cpp
(a segfault in a CPU kernel) ends the worker, not the benchmark, which then reports the crash and goes
on without the llama.cpp column.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from posttrain.utils.errors import InvalidValueError, PosttrainError, PosttrainRuntimeError


class LlamaCppWorkerDied(PosttrainError, RuntimeError):
    """The llama.cpp worker process ended (crash or error) before answering."""


def llama_cpp_version() -> str | None:
    """llama-cpp-python's version, or None when it is not installed. Does not import it (importing loads
    llama.cpp's shared libraries; only the worker process does that)."""
    from importlib import metadata, util

    if util.find_spec("llama_cpp") is None:
        return None
    try:
        return metadata.version("llama-cpp-python")
    except metadata.PackageNotFoundError:
        return "unknown"


class LlamaCppRunner:
    """One llama.cpp model and context, sized for ``max_batch`` sequences of ``max_len`` positions.

    ``extra_bufts`` is llama.cpp's ``use_extra_bufts`` model parameter (extra CPU buffer types: AMX
    kernels and weight repacking). It is off by default: on the machine this bench was written on (Xeon
    with AMX, llama-cpp-python 0.3.36) the AMX matmul segfaulted in the first ``llama_decode``
    (``ggml_backend_amx_mul_mat``)."""

    def __init__(
        self,
        gguf: str | Path,
        *,
        threads: int,
        max_batch: int,
        max_len: int,
        seed: int = 0,
        extra_bufts: bool = False,
    ) -> None:
        import llama_cpp as L

        self.L = L
        L.llama_backend_init()
        # llama.cpp logs every load step to stderr; the callback must stay referenced while it is set
        self._log_cb = L.llama_log_callback(lambda _level, _text, _user: None)
        L.llama_log_set(self._log_cb, None)
        mparams = L.llama_model_default_params()
        mparams.n_gpu_layers = 0
        mparams.use_extra_bufts = bool(extra_bufts)
        self.model = L.llama_model_load_from_file(str(gguf).encode(), mparams)
        if not self.model:
            raise PosttrainRuntimeError(f"llama.cpp could not load {gguf}")
        self.vocab = L.llama_model_get_vocab(self.model)
        self.n_vocab = int(L.llama_vocab_n_tokens(self.vocab))
        self.max_batch, self.max_len = max_batch, max_len
        cparams = L.llama_context_default_params()
        # one unified KV cache holding the shared prompt once plus every sequence's new tokens
        cparams.kv_unified = True
        cparams.n_ctx = max_len * max_batch + 16
        cparams.n_batch = cparams.n_ubatch = max(max_len, max_batch)
        cparams.n_seq_max = max_batch
        cparams.n_threads = cparams.n_threads_batch = threads
        cparams.no_perf = True
        self.ctx = L.llama_init_from_model(self.model, cparams)
        if not self.ctx:
            raise PosttrainRuntimeError(
                f"llama.cpp could not create a context for {max_batch} x {max_len} tokens"
            )
        self.batch = L.llama_batch_init(max(max_len, max_batch), 0, max_batch)
        bias = (L.llama_logit_bias * 1)()
        bias[0].token, bias[0].bias = int(L.llama_vocab_eos(self.vocab)), float("-inf")
        self.sampler = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
        L.llama_sampler_chain_add(self.sampler, L.llama_sampler_init_logit_bias(self.n_vocab, 1, bias))
        L.llama_sampler_chain_add(self.sampler, L.llama_sampler_init_dist(seed))

    def _fill(
        self, tokens: Sequence[int], positions: Sequence[int], seqs: Sequence[int], logits: Sequence[bool]
    ) -> None:
        b = self.batch
        for i, (t, p, s, lg) in enumerate(zip(tokens, positions, seqs, logits, strict=True)):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = t, p, 1, lg
            b.seq_id[i][0] = s
        b.n_tokens = len(tokens)

    def _decode(self) -> None:
        rc = self.L.llama_decode(self.ctx, self.batch)
        if rc != 0:
            raise PosttrainRuntimeError(f"llama_decode returned {rc}")

    def generate(self, prompt_ids: Sequence[int], batch: int, new_tokens: int) -> list[list[int]]:
        """``batch`` sampled completions of ``prompt_ids``, each exactly ``new_tokens`` tokens."""
        L, n = self.L, len(prompt_ids)
        if batch > self.max_batch or n + new_tokens > self.max_len:
            raise InvalidValueError(
                f"llama.cpp runner sized for {self.max_batch} x {self.max_len} tokens, "
                f"asked for {batch} x {n + new_tokens}"
            )
        mem = L.llama_get_memory(self.ctx)
        L.llama_memory_clear(mem, True)
        self._fill(prompt_ids, range(n), [0] * n, [False] * (n - 1) + [True])
        self._decode()
        for s in range(1, batch):
            L.llama_memory_seq_cp(mem, 0, s, -1, -1)
        out: list[list[int]] = [[] for _ in range(batch)]
        rows = [n - 1] * batch  # batch index of each sequence's logits (the prompt's last row at first)
        for step in range(new_tokens):
            toks = [int(L.llama_sampler_sample(self.sampler, self.ctx, r)) for r in rows]
            for o, t in zip(out, toks, strict=True):
                o.append(t)
            if step + 1 == new_tokens:
                break
            self._fill(toks, [n + step] * batch, range(batch), [True] * batch)
            self._decode()
            rows = list(range(batch))
        return out

    def close(self) -> None:
        L = self.L
        L.llama_sampler_free(self.sampler)
        L.llama_batch_free(self.batch)
        L.llama_free(self.ctx)
        L.llama_model_free(self.model)


def _worker_main(conn: Any, kwargs: dict[str, Any]) -> None:
    try:
        runner = LlamaCppRunner(**kwargs)
    except Exception as e:  # reported to the parent, which skips the column with this reason
        conn.send(("error", f"{type(e).__name__}: {e}"))
        return
    conn.send(("ready", None))
    while True:
        msg = conn.recv()
        if msg[0] == "stop":
            runner.close()
            return
        _, prompt_ids, batch, new_tokens = msg
        try:
            t0 = time.perf_counter()
            out = runner.generate(prompt_ids, batch, new_tokens)
            conn.send(("ok", time.perf_counter() - t0, sorted({len(o) for o in out})))
        except Exception as e:
            conn.send(("error", f"{type(e).__name__}: {e}"))


class LlamaCppWorker:
    """:class:`LlamaCppRunner` in a child process; ``generate`` returns (wall seconds, completion lengths).

    Raises :class:`LlamaCppWorkerDied` when the child crashed or failed (the message names the exit code
    or signal and what it was doing)."""

    def __init__(self, gguf: str | Path, **kwargs: Any) -> None:
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(
            target=_worker_main, args=(child, {"gguf": str(gguf), **kwargs}), daemon=True
        )
        self._proc.start()
        child.close()
        self._ask(None, "loading the model")

    def _ask(self, msg: Any, doing: str) -> Any:
        try:
            if msg is not None:
                self._conn.send(msg)
            reply = self._conn.recv()
        except (EOFError, OSError, BrokenPipeError):
            self._proc.join(timeout=10)
            code = self._proc.exitcode
            how = f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"
            raise LlamaCppWorkerDied(f"llama.cpp worker died ({how}) while {doing}") from None
        if reply[0] == "error":
            raise LlamaCppWorkerDied(f"llama.cpp worker failed while {doing}: {reply[1]}")
        return reply

    def generate(self, prompt_ids: Sequence[int], batch: int, new_tokens: int) -> tuple[float, list[int]]:
        _, seconds, lengths = self._ask(
            ("gen", list(prompt_ids), batch, new_tokens), f"generating {batch} x {new_tokens} tokens"
        )
        return float(seconds), list(lengths)

    def close(self) -> None:
        if self._proc.is_alive():
            with contextlib.suppress(OSError, BrokenPipeError):
                self._conn.send(("stop",))
            self._proc.join(timeout=30)
            if self._proc.is_alive():
                self._proc.kill()
        self._conn.close()
