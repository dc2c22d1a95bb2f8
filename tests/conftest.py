"""Shared test setup.

Without a GPU the Triton kernels run under the interpreter; the variable must be set before
triton is imported anywhere.
"""

import os
import pathlib
import shutil
from collections.abc import Iterable

import pytest

try:
    import torch

    _has_cuda = torch.cuda.is_available()
except ImportError:  # pragma: no cover - torch is a hard dependency
    _has_cuda = False
if not _has_cuda:
    os.environ.setdefault("TRITON_INTERPRET", "1")

# ../shared/data beside the checkout; FC_SHARED_DATA points elsewhere (a GPU machine's copy)
SHARED_DATA = pathlib.Path(
    os.environ.get("FC_SHARED_DATA") or pathlib.Path(__file__).resolve().parents[1].parent / "shared" / "data"
)


def _require_shared_data() -> pathlib.Path:
    if not SHARED_DATA.is_dir():
        pytest.fail(f"sample data not found at {SHARED_DATA}: clone next to ../shared")
    return SHARED_DATA


@pytest.fixture(scope="session")
def shared_data() -> pathlib.Path:
    return _require_shared_data()


def copy_sample_structures(names: str | Iterable[str], dest: pathlib.Path) -> pathlib.Path:
    """Copy sample structures (file names in ../shared/data/structures) into `dest`, under the
    same names, making `dest` if needed; returns `dest`. A test's input folder, for example:

        inputs = copy_sample_structures(("209d-assembly1.cif", "2q2k.cif"), tmp_path / "inputs")
    """
    structures = _require_shared_data() / "structures"
    dest.mkdir(parents=True, exist_ok=True)
    for name in [names] if isinstance(names, str) else names:
        shutil.copy(structures / name, dest / name)
    return dest


@pytest.fixture
def sample_copy(tmp_path, shared_data) -> pathlib.Path:
    """A writable copy of ../shared/data (the original is read-only)."""
    target = tmp_path / "data"
    shutil.copytree(shared_data, target)
    return target


@pytest.fixture(scope="session")
def sample_cache(tmp_path_factory, shared_data) -> pathlib.Path:
    """A finished cache of every sample structure with its ingested alignments (built once)."""
    from featurecache.precompute.pipeline import PrecomputeOptions, precompute

    cache_dir = tmp_path_factory.mktemp("sample-cache") / "cache"
    summary = precompute(
        PrecomputeOptions(
            inputs=[shared_data / "structures"],
            cache_dir=cache_dir,
            alignments_dir=shared_data / "alignments",
            template_dir=shared_data / "templates" / "mmcif",
            num_workers=2,
            progress=False,
        )
    )
    assert summary.failed == 0, summary.format()
    return cache_dir


@pytest.fixture
def one_thread():
    """Tiny matrices on a shared CI machine: OpenMP threads only wait on each other (30x slower)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
