"""Curation: AlphaFold 3's PDB filters (SI 2.5.4), applied to a parsed Structure before featurizing.

`curate(structure, config)` is a pure function. It either leaves the whole target out (a target
filter: release date, resolution, too many polymer chains, or no chain left) or returns the
structure with chains and ligand residues removed, each removal listed with its reason:

- ``unknown_polymer``: a polymer chain of unknown residues only;
- ``few_resolved_residues``: a polymer chain with fewer than `min_resolved_residues` resolved
  (structures with coordinates only: a sequence-only target keeps its chains);
- ``clash``: of two chains with more than `clash_fraction` of one's atoms within
  `clash_distance` of the other's, the one with the larger fraction goes (ties: the one with
  fewer atoms, then the later chain), pair by pair in chain order;
- ``ca_gap``: a protein chain with consecutive resolved CA atoms over `max_ca_gap` apart;
- ``crystallization_aid``: a ligand residue on AF3's list (CurationConfig.crystallization_aids)
  in a structure solved by crystallography;
- ``chain_limit``: beyond `max_chains` chains, only the nearest to a random interface token
  stay (a token centre within 15 Angstrom of another chain's; AF3 picks the chains by their
  nearest token centre). The draw is seeded by (config.seed, target id), so reruns agree.

Crystallization aids go before the chain limit, so that they do not take chains' places.
Hydrogens and waters never reach a Structure (the parser drops them), and model atoms the CCD
does not list and leaving atoms are left out when features are built.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
from collections import Counter
from dataclasses import dataclass

import gemmi
import numpy as np

from featurecache.config import CurationConfig
from featurecache.io.residues import UNKNOWN_LETTER
from featurecache.io.structure import Chain, Structure
from featurecache.precompute.contacts import StructureAtoms, close_pairs

# What each removal reason means, for `featurecache stats`.
REASONS = {
    "unknown_polymer": "polymer chain of unknown residues only",
    "few_resolved_residues": "polymer chain with too few resolved residues",
    "clash": "chain clashing with another chain",
    "ca_gap": "protein chain with consecutive CA atoms too far apart",
    "crystallization_aid": "crystallization aid in a crystal structure",
    "chain_limit": "chain beyond the chain limit, far from the chosen interface",
}
# Why a whole target is left out.
EXCLUSIONS = {
    "release_date": "released outside the release-date window",
    "resolution": "resolution worse than the cutoff",
    "polymer_chains": "more polymer chains than the limit",
    "no_chains": "no chain left after curation",
}
INTERFACE_TOKEN_DISTANCE = 15.0  # AF3: an interface token's centre is this close to another chain's
_CENTER_ATOMS = {"protein": "CA", "dna": "C1'", "rna": "C1'"}
# Covalent radii and metals by atomic number (gemmi's tables), for telling bonds from clashes.
_COVALENT_RADII = np.array([gemmi.Element(number).covalent_r if number else 0.0 for number in range(128)])
_METALS = np.array([bool(number) and gemmi.Element(number).is_metal for number in range(128)])
_BOND_TOLERANCE = 0.4  # Angstrom around the sum of covalent radii


@dataclass(frozen=True)
class Removal:
    """One thing curation removed: a whole chain (residue None) or a residue of a ligand chain."""

    reason: str  # a key of REASONS
    chain_id: str
    residue: str | None  # "<CCD code> <number>" for a residue, None for the whole chain
    atoms: int  # resolved heavy atoms removed with it
    detail: str = ""  # the numbers behind the decision

    def to_json(self) -> dict:
        return {
            "reason": self.reason,
            "chain": self.chain_id,
            "residue": self.residue,
            "atoms": self.atoms,
            "detail": self.detail,
        }


@dataclass(frozen=True)
class Exclusion:
    """Why a whole target is left out."""

    reason: str  # a key of EXCLUSIONS
    message: str

    def to_json(self) -> dict:
        return {"reason": self.reason, "message": self.message}


@dataclass(frozen=True)
class Curated:
    """curate()'s answer: the structure to featurize and what was removed, or why there is none."""

    structure: Structure | None  # None when the target is excluded
    removals: tuple[Removal, ...] = ()
    exclusion: Exclusion | None = None

    def removed_counts(self) -> dict[str, int]:
        """Removals per reason (only reasons that occurred)."""
        return dict(Counter(removal.reason for removal in self.removals))


