"""Reference conformers in the cache: computed once per CCD code across targets and runs, their
sources counted in `stats`, and records of another schema version recomputed or refused."""

import json

import numpy as np
import pytest

from click.testing import CliRunner

from featurecache.chem import conformer_from_arrays, decode_atom_names
from featurecache.cli import cli
from featurecache.loader import CacheDataset
from featurecache.precompute.pipeline import PipelineSetupError, PrecomputeOptions, precompute
from featurecache.schema import CONFORMERS_TABLE, SCHEMA_VERSION
from featurecache.config import StoreConfig
from featurecache.store.codec import decode_record, encode_record
from featurecache.store.inspect import cache_stats, format_stats
from featurecache.store.manifest import read_manifest
from featurecache.store.reader import StoreReader
from featurecache.store.writer import StoreWriter
from tests.conftest import copy_sample_structures


def _options(inputs, cache, **changes):
    return PrecomputeOptions(inputs=inputs, cache_dir=cache, executor="inline", progress=False, **changes)


def _codes(cache):
    with StoreReader(cache) as reader:
        return [decode_record(blob).meta["name"] for _, blob in reader.items(CONFORMERS_TABLE)]


@pytest.fixture
def inputs(tmp_path, shared_data):
    folder = copy_sample_structures(("209d-assembly1.cif", "2q2k.cif"), tmp_path / "inputs")
    # 721p with its GNP renamed FEM (a ferrocene RDKit cannot embed): its atoms all come from
    # FEM's CCD entry (masked where GNP has no atom of that name), with CCD ideal coordinates as
    # their reference.
    text = (shared_data / "structures" / "721p-assembly1.cif").read_text()
    (tmp_path / "later").mkdir()
    (tmp_path / "later" / "721p-fem.cif").write_text(text.replace(" GNP ", " FEM "))
    return folder


def test_each_code_is_computed_once_across_targets_and_runs(tmp_path, inputs):
    cache = tmp_path / "cache"
    first = precompute(_options([inputs], cache))
    assert first.failed == 0, first.format()
    codes = _codes(cache)
    # Both DNA duplexes use DA, DC, DG and DT: one record each, computed once.
    assert len(codes) == len(set(codes)) and {"DA", "DC", "DG", "DT", "PXA", "5IU"} <= set(codes)
    assert first.stages["conformers"].done == len(codes) and first.stages["conformers"].skipped == 0
    manifest = read_manifest(cache)
    assert manifest.counts[CONFORMERS_TABLE] == len(codes)

    # A later run adds a target: codes already cached are reused, only its new ones computed.
    later = precompute(_options([inputs, tmp_path / "later"], cache))
    assert later.stages["featurize"].done == 1 and later.stages["featurize"].skipped == 2
    added = set(_codes(cache)) - set(codes)
    assert later.stages["conformers"].done == len(added) and {"FEM", "MG"} <= added
    assert later.stages["conformers"].skipped >= 10  # amino acids 2q2k's protein already brought
    assert "GLY" not in added and len(_codes(cache)) == len(set(_codes(cache)))

    # The record's ref_pos is the stored conformer of each code.
    with StoreReader(cache) as reader:
        record = decode_record(reader.get("features", "721p-fem"))
        fem = next(
            decode_record(blob)
            for _, blob in reader.items(CONFORMERS_TABLE)
            if decode_record(blob).meta["name"] == "FEM"
        )
    conformer = conformer_from_arrays(fem.arrays, fem.meta)
    assert fem.meta["source"] == "ccd_ideal"
    names = decode_atom_names(record.arrays["ref_atom_name_chars"])
    ligand_atoms = record.arrays["is_ligand"][record.arrays["atom_to_token"]]
    first_fem = np.flatnonzero(ligand_atoms & (names == conformer.atom_names[0]))[0]
    np.testing.assert_allclose(
        record.arrays["ref_pos"][first_fem : first_fem + conformer.num_atoms], conformer.positions
    )
    # Only the GNP atoms whose names FEM also has are placed; the rest of FEM's atoms are masked.
    assert 0 < record.arrays["atom_mask"][first_fem : first_fem + conformer.num_atoms].sum() < conformer.num_atoms
    assert "FEM" in record.meta["conformer_codes"]

    # stats counts the sources: the ferrocene fell back to CCD ideal coordinates.
    report = cache_stats(cache)
    sources = report["conformer_sources"]
    assert sum(sources.values()) == len(_codes(cache)) and sources["ccd_ideal"] >= 1 and sources["rdkit"] > 10
    text = format_stats(report)
    assert f"conformers   rdkit {sources['rdkit']}, ccd_ideal {sources['ccd_ideal']}" in text
    assert report["conformer_fallbacks"] == {"embedding_failed": 1}  # FEM; the sample's other codes keep RDKit's
    assert "; fallbacks embedding_failed 1" in text

    # `show` prints the new arrays of a feature record and a conformer record.
    runner = CliRunner()
    shown = runner.invoke(cli, ["show", str(cache), "721p-fem"])
    assert shown.exit_code == 0, shown.output
    for name in (
        "ref_pos",
        "ref_mask",
        "ref_element",
        "ref_charge",
        "ref_atom_name_chars",
        "ref_space_uid",
        "token_bonds",
        "distogram_atom_index",
        "frame_atom_index",
    ):
        assert f"  {name} " in shown.output
    key = next(key for key, entry in read_manifest(cache).index[CONFORMERS_TABLE].items() if entry["code"] == "FEM")
    shown = runner.invoke(cli, ["show", str(cache), key, "--table", "conformers"])
    assert shown.exit_code == 0 and "meta.source" in shown.output and "ccd_ideal" in shown.output


