"""The one place for distributed concerns (torch.distributed).

The RL loop only ever asks for the GLOBAL token / sequence counts of a minibatch (so ``token-mean``
and ``seq-mean-*`` losses are invariant to how the batch is split over micro-batches and, later,
ranks; see docs/objectives.md on aggregation): :func:`global_sum` is an identity in one process and
an all-reduce under ``torch.distributed``. Multi-process training (sharding the batch, DDP/FSDP
gradient reduction, rank-0-only logging and checkpoints) is not implemented yet, so the trainers
call :func:`require_single_process` and refuse to run as several ranks instead of silently
training divergent copies.
"""

from __future__ import annotations

import torch


def is_distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def world_size() -> int:
    return torch.distributed.get_world_size() if is_distributed() else 1


def require_single_process(what: str) -> None:
    """Raise a clear error when running with more than one torch.distributed rank."""
    n = world_size()
    if n > 1:
        raise RuntimeError(
            f"{what}: running with torch.distributed world size {n}, but multi-process training is not "
            "implemented; run a single process"
        )


def global_sum(x: torch.Tensor) -> torch.Tensor:
    """Sum of ``x`` over all ranks (a copy; ``x`` itself is unchanged)."""
    out = x.detach().clone()
    if is_distributed():
        torch.distributed.all_reduce(out, op=torch.distributed.ReduceOp.SUM)
    return out
