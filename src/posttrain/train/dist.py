"""The one place for distributed concerns (torch.distributed, data-parallel DDP and FSDP2).

Launched by ``torchrun`` (``WORLD_SIZE`` > 1 in the environment), the trainers call :func:`setup`
first: it joins the process group (``gloo`` on CPU, ``nccl`` on CUDA, one GPU per local rank).
In one process every function here is an identity or a no-op, so single-process numbers are
unchanged. What each piece does (docs/distributed.md has the full story):

* **Sharding** — every rank's sampler draws the SAME global plan (its state stays identical on
  every rank, so a checkpoint does not depend on the world size) and :func:`shard_plan` keeps rank
  r's contiguous block of ``prompts_per_step / W`` prompts.
* **Counts and gradients** — the loss of a micro-batch is normalised by the minibatch's GLOBAL token /
  sequence counts (:func:`global_sum`: an all-reduce), so the per-rank losses add up to the loss of
  the global batch. DDP *averages* gradients over ranks, so :func:`backward` multiplies the local loss
  by W: the averaged gradient is then exactly the single-process gradient of the global batch.
* **Log-probs through the wrapper** — :func:`wrap_model` wraps the causal LM in
  :class:`~posttrain.models.logprobs.CausalLMHidden` (forward = decoder hidden states) inside
  ``DistributedDataParallel``; ``sequence_logprobs`` runs the wrapper's forward and applies the LM
  head with the chunked log-prob kernel. The head weight is used outside the forward, which DDP
  allows (its gradient hooks fire on gradient accumulation, wherever the parameter was used) as long
  as ``find_unused_parameters`` stays False.
* **Rank 0 writes** — config, metrics and checkpoints (:func:`on_main`); checkpoints hold the full
  (replicated) state dict plus every rank's sampling RNG (:func:`gather`).
* **Metrics** — :func:`reduce_metrics` combines per-rank step metrics by a per-key rule (sequence-
  weighted mean, sum, max, min, ...); hooks (sampler, controllers) see the global values.
* **FSDP2** (``distributed.strategy: fsdp``) — :func:`wrap_model` applies ``fully_shard`` to every
  decoder layer and to the :class:`~posttrain.models.logprobs.CausalLMHidden` root (embeddings, final
  norm and head): parameters, gradients and AdamW state are sharded over the ranks. Its
  reduce-scatter averages like DDP, so :func:`backward` is shared. Forwards outside the training
  wrapper (generation, old log-probs, evaluation, weight sync) run inside :func:`full_params`
  (every parameter all-gathered once, no collective inside, so ranks may generate different
  lengths). Checkpoints hold the gathered full state dicts (:func:`full_state_dicts`), in the same
  files as DDP and one process.
* **Seeds** — :func:`rank_seed`: rank r's sampling / reward seeds are ``seed + r · RANK_SEED_STRIDE``
  (rank 0 keeps the single-process seeds); model initialisation uses the same seed on every rank.
"""

from __future__ import annotations

import contextlib
import math
import os
import pickle
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import torch

from posttrain.utils.errors import InvalidValueError, PosttrainRuntimeError

T = TypeVar("T")

_OWN_GROUP = False  # True when setup() initialised the process group (teardown() destroys it)

STRATEGIES = ("ddp", "fsdp")
"""Data-parallel strategies (``distributed.strategy``): replicated DDP, or FSDP2 (``fully_shard``)."""

# FSDP2: a sharded model's ``[root, depth of full_params nesting]``, kept in the model's __dict__ (not
# a registered submodule: the root contains the model)
_FSDP_ATTR = "_posttrain_fsdp"

RANK_SEED_STRIDE = 1_000_003
"""Rank r samples with ``seed + r * RANK_SEED_STRIDE`` (a prime, so rank streams never coincide with
the seeds of neighbouring runs ``seed + 1``, ``seed + 2``)."""


# ------------------------------------------------------------------------------------- process group
def is_distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def world_size() -> int:
    return torch.distributed.get_world_size() if is_distributed() else 1


def rank() -> int:
    return torch.distributed.get_rank() if is_distributed() else 0


def is_main() -> bool:
    """True on rank 0 (and in a single process): the rank that logs and writes files."""
    return rank() == 0


