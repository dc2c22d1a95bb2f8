"""Boltz 2.2's own input parsers on a CPU, for tests of the files featurecache writes for it:
`boltz.data.parse.yaml.parse_yaml` (the input YAML, through parse_boltz_schema, as `boltz predict`
runs it) and `boltz.data.parse.csv.parse_csv` (an MSA CSV).

Boltz installs without its pins (setup.sh: ``pip install --no-deps boltz==2.2.0``); its parsers
import with what the test extra adds (pandas, biopython, mashumaro, chembl_structure_pipeline,
scikit-learn). It reads each residue's and ligand's RDKit molecule from ``<mol_dir>/<code>.pkl``,
a folder it downloads; `boltz_mol_dir` writes the codes a test needs (testing/peer_ccd.py).
"""

from __future__ import annotations

import pickle
from pathlib import Path

from rdkit import Chem

from featurecache.testing.peer_ccd import component_molecule

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


def input_codes(schema: dict) -> set[str]:
    """Every CCD code a Boltz input names (modifications, CCD ligands), plus the standard ones."""
    codes = set(STANDARD_CODES)
    for entry in schema["sequences"]:
        ((kind, body),) = entry.items()
        if kind == "ligand" and "ccd" in body:
            codes.update([body["ccd"]] if isinstance(body["ccd"], str) else body["ccd"])
        codes.update(modification["ccd"] for modification in body.get("modifications", []))
    return codes


def boltz_mol_dir(codes, folder: Path) -> Path:
    """A Boltz molecule folder holding `codes`, their atom and conformer properties pickled too
    (RDKit pickles none by default; Boltz's files carry them)."""
    folder.mkdir(parents=True, exist_ok=True)
    saved = Chem.GetDefaultPickleProperties()
    Chem.SetDefaultPickleProperties(Chem.PropertyPickleOptions.AllProps)
    try:
        for code in codes:
            with open(folder / f"{code}.pkl", "wb") as handle:
                pickle.dump(component_molecule(code), handle)
    finally:
        Chem.SetDefaultPickleProperties(saved)
    return folder


def parse_boltz_input(path: Path, folder: Path):
    """Boltz's Target (structure tables, the chains' MSA paths) of the input YAML at `path`, as
    Boltz 2 parses it."""
    import yaml
    from boltz.data.parse.yaml import parse_yaml

    schema = yaml.safe_load(path.read_text())
    mol_dir = boltz_mol_dir(input_codes(schema), folder / "mols")
    return parse_yaml(path, {}, mol_dir, boltz2=True)


def parse_boltz_msa(path: Path):
    """Boltz's MSA (residues, deletions, sequences with their pairing keys) of a CSV or A3M file."""
    from boltz.data.parse.a3m import parse_a3m
    from boltz.data.parse.csv import parse_csv

    return parse_csv(path) if path.suffix == ".csv" else parse_a3m(path, taxonomy=None)
