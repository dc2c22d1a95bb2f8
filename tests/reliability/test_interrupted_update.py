"""An update of a finished cache killed at random points never makes the cache unreadable.

Each trial copies a finished cache, starts a reader process on it (a CacheDataset opened before
the update, as a trainer holds one, plus fresh manifests, StoreReaders, datasets and `stats`
every pass) and an update (precompute with a new feature setting: every record is replaced, new
targets are added, and a target that failed before now succeeds, so its error record, which the
old manifest lists, is deleted). The update is killed with SIGKILL or SIGINT after a seeded
random delay; then `featurecache verify` must pass with the "update interrupted" note, `stats`
must say so, and a rerun must finish with the new manifest in place of the old. The reader must
never fail: each manifest it reads is the old or the new one, each record the old version or
the new one, byte for byte.

The last test sends a real Ctrl-C (SIGINT to the process group) to `featurecache precompute`
on the sample data, on Ray and inline: exit code 130, and the old cache still reads.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from featurecache import CacheDataset
from featurecache.cli import cli
from featurecache.precompute.pipeline import PrecomputeOptions, precompute
from featurecache.schema import FEATURES_TABLE
from featurecache.store.inspect import cache_stats
from featurecache.store.manifest import read_manifest
from featurecache.store.reader import StoreReader
from featurecache.store.update_marker import MARKER_NAME, read_update_marker
from featurecache.store.verify import verify_cache
from tests.conftest import copy_sample_structures

TRIALS = 4  # even trials SIGKILL, odd ones SIGINT
COPIES = 6
NEW_COPIES = 2  # targets the update adds
NUM_SHARDS = 3
BATCH_RECORDS = 2
OLD_MSA_ROWS, NEW_MSA_ROWS = 8, 4  # part of the feature fingerprint: the update replaces every record
KILL_SPAN = 0.95  # kill points spread over this fraction of an uninterrupted update's time
READER_PAUSE_S = 0.02  # between a reader's passes: hundreds of passes per update, and CPU left to the writer
FAILED_TARGET = "fixme"  # not mmCIF in the first run, a valid file in the update


def _digests(cache: Path) -> dict[str, str]:
    """Feature record key -> blake2b of its stored bytes."""
    with StoreReader(cache) as reader:
        return {
            key: hashlib.blake2b(bytes(blob), digest_size=16).hexdigest() for key, blob in reader.items(FEATURES_TABLE)
        }


@dataclass(frozen=True)
class _States:
    """The finished cache before the update, and what an uninterrupted update makes of it."""

    old_inputs: Path
    new_inputs: Path
    config: Path
    old_cache: Path
    versions: dict[str, str]  # feature fingerprint -> "old" / "new"
    ids: dict[str, list[str]]  # "old" / "new" -> the manifest's target ids
    records: dict[str, dict[str, str]]  # "old" / "new" -> feature record digests
    update_seconds: float

    def update_options(self, cache: Path) -> PrecomputeOptions:
        return PrecomputeOptions(
            inputs=[self.new_inputs],
            cache_dir=cache,
            config_path=self.config,
            msa_rows_stored=NEW_MSA_ROWS,
            executor="inline",
            progress=False,
        )

    def copy_of_old(self, cache: Path) -> Path:
        shutil.copytree(self.old_cache, cache, ignore=shutil.ignore_patterns("*-lock", "*.lock"))
        return cache


@pytest.fixture(scope="module")
def states(tmp_path_factory, shared_data) -> _States:
    root = tmp_path_factory.mktemp("update")
    old_inputs, new_inputs = root / "inputs-old", root / "inputs-new"
    old_inputs.mkdir()
    structure = shared_data / "structures" / "209d-assembly1.cif"
    for number in range(COPIES):
        shutil.copy(structure, old_inputs / f"copy{number:02d}-209d.cif")
    copy_sample_structures("2q2k.cif", old_inputs)
    (old_inputs / f"{FAILED_TARGET}.cif").write_text("not an mmCIF file\n")
    shutil.copytree(old_inputs, new_inputs)
    shutil.copy(structure, new_inputs / f"{FAILED_TARGET}.cif")
    for number in range(NEW_COPIES):
        shutil.copy(structure, new_inputs / f"added{number}-209d.cif")
    config = root / "pipeline.toml"
    # No search databases: query-only MSAs; two records per transaction, so kills land between commits.
    config.write_text(f"[store]\nnum_shards = {NUM_SHARDS}\nbatch_records = {BATCH_RECORDS}\n")

    old_cache = root / "old"
    summary = precompute(
        PrecomputeOptions(
            inputs=[old_inputs],
            cache_dir=old_cache,
            config_path=config,
            msa_rows_stored=OLD_MSA_ROWS,
            executor="inline",
            progress=False,
        )
    )
    assert summary.failed == 1 and summary.failures[0]["key"] == FAILED_TARGET, summary.format()
    assert f"parse/{FAILED_TARGET}" in read_manifest(old_cache).index["errors"]
    states = _States(old_inputs, new_inputs, config, old_cache, {}, {}, {}, 0.0)
    new_cache = states.copy_of_old(root / "new")
    started = time.perf_counter()
    summary = precompute(states.update_options(new_cache))
    seconds = time.perf_counter() - started
    assert summary.failed == 0 and summary.stages["featurize"].done == COPIES + NEW_COPIES + 2, summary.format()
    manifests = {"old": read_manifest(old_cache), "new": read_manifest(new_cache)}
    assert manifests["new"].counts["errors"] == 0
    return _States(
        old_inputs,
        new_inputs,
        config,
        old_cache,
        versions={manifest.fingerprints["features"]: name for name, manifest in manifests.items()},
        ids={name: sorted(manifest.targets) for name, manifest in manifests.items()},
        records={"old": _digests(old_cache), "new": _digests(new_cache)},
        update_seconds=seconds,
    )


def _read_pass(cache: Path, states: _States, trainer: CacheDataset, rng: random.Random, stats: bool) -> str:
    """One pass over everything a reader does; returns the manifest version it read."""
    manifest = read_manifest(cache)
    version = states.versions.get(manifest.fingerprints.get("features"))
    assert version is not None, f"a manifest of neither state: {manifest.fingerprints}"
    assert sorted(manifest.targets) == states.ids[version], f"{version} manifest with other targets"
    with StoreReader(cache, num_shards=manifest.num_shards) as reader:
        for key in manifest.targets:
            digest = hashlib.blake2b(bytes(reader.get(FEATURES_TABLE, key)), digest_size=16).hexdigest()
            versions = {name for name in ("old", "new") if states.records[name].get(key) == digest}
            assert versions, f"{key}: a record of neither state"
            if version == "new":
                assert versions == {"new"}, f"{key}: an old record under the new manifest"
    trainer[rng.randrange(len(trainer))]  # the trainer's dataset, opened before the update
    fresh = CacheDataset(cache, crop_size=16, msa_rows_per_sample=4)
    fresh[rng.randrange(len(fresh))]
    if stats:
        cache_stats(cache)
    return version


def _read_throughout(cache: Path, states: _States, ready, stop, results, seed: int) -> None:
    """Reads until `stop` is set and one more whole pass is done; failures are collected, not raised."""
    rng = random.Random(seed)
    errors, versions = [], []
    trainer = CacheDataset(cache, crop_size=16, msa_rows_per_sample=4, seed=seed)
    passes, last = 0, False
    while not last:
        last = stop.is_set()
        try:
            version = _read_pass(cache, states, trainer, rng, stats=passes % 4 == 0)
            if not versions or versions[-1] != version:
                versions.append(version)
        except Exception as error:
            errors.append(f"pass {passes}: {type(error).__name__}: {error}")
        passes += 1
        ready.set()
        time.sleep(READER_PAUSE_S)
    results.put({"errors": errors, "versions": versions, "passes": passes})


def _as_from_a_terminal() -> None:
    """Ctrl-C's default action in this process. A test runner started in the background by a
    shell without job control (`pytest &`, nohup in a script) has SIGINT ignored, and children
    inherit that: the update would then run through every Ctrl-C the tests send."""
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _default_sigint() -> None:
    """In a child before exec: SIGINT back to its default action (see _as_from_a_terminal);
    Python then installs its KeyboardInterrupt handler at start-up."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _update_in_child(options: PrecomputeOptions) -> None:
    _as_from_a_terminal()
    try:
        precompute(options)
    except KeyboardInterrupt:
        os._exit(130)