def launched_world_size() -> int:
    """``WORLD_SIZE`` set by ``torchrun`` (1 when not launched by it)."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        raise InvalidValueError(
            f"environment variable WORLD_SIZE={os.environ['WORLD_SIZE']!r} is not an integer"
        ) from None


def setup(device: str) -> str:
    """Join the process group when launched by ``torchrun`` with more than one process, and return the
    device this rank trains on (``device`` as configured, ``cuda`` becomes ``cuda:LOCAL_RANK``).

    Backend: ``nccl`` for CUDA devices, ``gloo`` otherwise (``POSTTRAIN_DIST_BACKEND`` overrides).
    A group someone else already initialised is used as it is. Single process: returns ``device``."""
    if launched_world_size() <= 1 and not is_distributed():
        return device
    if not torch.distributed.is_available():
        raise PosttrainRuntimeError(
            "launched with WORLD_SIZE > 1, but this torch build has no torch.distributed"
        )
    cuda = str(device).startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    if cuda:
        local = int(os.environ.get("LOCAL_RANK", "0"))
        if torch.cuda.device_count() <= local:
            raise PosttrainRuntimeError(
                f"LOCAL_RANK {local} but only {torch.cuda.device_count()} CUDA device(s) are visible; "
                "launch at most one process per GPU (torchrun --nproc-per-node <= #GPUs)"
            )
        torch.cuda.set_device(local)
        device = f"cuda:{local}"
    if not is_distributed():
        global _OWN_GROUP
        backend = os.environ.get("POSTTRAIN_DIST_BACKEND") or ("nccl" if cuda else "gloo")
        torch.distributed.init_process_group(backend=backend)
        _OWN_GROUP = True
    return device


def teardown() -> None:
    """Leave the process group if :func:`setup` joined it (a group set up by the caller is left alone)."""
    global _OWN_GROUP
    if _OWN_GROUP and is_distributed():
        # all ranks leave together: a rank destroying its gloo group while a peer still has traffic in
        # flight aborted the process at exit ("terminate called without an active exception")
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    _OWN_GROUP = False


def require_single_process(what: str) -> None:
    """Raise a clear error when running with more than one torch.distributed rank."""
    n = max(world_size(), launched_world_size())
    if n > 1:
        raise PosttrainRuntimeError(
            f"{what}: running with torch.distributed world size {n}, but {what} has no multi-process "
            "support; run a single process (multi-process training: `posttrain rl`, docs/distributed.md)"
        )


def check_rl_hooks(
    prompts_per_step: int,
    sampler: Any,
    replay: Any,
    *,
    engine: Any = None,
    model: Any = None,
    group_filter: Any = None,
) -> None:
    """Refuse what data-parallel RL does not support yet (nothing to check in one process): a global
    batch that does not split evenly, group filters (their extra sampling rounds would
    differ per rank), replay buffers (their stores would be per rank) and, with FSDP2, engines that
    copy the weights into another runtime (``sync_weights``, e.g. vLLM: not wired to the sharded
    parameters yet)."""
    n = world_size()
    if n <= 1:
        return
    if engine is not None and model is not None and is_sharded(model):
        from posttrain.rollout.base import RolloutEngine

        if type(engine).sync_weights is not RolloutEngine.sync_weights:
            raise InvalidValueError(
                f"rollout.engine {type(engine).__name__} copies the policy's weights into its own runtime "
                "(sync_weights), which distributed.strategy=fsdp does not support yet; use "
                "distributed.strategy=ddp or an in-process engine (hf)"
            )
    if prompts_per_step % n:
        raise InvalidValueError(
            f"rollout.prompts_per_step={prompts_per_step} is not a multiple of the world size {n}; every "
            "rank trains on prompts_per_step / world_size prompts"
        )
    if group_filter is not None:
        raise InvalidValueError(
            f"hooks.filter {type(group_filter).__name__} filters groups (extra sampling rounds), which "
            "multi-process training does not support yet; run it in one process"
        )
    from posttrain.hooks.base import NoReplay

    if not isinstance(replay, NoReplay):
        raise InvalidValueError(
            f"hooks.replay {type(replay).__name__}: replay buffers are not supported in multi-process "
            "training yet (each rank would keep its own store); use hooks.replay.name=none"
        )


def rank_seed(seed: int) -> int:
    """This rank's seed for sampling and reward workers; rank 0 keeps ``seed``."""
    return seed + rank() * RANK_SEED_STRIDE


