"""AF3's per-sample augmentation of the reference conformers (supplementary information §2.8,
Table 5: ref_pos is "atom positions in the reference conformer, with a random rotation and
translation applied").

Each reference space (`ref_space_uid`: one residue or ligand instance) is centred on the mean of
its atoms that have a conformer position (`ref_mask`), rotated by a rotation drawn uniformly from
SO(3) and moved by a translation drawn from N(0, translation_std² I) in Å, as AF3's released code
does. Atoms without a position stay at zero. The loader calls this once per sample, so every draw
of a target sees its conformers in a new frame and the model cannot learn the CCD/RDKit frame.
"""

from __future__ import annotations

import numpy as np


def random_rotations(count: int, rng: np.random.Generator) -> np.ndarray:
    """[count, 3, 3] rotations uniform on SO(3): unit quaternions from normalised 4D Gaussians."""
    quaternions = rng.standard_normal((count, 4))
    quaternions /= np.linalg.norm(quaternions, axis=1, keepdims=True)
    w, x, y, z = quaternions.T
    return np.stack(
        [
            np.stack([1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)], axis=-1),
            np.stack([2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)], axis=-1),
            np.stack([2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)], axis=-1),
        ],
        axis=1,
    )


def augment_reference_conformers(
    ref_pos: np.ndarray,
    ref_space_uid: np.ndarray,
    ref_mask: np.ndarray,
    rng: np.random.Generator,
    translation_std: float = 1.0,
) -> np.ndarray:
    """float32 [A, 3]: each reference space of `ref_pos` centred, randomly rotated and translated.

    One rotation and one translation per distinct `ref_space_uid`, drawn in the order of the
    sorted ids, so a draw depends only on `rng` and the sample's atoms.
    """
    positions = np.asarray(ref_pos, np.float64)
    has_position = np.asarray(ref_mask, bool)
    spaces, space_of_atom = np.unique(np.asarray(ref_space_uid), return_inverse=True)
    counts = np.bincount(space_of_atom, weights=has_position, minlength=len(spaces))
    sums = np.zeros((len(spaces), 3))
    np.add.at(sums, space_of_atom, positions * has_position[:, None])
    centres = sums / np.maximum(counts, 1)[:, None]  # [S, 3]
    rotations = random_rotations(len(spaces), rng)  # [S, 3, 3]
    translations = rng.normal(0.0, translation_std, (len(spaces), 3))  # [S, 3]
    centred = positions - centres[space_of_atom]
    moved = np.einsum("aij,aj->ai", rotations[space_of_atom], centred) + translations[space_of_atom]
    return np.where(has_position[:, None], moved, 0.0).astype(np.float32)