def _cli_verify(cache: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "featurecache.cli", "verify", str(cache)], capture_output=True, text=True, timeout=120
    )


def _check_after_the_kill(cache: Path, states: _States, sent: signal.Signals, where: str) -> bool:
    """The state a killed update left: readable, verified, explained. Returns whether it was interrupted."""
    marker = read_update_marker(cache)
    version = states.versions[read_manifest(cache).fingerprints["features"]]
    if marker is None:  # killed before it opened the cache, or after it finished
        return False
    assert version == "old" and marker.state == "interrupted", f"{where}: {marker}"
    assert marker.interrupted == (sent == signal.SIGINT), f"{where}: only Ctrl-C closes the writer: {marker}"
    verify = _cli_verify(cache)
    assert verify.returncode == 0, f"{where}: {verify.stdout}{verify.stderr}"
    assert "note: update interrupted (pid" in verify.stdout and "checked by its CRC" in verify.stdout, where
    stats = CliRunner().invoke(cli, ["stats", str(cache), "--json"])
    assert stats.exit_code == 0, f"{where}: {stats.output}"
    assert json.loads(stats.output)["update"].startswith("update interrupted"), where
    text = CliRunner().invoke(cli, ["stats", str(cache)]).output
    assert "\nnote         update interrupted" in text, f"{where}: {text}"
    return True


