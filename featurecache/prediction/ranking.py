"""AlphaFold 3's ranking of predicted samples (its output.md and released code):

    ranking_score = 0.8 ipTM + 0.2 pTM (pTM alone for one chain) + 0.5 fraction_disordered
                    - 100 has_clash

- has_clash: a polymer chain with more than 100 atoms, or more than half its atoms, within
  1.1 A of a polymer atom of another chain or of a residue more than one away in its own chain.
- fraction_disordered: the fraction of protein residues whose relative solvent accessibility
  (each protein chain alone, averaged over a window of 25 residues) exceeds 0.581 (AlphaFold-RSA).
  AlphaFold 3 reads the accessibility from DSSP; here it is the Shrake-Rupley area of biotite
  with DSSP's atom radii and probe, over Sander & Rost's maximal areas.

Inputs are one structure's atoms as numpy arrays: positions [A, 3] and per-atom labels.
"""

from __future__ import annotations

import math

import biotite.structure as struc
import numpy as np
from scipy.spatial import cKDTree

IPTM_WEIGHT = 0.8
DISORDER_WEIGHT = 0.5
CLASH_PENALTY = 100.0
CLASH_DISTANCE = 1.1  # Angstrom
CLASH_MIN_ATOMS = 100
CLASH_MIN_FRACTION = 0.5
DISORDER_RSA = 0.581
RSA_WINDOW = 25
# Maximal accessible surface area per residue, Sander & Rost 1994 (AF3's table); other residues: ALA's.
MAX_ACCESSIBLE_AREA = {
    "ALA": 106.0,
    "ARG": 248.0,
    "ASN": 157.0,
    "ASP": 163.0,
    "CYS": 135.0,
    "GLN": 198.0,
    "GLU": 194.0,
    "GLY": 84.0,
    "HIS": 184.0,
    "ILE": 169.0,
    "LEU": 164.0,
    "LYS": 205.0,
    "MET": 188.0,
    "PHE": 197.0,
    "PRO": 136.0,
    "SER": 130.0,
    "THR": 142.0,
    "TRP": 227.0,
    "TYR": 222.0,
    "VAL": 142.0,
}
DSSP_RADII = {"N": 1.65, "CA": 1.87, "C": 1.76, "O": 1.4}  # every other atom: 1.8
DSSP_OTHER_RADIUS = 1.8
DSSP_PROBE = 1.4
# biotite's Shrake-Rupley allocates a cell list over the atoms' bounding box (cells of twice the
# largest radius plus probe): a sample from a barely trained model, atoms strewn over kilometres of
# box, asked for tens of GB. Past this many cells the area is measured block by block instead.
SASA_MAX_CELLS = 4_000_000
SASA_BLOCK = 128.0  # Angstrom, the side of one block's cube


def ranking_score(ptm: float, iptm: float, fraction_disordered: float, has_clash: bool) -> float:
    combined = ptm if math.isnan(iptm) else IPTM_WEIGHT * iptm + (1.0 - IPTM_WEIGHT) * ptm
    return combined + DISORDER_WEIGHT * fraction_disordered - CLASH_PENALTY * float(has_clash)


def has_clash(positions: np.ndarray, chain: np.ndarray, residue: np.ndarray, polymer: np.ndarray) -> bool:
    """positions [A, 3]; chain, residue [A] (chain number, residue number); polymer [A] bool."""
    positions, chain, residue = positions[polymer], chain[polymer], residue[polymer]
    if not len(positions):
        return False
    pairs = cKDTree(positions).query_pairs(CLASH_DISTANCE, output_type="ndarray")  # [K, 2]
    first, second = pairs[:, 0], pairs[:, 1]
    counted = (chain[first] != chain[second]) | (np.abs(residue[first].astype(np.int64) - residue[second]) > 1)
    clashing = np.zeros(len(positions), dtype=bool)
    clashing[pairs[counted].ravel()] = True
    for value in np.unique(chain):
        members = chain == value
        count = int(clashing[members].sum())
        if count > CLASH_MIN_ATOMS or count / members.sum() > CLASH_MIN_FRACTION:
            return True
    return False


