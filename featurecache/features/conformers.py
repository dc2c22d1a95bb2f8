"""Reference conformers for featurization: CCD code -> chem.Conformer, each computed once.

Precompute computes every code's conformer once per cache (the ``conformers`` table) and hands
the featurizer the ones a target needs (`ReferenceConformers(chem, given=...)`); the online path
(no cache) computes them here, once per process. Which CCD code a residue's atoms come from is
decided here too (`reference_code`), so that precompute asks for exactly the codes featurization
will use. A ligand defined by SMILES (AF3 input JSON) is named by its reference "smiles:<canonical
SMILES>" wherever a CCD code would be, and its conformer comes from `chem.smiles_conformer`.
"""

from __future__ import annotations

from collections.abc import Mapping

from featurecache.chem import (
    Ccd,
    Component,
    Conformer,
    ConformerSettings,
    component_conformer,
    load_ccd,
    smiles_conformer,
)
from featurecache.config import ChemConfig
from featurecache.io.residues import UNKNOWN_RESIDUE
from featurecache.io.structure import Chain, Residue, Structure


def conformer_settings(chem: ChemConfig) -> ConformerSettings:
    return ConformerSettings(
        seed=chem.conformer_seed,
        max_iterations=chem.conformer_max_iterations,
        timeout_s=chem.conformer_timeout_s,
        force_field=chem.conformer_force_field,
        max_bond_deviation=chem.conformer_max_bond_deviation,
    )


SMILES_PREFIX = "smiles:"


def smiles_of(code: str) -> str | None:
    """The canonical SMILES of a "smiles:..." reference, None for a CCD code."""
    return code[len(SMILES_PREFIX) :] if code.startswith(SMILES_PREFIX) else None


def reference_code(ccd: Ccd, chain: Chain, residue: Residue) -> str | None:
    """The CCD code whose atoms a residue gets: its own; for an unresolved polymer residue the
    CCD does not know, its parent's (else the chain type's unknown residue's); None when the
    atoms can only come from the model (a resolved component the CCD does not define). A SMILES
    ligand's reference is "smiles:<canonical SMILES>"."""
    if residue.smiles:
        return SMILES_PREFIX + residue.smiles
    if residue.name in ccd:
        return residue.name
    if residue.is_resolved or not chain.is_polymer:
        return None
    for code in (residue.parent, UNKNOWN_RESIDUE[chain.molecule_type]):
        if code and code in ccd:
            return code
    return None


def needed_codes(structure: Structure, ccd: Ccd) -> set[str]:
    """Every CCD code whose conformer featurizing `structure` uses."""
    codes = {reference_code(ccd, chain, residue) for chain in structure.chains for residue in chain.residues}
    codes.discard(None)
    return codes


class ReferenceConformers:
    """The CCD of `chem` and the conformers of its codes: `given` ones (read from the cache)
    first, the rest computed on first use; `computed` lists the codes computed here."""

    def __init__(self, chem: ChemConfig = ChemConfig(), given: Mapping[str, Conformer] | None = None):
        try:
            self.ccd = load_ccd(chem.ccd_path)
        except FileNotFoundError as error:
            raise ValueError(str(error)) from None
        self.settings = conformer_settings(chem)
        self._conformers: dict[str, Conformer] = dict(given or {})
        self.computed: list[str] = []

    def component(self, code: str) -> Component:
        return self.ccd.component(code)

    def conformer(self, code: str) -> Conformer:
        found = self._conformers.get(code)
        if found is None:
            smiles = smiles_of(code)
            found = self._conformers[code] = (
                smiles_conformer(smiles, self.settings)
                if smiles is not None
                else component_conformer(self.ccd.component(code), self.settings)
            )
            self.computed.append(code)
        return found
