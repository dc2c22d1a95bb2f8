"""`featurecache export` of a small real cache (7A4D: four nanobodies and a homodimeric peptide,
with ingested alignments and templates): A3M rows against the record's assembled MSA, AF3 JSON
against AF3's input format."""

from __future__ import annotations

import csv
import json
import re
import shutil

import numpy as np
import pytest
from click.testing import CliRunner

from featurecache.cli import cli
from featurecache.config import ClusteringConfig, StoreConfig
from featurecache.features.msa import expand_msa
from featurecache.io.af3_json import read_af3_json
from featurecache.io.msa import parse_a3m
from featurecache.precompute.pipeline import PrecomputeOptions, precompute
from featurecache.store.codec import decode_record, encode_record
from featurecache.store.manifest import read_manifest
from featurecache.store.reader import StoreReader
from featurecache.store.writer import StoreWriter
from tests.precompute.test_search_command import check_af3_input

TARGET = "7a4d-assembly1"


@pytest.fixture(scope="module")
def cache(tmp_path_factory, shared_data):
    cache_dir = tmp_path_factory.mktemp("export") / "cache"
    summary = precompute(
        PrecomputeOptions(
            inputs=[shared_data / "structures" / "7a4d-assembly1.cif"],
            cache_dir=cache_dir,
            alignments_dir=shared_data / "alignments",
            template_dir=shared_data / "templates" / "mmcif",
            executor="inline",
            progress=False,
            clustering=ClusteringConfig(enabled=False),
        )
    )
    assert summary.stages["featurize"].done == 1, summary.format()
    with StoreReader(cache_dir) as reader:
        record = decode_record(reader.get("features", TARGET))
    return cache_dir, record


def _protein_chains(record):
    return [
        (number, chain_id)
        for number, (chain_id, kind) in enumerate(zip(record.meta["chain_ids"], record.meta["chain_types"]), start=1)
        if kind == "protein"
    ]


def test_a3m_rows_are_the_assembled_rows_query_first(cache, tmp_path):
    cache_dir, record = cache
    out = tmp_path / "a3m"
    result = CliRunner().invoke(cli, ["export", str(cache_dir), TARGET, "--format", "a3m", "--out", str(out)])
    assert result.exit_code == 0, result.output
    msa, deletions = expand_msa(record.arrays)
    chains = _protein_chains(record)
    assert len(chains) == 6
    parsed = {}
    for number, chain_id in chains:
        sequence = record.meta["sequences"][number - 1]
        a3m = parse_a3m((out / TARGET / f"{chain_id}.a3m").read_text(), chain_id)
        tokens = np.flatnonzero(record.arrays["asym_id"] == number)
        _, first = np.unique(record.arrays["residue_index"][tokens], return_index=True)
        tokens = tokens[np.sort(first)]  # one per residue (a modified residue has a token per atom)
        assert a3m.query == sequence and a3m.length == len(sequence) == tokens.size
        assert a3m.depth == msa.shape[0] > 1
        np.testing.assert_array_equal(a3m.deletion_matrix, deletions[:, tokens])
        parsed[chain_id] = a3m
    # Rows line up across the chains as the record assembled them: a paired row shows two or
    # more entities, an unpaired row one entity only (other chains all gaps; copies share rows).
    entity = record.arrays["entity_id"]
    first_of_entity = {}
    for number, chain_id in chains:
        first_of_entity.setdefault(int(entity[record.arrays["asym_id"] == number][0]), chain_id)
    shows = np.stack(
        [(parsed[chain_id].aligned[1:] != ord("-")).any(axis=1) for chain_id in first_of_entity.values()]
    )  # [entity, row]
    paired = record.arrays["msa_is_paired"][1:]
    assert (shows[:, paired].sum(axis=0) >= 2).all()
    assert (shows[:, ~paired].sum(axis=0) == 1).all() and shows.any(axis=1).all()


def test_af3_json_follows_the_documented_input_format(cache, tmp_path):
    cache_dir, record = cache
    out = tmp_path / "json"
    result = CliRunner().invoke(cli, ["export", str(cache_dir), TARGET, "--format", "af3-json", "--out", str(out)])
    assert result.exit_code == 0, result.output
    document = json.loads((out / f"{TARGET}.json").read_text())
    check_af3_input(document)
    proteins = [entry["protein"] for entry in document["sequences"] if "protein" in entry]
    assert all(
        body["pairedMsa"] == "" and body["unpairedMsa"].count(">") == record.arrays["msa_row_source"].shape[0]
        for body in proteins
    )
    parsed = read_af3_json(out / f"{TARGET}.json", TARGET)  # featurecache reads it back
    for number, chain_id in _protein_chains(record):
        tokens = np.flatnonzero(record.arrays["asym_id"] == number)
        stored = int(record.arrays["template_count"][tokens].max(initial=0))
        assert len(parsed.templates.get(chain_id, ())) == stored
    assert sum(map(len, parsed.templates.values())) == sum(
        int(record.arrays["template_count"][record.arrays["asym_id"] == number].max(initial=0))
        for number, _ in _protein_chains(record)
    )