def curate(structure: Structure, config: CurationConfig) -> Curated:
    """Apply AF3's target and bioassembly filters; see the module docstring."""
    exclusion = target_exclusion(structure, config)
    if exclusion is not None:
        return Curated(None, (), exclusion)
    removals: list[Removal] = []
    has_coordinates = any(residue.is_resolved for chain in structure.chains for residue in chain.residues)
    structure = _drop_chains(structure, _unusable_polymers(structure, config, has_coordinates), removals)
    structure = _drop_chains(structure, _clashing_chains(structure, config), removals)
    structure = _drop_chains(structure, _chains_with_ca_gaps(structure, config), removals)
    structure = _drop_crystallization_aids(structure, config, removals)
    structure = _drop_chains(structure, _chains_beyond_limit(structure, config), removals)
    if not structure.chains:
        return Curated(
            None,
            tuple(removals),
            Exclusion("no_chains", f"{structure.source}: no chain left after curation ({len(removals)} removed)"),
        )
    return Curated(structure, tuple(removals))


# --- target filters ---------------------------------------------------------------------------


def target_exclusion(structure: Structure, config: CurationConfig) -> Exclusion | None:
    """Why the target is left out as a whole (release date, resolution, polymer chains), or None.

    A structure with no resolution (NMR, predictions, sequence-only targets) passes the
    resolution filter; one with no release date fails a release-date window, if one is set.
    """
    source = structure.source
    if config.min_release_date is not None or config.max_release_date is not None:
        released = _date(structure.release_date)
        if released is None:
            return Exclusion("release_date", f"{source}: release date unknown, a release-date window is set")
        if config.min_release_date is not None and released < datetime.date.fromisoformat(config.min_release_date):
            return Exclusion(
                "release_date", f"{source}: released {released}, before min_release_date {config.min_release_date}"
            )
        if config.max_release_date is not None and released > datetime.date.fromisoformat(config.max_release_date):
            return Exclusion(
                "release_date", f"{source}: released {released}, after max_release_date {config.max_release_date}"
            )
    if structure.resolution is not None and structure.resolution > config.max_resolution:
        return Exclusion(
            "resolution",
            f"{source}: resolution {structure.resolution:g} A is worse than max_resolution {config.max_resolution:g} A",
        )
    polymers = sum(chain.is_polymer for chain in structure.chains)
    if polymers > config.max_polymer_chains:
        return Exclusion(
            "polymer_chains",
            f"{source}: {polymers} polymer chains, more than max_polymer_chains {config.max_polymer_chains}",
        )
    return None


def _date(text: str | None) -> datetime.date | None:
    try:
        return datetime.date.fromisoformat(text) if text else None
    except ValueError:
        return None


# --- chain filters: each returns {chain index: Removal} ---------------------------------------


def _unusable_polymers(structure: Structure, config: CurationConfig, has_coordinates: bool) -> dict[int, Removal]:
    found = {}
    for index, chain in enumerate(structure.chains):
        if not chain.is_polymer:
            continue
        atoms = _resolved_atoms(chain)
        if config.remove_unknown_polymers and set(chain.sequence) <= {UNKNOWN_LETTER[chain.molecule_type]}:
            found[index] = Removal(
                "unknown_polymer", chain.chain_id, None, atoms, f"{len(chain.residues)} residues, all unknown"
            )
            continue
        resolved = sum(residue.is_resolved for residue in chain.residues)
        if has_coordinates and resolved < config.min_resolved_residues:
            found[index] = Removal(
                "few_resolved_residues",
                chain.chain_id,
                None,
                atoms,
                f"{resolved} resolved residues, fewer than {config.min_resolved_residues}",
            )
    return found


def _clashing_chains(structure: Structure, config: CurationConfig) -> dict[int, Removal]:
    """AF3's clash filter, pair by pair in chain order (a removed chain clashes no more)."""
    if config.clash_fraction >= 1.0:
        return {}
    atoms = StructureAtoms.of(structure)
    counts = atoms.atoms_per_chain(len(structure.chains))
    first, second = close_pairs(atoms.positions, config.clash_distance, groups=atoms.chain)
    bonded = _covalent_contacts(structure, atoms, first, second)
    first, second = first[~bonded], second[~bonded]
    # clashing[i, j]: atoms of chain i within clash_distance of chain j
    clashing = np.zeros((len(structure.chains),) * 2, np.int64)
    for atom, other in ((first, second), (second, first)):
        pairs = np.unique(np.stack([atom, atoms.chain[other]], axis=1), axis=0)
        np.add.at(clashing, (atoms.chain[pairs[:, 0]], pairs[:, 1]), 1)
    fraction = clashing / np.maximum(counts, 1)[:, None]
    removed: dict[int, Removal] = {}
    for a, b in zip(*np.nonzero(np.triu(np.maximum(fraction, fraction.T) > config.clash_fraction))):
        if a in removed or b in removed:
            continue
        # the larger fraction goes; then the chain with fewer atoms; then the later chain
        loser = max((a, b), key=lambda chain: (fraction[chain, b + a - chain], -counts[chain], chain))
        partner = a + b - loser
        removed[int(loser)] = Removal(
            "clash",
            structure.chains[loser].chain_id,
            None,
            int(counts[loser]),
            f"{fraction[loser, partner]:.0%} of its atoms within {config.clash_distance:g} A of chain "
            f"{structure.chains[partner].chain_id}",
        )
    return removed


