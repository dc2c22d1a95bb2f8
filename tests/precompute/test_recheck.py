"""`featurecache precompute --recheck`: the repair of damaged records that a plain rerun keeps.

A plain rerun decides from each feature record's header entry that the record is current, so a
record damaged since (its arrays' bytes, the entry intact) stays damaged: `verify` names it and
says to rerun with --recheck. --recheck reads every record the run would keep in full (its CRC,
every array decoded) and recomputes the damaged ones, with the MSA and conformer records they
use; every other record keeps its bytes, and shards with nothing to repair are not written. A shard
file changed outside LMDB (damage in free space, which no record's checksum shows) is rewritten
from its records. Real runs (ingested alignments, inline executor), bytes flipped inside LMDB values.
"""

from __future__ import annotations

import shutil

import lmdb
import pytest
from click.testing import CliRunner

from featurecache.cli import cli
from featurecache.precompute.pipeline import PrecomputeOptions, precompute
from featurecache.schema import CONFORMERS_TABLE, FEATURES_TABLE, MSA_TABLE
from featurecache.store.layout import MAX_DBS, shard_name, shard_of
from featurecache.store.manifest import read_manifest
from featurecache.store.reader import StoreReader
from featurecache.store.verify import REPAIR_HINT, verify_cache

# Ras (721p, with its GNP and Mg ligands) and its AlphaFold model; 2q2k: a small one.
STRUCTURES = ("721p-assembly1.cif", "AF-P01112-F1-model_v4.cif.gz", "2q2k.cif")
RECHECKED = (FEATURES_TABLE, MSA_TABLE, CONFORMERS_TABLE)


@pytest.fixture
def finished_cache(tmp_path, shared_data):
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    for name in STRUCTURES:
        shutil.copy(shared_data / "structures" / name, inputs / name)
    options = PrecomputeOptions(
        inputs=[inputs],
        cache_dir=tmp_path / "cache",
        alignments_dir=shared_data / "alignments",
        executor="inline",
        progress=False,
    )
    assert precompute(options).stages["featurize"].done == len(STRUCTURES)
    return options


