"""Each command-line mistake a newcomer makes gives one line naming the thing, and exit status 2.

The cases are the classes issue 17 found by hand (bad option values, wrong files, unreadable or
foreign caches, conflicting options), each run through the installed `featurecache` script in a
subprocess, as a user runs it: no traceback, nothing written where nothing should be.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from featurecache.store.verify import verify_cache

pytestmark = pytest.mark.usefixtures("shared_data")


@pytest.fixture(scope="module")
def small_cache(tmp_path_factory, shared_data) -> Path:
    cache = tmp_path_factory.mktemp("cli") / "cache"
    _run(
        "precompute",
        str(shared_data / "structures" / "2q2k.cif"),
        "--alignments",
        str(shared_data / "alignments"),
        "--cache",
        str(cache),
        "--executor",
        "inline",
        "--no-progress",
        expect=0,
    )
    return cache


def _run(*args: str, expect: int) -> subprocess.CompletedProcess:
    result = subprocess.run(["featurecache", *args], capture_output=True, text=True, timeout=600)
    assert result.returncode == expect, f"featurecache {' '.join(args)}: exit {result.returncode}\n{result.stderr}"
    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    return result


def _error_line(result: subprocess.CompletedProcess) -> str:
    lines = [line for line in result.stderr.splitlines() if line.startswith("Error")]
    assert len(lines) == 1, result.stderr
    return lines[0]


def _cases(tmp: Path, cache: Path, data: Path) -> list[tuple[str, str, list[str], tuple[str, ...]]]:
    """(key, what, arguments, words the one line must contain)."""
    latin1 = tmp / "pipeline.toml"
    latin1.write_bytes("[store]\n# caf\xe9\n".encode("latin-1"))
    searching = tmp / "search.toml"
    searching.write_text('[[databases]]\nname = "uniref90"\ntool = "jackhmmer"\npath = "uniref90.fasta"\n')
    garbled = tmp / "garbled"
    shutil.copytree(cache, garbled)
    (garbled / "manifest.json").write_text('{"format": 1, "shards": [')
    not_a_cache = tmp / "plain-folder"
    not_a_cache.mkdir()
    structure = str(data / "structures" / "2q2k.cif")
    out = str(tmp / "never-written")
    return [
        (
            "config_not_utf8",
            "a pipeline config saved as Latin-1",
            ["precompute", structure, "--config", str(latin1), "--cache", out],
            ("--config", "pipeline.toml", "UTF-8"),
        ),
        (
            "config_missing",
            "a pipeline config that does not exist",
            ["precompute", structure, "--config", str(tmp / "nope.toml"), "--cache", out],
            ("--config", "nope.toml"),
        ),
        (
            "config_searches_and_alignments",
            "--alignments with a --config that configures searches (they would be ignored)",
            [
                "precompute",
                structure,
                "--config",
                str(searching),
                "--alignments",
                str(data / "alignments"),
                "--cache",
                out,
            ],
            ("--alignments", "--config", "[[databases]]", "uniref90"),
        ),
        ("workers_0", "--workers 0", ["precompute", structure, "--workers", "0", "--cache", out], ("--workers", "0")),
        ("shards_0", "--shards 0", ["precompute", structure, "--shards", "0", "--cache", out], ("--shards", "0")),
        ("gc_keep_0", "gc --keep 0", ["gc", str(tmp), "--keep", "0"], ("--keep", "0")),
        (
            "stats_garbled_manifest",
            "stats of a cache whose manifest.json is cut short",
            ["stats", str(garbled)],
            ("manifest.json", "JSON"),
        ),
        (
            "stats_not_a_cache",
            "stats of a folder that is not a cache",
            ["stats", str(not_a_cache)],
            ("plain-folder", "not a cache"),
        ),
        (
            "stats_plot_missing_folder",
            "stats --plot into a folder that does not exist",
            ["stats", str(cache), "--plot", str(tmp / "no" / "such" / "plot.png")],
            ("--plot", "does not exist"),
        ),
        (
            "stats_plot_suffix",
            "stats --plot with a suffix matplotlib cannot write",
            ["stats", str(cache), "--plot", str(tmp / "plot.xyz")],
            ("--plot", ".png"),
        ),
        ("verify_missing", "verify of a folder that does not exist", ["verify", str(tmp / "missing")], ("missing",)),
        (
            "show_missing_key",
            "show of a key the cache does not hold",
            ["show", str(cache), "no-such-target"],
            ("no-such-target",),
        ),
        (
            "train_not_a_cache",
            "train on a folder that is not a cache",
            ["train", "--cache", str(not_a_cache), "--steps", "1", "--out", str(tmp / "run")],
            ("plain-folder",),
        ),
        (
            "train_steps_0",
            "train --steps 0",
            ["train", "--cache", str(cache), "--steps", "0", "--out", str(tmp / "run")],
            ("--steps", "0"),
        ),
    ]


def test_each_cli_mistake_is_one_line_with_exit_2(tmp_path, small_cache, shared_data, reliability_report):
    rows = []
    for key, what, args, words in _cases(tmp_path, small_cache, shared_data):
        result = _run(*args, expect=2)
        line = _error_line(result)
        for word in words:
            assert word in line, f"{key}: {line!r} does not name {word!r}"
        rows.append(
            {
                "key": key,
                "what": what,
                "outcome": "exit 2",
                "stage": "cli",
                "message": line.replace(str(tmp_path), "TMP").replace(str(shared_data), "DATA"),
            }
        )
    assert not (tmp_path / "never-written").exists(), "a refused precompute created its cache folder"
    assert not (tmp_path / "run").exists(), "a refused train created its run folder"
    assert verify_cache(small_cache).ok
    reliability_report["cli_errors"] = rows


def test_debug_shows_a_traceback(tmp_path):
    result = subprocess.run(["featurecache", "--debug", "stats", str(tmp_path)], capture_output=True, text=True)
    assert result.returncode != 0 and "Traceback" in result.stderr


def test_stats_json_of_a_good_cache_still_parses(small_cache):
    json.loads(_run("stats", str(small_cache), "--json", expect=0).stdout)
