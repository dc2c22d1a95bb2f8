"""AlphaFold 3 input JSON targets through `featurecache precompute` (the real CLI, inline
executor): tokens, CCD and SMILES atoms, token bonds with the bonded pair, SMILES conformers in
the conformers table, MSAs given in the JSON used instead of a search, and one error line per
bad file while the rest of the batch is cached."""

from __future__ import annotations

import json

import numpy as np
from click.testing import CliRunner

from featurecache.chem import canonical_smiles, conformer_key, decode_atom_names, load_ccd, smiles_conformer
from featurecache import schema
from featurecache.cli import cli
from featurecache.config import ChemConfig
from featurecache.features.conformers import conformer_settings
from featurecache.schema import CONFORMERS_TABLE
from featurecache.store.codec import decode_record
from featurecache.store.reader import StoreReader

ASPIRIN = "CC(=O)Oc1ccccc1C(=O)O"
PROTEIN = "MKSNGTLLA"  # S3 phosphorylated (SEP), N4 glycosylated (NAG)
MSA = f">query\n{PROTEIN}\n>hit1\nMKSN-TLLA\n>hit2\nMRaSNGTLLV\n"


def _complex() -> dict:
    return {
        "name": "complex",
        "modelSeeds": [1],
        "dialect": "alphafold3",
        "version": 1,
        "sequences": [
            {
                "protein": {
                    "id": "A",
                    "sequence": PROTEIN,
                    "modifications": [{"ptmType": "SEP", "ptmPosition": 3}],
                    "unpairedMsa": MSA,
                    "pairedMsa": "",
                }
            },
            {"rna": {"id": "R", "sequence": "AGCU"}},
            {"ligand": {"id": "L", "smiles": ASPIRIN}},
            {"ligand": {"id": "G", "ccdCodes": ["NAG"]}},
        ],
        "bondedAtomPairs": [[["A", 4, "ND2"], ["G", 1, "C1"]]],
    }


def _run(inputs, cache, *extra):
    return CliRunner().invoke(
        cli, ["precompute", str(inputs), "--cache", str(cache), "--executor", "inline", "--no-progress", *extra]
    )


def _heavy_names(code: str, drop=()) -> list[str]:
    names = load_ccd().component(code).heavy_atoms().atom_names.tolist()
    return [name for name in names if name not in drop]


def test_af3_json_complex_precomputes_with_smiles_ligand_modification_and_bond(tmp_path):
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    (inputs / "complex.json").write_text(json.dumps(_complex()))
    cache = tmp_path / "cache"
    result = _run(inputs, cache)
    assert result.exit_code == 0, result.output
    with StoreReader(cache) as reader:
        record = decode_record(reader.get("features", "complex"))
        conformers = {
            decode_record(blob).meta["name"]: (key, decode_record(blob).meta)
            for key, blob in reader.items(CONFORMERS_TABLE)
        }
    arrays, meta = record.arrays, record.meta
    names = decode_atom_names(arrays["ref_atom_name_chars"]).tolist()
    asym = arrays["asym_id"]

    # Protein: 8 standard residues (one token each) and SEP tokenized per atom (its CCD atoms,
    # OXT dropped inside the chain); RNA: 4 tokens; aspirin: 13 heavy atoms; NAG without O1
    # (its leaving atom, as C1 is bonded).
    sep_atoms = _heavy_names("SEP", drop=("OXT",))
    aspirin = smiles_conformer(ASPIRIN)
    nag_atoms = _heavy_names("NAG", drop=("O1",))
    assert np.bincount(asym).tolist() == [0, 8 + len(sep_atoms), 4, 13, len(nag_atoms)]
    atom_chain = asym[arrays["atom_to_token"]]
    sep_tokens = np.flatnonzero((asym == 1) & (arrays["residue_index"] == 3))
    assert [names[atom] for atom in np.flatnonzero(np.isin(arrays["atom_to_token"], sep_tokens))] == sep_atoms
    smiles_names = [names[atom] for atom in np.flatnonzero(atom_chain == 3)]
    assert smiles_names == aspirin.atom_names.tolist() and smiles_names[:3] == ["C1", "C2", "O1"]
    assert arrays["ref_element"][atom_chain == 3].tolist() == aspirin.elements.tolist()
    assert arrays["ref_mask"][atom_chain == 3].all() and arrays["is_ligand"][asym == 3].all()
    assert [names[atom] for atom in np.flatnonzero(atom_chain == 4)] == nag_atoms
    assert not arrays["atom_mask"].any()  # nothing is resolved: a sequence-only target

    # Token bonds: the bonded pair (ASN 4 of A to NAG C1), aspirin's own 13 bonds, NAG's ring.
    bonds = {tuple(pair) for pair in arrays["token_bonds"].tolist()}
    asn = int(np.flatnonzero((asym == 1) & (arrays["residue_index"] == 4))[0])
    nag_c1 = int(arrays["atom_to_token"][np.flatnonzero((atom_chain == 4) & (np.array(names) == "C1"))[0]])
    assert (asn, nag_c1) in bonds
    aspirin_tokens = np.flatnonzero(asym == 3)
    assert sum(1 for i, j in bonds if i in aspirin_tokens and j in aspirin_tokens) == len(aspirin.bonds) == 13

    # The SMILES conformer is in the conformers table under its canonical SMILES' key.
    canonical = canonical_smiles(ASPIRIN)
    key, conformer_meta = conformers[canonical]
    assert key == conformer_key(ASPIRIN, conformer_settings(ChemConfig()))
    assert conformer_meta["kind"] == "smiles" and conformer_meta["source"] == "rdkit"
    assert f"smiles:{canonical}" in meta["conformer_codes"] and "SEP" in meta["conformer_codes"]

    # The protein's MSA is the JSON's (3 rows), the RNA's is the query alone; the metadata says so.
    assert meta["msa_sources"] == {"A": "input JSON unpairedMsa (3 rows)", "R": "query only (no alignment files)"}
    assert meta["msa_depth"] == 3

    # A second spelling of aspirin in another target reuses the stored conformer.
    other = _complex()
    other["sequences"][2]["ligand"]["smiles"] = "OC(=O)c1ccccc1OC(C)=O"
    (inputs / "other.json").write_text(json.dumps(other))
    again = _run(inputs, cache, "--json")
    assert again.exit_code == 0, again.output
    summary = json.loads(again.output)
    assert summary["stages"]["conformers"]["done"] == 0 and summary["stages"]["featurize"]["done"] == 1


