"""`featurecache export` as inputs of other tools, over every sample and bonded structure of
../shared/data (modified DNA and peptide residues, ligands, glycans bonded to asparagine and to
each other, capped peptides, a predicted model):

- the AlphaFold 3 JSON precomputed again gives the record it came from: the same chains, tokens,
  atoms and token bonds;
- Protenix's own JSON parser (the code `protenix pred` runs) builds the same residues, tokens and
  atoms from the exported Protenix JSON;
- Boltz's own YAML parser builds the same residues and bonds from the exported Boltz YAML.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml
from boltz.data import const
from click.testing import CliRunner

from featurecache import schema
from featurecache.cli import cli
from featurecache.config import ClusteringConfig
from featurecache.io.af3_json_writer import renamed_chains
from featurecache.io.residues import read_sequence
from featurecache.precompute.pipeline import PrecomputeOptions, precompute
from featurecache.store.codec import decode_record
from featurecache.store.reader import StoreReader
from featurecache.testing.boltz_inputs import parse_boltz_input, parse_boltz_msa
from featurecache.testing.protenix_inputs import protenix_features, residue_names
from tests.precompute.test_search_command import check_af3_input

STRUCTURES = (
    "structures/209d-assembly1.cif",
    "structures/721p-assembly1.cif",
    "structures/7a4d-assembly1.cif",
    "structures/2q2k.cif",
    "structures/AF-P01112-F1-model_v4.cif.gz",
    "bonded/1igy.cif",
    "bonded/1ncb.cif",
    "bonded/5h73.cif",
)
KEYS = tuple(path.split("/")[1].split(".")[0].lower() for path in STRUCTURES)


def _precompute(inputs, cache_dir):
    summary = precompute(
        PrecomputeOptions(
            inputs=list(inputs),
            cache_dir=cache_dir,
            executor="inline",
            progress=False,
            clustering=ClusteringConfig(enabled=False),
        )
    )
    assert summary.stages["featurize"].done == len(inputs), summary.format()
    with StoreReader(cache_dir) as reader:
        return {key: decode_record(reader.get(schema.FEATURES_TABLE, key)) for key in KEYS}


@pytest.fixture(scope="module")
def exported(tmp_path_factory, shared_data):
    """Every structure precomputed, exported as AF3 JSON, and the JSON files precomputed again."""
    root = tmp_path_factory.mktemp("export_inputs")
    records = _precompute([shared_data / path for path in STRUCTURES], root / "cache")
    result = CliRunner().invoke(
        cli, ["export", str(root / "cache"), *KEYS, "--format", "af3-json", "--out", str(root / "af3")]
    )
    assert result.exit_code == 0, result.output
    again = _precompute([root / "af3" / f"{key}.json" for key in KEYS], root / "again")
    return root, records, again


def _chain_tokens(record, number: int) -> np.ndarray:
    return np.flatnonzero(record.arrays["asym_id"] == number)


def _chain_view(record, number: int) -> dict:
    """What a chain is made of, independent of its place in the target: its tokens and atoms."""
    arrays = record.arrays
    tokens = _chain_tokens(record, number)
    atoms = np.flatnonzero(np.isin(arrays["atom_to_token"], tokens))
    view = {
        name: arrays[name][tokens]
        for name in ("restype", "residue_index", "is_protein", "is_rna", "is_dna", "is_ligand")
    }
    view.update({name: arrays[name][atoms] for name in ("ref_atom_name_chars", "ref_element", "ref_charge")})
    view["atom_token"] = arrays["atom_to_token"][atoms] - tokens[0]
    return view


def _token_bonds(record, chain_names: dict[str, str]) -> set:
    """Token bonds as ((chain, token within the chain), (chain, token within the chain)) pairs."""
    arrays = record.arrays
    chain_ids = record.meta["chain_ids"]
    first = {number: _chain_tokens(record, number)[0] for number in range(1, len(chain_ids) + 1)}
    ends = lambda token: (
        chain_names[chain_ids[arrays["asym_id"][token] - 1]],  # noqa: E731
        int(token - first[arrays["asym_id"][token]]),
    )
    return {tuple(sorted((ends(i), ends(j)))) for i, j in arrays["token_bonds"]}


@pytest.mark.slow
@pytest.mark.parametrize("key", KEYS)
def test_af3_json_precomputed_again_gives_the_same_record(exported, key):
    root, records, again = exported
    record, reread = records[key], again[key]
    check_af3_input(json.loads((root / "af3" / f"{key}.json").read_text()))
    chain_ids = record.meta["chain_ids"]
    af3_ids = {chain_id: renamed_chains(chain_ids).get(chain_id, chain_id) for chain_id in chain_ids}
    assert sorted(reread.meta["chain_ids"]) == sorted(af3_ids.values())
    number_of = {chain_id: number for number, chain_id in enumerate(reread.meta["chain_ids"], start=1)}
    for number, chain_id in enumerate(chain_ids, start=1):
        before, after = _chain_view(record, number), _chain_view(reread, number_of[af3_ids[chain_id]])
        for name, values in before.items():
            np.testing.assert_array_equal(after[name], values, err_msg=f"{key} chain {chain_id}: {name}")
    assert record.meta["num_atoms"] == reread.meta["num_atoms"]
    assert _token_bonds(record, af3_ids) == _token_bonds(reread, {new: new for new in af3_ids.values()})
    # what the export is for: modified residues and bonds to ligands survive
    assert reread.meta["modified_residues"] == [
        record.meta["modified_residues"][chain_ids.index(source)] for source in _sources(reread, af3_ids)
    ]
    assert len(reread.meta["ligand_bonds"]) == len(record.meta["ligand_bonds"])


def _sources(reread, af3_ids):
    source_of = {new: source for source, new in af3_ids.items()}
    return [source_of[chain_id] for chain_id in reread.meta["chain_ids"]]


def test_the_samples_hold_every_kind_of_residue_export_must_keep(exported):
    _, records, _ = exported
    modified = {code for record in records.values() for chain in record.meta["modified_residues"] for _, code in chain}
    # 2q2k's 5-iodo-dU, 209d's D-valine, sarcosine, N-methyl-valine and PXA, 7a4d's caps
    assert {"5IU", "DVA", "SAR", "MVA", "PXA"} <= modified
    assert sum(len(record.meta["ligand_bonds"]) for record in records.values()) > 20  # glycans of 1igy, 1ncb


def _residue_codes(record, number: int) -> list[str]:
    """The CCD code of each residue of a chain, from the record's sequence and modifications."""
    kind, sequence = record.meta["chain_types"][number - 1], record.meta["sequences"][number - 1]
    if kind == "ligand":
        return [code for code in sequence.strip("()").split(")(")]
    codes = list(read_sequence(sequence, kind).residues)
    for position, code in record.meta["modified_residues"][number - 1]:
        codes[position - 1] = code
    return codes


