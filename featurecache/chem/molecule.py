"""RDKit molecules from CCD components and from SMILES strings.

A component's molecule keeps the CCD's atom order with every hydrogen explicit (as the CCD
lists them), so conformer positions map back to CCD atoms by index. Its stereo centres and
double-bond geometry come from the CCD's coordinates, because the CCD's bond table alone does
not say whether an amino acid is L or D.
"""

from __future__ import annotations

from rdkit import Chem, rdBase

from featurecache.chem.ccd import Component

# How far RDKit's sanitization got: "full" (valences checked, aromaticity perceived),
# "no_valence_check" (everything but the valence check, which fails for many metal
# complexes), "none" (ring information only).
SANITIZATION_LEVELS = ("full", "no_valence_check", "none")

_RDKIT_BOND_TYPES = {
    1: Chem.BondType.SINGLE,
    2: Chem.BondType.DOUBLE,
    3: Chem.BondType.TRIPLE,
    4: Chem.BondType.QUADRUPLE,
    0: Chem.BondType.UNSPECIFIED,
}


class SmilesError(ValueError):
    """A SMILES string RDKit cannot read."""


def molecule_from_component(component: Component) -> tuple[Chem.Mol, str]:
    """(molecule with every atom of `component` in CCD order, sanitization level)."""
    editable = Chem.RWMol()
    for element, charge in zip(component.elements.tolist(), component.charges.tolist()):
        atom = Chem.Atom(element)
        atom.SetFormalCharge(charge)
        atom.SetNoImplicit(True)  # the CCD lists every hydrogen
        editable.AddAtom(atom)
    for (first, second), order in zip(component.bonds.tolist(), component.bond_orders.tolist()):
        editable.AddBond(first, second, _RDKIT_BOND_TYPES[order])
    molecule, level = sanitize(editable.GetMol())
    _assign_stereo_from_ccd(molecule, component)
    return molecule, level


def sanitize(molecule: Chem.Mol) -> tuple[Chem.Mol, str]:
    """A sanitized copy of `molecule` and the SANITIZATION_LEVELS entry RDKit reached."""
    attempts = (
        ("full", Chem.SanitizeFlags.SANITIZE_ALL),
        ("no_valence_check", Chem.SanitizeFlags.SANITIZE_ALL ^ Chem.SanitizeFlags.SANITIZE_PROPERTIES),
    )
    with rdBase.BlockLogs():
        for level, operations in attempts:
            candidate = Chem.Mol(molecule)
            try:
                Chem.SanitizeMol(candidate, operations)
            except (ValueError, RuntimeError):  # RDKit's sanitize exceptions are ValueErrors
                continue
            candidate.UpdatePropertyCache(strict=False)
            return candidate, level
        candidate = Chem.Mol(molecule)
        candidate.UpdatePropertyCache(strict=False)
        Chem.FastFindRings(candidate)  # the embedder needs ring information
        return candidate, "none"


def _assign_stereo_from_ccd(molecule: Chem.Mol, component: Component) -> None:
    """Set chirality and E/Z from the CCD's ideal (else model) coordinates, if complete."""
    complete = [
        positions
        for positions, missing in (
            (component.ideal_pos, component.ideal_missing),
            (component.model_pos, component.model_missing),
        )
        if not missing.any()
    ]
    if not component.num_atoms or not complete:
        return
    positions = complete[0]
    conformer = Chem.Conformer(component.num_atoms)
    for index, position in enumerate(positions.tolist()):
        conformer.SetAtomPosition(index, position)
    conformer_id = molecule.AddConformer(conformer, assignId=True)
    with rdBase.BlockLogs():
        try:
            Chem.AssignStereochemistryFrom3D(molecule, confId=conformer_id)
        except (ValueError, RuntimeError):
            pass  # stereo stays unassigned; the embedder then picks any
    molecule.RemoveAllConformers()


def canonical_smiles(smiles: str) -> str:
    """RDKit's canonical isomeric SMILES; raises SmilesError naming the SMILES if unreadable."""
    return Chem.MolToSmiles(_parse_smiles(smiles))


def molecule_from_smiles(smiles: str) -> tuple[str, Chem.Mol, list[str]]:
    """(canonical SMILES, molecule with explicit hydrogens, atom names).

    The molecule is read from the canonical SMILES, so two spellings of one molecule give the
    same atom order and names. Names follow AF3: element symbol in upper case plus a running
    count per element in atom order ("C1", "C2", "O1", "CL1"); hydrogens are added last.
    """
    canonical = canonical_smiles(smiles)
    molecule = Chem.AddHs(_parse_smiles(canonical))
    counts: dict[str, int] = {}
    names = []
    for atom in molecule.GetAtoms():
        symbol = atom.GetSymbol().upper()
        counts[symbol] = counts.get(symbol, 0) + 1
        names.append(f"{symbol}{counts[symbol]}")
    return canonical, molecule, names


def _parse_smiles(smiles: str) -> Chem.Mol:
    with rdBase.BlockLogs():
        molecule = Chem.MolFromSmiles(smiles, sanitize=False) if smiles.strip() else None
        if molecule is None:
            raise SmilesError(f"cannot parse SMILES {smiles!r}: not valid SMILES syntax")
        try:
            Chem.SanitizeMol(molecule)
        except (ValueError, RuntimeError) as error:
            raise SmilesError(f"cannot parse SMILES {smiles!r}: {error}") from None
    return molecule
