import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def _one_thread():
    # tiny models on a shared 2-core CPU: one intra-op thread is several times faster
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)