def _check_rerun(cache: Path, states: _States, where: str) -> None:
    summary = precompute(states.update_options(cache))
    assert summary.failed == 0, f"{where}: {summary.format()}"
    assert not (cache / MARKER_NAME).exists(), where
    manifest = read_manifest(cache)
    assert states.versions[manifest.fingerprints["features"]] == "new", where
    assert sorted(manifest.targets) == states.ids["new"] and manifest.counts["errors"] == 0, where
    assert _digests(cache) == states.records["new"], f"{where}: records differ from an uninterrupted update"
    report = verify_cache(cache)
    assert report.ok and report.update is None, f"{where}: {report.format()}"


def test_readers_never_fail_while_updates_are_killed(tmp_path, states, seed, reliability_report):
    rng = random.Random(seed)
    context = multiprocessing.get_context("fork")
    rows = []
    for trial in range(TRIALS):
        sent = signal.SIGKILL if trial % 2 == 0 else signal.SIGINT
        where = f"seed {seed}, trial {trial} ({sent.name})"
        cache = states.copy_of_old(tmp_path / f"trial-{trial}")
        ready, stop, results = context.Event(), context.Event(), context.Queue()
        reader = context.Process(target=_read_throughout, args=(cache, states, ready, stop, results, seed + trial))
        reader.start()
        try:
            assert ready.wait(timeout=120), f"{where}: the reader never finished a pass"
            # One random point in each of TRIALS equal slices of the update, counted from the moment it
            # opened the cache (its marker appears), so the kills cover every stage whatever the seed.
            delay = KILL_SPAN * states.update_seconds * (trial + rng.random()) / TRIALS
            update = context.Process(target=_update_in_child, args=(states.update_options(cache),))
            update.start()
            while update.is_alive() and not (cache / MARKER_NAME).exists():
                time.sleep(0.001)
            time.sleep(delay)
            os.kill(update.pid, sent)
            update.join()
            interrupted = _check_after_the_kill(cache, states, sent, f"{where}, after {delay:.3f} s")
            _check_rerun(cache, states, where)
        finally:
            stop.set()
            outcome = results.get(timeout=120)
            reader.join(timeout=60)
        assert outcome["errors"] == [], f"{where}: {outcome['errors'][:5]}"
        assert outcome["versions"][0] == "old" and outcome["versions"][-1] == "new", f"{where}: {outcome}"
        rows.append(
            {
                "trial": trial,
                "signal": sent.name,
                "delay_s": delay,
                "exit_code": update.exitcode,
                "interrupted": interrupted,
                "reader_passes": outcome["passes"],
            }
        )
        shutil.rmtree(cache)
    # The kills must have caught updates mid-way, by both signals.
    assert {row["signal"] for row in rows if row["interrupted"]} == {"SIGKILL", "SIGINT"}, rows
    reliability_report["interrupted_update"] = {
        "seed": seed,
        "trials": TRIALS,
        "targets": len(states.ids["new"]),
        "update_s": states.update_seconds,
        "rows": rows,
    }


