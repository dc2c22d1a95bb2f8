"""AlphaFold 3 input JSON (io/af3_json.py, io/inputs.read_input): the Structure, the given MSAs,
and one line naming the file and the JSON field for each kind of bad input."""

from __future__ import annotations

import copy
import json

import gemmi
import numpy as np
import pytest

from featurecache.chem import canonical_smiles
from featurecache.io.af3_json import read_af3_json
from featurecache.io.common import ParseError
from featurecache.io.inputs import discover_inputs, read_input, target_id_for

ASPIRIN = "CC(=O)Oc1ccccc1C(=O)O"
MSA = ">query\nMKSNGTLLA\n>hit1 organism A\nMKSN-TLLA\n>hit2\nMRaSNGTLLV\n"


def document(**changes) -> dict:
    base = {
        "name": "Complex",
        "modelSeeds": [1, 2],
        "dialect": "alphafold3",
        "version": 2,
        "sequences": [
            {
                "protein": {
                    "id": ["A", "B"],
                    "sequence": "MKSNGTLLA",
                    "modifications": [{"ptmType": "SEP", "ptmPosition": 3}],
                    "unpairedMsa": MSA,
                    "pairedMsa": "",
                }
            },
            {"rna": {"id": "R", "sequence": "AGCU", "modifications": [{"modificationType": "PSU", "basePosition": 4}]}},
            {"dna": {"id": "D", "sequence": "GACT"}},
            {"ligand": {"id": "L", "smiles": ASPIRIN}},
            {"ligand": {"id": "G", "ccdCodes": ["NAG", "NAG"]}},
        ],
        "bondedAtomPairs": [[["A", 4, "ND2"], ["G", 1, "C1"]], [["G", 1, "O4"], ["G", 2, "C1"]]],
    }
    base.update(changes)
    return base


def write(tmp_path, content, name="Complex.json"):
    path = tmp_path / name
    path.write_text(content if isinstance(content, str) else json.dumps(content, indent=1))
    return path


def test_chains_residues_modifications_ligands_and_bonds(tmp_path):
    path = write(tmp_path, document())
    assert target_id_for(path) == "complex" and discover_inputs([tmp_path]) == [path]
    parsed = read_input(path)
    structure = parsed.structure
    assert structure.id == "complex"
    assert [(c.chain_id, c.molecule_type) for c in structure.chains] == [
        ("A", "protein"),
        ("B", "protein"),
        ("R", "rna"),
        ("D", "dna"),
        ("L", "ligand"),
        ("G", "ligand"),
    ]
    protein = structure.chain("A")
    assert [r.name for r in protein.residues] == ["MET", "LYS", "SEP", "ASN", "GLY", "THR", "LEU", "LEU", "ALA"]
    assert protein.residues[2].parent == "SER" and protein.sequence == "MKSNGTLLA"
    assert [r.seq_id for r in protein.residues] == list(range(1, 10))
    assert not any(r.is_resolved for chain in structure.chains for r in chain.residues)
    assert [r.name for r in structure.chain("R").residues] == ["A", "G", "C", "PSU"]
    assert [r.name for r in structure.chain("D").residues] == ["DG", "DA", "DC", "DT"]
    (smiles_residue,) = structure.chain("L").residues
    assert smiles_residue.name == "UNL" and smiles_residue.smiles == canonical_smiles(ASPIRIN)
    assert [r.name for r in structure.chain("G").residues] == ["NAG", "NAG"]
    # Copies of one entity share its entity id; each entry of "sequences" is one entity.
    assert structure.chain("A").entity_id == structure.chain("B").entity_id == "1"
    first, second = structure.bonds
    assert (first.first.chain_id, first.first.residue, first.first.atom) == ("A", 3, "ND2")
    assert (first.second.chain_id, first.second.residue, first.second.atom) == ("G", 0, "C1")
    assert (second.first.residue, second.second.residue) == (0, 1) and first.kind == "covale"