def test_given_msa_is_the_chain_msa(tmp_path, shared_data):
    """unpairedMsaPath names a real A3M (relative to the JSON): the record's MSA is its rows."""
    a3m = (shared_data / "alignments" / "pdb" / "721p-assembly1A_protein.a3m").read_text()
    records = a3m.split(">")[1:201]
    (tmp_path / "ras.a3m").write_text("".join(">" + record for record in records))
    query = "".join(records[0].splitlines()[1:])
    document = {
        "name": "ras",
        "modelSeeds": [7],
        "dialect": "alphafold3",
        "version": 2,
        "sequences": [{"protein": {"id": "A", "sequence": query, "unpairedMsaPath": "ras.a3m", "pairedMsa": ""}}],
    }
    (tmp_path / "ras.json").write_text(json.dumps(document))
    cache = tmp_path / "cache"
    result = _run(tmp_path / "ras.json", cache)
    assert result.exit_code == 0, result.output
    with StoreReader(cache) as reader:
        record = decode_record(reader.get("features", "ras"))
    unique_rows = len({"".join(c for c in "".join(r.splitlines()[1:]) if not c.islower()) for r in records})
    assert record.meta["msa_depth"] == unique_rows
    assert record.meta["msa_sources"] == {"A": f"input JSON unpairedMsaPath ras.a3m ({len(records)} rows)"}

    # The record is current until the MSA file changes (the input hash covers the files a JSON names).
    assert json.loads(_run(tmp_path / "ras.json", cache, "--json").output)["stages"]["featurize"]["skipped"] == 1
    (tmp_path / "ras.a3m").write_text("".join(">" + record for record in records[:50]))
    rerun = _run(tmp_path / "ras.json", cache, "--json")
    assert json.loads(rerun.output)["stages"]["featurize"]["done"] == 1, rerun.output
    with StoreReader(cache) as reader:
        assert decode_record(reader.get("features", "ras")).meta["msa_sources"]["A"].endswith("(50 rows)")


