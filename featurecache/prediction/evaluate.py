"""`featurecache evaluate`: how close a predicted structure is to the true one.

Atoms are matched by chain, residue number, residue name and atom name, over the heavy atoms the
truth resolves. The number is a polymer residue's label_seq_id (its place in the sequence, which
`featurecache predict` writes as the author number too) and a ligand's author number (with
insertion code). Chains are matched by their polymer sequence, not by name: files name chains
differently (a PDB entry's author chains H and L are A and B in a prediction, which names chains
by the cache's label ids; 2q2k's author chain A is its label chain B), and a ligand goes with
the author chain it belongs to. A truth chain's candidates are the predicted chains whose
residues agree with it wherever both have a residue (a crop, or unresolved residues, leave some
out); chains of the same sequence may be predicted in either order (a homodimer's A and B), so of
the assignments of candidates to chains the one that fits the polymer CA atoms best is taken, as
AF3's evaluation does with its chain permutation.

Scores:
- CA-RMSD after the optimal superposition of the polymer CA (or C4' for nucleic acids) atoms, and
  per chain after superposing that chain alone;
- lDDT over all heavy atoms (15 A inclusion radius, thresholds 0.5 / 1 / 2 / 4 A, pairs of atoms
  in different residues, as Mariani et al. 2013) and over the CA atoms alone;
- ligand RMSD: the non-polymer heavy atoms after superposing the polymer CA atoms (what docking
  benchmarks call the pocket-aligned ligand RMSD, over the whole protein).
Symmetric atoms (e.g. Asp OD1 / OD2) are not swapped: the scores are a slight underestimate.
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import click
import gemmi
import numpy as np

from featurecache.errors import BoundaryCommand, UserError
from featurecache.kernels.smooth_lddt import INCLUSION_RADIUS, LDDT_THRESHOLDS

BACKBONE_ATOMS = ("CA", "C4'")  # the representative atom of an amino acid / a nucleotide
# Chain orders tried per group of identical chains: past this, each chain takes the candidate of
# its own name if there is one, else the candidates in order.
MAX_PERMUTATIONS = 720
# A predicted chain is a candidate for a truth chain when they share at least this many polymer
# residue numbers and their residue names differ at no more than this share of them (a modified
# residue written under its parent's name, say); chains of different sequences differ at most.
MIN_SHARED_RESIDUES = 3
MAX_MISMATCHED_SHARE = 0.1


class EvaluateError(ValueError):
    """A structure that cannot be compared (unreadable, or no atoms in common)."""


@dataclass(frozen=True)
class Atom:
    chain: str  # author chain (auth_asym_id): a ligand keeps its polymer chain's
    residue: str  # "seq N" (polymer: label_seq_id) or "auth N" (ligand: author number)
    residue_name: str
    name: str
    polymer: bool


@dataclass
class Scores:
    atoms: int  # heavy atoms compared
    ca_atoms: int
    ligand_atoms: int
    ca_rmsd: float
    lddt: float  # all heavy atoms
    ca_lddt: float
    ligand_rmsd: float | None  # None: the truth has no ligand atoms
    chain_ca_rmsd: dict[str, float] = field(default_factory=dict)
    chain_map: dict[str, str] = field(default_factory=dict)  # truth chain -> predicted chain

    def as_dict(self) -> dict:
        return asdict(self)


def read_atoms(path: Path) -> dict[Atom, np.ndarray]:
    """Heavy atoms of the first model (no waters), keyed for matching."""
    try:
        structure = gemmi.read_structure(str(path))
    except (RuntimeError, ValueError, OSError) as error:
        raise EvaluateError(f"{path}: not a readable structure ({error})") from error
    structure.setup_entities()
    # a PDB file's residues get their places in the sequence from its SEQRES records, as an
    # mmCIF file's label_seq_id gives them (an mmCIF file's own numbering is kept)
    structure.assign_label_seq_id(False)
    structure.remove_hydrogens()
    structure.remove_waters()
    if len(structure) == 0:
        raise EvaluateError(f"{path}: no model")
    atoms = {}
    for chain in structure[0]:
        for residue in chain:
            polymer = _is_polymer_residue(residue.name)
            for atom in residue:
                if atom.altloc not in ("\0", "A"):
                    continue  # the first alternative location only
                key = Atom(chain.name, _residue_number(residue, polymer), residue.name, atom.name, polymer)
                atoms[key] = np.array(atom.pos.tolist())
    return atoms


def _residue_number(residue: gemmi.Residue, polymer: bool) -> str:
    """A polymer residue's place in its chain's sequence (label_seq_id, which `predict` also
    writes as the author number); a ligand's author number, or either when the file has no
    label numbering (legacy PDB)."""
    if polymer and residue.label_seq is not None:
        return f"seq {residue.label_seq}"
    return f"auth {residue.seqid}"


def _is_polymer_residue(name: str) -> bool:
    """An amino acid or nucleotide by its CCD class (gemmi's table). Files disagree on how they
    label a ligand's chain and number (an assembly file may number it as the chain's next
    residue), so the residue's chemistry decides; an unknown code counts as a ligand."""
    info = gemmi.find_tabulated_residue(name)
    return info is not None and (info.is_amino_acid() or info.is_nucleic_acid())