def barrier() -> None:
    if is_distributed():
        torch.distributed.barrier()


# ------------------------------------------------------------------------------------ model wrapping
def wrap_model(model: torch.nn.Module, strategy: str = "ddp") -> torch.nn.Module:
    """The module the trainer runs forward passes WITH gradient through: ``model`` itself in one process,
    else ``DistributedDataParallel(CausalLMHidden(model))`` (parameters shared with ``model``, which the
    engine, optimizer and checkpoints keep using; DDP broadcasts rank 0's weights at construction) or,
    with ``strategy="fsdp"``, the FSDP2-sharded ``CausalLMHidden(model)`` (:func:`_fully_shard`)."""
    if strategy not in STRATEGIES:
        raise InvalidValueError(
            f"distributed.strategy: unknown value {strategy!r}; accepted: {', '.join(STRATEGIES)}"
        )
    if world_size() <= 1:
        return model
    from posttrain.models.logprobs import CausalLMHidden

    if strategy == "fsdp":
        return _fully_shard(model)
    module = CausalLMHidden(model)
    device = next(model.parameters()).device
    ids = [device.index] if device.type == "cuda" else None
    return torch.nn.parallel.DistributedDataParallel(module, device_ids=ids, find_unused_parameters=False)


def _decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks to shard one by one: the modules whose class Hugging Face lists in
    ``_no_split_modules`` (``LlamaDecoderLayer``, ``Qwen2DecoderLayer``, ...), else the longest
    ``ModuleList`` in the model."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if layers:
        return layers
    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList)]
    return list(max(lists, key=len)) if lists else []


def _fully_shard(model: torch.nn.Module) -> torch.nn.Module:
    """FSDP2 over the ranks (a 1-D device mesh): ``fully_shard`` on every decoder layer, then on the
    ``CausalLMHidden(model)`` root, which keeps the embeddings, final norm and head. The parameters
    of ``model`` become sharded ``DTensor`` s in place (build the optimizer AFTER this). FSDP2 does not
    broadcast, so rank 0's weights are broadcast first (DDP's behaviour). The root is initialised at
    once (``_lazy_init``: torch's FSDP2 picks as root the first module that runs forward, and the
    first forward of a run is a generation that does not pass through the root)."""
    if is_sharded(model):
        return model.__dict__[_FSDP_ATTR][0]
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from posttrain.models.logprobs import CausalLMHidden

    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            torch.distributed.broadcast(t.data, src=0)
    device = next(model.parameters()).device
    mesh = init_device_mesh(device.type, (world_size(),))
    root = CausalLMHidden(model)
    for layer in _decoder_layers(model):
        fully_shard(layer, mesh=mesh)
    fully_shard(root, mesh=mesh)
    state = root._get_fsdp_state()  # FSDPModule API; _lazy_init is torch-internal (2.6 .. 2.13)
    state._lazy_init()
    model.__dict__[_FSDP_ATTR] = [root, 0]
    return root


def is_sharded(model: torch.nn.Module) -> bool:
    """Whether ``model``'s parameters are FSDP2-sharded (:func:`wrap_model` with ``strategy="fsdp"``)."""
    return _FSDP_ATTR in getattr(model, "__dict__", {})