def _covalent_contacts(
    structure: Structure, atoms: StructureAtoms, first: np.ndarray, second: np.ndarray
) -> np.ndarray:
    """Which close pairs are bonds between chains, not clashes: bonds the file declares
    (Structure.bonds, where the parser reads them), and a ligand chain's atom at covalent-bond
    length from another chain's (no metal): a cap or covalent ligand the parser split off."""
    bonded = np.zeros(len(first), bool)
    declared = getattr(structure, "bonds", ())
    if declared:
        index = {
            (structure.chains[c].chain_id, r, structure.chains[c].residues[r].atom_names[a]): i
            for i, (c, r, a) in enumerate(zip(atoms.chain, atoms.residue, atoms.atom))
        }
        pairs = {
            frozenset(
                (
                    index.get((bond.first.chain_id, bond.first.residue, bond.first.atom)),
                    index.get((bond.second.chain_id, bond.second.residue, bond.second.atom)),
                )
            )
            for bond in declared
        }
        bonded |= np.array([frozenset((a, b)) in pairs for a, b in zip(first.tolist(), second.tolist())], bool)
    is_ligand = np.array([not chain.is_polymer for chain in structure.chains], bool)
    radius, metal = _COVALENT_RADII[atoms.elements], _METALS[atoms.elements]
    expected = radius[first] + radius[second]
    length = np.linalg.norm(atoms.positions[first] - atoms.positions[second], axis=1)
    geometric = (
        (is_ligand[atoms.chain[first]] | is_ligand[atoms.chain[second]])
        & ~metal[first]
        & ~metal[second]
        & (np.abs(length - expected) <= _BOND_TOLERANCE)
    )
    return bonded | geometric


def _chains_with_ca_gaps(structure: Structure, config: CurationConfig) -> dict[int, Removal]:
    found = {}
    for index, chain in enumerate(structure.chains):
        if chain.molecule_type != "protein":
            continue
        previous = None
        for residue in chain.residues:
            ca = _atom_position(residue, "CA")
            if ca is not None and previous is not None:
                gap = float(np.linalg.norm(ca - previous))
                if gap > config.max_ca_gap:
                    found[index] = Removal(
                        "ca_gap",
                        chain.chain_id,
                        None,
                        _resolved_atoms(chain),
                        f"CA atoms {gap:.1f} A apart at residue {residue.seq_id}",
                    )
                    break
            previous = ca  # an unresolved residue (or one without CA) breaks the run
    return found


def _chains_beyond_limit(structure: Structure, config: CurationConfig) -> dict[int, Removal]:
    """AF3's chain limit: keep the max_chains chains nearest a random interface token centre."""
    if len(structure.chains) <= config.max_chains:
        return {}
    positions, chain_of = token_centres(structure)
    if len(positions) == 0:
        return {}  # a sequence-only target: nothing to measure, keep every chain
    first, second = close_pairs(positions, INTERFACE_TOKEN_DISTANCE, groups=chain_of, strict=True)
    candidates = np.unique(np.concatenate([first, second])) if len(first) else np.arange(len(positions))
    rng = np.random.default_rng([config.seed, _target_seed(structure.id)])
    centre = positions[candidates[rng.integers(len(candidates))]]
    distance = np.full(len(structure.chains), np.inf)
    np.minimum.at(distance, chain_of, np.linalg.norm(positions - centre, axis=1))
    kept = set(np.argsort(distance, kind="stable")[: config.max_chains].tolist())
    return {
        index: Removal(
            "chain_limit",
            chain.chain_id,
            None,
            _resolved_atoms(chain),
            f"nearest token centre {distance[index]:.1f} A from the chosen interface token; "
            f"{len(structure.chains)} chains, {config.max_chains} kept",
        )
        for index, chain in enumerate(structure.chains)
        if index not in kept
    }


