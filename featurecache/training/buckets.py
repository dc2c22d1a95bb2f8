"""The padded sizes of --static-shapes and --cuda-graphs batches (collate's `pad_to` buckets).

Tokens, MSA rows and templates pad to one size each. The atom axis pads to the smallest of a few
buckets that holds the batch: one size for every batch would be the most atoms any crop can
hold (24 per token, or the cache's largest target), about twice what a 384-token protein crop
holds (~3,000 atoms), and the atom work (atom attention, smooth lDDT over N_atom^2 pairs) would
be paid on the padding. A few sizes keep the shapes few (one CUDA graph each) and bounded.

How the sizes are chosen: each target's crop is estimated from the manifest (a target within
the crop is whole; a larger one holds its mean atoms per token times the crop, with headroom),
and `--atom-buckets N` sizes are the (at most) N multiples of 128 that pad those estimates least
in total, each target counted once, the largest always the bound above, so every crop fits one. Token bonds pad along with the atoms:
a bucket of A atoms holds min(3 per token of the crop, 3 per atom) bonds, a bound no crop of A
atoms passes (it has at most A tokens, each with an atom), so the bond axis never moves a batch to a larger bucket.
It shrinks only the small buckets' bond axes; the manifest has no bond counts to choose from,
and the axis costs little (a scatter into the pair, a loss over the bonds).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

from featurecache.training.config import (
    ATOM_PAD_MULTIPLE,
    ATOMS_PER_TOKEN_BOUND,
    BONDS_PER_TOKEN_BOUND,
    TrainConfig,
    TrainSetupError,
)

# A crop of a target larger than the crop is estimated at the target's mean atoms per token
# times the crop size, times this: over 40 epochs of crops of the sample targets (721p, 7a4d) at
# crops 256 and 384 a crop held at most 1.06x that mean (small crops around a ligand, up to
# 1.22x at crop 96). A crop past its estimate takes the next bucket up, which only costs time.
CROP_ATOM_HEADROOM = 1.1


def _round_up(value: float, multiple: int) -> int:
    return -(-math.ceil(value) // multiple) * multiple


def padding_buckets(config: TrainConfig, dataset) -> list[dict[str, int]] | None:
    """With fixed shapes, collate's `pad_to` buckets (smallest first): the crop size, the sample's
    MSA rows, the most templates a sample holds, and per bucket the atoms and token bonds; else None."""
    if not config.fixed_shapes:
        return None
    try:
        templates = dataset.max_templates
    except ValueError as error:  # an older manifest without template counts: one line naming the cache
        text = " ".join(str(error).split())
        raise TrainSetupError(
            f"--cache: {text}" if str(config.cache) in text else f"--cache {config.cache}: {text}"
        ) from None
    crop = config.sample.crop_size
    atom_bound = crop * ATOMS_PER_TOKEN_BOUND
    largest_target = getattr(dataset, "max_atoms", None)
    if largest_target is not None:
        # A crop never holds more atoms than its whole target: on a cache of small or protein-only
        # targets this bound is several times tighter than 24 per token.
        atom_bound = min(atom_bound, _round_up(largest_target, ATOM_PAD_MULTIPLE))
    target_sizes = getattr(dataset, "target_sizes", None)
    if target_sizes:
        atoms = atom_bucket_sizes(crop_atom_estimates(target_sizes, crop), atom_bound, config.atom_buckets)
    else:  # no atom counts (an older manifest, --online, a followed publication): the bound alone
        atoms = [atom_bound]
    bond_bound = crop * BONDS_PER_TOKEN_BOUND
    return [
        {
            "token": crop,
            "msa": config.sample.msa_pool_rows,
            "template": templates,
            "atom": size,
            "token_bond": min(bond_bound, size * BONDS_PER_TOKEN_BOUND),
        }
        for size in atoms
    ]


def crop_atom_estimates(target_sizes: Sequence[tuple[int, int]], crop: int) -> list[int]:
    """The atoms a crop of each (tokens, atoms) target is expected to hold, at most (see
    CROP_ATOM_HEADROOM): the whole target when it fits the crop."""
    return [
        atoms if tokens <= crop else min(atoms, math.ceil(atoms * crop / tokens * CROP_ATOM_HEADROOM))
        for tokens, atoms in target_sizes
    ]


def atom_bucket_sizes(crop_atoms: Sequence[int], bound: int, count: int) -> list[int]:
    """At most `count` atom-axis sizes, ascending, the last `bound`, the others multiples of
    ATOM_PAD_MULTIPLE below it, such that padding each of `crop_atoms` (one per target) to the
    smallest size that holds it pads the fewest atoms in total (an exact dynamic programme over
    the estimates rounded up: O(count x distinct sizes^2), sizes <= bound / 128)."""
    if count < 1:
        raise ValueError(f"atom buckets: count is {count}, at least 1 is needed")
    demand = Counter(min(bound, _round_up(max(atoms, 1), ATOM_PAD_MULTIPLE)) for atoms in crop_atoms)
    sizes = sorted(set(demand) | {bound})
    weights = [demand[size] for size in sizes]
    below = [0]  # below[j]: targets whose estimate rounds to sizes[:j]
    for weight in weights:
        below.append(below[-1] + weight)
    # best[j]: (padded atoms of the targets up to sizes[j] with sizes[j] the largest bucket, buckets)
    best = [(sizes[j] * below[j + 1], (sizes[j],)) for j in range(len(sizes))]
    for _ in range(count - 1):
        more = list(best)
        for j in range(len(sizes)):
            for i in range(j):
                cost = best[i][0] + sizes[j] * (below[j + 1] - below[i + 1])
                if cost < more[j][0]:
                    more[j] = (cost, (*best[i][1], sizes[j]))
        best = more
    return list(best[-1][1])
