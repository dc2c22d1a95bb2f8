"""Ray keeps quiet in a precompute run unless --verbose: no token-authentication warning, no
start-up banner, nothing from its workers on the terminal; and what Ray prints itself never
reaches stdout, which holds the command's result alone."""

import json
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
        [
            sys.executable,
            "-m",
            "featurecache.cli",
            "precompute",
            str(shared_data / "structures" / "209d-assembly1.cif"),
            "--alignments",
            str(shared_data / "alignments"),
            "--cache",
            str(cache),
            "--workers",
            "1",
            "--no-progress",
            *extra,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.slow
def test_ray_is_quiet_unless_verbose(tmp_path, shared_data):
    quiet = _precompute(tmp_path, shared_data)
    assert quiet.returncode == 0, quiet.stderr[-3000:]
    assert "done      1" in quiet.stdout
    assert quiet.stderr.strip() == "", quiet.stderr  # no token warning, no banner, no worker output
    verbose = _precompute(tmp_path, shared_data, "--verbose")
    assert verbose.returncode == 0, verbose.stderr[-3000:]
    assert "Started a local Ray instance" in verbose.stderr


def test_json_stdout_holds_only_the_summary_when_ray_prints_a_notice(tmp_path, shared_data, monkeypatch):
    """Ray's error thread prints notices such as a lost node's ("(raylet) Raylet is terminated")
    with print_to_stdstream, on whatever sys.stdout is when it prints. Until Ray is down the CLI
    points sys.stdout at stderr: the notice stays visible there, and stdout is the JSON alone.
    (The real notice, from a killed raylet: tests/precompute/test_ray_cluster.py.)"""
    from click.testing import CliRunner
    from ray._private.worker import print_to_stdstream

    from featurecache.cli import cli
    from featurecache.precompute import pipeline

    run = pipeline.precompute

    def run_while_ray_prints(options):
        print_to_stdstream(
            {"lines": ["Raylet is terminated (a notice Ray printed mid-run)"], "pid": "raylet", "is_err": False},
            ignore_prefix=False,
        )
        return run(options)

    monkeypatch.setattr(pipeline, "precompute", run_while_ray_prints)
    result = CliRunner().invoke(
        cli,
        [
            "precompute",
            str(shared_data / "structures" / "209d-assembly1.cif"),
            "--alignments",
            str(shared_data / "alignments"),
            "--cache",
            str(tmp_path / "cache"),
            "--executor",
            "inline",
            "--no-progress",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["stages"]["featurize"]["done"] == 1
    assert "Raylet is terminated (a notice Ray printed mid-run)" in result.stderr
