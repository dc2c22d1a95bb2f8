"""`featurecache verify --repair`: damage where no record lies is cleared, and no record is lost.

Real caches built from the sample data, damaged exactly where no record is: a free page or the
unused part of a used page (found by reading LMDB's pages, tests/store/_lmdb_pages.py), bytes
appended to a shard; and shards LMDB cannot read (both meta pages damaged, a truncated file),
whose records must be recomputed from the inputs. A reader that opened the cache before the
repair keeps reading it, and so do readers that open it afterwards, while a writer updates it.
"""

from __future__ import annotations

import random
import shutil
import subprocess
import sys

import lmdb
import pytest
from click.testing import CliRunner

from featurecache.cli import cli
from featurecache.config import StoreConfig, file_sha256
from featurecache.store.layout import shard_name
from featurecache.store.manifest import read_manifest
from featurecache.store.repair import repair_cache
from featurecache.store.verify import FILE_CHANGED, REPAIR_HINT, UNREADABLE, rewrite_hint, unreadable_hint, verify_cache
from featurecache.store.writer import StoreWriter
from tests.store._cache import REPO, build_cache, child_env, random_seed, sample_blob
from tests.store._lmdb_pages import page_map

STRUCTURES = ("2q2k.cif", "721p-assembly1.cif")


@pytest.fixture(scope="module")
def sample_cache(tmp_path_factory, shared_data):
    """A finished cache of two sample structures with their alignments (tests work on copies)."""
    root = tmp_path_factory.mktemp("sample")
    inputs = root / "inputs"
    inputs.mkdir()
    for name in STRUCTURES:
        shutil.copy(shared_data / "structures" / name, inputs / name)
    arguments = [str(inputs), "--alignments", str(shared_data / "alignments"), "--executor", "inline", "--no-progress"]
    result = CliRunner().invoke(cli, ["precompute", *arguments, "--cache", str(root / "cache")])
    assert result.exit_code == 0, result.output
    return root / "cache", arguments


@pytest.fixture
def cache(tmp_path, sample_cache):
    shutil.copytree(sample_cache[0], tmp_path / "cache")
    return tmp_path / "cache"


def _entries(cache_dir) -> dict[tuple[str, str, bytes], bytes]:
    """Every entry of every table of every shard (records, index, header and meta entries)."""
    entries = {}
    for shard in read_manifest(cache_dir, expected_schema=None).shards:
        env = lmdb.open(str(cache_dir / shard.file), subdir=False, readonly=True, lock=False, max_dbs=32)
        with env.begin() as txn:
            names = [name for name, _ in txn.cursor()]
            for name in names:
                for key, value in txn.cursor(db=env.open_db(name, txn=txn, create=False)):
                    entries[(shard.file, name.decode(), key)] = value
        env.close()
    return entries


def _flip(path, offset: int, rng: random.Random) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= rng.randrange(1, 256)
    path.write_bytes(bytes(data))


def _free_page_offset(path, rng: random.Random) -> int:
    pages = page_map(path)
    assert pages.free, f"{path} has no free page"
    return rng.choice(sorted(pages.free)) * pages.page_size + rng.randrange(pages.page_size)


def _unused_offset_in_used_page(path, rng: random.Random) -> int:
    start, end = rng.choice([gap for gap in page_map(path).gaps if gap[1] > gap[0]])
    return rng.randrange(start, end)


def _verify_cli(cache_dir, *options):
    return CliRunner().invoke(cli, ["verify", *options, str(cache_dir)])


def _assert_clean(cache_dir) -> None:
    report = verify_cache(cache_dir)
    assert report.ok, report.format()
    for shard in read_manifest(cache_dir).shards:
        assert file_sha256(cache_dir / shard.file) == shard.sha256