@contextlib.contextmanager
def full_params(model: torch.nn.Module) -> Iterator[None]:
    """Inside: every parameter of a FSDP2-sharded ``model`` is all-gathered (a collective: every rank
    enters together) and stays so, and FSDP's forward hooks do no communication, so forwards outside
    the training wrapper (``model.generate``, no-grad log-probs, evaluation on rank 0 only) run as in
    one process and ranks may run different numbers of them. On exit the parameters are sharded again.
    Costs one full copy of the parameters per rank while inside. Nothing happens without FSDP2;
    nested uses gather once."""
    entry = getattr(model, "__dict__", {}).get(_FSDP_ATTR)
    if entry is None or entry[1] > 0:
        if entry is not None:
            entry[1] += 1
        try:
            yield
        finally:
            if entry is not None:
                entry[1] -= 1
        return
    from torch.distributed.fsdp import FSDPModule

    root = entry[0]
    modules = [m for m in root.modules() if isinstance(m, FSDPModule)]
    for m in modules:
        m.unshard()
    root.set_reshard_after_forward(False)
    # fully_shard marks every module it manages; Hugging Face's generate() then runs "synced_gpus"
    # (an all-reduce per token, so a rank generating alone, e.g. rank 0's evaluation, would hang)
    managed = model.__dict__.get("_is_fsdp_managed_module")
    model._is_fsdp_managed_module = False
    entry[1] += 1
    try:
        yield
    finally:
        entry[1] -= 1
        if managed is None:
            del model._is_fsdp_managed_module
        else:
            model._is_fsdp_managed_module = managed
        for m in modules:
            m.reshard()
        root.set_reshard_after_forward(True)  # the layers reshard after forward (FSDP's default) ...
        root.set_reshard_after_forward(False, recurse=False)  # ... the root does not (FSDP's root rule)


def wrap_adapter(adapter: Any, *, batch_size: int, strategy: str = "ddp") -> Any:
    """SFT's counterpart of :func:`wrap_model`: ``adapter`` itself in one process, else a
    :class:`~posttrain.models.CausalLMAdapter` over the DDP-wrapped model (its ``logprobs`` run through
    the wrapper). Refuses adapters of other kinds and a ``batch_size`` that does not split evenly."""
    n = world_size()
    if n <= 1:
        return adapter
    from posttrain.models import CausalLMAdapter

    if not isinstance(adapter, CausalLMAdapter):
        raise InvalidValueError(
            f"multi-process SFT supports causal-LM adapters only, got {type(adapter).__name__}; run it in "
            "one process"
        )
    if batch_size % n:
        raise InvalidValueError(
            f"batch_size={batch_size} is not a multiple of the world size {n}; every rank trains on "
            "batch_size / world_size sequences"
        )
    return CausalLMAdapter(wrap_model(adapter.model, strategy), adapter.tokenizer)


def backward(loss: torch.Tensor) -> None:
    """``loss.backward()`` for a local loss normalised by GLOBAL counts: DDP averages gradients over the
    W ranks (FSDP2's reduce-scatter averages too), so the loss is multiplied by W and the averaged gradient equals the sum of the ranks'
    gradients, i.e. the gradient of the global batch (one process: plain ``loss.backward()``)."""
    n = world_size()
    (loss * n if n > 1 else loss).backward()


# ------------------------------------------------------------------------------------- collectives
def global_sum(x: torch.Tensor) -> torch.Tensor:
    """Sum of ``x`` over all ranks (a copy; ``x`` itself is unchanged)."""
    out = x.detach().clone()
    if is_distributed():
        torch.distributed.all_reduce(out, op=torch.distributed.ReduceOp.SUM)
    return out


def gather(obj: T) -> list[T]:
    """Every rank's ``obj`` (picklable), in rank order, on every rank (``[obj]`` in one process)."""
    if not is_distributed():
        return [obj]
    out: list[Any] = [None] * world_size()
    torch.distributed.all_gather_object(out, obj)
    return out


def on_main(fn: Callable[[], T]) -> T:
    """Run ``fn`` on rank 0 only and hand its result to every rank. An exception on rank 0 is raised
    there as it is and on every other rank too (the same exception when it survives pickling, else a
    RuntimeError with its message), so no rank waits forever for a rank that failed."""
    if not is_distributed():
        return fn()
    box: list[Any] = [None]
    error: Exception | None = None
    if is_main():
        try:
            box[0] = ("ok", fn())
        except Exception as e:
            error = e
            box[0] = ("error", e if _picklable(e) else RuntimeError(f"rank 0: {type(e).__name__}: {e}"))
    torch.distributed.broadcast_object_list(box, src=0)
    if error is not None:
        raise error
    kind, value = box[0]
    if kind == "error":
        raise value
    return value


def _picklable(obj: Any) -> bool:
    try:
        pickle.loads(pickle.dumps(obj))
    except Exception:
        return False
    return True