def token_centres(structure: Structure) -> tuple[np.ndarray, np.ndarray]:
    """Resolved token centre positions [T, 3] and their chain indices [T], as AF3 defines them:
    CA / C1' of a polymer residue that has it, else every atom (ligands, modified residues)."""
    positions, chain_of = [], []
    for index, chain in enumerate(structure.chains):
        for residue in chain.residues:
            centre = _atom_position(residue, _CENTER_ATOMS.get(chain.molecule_type, ""))
            points = [centre] if centre is not None else list(residue.positions[residue.occupancies > 0])
            positions.extend(points)
            chain_of.extend([index] * len(points))
    return np.asarray(positions, np.float64).reshape(-1, 3), np.asarray(chain_of, np.int64)


def _target_seed(target_id: str) -> int:
    return int.from_bytes(hashlib.sha256(target_id.encode()).digest()[:8], "big")


# --- ligand residues --------------------------------------------------------------------------


def _drop_crystallization_aids(structure: Structure, config: CurationConfig, removals: list[Removal]) -> Structure:
    """Remove AF3's crystallization aids from ligand chains of a crystal structure."""
    aids = set(config.crystallization_aids)
    if not aids or not is_crystallography(structure.method):
        return structure
    dropped: dict[int, set[int]] = {}
    for index, chain in enumerate(structure.chains):
        if chain.is_polymer:
            continue
        for position, residue in enumerate(chain.residues):
            if residue.name in aids:
                dropped.setdefault(index, set()).add(position)
                removals.append(
                    Removal(
                        "crystallization_aid",
                        chain.chain_id,
                        f"{residue.name} {residue.seq_id}",
                        int((residue.occupancies > 0).sum()),
                        f"method {structure.method}",
                    )
                )
    return _drop_residues(structure, dropped)


def is_crystallography(method: str | None) -> bool:
    """The experimental method is a diffraction or crystallography one (X-ray, neutron, electron, ...)."""
    method = (method or "").upper()
    return "DIFFRACTION" in method or "CRYSTALLOGRAPHY" in method


# --- rebuilding the structure -----------------------------------------------------------------


def _drop_chains(structure: Structure, removed: dict[int, Removal], removals: list[Removal]) -> Structure:
    if not removed:
        return structure
    removals.extend(removed[index] for index in sorted(removed))
    return _drop_residues(structure, {index: set(range(len(structure.chains[index].residues))) for index in removed})


def _drop_residues(structure: Structure, dropped: dict[int, set[int]]) -> Structure:
    """`structure` without the residues given per chain index; a chain left empty goes, and so
    do the declared bonds (Structure.bonds, where the parser reads them) that touch a removed residue."""
    if not dropped:
        return structure
    chains: list[Chain] = []
    new_position: dict[tuple[str, int], int] = {}  # (chain id, old residue index) -> new index
    for index, chain in enumerate(structure.chains):
        gone = dropped.get(index, set())
        kept = [position for position in range(len(chain.residues)) if position not in gone]
        if not kept:
            continue
        new_position.update(((chain.chain_id, old), new) for new, old in enumerate(kept))
        chains.append(
            chain
            if not gone
            else dataclasses.replace(chain, residues=tuple(chain.residues[position] for position in kept))
        )
    changes = {"chains": tuple(chains)}
    if getattr(structure, "bonds", None):
        changes["bonds"] = tuple(
            _renumbered(bond, new_position)
            for bond in structure.bonds
            if all((atom.chain_id, atom.residue) in new_position for atom in (bond.first, bond.second))
        )
    return dataclasses.replace(structure, **changes)


def _renumbered(bond, new_position: dict[tuple[str, int], int]):
    first, second = (
        dataclasses.replace(atom, residue=new_position[atom.chain_id, atom.residue])
        for atom in (bond.first, bond.second)
    )
    return dataclasses.replace(bond, first=first, second=second)


def _resolved_atoms(chain: Chain) -> int:
    return int(sum((residue.occupancies > 0).sum() for residue in chain.residues))


def _atom_position(residue, name: str) -> np.ndarray | None:
    if name in residue.atom_names:
        index = residue.atom_names.index(name)
        if residue.occupancies[index] > 0:
            return residue.positions[index].astype(np.float64)
    return None