@pytest.fixture(scope="module")
def dimer_cache(tmp_path_factory, shared_data):
    """A heterodimer whose chains' MSAs pair (7A4D's do not: their headers name no species):
    hemoglobin alpha and EGF as a FASTA target, each with the first rows of its UniRef90 MSA."""
    folder = tmp_path_factory.mktemp("dimer")
    (folder / "alignments").mkdir()
    queries = []
    for name in ("1a00_A", "1a3p_A"):
        records = (shared_data / "alignments" / "afdb" / name / "uniref90_hits.a3m").read_text().split("\n>")
        (folder / "alignments" / f"{name}.a3m").write_text("\n>".join(records[:1200]) + "\n")
        queries.append(records[0].split("\n")[1])
    (folder / "dimer.fasta").write_text(
        "".join(f">{chain} mol:protein\n{query}\n" for chain, query in zip("AB", queries))
    )
    summary = precompute(
        PrecomputeOptions(
            inputs=[folder / "dimer.fasta"],
            cache_dir=folder / "cache",
            alignments_dir=folder / "alignments",
            executor="inline",
            progress=False,
            clustering=ClusteringConfig(enabled=False),
        )
    )
    assert summary.stages["featurize"].done == 1, summary.format()
    with StoreReader(folder / "cache") as reader:
        record = decode_record(reader.get("features", "dimer"))
    assert record.arrays["msa_is_paired"][1:].sum() > 10
    return folder / "cache", record


def test_boltz_csv_has_boltz_columns_and_pairs_by_key(dimer_cache, tmp_path):
    """Boltz reads exactly the columns key and sequence (A3M rows, query first); rows of two chains
    with the same key are paired, -1 pairs with nothing (and is the query's: Boltz sets the queries
    side by side itself). A paired row's key is its assembled row, the same in both chains."""
    cache_dir, record = dimer_cache
    for output_format in ("a3m", "boltz-csv"):
        result = CliRunner().invoke(
            cli, ["export", str(cache_dir), "dimer", "--format", output_format, "--out", str(tmp_path / output_format)]
        )
        assert result.exit_code == 0, result.output
    paired = record.arrays["msa_is_paired"]
    assert sorted(path.name for path in (tmp_path / "boltz-csv" / "dimer").iterdir()) == ["A.csv", "B.csv"]
    keys_of_chain = {}
    for chain_id, sequence in zip("AB", record.meta["sequences"]):
        with open(tmp_path / "boltz-csv" / "dimer" / f"{chain_id}.csv", newline="") as handle:
            reader = csv.DictReader(handle)
            rows = list(reader)
        assert reader.fieldnames == ["key", "sequence"]
        keys = [int(row["key"]) for row in rows]  # integers, as Boltz reads them
        a3m_rows = re.findall(r">[^\n]*\n([^\n]*)", (tmp_path / "a3m" / "dimer" / f"{chain_id}.a3m").read_text())
        shown = [row for row, text in enumerate(a3m_rows) if row == 0 or re.search("[A-Z]", text)]
        assert len(shown) < len(a3m_rows)  # the other chain's own rows, all gaps here, are left out
        assert [row["sequence"] for row in rows] == [a3m_rows[row] for row in shown]
        assert rows[0]["sequence"] == sequence and keys[0] == -1
        assert keys[1:] == [row if paired[row] else -1 for row in shown[1:]]
        keys_of_chain[chain_id] = [key for key in keys if key != -1]
        assert len(set(keys_of_chain[chain_id])) == len(keys_of_chain[chain_id])  # once per chain
    # every row the record paired is a key both chains hold, so Boltz pairs exactly those rows
    assert keys_of_chain["A"] == keys_of_chain["B"] == (np.flatnonzero(paired[1:]) + 1).tolist()


def test_unknown_key_is_one_line_and_exit_2(cache, tmp_path):
    cache_dir, _ = cache
    result = CliRunner().invoke(
        cli, ["export", str(cache_dir), TARGET, "nope", "--format", "a3m", "--out", str(tmp_path / "o")]
    )
    assert result.exit_code == 2 and "'nope'" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "o").exists()  # nothing written when a key is missing


@pytest.mark.parametrize("output_format", ["af3-json", "protenix-json", "boltz-yaml"])
def test_a_record_from_before_schema_4_is_one_line_asking_for_precompute(cache, tmp_path, output_format):
    """Records written before they kept modified residues, ligand bonds and template dates cannot be
    written back as inputs: one line naming the record and the fix, nothing written."""
    cache_dir, record = cache
    old_cache = tmp_path / "cache"
    shutil.copytree(cache_dir, old_cache)
    meta = {
        name: value
        for name, value in record.meta.items()
        if name not in ("modified_residues", "ligand_bonds", "template_release_dates")
    }
    writer = StoreWriter(old_cache, StoreConfig(num_shards=read_manifest(old_cache).num_shards))
    try:
        writer.put(
            "features",
            TARGET,
            encode_record(TARGET, dict(record.arrays), meta, record.fingerprint, record.input_hash, 3, 0),
        )
    finally:
        writer.close()
    result = CliRunner().invoke(
        cli, ["export", str(old_cache), TARGET, "--format", output_format, "--out", str(tmp_path / "o")]
    )
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert f"record '{TARGET}' (schema version 3) lacks modified_residues" in result.output
    assert "rerun `featurecache precompute`" in result.output and not (tmp_path / "o").exists()
