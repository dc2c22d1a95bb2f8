import numpy as np
import pytest

from featurecache.config import FeatureConfig, file_sha256
from featurecache import schema
from featurecache.chem import load_ccd
from featurecache.features.featurize import featurize_from_files, featurize_target
from featurecache.features.msa import expand_msa
from featurecache.io.alignments import AlignmentIndex
from featurecache.io.mmcif import read_mmcif

STRUCTURES = [
    "209d-assembly1.cif",
    "721p-assembly1.cif",
    "7a4d-assembly1.cif",
    "2q2k.cif",
    "AF-P01112-F1-model_v4.cif.gz",
]
CONFIG = FeatureConfig(msa_rows_stored=2048, max_paired_rows=512)


@pytest.fixture(scope="module")
def index(shared_data):
    return AlignmentIndex(shared_data / "alignments")


@pytest.fixture(scope="module")
def records(shared_data, index):
    return {
        name: featurize_from_files(
            shared_data / "structures" / name, index, CONFIG, shared_data / "templates" / "mmcif"
        )
        for name in STRUCTURES
    }


@pytest.mark.parametrize("name", STRUCTURES)
def test_every_structure_featurizes_to_the_schema(records, shared_data, name):
    arrays, metadata = records[name]
    schema.check_record(arrays, where=name)
    assert set(metadata) == set(schema.METADATA_FIELDS)
    assert metadata["source_hash"] == file_sha256(shared_data / "structures" / name)
    assert metadata["num_tokens"] == arrays["restype"].shape[0]
    assert metadata["num_atoms"] == arrays["atom_to_token"].shape[0]
    assert metadata["msa_depth"] == arrays["msa_species"].shape[0] <= CONFIG.msa_rows_stored
    assert len(metadata["chain_ids"]) == len(metadata["sequences"]) == arrays["asym_id"].max()
    np.testing.assert_array_equal(expand_msa(arrays, np.array([0]))[0][0], arrays["restype"])
    assert np.isfinite(arrays["atom_pos"]).all() and np.isfinite(arrays["msa_profile"]).all()
    assert (arrays["atom_to_token"] < metadata["num_tokens"]).all()


def test_metadata_of_each_target(records):
    assert records["721p-assembly1.cif"][1]["msa_depth"] == CONFIG.msa_rows_stored
    assert records["721p-assembly1.cif"][1]["warnings"] == []
    assert records["2q2k.cif"][1]["warnings"] == ["chain A: no alignment, query-only MSA"]
    af_metadata = records["AF-P01112-F1-model_v4.cif.gz"][1]
    assert af_metadata["resolution"] is None and af_metadata["id"] == "af-p01112-f1-model_v4"
    assert any("similarity" in w for w in af_metadata["warnings"])
    # PXA is residue 6 of the actinomycin peptide (its sequence lists it): no ligand chain of its own.
    assert records["209d-assembly1.cif"][1]["chain_ids"] == ["A", "B", "C"]


def test_af_model_and_721p_share_msa_rows(records):
    """H-Ras: the AlphaFold model uses 721p's MSA, mapped onto its longer sequence."""
    model, _ = records["AF-P01112-F1-model_v4.cif.gz"]
    crystal, _ = records["721p-assembly1.cif"]
    chain_a = crystal["asym_id"] == 1
    model_msa, crystal_msa = expand_msa(model)[0], expand_msa(crystal)[0]
    # The first 166 residues of the model line up with 721p chain A in the rows both kept.
    np.testing.assert_array_equal(model_msa[1:50, :166], crystal_msa[1:50][:, chain_a])
    assert (model_msa[1:, 166:] == schema.GAP).all()


def test_unknown_chain_in_inputs(shared_data):
    structure = read_mmcif(shared_data / "structures" / "2q2k.cif")
    with pytest.raises(ValueError, match=r"chains \['Z'\]"):
        featurize_target(structure, {"Z": None}, {}, CONFIG)


def test_without_alignments_every_chain_is_query_only(shared_data):
    arrays, metadata = featurize_from_files(shared_data / "structures" / "7a4d-assembly1.cif", None, CONFIG)
    assert arrays["msa_species"].shape[0] == 1 and arrays["msa_block"].shape[0] == 0 and metadata["num_templates"] == 0
    # Six protein chains in five entities: the capped peptides E and F are one entity.
    assert metadata["warnings"] == [f"chain {c}: no alignment, query-only MSA" for c in ("A", "B", "C", "D", "E, F")]


@pytest.mark.parametrize("name", ["1psm", "3u8v", "4zey", "5kc1"])
def test_template_structures_featurize_as_targets(shared_data, name):
    """NMR ensembles, waters, selenomethionine, a 12-chain mostly unresolved assembly."""
    arrays, metadata = featurize_from_files(shared_data / "templates" / "mmcif" / f"{name}.cif", None, CONFIG)
    schema.check_record(arrays, where=name)
    protein = arrays["is_protein"]
    # Standard protein tokens have their full atom table, resolved or not.
    assert (np.bincount(arrays["atom_to_token"], minlength=metadata["num_tokens"])[protein] >= 4).all()
    # Every resolved atom of a protein residue that its CCD entry lists (OXT only at the chain's
    # end) appears, masked in, in the record.
    structure = read_mmcif(shared_data / "templates" / "mmcif" / f"{name}.cif")
    ccd = load_ccd()

    def kept(chain, position, atom):
        residue = chain.residues[position]
        listed = ccd.component(residue.name).heavy_atoms().atom_names.tolist() if residue.name in ccd else []
        return atom in listed and (atom != "OXT" or position == len(chain.residues) - 1)

    expected = sum(
        sum(
            kept(chain, position, atom) and occupancy > 0
            for atom, occupancy in zip(residue.atom_names, residue.occupancies)
        )
        for chain in structure.chains
        if chain.molecule_type == "protein"
        for position, residue in enumerate(chain.residues)
    )
    assert arrays["atom_mask"][protein[arrays["atom_to_token"]]].sum() == expected


def test_input_warnings_are_in_the_record_metadata(tmp_path, monkeypatch):
    """Ambiguity codes of a FASTA chain and an over-long chain are warnings of the record."""
    from featurecache.features import tokenize as tokenize_module
    from featurecache.io.inputs import structure_from_fasta

    path = tmp_path / "ambiguous.fasta"
    path.write_text(">a mol:protein\nMKTAYIAKQRQISFVKSHFSRQB\n>b mol:rna\nGGACURYN\n")
    monkeypatch.setattr(tokenize_module, "LONG_CHAIN_RESIDUES", 20)
    _, metadata = featurize_target(structure_from_fasta(path), {}, {}, CONFIG)
    warnings = metadata["warnings"]
    assert "chain A: 1 B read as X (Asx: D or N)" in warnings
    assert "chain B: 1 R read as N (IUPAC ambiguity code), 1 Y read as N (IUPAC ambiguity code)" in warnings
    assert any(w.startswith("chain A: 23 residues, longer than 20") for w in warnings)
    assert not any(w.startswith("chain B: 8 residues") for w in warnings)
