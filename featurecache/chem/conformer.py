"""Reference conformers: one 3D structure per CCD code or SMILES, for AF3's ref_pos.

AF3 (supplementary information §2.8) generates each component's reference conformer with
RDKit's ETKDGv3; when that fails it uses the CCD's ideal coordinates, then the CCD's model
coordinates (only for entries last changed before the training cutoff, since model
coordinates come from one PDB structure), and leaves any remaining atom at zero. This module
does the same with a fixed seed and an embedding timeout, and records which source was used
so that `stats` can count them.

Where this differs from AF3:
- `force_field="mmff"` (default) relaxes the ETKDG conformer with MMFF94 where MMFF has
  parameters for every atom: ETKDG alone leaves P-O bonds up to 0.1 A shorter than the CCD's
  ideal ones (ATP). `force_field="none"` is AF3's exact procedure.
- a component RDKit cannot fully sanitize (many metal complexes) takes the CCD's coordinates
  as in AF3, but is still embedded when the CCD has no coordinates for it at all.
- an RDKit conformer with a bond more than `max_bond_deviation` longer or shorter than in the
  CCD's coordinates (ideal, else model; when either gives every heavy atom) is replaced by those
  coordinates. ETKDG and MMFF know no metal-ligand geometry: iridium hexammine (IRI) came out with
  Ir-N bonds of 1.44-2.70 A against 2.26 A, an Fe-S cluster (FES) with Fe-S of 2.59 against 2.20,
  cobalamin (B12) with Co-N of 2.67 against 1.91. `Conformer.fallback` says why a conformer's
  positions are not RDKit's, so that `stats` can count each reason.
- one fixed seed, so the conformer can be cached; AF3's per-sample random rotation and
  translation of ref_pos is drawn by the loader (features/conformer_augmentation.py, called from
  loader.crop_sample; SampleConfig.augment_conformers).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
from rdkit import Chem, rdBase
from rdkit.Chem import AllChem

from featurecache.chem.ccd import HYDROGEN, Component, bonds_among
from featurecache.chem.molecule import molecule_from_component, molecule_from_smiles

# Where a conformer's positions came from.
SOURCES = ("rdkit", "ccd_ideal", "ccd_model", "none")
# Why they are not an RDKit conformer (Conformer.fallback; None when they are): RDKit could not
# fully sanitize the molecule (AF3 then takes the CCD's coordinates), ETKDG found no conformer,
# or the conformer's bond lengths differ from the CCD's by more than max_bond_deviation.
FALLBACK_REASONS = ("not_sanitized", "embedding_failed", "bond_lengths")
FORCE_FIELDS = ("mmff", "none")
# MMFF iterations: enough for bond lengths and angles to settle from an ETKDG start.
_MMFF_MAX_ITERATIONS = 500


@dataclass(frozen=True)
class ConformerSettings:
    """Everything that changes a generated conformer; all of it goes into the cache key."""

    seed: int = 0  # ETKDG random seed
    max_iterations: int = 0  # ETKDG embedding attempts; 0: RDKit's default (10 x atoms)
    timeout_s: int = 10  # ETKDG gives up after this many seconds per fragment; 0: never
    force_field: str = "mmff"  # FORCE_FIELDS: relax the ETKDG conformer, or not (AF3)
    # CCD model coordinates are used only for entries modified before this ISO date (AF3:
    # its training cutoff, as they come from one PDB entry); None: always.
    model_coordinates_before: str | None = None
    # Angstrom: an RDKit conformer whose bond lengths differ from the CCD coordinates' by more
    # gives way to them; inf: never. Over 383 random CCD components without metals, ETKDG + MMFF
    # bonds were within 0.15 A of the CCD ideal ones in 99% and within 0.2 A in all but two
    # (one a macrocycle's Z double bond stretched to 1.56 A); in metal complexes the median
    # component's worst metal bond was 0.29 A off.
    max_bond_deviation: float = 0.2

    def __post_init__(self):
        if self.force_field not in FORCE_FIELDS:
            raise ValueError(f"force_field {self.force_field!r} is not one of {FORCE_FIELDS}")
        if not self.max_bond_deviation > 0:  # also refuses NaN
            raise ValueError(f"max_bond_deviation must be > 0 Angstrom (inf: no check), got {self.max_bond_deviation}")
        for name in ("seed", "max_iterations", "timeout_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")


@dataclass(frozen=True, eq=False)
class Conformer:
    """Heavy atoms of one component or SMILES ligand with their reference positions.

    Atoms are in CCD order (leaving atoms included; `without` drops them) or, for SMILES, in
    canonical SMILES order. `mask` is False where no position is known (left at 0).
    """

    name: str  # CCD code, or canonical SMILES
    kind: str  # "ccd" or "smiles"
    atom_names: np.ndarray  # [A] str
    elements: np.ndarray  # [A] int8 atomic number
    charges: np.ndarray  # [A] int8 formal charge
    positions: np.ndarray  # [A, 3] float32, Angstrom
    mask: np.ndarray  # [A] bool, position known
    bonds: np.ndarray  # [B, 2] int32 atom indices
    bond_orders: np.ndarray  # [B] int8 (1, 2, 3, 4; 0 other)
    source: str  # SOURCES
    sanitization: str  # molecule.SANITIZATION_LEVELS
    fallback: str | None  # FALLBACK_REASONS: why the positions are not RDKit's; None if they are

    def __post_init__(self):
        if self.source not in SOURCES:
            raise ValueError(f"conformer source {self.source!r} is not one of {SOURCES}")
        if self.fallback is not None and self.fallback not in FALLBACK_REASONS:
            raise ValueError(f"conformer fallback {self.fallback!r} is not one of {FALLBACK_REASONS}")
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, np.ndarray):
                value.flags.writeable = False

    @property
    def num_atoms(self) -> int:
        return len(self.atom_names)

    def without(self, names) -> Conformer:
        """The conformer without the named atoms (e.g. linking.link_drop_atoms(...))."""
        keep = ~np.isin(self.atom_names, list(names))
        bonds, bond_kept = bonds_among(self.bonds, keep)
        return dataclasses.replace(
            self,
            atom_names=self.atom_names[keep],
            elements=self.elements[keep],
            charges=self.charges[keep],
            positions=self.positions[keep],
            mask=self.mask[keep],
            bonds=bonds,
            bond_orders=self.bond_orders[bond_kept],
        )


def component_conformer(component: Component, settings: ConformerSettings = ConformerSettings()) -> Conformer:
    """Reference conformer of a whole CCD entry (as `Ccd.component` returns it)."""
    if not component.is_complete:
        raise ValueError(f"CCD {component.code}: a conformer needs the complete entry, hydrogens included")
    molecule, sanitization = molecule_from_component(component)
    heavy = ~component.is_hydrogen
    atoms = component.heavy_atoms()
    positions, mask, source = _ccd_positions(component, settings)
    # As AF3: a molecule RDKit cannot sanitize takes the CCD's coordinates when there are any.
    if sanitization != "full" and source != "none":
        fallback = "not_sanitized"
    else:
        embedded = _embed(molecule, settings, optimize=sanitization == "full")
        if embedded is None:
            fallback = "embedding_failed" if heavy.any() else None  # no atoms (UNL): nothing failed
        elif (
            source != "none"
            and mask.all()  # only a full CCD set can take the conformer's place
            and bond_length_deviation(embedded[heavy], positions, atoms.bonds) > settings.max_bond_deviation
        ):
            fallback = "bond_lengths"
        else:
            positions, mask, source, fallback = embedded[heavy], np.ones(int(heavy.sum()), bool), "rdkit", None
    return Conformer(
        name=component.code,
        kind="ccd",
        atom_names=atoms.atom_names,
        elements=atoms.elements,
        charges=atoms.charges,
        positions=positions.astype(np.float32),
        mask=mask,
        bonds=atoms.bonds,
        bond_orders=atoms.bond_orders,
        source=source,
        sanitization=sanitization,
        fallback=fallback,
    )


def bond_length_deviation(positions: np.ndarray, reference: np.ndarray, bonds: np.ndarray) -> float:
    """Largest |bond length in `positions` - bond length in `reference`| over `bonds` [B, 2],
    Angstrom (positions and reference: [A, 3]); 0 without bonds."""
    if len(bonds) == 0:
        return 0.0
    lengths = np.linalg.norm(positions[bonds[:, 0]] - positions[bonds[:, 1]], axis=1)
    reference_lengths = np.linalg.norm(reference[bonds[:, 0]] - reference[bonds[:, 1]], axis=1)
    return float(np.abs(lengths - reference_lengths).max())


def smiles_conformer(smiles: str, settings: ConformerSettings = ConformerSettings()) -> Conformer:
    """Reference conformer of a SMILES ligand; atoms named as AF3 names them ("C1", "O2").

    Raises molecule.SmilesError naming the SMILES if RDKit cannot read it. Without CCD
    coordinates to fall back on, a failed embedding gives source "none" (all masked).
    """
    canonical, molecule, names = molecule_from_smiles(smiles)
    heavy = np.array([atom.GetAtomicNum() != HYDROGEN for atom in molecule.GetAtoms()], bool)
    positions = _embed(molecule, settings, optimize=True)
    if positions is None:
        positions, mask, source = np.zeros((int(heavy.sum()), 3)), np.zeros(int(heavy.sum()), bool), "none"
        fallback = "embedding_failed"
    else:
        positions, mask, source, fallback = positions[heavy], np.ones(int(heavy.sum()), bool), "rdkit", None
    heavy_index = np.cumsum(heavy) - 1
    Chem.Kekulize(molecule, clearAromaticFlags=False)  # orders 1/2/3 like the CCD's
    bonds, orders = [], []
    for bond in molecule.GetBonds():
        first, second = bond.GetBeginAtomIdx(), bond.GetEndAtomIdx()
        if heavy[first] and heavy[second]:
            bonds.append((heavy_index[first], heavy_index[second]))
            orders.append(_bond_order(bond))
    return Conformer(
        name=canonical,
        kind="smiles",
        atom_names=np.array(names, dtype=str)[heavy],
        elements=np.array([a.GetAtomicNum() for a in molecule.GetAtoms()], np.int8)[heavy],
        charges=np.array([a.GetFormalCharge() for a in molecule.GetAtoms()], np.int8)[heavy],
        positions=positions.astype(np.float32),
        mask=mask,
        bonds=np.array(bonds, np.int32).reshape(-1, 2),
        bond_orders=np.array(orders, np.int8),
        source=source,
        sanitization="full",
        fallback=fallback,
    )


def _bond_order(bond: Chem.Bond) -> int:
    bond_type = bond.GetBondType()
    if bond_type == Chem.BondType.DATIVE:  # AF3 treats dative bonds as single
        return 1
    return {Chem.BondType.SINGLE: 1, Chem.BondType.DOUBLE: 2, Chem.BondType.TRIPLE: 3, Chem.BondType.QUADRUPLE: 4}.get(
        bond_type, 0
    )


def _embed(molecule: Chem.Mol, settings: ConformerSettings, optimize: bool) -> np.ndarray | None:
    """[atoms, 3] ETKDGv3 positions (MMFF-relaxed if asked and possible), or None on failure."""
    if molecule.GetNumAtoms() == 0:
        return None
    molecule = Chem.Mol(molecule)
    parameters = AllChem.ETKDGv3()
    parameters.randomSeed = settings.seed
    parameters.maxIterations = settings.max_iterations
    parameters.timeout = settings.timeout_s
    parameters.numThreads = 1  # one thread per worker; keeps results reproducible
    with rdBase.BlockLogs():
        try:
            conformer_id = AllChem.EmbedMolecule(molecule, parameters)
        except (ValueError, RuntimeError):  # RDKit raises for some unsanitizable molecules
            return None
        if conformer_id < 0:
            return None
        if optimize and settings.force_field == "mmff" and AllChem.MMFFHasAllMoleculeParams(molecule):
            AllChem.MMFFOptimizeMolecule(molecule, confId=conformer_id, maxIters=_MMFF_MAX_ITERATIONS)
    return molecule.GetConformer(conformer_id).GetPositions()


def _ccd_positions(component: Component, settings: ConformerSettings) -> tuple[np.ndarray, np.ndarray, str]:
    """AF3's fallback: heavy-atom ([A, 3], mask, source) from CCD ideal, else model coordinates.

    A source with every heavy atom wins, ideal first; otherwise the one that has more atoms;
    "none" if neither has any.
    """
    heavy = ~component.is_hydrogen
    candidates = [("ccd_ideal", component.ideal_pos[heavy], ~component.ideal_missing[heavy])]
    cutoff = settings.model_coordinates_before
    if cutoff is None or (component.modified_date and component.modified_date < cutoff):
        candidates.append(("ccd_model", component.model_pos[heavy], ~component.model_missing[heavy]))
    complete = [c for c in candidates if c[2].all()]
    source, positions, mask = complete[0] if complete else max(candidates, key=lambda c: c[2].sum())
    if not mask.any():
        return np.zeros((int(heavy.sum()), 3), np.float32), np.zeros(int(heavy.sum()), bool), "none"
    return positions.copy(), mask.copy(), source
