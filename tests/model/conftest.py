import pytest


@pytest.fixture(autouse=True)
def _single_thread(one_thread):
    """Every model test multiplies tiny matrices: one thread (fixture in tests/conftest.py)."""
    yield
