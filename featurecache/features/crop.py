"""Cropping and MSA subsampling of a feature record (run by the loader every epoch).

Crops follow AF3's recipe (SI 2.7, which reuses AF-Multimer's), in three modes (`crop_tokens`):

- contiguous (Algorithm 1): a random contiguous stretch of every chain, chains visited in
  random order, so that the kept tokens add up to the crop size;
- spatial: the tokens nearest a random resolved token of the sampled chain or interface;
- spatial interface: the same around a random interface token (a resolved token within 15 A of a
  resolved token of another chain, the partner chain for a sampled interface).

Crops never split a residue: a modified residue's or a ligand component's atoms (one token
each) share one reference space (`ref_space_uid`), and `crop_groups` makes that the unit a crop
keeps or drops whole. A contiguous stretch widens to whole residues at its ends where the
budget allows, else narrows; a spatial crop takes whole residues in order of their nearest
token and skips one that no longer fits.

`msa_sample_rows` draws one set of MSA rows; `msa_cycle_rows` draws one set per recycling cycle
(AF3 draws anew each cycle) and returns their union with each set's positions in it. The loader
assembles the union for the kept tokens (features.msa.expand_msa) after the crop, so the record's
MSA is read for those rows only.

`crop_arrays` is generic over the schema's axes: arrays with a ``token`` axis are indexed by the
kept tokens, arrays with an ``atom`` axis by the atoms of the kept tokens, and arrays whose values
point into an axis (``schema.ArraySpec.points_to``: atom_to_token, token_bonds, the frame and
distogram atom indices) are renumbered to positions in the crop: an index tuple that names a
cropped-away atom becomes all -1, a ``token_bond`` row with a cropped-away token is dropped. ``token_index`` keeps its original values (it feeds the
relative position encoding, which must see true sequence distances); ``residue_index`` as well.
"""

from __future__ import annotations

import numpy as np

from featurecache import schema
from featurecache.config import CROP_MODES

INTERFACE_DISTANCE = 15.0  # Angstrom, AF-Multimer's interface definition for crop centres
_TIE_BREAK = 1e-3  # AF3 adds index * 1e-3 to distances so ties resolve deterministically


def _check_crop_size(crop_size: int) -> None:
    if crop_size <= 0:
        raise ValueError(f"crop_size must be positive, got {crop_size}")


def crop_groups(arrays: dict[str, np.ndarray]) -> np.ndarray:
    """Per token, the number of the unit a crop keeps or drops whole (0..G-1, in token order):
    the residue its atoms belong to (their ref_space_uid), so that a ligand component or a
    modified residue, whose atoms are one token each, is never split. A token without atoms is
    a unit of its own."""
    num_tokens = arrays["restype"].shape[0]
    uid = np.asarray(arrays["ref_space_uid"], dtype=np.int64)
    group = np.arange(num_tokens, dtype=np.int64) + (uid.max() + 1 if uid.size else 0)
    group[arrays["atom_to_token"]] = uid
    return np.unique(group, return_inverse=True)[1].reshape(-1)


def crop_tokens(
    arrays: dict[str, np.ndarray],
    mode: str,
    crop_size: int,
    rng: np.random.Generator,
    focus_chains: tuple[int, ...] = (),
) -> np.ndarray:
    """Sorted token indices of one crop of `mode` (config.CROP_MODES) around `focus_chains` (the
    asym_ids of the sampled chain or interface; () for none), never splitting a residue."""
    if mode not in CROP_MODES:
        raise ValueError(f"crop mode must be one of {CROP_MODES}, got {mode!r}")
    groups = crop_groups(arrays)
    if mode == "contiguous":
        return contiguous_crop(arrays["asym_id"], crop_size, rng, groups=groups)
    return spatial_crop(
        arrays["token_center_pos"],
        arrays["token_center_mask"],
        arrays["asym_id"],
        crop_size,
        rng,
        interface_bias=mode == "spatial_interface",
        groups=groups,
        focus_chains=focus_chains,
    )


