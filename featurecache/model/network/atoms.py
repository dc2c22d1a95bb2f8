"""Moving between atoms and tokens in a collated batch (schema.py: `atom_to_token`, `token_bonds`,
`frame_atom_index`, `distogram_atom_index`): the model's one place for these gathers.

Atoms of one token are consecutive (the record lists them token by token), padding atoms are
False in `atom_pad_mask` and point to token 0, and padded edge-list rows are -1.
"""

from __future__ import annotations

import torch


def gather_tokens(token_values: torch.Tensor, atom_to_token: torch.Tensor) -> torch.Tensor:
    """token_values [B, (S,) N, C], atom_to_token [B, A] -> each atom's token's value [B, (S,) A, C]."""
    index = atom_to_token.long()
    if token_values.dim() == 4:  # a sample axis
        index = index[:, None, :].expand(-1, token_values.shape[1], -1)
    return torch.gather(token_values, -2, index.unsqueeze(-1).expand(*index.shape, token_values.shape[-1]))


def atom_flags(token_flags: torch.Tensor, atom_to_token: torch.Tensor) -> torch.Tensor:
    """A token flag on each atom: token_flags [B, N] (e.g. `is_dna`) -> [B, A]."""
    return gather_tokens(token_flags.unsqueeze(-1), atom_to_token).squeeze(-1)


