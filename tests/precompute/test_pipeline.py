"""End-to-end precompute: ingest and search modes, resume, stale records, failures, exit codes."""

import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from click.testing import CliRunner

from featurecache.cli import cli
from featurecache.store.codec import decode_record, read_header
from featurecache.store.manifest import read_manifest
from featurecache.store.reader import StoreReader
from featurecache.store.verify import verify_cache
from featurecache.precompute.pipeline import PipelineSetupError, PrecomputeOptions, precompute
from tests.conftest import copy_sample_structures

SMALL = ("209d-assembly1.cif", "2q2k.cif")


@pytest.fixture
def small_inputs(tmp_path):
    return copy_sample_structures(SMALL, tmp_path / "inputs")


def _options(inputs, cache, shared_data, **changes):
    values = dict(
        inputs=[inputs], cache_dir=cache, alignments_dir=shared_data / "alignments", executor="inline", progress=False
    )
    values.update(changes)
    return PrecomputeOptions(**values)


def _fingerprints(cache):
    with StoreReader(cache) as reader:
        return {key: read_header(blob).fingerprint for key, blob in reader.items("features")}


def test_rerun_skips_current_and_recomputes_stale(tmp_path, small_inputs, shared_data):
    cache = tmp_path / "cache"
    first = precompute(_options(small_inputs, cache, shared_data))
    assert first.stages["featurize"].done == 2 and first.failed == 0
    before = _fingerprints(cache)

    again = precompute(_options(small_inputs, cache, shared_data))
    assert again.stages["featurize"].skipped == 2 and again.stages["featurize"].done == 0

    # A feature setting changes every fingerprint: both records are recomputed.
    changed = precompute(_options(small_inputs, cache, shared_data, msa_rows_stored=7))
    assert changed.stages["featurize"].done == 2
    after = _fingerprints(cache)
    assert all(before[key] != after[key] for key in before)
    with StoreReader(cache) as reader:
        record = decode_record(reader.get("features", "2q2k"))
    assert record.arrays["msa_species"].shape[0] <= 7

    # A changed input file (same name) is stale too; the other target stays current.
    path = small_inputs / "2q2k.cif"
    path.write_text(path.read_text().replace("2Q2K", "2Q2K", 1) + "\n#\n")
    edited = precompute(_options(small_inputs, cache, shared_data, msa_rows_stored=7))
    assert edited.stages["featurize"].done == 1 and edited.stages["featurize"].skipped == 1
    assert verify_cache(cache).ok
    assert read_manifest(cache).counts["features"] == 2


def test_bad_inputs_are_recorded_and_the_rest_completes(tmp_path, small_inputs, shared_data):
    (small_inputs / "truncated.cif").write_text((small_inputs / "2q2k.cif").read_text()[:5000])
    (small_inputs / "binary.cif").write_bytes(os.urandom(2000))
    (small_inputs / "empty.fasta").write_text("")
    with gzip.open(small_inputs / "notgzip.cif.gz", "wb") as handle:
        handle.write(b"this is not an mmCIF file\n")
    cache = tmp_path / "cache"
    summary = precompute(_options(small_inputs, cache, shared_data))
    assert summary.stages["featurize"].done == 2
    assert summary.failed == 4
    failed = {failure["key"]: failure["message"] for failure in summary.failures}
    assert set(failed) == {"truncated", "binary", "empty", "notgzip"}
    for key, message in failed.items():
        assert key in message or "truncated" in message or str(small_inputs) in message, message

    with StoreReader(cache) as reader:
        errors = {key: decode_record(blob).meta for key, blob in reader.items("errors")}
    assert {meta["key"] for meta in errors.values()} == set(failed)
    # A rerun retries the failures (and counts the attempts), and skips what is cached.
    rerun = precompute(_options(small_inputs, cache, shared_data))
    assert rerun.stages["featurize"].skipped == 2 and rerun.failed == 4
    with StoreReader(cache) as reader:
        attempts = {decode_record(blob).meta["attempts"] for _, blob in reader.items("errors")}
    assert attempts == {2}


