import sys
from pathlib import Path

import pytest
import torch

# test modules import shared helpers (and reward-pool workers unpickle rewards) from `_train_helpers`
sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(autouse=True, scope="session")
def _one_thread():
    # tiny models on a shared 2-core CPU: one intra-op thread is several times faster
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)
