"""`featurecache stats`: counted warnings (template hits without a structure), the update note."""

import json

from click.testing import CliRunner

from featurecache.cli import cli
from featurecache.config import StoreConfig
from featurecache.store.codec import encode_record
from featurecache.store.inspect import cache_stats, format_stats
from featurecache.store.writer import StoreWriter
from tests.store._cache import random_seed, sample_arrays

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
    assert report["template_hits_without_structure"] == {"hits": 9, "targets": 2,
                                                         "per_target": {"2q2k": 2, "7a4d": 7}}
    text = format_stats(report)
    assert ("\nwarnings     1\n  9 template hits in 2 targets have no structure in the template folder "
            "(m8 hits against the whole PDB?): 7a4d 7, 2q2k 2\n") in text, text
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