def test_setup_errors_exit_2_before_any_work(tmp_path, small_inputs, shared_data):
    runner = CliRunner()
    cache = tmp_path / "cache"
    result = runner.invoke(cli, ["precompute", str(tmp_path / "missing"), "--cache", str(cache)])
    assert result.exit_code == 2 and "does not exist" in result.output
    result = runner.invoke(
        cli, ["precompute", str(small_inputs), "--cache", str(cache), "--alignments", str(tmp_path / "nowhere")]
    )
    assert result.exit_code == 2 and "nowhere" in result.output
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    result = runner.invoke(cli, ["precompute", str(small_inputs), "--cache", str(blocker / "cache")])
    assert result.exit_code == 2 and "--cache" in result.output
    config = tmp_path / "pipeline.toml"
    config.write_text(
        f'[[databases]]\nname = "gone"\ntool = "jackhmmer"\nrole = "msa"\npath = "{tmp_path / "no-such.fasta"}"\n'
    )
    result = runner.invoke(cli, ["precompute", str(small_inputs), "--cache", str(cache), "--config", str(config)])
    assert result.exit_code == 2 and "no-such.fasta" in result.output
    assert not cache.exists() or not any(cache.iterdir())
    with pytest.raises(PipelineSetupError, match="executor"):
        precompute(_options(small_inputs, cache, shared_data, executor="threads"))


def test_old_max_msa_rows_flag_still_works_and_names_the_new_one(tmp_path, small_inputs, shared_data):
    runner = CliRunner()
    cache = tmp_path / "cache"
    common = [
        "precompute",
        str(small_inputs),
        "--cache",
        str(cache),
        "--alignments",
        str(shared_data / "alignments"),
        "--executor",
        "inline",
        "--no-progress",
    ]
    with pytest.warns(DeprecationWarning, match="use --msa-rows-stored"):
        old = runner.invoke(cli, [*common, "--max-msa-rows", "5"])
    assert old.exit_code == 0, old.output
    assert "deprecated" in old.output and "--msa-rows-stored" in old.output
    with StoreReader(cache) as reader:
        assert decode_record(reader.get("features", "2q2k")).arrays["msa_species"].shape[0] <= 5
    new = runner.invoke(cli, [*common, "--msa-rows-stored", "5"])
    assert new.exit_code == 0 and "deprecated" not in new.output
    assert "skipped      2" in new.output  # one setting, one fingerprint, whichever spelling
    help_text = runner.invoke(cli, ["precompute", "--help"]).output
    assert "--msa-rows-stored" in help_text and "--max-msa-rows" not in help_text


def test_cli_main_job_with_ray(tmp_path, small_inputs, shared_data):
    """The README's main job through the command line, with Ray started locally."""
    runner = CliRunner()
    cache = tmp_path / "cache"
    result = runner.invoke(
        cli,
        [
            "precompute",
            str(small_inputs),
            "--cache",
            str(cache),
            "--alignments",
            str(shared_data / "alignments"),
            "--workers",
            "2",
            "--no-progress",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "done      2" in result.output
    stats = runner.invoke(cli, ["stats", str(cache), "--plot", str(tmp_path / "stats.png")])
    assert stats.exit_code == 0, stats.output
    assert "2q2k" in stats.output and "209d-assembly1" in stats.output
    assert (tmp_path / "stats.png").stat().st_size > 1000
    verify = runner.invoke(cli, ["verify", str(cache)])
    assert verify.exit_code == 0 and "OK" in verify.output
    show = runner.invoke(cli, ["show", str(cache), "2q2k"])
    assert show.exit_code == 0 and "msa_profile" in show.output
    missing = runner.invoke(cli, ["show", str(cache), "nope"])
    assert missing.exit_code == 2 and "nope" in missing.output  # a key that is not there: a usage error


def _cut_after(path, keep_line) -> None:
    """Cut a file at a line boundary: keep its first `keep_line` lines."""
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:keep_line]))