def test_given_msas(tmp_path):
    parsed = read_input(write(tmp_path, document()))
    assert set(parsed.msas) == {"A", "B"}  # RNA without an MSA is left to the search
    given = parsed.msas["A"]
    assert given.msa.depth == 3 and given.msa.length == 9 and given.msa.query == "MKSNGTLLA"
    assert given.msa.deletion_matrix[2].tolist() == [0, 0, 1, 0, 0, 0, 0, 0, 0]
    assert given.origin == "input JSON unpairedMsa (3 rows)"

    # "" for both: query only; a file named relative to the JSON; paired rows come first.
    (tmp_path / "msas").mkdir()
    (tmp_path / "msas" / "a.a3m").write_text(MSA)
    entries = copy.deepcopy(document()["sequences"][:1])
    entries[0]["protein"].update(unpairedMsa="", pairedMsa="")
    empty = write(tmp_path, document(sequences=entries, bondedAtomPairs=[]), "empty.json")
    assert read_input(empty).msas["A"].msa is None
    del entries[0]["protein"]["unpairedMsa"]
    entries[0]["protein"].update(unpairedMsaPath="msas/a.a3m", pairedMsa=">q\nMKSNGTLLA\n>paired\nMKSNGTLLM\n")
    combined = read_input(write(tmp_path, document(sequences=entries, bondedAtomPairs=[]), "both.json")).msas["A"]
    assert combined.msa.depth == 4 and combined.msa.descriptions == ("q", "paired", "hit1 organism A", "hit2")
    assert combined.origin == "input JSON pairedMsa + unpairedMsaPath msas/a.a3m (4 rows)"


def _set(path: str, value):
    """A document with the value at a dotted path replaced ('sequences.3.ligand.smiles')."""
    changed = document()
    *parents, last = path.split(".")
    node = changed
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    if value is _DELETE:
        del node[int(last) if isinstance(node, list) else last]
    else:
        node[int(last) if isinstance(node, list) else last] = value
    return changed


_DELETE = object()

BAD_DOCUMENTS = [
    ("sequences.3.ligand.smiles", "C1CC((", r"sequences\[3\]\.ligand\.smiles: cannot parse SMILES 'C1CC\(\('"),
    (
        "sequences.4.ligand.ccdCodes",
        ["NAG", "XYZ12"],
        r"sequences\[4\]\.ligand\.ccdCodes\[1\]: unknown CCD code 'XYZ12'",
    ),
    (
        "sequences.0.protein.modifications.0.ptmPosition",
        10,
        r"sequences\[0\]\.protein\.modifications\[0\]\.ptmPosition: position 10 is outside the sequence \(1-9\)",
    ),
    (
        "sequences.0.protein.modifications.0.ptmType",
        "NOPE1",
        r"sequences\[0\]\.protein\.modifications\[0\]\.ptmType: unknown CCD code 'NOPE1'",
    ),
    (
        "bondedAtomPairs.0.1",
        ["G", 1, "XX"],
        r"bondedAtomPairs\[0\]\[1\]: residue 1 of chain G \(NAG\) has no atom 'XX'",
    ),
    ("bondedAtomPairs.0.1", ["Q", 1, "C1"], r"bondedAtomPairs\[0\]\[1\]: no chain 'Q'"),
    ("bondedAtomPairs.0.1", ["L", 1, "C1"], r"bondedAtomPairs\[0\]\[1\]: chain L is a SMILES ligand"),
    ("bondedAtomPairs.1.1", ["G", 3, "C1"], r"bondedAtomPairs\[1\]\[1\]: chain G has no residue 3 \(1-2\)"),
    ("sequences.2.dna.sequence", "GAXT", r"sequences\[2\]\.dna\.sequence: invalid character 'X' at position 3"),
    ("sequences.3.ligand.id", "A", r"sequences\[3\]\.ligand\.id: chain id 'A' is already used by sequences\[0\]"),
    ("sequences.4.ligand.smiles", "CCO", r"sequences\[4\]\.ligand: needs exactly one of ccdCodes and smiles"),
    ("sequences.0.protein.pairedMsa", _DELETE, r"sequences\[0\]\.protein\.pairedMsa: must be set too"),
    (
        "sequences.0.protein.unpairedMsa",
        ">q\nMKSNG\n",
        r"sequences\[0\]\.protein\.unpairedMsa: the first sequence must be the query",
    ),
    ("sequences.0.protein.unpairedMsa", "MKSNGTLLA\n", r"sequences\[0\]\.protein\.unpairedMsa: not A3M"),
    ("sequences.0.protein.color", "red", r"sequences\[0\]\.protein\.color: unknown field"),
    ("sequences.1.rna.description", "x", r"sequences\[1\]\.rna\.description: needs \"version\": 4 or later"),
    ("modelSeeds", [], r"modelSeeds: needs at least one seed"),
    ("dialect", "alphafoldserver", r"dialect: must be 'alphafold3'"),
    ("version", 7, r"version: must be one of 1, 2, 3, 4"),
    ("version", 2.0, r"version: must be one of 1, 2, 3, 4, got 2\.0"),
    ("name", _DELETE, r"name: must be a string, got null"),
    ("userCCD", "data_X\n", r"userCCD: a user-provided CCD is not supported"),
    (
        "sequences.0.protein.templates",
        [{"mmcif": "data_x\n", "queryIndices": [0, 1], "templateIndices": [0]}],
        r"sequences\[0\]\.protein\.templates\[0\]\.mmcif: not a readable mmCIF: no _atom_site records",
    ),
]