def contiguous_crop(
    asym_id: np.ndarray, crop_size: int, rng: np.random.Generator, groups: np.ndarray | None = None
) -> np.ndarray:
    """Sorted token indices of a contiguous crop (AF3 / AF-Multimer Algorithm 1) of at most
    crop_size; with `groups` (crop_groups), each chain's stretch is moved to whole groups."""
    _check_crop_size(crop_size)
    asym_id = np.asarray(asym_id)
    if asym_id.size <= crop_size:
        return np.arange(asym_id.size)
    chains = [np.flatnonzero(asym_id == chain) for chain in np.unique(asym_id)]
    order = rng.permutation(len(chains))
    lengths = np.array([chains[k].size for k in order])
    remaining_after = np.concatenate([np.cumsum(lengths[::-1])[::-1][1:], [0]])
    kept, added = [], 0
    for position, chain_number in enumerate(order):
        tokens = chains[chain_number]
        size_max = min(crop_size - added, tokens.size)
        size_min = min(tokens.size, max(0, crop_size - (added + remaining_after[position])))
        size = int(rng.integers(size_min, size_max + 1))
        start = int(rng.integers(0, tokens.size - size + 1))
        stop = start + size
        if groups is not None and size:
            start, stop = _whole_groups(groups[tokens], start, stop, crop_size - added)
        kept.append(tokens[start:stop])
        added += stop - start
    return np.sort(np.concatenate(kept))


def _whole_groups(chain_groups: np.ndarray, start: int, stop: int, budget: int) -> tuple[int, int]:
    """The stretch [start, stop) of one chain's tokens moved to group boundaries: each end
    widened to take its whole group when the budget allows, else narrowed to drop it."""
    new_run = np.concatenate([[True], chain_groups[1:] != chain_groups[:-1]])
    run_starts = np.flatnonzero(new_run)
    run_of = np.cumsum(new_run) - 1
    run_stops = np.concatenate([run_starts[1:], [chain_groups.size]])
    wide_start, narrow_start = int(run_starts[run_of[start]]), start
    if wide_start != start:
        narrow_start = int(run_stops[run_of[start]])
    wide_stop, narrow_stop = int(run_stops[run_of[stop - 1]]), stop
    if wide_stop != stop:
        narrow_stop = int(run_starts[run_of[stop - 1]])
    for low, high in (
        (wide_start, wide_stop),
        (wide_start, narrow_stop),
        (narrow_start, wide_stop),
        (narrow_start, narrow_stop),
    ):
        if high - low <= budget:
            return low, max(low, high)
    return start, start


def spatial_crop(
    token_center_pos: np.ndarray,
    token_center_mask: np.ndarray,
    asym_id: np.ndarray,
    crop_size: int,
    rng: np.random.Generator,
    interface_bias: bool = True,
    groups: np.ndarray | None = None,
    focus_chains: tuple[int, ...] = (),
) -> np.ndarray:
    """Sorted indices of the crop_size tokens nearest a random resolved centre token.

    The centre is drawn from the resolved tokens of `focus_chains` (asym_ids; every chain when
    empty or when none of theirs is resolved). With `interface_bias` (AF3's spatial interface
    crop) it is drawn from those within 15 A of a resolved token of another chain (of the other
    focus chain, for an interface) when there are any. Unresolved tokens come last (infinite
    distance). With `groups` (crop_groups) whole groups are taken in order of their nearest
    token, a group that no longer fits skipped. A target with no resolved token falls back to a
    contiguous crop.
    """
    _check_crop_size(crop_size)
    positions = np.asarray(token_center_pos, dtype=np.float64)
    mask = np.asarray(token_center_mask, dtype=bool)
    asym_id = np.asarray(asym_id)
    if asym_id.size <= crop_size:
        return np.arange(asym_id.size)
    resolved = np.flatnonzero(mask)
    if resolved.size == 0:
        return contiguous_crop(asym_id, crop_size, rng, groups=groups)
    centre = int(rng.choice(_centre_candidates(positions, resolved, asym_id, focus_chains, interface_bias)))
    distances = np.linalg.norm(positions - positions[centre], axis=1)
    distances[~mask] = np.inf
    distances += np.arange(asym_id.size) * _TIE_BREAK
    if groups is not None:
        kept = _nearest_whole_groups(distances, groups, crop_size)
        if kept.size:
            return kept
    nearest = np.argsort(distances, kind="stable")[:crop_size]
    return np.sort(nearest)


