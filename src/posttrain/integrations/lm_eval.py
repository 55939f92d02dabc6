"""posttrain as an lm-evaluation-harness model, offline: ``--model posttrain`` and :func:`run_harness`.

:class:`PosttrainLM` is an ``lm_eval.api.model.TemplateLM`` registered as ``posttrain`` in lm-eval's
model registry when this module is imported. It loads any ``model.name`` posttrain loads
(:func:`posttrain.models.load_adapter`: presets, ``smollm2-135m``, ``.gguf`` files, Hugging Face
folders, run folders, LoRA adapter folders) or takes a loaded adapter, and answers

* ``loglikelihood``: the token ids lm-eval gives (``_loglikelihood_tokens``) scored in batches sorted
  by length with the trainer's chunked log-probs (:func:`posttrain.models.token_logprobs`, through
  :func:`posttrain.serve.scoring.score_tokens`, the server's own scorer); ``is_greedy`` compares
  token ids, so a tokenizer that does not survive decode -> encode (the tiny preset's) is no problem;
* ``loglikelihood_rolling``: ``lm_eval.utils.get_rolling_token_windows`` windows, scored as above;
* ``generate_until``: prompts grouped by generation settings, sorted by length and generated in
  batches by a posttrain rollout engine (:func:`build_generation_engine`; ``hf`` by default, ``fast``
  or ``vllm`` by ``engine=...``), the text cut at the earliest ``until`` string.

lm-eval 0.4.13 has no plug-in entry point for models, so ``lm_eval --model posttrain`` finds the
class only in a process that imported this module: ``python -m posttrain.integrations.lm_eval``
(lm-eval's own command line, arguments unchanged), ``posttrain eval --harness lm-eval`` and
:func:`run_harness` do. Hub access is never attempted: importing this module sets the offline
variables (:data:`OFFLINE_ENV`) before lm-eval or ``datasets`` load, and a task whose dataset lives
on the Hub fails with a :class:`HarnessError` naming it. Reference: ``docs/lm-eval.md``.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from posttrain.utils.errors import MissingPackageError, PosttrainError

OFFLINE_ENV = {
    "HF_DATASETS_OFFLINE": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_EVALUATE_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
}
"""Set on import (before lm-eval, ``datasets`` and ``evaluate`` read them): nothing is downloaded."""

TASKS_DIR = Path(__file__).with_name("lm_eval_tasks")
"""The task YAMLs shipped with posttrain (``posttrain_arithmetic``, ``posttrain_arithmetic_mc``,
``posttrain_instructions``, ``posttrain_ifbench``); always on lm-eval's task path when run through this
module."""

CPU_BOOTSTRAP_ITERS = 100
"""lm-eval's ``bootstrap_iters`` (standard errors of the metrics) when none is given: lm-eval's
default, 100000, takes minutes per metric on a CPU; 0 turns standard errors off."""

DEFAULT_BATCH_SIZE = 16
_log = logging.getLogger("posttrain.integrations.lm_eval")


class HarnessError(PosttrainError, RuntimeError):
    """An lm-eval run posttrain cannot do as asked (a task that needs the Hub, no such task)."""


def set_offline() -> None:
    """Force the Hugging Face offline switches, in the environment and in already imported modules."""
    os.environ.update(OFFLINE_ENV)
    for mod, attr in (("datasets.config", "HF_HUB_OFFLINE"), ("huggingface_hub.constants", "HF_HUB_OFFLINE")):
        if mod in sys.modules:
            setattr(sys.modules[mod], attr, True)
    if "datasets.config" in sys.modules:
        sys.modules["datasets.config"].HF_DATASETS_OFFLINE = True


set_offline()

try:
    import lm_eval.models  # noqa: F401 - fills lm-eval's model registry (local-completions, hf, ...)
    from lm_eval import utils as lm_utils
    from lm_eval.api.model import TemplateLM
    from lm_eval.api.registry import register_model
except ImportError as e:  # pragma: no cover - exercised where the extra is missing
    raise MissingPackageError(
        f"posttrain.integrations.lm_eval needs lm-eval: pip install -e '.[lm-eval]' ({e})"
    ) from e

set_offline()  # lm_eval imports datasets: make sure its config reads offline


def build_generation_engine(
    model: Any,
    tokenizer: Any,
    *,
    engine: str = "hf",
    engine_params: dict[str, Any] | None = None,
    max_batch_size: int | None = None,
    precision: str = "fp32",
    seed: int | None = None,
) -> Any:
    """The rollout engine ``generate_until`` samples with, built by a :class:`~posttrain.rollout.RolloutSpec`
    as the trainer and the evaluator build theirs (seeded with the evaluation seed)."""
    from posttrain.rollout import RolloutSpec
    from posttrain.train.evaluate import EVAL_SEED

    spec = RolloutSpec(
        engine=engine, engine_params=engine_params or {}, precision=precision, max_batch_size=max_batch_size
    )
    return spec.build(model, tokenizer, seed=EVAL_SEED if seed is None else seed).engine


def _device(device: str | None) -> str:
    """``device`` as given, except lm-eval's command-line default ``cuda...`` where torch has no CUDA:
    then "cpu" with a warning (lm-eval's own ``hf`` model does the same)."""
    import torch

    if not device:
        return "cpu"
    if str(device).startswith("cuda") and not torch.cuda.is_available():
        _log.warning("device %s: torch has no CUDA here; using cpu", device)
        return "cpu"
    return str(device)


def _batches(order: list[int], size: int) -> Iterator[list[int]]:
    for s in range(0, len(order), size):
        yield order[s : s + size]


@register_model("posttrain")
class PosttrainLM(TemplateLM):
    """lm-eval's view of a posttrain model. ``--model_args`` (all optional but ``name`` or ``lm``):

    name: model spec (:func:`posttrain.models.load_adapter`); lm: an already loaded adapter (Python
    only; its model is used as is); kind: adapter kind ("causal-lm"); dtype ("float32"); device
    ("cpu"; "auto" picks cuda when present); seed (preset weights, 0); batch_size (per forward /
    generate call, 16); engine ("hf") and engine_params (dict) of generation; precision ("fp32" or
    "bf16" autocast); max_length (context; default the model's); max_gen_toks (256, when a task
    gives none); chunk_size (rows of logits per block in the LM head).
    """

    def __init__(
        self,
        name: str | None = None,
        *,
        lm: Any = None,
        kind: str = "causal-lm",
        dtype: str = "float32",
        device: str | None = "cpu",
        seed: int = 0,
        batch_size: int | str | None = DEFAULT_BATCH_SIZE,
        max_batch_size: int | None = None,
        engine: str = "hf",
        engine_params: dict[str, Any] | None = None,
        precision: str = "fp32",
        max_length: int | None = None,
        max_gen_toks: int = 256,
        chunk_size: int | None = None,
        **unused: Any,
    ) -> None:
        super().__init__()
        from posttrain.models import DEFAULT_CHUNK_SIZE, check_precision, load_adapter
        from posttrain.utils.errors import InvalidValueError

        name = name or unused.pop("pretrained", None)  # lm-eval's usual key for the model
        if unused:
            _log.warning("--model posttrain ignores model_args %s", ", ".join(sorted(unused)))
        if lm is None:
            if not name:
                raise InvalidValueError("--model posttrain needs --model_args name=<model> (e.g. name=tiny)")
            lm = load_adapter(str(name), kind=kind, dtype=dtype, device=_device(device), seed=int(seed))
        self.lm = lm
        self.name = str(name) if name else type(lm).__name__
        self.model = lm.model
        self.tokenizer = lm.tokenizer
        self.precision = check_precision(precision)
        try:
            self.batch_size = int(batch_size) if batch_size not in (None, "auto") else DEFAULT_BATCH_SIZE
        except ValueError:  # "auto:4" and the like: lm-eval's automatic sizing is not implemented
            self.batch_size = DEFAULT_BATCH_SIZE
        if self.batch_size < 1:
            raise InvalidValueError(f"batch_size must be >= 1, got {batch_size!r}")
        context = getattr(self.model.config, "max_position_embeddings", None) or 2048
        self.max_length = int(max_length or context)
        self.max_gen_toks = int(max_gen_toks)
        self.chunk_size = int(chunk_size or DEFAULT_CHUNK_SIZE)
        self._engine_spec = (engine, dict(engine_params or {}))
        self._engine: Any = None

    # -------------------------------------------------------------------------------- tokens
    @property
    def eot_token_id(self) -> int:
        return int(self.tokenizer.eos_token_id)

    @property
    def tokenizer_name(self) -> str:
        return str(getattr(self.tokenizer, "name_or_path", "") or self.name).replace("/", "__")

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs: Any) -> list[int]:
        return [int(i) for i in self.tokenizer.encode(string, add_special_tokens=bool(add_special_tokens))]

    def tok_decode(self, tokens: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(list(tokens), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(
        self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True
    ) -> str:
        """The tokenizer's chat template over ``chat_history`` (lm-eval's ``--apply_chat_template``)."""
        return self.tokenizer.apply_chat_template(
            chat_history,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=not add_generation_prompt,
        )

    def _autocast(self) -> Any:
        from posttrain.models import precision_autocast

        return precision_autocast(next(self.model.parameters()).device, self.precision)

    # ------------------------------------------------------------------------ log-likelihood
    def score_requests(self, pairs: list[tuple[list[int], list[int]]]) -> list[tuple[float, bool]]:
        """(sum of the continuation's log-probs, whether every continuation token is the argmax) per
        (context ids, continuation ids); batches of ``batch_size`` rows sorted by length (longest first),
        each left-truncated to ``max_length`` tokens as lm-eval's own models do."""
        from posttrain.serve.scoring import score_tokens

        seqs, conts = [], []
        for ctx, cont in pairs:
            seq = (list(ctx) + list(cont))[-self.max_length :]
            seqs.append(seq)
            conts.append(min(len(cont), len(seq) - 1))
        order = sorted(range(len(seqs)), key=lambda i: (-len(seqs[i]), seqs[i]))
        out: list[tuple[float, bool]] = [(0.0, True)] * len(seqs)
        pad = int(self.tokenizer.pad_token_id or 0)
        for idx in _batches(order, self.batch_size):
            with self._autocast():
                scored = score_tokens(
                    self.model, [seqs[i] for i in idx], top_k=1, pad_id=pad, chunk_size=self.chunk_size
                )
            for i, sc in zip(idx, scored, strict=True):
                span = range(len(seqs[i]) - conts[i], len(seqs[i]))
                total = float(sum(sc.logprobs[t] for t in span))
                greedy = all(sc.top[t][0][0] == sc.ids[t] for t in span)
                out[i] = (total, greedy)
        return out

    def _loglikelihood_tokens(
        self, requests: list[tuple[Any, list[int], list[int]]], disable_tqdm: bool = False, **kwargs: Any
    ) -> list[tuple[float, bool]]:
        res = self.score_requests([(ctx, cont) for _, ctx, cont in requests])
        for (key, _, _), answer in zip(requests, res, strict=True):
            if key is not None:
                self.cache_hook.add_partial("loglikelihood", key, answer)
        return res

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        out = []
        for (string,) in [r.args for r in requests]:
            windows = [
                lm_utils.make_disjoint_window(w)
                for w in lm_utils.get_rolling_token_windows(
                    token_list=self.tok_encode(string),
                    prefix_token=self.prefix_token_id,
                    max_seq_len=self.max_length,
                    context_len=1,
                )
            ]
            total = sum(lp for lp, _ in self.score_requests(windows))
            self.cache_hook.add_partial("loglikelihood_rolling", (string,), total)
            out.append(total)
        return out

    # ---------------------------------------------------------------------------- generation
    @property
    def engine(self) -> Any:
        if self._engine is None:
            name, params = self._engine_spec
            self._engine = build_generation_engine(
                self.model,
                self.tokenizer,
                engine=name,
                engine_params=params,
                max_batch_size=self.batch_size,
                precision=self.precision,
            )
        return self._engine

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        import json

        from posttrain.rollout.base import SamplingParams
        from posttrain.utils.errors import InvalidValueError

        args = [r.args for r in requests]
        groups: dict[str, list[int]] = {}
        for i, (_, gen_kwargs) in enumerate(args):
            groups.setdefault(json.dumps(gen_kwargs, sort_keys=True, default=str), []).append(i)
        out: list[str] = [""] * len(args)
        for members in groups.values():
            kw = dict(args[members[0]][1])
            until = kw.pop("until", None) or []
            until = [until] if isinstance(until, str) else list(until)
            max_new = int(kw.pop("max_gen_toks", kw.pop("max_new_tokens", self.max_gen_toks)))
            # Hugging Face's meaning: do_sample false is greedy whatever the temperature; absent, a
            # temperature above 0 samples (as local-completions asks the server to)
            do_sample = kw.pop("do_sample", None)
            temperature = float(kw.pop("temperature", 1.0 if do_sample else 0.0))
            params = SamplingParams(
                temperature=0.0 if do_sample is False else temperature,
                top_p=float(kw.pop("top_p", 1.0)),
                max_new_tokens=max_new,
                logprobs=False,
            )
            if kw:
                _log.warning("generate_until ignores generation settings %s", ", ".join(sorted(kw)))
            if max_new >= self.max_length:
                raise InvalidValueError(
                    f"max_gen_toks {max_new} leaves no room for a prompt in the context of {self.max_length}"
                )
            prompts = {i: self.tok_encode(args[i][0])[-(self.max_length - max_new) :] for i in members}
            order = sorted(members, key=lambda i: -len(prompts[i]))
            for idx in _batches(order, self.batch_size):
                with self._autocast():
                    batch = self.engine.generate([prompts[i] for i in idx], [1] * len(idx), params)
                for g, ids in zip(batch.group_ids.tolist(), batch.completion_lists(), strict=True):
                    text = self.tok_decode(ids)
                    cut = min((p for p in (text.find(s) for s in until) if p >= 0), default=len(text))
                    i = idx[int(g)]
                    out[i] = text[:cut]
                    self.cache_hook.add_partial("generate_until", args[i], out[i])
        return out


# ------------------------------------------------------------------------------- running tasks
def task_manager(
    include_path: str | Path | Sequence[str | Path] | None = None, tasks: Sequence[str] | None = None
) -> Any:
    """lm-eval's TaskManager with posttrain's shipped tasks (:data:`TASKS_DIR`) and ``include_path``.
    When every name in ``tasks`` is found there, lm-eval's own few thousand task YAMLs are not indexed
    (that index takes tens of seconds on a small CPU); otherwise they are."""
    from lm_eval.tasks import TaskManager

    paths = [str(TASKS_DIR)]
    if include_path:
        extra = [include_path] if isinstance(include_path, str | Path) else list(include_path)
        paths += [str(p) for p in extra]
    if tasks:
        local = TaskManager(include_path=paths, include_defaults=False)
        if all(t in local.all_tasks for t in tasks):
            return local
    return TaskManager(include_path=paths)


_LOCAL_BUILDERS = {"json", "csv", "parquet", "text", "arrow", "pandas"}


def check_offline_tasks(manager: Any, tasks: Sequence[str]) -> None:
    """Refuse, before anything loads, a task whose dataset would come from the Hugging Face Hub: its
    ``dataset_path`` is neither a local builder (json, csv, ...), nor a local folder, nor replaced by
    ``custom_dataset``. The message names the dataset and says how to point the task at local files."""
    unknown = [t for t in tasks if t not in manager.all_tasks]
    if unknown:
        raise HarnessError(
            f"unknown lm-eval task(s) {', '.join(unknown)}; posttrain's own: "
            f"{', '.join(sorted(t for t in manager.all_tasks if t.startswith('posttrain_')))}"
        )
    for name in tasks:
        for sub, cfg in _task_configs(manager, name):
            if cfg.get("custom_dataset") is not None:
                continue
            path = cfg.get("dataset_path")
            if path is None or path in _LOCAL_BUILDERS or Path(str(path)).expanduser().exists():
                continue
            raise HarnessError(
                f"lm-eval task {sub!r} reads dataset {path!r}"
                + (f" ({cfg['dataset_name']})" if cfg.get("dataset_name") else "")
                + " from the Hugging Face Hub, and posttrain runs lm-eval offline (no download is "
                "attempted). Point the task at local files: a YAML with `include: <its yaml>`, "
                "`dataset_path: json` and `dataset_kwargs: {data_files: {test: /path/test.jsonl}}`, "
                "passed with --include-path (docs/lm-eval.md)"
            )


def _task_configs(manager: Any, name: str, seen: frozenset[str] = frozenset()) -> list[tuple[str, dict]]:
    """(task name, its YAML config, includes resolved) for ``name``; for a group or a tag, for each
    task in it."""
    from lm_eval.tasks._index import Kind

    entry = manager.task_index.get(name)
    if entry is None or name in seen:
        return []
    if entry.kind in (Kind.TASK, Kind.PY_TASK):
        return [(name, dict(entry.cfg or {}))]
    if entry.kind == Kind.GROUP:
        items = (entry.cfg or {}).get("task") or []
        members = [m if isinstance(m, str) else (m or {}).get("task") for m in items]
    else:  # a tag: the tasks that carry it
        members = [n for n, e in manager.task_index.items() if name in (e.tags or set())]
    out: list[tuple[str, dict]] = []
    for m in members:
        if isinstance(m, str):
            out += _task_configs(manager, m, seen | {name})
    return out


def run_harness(
    model: Any,
    tasks: Sequence[str],
    limit: int | float | None = None,
    *,
    include_path: str | Path | Sequence[str | Path] | None = None,
    num_fewshot: int | None = None,
    bootstrap_iters: int = CPU_BOOTSTRAP_ITERS,
    apply_chat_template: bool = False,
    gen_kwargs: dict[str, Any] | None = None,
    log_samples: bool = False,
    model_args: dict[str, Any] | None = None,
    full: bool = False,
) -> dict[str, Any]:
    """lm-eval's scores of ``model`` on ``tasks``: ``{task: {metric: value}}`` (metric names as lm-eval
    writes them, e.g. ``acc,none``, ``acc_stderr,none``; task groups included).

    ``model``: a spec (a name ``load_adapter`` takes), a loaded adapter (its model is scored as it is
    now, in eval mode, its train/eval mode restored after: a trainer calls this mid-run), a
    :class:`PosttrainLM`, or any lm-eval ``LM``. ``limit``:
    documents per task (lm-eval's ``--limit``). ``model_args`` go to :class:`PosttrainLM` (engine,
    batch_size, ...). ``full=True`` returns lm-eval's whole result dict instead (configs, samples).
    Offline only; a Hub dataset is a :class:`HarnessError` (:func:`check_offline_tasks`)."""
    from lm_eval import simple_evaluate
    from lm_eval.api.model import LM

    set_offline()
    tasks = list(tasks)
    manager = task_manager(include_path, tasks)
    check_offline_tasks(manager, tasks)  # before a model is loaded
    if isinstance(model, LM):
        lm = model
    elif isinstance(model, str | Path):
        lm = PosttrainLM(str(model), **(model_args or {}))
    else:
        lm = PosttrainLM(lm=model, **(model_args or {}))
    module = getattr(lm, "model", None)
    was_training = bool(getattr(module, "training", False))
    if was_training:
        module.eval()  # a trainer's model mid-run: scored in eval mode, its mode restored after
    try:
        results = simple_evaluate(
            model=lm,
            tasks=tasks,
            num_fewshot=num_fewshot,
            limit=limit,
            bootstrap_iters=bootstrap_iters,
            task_manager=manager,
            apply_chat_template=apply_chat_template,
            gen_kwargs=gen_kwargs,
            log_samples=log_samples,
            random_seed=0,
            numpy_random_seed=1234,
            torch_random_seed=1234,
            fewshot_random_seed=1234,
        )
    finally:
        if was_training:
            module.train()
    if results is None:  # non-zero ranks under torch.distributed
        return {}
    if full:
        return results
    return {task: {k: v for k, v in m.items() if k != "alias"} for task, m in results["results"].items()}


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m posttrain.integrations.lm_eval ARGS``: lm-eval's own command line (``lm_eval ARGS``)
    with ``--model posttrain`` registered, posttrain's tasks on the task path (``--include_path``
    defaults to :data:`TASKS_DIR`), offline, and ``bootstrap_iters`` :data:`CPU_BOOTSTRAP_ITERS` (lm-eval
    0.4.13's command line has no flag for it and would use 100000)."""
    import functools

    import lm_eval
    from lm_eval.__main__ import cli_evaluate

    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0].startswith("--") and args[0] not in ("-h", "--help"):
        args = ["run", *args]  # `lm_eval --model ...` is `lm_eval run --model ...`
    if (
        args
        and args[0] in ("run", "ls", "validate")
        and not any(a.startswith("--include_path") for a in args)
    ):
        args += ["--include_path", str(TASKS_DIR)]
    evaluate = lm_eval.simple_evaluate
    lm_eval.simple_evaluate = functools.partial(evaluate, bootstrap_iters=CPU_BOOTSTRAP_ITERS)
    sys.argv = ["lm_eval", *args]
    try:
        cli_evaluate()
    finally:
        lm_eval.simple_evaluate = evaluate


if __name__ == "__main__":
    main()