def test_conformer_settings_key_new_records(tmp_path, inputs):
    cache = tmp_path / "cache"
    precompute(_options([inputs], cache))
    config = tmp_path / "pipeline.toml"
    config.write_text("[chem]\nconformer_seed = 7\n")
    summary = precompute(_options([inputs], cache, config_path=config))
    # New settings: every conformer and every record is recomputed under new keys.
    assert summary.stages["featurize"].done == 2 and summary.stages["conformers"].skipped == 0
    assert len(_codes(cache)) == 2 * summary.stages["conformers"].done


def test_v1_cache_is_refused_by_the_loader_and_recomputed_by_precompute(tmp_path, inputs):
    cache = tmp_path / "cache"
    precompute(_options([inputs], cache))
    manifest = cache / "manifest.json"
    data = json.loads(manifest.read_text())
    data["schema_version"] = 1
    manifest.write_text(json.dumps(data))
    with pytest.raises(
        ValueError, match=rf"schema_version 1, expected {SCHEMA_VERSION}: .*rerun `featurecache precompute`"
    ):
        CacheDataset(cache)
    # A record written under schema 1 (its fingerprint hashed schema 1) is stale: recomputed.
    with StoreReader(cache) as reader:
        old = decode_record(reader.get("features", "2q2k"))
    writer = StoreWriter(cache, StoreConfig(num_shards=read_manifest(cache, expected_schema=None).num_shards))
    try:
        writer.put(
            "features",
            "2q2k",
            encode_record("2q2k", dict(old.arrays), dict(old.meta), "v1-fingerprint", old.input_hash, 1, 0),
        )
    finally:
        writer.close()
    summary = precompute(_options([inputs], cache))
    assert summary.stages["featurize"].done == 1 and summary.stages["featurize"].skipped == 1
    assert read_manifest(cache).schema_version == SCHEMA_VERSION
    with StoreReader(cache) as reader:
        assert decode_record(reader.get("features", "2q2k")).schema_version == SCHEMA_VERSION
    assert len(CacheDataset(cache, crop_size=None)) == 2


@pytest.mark.parametrize("content", [None, "not a CIF file\n"])
def test_bad_ccd_path_is_one_setup_error(tmp_path, inputs, content):
    ccd = tmp_path / "components.cif"
    if content is not None:
        ccd.write_text(content)
    config = tmp_path / "pipeline.toml"
    config.write_text(f'[chem]\nccd_path = "{ccd.name}"\n')
    with pytest.raises(PipelineSetupError, match=r"^--ccd / \[chem\] ccd_path: CCD file .*components.cif"):
        precompute(_options([inputs], tmp_path / "cache", config_path=config))