def relative_accessibility(
    positions: np.ndarray, atom_names: list[str], elements: list[str], residue: np.ndarray, residue_names: list[str]
) -> np.ndarray:
    """Per residue of one protein chain (in order of first appearance): its atoms' accessible
    area over the residue's maximal area, capped at 1."""
    atoms = struc.AtomArray(len(positions))
    atoms.coord = positions.astype(np.float32)
    atoms.atom_name = np.array(atom_names)
    atoms.element = np.array(elements)
    radii = np.array([DSSP_RADII.get(name, DSSP_OTHER_RADIUS) for name in atom_names])
    area = accessible_area(atoms, radii)
    order, first = np.unique(residue, return_index=True)
    order = order[np.argsort(first)]
    rsa = []
    for number in order:
        members = residue == number
        name = residue_names[int(np.flatnonzero(members)[0])]
        rsa.append(
            min(float(np.nansum(area[members])) / MAX_ACCESSIBLE_AREA.get(name, MAX_ACCESSIBLE_AREA["ALA"]), 1.0)
        )
    return np.array(rsa)


def accessible_area(atoms: struc.AtomArray, radii: np.ndarray) -> np.ndarray:
    """biotite's Shrake-Rupley area of each atom (DSSP's probe), in bounded memory whatever the
    spread of the coordinates: past SASA_MAX_CELLS, each SASA_BLOCK cube's atoms are measured with
    every atom within reach of the cube as occluders, which gives the same areas (atoms farther
    apart than their radii plus two probes never occlude each other)."""
    reach = 2.0 * (float(radii.max()) + DSSP_PROBE)  # also biotite's cell size
    coords = atoms.coord.astype(np.float64)
    cells = np.prod(np.ceil(np.ptp(coords, axis=0) / reach) + 1.0)
    if cells <= SASA_MAX_CELLS:
        return struc.sasa(atoms, probe_radius=DSSP_PROBE, vdw_radii=radii, ignore_ions=False)
    blocks = np.floor((coords - coords.min(axis=0)) / SASA_BLOCK).astype(np.int64)
    area = np.full(len(atoms), np.nan, dtype=np.float32)
    occupied, block_of_atom = np.unique(blocks, axis=0, return_inverse=True)
    block_of_atom = block_of_atom.ravel()
    for block in range(len(occupied)):
        core = block_of_atom == block
        low, high = coords[core].min(axis=0) - reach, coords[core].max(axis=0) + reach
        near = np.all((coords >= low) & (coords <= high), axis=1)
        measured = core[near]
        area[core] = struc.sasa(
            atoms[near], probe_radius=DSSP_PROBE, atom_filter=measured, vdw_radii=radii[near], ignore_ions=False
        )[measured]
    return area


def windowed(values: np.ndarray, window: int = RSA_WINDOW) -> np.ndarray:
    """Mean over a centred window, the ends padded by reflection (AlphaFold-RSA)."""
    half = (window - 1) // 2
    if len(values) < 2:
        return values.astype(float)
    padded = np.pad(values, (half, half), mode="reflect")
    return np.convolve(padded, np.ones(window), "valid") / window


def fraction_disordered(
    positions: np.ndarray,
    atom_names: list[str],
    elements: list[str],
    chain: np.ndarray,
    residue: np.ndarray,
    residue_names: list[str],
    protein: np.ndarray,
) -> float:
    """Fraction of protein residues with windowed RSA above 0.581 (0 without protein)."""
    disordered = []
    for value in np.unique(chain[protein]):
        members = np.flatnonzero(protein & (chain == value))
        rsa = relative_accessibility(
            positions[members],
            [atom_names[i] for i in members],
            [elements[i] for i in members],
            residue[members],
            [residue_names[i] for i in members],
        )
        disordered.extend(windowed(rsa) > DISORDER_RSA)
    return float(np.mean(disordered)) if disordered else 0.0