def _wait_for_commits(process: subprocess.Popen, cache: Path, timeout: float) -> None:
    """Until the update has opened the cache and committed records (the shard files grew)."""
    deadline = time.monotonic() + timeout
    while process.poll() is None and not (cache / MARKER_NAME).exists():
        assert time.monotonic() < deadline, "the update never opened the cache"
        time.sleep(0.01)
    baseline = sum(path.stat().st_size for path in cache.glob("shard-*.lmdb"))
    while process.poll() is None and sum(path.stat().st_size for path in cache.glob("shard-*.lmdb")) <= baseline:
        assert time.monotonic() < deadline, "the update never committed a record"
        time.sleep(0.01)


@dataclass(frozen=True)
class _SampleCache:
    command: list[str]  # `featurecache precompute` of the sample structures, without --cache
    cache: Path  # finished by one run of `command`


@pytest.fixture(scope="module")
def sample_cache(tmp_path_factory, shared_data) -> _SampleCache:
    root = tmp_path_factory.mktemp("ctrl-c")
    config = root / "pipeline.toml"
    # Search stage without databases (query-only MSAs), one record per transaction: commits all along.
    config.write_text("[store]\nnum_shards = 2\nbatch_records = 1\n")
    command = [
        sys.executable,
        "-m",
        "featurecache.cli",
        "precompute",
        str(shared_data / "structures"),
        "--config",
        str(config),
        "--no-progress",
    ]
    cache = root / "cache"
    first = subprocess.run(
        [*command, "--cache", str(cache), "--executor", "inline", "--msa-rows-stored", str(OLD_MSA_ROWS)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert first.returncode == 0, first.stdout + first.stderr
    return _SampleCache(command, cache)


@pytest.mark.parametrize("executor", ["ray", "inline"])
def test_ctrl_c_exits_130_and_the_old_cache_still_reads(tmp_path, sample_cache, executor):
    cache = tmp_path / "cache"
    shutil.copytree(sample_cache.cache, cache, ignore=shutil.ignore_patterns("*-lock", "*.lock"))
    finished = read_manifest(cache)
    update = [
        *sample_cache.command,
        "--cache",
        str(cache),
        "--executor",
        executor,
        "--msa-rows-stored",
        str(NEW_MSA_ROWS),
    ]
    if executor == "ray":
        update += ["--workers", "1"]
    # A new session: the signal goes to its process group, as a terminal's Ctrl-C does.
    process = subprocess.Popen(
        update,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=_default_sigint,
    )
    try:
        _wait_for_commits(process, cache, timeout=240)
        assert process.poll() is None, f"the update ended before Ctrl-C: {process.communicate()[0][-3000:]}"
        os.killpg(process.pid, signal.SIGINT)
        output, _ = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert process.returncode == 130, f"exit {process.returncode}: {output[-3000:]}"
    assert "featurecache: interrupted" in output and "Traceback" not in output, output[-3000:]
    assert read_manifest(cache) == finished
    assert read_update_marker(cache).interrupted
    verify = _cli_verify(cache)
    assert verify.returncode == 0 and "note: update interrupted" in verify.stdout, verify.stdout + verify.stderr
    dataset = CacheDataset(cache, crop_size=16, msa_rows_per_sample=4)
    assert sorted(dataset.ids) == sorted(finished.targets) and all(dataset[i] for i in range(len(dataset)))
