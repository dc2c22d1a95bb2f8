"""The repository carries source and text, not binaries: wheels, archives, device outputs and large
files stay out of git (wheels for the GPU machine travel in an ignored folder; see README)."""

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_BYTES = 1 << 20
# Folders that hold real sample inputs, where a large file is data the tests read.
SAMPLE_DATA_DIRS = ("tests/data/",)
BINARY_SUFFIXES = (
    ".whl",
    ".egg",
    ".zip",
    ".tar",
    ".tgz",
    ".gz",
    ".bz2",
    ".xz",
    ".zst",
    ".7z",
    ".so",
    ".pt",
    ".pth",
    ".ckpt",
    ".npz",
    ".npy",
    ".mdb",
    ".lmdb",
)
IGNORED_LOCAL_DIRS = (".whl", ".whl-core", ".devout", ".devdata")


def _tracked_files() -> list[str]:
    try:
        listing = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [name for name in listing.decode().split("\0") if name]


def test_no_tracked_binaries_or_large_files():
    problems = []
    for name in _tracked_files():
        path = ROOT / name
        if not path.is_file() or name.startswith(SAMPLE_DATA_DIRS):
            continue
        if name.lower().endswith(BINARY_SUFFIXES):
            problems.append(f"{name}: a wheel, archive or binary artefact")
        elif path.stat().st_size > MAX_BYTES:
            problems.append(f"{name}: {path.stat().st_size / 2**20:.1f} MiB (limit 1 MiB)")
        elif name.split("/")[0] in IGNORED_LOCAL_DIRS:
            problems.append(f"{name}: inside a local-only folder")
    assert not problems, "tracked files that do not belong in git:\n" + "\n".join(problems)


def test_local_only_folders_are_ignored():
    ignore_rules = (ROOT / ".gitignore").read_text().splitlines()
    for folder in IGNORED_LOCAL_DIRS:
        assert f"/{folder}/" in ignore_rules, f".gitignore does not ignore {folder}/"
