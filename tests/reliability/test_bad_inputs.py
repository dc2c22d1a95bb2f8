"""A corpus of bad inputs, bad tools and bad caches: each gives a clear message, the rest completes.

The input corpus (tests/reliability/_corpus.py) goes through one precompute batch beside two
good targets; tool and setup failures get their own small runs with a real jackhmmer on a
small real database. Messages are checked for the file, key or option they must name and for
what went wrong.
"""

from __future__ import annotations

import logging
import os
import random
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from featurecache.cli import cli
from featurecache.config import FeatureConfig, StoreConfig
from featurecache.schema import check_record
from featurecache.store.codec import decode_record
from featurecache.store.manifest import MANIFEST_NAME
from featurecache.store.reader import StoreReader
from featurecache.store.writer import StoreWriter
from featurecache.store.verify import verify_cache
from featurecache.precompute.pipeline import PrecomputeOptions, precompute
from tests.conftest import copy_sample_structures
from tests.reliability._corpus import GOOD_TARGETS, build_corpus, homolog_sequences

GOOD_KEYS = {"209d-assembly1", "2q2k"}


def _records(cache: Path, table: str) -> dict:
    with StoreReader(cache) as reader:
        return {key: decode_record(blob, key=key) for key, blob in reader.items(table)}


def test_bad_input_corpus_each_named_and_the_rest_completes(tmp_path, shared_data, seed, caplog, reliability_report):
    rng = random.Random(seed)
    inputs, alignments, cache = tmp_path / "inputs", tmp_path / "alignments", tmp_path / "cache"
    shutil.copytree(shared_data / "alignments", alignments)
    cases = build_corpus(shared_data, inputs, alignments, rng)
    assert len(cases) >= 30 and len({case.key for case in cases}) == len(cases)

    with caplog.at_level(logging.WARNING, logger="featurecache.precompute.pipeline"):
        summary = precompute(
            PrecomputeOptions(
                inputs=[inputs], cache_dir=cache, alignments_dir=alignments, executor="inline", progress=False
            )
        )
    logged = [record.getMessage() for record in caplog.records]
    failures = {failure["key"]: failure for failure in summary.failures}
    features = _records(cache, "features")
    errors = {record.meta["key"]: record.meta for record in _records(cache, "errors").values()}
    failing = [case for case in cases if case.outcome == "error"]
    assert summary.failed == len(failing), summary.format()
    assert set(failures) == set(errors) == {case.key for case in failing}
    assert set(features) == GOOD_KEYS | {case.key for case in cases if case.outcome == "cached"}

    rows = []
    for case in cases:
        if case.outcome == "error":
            failure = failures[case.key]
            message = failure["message"]
            assert failure["stage"] == case.stage, (case, failure)
            assert errors[case.key]["message"] == message and errors[case.key]["stage"] == case.stage
            for text in case.expect:
                assert text in message, f"{case.key}: {text!r} not in {message!r}"
        else:
            record = features[case.key]
            check_record(record.arrays, where=case.key)
            notes = record.meta["warnings"] + logged
            message = next((note for note in notes if all(text in note for text in case.expect)), None)
            assert message is not None, f"{case.key}: no warning with {case.expect} in {notes}"
            if not case.expect:
                message = f"cached, {record.arrays['restype'].shape[0]} tokens"
        rows.append(
            {
                "key": case.key,
                "what": case.what,
                "outcome": case.outcome,
                "stage": case.stage,
                "message": message.replace(str(tmp_path) + "/", ""),
            }
        )

    # Data the corpus bends but does not break is featurized at its true size.
    assert features["long"].arrays["restype"].shape == (3000,)
    assert features["huge_a3m"].arrays["msa_species"].shape[0] == FeatureConfig().msa_rows_stored
    assert features["unknown_residues"].arrays["restype"].shape == (38,)
    for key in GOOD_KEYS:
        assert features[key].arrays["msa_species"].shape[0] > 1, f"{key} lost its alignments"
    assert verify_cache(cache).ok

    # A rerun retries every failure (attempt 2) and skips every cached target.
    rerun = precompute(
        PrecomputeOptions(
            inputs=[inputs], cache_dir=cache, alignments_dir=alignments, executor="inline", progress=False
        )
    )
    assert rerun.stages["featurize"].skipped == len(features) and rerun.failed == len(failing)
    assert {meta["attempts"] for meta in _records_meta(cache, "errors")} == {2}
    reliability_report["bad_inputs"] = rows


