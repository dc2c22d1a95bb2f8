"""`precompute --alignments DIR --config pipeline.toml`: ingesting alignments with the config's settings.

The config's feature, curation, clustering and store settings apply to an ingest run and go into
its records' fingerprints; a config that configures searches ([[databases]]) is refused, since
--alignments would leave them unused. Real runs on a sample structure.
"""

from __future__ import annotations

from click.testing import CliRunner

from featurecache.cli import cli
from featurecache.config import FeatureConfig
from featurecache.store.manifest import read_manifest
from featurecache.store.reader import StoreReader

TARGET = "721p-assembly1"  # two Ras chains, each with GNP and Mg: 6 chains


def _ingest(shared_data, cache, *extra: str):
    return CliRunner().invoke(
        cli,
        [
            "precompute",
            str(shared_data / "structures" / f"{TARGET}.cif"),
            "--alignments",
            str(shared_data / "alignments"),
            "--cache",
            str(cache),
            "--executor",
            "inline",
            "--no-progress",
            *extra,
        ],
    )


def _settings(path, max_chains: int):
    path.write_text(
        f"[features]\nmsa_rows_stored = 8\n\n[curation]\nmax_chains = {max_chains}\n\n"
        f"[clustering]\nenabled = false\n\n[store]\nnum_shards = 2\n"
    )
    return path


def test_an_ingest_run_takes_the_configs_settings(tmp_path, shared_data):
    plain = _ingest(shared_data, tmp_path / "plain")
    assert plain.exit_code == 0, plain.output
    config = _settings(tmp_path / "settings.toml", max_chains=2)
    result = _ingest(shared_data, tmp_path / "cache", "--config", str(config))
    assert result.exit_code == 0, result.output

    default, configured = read_manifest(tmp_path / "plain"), read_manifest(tmp_path / "cache")
    assert default.targets[TARGET]["num_chains"] == 6 and default.targets[TARGET]["msa_depth"] > 8
    entry = configured.targets[TARGET]
    assert entry["num_chains"] == 2 and entry["curation"] == {"chain_limit": 4}  # [curation] max_chains
    assert entry["msa_depth"] == 8  # [features] msa_rows_stored
    assert configured.num_shards == 2 and "sampling" not in configured.index  # [store], [clustering]
    assert configured.fingerprints["feature_config"] == FeatureConfig(msa_rows_stored=8).config_fingerprint()
    assert configured.fingerprints["mode"] == default.fingerprints["mode"]  # still ingested from the same folder
    with StoreReader(tmp_path / "cache") as reader:
        record = reader.get_record("features", TARGET)
    assert record.arrays["msa_row_source"].shape[0] == 8  # the rows stored, query included
    assert {removal["reason"] for removal in record.meta["curation"]} == {"chain_limit"}
    assert record.fingerprint == entry["fingerprint"] != default.targets[TARGET]["fingerprint"]

    # the settings are part of the fingerprint: the same config skips, a changed one recomputes
    again = _ingest(shared_data, tmp_path / "cache", "--config", str(config))
    assert "featurize  done      0  skipped      1" in again.output, again.output
    changed = _ingest(shared_data, tmp_path / "cache", "--config", str(_settings(tmp_path / "three.toml", 3)))
    assert "featurize  done      1  skipped      0" in changed.output, changed.output
    assert read_manifest(tmp_path / "cache").targets[TARGET]["num_chains"] == 3


def test_a_config_with_search_databases_is_refused_with_alignments(tmp_path, shared_data):
    config = tmp_path / "search.toml"
    config.write_text(
        '[features]\nmsa_rows_stored = 8\n\n[[databases]]\nname = "uniref90"\ntool = "jackhmmer"\n'
        'path = "uniref90.fasta"\n'
    )
    result = _ingest(shared_data, tmp_path / "cache", "--config", str(config))
    assert result.exit_code == 2, result.output
    (line,) = result.output.strip().splitlines()
    assert "--config" in line and "[[databases]]" in line and "uniref90" in line and "--alignments" in line, line
    assert "Traceback" not in result.output and not (tmp_path / "cache").exists()
