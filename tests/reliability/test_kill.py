"""kill -9 of precompute at random points: the rerun completes with every record whole, once.

Each trial forks a precompute process (inline executor: no Ray start-up per trial) on a fresh
cache, kills it with SIGKILL after a seeded random delay, checks what it left, and reruns to
the end. The pipeline config keeps two records per transaction, so the kills land between,
inside and after many commits, in the search stage, the featurize stage and the manifest write.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import shutil
import signal
import time
from pathlib import Path

import lmdb
import pytest

from featurecache.store.codec import decode_record
from featurecache.store.manifest import MANIFEST_NAME, read_manifest
from featurecache.store.shards import TABLES, StoreReader
from featurecache.store.verify import verify_cache
from featurecache.workers.pipeline import PrecomputeOptions, precompute

TRIALS = 12
COPIES = 16  # copies of 209d under their own names: 16 targets that share their chains' MSAs
NUM_SHARDS = 3
BATCH_RECORDS = 2


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
    """What a killed run committed, read shard by shard with LMDB itself: a kill while a shard
    file is being created leaves a shard without any table, which holds no records."""
    records = {}
    for path in sorted(cache.glob("shard-*.lmdb")) if cache.is_dir() else []:
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


@pytest.fixture
def kill_inputs(tmp_path, shared_data) -> tuple[Path, Path]:
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    for number in range(COPIES):
        shutil.copy(shared_data / "structures" / "209d-assembly1.cif", inputs / f"copy{number:02d}-209d.cif")
    for name in ("2q2k.cif", "721p-assembly1.cif"):
        shutil.copy(shared_data / "structures" / name, inputs / name)
    config = tmp_path / "pipeline.toml"
    # No search databases: every chain gets a query-only `msa` record from the search stage.
    config.write_text(f"[store]\nnum_shards = {NUM_SHARDS}\nbatch_records = {BATCH_RECORDS}\n")
    return inputs, config


def test_kill_9_at_random_points_then_rerun(tmp_path, kill_inputs, seed, reliability_report):
    inputs, config = kill_inputs
    rng = random.Random(seed)

    def options(cache: Path) -> PrecomputeOptions:
        return PrecomputeOptions(inputs=[inputs], cache_dir=cache, config_path=config, executor="inline",
                                 progress=False)

    started = time.perf_counter()
    reference_summary = precompute(options(tmp_path / "reference"))
    full_run_s = time.perf_counter() - started
    assert reference_summary.failed == 0, reference_summary.format()
    reference = _stored(tmp_path / "reference")
    targets = reference_summary.targets
    assert sum(table == "features" for table, _ in reference) == targets == COPIES + 2
    assert sum(table == "msa" for table, _ in reference) < targets  # shared chains stored once

    context = multiprocessing.get_context("fork")
    rows = []
    for trial in range(TRIALS):
        cache = tmp_path / f"trial-{trial:02d}"
        delay = rng.uniform(0.0, 1.1 * full_run_s)
        process = context.Process(target=_precompute_in_child, args=(options(cache),))
        process.start()
        time.sleep(delay)
        os.kill(process.pid, signal.SIGKILL)
        process.join()
        where = f"seed {seed}, trial {trial}, killed after {delay:.3f} s"

        # What the killed run left: whole records, each equal to the reference.
        left = _left_by_kill(cache)
        for record_id, blob in left.items():
            assert blob == reference[record_id], f"{where}: {record_id} differs from the reference"
        manifest_left = (cache / MANIFEST_NAME).exists()
        committed = sum(table == "features" for table, _ in left)
        committed_msa = sum(table == "msa" for table, _ in left)

        summary = precompute(options(cache))
        stages = summary.stages["featurize"]
        assert summary.failed == 0 and stages.done + stages.skipped == targets, f"{where}: {summary.format()}"
        # Only the committed records count as done: everything else was computed again.
        assert stages.skipped == committed, f"{where}: {committed} committed, {stages.skipped} skipped"
        report = verify_cache(cache)
        assert report.ok, f"{where}: {report.format()}"
        assert _stored(cache) == reference, f"{where}: records lost, duplicated or changed"
        assert read_manifest(cache).counts == read_manifest(tmp_path / "reference").counts, where
        rows.append({"trial": trial, "delay_s": delay, "committed": committed, "committed_msa": committed_msa,
                     "manifest": manifest_left, "exit_code": process.exitcode,
                     "done": stages.done, "skipped": stages.skipped})
        shutil.rmtree(cache)

    # The delays must have hit the run mid-way, not only before it started or after it ended.
    assert any(0 < row["committed"] < targets for row in rows) or any(
        row["committed"] == 0 and row["delay_s"] > 0.2 * full_run_s for row in rows), rows
    reliability_report["kill"] = {"seed": seed, "trials": TRIALS, "targets": targets, "num_shards": NUM_SHARDS,
                                  "batch_records": BATCH_RECORDS, "full_run_s": full_run_s,
                                  "msa_records": sum(table == "msa" for table, _ in reference), "rows": rows}
