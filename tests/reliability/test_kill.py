"""kill -9 of precompute at random points: the rerun completes with every record whole, once.

Each trial forks a precompute process (inline executor: no Ray start-up per trial) on a fresh
cache, kills it with SIGKILL after a seeded random delay, checks what it left, and reruns to
the end. The pipeline config keeps two records per transaction, so the kills land between,
inside and after many commits, in the search stage and the featurize stage; the last trials land
in the clustering that follows (no commits, however long it takes) and the manifest write.
"""

from __future__ import annotations

import contextlib
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

import lmdb
import pytest

from featurecache.store.codec import decode_record
from featurecache.store.manifest import MANIFEST_NAME, read_manifest
from featurecache.config import StoreConfig
from featurecache.schema import TABLES
from featurecache.store.layout import shard_name
from featurecache.store.reader import StoreReader
from featurecache.store.writer import ShardWriter
from featurecache.store.verify import verify_cache
from featurecache.precompute.pipeline import PrecomputeOptions, precompute
from tests.conftest import copy_sample_structures

TRIALS = 12
COPIES = 24  # copies of 209d under their own names: targets that share their chains' MSAs
NUM_SHARDS = 3
BATCH_RECORDS = 2
KILL_SPAN = 0.95  # kill points spread over this fraction of each phase of the uninterrupted run
LATE_TRIALS = 2  # trials killed after the last commit: in the clustering or the manifest write


def _stored(cache: Path) -> dict[tuple[str, str], bytes]:
    """Every record of every table, (table, key) -> bytes; each one must decode."""
    records = {}
    with StoreReader(cache) as reader:
        for table in TABLES:
            for key, blob in reader.items(table):
                decode_record(blob, where=f"{cache}/{table}", key=key)  # raises on a partial record
                records[table, key] = bytes(blob)
    return records


def _left_by_kill(cache: Path) -> dict[tuple[str, str], bytes]:
    """What a killed run committed, read shard by shard with LMDB itself. A kill while a shard
    is being created leaves an empty file (LMDB has not written its header yet) or a shard
    without tables: both hold no records, and the rerun initializes them."""
    records = {}
    for path in sorted(cache.glob("shard-*.lmdb")) if cache.is_dir() else []:
        if path.stat().st_size == 0:
            continue
        with lmdb.open(str(path), subdir=False, readonly=True, lock=False, max_dbs=16) as env:
            for table in TABLES:
                try:
                    db = env.open_db(table.encode(), create=False)
                except lmdb.NotFoundError:
                    continue
                with env.begin(db=db) as txn:
                    for key, blob in txn.cursor():
                        key = key.decode()
                        decode_record(blob, where=f"{path}/{table}", key=key)  # raises on a partial record
                        records[table, key] = bytes(blob)
    return records


def _precompute_in_child(options: PrecomputeOptions) -> None:
    precompute(options)


@dataclass(frozen=True)
class _Reference:
    inputs: Path
    config: Path
    cache: Path
    records: dict[tuple[str, str], bytes]
    targets: int
    seconds: float  # wall time of the uninterrupted inline run
    commit_seconds: float  # of which until its last record was committed (the rest: clustering, manifest)

    def options(self, cache: Path, executor: str = "inline") -> PrecomputeOptions:
        return PrecomputeOptions(
            inputs=[self.inputs], cache_dir=cache, config_path=self.config, executor=executor, progress=False
        )


