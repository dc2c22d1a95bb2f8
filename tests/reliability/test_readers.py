"""Trainers reading through CacheDataset(follow_latest=True) while new generations are published.

tests/store/test_publish.py already runs 8 StoreReader processes x 1,000 reads during publishes;
this adds the loader's path: 8 forked reader processes, each a CacheDataset on the publish root
that switches to the newest generation at every `set_epoch`, checking every record it loads
against the generation it came from.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import random
import shutil
from pathlib import Path

from featurecache import CacheDataset
from featurecache.store.manifest import read_manifest
from featurecache.store.publish import gc, publish, resolve_generation
from featurecache.store.reader import StoreReader
from featurecache.precompute.pipeline import PrecomputeOptions, precompute
from tests.conftest import copy_sample_structures

READERS = 8
READS = 1000
EPOCH_READS = 100  # reads between set_epoch calls, where a reader may switch generation


def _digest(arrays: dict) -> str:
    digest = hashlib.blake2b(digest_size=16)
    for name in sorted(arrays):
        digest.update(name.encode())
        digest.update(str(arrays[name].dtype).encode() + str(arrays[name].shape).encode())
        digest.update(arrays[name].tobytes())
    return digest.hexdigest()


def _expected(cache: Path) -> dict[str, str]:
    with StoreReader(cache) as reader:
        return {key: _digest(reader.get_record("features", key).arrays) for key in reader.keys("features")}


def _read_while_publishing(dest: Path, expected: dict, barrier, published, results, seed: int) -> None:
    """READS random reads, then on until an epoch that began after the last publish."""
    rng = random.Random(seed)
    errors, seen = [], []
    dataset = CacheDataset(dest, crop_size=24, msa_rows_per_sample=4, follow_latest=True)
    step, final_epoch = 0, False
    while step < READS or not final_epoch:
        try:
            if step % EPOCH_READS == 0:
                final_epoch = published.is_set()  # read before switching: no publish after this one
                dataset.set_epoch(step // EPOCH_READS)
                version = read_manifest(dataset.cache_dir).fingerprints["features"]
                if not seen or seen[-1] != dataset.cache_dir.name:
                    seen.append(dataset.cache_dir.name)
            index = rng.randrange(len(dataset))
            key = dataset.ids[index]
            arrays, _ = dataset.load_arrays(key)
            if _digest(arrays) != expected[version][key]:
                errors.append(f"{dataset.cache_dir.name}/{key}: arrays differ from the published record")
            dataset[index]  # the cropped sample too
        except Exception as error:  # counted, not raised: the parent reports all of them
            errors.append(f"step {step}: {type(error).__name__}: {error}")
        if step == 0:
            barrier.wait()  # every reader holds the first generation before publishing starts
        step += 1
    results.put((errors, seen, step))


def test_follow_latest_readers_during_publish(tmp_path, shared_data, seed, reliability_report):
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    for number in range(12):
        shutil.copy(shared_data / "structures" / "209d-assembly1.cif", inputs / f"copy{number:02d}-209d.cif")
    copy_sample_structures("2q2k.cif", inputs)
    caches, expected = {}, {}
    for name, msa_rows in (("a", 64), ("b", 3)):  # two versions of every record
        caches[name] = tmp_path / name
        summary = precompute(
            PrecomputeOptions(
                inputs=[inputs],
                cache_dir=caches[name],
                msa_rows_stored=msa_rows,
                alignments_dir=shared_data / "alignments",
                executor="inline",
                progress=False,
            )
        )
        assert summary.failed == 0, summary.format()
        expected[read_manifest(caches[name]).fingerprints["features"]] = _expected(caches[name])
    assert len(expected) == 2

    dest = tmp_path / "shared"
    first = publish(caches["a"], dest)
    context = multiprocessing.get_context("fork")
    barrier, published_all, results = context.Barrier(READERS + 1), context.Event(), context.Queue()
    readers = [
        context.Process(target=_read_while_publishing, args=(dest, expected, barrier, published_all, results, seed + i))
        for i in range(READERS)
    ]
    for process in readers:
        process.start()
    barrier.wait(timeout=120)
    published = [publish(caches[name], dest) for name in ("b", "a", "b")]
    published_all.set()
    outcomes = [results.get(timeout=300) for _ in readers]
    for process in readers:
        process.join(timeout=60)
        assert process.exitcode == 0
    errors = [error for reader_errors, _, _ in outcomes for error in reader_errors]
    assert errors == []
    # Each reader started on the first generation and followed LATEST to the last one.
    assert all(seen[0] == first.name and seen[-1] == published[-1].name for _, seen, _ in outcomes), outcomes
    assert resolve_generation(dest) == published[-1]
    assert gc(dest, keep=1) == [first, *published[:2]]
    reliability_report["readers"] = {
        "readers": READERS,
        "reads": sum(steps for _, _, steps in outcomes),
        "publishes": len(published),
        "generations_seen": max(len(seen) for _, seen, _ in outcomes),
        "errors": len(errors),
    }