def test_precompute_names_and_counts_alignment_files_cut_short(tmp_path, shared_data):
    """Real alignment files of 2q2k, cut at line boundaries inside a record, through `featurecache
    precompute --alignments`: an A3M cut after a header loses that record, an HHR cut inside a hit
    loses that hit, a Stockholm without its '//' is left out; each is one warning naming the file,
    and `featurecache stats` counts them."""
    inputs = copy_sample_structures("2q2k.cif", tmp_path / "inputs")
    alignments = tmp_path / "alignments"
    for chain in ("2q2k_A", "2q2k_B"):
        shutil.copytree(shared_data / "alignments" / "openfold" / chain, alignments / chain)
    a3m = alignments / "2q2k_A" / "bfd_uniclust_hits.a3m"
    _cut_after(a3m, 5)  # query, one hit, then the next hit's header alone
    hhr = alignments / "2q2k_A" / "pdb70_hits.hhr"
    hhr_lines = (shared_data / "alignments" / "openfold" / "pdb70_hits.hhr").read_text().splitlines(keepends=True)
    hhr.write_text("".join(hhr_lines[: hhr_lines.index("No 5\n") + 5]))  # hit 5: name, scores, one Q row
    sto = alignments / "2q2k_B" / "uniref90_hits.sto"
    sto_lines = sto.read_text().splitlines()
    _cut_after(sto, next(n for n in range(len(sto_lines) - 1, 0, -1) if not sto_lines[n].startswith(("#", "//"))))
    cache = tmp_path / "cache"
    runner = CliRunner()
    result = runner.invoke(
        cli,
        [
            "precompute",
            str(inputs),
            "--cache",
            str(cache),
            "--alignments",
            str(alignments),
            "--executor",
            "inline",
            "--no-progress",
        ],
    )
    assert result.exit_code == 0, result.output
    stats = runner.invoke(cli, ["stats", str(cache)])
    assert stats.exit_code == 0, stats.output
    cut_lines = [line for line in stats.output.splitlines() if "file cut short" in line]
    assert len(cut_lines) == 3, stats.output
    for path in (a3m, hhr, sto):
        assert sum(str(path) in line for line in cut_lines) == 1, (path, stats.output)
    assert "  3 about input files cut short" in stats.output
    report = json.loads(runner.invoke(cli, ["stats", str(cache), "--json"]).output)
    assert report["files_cut_short"] == 3
    assert read_manifest(cache).counts["features"] == 1


def test_kill_during_precompute_then_rerun(tmp_path, shared_data):
    """kill -9 of the driver mid-run: the rerun caches every target once and verify is clean."""
    cache = tmp_path / "cache"
    command = [
        sys.executable,
        "-m",
        "featurecache.cli",
        "precompute",
        str(shared_data / "structures"),
        "--cache",
        str(cache),
        "--alignments",
        str(shared_data / "alignments"),
        "--executor",
        "inline",
        "--no-progress",
    ]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    # Kill once at least one record is committed (the shard files grow past their empty size).
    while time.time() < deadline and process.poll() is None:
        shards = list(cache.glob("shard-*.lmdb")) if cache.exists() else []
        if shards and sum(path.stat().st_size for path in shards) > 600_000:
            break
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    summary = precompute(
        PrecomputeOptions(
            inputs=[shared_data / "structures"],
            cache_dir=cache,
            alignments_dir=shared_data / "alignments",
            executor="inline",
            progress=False,
        )
    )
    stages = summary.stages["featurize"]
    assert stages.done + stages.skipped == 5 and summary.failed == 0
    assert verify_cache(cache).ok
    assert read_manifest(cache).counts["features"] == 5