def test_given_templates_are_the_chain_templates(tmp_path, shared_data, ras_sequence):
    """A template given as a one-chain mmCIF (721P chain A for H-Ras, residues 11-110 mapped to
    themselves) is the record's only template of the chain: its residues and backbone."""
    from tests.io.test_af3_json import single_chain_mmcif

    mapped = list(range(10, 110))
    template = {
        "mmcif": single_chain_mmcif(shared_data / "structures" / "721p-assembly1.cif", "A"),
        "queryIndices": mapped,
        "templateIndices": mapped,
    }
    document = {
        "name": "ras",
        "modelSeeds": [1],
        "dialect": "alphafold3",
        "version": 1,
        "sequences": [
            {
                "protein": {
                    "id": "A",
                    "sequence": ras_sequence,
                    "unpairedMsa": "",
                    "pairedMsa": "",
                    "templates": [template],
                }
            }
        ],
    }
    (tmp_path / "ras.json").write_text(json.dumps(document))
    cache = tmp_path / "cache"
    result = _run(tmp_path / "ras.json", cache)
    assert result.exit_code == 0, result.output
    with StoreReader(cache) as reader:
        record = decode_record(reader.get("features", "ras"))
    arrays, meta = record.arrays, record.meta
    assert meta["template_names"] == ["A:input_json_0_A"] and meta["warnings"] == []
    assert arrays["template_restype"].shape == (1, len(ras_sequence)) and (arrays["template_count"] == 1).all()
    covered = np.zeros(len(ras_sequence), bool)
    covered[mapped] = True
    assert np.array_equal(arrays["template_restype"][0][covered], arrays["restype"][covered])  # same protein
    assert (arrays["template_restype"][0][~covered] == schema.GAP).all()
    assert np.array_equal(arrays["template_backbone_mask"][0].all(axis=1), covered)
    assert meta["msa_sources"] == {"A": 'input JSON: MSA set to "" (query only)'} and meta["msa_depth"] == 1


BAD = {
    "broken": (
        '{"name": "x",\n "modelSeeds": [1]\n "dialect": "alphafold3"}',
        "broken.json: malformed JSON at line 3, column 2: Expecting ',' delimiter",
    ),
    "unknown_ccd": (
        ("ligand", {"id": "Z", "ccdCodes": ["NOTACODE"]}),
        "sequences[4].ligand.ccdCodes[0]: unknown CCD code 'NOTACODE'",
    ),
    "bad_smiles": (
        ("ligand", {"id": "Z", "smiles": "c1ccc(cc1"}),
        "sequences[4].ligand.smiles: cannot parse SMILES 'c1ccc(cc1'",
    ),
    "bad_position": (
        ("protein", {"id": "Z", "sequence": "MKV", "modifications": [{"ptmType": "SEP", "ptmPosition": 4}]}),
        "sequences[4].protein.modifications[0].ptmPosition: position 4 is outside the sequence (1-3)",
    ),
}


def test_bad_files_give_one_line_each_and_the_batch_finishes(tmp_path):
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    (inputs / "good.json").write_text(json.dumps(_complex()))
    for name, (content, _) in BAD.items():
        if isinstance(content, tuple):
            document = _complex()
            document["sequences"].append({content[0]: content[1]})
            content = json.dumps(document)
        (inputs / f"{name}.json").write_text(content)
    cache = tmp_path / "cache"
    result = _run(inputs, cache)
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    failed = [line for line in result.output.splitlines() if "FAILED" in line]
    assert len(failed) == len(BAD)
    for name, (_, message) in BAD.items():
        (line,) = [line for line in failed if f" {name}: " in line]
        assert line.strip().startswith(f"FAILED parse {name}: ") and message in line, line
    with StoreReader(cache) as reader:
        assert decode_record(reader.get("features", "good")).arrays["restype"].shape[0] > 0
        errors = {key: decode_record(blob).meta for key, blob in reader.items("errors")}
    assert sorted(errors) == sorted(f"parse/{name}" for name in BAD)


def test_search_mode_searches_only_chains_without_a_given_msa(tmp_path, test_databases, ras_sequence):
    from featurecache.testing.testdb import write_pipeline_config

    config = write_pipeline_config(test_databases, tmp_path / "pipeline.toml", threads=1)
    document = {
        "name": "pair",
        "modelSeeds": [1],
        "dialect": "alphafold3",
        "version": 1,
        "sequences": [
            {"protein": {"id": "A", "sequence": PROTEIN, "unpairedMsa": MSA, "pairedMsa": ""}},
            {"protein": {"id": "B", "sequence": ras_sequence}},
        ],
    }
    (tmp_path / "pair.json").write_text(json.dumps(document))
    cache = tmp_path / "cache"
    result = _run(tmp_path / "pair.json", cache, "--config", str(config), "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["stages"]["search"]["done"] == 1  # chain B only
    with StoreReader(cache) as reader:
        meta = decode_record(reader.get("features", "pair")).meta
    assert meta["msa_sources"]["A"] == "input JSON unpairedMsa (3 rows)"
    assert meta["msa_sources"]["B"].startswith("search (msa/")