@pytest.mark.parametrize(
    "field, value, message", BAD_DOCUMENTS, ids=[case[0] + str(i) for i, case in enumerate(BAD_DOCUMENTS)]
)
def test_bad_documents_name_the_file_and_the_field(tmp_path, field, value, message):
    path = write(tmp_path, _set(field, value))
    with pytest.raises(ParseError, match=f"^{path}: {message}") as caught:
        read_input(path)
    assert "\n" not in str(caught.value)


def test_malformed_json_gives_line_and_column(tmp_path):
    path = write(tmp_path, '{"name": "x",\n  "modelSeeds": [1]\n  "dialect": "alphafold3"}')
    with pytest.raises(ParseError, match=rf"^{path}: malformed JSON at line 3, column 3: Expecting ',' delimiter$"):
        read_input(path)
    server = write(tmp_path, json.dumps([{"name": "x", "sequences": []}]), "server.json")
    with pytest.raises(ParseError, match=r"AlphaFold Server dialect"):
        read_input(server)


def single_chain_mmcif(path, chain: str) -> str:
    """The mmCIF text of one chain of a structure file (AF3 templates hold one chain)."""
    structure = gemmi.read_structure(str(path))
    for model in structure:
        for name in [c.name for c in model if c.name != chain]:
            model.remove_chain(name)
    structure.setup_entities()
    return structure.make_mmcif_document().as_string()


def test_templates_are_read_and_checked(tmp_path, shared_data):
    ras = shared_data / "structures" / "721p-assembly1.cif"
    templates = [{"mmcif": single_chain_mmcif(ras, "A"), "queryIndices": [0, 1, 2], "templateIndices": [4, 5, 6]}]
    parsed = read_af3_json(write(tmp_path, _set("sequences.0.protein.templates", templates)), "complex")
    (template,) = parsed.templates["A"]
    assert template.chain.sequence.startswith("MTEYKLVVVGAGGVGKSALTIQ") and template.chain.molecule_type == "protein"
    assert np.array_equal(template.hit.hit_indices, [4, 5, 6]) and np.array_equal(template.hit.query_indices, [0, 1, 2])
    assert template.hit.name == "input_json_0_A" and parsed.templates["B"] == parsed.templates["A"]
    assert parsed.model_seeds == (1, 2) and parsed.name == "Complex"
    # "templates": [] is template-free (AF3); no "templates" leaves them to the search.
    template_free = write(tmp_path, _set("sequences.0.protein.templates", []))
    assert read_af3_json(template_free, "c").templates == {"A": (), "B": ()}
    assert read_af3_json(write(tmp_path, document()), "c").templates == {}

    # AF3 refuses a template file with more than one chain; indices must fall inside both chains.
    two_chains = [{"mmcifPath": str(ras), "queryIndices": [0], "templateIndices": [0]}]
    with pytest.raises(ParseError, match=r"templates\[0\]\.mmcifPath: must hold exactly one protein chain .* has 2"):
        read_af3_json(write(tmp_path, _set("sequences.0.protein.templates", two_chains)), "complex")
    templates[0]["templateIndices"] = [4, 5, 500]
    with pytest.raises(ParseError, match=r"templates\[0\]\.templateIndices: index 500 is outside the template chain"):
        read_af3_json(write(tmp_path, _set("sequences.0.protein.templates", templates)), "complex")
