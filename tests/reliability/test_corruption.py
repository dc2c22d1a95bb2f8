"""Random byte flips in the shard files of a published generation: every damaged record is caught.

The cache is a real one (the sample structures with their alignments and templates), published
so that each record is stored exactly once (a compacted copy has no stale pages). Each round
flips random bytes inside randomly chosen records of a fresh copy of the publish root, then
checks that `verify` names exactly those records and that CacheDataset refuses each damaged
target (on_error="raise") or skips and counts it (on_error="skip").
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import random
import shutil
import stat
from pathlib import Path

import pytest

from featurecache import CacheDataset
from featurecache.store.codec import CorruptRecordError
from featurecache.store.publish import publish, resolve_generation
from featurecache.store.layout import shard_name, shard_of
from featurecache.store.reader import StoreReader
from featurecache.store.verify import verify_cache
from featurecache.precompute.pipeline import PrecomputeOptions, precompute

ROUNDS = 4


@pytest.fixture(scope="module")
def published(tmp_path_factory, shared_data) -> Path:
    """A publish root holding one generation of the sample-data cache."""
    root = tmp_path_factory.mktemp("published")
    summary = precompute(
        PrecomputeOptions(
            inputs=[shared_data / "structures"],
            cache_dir=root / "cache",
            alignments_dir=shared_data / "alignments",
            template_dir=shared_data / "templates" / "mmcif",
            executor="inline",
            progress=False,
        )
    )
    assert summary.failed == 0, summary.format()
    publish(root / "cache", root / "shared")
    return root / "shared"


def _writable_copy(publish_root: Path, target: Path) -> Path:
    """Copy a publish root; generations are read-only, so the copy's files are made writable."""
    shutil.copytree(publish_root, target)
    for directory, _, files in os.walk(target):
        os.chmod(directory, stat.S_IRWXU)
        for name in files:
            os.chmod(Path(directory) / name, stat.S_IRUSR | stat.S_IWUSR)
    return resolve_generation(target)


def _flip(generation: Path, num_shards: int, damaged: list[tuple[str, str, bytes]], rng: random.Random) -> int:
    """Flip 1-3 random bytes inside each chosen record's bytes in its shard file; returns the flips."""
    flips = 0
    for table, key, blob in damaged:
        path = generation / shard_name(shard_of(key, num_shards))
        data = bytearray(path.read_bytes())
        position = data.find(blob)
        assert position >= 0 and data.find(blob, position + 1) < 0, f"{table}/{key} is not stored once"
        for offset in rng.sample(range(len(blob)), rng.randint(1, 3)):
            data[position + offset] ^= rng.randrange(1, 256)
            flips += 1
        path.write_bytes(bytes(data))
    return flips


def test_every_flipped_record_is_detected(tmp_path, published, seed, caplog, reliability_report):
    rng = random.Random(seed)
    rows, example_error = [], None
    for round_number in range(ROUNDS):
        root = tmp_path / f"round-{round_number}"
        generation = _writable_copy(published, root)
        with StoreReader(generation) as reader:
            records = [(table, key, bytes(blob)) for table in ("features", "msa") for key, blob in reader.items(table)]
            num_shards = reader.num_shards
        features = [record for record in records if record[0] == "features"]
        # At least one target, plus a random mix of other records; one target stays intact, so
        # that on_error="skip" always has a record to return.
        intact, chosen = rng.sample(features, 2)
        chosen = [chosen] + rng.sample(
            [record for record in records if record not in (intact, chosen)], rng.randint(1, 5)
        )
        flips = _flip(generation, num_shards, chosen, rng)
        expected = {(table, key) for table, key, _ in chosen}

        report = verify_cache(generation)
        assert {(record.table, record.key) for record in report.damaged} == expected, report.format()
        for record in report.damaged:
            assert record.shard == shard_name(shard_of(record.key, num_shards))
        assert {problem.shard for problem in report.shard_problems} == {
            shard_name(shard_of(key, num_shards)) for _, key, _ in chosen
        }

        damaged_targets = sorted(key for table, key, _ in chosen if table == "features")
        dataset = CacheDataset(root, crop_size=48, msa_rows_per_sample=16)
        assert dataset.cache_dir == generation
        for key in damaged_targets:
            with pytest.raises(CorruptRecordError) as raised:
                dataset[dataset.ids.index(key)]
            message = str(raised.value)
            shard = shard_name(shard_of(key, num_shards))
            assert key in message and shard in message and generation.name in message, message
            example_error = message.replace(str(tmp_path) + "/", "")
        intact = [key for key in dataset.ids if key not in damaged_targets]
        for key in intact:
            assert dataset[dataset.ids.index(key)]["id"] == key

        skipping = CacheDataset(root, crop_size=48, msa_rows_per_sample=16, on_error="skip")
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="featurecache.loader"):
            returned = [skipping[index]["id"] for index in range(len(skipping))]
        assert not set(returned) & set(damaged_targets)
        skipped_ids = {key for key in damaged_targets if any(key in line for line in caplog.messages)}
        assert skipped_ids == set(damaged_targets) and skipping.skipped >= len(damaged_targets)
        rows.append(
            {
                "round": round_number,
                "records": len(records),
                "damaged": len(expected),
                "flips": flips,
                "verify_named": len(report.damaged),
                "raised": len(damaged_targets),
                "skipped": len(skipped_ids),
            }
        )
        dataset.reader.close()
        skipping.reader.close()
    reliability_report["corruption"] = {"seed": seed, "rows": rows, "example_error": example_error}


