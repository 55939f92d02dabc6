"""tests/algos: tiny tensors only, so run torch single-threaded (intra-op threads only add sync overhead
on a shared CPU, ~100x on these sizes); the previous setting is restored after each test."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _single_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
