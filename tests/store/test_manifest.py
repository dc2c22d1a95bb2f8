"""manifest.json: contents, atomic replacement, validation errors that name the problem, and the
shard digests a finish keeps for the files it left unchanged."""

import json
import os

import pytest

from featurecache.config import StoreConfig, file_sha256
from featurecache.schema import RECORD_FORMAT, SCHEMA_VERSION
from featurecache.store.files import write_text_atomic
from featurecache.store.layout import shard_of
from featurecache.store import manifest as manifest_module
from featurecache.store.manifest import MANIFEST_FORMAT, MANIFEST_NAME, read_manifest
from featurecache.store.verify import verify_cache
from featurecache.store.writer import StoreWriter
from tests.store._cache import build_cache, random_seed, sample_arrays, sample_blob


def test_manifest_describes_the_finished_cache(tmp_path):
    seed = random_seed()
    keys = [f"t{i}" for i in range(17)]
    written = build_cache(tmp_path, keys, seed, num_shards=3)
    manifest = read_manifest(tmp_path)
    assert manifest == written
    assert manifest.format == MANIFEST_FORMAT and manifest.record_format == RECORD_FORMAT
    assert manifest.schema_version == SCHEMA_VERSION and manifest.generation is None
    assert manifest.fingerprints == {"seed": str(seed)}
    assert manifest.counts == {"msa": 0, "features": 17, "errors": 0, "conformers": 0}
    assert [shard.file for shard in manifest.shards] == [f"shard-0000{i}.lmdb" for i in range(3)]
    for shard in manifest.shards:
        path = tmp_path / shard.file
        assert shard.size == path.stat().st_size and shard.sha256 == file_sha256(path)
    assert sum(shard.counts["features"] for shard in manifest.shards) == 17
    for key in keys:
        expected = sample_arrays(key, seed)
        entry = manifest.targets[key]
        assert entry["shard"] == shard_of(key, 3)
        assert (entry["num_tokens"], entry["msa_depth"]) == expected["msa"].shape[::-1]
        assert entry["weight"] == pytest.approx(1.0 / expected["msa"].shape[0])


def test_reopening_for_writing_keeps_the_last_manifest_until_finish_and_keeps_created(tmp_path):
    seed = random_seed()
    first = build_cache(tmp_path, ["a", "b"], seed, num_shards=2)
    with StoreWriter(tmp_path, StoreConfig(num_shards=2)) as writer:
        blob, index = sample_blob("c", seed)
        writer.put("features", "c", blob, index=index)
        writer.put("errors", "d", b"error record")
        writer.flush()
        assert read_manifest(tmp_path) == first  # readers keep the last finished state
        second = writer.finish(fingerprints={"seed": str(seed)})
    assert second.created == first.created and second.updated >= first.updated
    assert second.counts == {"msa": 0, "features": 3, "errors": 1, "conformers": 0}
    assert set(second.targets) == {"a", "b", "c"} and read_manifest(tmp_path) == second


def test_atomic_write_leaves_the_old_file_when_interrupted(tmp_path, monkeypatch):
    path = tmp_path / MANIFEST_NAME
    write_text_atomic(path, '{"old": true}\n')

    def crash(source, target):
        raise OSError("disk went away")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk went away"):
        write_text_atomic(path, '{"new": true}\n')
    assert path.read_text() == '{"old": true}\n'
    assert sorted(entry.name for entry in tmp_path.iterdir()) == [MANIFEST_NAME]
    monkeypatch.undo()
    write_text_atomic(path, '{"new": true}\n')
    assert path.read_text() == '{"new": true}\n' and oct(path.stat().st_mode & 0o777) == "0o644"


def _rewrite(cache_dir, change) -> None:
    path = cache_dir / MANIFEST_NAME
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda d: d.update(format=MANIFEST_FORMAT + 1),
            f"manifest.json has format {MANIFEST_FORMAT + 1}, expected {MANIFEST_FORMAT}",
        ),
        (lambda d: d.update(record_format=99), f"has record_format 99, expected {RECORD_FORMAT}"),
        (
            lambda d: d.update(schema_version=SCHEMA_VERSION + 1),
            f"has schema_version {SCHEMA_VERSION + 1}, expected {SCHEMA_VERSION}: .* rerun `featurecache precompute`",
        ),
        (lambda d: d.pop("shards"), "has no 'shards' field"),
        (lambda d: d.update(shards=[]), "lists no shards"),
        (
            lambda d: d["shards"][1].update(file="shard-00007.lmdb"),
            r"shards\[1\] names 'shard-00007.lmdb', expected shard-00001.lmdb",
        ),
        (lambda d: d["shards"][0].update(size="12"), "field 'size' is str"),
        (lambda d: d.update(counts=[1, 2]), "field 'counts' is list"),
        (lambda d: d["index"].update(features=[]), "index of table 'features' is not a map"),
        (lambda d: d.update(format=True), "field 'format' is bool"),
    ],
)
def test_invalid_manifests_are_refused_with_the_reason(tmp_path, change, message):
    build_cache(tmp_path, ["a", "b", "c"], random_seed(), num_shards=2)
    _rewrite(tmp_path, change)
    with pytest.raises(ValueError, match=message):
        read_manifest(tmp_path)


