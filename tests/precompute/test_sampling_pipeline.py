"""Curation, clustering and AF3 weights inside precompute, end to end on real sample structures:
weights land in the manifest, adding a target re-clusters the cache without recomputing any
feature record, a target curation leaves out is listed and skipped, and `stats` shows it all."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from featurecache.cli import cli
from featurecache.config import ClusteringConfig, CurationConfig
from featurecache.precompute.pipeline import PipelineSetupError, PrecomputeOptions, precompute
from featurecache.schema import FEATURES_TABLE
from featurecache.store.codec import read_header
from featurecache.store.inspect import cache_stats, format_stats
from featurecache.store.manifest import EXCLUDED_TABLE, SAMPLING_TABLE, read_manifest
from featurecache.store.plot import plot_stats
from featurecache.store.reader import StoreReader
from featurecache.store.verify import verify_cache
from tests.conftest import copy_sample_structures

pytestmark = [pytest.mark.tools, pytest.mark.slow]  # featurizes real structures and runs MMseqs2

RAS = "721p-assembly1"
PEPTIDE_DNA = "209d-assembly1"
MODEL = "af-p01112-f1-model_v4"


def _run(inputs, cache, **options):
    return precompute(PrecomputeOptions(inputs=[inputs], cache_dir=cache, executor="inline", progress=False, **options))


def _feature_blobs(cache) -> dict[str, bytes]:
    manifest = read_manifest(cache)
    with StoreReader(cache, num_shards=manifest.num_shards) as reader:
        return {key: bytes(reader.get(FEATURES_TABLE, key)) for key in manifest.targets}


@pytest.fixture(scope="module")
def grown(tmp_path_factory):
    """A cache of 209D and 721P, then the H-Ras model added, then a rerun with nothing new."""
    root = tmp_path_factory.mktemp("grown")
    inputs, cache = root / "inputs", root / "cache"
    copy_sample_structures((f"{RAS}.cif", f"{PEPTIDE_DNA}.cif"), inputs)
    first = _run(inputs, cache)
    before = (read_manifest(cache), _feature_blobs(cache))
    copy_sample_structures("AF-P01112-F1-model_v4.cif.gz", inputs)
    second = _run(inputs, cache)
    after = (read_manifest(cache), _feature_blobs(cache))
    third = _run(inputs, cache)
    return {"cache": cache, "summaries": (first, second, third), "before": before, "after": after}


def test_manifest_carries_af3_weights_for_every_chain_and_interface(grown):
    manifest, _ = grown["before"]
    ras = manifest.targets[RAS]
    # chains A and B of 721P (H-Ras) are the only members of their cluster: 0.5 * 3 / 2
    assert [(c["chain_id"], c["asym_id"], c["molecule_type"]) for c in ras["chains"]] == [
        ("A", 1, "protein"),
        ("A:MG167", 2, "ligand"),
        ("A:GNP168", 3, "ligand"),
        ("B", 4, "protein"),
        ("B:MG167", 5, "ligand"),
        ("B:GNP168", 6, "ligand"),
    ]
    assert ras["chains"][0]["weight"] == pytest.approx(0.75) and ras["chains"][0]["cluster"].startswith("protein:")
    assert ras["chains"][1]["cluster"] == "ligand:MG" and ras["chains"][1]["weight"] == pytest.approx(0.25)
    interfaces = {tuple(item["chains"]): item for item in ras["interfaces"]}
    assert set(interfaces) == {(1, 2), (1, 3), (1, 4), (2, 3), (4, 5), (4, 6), (5, 6)}
    assert interfaces[1, 4]["weight"] == pytest.approx(6.0)  # protein-protein, its own cluster
    assert interfaces[1, 3]["weight"] == pytest.approx(4.0 / 2)  # protein-GNP, twice in the cache
    total = sum(c["weight"] for c in ras["chains"]) + sum(i["weight"] for i in ras["interfaces"])
    assert ras["weight"] == pytest.approx(total)
    assert manifest.index[SAMPLING_TABLE][RAS]["weight"] == ras["weight"]
    assert "weight" not in manifest.index[FEATURES_TABLE][RAS]  # the shard index holds no derived field
    assert "sampling" in manifest.fingerprints
    assert verify_cache(grown["cache"]).ok


def test_adding_a_target_reclusters_without_recomputing_features(grown):
    first, second, third = grown["summaries"]
    assert first.stages["featurize"].done == 2 and first.clustered
    # only the new target is featurized; the others' records stay byte for byte
    assert second.stages["featurize"].done == 1 and second.stages["featurize"].skipped == 2 and second.clustered
    (manifest_before, blobs_before), (manifest_after, blobs_after) = grown["before"], grown["after"]
    assert {key: blobs_after[key] for key in blobs_before} == blobs_before
    for key in blobs_before:
        assert manifest_after.index[FEATURES_TABLE][key] == manifest_before.index[FEATURES_TABLE][key]
    assert manifest_after.fingerprints["features"] == manifest_before.fingerprints["features"]
    assert manifest_after.fingerprints["sampling"] != manifest_before.fingerprints["sampling"]
    # the H-Ras model joins 721P's protein cluster: 3 members now, so each chain weighs 0.5 * 3 / 3
    ras_after = manifest_after.targets[RAS]["chains"][0]
    assert manifest_after.targets[MODEL]["chains"][0]["cluster"] == ras_after["cluster"]
    assert ras_after["weight"] == pytest.approx(0.5)
    assert manifest_after.targets[RAS]["weight"] < manifest_before.targets[RAS]["weight"]
    # nothing new: no featurization, no clustering, the same table
    assert third.stages["featurize"].done == 0 and not third.clustered
    assert read_manifest(grown["cache"]).index[SAMPLING_TABLE] == manifest_after.index[SAMPLING_TABLE]


def test_loader_reads_the_target_weights(grown):
    from featurecache.loader import CacheDataset

    dataset = CacheDataset(grown["cache"], crop_size=32)
    targets = read_manifest(grown["cache"]).index[SAMPLING_TABLE]
    table = dataset.sampling_table
    # each target's chains and interfaces add up to its weight
    assert [table.weights[table.targets == index].sum() for index in range(len(dataset))] == pytest.approx(
        [targets[i]["weight"] for i in dataset.ids]
    )


def test_stats_show_clusters_and_weights(grown, tmp_path):
    report = cache_stats(grown["cache"])
    sampling = report["sampling"]
    chains = sum(len(entry["chains"]) for entry in read_manifest(grown["cache"]).index[SAMPLING_TABLE].values())
    assert sampling["chains"]["items"] == chains and sampling["chains"]["clusters"] < chains
    assert sampling["chains"]["cluster_size"]["p100"] == 3  # H-Ras: 721P A, B and the model
    assert sum(int(size) * count for size, count in sampling["chains"]["clusters_of_size"].items()) == chains
    assert report["targets"][RAS]["weight"] == pytest.approx(read_manifest(grown["cache"]).targets[RAS]["weight"])
    text = format_stats(report)
    assert "sampling     chains" in text and "target weight" in text and "iface cluster" in text
    result = CliRunner().invoke(cli, ["stats", str(grown["cache"]), "--json", "--plot", str(tmp_path / "s.png")])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output.split("\nplot written")[0])["sampling"]["interfaces"]["items"] > 0
    assert (tmp_path / "s.png").stat().st_size > 0


def test_curation_leaves_targets_out_and_records_removals(tmp_path):
    inputs, cache = tmp_path / "inputs", tmp_path / "cache"
    copy_sample_structures(("2q2k.cif", "AF-P01112-F1-model_v4.cif.gz"), inputs)
    strict = CurationConfig(max_resolution=2.5)  # 2Q2K is 3.0 A; the model has no resolution
    summary = _run(inputs, cache, curation=strict)
    assert summary.excluded == 1 and summary.stages["featurize"].done == 1 and summary.failed == 0
    manifest = read_manifest(cache)
    assert set(manifest.targets) == {MODEL}
    assert manifest.index[EXCLUDED_TABLE]["2q2k"]["reason"] == "resolution"
    assert set(manifest.index[SAMPLING_TABLE]) == {MODEL}
    # a rerun with the same settings skips it without parsing it again, and keeps it listed
    again = _run(inputs, cache, curation=strict)
    assert again.excluded == 0 and again.stages["featurize"].skipped == 2 and again.stages["featurize"].done == 0
    assert read_manifest(cache).index[EXCLUDED_TABLE]["2q2k"]["reason"] == "resolution"
    report = cache_stats(cache)
    assert report["curation"]["excluded"] == {"resolution": 1} and "2q2k" in report["curation"]["excluded_targets"]
    assert "targets left out 1 (resolution 1)" in format_stats(report)

    # AF3's defaults keep 2Q2K but take its HEPES out; the change of settings recomputes records
    default = _run(inputs, cache)
    assert default.stages["featurize"].done == 2
    manifest = read_manifest(cache)
    assert manifest.index[EXCLUDED_TABLE] == {} and manifest.targets["2q2k"]["curation"] == {"crystallization_aid": 1}
    with StoreReader(cache, num_shards=manifest.num_shards) as reader:
        meta = read_header(reader.get(FEATURES_TABLE, "2q2k")).meta
    assert [(removal["reason"], removal["residue"]) for removal in meta["curation"]] == [
        ("crystallization_aid", "EPE 1")
    ]
    assert meta["chain_ids"] == ["A", "B", "C"] and meta["chain_types"] == ["dna", "protein", "protein"]
    assert cache_stats(cache)["curation"]["removed"] == {"crystallization_aid": 1}


def test_clustering_off_and_a_missing_mmseqs(tmp_path):
    inputs = copy_sample_structures("AF-P01112-F1-model_v4.cif.gz", tmp_path / "inputs")
    off = ClusteringConfig(enabled=False)
    summary = _run(inputs, tmp_path / "off", clustering=off)
    manifest = read_manifest(tmp_path / "off")
    assert not summary.clustered and SAMPLING_TABLE not in manifest.index and "sampling" not in manifest.fingerprints
    report = cache_stats(tmp_path / "off")
    assert report["sampling"] is None and "no clusters" in format_stats(report)
    plot_stats(report, tmp_path / "off.png")
    assert (tmp_path / "off.png").stat().st_size > 0
    config = tmp_path / "pipeline.toml"
    config.write_text('[tools.mmseqs]\nbinary = "/nonexistent/mmseqs"\n')
    with pytest.raises(PipelineSetupError, match="clustering .* needs MMseqs2.*enabled = false"):
        precompute(
            PrecomputeOptions(
                inputs=[inputs], cache_dir=tmp_path / "missing", config_path=config, executor="inline", progress=False
            )
        )