def gather_atoms(positions: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """positions [B, (S,) A, 3] at atom indices [B, N] (-1 reads atom 0) -> [B, (S,) N, 3]."""
    index = index.long().clamp(min=0)
    if positions.dim() == 4:
        index = index[:, None].expand(-1, positions.shape[1], -1)
    return torch.gather(positions, -2, index.unsqueeze(-1).expand(*index.shape, 3))


def pairwise_distances(first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    """[..., I, 3] x [..., J, 3] -> [..., I, J] Euclidean distances, each from its own coordinate
    differences (the matrix-product form loses ~1e-3 A at coordinates of 100 A in fp32).

    Where autograd records it is torch.cdist's direct mode, whose gradient is 0 for coincident
    points (sqrt's is not finite there). Without gradient (the confidence head's input and its
    targets) the differences are accumulated a coordinate at a time in one [..., I, J] buffer: a
    few elementwise passes, where cdist's direct mode reduces each distance's 3 terms with a block
    of threads (0.74 ms a call at 3,328 atoms on an H100, benchmarks/NOTES.md section 10)."""
    if torch.is_grad_enabled() and (first.requires_grad or second.requires_grad):
        return torch.cdist(first, second, compute_mode="donot_use_mm_for_euclid_dist")
    squared = None
    for axis in range(first.shape[-1]):
        difference = first[..., :, None, axis] - second[..., None, :, axis]
        squared = difference.square_() if squared is None else squared.addcmul_(difference, difference)
    return squared.sqrt_()


def distogram_atoms(batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's distogram atom (CB, CA of glycine, C4 / C2 of nucleotides) in the ground
    truth: positions [B, N, 3] (fp32) and resolved [B, N] (a real, resolved atom of a real token)."""
    index = batch["distogram_atom_index"].long()
    positions = gather_atoms(batch["atom_pos"].float(), index)
    resolved = torch.gather(batch["atom_mask"] & batch["atom_pad_mask"], 1, index.clamp(min=0))
    return positions, resolved & (index >= 0) & batch["token_pad_mask"]


def token_first_atom(atom_to_token: torch.Tensor, atom_pad_mask: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """[B, N] the first real atom of each token (atoms of a token are consecutive); A where none."""
    batch_size, num_atoms = atom_to_token.shape
    atom_index = torch.arange(num_atoms, device=atom_to_token.device).expand(batch_size, -1)
    atom_index = torch.where(atom_pad_mask, atom_index, num_atoms)
    first = torch.full((batch_size, num_tokens), num_atoms, dtype=torch.long, device=atom_to_token.device)
    return first.scatter_reduce(1, atom_to_token.long(), atom_index, reduce="amin")


def centre_atom_index(batch: dict) -> torch.Tensor:
    """[B, N] each token's centre atom (CA, C1', a ligand's own atom): the frame's middle atom
    b where the token has a frame, else its first atom (a one-atom token's only atom)."""
    frame_middle = batch["frame_atom_index"][..., 1].long()
    first = token_first_atom(batch["atom_to_token"], batch["atom_pad_mask"], frame_middle.shape[1])
    first = first.clamp(max=batch["atom_pad_mask"].shape[1] - 1)
    return torch.where(frame_middle >= 0, frame_middle, first)


def representative_atom_index(batch: dict) -> torch.Tensor:
    """[B, N] the distogram atom of each token, the centre atom where it has none."""
    distogram = batch["distogram_atom_index"].long()
    return torch.where(distogram >= 0, distogram, centre_atom_index(batch))


def mean_over_token_atoms(
    atom_values: torch.Tensor, atom_to_token: torch.Tensor, atom_pad_mask: torch.Tensor, num_tokens: int
) -> torch.Tensor:
    """Mean of atom_values [B, (S,) A, C] over each token's real atoms -> [B, (S,) N, C]
    (zero for a token without atoms)."""
    weights = atom_pad_mask.to(atom_values.dtype)
    index = atom_to_token.long()
    if atom_values.dim() == 4:
        weights, index = weights[:, None], index[:, None].expand(-1, atom_values.shape[1], -1)
    shape = (*atom_values.shape[:-2], num_tokens)
    count = atom_values.new_zeros(shape).scatter_add(-1, index, weights.expand(index.shape))
    total = atom_values.new_zeros(*shape, atom_values.shape[-1]).scatter_add(
        -2, index.unsqueeze(-1).expand(*index.shape, atom_values.shape[-1]), atom_values * weights.unsqueeze(-1)
    )
    return total / count.clamp(min=1).unsqueeze(-1)


def dense_token_bonds(token_bonds: torch.Tensor, token_bond_mask: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """The edge list [B, E, 2] as AF3's symmetric bond indicator [B, N, N] (bool)."""
    batch_size = token_bonds.shape[0]
    valid = token_bond_mask & (token_bonds >= 0).all(dim=-1)
    dense = torch.zeros(batch_size, num_tokens + 1, num_tokens + 1, dtype=torch.bool, device=token_bonds.device)
    # invalid rows write into the extra row and column, dropped below
    i = torch.where(valid, token_bonds[..., 0].long(), num_tokens)
    j = torch.where(valid, token_bonds[..., 1].long(), num_tokens)
    rows = torch.arange(batch_size, device=token_bonds.device)[:, None].expand_as(i)
    # a tensor, not the Python True: a scalar would be copied from the host, which a CUDA graph capture forbids
    bonded = torch.ones_like(i, dtype=torch.bool)
    dense[rows, i, j] = bonded
    dense[rows, j, i] = bonded
    return dense[:, :num_tokens, :num_tokens]


def token_bond_atoms(
    token_bonds: torch.Tensor,
    token_bond_mask: torch.Tensor,
    atom_to_token: torch.Tensor,
    atom_pad_mask: torch.Tensor,
    atom_pos: torch.Tensor,
    atom_resolved: torch.Tensor,
) -> torch.Tensor:
    """[B, E, 2] the bonded atom pair of each token bond, -1 where either token has no resolved atom.

    The record names only the tokens. Every token bond has a ligand side (SI 2.8: polymer-ligand
    and ligand-ligand bonds), whose token is one atom; the other side's bonded atom is its resolved
    atom nearest to that one in the ground truth (a covalent bond is under 2.4 Angstrom, far
    below any other pair). Found in two nearest-atom passes over [B, E, A], with no host sync:
    from the second token's first resolved atom to the first token's nearest, and back.
    """
    valid_bond = token_bond_mask & (token_bonds >= 0).all(dim=-1)
    atom_ok = (atom_resolved & atom_pad_mask)[:, None, :]
    member = [(atom_to_token[:, None, :] == token_bonds[..., side, None]) & atom_ok for side in (0, 1)]  # [B, E, A]
    found = valid_bond & member[0].any(dim=-1) & member[1].any(dim=-1)
    pos = atom_pos.float()

    def nearest(from_atom, candidates):  # from_atom [B, E] -> the closest candidate atom [B, E]
        start = torch.gather(pos, 1, from_atom.unsqueeze(-1).expand(-1, -1, 3))  # [B, E, 3]
        distance = (start[:, :, None, :] - pos[:, None, :, :]).square().sum(-1)  # [B, E, A]
        return distance.masked_fill(~candidates, float("inf")).argmin(dim=-1)

    first_of_second = member[1].int().argmax(dim=-1)  # the first True
    atom_first = nearest(first_of_second, member[0])
    atom_second = nearest(atom_first, member[1])
    return torch.where(found.unsqueeze(-1), torch.stack([atom_first, atom_second], dim=-1), -1)