def _records_meta(cache: Path, table: str) -> list[dict]:
    return [record.meta for record in _records(cache, table).values()]


# --- tools and setup ----------------------------------------------------------------------------


@pytest.fixture
def search_inputs(tmp_path, shared_data):
    """A protein target (searched with jackhmmer) and a DNA target (not searched: AF3 gives DNA
    no MSA), plus a jackhmmer database of 60 real sequences."""
    sequences = homolog_sequences(shared_data, 61)
    database = tmp_path / "db" / "homologs.fasta"
    database.parent.mkdir()
    database.write_text("".join(f">UniRef100_H{i:04d}\n{sequence}\n" for i, sequence in enumerate(sequences[1:])))
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    (inputs / "protein.fasta").write_text(f">p mol:protein\n{sequences[0]}\n")
    (inputs / "dna.fasta").write_text(">d mol:dna\nCGCGAATTCGCGTTAACG\n")
    return inputs, database


def _config(tmp_path: Path, database: Path, tool: str = "", search: str = "") -> Path:
    path = tmp_path / "pipeline.toml"
    path.write_text(
        f"[search]\nthreads = 1\n{search}\n[tools.jackhmmer]\n{tool}\n"
        f'[[databases]]\nname = "homologs"\ntool = "jackhmmer"\nrole = "msa"\npath = "{database}"\n'
    )
    return path


def _cli(*args: str):
    return CliRunner().invoke(cli, [str(arg) for arg in args])


def _search_failure(tmp_path: Path, inputs: Path, config: Path, name: str) -> tuple[str, dict]:
    """Run precompute with `config`; return the search failure's message and its errors record."""
    cache = tmp_path / f"cache-{name}"
    summary = precompute(
        PrecomputeOptions(inputs=[inputs], cache_dir=cache, config_path=config, executor="inline", progress=False)
    )
    stages = {(failure["stage"], failure["key"]): failure["message"] for failure in summary.failures}
    assert stages.pop(("featurize", "protein")) == "search failed for chain(s) A", summary.format()
    assert len(stages) == 1 and next(iter(stages))[0] == "search", summary.format()
    # The DNA target has no search to fail and is cached all the same.
    assert set(_records(cache, "features")) == {"dna"}
    assert verify_cache(cache).ok
    record = next(meta for meta in _records_meta(cache, "errors") if meta["stage"] == "search")
    return next(iter(stages.values())), record


def test_failing_and_timed_out_tools_fail_their_target_only(tmp_path, search_inputs, reliability_report):
    inputs, database = search_inputs
    corrupt = tmp_path / "db" / "corrupt.fasta"
    corrupt.write_bytes(bytes(random.Random(0).randrange(1, 256) for _ in range(3000)))
    message, record = _search_failure(tmp_path, inputs, _config(tmp_path, corrupt), "failing")
    assert "database homologs: jackhmmer exited with status 1" in message and str(corrupt) in message
    assert "is empty or misformatted" in record["stderr_tail"] and "is empty or misformatted" in message
    stderr_last = next(line for line in record["stderr_tail"].splitlines() if "misformatted" in line)
    rows = [
        {
            "key": "failing_tool",
            "what": "jackhmmer fails on a corrupt database file",
            "outcome": "error",
            "stage": "search",
            "message": f"{message.splitlines()[0]} ... (tail): {stderr_last.replace(str(tmp_path) + '/', '')}",
        }
    ]

    message, record = _search_failure(
        tmp_path, inputs, _config(tmp_path, database, search="timeout_s = 0.001"), "timeout"
    )
    assert "database homologs: jackhmmer timed out after 0.001 s and was killed" in message
    rows.append(
        {
            "key": "timeout",
            "what": "jackhmmer past its 1 ms timeout",
            "outcome": "error",
            "stage": "search",
            "message": message.splitlines()[0],
        }
    )
    reliability_report.setdefault("tool_failures", []).extend(rows)