@pytest.mark.slow
@pytest.mark.parametrize("key", ["209d-assembly1", "2q2k", "721p-assembly1", "1igy", "5h73"])
def test_protenix_parser_builds_the_record_from_the_protenix_json(exported, key, tmp_path, recwarn):
    root, records, _ = exported
    record = records[key]
    result = CliRunner().invoke(
        cli, ["export", str(root / "cache"), key, "--format", "protenix-json", "--out", str(tmp_path)]
    )
    assert result.exit_code == 0, result.output
    document = json.loads((tmp_path / f"{key}.protenix.json").read_text())
    assert isinstance(document, list) and len(document) == 1  # Protenix: a non-empty top-level list of jobs
    features, atom_array = protenix_features(document[0], tmp_path)
    af3_ids = renamed_chains(record.meta["chain_ids"])
    for number, chain_id in enumerate(record.meta["chain_ids"], start=1):
        assert residue_names(atom_array, af3_ids.get(chain_id, chain_id)) == _residue_codes(record, number), chain_id
    assert features["msa"].shape[1] == features["token_index"].shape[0]
    # The same atoms and tokens, but where Protenix's own chemistry differs: a residue whose CCD
    # entry has no peptide-link atoms (209d's PXA) loses every leaving atom there, with a warning.
    if not any("all leaving atoms will be removed" in str(warning.message) for warning in recwarn):
        assert features["token_index"].shape[0] == record.meta["num_tokens"]
        assert features["atom_to_token_idx"].shape[0] == record.meta["num_atoms"]
    else:
        assert key == "209d-assembly1"


@pytest.mark.slow
@pytest.mark.parametrize("key", ["209d-assembly1", "2q2k", "1igy", "5h73"])
def test_boltz_parser_builds_the_residues_and_bonds_from_the_boltz_yaml(exported, key, tmp_path):
    root, records, _ = exported
    record = records[key]
    result = CliRunner().invoke(
        cli, ["export", str(root / "cache"), key, "--format", "boltz-yaml", "--out", str(tmp_path / "out")]
    )
    assert result.exit_code == 0, result.output
    path = tmp_path / "out" / f"{key}.yaml"
    target = parse_boltz_input(path, tmp_path)
    structure = target.structure
    af3_ids = renamed_chains(record.meta["chain_ids"])
    for number, chain_id in enumerate(record.meta["chain_ids"], start=1):
        (chain,) = [chain for chain in structure.chains if chain["name"] == af3_ids.get(chain_id, chain_id)]
        residues = structure.residues[chain["res_idx"] : chain["res_idx"] + chain["res_num"]]
        assert [str(name) for name in residues["name"]] == _residue_codes(record, number), chain_id
    covalent = structure.bonds["type"] == const.bond_type_ids["COVALENT"]  # the YAML's bond constraints
    assert covalent.sum() == len(record.meta["ligand_bonds"])
    proteins = [entry["protein"] for entry in yaml.safe_load(path.read_text())["sequences"] if "protein" in entry]
    for protein in proteins:  # every protein's MSA a CSV that Boltz's own reader takes
        msa = parse_boltz_msa(tmp_path / "out" / protein["msa"])
        assert len(msa.sequences) >= 1
