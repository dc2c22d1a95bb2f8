"""Moving between atoms and tokens in a collated batch (schema.py: `atom_to_token`, `token_bonds`).

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


def mean_over_token_atoms(atom_values: torch.Tensor, atom_to_token: torch.Tensor, atom_pad_mask: torch.Tensor,
                          num_tokens: int) -> torch.Tensor:
    """Mean of atom_values [B, (S,) A, C] over each token's real atoms -> [B, (S,) N, C]
    (zero for a token without atoms)."""
    weights = atom_pad_mask.to(atom_values.dtype)
    index = atom_to_token.long()
    if atom_values.dim() == 4:
        weights, index = weights[:, None], index[:, None].expand(-1, atom_values.shape[1], -1)
    shape = (*atom_values.shape[:-2], num_tokens)
    count = atom_values.new_zeros(shape).scatter_add(-1, index, weights.expand(index.shape))
    total = atom_values.new_zeros(*shape, atom_values.shape[-1]).scatter_add(
        -2, index.unsqueeze(-1).expand(*index.shape, atom_values.shape[-1]), atom_values * weights.unsqueeze(-1))
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
    dense[rows, i, j] = True
    dense[rows, j, i] = True
    return dense[:, :num_tokens, :num_tokens]


def token_atom_table(atom_to_token: torch.Tensor, atom_pad_mask: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """[B, N, K] the atom indices of each token (K: most atoms of any token), padded with -1."""
    batch_size, num_atoms = atom_to_token.shape
    device = atom_to_token.device
    token = torch.where(atom_pad_mask, atom_to_token.long(), num_tokens)  # padding atoms: an extra token
    counts = torch.zeros(batch_size, num_tokens + 1, dtype=torch.long, device=device)
    counts.scatter_add_(1, token, torch.ones_like(token))
    atom_index = torch.arange(num_atoms, device=device).expand(batch_size, -1)
    order = torch.argsort(token * num_atoms + atom_index, dim=1)  # by token, then by atom
    sorted_token = torch.gather(token, 1, order)
    first = counts.cumsum(dim=1) - counts
    rank = atom_index - torch.gather(first, 1, sorted_token)
    width = max(int(counts.max()), 1)
    table = torch.full((batch_size, num_tokens + 1, width), -1, dtype=torch.long, device=device)
    rows = torch.arange(batch_size, device=device)[:, None].expand_as(order)
    table[rows, sorted_token, rank] = order
    width = max(int(counts[:, :num_tokens].max()) if num_tokens else 1, 1)
    return table[:, :num_tokens, :width]


def token_bond_atoms(token_bonds: torch.Tensor, token_bond_mask: torch.Tensor, atom_to_token: torch.Tensor,
                     atom_pad_mask: torch.Tensor, atom_pos: torch.Tensor, atom_resolved: torch.Tensor,
                     num_tokens: int) -> torch.Tensor:
    """[B, E, 2] the bonded atom pair of each token bond, -1 where there is none.

    A ligand token is one atom; a polymer residue's token holds many, and the record names only
    the token. The bonded atom is the pair of resolved atoms of the two tokens closest in the
    ground truth (a covalent bond is under 2.4 Angstrom, SI 2.8, far below any other pair).
    """
    table = token_atom_table(atom_to_token, atom_pad_mask, num_tokens)  # [B, N, K]
    valid_bond = token_bond_mask & (token_bonds >= 0).all(dim=-1)
    tokens = token_bonds.long().clamp(min=0)
    rows = torch.arange(table.shape[0], device=table.device)[:, None]
    atoms_i, atoms_j = table[rows, tokens[..., 0]], table[rows, tokens[..., 1]]  # [B, E, K]
    width = table.shape[-1]

    def positions(atoms):
        flat = atoms.clamp(min=0).flatten(1)
        pos = torch.gather(atom_pos, 1, flat.unsqueeze(-1).expand(-1, -1, 3)).view(*atoms.shape, 3)
        ok = torch.gather(atom_resolved, 1, flat).view(atoms.shape) & (atoms >= 0)
        return pos, ok

    pos_i, ok_i = positions(atoms_i)
    pos_j, ok_j = positions(atoms_j)
    distance = (pos_i[..., :, None, :] - pos_j[..., None, :, :]).norm(dim=-1)  # [B, E, K, K]
    distance = distance.masked_fill(~(ok_i[..., :, None] & ok_j[..., None, :]), float("inf"))
    best = distance.flatten(-2).argmin(dim=-1)
    found = valid_bond & torch.isfinite(distance.flatten(-2).amin(dim=-1))
    pair = torch.stack([torch.gather(atoms_i, -1, (best // width).unsqueeze(-1)).squeeze(-1),
                        torch.gather(atoms_j, -1, (best % width).unsqueeze(-1)).squeeze(-1)], dim=-1)
    return torch.where(found.unsqueeze(-1), pair, -1)
