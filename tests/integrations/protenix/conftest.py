import pytest
import torch

from featurecache.integrations.protenix.convert import protenix_to_featurecache
from featurecache.testing.protenix import import_protenix, protenix_model


@pytest.fixture(autouse=True, scope="session")
def _protenix():
    """Protenix missing fails these tests with the fix in the message (./setup.sh installs it):
    a skip would let CI pass without comparing anything."""
    import_protenix()


@pytest.fixture(autouse=True)
def _single_thread(one_thread):
    """Small fp32 models on the CPU: one thread (fixture in tests/conftest.py)."""
    yield


@pytest.fixture(scope="package")
def small_protenix():
    """Protenix's whole model, small (featurecache.testing.protenix.SMALL_PROTENIX), its weights
    random, and its state dict converted: (Protenix's model, featurecache's config, state dict)."""
    model = protenix_model(torch.Generator().manual_seed(20261205))
    config, state = protenix_to_featurecache(model.state_dict())
    return model, config, state
