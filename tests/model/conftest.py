import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny matrices on a shared CI machine: OpenMP threads only wait on each other (30x slower)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