def test_failing_tool_message_says_why(tmp_path, search_inputs, reliability_report):
    """HMMER prints command-line errors on stdout, not stderr: the message must still say why."""
    inputs, database = search_inputs
    config = _config(tmp_path, database, tool='extra_flags = ["--no-such-option"]')
    message, record = _search_failure(tmp_path, inputs, config, "bad-flag")
    reason = 'Failed to parse command line: No such option "--no-such-option"'
    assert "jackhmmer exited with status 1" in message and reason in message and reason in record["stderr_tail"]
    reliability_report.setdefault("tool_failures", []).append(
        {
            "key": "bad_flag",
            "what": "jackhmmer given an option it does not know",
            "outcome": "error",
            "stage": "search",
            "message": f"{message.splitlines()[0]} ... (tail): {reason}",
        }
    )


def test_setup_problems_exit_2_before_any_work(tmp_path, search_inputs, reliability_report):
    inputs, database = search_inputs
    rows = []

    def expect_setup_error(
        name: str, what: str, args: list, expected: tuple[str, ...], cache: Path, target: Path = inputs
    ) -> None:
        result = _cli("precompute", target, "--cache", cache, "--executor", "inline", "--no-progress", *args)
        assert result.exit_code == 2, f"{name}: exit {result.exit_code}: {result.output}"
        for text in expected:
            assert text in result.output, f"{name}: {text!r} not in {result.output!r}"
        message = result.output.strip().removeprefix("Error: ").replace(str(tmp_path) + "/", "")
        rows.append({"key": name, "what": what, "outcome": "exit 2", "stage": "setup", "message": message})

    missing = tmp_path / "nowhere" / "jackhmmer"
    expect_setup_error(
        "missing_tool_path",
        "configured jackhmmer binary path does not exist",
        ["--config", _config(tmp_path, database, f'binary = "{missing}"')],
        ("tool jackhmmer", str(missing), "does not exist or is not executable"),
        tmp_path / "c1",
    )
    expect_setup_error(
        "missing_tool",
        "jackhmmer binary name not on PATH",
        ["--config", _config(tmp_path, database, 'binary = "jackhmmer-not-installed"')],
        ("tool jackhmmer", "jackhmmer-not-installed"),
        tmp_path / "c1",
    )
    gone = tmp_path / "db" / "gone.fasta"
    expect_setup_error(
        "missing_database",
        "database FASTA file missing",
        ["--config", _config(tmp_path, gone)],
        ("database homologs", str(gone)),
        tmp_path / "c2",
    )
    broken_toml = tmp_path / "broken.toml"
    broken_toml.write_text("[search\nthreads = 1\n")
    expect_setup_error(
        "broken_config",
        "pipeline config that is not TOML",
        ["--config", broken_toml],
        (str(broken_toml), "not valid TOML"),
        tmp_path / "c3",
    )
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    expect_setup_error(
        "cache_is_a_file", "--cache below an existing file", [], ("--cache", "a-file"), blocker / "cache"
    )
    # Unwritable cache folder: root ignores permission bits, so as root use a path sysfs refuses.
    if os.geteuid() != 0:
        locked_dir = tmp_path / "read-only"
        locked_dir.mkdir(mode=0o555)
        unwritable = locked_dir / "cache"
    else:
        unwritable = Path("/sys/featurecache-cache")
    expect_setup_error(
        "unwritable_cache", "--cache in a folder nobody may write", [], ("--cache", str(unwritable)), unwritable
    )
    busy = tmp_path / "busy"
    with StoreWriter(busy, StoreConfig(num_shards=4)):
        expect_setup_error(
            "cache_in_use", "another precompute is writing the cache", [], ("being written by another writer",), busy
        )
    expect_setup_error(
        "shard_mismatch",
        "--shards 2 for a cache that has 4",
        ["--shards", "2"],
        ("--shards 2", "already has 4 shards"),
        busy,
    )
    expect_setup_error(
        "missing_input",
        "input path that does not exist",
        [],
        ("input", "no-such-input", "does not exist"),
        tmp_path / "c4",
        tmp_path / "no-such-input",
    )
    # Nothing was written: no shard files in the caches of the failed runs.
    assert not [path for name in ("c1", "c2", "c3", "c4") for path in (tmp_path / name).glob("shard-*")]
    reliability_report.setdefault("setup_errors", []).extend(rows)