@pytest.mark.parametrize("where", ["free page", "unused part of a used page", "bytes appended"])
def test_damage_where_no_record_lies_is_rewritten_away(cache, where):
    seed = random_seed()
    rng = random.Random(seed)
    before = _entries(cache)
    shards = [cache / shard.file for shard in read_manifest(cache).shards]
    damaged = rng.sample(shards, 2)
    for path in damaged:
        if where == "free page":
            _flip(path, _free_page_offset(path, rng), rng)
        elif where == "unused part of a used page":
            _flip(path, _unused_offset_in_used_page(path, rng), rng)
        else:
            with open(path, "ab") as handle:
                handle.write(rng.randbytes(rng.randrange(1, 9000)))
    assert _entries(cache) == before, f"seed {seed}: the damage hit an entry"

    result = _verify_cache_fails(cache)
    assert result.output.count("damaged shard ") == 2 and "0 records, 2 shard problems" in result.output
    assert result.output.strip().splitlines()[-1] == rewrite_hint(cache)
    assert verify_cache(cache).to_dict()["repair"] == rewrite_hint(cache)  # --json names it too

    # a rerun of precompute leaves these shards unchanged, so only the repair clears them
    result = _verify_cli(cache, "--repair")
    assert result.exit_code == 0, result.output
    assert sorted(line.split()[1] for line in result.output.splitlines() if line.startswith("rewrote ")) == sorted(
        path.name for path in damaged
    )
    assert result.output.strip().endswith("OK")
    _assert_clean(cache)
    assert _entries(cache) == before, f"seed {seed}"
    # nothing left to repair: a second run rewrites nothing
    again = repair_cache(cache)
    assert again.rewritten == [] and again.after.ok


def _verify_cache_fails(cache_dir):
    result = _verify_cli(cache_dir)
    assert result.exit_code == 1, result.output
    return result