def _verify_in_child(generation: Path, connection) -> None:
    connection.send(verify_cache(generation).to_dict())


def test_flips_anywhere_in_shard_files_are_detected(tmp_path, published, seed, reliability_report):
    """Flips at random file offsets: inside records, but also in LMDB's pages and keys.

    Every shard with a flip fails its sha256 check, and every record whose bytes were hit is
    named. verify runs in a forked child, so that LMDB meeting a damaged page cannot take the
    test process down with it: a crash is a failure like any other.
    """
    rng = random.Random(seed)
    generation = resolve_generation(published)
    with StoreReader(generation) as reader:
        num_shards = reader.num_shards
        spans = {}  # shard file -> [(start, end, table, key)] of every record's bytes
        for table in ("features", "msa", "errors"):
            for key, blob in reader.items(table):
                path = generation / shard_name(shard_of(key, num_shards))
                data = path.read_bytes()
                start = data.find(bytes(blob))
                assert start >= 0 and data.find(bytes(blob), start + 1) < 0
                spans.setdefault(path.name, []).append((start, start + len(blob), table, key))
    context = multiprocessing.get_context("fork")
    totals = {
        "rounds": 20,
        "flips": 0,
        "in_records": 0,
        "records_hit": 0,
        "records_named": 0,
        "shards_hit": 0,
        "shards_flagged": 0,
    }
    for round_number in range(totals["rounds"]):
        copy = tmp_path / f"round-{round_number}"
        copy.mkdir()
        shutil.copy(generation / "manifest.json", copy)
        for index in range(num_shards):
            shutil.copy(generation / shard_name(index), copy)
            os.chmod(copy / shard_name(index), stat.S_IRUSR | stat.S_IWUSR)
        hit_records, hit_shards = set(), set()
        for _ in range(rng.randint(1, 4)):
            name = shard_name(rng.randrange(num_shards))
            data = bytearray((copy / name).read_bytes())
            offset = rng.randrange(len(data))
            data[offset] ^= rng.randrange(1, 256)
            (copy / name).write_bytes(bytes(data))
            hit_shards.add(name)
            totals["flips"] += 1
            for start, end, table, key in spans.get(name, []):
                if start <= offset < end:
                    hit_records.add((table, key))
                    totals["in_records"] += 1
        receive, send = context.Pipe(duplex=False)
        child = context.Process(target=_verify_in_child, args=(copy, send))
        child.start()
        send.close()
        report = receive.recv() if receive.poll(120) else None
        child.join(60)
        where = f"seed {seed}, round {round_number}"
        assert child.exitcode == 0 and report is not None, f"{where}: verify died with exit code {child.exitcode}"
        assert not report["ok"], where
        flagged = {problem["shard"] for problem in report["shard_problems"]}
        unreadable = {problem["shard"] for problem in report["shard_problems"] if "unreadable" in problem["reason"]}
        assert flagged == hit_shards, f"{where}: flipped {sorted(hit_shards)}, flagged {sorted(flagged)}"
        named = {(record["table"], record["key"]) for record in report["damaged"]}
        missed = {
            (table, key)
            for table, key in hit_records - named
            if shard_name(shard_of(key, num_shards)) not in unreadable
        }
        assert not missed, f"{where}: damaged records not named: {sorted(missed)}"
        totals["records_hit"] += len(hit_records)
        totals["records_named"] += len(hit_records & named)
        totals["shards_hit"] += len(hit_shards)
        totals["shards_flagged"] += len(flagged)
        shutil.rmtree(copy)
    reliability_report["corruption_anywhere"] = {"seed": seed, **totals}
