"""The one place where data-parallel training would plug in (torch.distributed).

The loop only ever asks for the GLOBAL token / sequence counts of a minibatch (so ``token-mean`` and
``seq-mean-*`` losses are invariant to how the batch is split over micro-batches and ranks, spec
``rl-objectives.md`` §4) and averages metrics. In a single process these are identities; under
``torch.distributed`` they are all-reduces, and gradients are summed by DDP/FSDP outside the math.
"""

from __future__ import annotations

import torch


def is_distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def world_size() -> int:
    return torch.distributed.get_world_size() if is_distributed() else 1


def rank() -> int:
    return torch.distributed.get_rank() if is_distributed() else 0


def is_main() -> bool:
    return rank() == 0


def global_sum(x: torch.Tensor) -> torch.Tensor:
    """Sum of ``x`` over all ranks (a copy; ``x`` itself is unchanged)."""
    out = x.detach().clone()
    if is_distributed():
        torch.distributed.all_reduce(out, op=torch.distributed.ReduceOp.SUM)
    return out
