"""Ray keeps quiet in a precompute run unless --verbose: no token-authentication warning, no
start-up banner, nothing from its workers on the terminal."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _precompute(tmp_path: Path, shared_data: Path, *extra: str) -> subprocess.CompletedProcess:
    """`featurecache precompute` of the smallest sample structure in a child process with a local Ray."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    env.pop("RAY_AUTH_MODE", None)  # Ray's default, under which it warns on every start
    cache = tmp_path / f"cache{len(extra)}"
    return subprocess.run(
        [sys.executable, "-m", "featurecache.cli", "precompute", str(shared_data / "structures" / "209d-assembly1.cif"),
         "--alignments", str(shared_data / "alignments"), "--cache", str(cache), "--workers", "1", "--no-progress",
         *extra],
        env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_ray_is_quiet_unless_verbose(tmp_path, shared_data):
    quiet = _precompute(tmp_path, shared_data)
    assert quiet.returncode == 0, quiet.stderr[-3000:]
    assert "done      1" in quiet.stdout
    assert quiet.stderr.strip() == "", quiet.stderr  # no token warning, no banner, no worker output
    verbose = _precompute(tmp_path, shared_data, "--verbose")
    assert verbose.returncode == 0, verbose.stderr[-3000:]
    assert "Started a local Ray instance" in verbose.stderr