def _centre_candidates(
    positions: np.ndarray,
    resolved: np.ndarray,
    asym_id: np.ndarray,
    focus_chains: tuple[int, ...],
    interface_bias: bool,
) -> np.ndarray:
    """Resolved tokens a spatial crop may centre on (see spatial_crop)."""
    candidates = resolved
    in_focus = resolved[np.isin(asym_id[resolved], focus_chains)]
    if in_focus.size:
        candidates = in_focus
    if interface_bias:
        partners = resolved
        if len(focus_chains) == 2:
            partners = resolved[np.isin(asym_id[resolved], focus_chains)]
        interface = _interface_tokens(positions, candidates, partners, asym_id)
        if interface.size:
            candidates = interface
    return candidates


def _nearest_whole_groups(distances: np.ndarray, groups: np.ndarray, crop_size: int) -> np.ndarray:
    """Sorted token indices of whole groups taken nearest first (a group's distance is its
    nearest token's) while they fit in crop_size; empty if not even the nearest group fits."""
    num_groups = int(groups.max()) + 1
    group_distance = np.full(num_groups, np.inf)
    np.minimum.at(group_distance, groups, distances)
    group_size = np.bincount(groups, minlength=num_groups)
    order = np.argsort(group_distance, kind="stable")
    # The prefix that fits as a whole at once; past it, one group at a time (few are left to try).
    fits = int(np.searchsorted(np.cumsum(group_size[order]), crop_size, side="right"))
    taken = list(order[:fits])
    room = crop_size - int(group_size[order[:fits]].sum())
    for group in order[fits:]:
        if room == 0:
            break
        if group_size[group] <= room:
            taken.append(group)
            room -= int(group_size[group])
    return np.flatnonzero(np.isin(groups, np.asarray(taken, dtype=groups.dtype)))


def _interface_tokens(positions: np.ndarray, rows: np.ndarray, columns: np.ndarray, asym_id: np.ndarray) -> np.ndarray:
    """Tokens of `rows` within INTERFACE_DISTANCE of a token of `columns` of another chain."""
    # Centred float32 points and |a|^2 + |b|^2 - 2ab (one BLAS matmul per block): ~10x faster
    # than broadcasting differences, which cost 40 ms per sample at 549 tokens.
    origin = positions[columns].mean(axis=0)
    row_points = (positions[rows] - origin).astype(np.float32)
    column_points = (positions[columns] - origin).astype(np.float32)
    row_norms = (row_points * row_points).sum(axis=1)
    column_norms = (column_points * column_points).sum(axis=1)
    row_chains, column_chains = asym_id[rows], asym_id[columns]
    found = np.zeros(rows.size, dtype=bool)
    block = 1024  # rows per distance block: bounds memory at 1024 x N
    for start in range(0, rows.size, block):
        stop = min(start + block, rows.size)
        squared = row_norms[start:stop, None] + column_norms[None, :] - 2.0 * (row_points[start:stop] @ column_points.T)
        close = squared < INTERFACE_DISTANCE**2
        close &= row_chains[start:stop, None] != column_chains[None, :]
        found[start:stop] = close.any(axis=1)
    return rows[found]


