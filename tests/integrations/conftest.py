"""Fixtures of the Protenix integration tests: Protenix's model at small sizes, built once per module."""

import pytest
import torch

from tests.integrations.protenix_model import small_protenix


@pytest.fixture(scope="module")
def single_thread():
    """Small fp32 matrices on a shared CPU: more threads only wait on each other."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def protenix_model(single_thread):
    return small_protenix()