@pytest.fixture(scope="module")
def reference(tmp_path_factory, shared_data) -> _Reference:
    """The inputs, their pipeline config and the records of one uninterrupted run."""
    root = tmp_path_factory.mktemp("kill")
    inputs = root / "inputs"
    inputs.mkdir()
    for number in range(COPIES):
        shutil.copy(shared_data / "structures" / "209d-assembly1.cif", inputs / f"copy{number:02d}-209d.cif")
    copy_sample_structures(("2q2k.cif", "721p-assembly1.cif"), inputs)
    config = root / "pipeline.toml"
    # No search databases: every chain gets a query-only `msa` record from the search stage.
    # Clustering off: it runs after every record is committed and would take most of the run, so
    # the random kill points would rarely land among the record commits this test is about.
    config.write_text(
        f"[store]\nnum_shards = {NUM_SHARDS}\nbatch_records = {BATCH_RECORDS}\n[clustering]\nenabled = false\n"
    )
    cache = root / "reference"
    started = time.perf_counter()
    summary = precompute(
        PrecomputeOptions(inputs=[inputs], cache_dir=cache, config_path=config, executor="inline", progress=False)
    )
    seconds = time.perf_counter() - started
    assert summary.failed == 0, summary.format()
    records = _stored(cache)
    assert sum(table == "features" for table, _ in records) == summary.targets == COPIES + 2
    assert sum(table == "msa" for table, _ in records) < summary.targets  # shared chains stored once
    return _Reference(inputs, config, cache, records, summary.targets, seconds, seconds - summary.cluster_seconds)


def _check_rerun(reference: _Reference, cache: Path, where: str) -> tuple[int, int, int, int, bool]:
    """Check what a killed run left, rerun it to the end and check the result.

    Returns (features committed, msa committed, featurized by the rerun, skipped, manifest left).
    """
    left = _left_by_kill(cache)
    for record_id, blob in left.items():
        assert blob == reference.records[record_id], f"{where}: {record_id} differs from the reference"
    manifest_left = (cache / MANIFEST_NAME).exists()
    committed = sum(table == "features" for table, _ in left)
    committed_msa = sum(table == "msa" for table, _ in left)

    summary = precompute(reference.options(cache))
    stages = summary.stages["featurize"]
    assert summary.failed == 0 and stages.done + stages.skipped == reference.targets, f"{where}: {summary.format()}"
    # Only the committed records count as done: everything else was computed again.
    assert stages.skipped == committed, f"{where}: {committed} committed, {stages.skipped} skipped"
    report = verify_cache(cache)
    assert report.ok, f"{where}: {report.format()}"
    assert _stored(cache) == reference.records, f"{where}: records lost, duplicated or changed"
    assert read_manifest(cache).counts == read_manifest(reference.cache).counts, where
    return committed, committed_msa, stages.done, stages.skipped, manifest_left


@pytest.mark.parametrize("created", [1, 2])
def test_rerun_after_a_kill_while_shards_were_being_created(tmp_path, reference, created):
    """The state a kill leaves 20-40 ms into a run: the first shards exist, the others do not."""
    cache = tmp_path / "cache"
    cache.mkdir()
    for index in range(created):
        ShardWriter(cache / shard_name(index), index, NUM_SHARDS, StoreConfig(num_shards=NUM_SHARDS)).close()
    committed, committed_msa, done, skipped, manifest_left = _check_rerun(reference, cache, f"{created} shards")
    assert (committed, committed_msa, done, skipped, manifest_left) == (0, 0, reference.targets, 0, False)


def _kill_delay(reference: _Reference, trial: int, rng: random.Random) -> float:
    """One random point in each of equal slices of the commit phase (search, conformers,
    featurize), so the kills cover every stage whatever the seed and however long the clustering
    after it takes; the last LATE_TRIALS trials in slices of what follows the last commit."""
    early = TRIALS - LATE_TRIALS
    if trial < early:
        return KILL_SPAN * reference.commit_seconds * (trial + rng.random()) / early
    late = reference.seconds - reference.commit_seconds
    return reference.commit_seconds + KILL_SPAN * late * (trial - early + rng.random()) / LATE_TRIALS


