"""`featurecache stats`: counted warnings (template hits without a structure), the update note,
and warnings read from the records' header entries, not the records."""

import json

import numpy as np
from click.testing import CliRunner

from featurecache.cli import cli
from featurecache.config import StoreConfig
from featurecache.store.codec import encode_record
from featurecache.store.inspect import cache_stats, format_stats
from featurecache.store.reader import StoreReader
from featurecache.store.writer import StoreWriter
from tests.store._cache import random_seed, sample_arrays
from tests.store._pages import mapped_bytes, needs_smaps

HITS = "template_hits_without_coordinates"


def _put_target(writer: StoreWriter, key: str, seed: int, hits: list[str], count_in_index: bool) -> None:
    arrays = sample_arrays(key, seed)
    meta = {"id": key, "seed": seed, "warnings": [], HITS: hits}
    index = {"num_tokens": arrays["msa"].shape[1], "msa_depth": arrays["msa"].shape[0], "weight": 1.0}
    if count_in_index:  # caches written before the index counted them have only the record's list
        index[HITS] = len(hits)
    writer.put("features", key, encode_record(key, arrays, meta, "fp", "0" * 64, 1), index=index)


def test_template_hits_without_a_structure_are_a_counted_warning(tmp_path):
    seed = random_seed()
    with StoreWriter(tmp_path, StoreConfig(num_shards=2)) as writer:
        _put_target(writer, "7a4d", seed, [f"1ab{i}_A" for i in range(7)], count_in_index=True)
        _put_target(writer, "2q2k", seed, ["4g3x_A", "721p_A"], count_in_index=False)
        _put_target(writer, "209d", seed, [], count_in_index=True)
        _put_target(writer, "721p", seed, [], count_in_index=False)
        writer.finish()
    report = cache_stats(tmp_path)
    assert report["template_hits_without_structure"] == {"hits": 9, "targets": 2, "per_target": {"2q2k": 2, "7a4d": 7}}
    text = format_stats(report)
    assert (
        "\nwarnings     1\n  9 template hits in 2 targets have no structure in the template folder "
        "(m8 hits against the whole PDB?): 7a4d 7, 2q2k 2\n"
    ) in text, text
    result = CliRunner().invoke(cli, ["stats", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["template_hits_without_structure"]["hits"] == 9


def test_a_cache_without_such_hits_shows_no_warning(tmp_path):
    with StoreWriter(tmp_path, StoreConfig(num_shards=1)) as writer:
        _put_target(writer, "209d", random_seed(), [], count_in_index=True)
        writer.finish()
    report = cache_stats(tmp_path)
    assert report["template_hits_without_structure"] == {"hits": 0, "targets": 0, "per_target": {}}
    assert report["update"] is None
    assert "\nwarnings     0\nfailures     0" in format_stats(report)


@needs_smaps
def test_stats_reads_the_warnings_of_large_records_from_their_header_entries(tmp_path):
    records, record_bytes = 16, 1 << 20
    cache = tmp_path / "cache"
    with StoreWriter(cache, StoreConfig(num_shards=1)) as writer:
        for number in range(records):
            key = f"t{number}"
            arrays = {"msa": np.random.default_rng(number).integers(0, 255, size=record_bytes, dtype=np.uint8)}
            meta = {"id": key, "warnings": [f"{key}: a warning"]}
            writer.put(
                "features",
                key,
                encode_record(key, arrays, meta, "fp", "0" * 64, 1, zstd_level=0),
                index={"num_tokens": 1, "msa_depth": 1, "warnings": 1},
            )
        writer.finish()
    with StoreReader(cache) as held:  # keeps the shard's map (shared in this process) open across cache_stats
        held.count("features")
        before = mapped_bytes(tmp_path)
        report = cache_stats(cache)
        touched = mapped_bytes(tmp_path) - before
        for number in range(records):
            held.get("features", f"t{number}")
        read_all = mapped_bytes(tmp_path) - before
    assert sorted(report["warnings"]) == sorted(f"t{number}: t{number}: a warning" for number in range(records))
    # a quarter of the records: the kernel may map a whole large page-cache folio around a touched page
    assert touched < records * record_bytes // 4, (
        f"stats touched {touched >> 10} KiB of {records} records of {record_bytes >> 10} KiB"
    )
    assert read_all > records * record_bytes // 2, "the measurement does not see records read"