def _flip(cache_dir, table: str, key: str) -> None:
    """Flip one byte in the middle of a stored record, through LMDB (its header entry, if any, stays
    intact: the entry still says the record is current)."""
    path = cache_dir / shard_name(shard_of(key, read_manifest(cache_dir).num_shards))
    env = lmdb.open(str(path), subdir=False, max_dbs=MAX_DBS)
    records = env.open_db(table.encode())
    with env.begin(write=True) as txn:
        blob = bytearray(txn.get(key.encode(), db=records))
        blob[len(blob) // 2] ^= 0x55
        txn.put(key.encode(), bytes(blob), db=records)
    env.close()


def _records(cache_dir) -> dict[tuple[str, str], bytes]:
    with StoreReader(cache_dir) as reader:
        return {(table, key): bytes(blob) for table in RECHECKED for key, blob in reader.items(table)}


def _txnids(cache_dir) -> dict[str, int]:
    return {shard.file: shard.txnid for shard in read_manifest(cache_dir).shards}


def _verify_cli(cache_dir):
    return CliRunner().invoke(cli, ["verify", str(cache_dir)])


def _precompute_cli(options: PrecomputeOptions, *extra: str):
    return CliRunner().invoke(
        cli,
        [
            "precompute",
            *map(str, options.inputs),
            "--cache",
            str(options.cache_dir),
            "--alignments",
            str(options.alignments_dir),
            "--executor",
            "inline",
            "--no-progress",
            *extra,
        ],
    )


def test_recheck_recomputes_exactly_the_damaged_feature_record(finished_cache):
    cache_dir = finished_cache.cache_dir
    damaged = "2q2k"
    _flip(cache_dir, FEATURES_TABLE, damaged)
    before, txnids = _records(cache_dir), _txnids(cache_dir)

    result = _verify_cli(cache_dir)
    assert result.exit_code == 1, result.output
    assert f"damaged record features/{damaged} in " in result.output
    last = result.output.strip().splitlines()[-1]
    assert last == REPAIR_HINT and "--recheck" in last

    # The documented trade-off: a plain rerun decides from the intact header entry and keeps it.
    plain = precompute(finished_cache)
    assert plain.stages["featurize"].done == 0 and plain.stages["featurize"].skipped == len(STRUCTURES)
    assert not plain.recheck and "  recheck: " not in plain.format()
    assert [(record.table, record.key) for record in verify_cache(cache_dir).damaged] == [(FEATURES_TABLE, damaged)]
    assert _records(cache_dir) == before

    result = _precompute_cli(finished_cache, "--recheck")
    assert result.exit_code == 0, result.output
    assert (
        "recheck: " + f"{len(before)} kept record(s) read in full, 1 damaged (features 1), "
        "1 damaged record(s) recomputed (features 1)"
    ) in result.output
    assert "featurize  done      1  skipped      2" in result.output

    report = verify_cache(cache_dir)
    assert report.ok, report.format()
    assert REPAIR_HINT not in report.format()
    after = _records(cache_dir)
    assert after.keys() == before.keys()
    assert {name for name in after if after[name] != before[name]} == {(FEATURES_TABLE, damaged)}
    # Only the damaged record's shard was written to; the others keep their LMDB transaction.
    damaged_shard = shard_name(shard_of(damaged, read_manifest(cache_dir).num_shards))
    assert {name for name, txnid in _txnids(cache_dir).items() if txnid != txnids[name]} == {damaged_shard}
    with StoreReader(cache_dir) as reader:
        assert reader.get_record(FEATURES_TABLE, damaged).key == damaged
        assert (
            reader.header(FEATURES_TABLE, damaged).fingerprint == reader.get_record(FEATURES_TABLE, damaged).fingerprint
        )


def test_recheck_of_an_intact_cache_recomputes_nothing(finished_cache):
    cache_dir = finished_cache.cache_dir
    before, txnids = _records(cache_dir), _txnids(cache_dir)
    summary = precompute(PrecomputeOptions(**{**vars(finished_cache), "recheck": True}))
    assert summary.stages["featurize"].done == 0 and summary.stages["featurize"].skipped == len(STRUCTURES)
    assert summary.stages["conformers"].done == 0
    assert summary.rechecked == len(before)
    assert summary.damaged == {} and summary.recomputed == {} and summary.damaged_left == []
    assert "0 damaged, 0 damaged record(s) recomputed" in summary.format()
    assert _records(cache_dir) == before and _txnids(cache_dir) == txnids
    assert verify_cache(cache_dir).ok


def test_recheck_recomputes_damaged_msa_and_conformer_records_with_the_targets_using_them(finished_cache):
    cache_dir = finished_cache.cache_dir
    with StoreReader(cache_dir) as reader:
        msa_key = sorted(reader.keys(MSA_TABLE))[0]
        conformer_key = sorted(reader.keys(CONFORMERS_TABLE))[0]
    _flip(cache_dir, MSA_TABLE, msa_key)
    _flip(cache_dir, CONFORMERS_TABLE, conformer_key)
    before = _records(cache_dir)
    assert {(record.table, record.key) for record in verify_cache(cache_dir).damaged} == {
        (MSA_TABLE, msa_key),
        (CONFORMERS_TABLE, conformer_key),
    }

    plain = precompute(finished_cache)  # the feature records are current: nothing reads the others
    assert plain.stages["featurize"].done == 0 and not verify_cache(cache_dir).ok

    summary = precompute(PrecomputeOptions(**{**vars(finished_cache), "recheck": True}))
    assert summary.failed == 0, summary.format()
    assert summary.damaged == {MSA_TABLE: 1, CONFORMERS_TABLE: 1}, summary.format()
    assert summary.recomputed == {MSA_TABLE: 1, CONFORMERS_TABLE: 1}, summary.format()
    assert summary.damaged_left == []
    assert 1 <= summary.stages["featurize"].done < len(STRUCTURES)  # only the targets that use them
    report = verify_cache(cache_dir)
    assert report.ok, report.format()
    after = _records(cache_dir)
    assert after.keys() == before.keys()
    changed = {name for name in after if after[name] != before[name]}
    assert {(MSA_TABLE, msa_key), (CONFORMERS_TABLE, conformer_key)} <= changed
    assert {table for table, _ in changed - {(MSA_TABLE, msa_key), (CONFORMERS_TABLE, conformer_key)}} <= {
        FEATURES_TABLE
    }  # the users' feature records are rewritten; no other msa or conformer record


def test_recheck_is_a_flag(finished_cache):
    result = _precompute_cli(finished_cache, "--recheck=yes")
    assert result.exit_code == 2, result.output
    assert "--recheck" in result.output and "Traceback" not in result.output


def test_recheck_in_search_mode_searches_again_only_the_damaged_database_output(tmp_path, shared_data, test_databases):
    """Real searches: a damaged raw output of one database is searched again (the other databases'
    outputs reused), and the chain's MSA record and its target's features are rewritten from it."""
    from featurecache.store.codec import decode_record
    from featurecache.testing.testdb import write_pipeline_config

    config_path = write_pipeline_config(test_databases, tmp_path / "pipeline.toml", threads=1, template_tool="hhsearch")
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    shutil.copy(shared_data / "structures" / "721p-assembly1.cif", inputs)
    options = PrecomputeOptions(
        inputs=[inputs], cache_dir=tmp_path / "cache", config_path=config_path, executor="inline", progress=False
    )
    assert precompute(options).stages["search"].done == 1
    with StoreReader(options.cache_dir) as reader:
        outputs = {
            key: decode_record(reader.get(MSA_TABLE, key)).meta["database"]
            for key in reader.keys(MSA_TABLE)
            if "-db-" in key
        }
    damaged = sorted(outputs)[0]
    _flip(options.cache_dir, MSA_TABLE, damaged)
    before = _records(options.cache_dir)
    assert [(record.table, record.key) for record in verify_cache(options.cache_dir).damaged] == [(MSA_TABLE, damaged)]

    summary = precompute(PrecomputeOptions(**{**vars(options), "recheck": True}))
    assert summary.failed == 0, summary.format()
    assert summary.damaged == {MSA_TABLE: 1} and summary.recomputed == {MSA_TABLE: 1}, summary.format()
    assert summary.stages["search"].done == 1 and summary.stages["featurize"].done == 1
    assert verify_cache(options.cache_dir).ok
    after = _records(options.cache_dir)
    with StoreReader(options.cache_dir) as reader:
        (chain,) = [
            decode_record(reader.get(MSA_TABLE, key)).meta for key in reader.keys(MSA_TABLE) if "-db-" not in key
        ]
    assert {name for name, entry in chain["databases"].items() if not entry["reused"]} == {outputs[damaged]}
    unchanged_outputs = {(MSA_TABLE, key) for key in outputs if key != damaged}
    assert all(after[name] == before[name] for name in unchanged_outputs)
    assert after[(MSA_TABLE, damaged)] != before[(MSA_TABLE, damaged)]


def _flip_free_page(path, rng) -> None:
    """Flip one byte of a free page of the shard file (tests/store/_lmdb_pages.py): no record's byte."""
    from tests.store._lmdb_pages import page_map

    pages = page_map(path)
    offset = rng.choice(sorted(pages.free)) * pages.page_size + rng.randrange(pages.page_size)
    data = bytearray(path.read_bytes())
    data[offset] ^= rng.randrange(1, 256)
    path.write_bytes(bytes(data))


def test_recheck_rewrites_shards_damaged_outside_any_record(finished_cache):
    """Damage in free space: no record is damaged, the shard's sha256 is wrong. A rerun leaves the
    shard unchanged (and its recorded digest), --recheck rewrites it from its records."""
    import random

    cache_dir = finished_cache.cache_dir
    rng = random.Random()
    path = cache_dir / read_manifest(cache_dir).shards[rng.randrange(read_manifest(cache_dir).num_shards)].file
    _flip_free_page(path, rng)
    before = _records(cache_dir)
    report = verify_cache(cache_dir)
    assert report.damaged == [] and [problem.shard for problem in report.shard_problems] == [path.name]
    assert f"`featurecache verify --repair {cache_dir}`" in report.format().splitlines()[-1]
    precompute(finished_cache)
    assert not verify_cache(cache_dir).ok  # a plain rerun changed nothing

    summary = precompute(PrecomputeOptions(**{**vars(finished_cache), "recheck": True}))
    assert summary.damaged == {} and summary.stages["featurize"].done == 0, summary.format()
    report = verify_cache(cache_dir)
    assert report.ok, report.format()
    assert _records(cache_dir) == before


def test_recheck_recomputes_damaged_records_then_rewrites_their_damaged_shards(finished_cache):
    """A damaged record and damaged free space in its shard, damaged free space in another shard:
    verify names --recheck, which recomputes the record and rewrites both shards."""
    import random

    from featurecache.config import file_sha256

    cache_dir = finished_cache.cache_dir
    rng = random.Random()
    manifest = read_manifest(cache_dir)
    damaged = "2q2k"
    own_shard = cache_dir / shard_name(shard_of(damaged, manifest.num_shards))
    other_shard = cache_dir / rng.choice([shard.file for shard in manifest.shards if shard.file != own_shard.name])
    _flip(cache_dir, FEATURES_TABLE, damaged)
    _flip_free_page(own_shard, rng)
    _flip_free_page(other_shard, rng)
    before = _records(cache_dir)
    result = _verify_cli(cache_dir)
    assert result.exit_code == 1 and result.output.strip().splitlines()[-1] == REPAIR_HINT, result.output

    result = _precompute_cli(finished_cache, "--recheck")
    assert result.exit_code == 0, result.output
    report = verify_cache(cache_dir)
    assert report.ok, report.format()
    after = _records(cache_dir)
    assert after.keys() == before.keys()
    assert {name for name in after if after[name] != before[name]} == {(FEATURES_TABLE, damaged)}
    for shard in read_manifest(cache_dir).shards:
        assert file_sha256(cache_dir / shard.file) == shard.sha256
    # the other shard had nothing to recompute: only its rewrite moved its transaction id
    assert {path.name for path in (own_shard, other_shard)} <= {
        shard.file for shard, old in zip(read_manifest(cache_dir).shards, manifest.shards) if shard.txnid > old.txnid
    }