def test_kill_9_at_random_points_then_rerun(tmp_path, reference, seed, reliability_report):
    rng = random.Random(seed)
    context = multiprocessing.get_context("fork")
    rows = []
    for trial in range(TRIALS):
        cache = tmp_path / f"trial-{trial:02d}"
        # A forked child skips the reference run's cold start, so its run is shorter: the last
        # slices still land near the end (the manifest write) or just past it.
        delay = _kill_delay(reference, trial, rng)
        process = context.Process(target=_precompute_in_child, args=(reference.options(cache),))
        process.start()
        # Delays count from the moment every shard file exists: a kill while they are being
        # created (the first ~30 ms) is pinned by test_rerun_after_a_kill_while_shards_were_being_created.
        while process.is_alive() and len(list(cache.glob("shard-*.lmdb"))) < NUM_SHARDS:
            time.sleep(0.001)
        time.sleep(delay)
        os.kill(process.pid, signal.SIGKILL)
        process.join()
        where = f"seed {seed}, trial {trial}, killed after {delay:.3f} s"
        committed, committed_msa, done, skipped, manifest_left = _check_rerun(reference, cache, where)
        rows.append(
            {
                "trial": trial,
                "delay_s": delay,
                "committed": committed,
                "committed_msa": committed_msa,
                "manifest": manifest_left,
                "exit_code": process.exitcode,
                "done": done,
                "skipped": skipped,
            }
        )
        shutil.rmtree(cache)

    # The delays must have hit the run mid-way, not only before it started or after it ended.
    assert any(0 < row["committed"] < reference.targets for row in rows) or any(
        row["committed"] == 0 and row["delay_s"] > 0.2 * reference.commit_seconds for row in rows
    ), rows
    reliability_report.setdefault("kill", {}).update(
        seed=seed,
        trials=TRIALS,
        targets=reference.targets,
        num_shards=NUM_SHARDS,
        batch_records=BATCH_RECORDS,
        full_run_s=reference.seconds,
        commit_s=reference.commit_seconds,
        late_trials=LATE_TRIALS,
        span=KILL_SPAN,
        rows=rows,
        msa_records=sum(table == "msa" for table, _ in reference.records),
    )


def _session_members(session_id: int) -> list[int]:
    """Live processes of a session a test started (Ray puts its workers in process groups of their
    own, but they stay in the session). Zombies are left out: they hold no resources."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            if state != "Z" and os.getsid(int(entry.name)) == session_id:
                members.append(int(entry.name))
        except OSError:  # exited meanwhile
            continue
    return members


def _shard_bytes(cache: Path) -> int:
    return sum(path.stat().st_size for path in cache.glob("shard-*.lmdb"))


@pytest.mark.slow
def test_kill_9_of_a_ray_driver_with_tasks_in_flight(tmp_path, reference, seed, reliability_report):
    """The CLI on a local Ray cluster, killed (driver, raylet, workers) once records are committing."""
    rng = random.Random(seed)
    cache = tmp_path / "cache"
    command = [
        sys.executable,
        "-m",
        "featurecache.cli",
        "precompute",
        str(reference.inputs),
        "--cache",
        str(cache),
        "--config",
        str(reference.config),
        "--workers",
        "2",
        "--no-progress",
    ]
    log_path = tmp_path / "precompute.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, start_new_session=True, stdout=log, stderr=subprocess.STDOUT)
    try:
        # The shards are created before Ray starts (seconds); their size then is the baseline,
        # and the first commit of records grows it.
        deadline = time.monotonic() + 240
        while process.poll() is None and len(list(cache.glob("shard-*.lmdb"))) < NUM_SHARDS:
            assert time.monotonic() < deadline, "precompute never created its shards"
            time.sleep(0.02)
        time.sleep(1.0)
        baseline = _shard_bytes(cache)
        while process.poll() is None and _shard_bytes(cache) <= baseline:
            assert time.monotonic() < deadline, "precompute never committed a record"
            time.sleep(0.02)
        time.sleep(rng.uniform(0.0, 0.05))  # the featurize stage (~0.3 s or more) is still running then
    finally:
        for pid in _session_members(process.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        process.wait()
    assert process.returncode == -signal.SIGKILL, (
        f"the run ended before the kill (exit {process.returncode}): {log_path.read_text()[-2000:]}"
    )
    for _ in range(100):
        if not _session_members(process.pid):
            break
        time.sleep(0.1)
    assert not _session_members(process.pid), "Ray processes outlived the kill"
    committed, committed_msa, done, skipped, manifest_left = _check_rerun(reference, cache, f"seed {seed}, Ray")
    reliability_report.setdefault("kill", {})["ray"] = {
        "committed": committed,
        "committed_msa": committed_msa,
        "done": done,
        "skipped": skipped,
    }