class _Silent:
    """Stands in for a logger on ranks other than 0: every method call does nothing."""

    def __getattr__(self, name: str) -> Callable[..., None]:
        return lambda *args, **kwargs: None


def main_only(factory: Callable[[], T]) -> T:
    """``factory()`` on rank 0; elsewhere an object whose every method does nothing (loggers)."""
    return factory() if is_main() else _Silent()  # type: ignore[return-value]


def sum_dicts(d: dict[str, float]) -> dict[str, float]:
    """Per-key sum over ranks of float dicts (keys present on any rank)."""
    if not is_distributed():
        return d
    out: dict[str, float] = {}
    for part in gather(d):
        for k, v in part.items():
            out[k] = out.get(k, 0.0) + v
    return out


# ------------------------------------------------------------------------------------- checkpoints
def _param_names(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """The parameter name of every optimizer index (``optimizer.state_dict()`` numbers the parameters
    of all groups in order)."""
    names = {id(p): n for n, p in model.named_parameters()}
    return [names[id(p)] for g in optimizer.param_groups for p in g["params"]]


def full_state_dicts(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer | None
) -> tuple[dict[str, torch.Tensor] | None, dict[str, Any] | None]:
    """(model state dict, optimizer state dict), full and on the CPU, on rank 0 of a FSDP2 run (other
    ranks get empty dicts); ``(None, None)`` otherwise (the caller saves its own, replicated, state).
    A collective: every rank calls it. Gathered with ``torch.distributed.checkpoint.state_dict``
    (``full_state_dict=True, cpu_offload=True``); the optimizer's is renumbered from parameter names
    to indices, exactly the layout of a one-process ``optimizer.state_dict()``, so the checkpoint files
    do not depend on the strategy or the world size."""
    if not is_sharded(model):
        return None, None
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    msd = get_model_state_dict(model, options=opts)
    if optimizer is None:
        return msd, None
    osd = get_optimizer_state_dict(model, optimizer, options=opts)
    if not is_main():
        return msd, {}
    index = {name: i for i, name in enumerate(_param_names(model, optimizer))}
    return msd, {
        "state": {index[k]: v for k, v in osd["state"].items()},
        "param_groups": [{**g, "params": [index[k] for k in g["params"]]} for g in osd["param_groups"]],
    }


def optimizer_loader(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> Callable[[dict[str, Any]], None] | None:
    """How to load a full, index-numbered optimizer state dict (a checkpoint's) into ``optimizer``: None
    (``optimizer.load_state_dict``) unless ``model`` is FSDP2-sharded; then a function that renames
    the indices to parameter names and shards the state with ``set_optimizer_state_dict``
    (``full_state_dict=True``; every rank reads the checkpoint). Call it before the first backward:
    torch initialises the optimizer state it fills only while no parameter has a gradient."""
    if not is_sharded(model):
        return None

    def load(sd: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        names = _param_names(model, optimizer)
        named = {
            "state": {names[int(i)]: v for i, v in sd["state"].items()},
            "param_groups": [
                {**g, "params": [names[int(i)] for i in g["params"]]} for g in sd["param_groups"]
            ],
        }
        set_optimizer_state_dict(model, optimizer, named, options=StateDictOptions(full_state_dict=True))

    return load


def add_rank_states(trainer_state: dict[str, Any], extra_tensors: dict[str, torch.Tensor]) -> None:
    """Gather every rank's RNG states and ``extra_tensors`` (e.g. the engine's sampling generator) so
    rank 0 saves them all: rank r >= 1's tensors go into ``extra_tensors`` as ``rank<r>.<key>`` and
    ``rank<r>.rng.<key>``, their python / numpy RNG into ``trainer_state["dist"]``. Rank 0's own
    entries keep their single-process names, so any world size (1 included) can read the checkpoint.
    Nothing happens in one process."""
    if not is_distributed():
        return
    from posttrain.train.checkpoint import capture_rng

    rng_t, rng_js = capture_rng()
    mine = (
        {k: v.detach().cpu() for k, v in extra_tensors.items()},
        {k: v.cpu() for k, v in rng_t.items()},
        rng_js,
    )
    parts = gather(mine)
    rng_json: dict[str, Any] = {}
    for r, (ext, rt, rj) in enumerate(parts):
        if r == 0:
            continue
        extra_tensors.update({f"rank{r}.{k}": v for k, v in ext.items()})
        extra_tensors.update({f"rank{r}.rng.{k}": v for k, v in rt.items()})
        rng_json[str(r)] = rj
    trainer_state["dist"] = {"world_size": world_size(), "rng": rng_json}


def restore_rank_state(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    """This rank's extra tensors from a checkpoint read by ``load_checkpoint`` (which restored rank 0's
    RNG on every rank). Rank r >= 1 of a checkpoint saved with at least r + 1 ranks restores its own
    RNG states and gets its own tensors; a rank the checkpoint does not have (the world grew) keeps
    the streams it was seeded with (:func:`rank_seed`), so its samples continue differently from
    any uninterrupted run but deterministically."""
    ext = state["extra_tensors"]
    own = {k: v for k, v in ext.items() if not k.startswith("rank")}
    r = rank()
    saved = state.get("dist", {}).get("world_size", 1)
    if r == 0:
        return own
    if r >= saved:
        return {}
    from posttrain.train.checkpoint import restore_rng

    prefix = f"rank{r}."
    mine = {k[len(prefix) :]: v for k, v in ext.items() if k.startswith(prefix)}
    rng_t = {k[len("rng.") :]: v for k, v in mine.items() if k.startswith("rng.")}
    restore_rng(rng_t, state["dist"]["rng"][str(r)])
    return {k: v for k, v in mine.items() if not k.startswith("rng.")}


# ------------------------------------------------------------------------------------------ sharding
def shard(items: list[T]) -> list[T]:
    """Rank r's contiguous block of ``items`` (all of them in one process); the length must be a
    multiple of the world size."""
    n = world_size()
    if n <= 1:
        return items
    k, rem = divmod(len(items), n)
    if rem:
        raise InvalidValueError(f"{len(items)} items cannot be split evenly over {n} ranks")
    return items[rank() * k : (rank() + 1) * k]


def shard_plan(plan: Any) -> Any:
    """Rank r's contiguous block of the global :class:`~posttrain.hooks.PromptPlan` (all of it in one
    process). Prompts of a block keep their order, so concatenating the ranks' outcomes in rank order
    gives the global plan's order."""
    n = world_size()
    if n <= 1:
        return plan
    k, rem = divmod(len(plan.examples), n)
    if rem:
        raise InvalidValueError(
            f"{len(plan.examples)} prompts cannot be split evenly over {n} ranks; make "
            f"rollout.prompts_per_step a multiple of the world size"
        )
    lo = rank() * k
    return type(plan)(plan.examples[lo : lo + k], plan.n_per_prompt[lo : lo + k])


def align_micro_batches(micro_batches: list[tuple[torch.Tensor, ...]]) -> list[tuple[torch.Tensor, ...]]:
    """Give every rank the same number of micro-batches in each minibatch (``micro_batches[j]``: the
    row indices of minibatch j's micro-batches). DDP all-reduces in every backward (FSDP2 all-gathers
    in every forward and reduce-scatters in every backward), so all ranks must run the same number of
    them; with variable group sizes the ranks' row counts differ. A rank with
    fewer micro-batches than the most any rank has splits its rows into that many smaller ones
    (gradients are unchanged: losses use the minibatch's global counts). Identity in one process."""
    if world_size() <= 1:
        return micro_batches
    counts = gather([len(s) for s in micro_batches])
    if len({len(c) for c in counts}) > 1:
        raise InvalidValueError(
            f"ranks split their rows into different numbers of minibatches ({[len(c) for c in counts]}): "
            "some rank has fewer sequences than `minibatches`; lower `minibatches` or raise "
            "rollout.prompts_per_step"
        )
    out = []
    for j, splits in enumerate(micro_batches):
        target = max(c[j] for c in counts)
        if len(splits) < target:
            rows = torch.cat(splits)
            if len(rows) < target:
                raise InvalidValueError(
                    f"minibatch {j}: this rank has {len(rows)} sequences, fewer than the {target} "
                    "micro-batches another rank needs; raise micro_batch_size"
                )
            splits = tuple(rows.tensor_split(target))
        out.append(splits)
    return out


def gather_list(items: list[T]) -> list[T]:
    """The concatenation of every rank's list, in rank order (``items`` in one process)."""
    if not is_distributed():
        return items
    return [x for part in gather(items) for x in part]


# ------------------------------------------------------------------------------------------- metrics
def _weighted_mean(key: str, parts: list[dict[str, float]], weight: str) -> float:
    w = [p[weight] for p in parts]
    return float(sum(p[key] * wi for p, wi in zip(parts, w, strict=True)) / max(sum(w), 1e-300))


def _pooled_std(key: str, parts: list[dict[str, float]], _: str) -> float:
    """Sample std of the union of the ranks' rewards from each rank's n (num_sequences), mean
    (reward_mean) and std, with Bessel's correction like ``torch.std`` over the global batch."""
    n = [p["num_sequences"] for p in parts]
    mean = [p["reward_mean"] for p in parts]
    std = [p[key] for p in parts]
    total = sum(n)
    if total < 2:
        return 0.0
    mu = sum(ni * mi for ni, mi in zip(n, mean, strict=True)) / total
    ss = sum(
        (ni - 1) * si**2 + ni * (mi - mu) ** 2 for ni, mi, si in zip(n, mean, std, strict=True) if ni > 0
    )
    return math.sqrt(max(ss, 0.0) / (total - 1))


_REDUCERS: dict[str, Callable[[str, list[dict[str, float]], str], float]] = {
    "same": lambda k, parts, _: parts[0][k],
    "sum": lambda k, parts, _: float(sum(p[k] for p in parts)),
    "max": lambda k, parts, _: float(max(p[k] for p in parts)),
    "min": lambda k, parts, _: float(min(p[k] for p in parts)),
    "mean": _weighted_mean,
    "std": _pooled_std,
}

#: How a per-rank step metric becomes the global one: ``mean:<w>`` is the mean weighted by each
#: rank's metric ``w``; ``sum`` / ``max`` / ``min``; ``std`` pools per-rank (n, mean, std); ``same``
#: is identical on every rank by construction (rank 0's value). Keys not listed (e.g.
#: ``reward/<component>``) are sequence-weighted means (``mean:num_sequences``).
METRIC_RULES: dict[str, str] = {
    "num_sequences": "sum",
    "num_groups": "sum",
    "replayed": "sum",
    "reward_timeouts": "sum",
    "reward_errors": "sum",
    "length_max": "max",
    "group_size_max": "max",
    "group_size_min": "min",
    "sampling_rounds": "max",
    "zero_var_frac": "mean:num_groups",
    "advantage_abs_mean": "mean:advantage_numel",
    "entropy_pre_update": "mean:action_tokens",  # a token-weighted mean over the rank's action tokens
    "reward_std": "std",
    "time_generation": "max",
    "time_forward_overlap": "max",
    "time_reward_wait": "max",
    "time_update": "max",
    "time_step": "max",
    "tokens_per_s": "sum",
    "step": "same",
    "lr": "same",
    "temperature": "same",
    "grad_norm": "same",
    "grad_norm_max": "same",
}
DEFAULT_METRIC_RULE = "mean:num_sequences"


def reduce_metrics(
    metrics: dict[str, float],
    *,
    weights: dict[str, float] | None = None,
    global_keys: Iterable[str] = (),
) -> dict[str, float]:
    """Global step metrics from every rank's ``metrics`` by :data:`METRIC_RULES` (identity in one
    process). ``weights`` are extra per-rank weights that rules refer to (``advantage_numel``,
    ``action_tokens``); they are not returned. ``global_keys`` are already global (reduced earlier) and kept as they are.
    Per-rank throughputs add up (``tokens_per_s``); times are the slowest rank's."""
    if not is_distributed():
        return metrics
    parts = gather({**metrics, **(weights or {})})
    done = set(global_keys)
    out: dict[str, float] = {}
    for key in metrics:
        rule = "same" if key in done else METRIC_RULES.get(key, DEFAULT_METRIC_RULE)
        name, _, arg = rule.partition(":")
        out[key] = _REDUCERS[name](key, parts, arg)
    return out