def test_other_schema_is_accepted_when_asked(tmp_path):
    build_cache(tmp_path, ["a"], random_seed(), num_shards=1)
    _rewrite(tmp_path, lambda d: d.update(schema_version=SCHEMA_VERSION + 1))
    assert read_manifest(tmp_path, expected_schema=None).schema_version == SCHEMA_VERSION + 1


def test_unreadable_manifest_and_missing_cache_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_manifest(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="is not a featurecache cache: it has no manifest.json"):
        read_manifest(tmp_path)
    (tmp_path / MANIFEST_NAME).write_text('{"format": 1,')
    with pytest.raises(ValueError, match="manifest.json is not valid JSON"):
        read_manifest(tmp_path)
    (tmp_path / MANIFEST_NAME).write_text("[1, 2]")
    with pytest.raises(ValueError, match="manifest.json is not a JSON object"):
        read_manifest(tmp_path)


def _hashing_counted(monkeypatch) -> list[str]:
    """The shard files finish reads whole for their sha256 (manifest.file_sha256, still called)."""
    hashed = []
    real = manifest_module.file_sha256

    def counting(path, *args, **kwargs):
        hashed.append(os.path.basename(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(manifest_module, "file_sha256", counting)
    return hashed


def test_finish_hashes_only_the_shards_this_writer_changed(tmp_path, monkeypatch):
    seed = random_seed()
    keys = [f"t{i}" for i in range(12)]
    build_cache(tmp_path, keys, seed, num_shards=3)
    hashed = _hashing_counted(monkeypatch)
    with StoreWriter(tmp_path, StoreConfig(num_shards=3)) as writer:  # a rerun that changes nothing
        writer.finish(fingerprints={"seed": str(seed)})
    assert hashed == []
    with StoreWriter(tmp_path, StoreConfig(num_shards=3)) as writer:
        writer.put("features", keys[0], *sample_blob(keys[0], seed + 1))
        writer.finish(fingerprints={"seed": str(seed)})
    assert hashed == [f"shard-0000{shard_of(keys[0], 3)}.lmdb"]
    manifest = read_manifest(tmp_path)
    assert all(shard.sha256 == file_sha256(tmp_path / shard.file) for shard in manifest.shards)
    assert verify_cache(tmp_path).ok


def test_a_manifest_without_transaction_ids_gets_every_shard_hashed(tmp_path, monkeypatch):
    seed = random_seed()
    build_cache(tmp_path, [f"t{i}" for i in range(6)], seed, num_shards=2)
    document = json.loads((tmp_path / MANIFEST_NAME).read_text())
    for shard in document["shards"]:
        del shard["txnid"]  # as written before they were recorded
    write_text_atomic(tmp_path / MANIFEST_NAME, json.dumps(document))
    hashed = _hashing_counted(monkeypatch)
    with StoreWriter(tmp_path, StoreConfig(num_shards=2)) as writer:
        writer.finish(fingerprints={"seed": str(seed)})
    assert sorted(hashed) == ["shard-00000.lmdb", "shard-00001.lmdb"]
    assert all(shard.txnid is not None for shard in read_manifest(tmp_path).shards)


def test_a_shard_changed_outside_lmdb_keeps_its_old_digest_so_verify_names_it(tmp_path):
    """Bit rot leaves LMDB's transaction id and the size as they were: the digest is kept, not
    recomputed over the damage, and verify still finds the shard changed."""
    seed = random_seed()
    build_cache(tmp_path, ["t0", "t1"], seed, num_shards=1)
    path = tmp_path / "shard-00000.lmdb"
    data = bytearray(path.read_bytes())
    blob = sample_blob("t0", seed)[0]
    position = data.find(blob)  # inside a record: LMDB's own pages stay whole
    assert position >= 0
    data[position + len(blob) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with StoreWriter(tmp_path, StoreConfig(num_shards=1)) as writer:
        writer.finish(fingerprints={"seed": str(seed)})
    problems = [problem.reason for problem in verify_cache(tmp_path).shard_problems]
    assert any("sha256" in reason for reason in problems), problems