def crop_arrays(arrays: dict[str, np.ndarray], token_indices: np.ndarray) -> dict[str, np.ndarray]:
    """Index every schema array along its token and atom axes; other arrays are passed through."""
    token_indices = np.asarray(token_indices, dtype=np.int64)
    num_tokens = arrays["restype"].shape[0]
    if token_indices.size and (token_indices.min() < 0 or token_indices.max() >= num_tokens):
        raise ValueError(f"token indices out of range 0..{num_tokens - 1}")
    if np.unique(token_indices).size != token_indices.size:
        raise ValueError("token indices must be unique")
    atom_to_token = arrays["atom_to_token"]
    atom_indices = np.flatnonzero(np.isin(atom_to_token, token_indices))
    # Keep atoms grouped with their tokens in the order the tokens are given.
    new_position = np.full(num_tokens, -1, dtype=np.int64)
    new_position[token_indices] = np.arange(token_indices.size)
    atom_indices = atom_indices[np.argsort(new_position[atom_to_token[atom_indices]], kind="stable")]
    new_atom = np.full(atom_to_token.shape[0], -1, dtype=np.int64)
    new_atom[atom_indices] = np.arange(atom_indices.size)
    renumber = {"token": new_position, "atom": new_atom}
    cropped: dict[str, np.ndarray] = {}
    for name, value in arrays.items():
        spec = schema.ARRAYS_BY_NAME.get(name)
        if spec is None:
            cropped[name] = value
            continue
        for axis, axis_name in enumerate(spec.axes):
            if axis_name == "token":
                value = np.take(value, token_indices, axis=axis)
            elif axis_name == "atom":
                value = np.take(value, atom_indices, axis=axis)
        if spec.points_to in renumber:
            value = _renumber(value, renumber[spec.points_to], spec)
        cropped[name] = value
    return cropped


def _renumber(value: np.ndarray, new_index: np.ndarray, spec: schema.ArraySpec) -> np.ndarray:
    """Indices into a cropped axis, renumbered; a tuple (last fixed-size axis) with a cropped-away
    entry becomes all -1, or is dropped along an edge-list axis (one the crop does not index)."""
    renumbered = np.where(value >= 0, new_index[np.clip(value, 0, None)], -1)
    if value.ndim > 1 and isinstance(spec.axes[-1], int):
        lost = (renumbered < 0).any(axis=-1)
        if spec.axes[0] not in ("token", "atom"):
            return renumbered[~lost].astype(value.dtype)
        renumbered[lost] = -1
    return renumbered.astype(value.dtype)


def msa_sample_rows(depth: int, max_rows: int, rng: np.random.Generator) -> np.ndarray:
    """Assembled MSA rows a sample keeps: the query row and up to max_rows - 1 random other rows,
    in their original order (every row when the MSA has no more than max_rows).

    msa_profile and deletion_mean stay as computed over the full MSA, as in AF3.
    """
    if max_rows < 1:
        raise ValueError(f"max_rows must be at least 1, got {max_rows}")
    if depth <= max_rows:
        return np.arange(depth)
    others = rng.choice(np.arange(1, depth), size=max_rows - 1, replace=False)
    return np.concatenate([[0], np.sort(others)])


def msa_cycle_rows(
    depth: int, rows_per_cycle: int, num_draws: int, first_rng: np.random.Generator, other_rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """AF3's fresh MSA draw per recycling cycle, made on the host with fixed shapes.

    Draws `num_draws` independent row sets as `msa_sample_rows` does (the first from
    `first_rng`, exactly the single draw of earlier versions; the others from `other_rng`) and
    returns (pool, cycle_rows): `pool` the sorted union of the drawn rows (at most
    num_draws * (rows_per_cycle - 1) + 1, the query shared), and `cycle_rows` int32
    [num_draws, rows_per_cycle], each draw's rows as positions in `pool`, -1 past a shallow
    MSA's depth. Every cycle of a shallow MSA (depth <= rows_per_cycle) gets every row.
    """
    if num_draws < 1:
        raise ValueError(f"num_draws must be at least 1, got {num_draws}")
    draws = [msa_sample_rows(depth, rows_per_cycle, first_rng)]
    draws += [msa_sample_rows(depth, rows_per_cycle, other_rng) for _ in range(num_draws - 1)]
    pool = np.unique(np.concatenate(draws))
    cycle_rows = np.full((num_draws, rows_per_cycle), -1, np.int32)
    for cycle, rows in enumerate(draws):
        cycle_rows[cycle, : len(rows)] = np.searchsorted(pool, rows)
    return pool, cycle_rows