@pytest.mark.tools
def test_search_mode_end_to_end_and_one_failing_search(tmp_path, test_databases):
    """Real searches (jackhmmer, hhblits, hhsearch, nhmmer) on small real databases.

    The nucleotide database is replaced by a corrupt file: the DNA target's search fails and is
    recorded, while the protein target is searched, featurized with templates and cached.
    """
    from featurecache.testing.testdb import write_pipeline_config

    broken = tmp_path / "broken-nucleotides.fasta"
    broken.write_bytes(b"\x00\x01 not a sequence database \xff\n" * 50)
    config_path = write_pipeline_config(test_databases, tmp_path / "pipeline.toml", threads=1, template_tool="hhsearch")
    text = config_path.read_text().replace(str(test_databases.nucleotide_fasta), str(broken))
    config_path.write_text(text)
    inputs = copy_sample_structures("721p-assembly1.cif", tmp_path / "inputs")
    (inputs / "dna_only.fasta").write_text(">chain_a mol:dna\nCGCGAATTCGCG\n")

    cache = tmp_path / "cache"
    result = CliRunner().invoke(
        cli,
        [
            "precompute",
            str(inputs),
            "--cache",
            str(cache),
            "--config",
            str(config_path),
            "--executor",
            "inline",
            "--no-progress",
            "--json",
        ],
    )
    assert result.exit_code == 1, result.output
    with StoreReader(cache) as reader:
        record = decode_record(reader.get("features", "721p-assembly1"))
        errors = {key: decode_record(blob).meta for key, blob in reader.items("errors")}
        msa_keys = [key for key in reader.keys("msa") if "-db-" not in key]  # not the per-database outputs
    # The homodimer's two identical chains were searched once.
    assert len(msa_keys) == 1
    assert record.arrays["msa_species"].shape[0] > 10
    assert record.meta["warnings"] == []
    stages = {meta["stage"] for meta in errors.values()}
    assert stages == {"search", "featurize"}
    search_error = next(meta for meta in errors.values() if meta["stage"] == "search")
    assert "nhmmer" in search_error["message"] or "nucleotide" in search_error["message"]
    assert search_error["stderr_tail"] or "Stockholm" in search_error["message"]


def test_changing_one_database_searches_that_database_only(tmp_path, test_databases):
    """A new hit cap on the template database: the MSA databases' stored outputs are reused,
    the template search runs again, and the features match a run from scratch."""
    from featurecache.testing.testdb import write_pipeline_config

    config_path = write_pipeline_config(test_databases, tmp_path / "pipeline.toml", threads=1, template_tool="hhsearch")
    inputs = copy_sample_structures("721p-assembly1.cif", tmp_path / "inputs")

    def run(cache):
        result = CliRunner().invoke(
            cli,
            [
                "precompute",
                str(inputs),
                "--cache",
                str(cache),
                "--config",
                str(config_path),
                "--executor",
                "inline",
                "--no-progress",
            ],
        )
        assert result.exit_code == 0, result.output
        with StoreReader(cache) as reader:
            chains = [decode_record(reader.get("msa", key)).meta for key in reader.keys("msa") if "-db-" not in key]
            features = decode_record(reader.get("features", "721p-assembly1"))
        return chains, features

    cache = tmp_path / "cache"
    (first,), _ = run(cache)
    assert not any(entry["reused"] for entry in first["databases"].values())
    text = config_path.read_text()
    assert text.count("max_hits = 20") == 1  # the template database's cap
    config_path.write_text(text.replace("max_hits = 20", "max_hits = 19"))
    chains, features = run(cache)
    (second,) = [meta for meta in chains if meta["databases"] != first["databases"]]
    reused = {name for name, entry in second["databases"].items() if entry["reused"]}
    assert reused == set(first["databases"]) - {"pdb_seqres_sample"} and reused  # every MSA database
    _, fresh = run(tmp_path / "fresh")
    for name, value in fresh.arrays.items():
        np.testing.assert_array_equal(features.arrays[name], value, err_msg=name)
