"""Protenix 2.0's own input pipeline on a CPU, for tests of the files featurecache writes for it:
its JSON parser (protenix.data.inference.json_to_feature, the code `protenix pred` runs on each
job) and its MSA featurizer (pairing by species, protenix.data.msa).

Protenix reads the CCD from ``$PROTENIX_ROOT_DIR/common/components.cif`` and a pickle of RDKit
molecules beside it, files it downloads; `protenix_ccd` writes both for the codes a test needs
(testing/peer_ccd.py) and points Protenix's CCD module at them, as Protenix's own web service
does (protenix.web_service.colab_request_parser sets ccd.COMPONENTS_FILE / ccd.RKDIT_MOL_PKL).
Importing protenix.data.inference needs pandas and fair-esm (its ESM module is imported with it),
both in the test extra.
"""

from __future__ import annotations

import contextlib
import pickle
from pathlib import Path

import numpy as np

from featurecache.testing.peer_ccd import component_mask, component_molecule, write_components_cif

# The residues Protenix builds for sequence letters (json_parser's PROTEIN_1to3, DNA_1to3,
# RNA_1to3), including its unknown residues.
STANDARD_CODES = (
    "ALA",
    "ARG",
    "ASN",
    "ASP",
    "CYS",
    "GLN",
    "GLU",
    "GLY",
    "HIS",
    "ILE",
    "LEU",
    "LYS",
    "MET",
    "PHE",
    "PRO",
    "SER",
    "THR",
    "TRP",
    "TYR",
    "VAL",
    "UNK",
    "A",
    "G",
    "C",
    "U",
    "N",
    "DA",
    "DG",
    "DC",
    "DT",
    "DN",
)


def job_codes(job: dict) -> set[str]:
    """Every CCD code a Protenix job names (modifications and CCD ligands), plus the standard ones."""
    codes = set(STANDARD_CODES)
    for entry in job["sequences"]:
        ((kind, body),) = entry.items()
        if kind == "ligand" and body["ligand"].startswith("CCD_"):
            codes.update(body["ligand"][4:].split("_"))
        for modification in body.get("modifications", []):
            codes.add(next(value for key, value in modification.items() if key.endswith("Type"))[4:])
    return codes


def _protenix_molecule(code: str):
    """component_molecule with the attributes Protenix's pickle gives each molecule
    (ccd.get_ccd_ref_info reads atom_map, ref_mask and ref_conf_id)."""
    molecule = component_molecule(code)
    molecule.atom_map = {atom.GetProp("name"): atom.GetIdx() for atom in molecule.GetAtoms()}
    molecule.ref_mask = component_mask(code)
    molecule.ref_conf_id = molecule.GetConformer().GetId()
    return molecule


@contextlib.contextmanager
def protenix_ccd(codes, folder: Path):
    """Protenix's CCD module reading components.cif and the molecule pickle of `codes`, written
    under `folder`, inside the block (its caches cleared before and after)."""
    from protenix.data.core import ccd

    components, molecules = folder / "components.cif", folder / "components.cif.rdkit_mol.pkl"
    write_components_cif(codes, components)
    with open(molecules, "wb") as handle:
        pickle.dump({code: _protenix_molecule(code) for code in sorted(codes)}, handle)
    saved = ccd.COMPONENTS_FILE, ccd.RKDIT_MOL_PKL
    cached = (
        ccd.biotite_load_ccd_cif,
        ccd.get_component_atom_array,
        ccd.get_one_letter_code,
        ccd.get_mol_type,
        ccd.get_ccd_ref_info,
    )

    def clear() -> None:
        for function in cached:
            function.cache_clear()
        ccd._ccd_rdkit_mols.clear()

    clear()
    ccd.COMPONENTS_FILE, ccd.RKDIT_MOL_PKL = str(components), molecules
    try:
        yield
    finally:
        ccd.COMPONENTS_FILE, ccd.RKDIT_MOL_PKL = saved
        clear()


def protenix_features(job: dict, folder: Path) -> tuple[dict, object]:
    """(input features, biotite AtomArray) of one job of a Protenix JSON, as `protenix pred` makes
    them: the JSON parser, then the MSA features (pairing.a3m rows paired by species)."""
    from protenix.data.inference.json_to_feature import SampleDictToFeatures
    from protenix.data.msa.msa_featurizer import InferenceMSAFeaturizer

    with protenix_ccd(job_codes(job), folder):
        features, atom_array, _ = SampleDictToFeatures(job).get_feature_dict()
        msa = InferenceMSAFeaturizer.make_msa_feature(
            bioassembly=job["sequences"], atom_array=atom_array, msa_pair_as_unpair=False
        )
    return {**features, **msa}, atom_array


def residue_names(atom_array, chain_id: str) -> list[str]:
    """The residue names Protenix built for one chain, in order."""
    in_chain = atom_array[atom_array.chain_id == chain_id]
    _, first = np.unique(in_chain.res_id, return_index=True)
    return [str(name) for name in in_chain.res_name[np.sort(first)]]