# --- full disk --------------------------------------------------------------------------------

_FILE_SIZE_LIMIT = 50_000  # bytes: an empty shard takes 36,864; the two targets need ~70,000 more


def _limit_file_size() -> None:
    # RLIMIT_FSIZE: writes past the limit fail with EFBIG, as on a full disk, without root or
    # a special filesystem. Python ignores SIGXFSZ, so the write fails instead of killing.
    resource.setrlimit(resource.RLIMIT_FSIZE, (_FILE_SIZE_LIMIT, _FILE_SIZE_LIMIT))


@pytest.fixture(scope="module")
def full_disk_run(tmp_path_factory, shared_data):
    """A precompute command run out of disk space; returns (result, inputs, cache)."""
    root = tmp_path_factory.mktemp("full-disk")
    inputs, cache = root / "inputs", root / "cache"
    copy_sample_structures(GOOD_TARGETS, inputs)
    command = [
        sys.executable,
        "-m",
        "featurecache.cli",
        "precompute",
        str(inputs),
        "--cache",
        str(cache),
        "--alignments",
        str(shared_data / "alignments"),
        "--executor",
        "inline",
        "--no-progress",
    ]
    result = subprocess.run(command, preexec_fn=_limit_file_size, capture_output=True, text=True, timeout=300)
    return result, inputs, cache


def test_full_disk_ends_with_a_clear_error_and_the_rerun_completes(full_disk_run, shared_data, reliability_report):
    result, inputs, cache = full_disk_run
    output = result.stdout + result.stderr
    assert result.returncode == 2 and "Traceback" not in output, output
    assert str(cache) in output and "shard-0000" in output, output
    assert not (cache / MANIFEST_NAME).exists()  # never mistaken for a finished cache
    summary = precompute(
        PrecomputeOptions(
            inputs=[inputs],
            cache_dir=cache,
            alignments_dir=shared_data / "alignments",
            executor="inline",
            progress=False,
        )
    )
    assert summary.failed == 0 and summary.stages["featurize"].done == len(GOOD_TARGETS), summary.format()
    assert verify_cache(cache).ok
    assert set(_records(cache, "features")) == GOOD_KEYS
    message = output.strip().removeprefix("Error: ").replace(str(cache.parent) + "/", "")
    reliability_report["full_disk"] = [
        {
            "key": "full_disk",
            "what": f"shard files capped at {_FILE_SIZE_LIMIT} bytes (RLIMIT_FSIZE)",
            "outcome": f"exit {result.returncode}; the rerun with space completes, verify clean",
            "stage": "write",
            "message": message,
        }
    ]


def test_two_inputs_with_one_target_id_are_refused(tmp_path, shared_data, reliability_report):
    """dup.cif and dup.fasta would both be stored as 'dup', the second overwriting the first."""
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    shutil.copy(shared_data / "structures" / "209d-assembly1.cif", inputs / "dup.cif")
    (inputs / "dup.fasta").write_text(">a mol:protein\nMKVLAAGIVGLLLAAGCSS\n")
    result = _cli("precompute", inputs, "--cache", tmp_path / "cache", "--executor", "inline", "--no-progress")
    assert result.exit_code == 2, result.output
    assert "'dup'" in result.output and "dup.cif" in result.output and "dup.fasta" in result.output
    assert not list((tmp_path / "cache").glob("shard-*"))
    reliability_report.setdefault("setup_errors", []).append(
        {
            "key": "duplicate_target_id",
            "what": "two inputs with one target id (dup.cif, dup.fasta)",
            "outcome": "exit 2",
            "stage": "setup",
            "message": result.output.strip().removeprefix("Error: ").replace(str(tmp_path) + "/", ""),
        }
    )
