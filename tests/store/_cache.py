"""Builders for small real caches used by the store tests (also imported by child processes)."""

from __future__ import annotations

import os
import random
import zlib
from pathlib import Path

import numpy as np

from featurecache.config import StoreConfig
from featurecache.store.codec import encode_record
from featurecache.store.manifest import Manifest
from featurecache.store.writer import StoreWriter

REPO = Path(__file__).resolve().parents[2]


def random_seed() -> int:
    """A fresh seed per test run; the failing value appears in assertion messages."""
    return random.randrange(1 << 30)


def child_env() -> dict:
    """Environment for a child Python process that imports featurecache and tests from this checkout."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}


def sample_arrays(key: str, seed: int, num_tokens: int | None = None) -> dict[str, np.ndarray]:
    """Arrays determined by (key, seed), so any process can check what it read."""
    rng = np.random.default_rng([seed, zlib.crc32(key.encode())])
    num_tokens = int(rng.integers(5, 60)) if num_tokens is None else num_tokens
    msa_depth = int(rng.integers(1, 30))
    return {
        "msa": rng.integers(0, 32, size=(msa_depth, num_tokens), dtype=np.int8),
        "deletion_matrix": (rng.random((msa_depth, num_tokens)) < 0.1).astype(np.uint16),
        "token_center_pos": rng.normal(size=(num_tokens, 3)).astype(np.float32),
        "is_protein": rng.random(num_tokens) < 0.9,
    }


def sample_blob(key: str, seed: int, num_tokens: int | None = None) -> tuple[bytes, dict]:
    arrays = sample_arrays(key, seed, num_tokens)
    num_tokens, msa_depth = arrays["token_center_pos"].shape[0], arrays["msa"].shape[0]
    meta = {"id": key, "num_tokens": num_tokens, "msa_depth": msa_depth, "seed": seed}
    blob = encode_record(key, arrays, meta, fingerprint=f"seed-{seed}", input_hash="0" * 64, schema_version=1)
    return blob, {"num_tokens": num_tokens, "msa_depth": msa_depth, "weight": 1.0 / msa_depth}


def assert_record_matches(record, key: str, seed: int, num_tokens: int | None = None) -> None:
    expected = sample_arrays(key, seed, num_tokens)
    assert record.key == key and record.meta["seed"] == seed, (record.key, record.meta)
    assert list(record.arrays) == list(expected)
    for name, value in expected.items():
        np.testing.assert_array_equal(record.arrays[name], value, err_msg=f"{key}/{name} (seed {seed})")


def build_cache(
    cache_dir: Path,
    keys: list[str],
    seed: int,
    num_shards: int = 3,
    batch_records: int = 8,
    map_size_bytes: int = 1 << 20,
    msa_keys: tuple[str, ...] = (),
) -> Manifest:
    config = StoreConfig(num_shards=num_shards, map_size_bytes=map_size_bytes, batch_records=batch_records)
    with StoreWriter(cache_dir, config) as writer:
        for key in keys:
            blob, index = sample_blob(key, seed)
            writer.put("features", key, blob, index=index)
        for key in msa_keys:
            writer.put("msa", key, sample_blob(key, seed)[0])
        return writer.finish(fingerprints={"seed": str(seed)})


_worker_reader = None


def init_reader_worker(reader) -> None:
    """Pool initializer: the reader arrives pickled, as in a spawned DataLoader worker."""
    global _worker_reader
    _worker_reader = reader


def read_in_worker(key_and_seed: tuple[str, int]) -> tuple[int, int]:
    key, seed = key_and_seed
    record = _worker_reader.get_record("features", key)
    assert_record_matches(record, key, seed)
    return os.getpid(), int(record.arrays["msa"].astype(np.int64).sum())


def cache_state(cache_dir: Path) -> dict:
    """What a reader sees: the manifest's keys and fingerprints, and each listed record's seed.

    Run in a child process while this process writes (LMDB allows one environment per file per
    process); every record it returns decoded (checksum included) and matched its seed's arrays.
    """
    from featurecache.store.manifest import read_manifest
    from featurecache.store.reader import StoreReader

    manifest = read_manifest(cache_dir)
    seeds = {}
    with StoreReader(cache_dir, num_shards=manifest.num_shards) as reader:
        for key in manifest.targets:
            record = reader.get_record("features", key)
            assert_record_matches(record, key, record.meta["seed"])
            seeds[key] = record.meta["seed"]
    return {"fingerprints": manifest.fingerprints, "seeds": seeds}
