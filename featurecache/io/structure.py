"""The parsed form of an input: a frozen `Structure` of chains and residues with heavy atoms,
and the covalent bonds between residues that the file declares.

Built by the mmCIF / PDB parser (`io.mmcif`) and, for targets known only by sequence, by
`structure_from_sequences`. Featurization reads only this, never the input file again.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from featurecache.io.residues import (
    UNKNOWN_LETTER,
    UNKNOWN_RESIDUE,
    SequenceError,
    parent_of,
    read_sequence,
    residue_letter,
)


@dataclass(frozen=True, eq=False)
class Residue:
    """One residue (or one ligand component) with its heavy atoms; no atoms when unresolved."""

    name: str  # CCD code as modelled (MSE already converted to MET)
    parent: str  # standard parent CCD code ("" when unknown); equal to name for standard residues
    seq_id: int  # label_seq_id for polymers (1-based), position within the ligand chain otherwise
    auth_seq_id: str
    atom_names: tuple[str, ...]
    elements: np.ndarray  # [n] int8 atomic numbers (0 = unknown)
    charges: np.ndarray  # [n] int8
    positions: np.ndarray  # [n, 3] float32
    occupancies: np.ndarray  # [n] float32
    b_factors: np.ndarray  # [n] float32 (pLDDT for predicted models)
    smiles: str = ""  # canonical SMILES of a ligand defined by SMILES (AF3 input JSON); name is then "UNL"

    @property
    def is_resolved(self) -> bool:
        return len(self.atom_names) > 0


@dataclass(frozen=True, eq=False)
class Chain:
    chain_id: str  # label_asym_id, or "<label_asym_id>:<CCD><auth number>" for split-off ligands
    auth_chain_id: str
    entity_id: str  # as written in the file (may be unreliable in processed files)
    molecule_type: str  # "protein" | "dna" | "rna" | "ligand"
    residues: tuple[Residue, ...]

    @property
    def is_polymer(self) -> bool:
        return self.molecule_type != "ligand"

    @property
    def sequence(self) -> str:
        """One-letter sequence for polymers (X / N for unknown), CCD codes (or SMILES) in brackets for ligands."""
        if not self.is_polymer:
            return "".join(f"({residue.smiles or residue.name})" for residue in self.residues)
        unknown = UNKNOWN_LETTER[self.molecule_type]
        return "".join(residue_letter(residue.parent, self.molecule_type, unknown) for residue in self.residues)


@dataclass(frozen=True)
class AtomRef:
    """One atom of a structure: its chain (Chain.chain_id), residue (index into that chain's
    residues) and atom name (as the CCD names it; MSE's SE is SD, as for the residue)."""

    chain_id: str
    residue: int
    atom: str


@dataclass(frozen=True)
class Bond:
    """A covalent bond between residues that the file declares (mmCIF ``_struct_conn``):
    kind "covale" (glycosidic, ligand-residue, modified-residue links) or "disulf"."""

    first: AtomRef
    second: AtomRef
    kind: str


@dataclass(frozen=True, eq=False)
class Structure:
    id: str
    source: str
    resolution: float | None
    release_date: str | None  # ISO date
    method: str | None
    chains: tuple[Chain, ...] = field(default_factory=tuple)
    warnings: tuple[str, ...] = ()  # what reading the input changed or could not know, per chain
    bonds: tuple[Bond, ...] = ()  # covalent bonds between residues (_struct_conn), each once

    def chain(self, chain_id: str) -> Chain:
        for chain in self.chains:
            if chain.chain_id == chain_id:
                return chain
        raise KeyError(f"{self.source}: no chain {chain_id!r}; chains are {[c.chain_id for c in self.chains]}")


def structure_from_sequences(
    target_id: str, chains: list[tuple[str, str, str]], release_date: str | None = None
) -> Structure:
    """A structure with no coordinates from (chain id, molecule type, one-letter sequence) triples,
    for targets known only by sequence (FASTA inputs): every residue is unresolved.

    Letters are read by `residues.read_sequence`: an invalid one is a SequenceError (a ValueError)
    naming the chain; ambiguity codes become warnings naming the chain."""
    built, warnings = [], []
    for chain_id, molecule_type, sequence in chains:
        if molecule_type not in UNKNOWN_RESIDUE:
            raise ValueError(f"chain {chain_id}: molecule type {molecule_type!r} is not protein, dna or rna")
        try:
            reading = read_sequence(sequence, molecule_type)
        except SequenceError as error:
            raise SequenceError(error.letter, error.position, molecule_type, chain_id) from None
        residues = tuple(
            unresolved_residue(name, parent_of(name), position)
            for position, name in enumerate(reading.residues, start=1)
        )
        built.append(Chain(chain_id, chain_id, "", molecule_type, residues))
        substituted = reading.warning(molecule_type)
        if substituted:
            warnings.append(f"chain {chain_id}: {substituted}")
    return Structure(target_id, target_id, None, release_date, None, tuple(built), tuple(warnings))


def unresolved_residue(name: str, parent: str, seq_id: int) -> Residue:
    return Residue(
        name=name,
        parent=parent,
        seq_id=seq_id,
        auth_seq_id="",
        atom_names=(),
        elements=np.zeros(0, np.int8),
        charges=np.zeros(0, np.int8),
        positions=np.zeros((0, 3), np.float32),
        occupancies=np.zeros(0, np.float32),
        b_factors=np.zeros(0, np.float32),
    )