def test_a_shard_with_damaged_records_is_left_to_precompute_recheck(cache):
    rng = random.Random(random_seed())
    manifest = read_manifest(cache)
    target = sorted(manifest.targets)[0]
    path = cache / shard_name(manifest.targets[target]["shard"])
    env = lmdb.open(str(path), subdir=False, max_dbs=32)
    features = env.open_db(b"features")
    with env.begin(write=True) as txn:
        blob = bytearray(txn.get(target.encode(), db=features))
        blob[len(blob) // 2] ^= 0x55
        txn.put(target.encode(), bytes(blob), db=features)
    env.close()
    _flip(path, _free_page_offset(path, rng), rng)
    result = _verify_cache_fails(cache)
    assert result.output.strip().splitlines()[-1] == REPAIR_HINT
    repaired = repair_cache(cache)
    assert repaired.left == [path.name] and repaired.rewritten == []
    assert [record.key for record in repaired.after.damaged] == [target]


@pytest.mark.parametrize("damage", ["meta pages", "truncated"])
def test_an_unreadable_shard_is_set_aside_and_its_records_recomputed(cache, sample_cache, damage):
    before = _entries(cache)
    manifest = read_manifest(cache)
    # A shard holding an msa record and conformers (the most records of those): which shard a key
    # lands in depends on the key, and an ingested MSA's key on the alignment files' paths, so
    # on where the sample data lies; the choice must not leave a table out of the test.
    shard = max(
        (info for info in manifest.shards if info.counts.get("msa") and info.counts.get("conformers")),
        key=lambda info: sum(info.counts.values()),
    )
    path = cache / shard.file
    if damage == "meta pages":  # both of LMDB's meta pages: it cannot open the file
        data = bytearray(path.read_bytes())
        for page in (0, 1):
            data[page * 4096 + 16 : page * 4096 + 24] = b"\0" * 8
        path.write_bytes(bytes(data))
    else:
        with open(path, "r+b") as handle:
            handle.truncate(path.stat().st_size // 2)

    damaged_size = path.stat().st_size
    result = _verify_cache_fails(cache)
    (problem,) = [
        line for line in result.output.splitlines() if line.startswith("  damaged shard") and "unreadable" in line
    ]
    assert shard.file in problem and ("truncated" in problem) == (damage == "truncated"), result.output
    assert result.output.strip().splitlines()[-1] == unreadable_hint(cache)
    # its sha256 differs too; nothing else is named
    assert {(problem.shard, problem.kind) for problem in verify_cache(cache).shard_problems} == {
        (shard.file, FILE_CHANGED),
        (shard.file, UNREADABLE),
    }

    result = _verify_cli(cache, "--repair")
    assert result.exit_code == 1, result.output
    assert f"moved unreadable {shard.file} to {shard.file}.unreadable-" in result.output
    assert result.output.strip().splitlines()[-1] == REPAIR_HINT
    (aside,) = [path for path in cache.glob(f"{shard.file}.unreadable-*") if not path.name.endswith("-lock")]
    assert aside.stat().st_size == damaged_size  # kept as it was
    lost = {key for (file, table, key) in before if file == shard.file and table in ("features", "msa", "conformers")}
    assert {table for (file, table, _) in before if file == shard.file} >= {"msa", "conformers"}
    after = verify_cache(cache)
    assert {record.key.encode() for record in after.damaged} == lost
    assert {record.reason for record in after.damaged} == {"listed in the manifest but missing"}

    inputs, *options = sample_cache[1]
    result = CliRunner().invoke(cli, ["precompute", inputs, *options, "--cache", str(cache), "--recheck"])
    assert result.exit_code == 0, result.output
    _assert_clean(cache)
    recomputed = _entries(cache)
    assert recomputed.keys() == before.keys(), sorted(set(recomputed) ^ set(before))
    # deterministic inputs give the same records; only the meta entry's creation time may differ
    assert {name for name in before if recomputed[name] != before[name]} <= {(shard.file, "meta", b"shard")}


def test_published_generations_and_locked_caches_are_refused(cache, tmp_path):
    from featurecache.store.locks import ShardLock
    from featurecache.store.publish import publish

    generation = publish(cache, tmp_path / "published")
    result = _verify_cli(generation, "--repair")
    assert result.exit_code == 2 and "published generation" in result.output and "Traceback" not in result.output
    lock = ShardLock(cache / shard_name(1))
    try:
        result = _verify_cli(cache, "--repair")
    finally:
        lock.release()
    assert result.exit_code == 2, result.output
    assert "cannot repair" in result.output and "another writer" in result.output


_READER = """
import sys
from featurecache.store.reader import StoreReader
from tests.store._cache import assert_record_matches
cache, seed, tables = sys.argv[1], int(sys.argv[2]), {"features": sys.argv[3].split(","), "msa": sys.argv[4].split(",")}
reader = StoreReader(cache)  # opened once: its environments stay open across the repair and the update
for line in sys.stdin:
    for table, keys in tables.items():
        for key in keys:
            assert_record_matches(reader.get_record(table, key), key, seed)
    print(sum(map(len, tables.values())), flush=True)
"""


def _reader(cache_dir, seed: int, keys: list[str], msa_keys: list[str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", _READER, str(cache_dir), str(seed), ",".join(keys), ",".join(msa_keys)],
        cwd=REPO,
        env=child_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _read_all(child) -> int:
    child.stdin.write("read\n")
    child.stdin.flush()
    line = child.stdout.readline()
    assert line, f"the reader died: {child.stderr.read()}"
    return int(line)


def _read_once(cache_dir, seed: int, keys: list[str], msa_keys: list[str]) -> int:
    """Every record read by a new process, which opens the shards after everything before it."""
    child = _reader(cache_dir, seed, keys, msa_keys)
    count = _read_all(child)
    child.stdin.close()
    assert child.wait(timeout=60) == 0, child.stderr.read()
    return count


def test_readers_keep_reading_through_a_repair_and_the_update_after_it(tmp_path):
    """A reader open before the repair, a reader that opens after it (sharing LMDB's lock file with
    the first), a writer that then commits once per shard, and a reader that opens when all
    others have closed (LMDB then starts its lock file afresh from the file's newest meta page):
    every read is whole and right, and nothing the writer committed is lost."""
    seed = random_seed()
    keys, msa_keys = [f"t{i:03d}" for i in range(40)], [f"m{i:03d}" for i in range(30)]
    # a commit per record: the files' transaction ids are far from those of a copy's own commits,
    # and msa, the last table copied, is not empty
    build_cache(tmp_path, keys, seed, num_shards=3, batch_records=1, msa_keys=tuple(msa_keys))
    rng = random.Random(seed)
    for shard in read_manifest(tmp_path).shards:
        _flip(tmp_path / shard.file, _free_page_offset(tmp_path / shard.file, rng), rng)
    early = _reader(tmp_path, seed, keys, msa_keys)
    added = [f"n{i:03d}" for i in range(12)]
    everything = len(keys) + len(msa_keys)
    try:
        assert _read_all(early) == everything
        assert len(repair_cache(tmp_path).rewritten) == 3
        assert _read_all(early) == everything
        assert _read_once(tmp_path, seed, keys, msa_keys) == everything
        with StoreWriter(tmp_path, StoreConfig(num_shards=3, batch_records=100)) as writer:  # one commit each
            for key in added:
                writer.put("features", key, *sample_blob(key, seed))
            writer.finish(fingerprints={"seed": str(seed)})
        assert _read_all(early) == everything
        assert _read_once(tmp_path, seed, keys + added, msa_keys) == everything + len(added)
    finally:
        early.stdin.close()
        early.wait(timeout=60)
    assert early.returncode == 0, early.stderr.read()
    assert _read_once(tmp_path, seed, keys + added, msa_keys) == everything + len(added), f"seed {seed}"
    _assert_clean(tmp_path)


_READ_EVERY_RECORD = """
import sys
from featurecache.loader import CacheDataset
dataset = CacheDataset(sys.argv[1], crop_size=64)
for index in range(len(dataset)):
    dataset[index]
"""


def test_a_truncated_shard_is_named_not_a_crash_for_every_reader_and_writer(cache, sample_cache):
    """Reading a page past the end of a memory-mapped file kills a process with SIGBUS: the loader,
    precompute (reruns and --recheck alike) and stats must each stop on the shard with one line
    naming it and the repair, before LMDB reads a page. Each runs in a child process, so a crash
    is seen as one rather than taking pytest down."""
    manifest = read_manifest(cache)
    # a shard holding a feature record, so the loader has to open it
    path = cache / shard_name(manifest.targets[sorted(manifest.targets)[0]]["shard"])
    with open(path, "r+b") as handle:
        handle.truncate(path.stat().st_size // 2)
    size = path.stat().st_size
    inputs, *options = sample_cache[1]
    featurecache = [sys.executable, "-m", "featurecache.cli"]
    runs = {
        "loader": [sys.executable, "-c", _READ_EVERY_RECORD, str(cache)],
        "precompute": [*featurecache, "precompute", inputs, *options, "--cache", str(cache)],
        "precompute --recheck": [*featurecache, "precompute", inputs, *options, "--cache", str(cache), "--recheck"],
        "stats": [*featurecache, "stats", str(cache)],
    }
    for name, command in runs.items():
        done = subprocess.run(command, capture_output=True, text=True, env=child_env(), timeout=600)
        assert done.returncode > 0, f"{name}: exit {done.returncode} (a negative code is a signal)\n{done.stderr}"
        assert str(path) in done.stderr and "truncated to" in done.stderr and "verify --repair" in done.stderr, (
            name,
            done.stderr[-2000:],
        )
        if name != "loader":  # the commands: one line, exit 2, no traceback
            assert done.returncode == 2 and "Traceback" not in done.stderr, (name, done.stderr)
    assert path.stat().st_size == size  # nothing wrote to it