def _polymer_residues(atoms: dict[Atom, np.ndarray]) -> dict[str, dict[str, str]]:
    """chain -> {residue number: residue name} of its polymer residues (chains of ligands alone
    are left out: they have no sequence to be matched by)."""
    chains: dict[str, dict[str, str]] = {}
    for atom in atoms:
        if atom.polymer:
            chains.setdefault(atom.chain, {})[atom.residue] = atom.residue_name
    return chains


def _agree(one: dict[str, str], other: dict[str, str]) -> bool:
    """Two chains of the same sequence, as far as both have residues."""
    shared = one.keys() & other.keys()
    mismatched = sum(one[number] != other[number] for number in shared)
    return len(shared) >= MIN_SHARED_RESIDUES and mismatched <= MAX_MISMATCHED_SHARE * len(shared)


def superpose(moving: np.ndarray, fixed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rotation R and translation t minimising |moving @ R.T + t - fixed| (gemmi's superposition)."""
    fit = gemmi.superpose_positions([gemmi.Position(*p) for p in fixed], [gemmi.Position(*p) for p in moving])
    return np.array(fit.transform.mat.tolist()), np.array(fit.transform.vec.tolist())


def rmsd(x: np.ndarray, y: np.ndarray) -> float:
    return float(np.sqrt(((x - y) ** 2).sum(-1).mean()))


def superposed_rmsd(x: np.ndarray, y: np.ndarray) -> float:
    rotation, translation = superpose(x, y)
    return rmsd(x @ rotation.T + translation, y)


def lddt(predicted: np.ndarray, truth: np.ndarray, residue_ids: np.ndarray) -> float:
    """Global lDDT of predicted against true positions [n, 3]: pairs within INCLUSION_RADIUS in the
    truth, of atoms in different residues (residue_ids [n])."""
    true_distances = np.linalg.norm(truth[:, None] - truth[None], axis=-1)
    pairs = (true_distances < INCLUSION_RADIUS) & (residue_ids[:, None] != residue_ids[None])
    if not pairs.any():
        return math.nan
    error = np.abs(np.linalg.norm(predicted[:, None] - predicted[None], axis=-1) - true_distances)[pairs]
    return float(np.mean([(error < threshold).mean() for threshold in LDDT_THRESHOLDS]))


def _assignments(truth: dict[Atom, np.ndarray], predicted: dict[Atom, np.ndarray]):
    """Every truth -> predicted chain map that gives each truth chain one of its candidates (a
    predicted chain whose residues agree with it; None when it has none left), no predicted chain
    twice. Truth chains that agree with each other form a group whose candidates are permuted."""
    truth_chains, predicted_chains = _polymer_residues(truth), _polymer_residues(predicted)
    groups: list[list[str]] = []
    for chain in sorted(truth_chains):
        group = next((g for g in groups if _agree(truth_chains[g[0]], truth_chains[chain])), None)
        if group is None:
            groups.append([chain])
        else:
            group.append(chain)
    choices = []
    for group in groups:
        candidates = sorted(
            name for name, residues in predicted_chains.items() if _agree(truth_chains[group[0]], residues)
        )
        slots = candidates + [None] * max(0, len(group) - len(candidates))
        if math.perm(len(slots), len(group)) <= MAX_PERMUTATIONS:
            choices.append(list(itertools.permutations(slots, len(group))))
        else:  # each chain its own name where that is a candidate, the rest in order
            own = [chain if chain in candidates else None for chain in group]
            rest = iter([name for name in candidates if name not in own])
            choices.append([tuple(name if name is not None else next(rest, None) for name in own)])
    for combination in itertools.product(*choices):
        chain_map = {chain: image for group, order in zip(groups, combination) for chain, image in zip(group, order)}
        images = [image for image in chain_map.values() if image is not None]
        if len(images) == len(set(images)):
            yield chain_map


def _matched(predicted: dict[Atom, np.ndarray], truth: dict[Atom, np.ndarray], chain_map: dict[str, str | None]):
    """The truth's atoms that the prediction has under the mapped chain names, with both positions
    (a chain of ligands alone, which has no sequence to map it by, keeps its name)."""
    pairs = [(key, replace(key, chain=chain_map.get(key.chain, key.chain))) for key in truth]
    pairs = [(key, image) for key, image in pairs if image.chain is not None and image in predicted]
    keys = [key for key, _ in pairs]
    return keys, np.array([predicted[image] for _, image in pairs]), np.array([truth[key] for key in keys])


def compare(predicted_path: Path, truth_path: Path) -> Scores:
    predicted, truth = read_atoms(Path(predicted_path)), read_atoms(Path(truth_path))
    best = None
    for chain_map in _assignments(truth, predicted):
        keys, x, y = _matched(predicted, truth, chain_map)
        ca = [i for i, key in enumerate(keys) if key.polymer and key.name in BACKBONE_ATOMS]
        if len(ca) < 3:
            continue
        fit = superposed_rmsd(x[ca], y[ca])
        if best is None or fit < best[0]:
            best = (fit, chain_map, keys, x, y, ca)
    if best is None:
        for path, atoms in ((truth_path, truth), (predicted_path, predicted)):
            if any(key.polymer and key.residue.startswith("auth ") for key in atoms):
                raise EvaluateError(
                    f"{path}: its polymer residues have no place in a sequence (a PDB file without SEQRES "
                    "records?): give it as mmCIF, or with SEQRES"
                )
        raise EvaluateError(f"{predicted_path}: fewer than 3 polymer CA / C4' atoms in common with {truth_path}")
    ca_rmsd, chain_map, keys, x, y, ca = best
    residue_index: dict[tuple, int] = {}
    residue_ids = np.array([residue_index.setdefault((key.chain, key.residue), len(residue_index)) for key in keys])
    rotation, translation = superpose(x[ca], y[ca])
    ligand = [i for i, key in enumerate(keys) if not key.polymer]
    chains = sorted({keys[i].chain for i in ca})
    chain_ca_rmsd = {}
    for chain in chains:
        members = [i for i in ca if keys[i].chain == chain]
        if len(members) >= 3:
            chain_ca_rmsd[chain] = superposed_rmsd(x[members], y[members])
    return Scores(
        atoms=len(keys),
        ca_atoms=len(ca),
        ligand_atoms=len(ligand),
        ca_rmsd=ca_rmsd,
        lddt=lddt(x, y, residue_ids),
        ca_lddt=lddt(x[ca], y[ca], residue_ids[ca]),
        ligand_rmsd=rmsd(x[ligand] @ rotation.T + translation, y[ligand]) if ligand else None,
        chain_ca_rmsd=chain_ca_rmsd,
        chain_map={chain: chain_map.get(chain, chain) for chain in chains},
    )


@click.command("evaluate", cls=BoundaryCommand)
@click.argument("predicted", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--truth", required=True, type=click.Path(dir_okay=False), help="The true structure (mmCIF or PDB).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per predicted file instead of a table.")
def evaluate_command(predicted, truth, as_json) -> None:
    """Score predicted structures PREDICTED... against --truth: CA-RMSD (whole and per chain),
    all-atom and CA lDDT, and the ligand RMSD after superposing the polymer."""
    for path in (*predicted, truth):
        if not Path(path).is_file():
            raise UserError(f"{path}: no such file")
    if not as_json:
        click.echo("predicted\tCA-RMSD\tlDDT\tCA-lDDT\tligand-RMSD\tatoms")
    for path in predicted:
        try:
            scores = compare(Path(path), Path(truth))
        except EvaluateError as error:
            raise UserError(str(error)) from error
        if as_json:
            click.echo(json.dumps({"predicted": str(path), **scores.as_dict()}))
        else:
            ligand = "-" if scores.ligand_rmsd is None else f"{scores.ligand_rmsd:.2f}"
            click.echo(
                f"{path}\t{scores.ca_rmsd:.2f}\t{scores.lddt:.3f}\t{scores.ca_lddt:.3f}\t{ligand}\t{scores.atoms}"
            )