def test_a_users_components_cif_gives_its_own_conformer_keys(tmp_path):
    """--ccd: a components.cif with the entries 209d uses (written from real CCD entries); the
    conformers are keyed by that file's version, apart from the bundled CCD's."""
    from tests.chem._components import write_components_cif

    folder = copy_sample_structures("209d-assembly1.cif", tmp_path / "inputs")
    ccd = tmp_path / "components.cif.gz"
    codes = ["DA", "DC", "DG", "DT", "THR", "DVA", "PRO", "SAR", "MVA", "PXA"]
    write_components_cif(ccd, codes)
    cache = tmp_path / "cache"
    precompute(_options([folder], cache))
    bundled = set(read_manifest(cache).index[CONFORMERS_TABLE])
    result = CliRunner().invoke(
        cli,
        [
            "precompute",
            str(folder),
            "--cache",
            str(cache),
            "--ccd",
            str(ccd),
            "--executor",
            "inline",
            "--no-progress",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output[result.output.index("{") :])
    assert summary["stages"]["featurize"]["done"] == 1  # the CCD changed: the record is recomputed
    index = read_manifest(cache).index[CONFORMERS_TABLE]
    own = {key for key in index if key not in bundled}
    assert sorted(index[key]["code"] for key in own) == sorted(codes)
    assert summary["stages"]["conformers"]["done"] == len(codes)


def _metal_ligands_json() -> dict:
    """An AF3 input JSON: a short peptide with iridium hexammine (IRI, as in PDB 4gxy), heme and ATP."""
    ligands = [
        {"ligand": {"id": chain, "ccdCodes": [code]}} for chain, code in (("I", "IRI"), ("H", "HEM"), ("T", "ATP"))
    ]
    return {
        "name": "metals",
        "modelSeeds": [1],
        "dialect": "alphafold3",
        "version": 1,
        "sequences": [
            {"protein": {"id": "A", "sequence": "MKTAYIA", "unpairedMsa": ">query\nMKTAYIA\n", "pairedMsa": ""}},
            *ligands,
        ],
    }


def test_metal_complexes_take_ccd_coordinates_and_stats_counts_why(tmp_path):
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    (inputs / "metals.json").write_text(json.dumps(_metal_ligands_json()))
    cache = tmp_path / "cache"
    first = precompute(_options([inputs], cache))
    assert first.failed == 0, first.format()
    index = read_manifest(cache).index[CONFORMERS_TABLE]
    by_code = {entry["code"]: entry for entry in index.values()}
    assert (by_code["IRI"]["source"], by_code["IRI"]["fallback"]) == ("ccd_model", "bond_lengths")
    assert (by_code["HEM"]["source"], by_code["HEM"]["fallback"]) == ("ccd_ideal", "bond_lengths")
    assert (by_code["ATP"]["source"], by_code["ATP"]["fallback"]) == ("rdkit", None)

    # The feature record's reference positions for IRI have the CCD's Ir-N bonds (2.24-2.27 A).
    with StoreReader(cache) as reader:
        record = decode_record(reader.get("features", "metals"))
    iridium = np.flatnonzero(record.arrays["ref_element"] == 77)
    nitrogens = iridium[0] + 1 + np.arange(6)  # IRI's atoms in CCD order: IR, N1..N6
    names = decode_atom_names(record.arrays["ref_atom_name_chars"][nitrogens]).tolist()
    assert names == [f"N{i}" for i in range(1, 7)]
    ir_n = np.linalg.norm(record.arrays["ref_pos"][nitrogens] - record.arrays["ref_pos"][iridium[0]], axis=1)
    assert np.all(np.abs(ir_n - 2.255) < 0.02), ir_n

    report = cache_stats(cache)
    assert report["conformer_fallbacks"] == {"bond_lengths": 2}
    shown = CliRunner().invoke(cli, ["stats", str(cache)])
    assert shown.exit_code == 0, shown.output
    assert "; fallbacks bond_lengths 2" in shown.output

    # Turning the check off is a new conformer setting: new keys, RDKit's conformers, recomputed records.
    config = tmp_path / "pipeline.toml"
    config.write_text("[chem]\nconformer_max_bond_deviation = inf\n")
    unchecked = precompute(_options([inputs], cache, config_path=config))
    assert unchecked.stages["conformers"].skipped == 0 and unchecked.stages["featurize"].done == 1
    new = [entry for key, entry in read_manifest(cache).index[CONFORMERS_TABLE].items() if key not in index]
    ligands = {"IRI", "HEM", "ATP"}
    assert {entry["code"]: (entry["source"], entry["fallback"]) for entry in new if entry["code"] in ligands} == {
        code: ("rdkit", None) for code in ligands
    }
