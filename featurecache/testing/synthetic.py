"""A schema-valid random batch, shaped as featurecache.loader.collate returns it: for tests, and
for benchmarks on machines that have no cache.

Integer arrays are torch.long, deletion_matrix float32, booleans bool; every sample but the
longest is padded along tokens, atoms, token bonds, MSA rows and templates, with the pad masks
collate adds (index arrays pad with -1, as collate pads them).

Each sample is one chain of polymer residues followed by a small ligand: residues have
`num_atoms_per_token` atoms, the last tokens (a quarter, at most 2) are one-atom ligand tokens,
bonded to each other and to the last residue. Atoms lie around their token's centre on a rough
chain, so distances fill the distogram's range; index arrays point at real atoms of their token.
"""

from __future__ import annotations

import torch

from featurecache.schema import FEATURES, FEATURES_BY_NAME, GAP, MAX_ATOM_PERMUTATIONS, NUM_RESTYPES

_ELEMENTS = torch.tensor([6, 7, 8, 16])  # C, N, O, S


def random_batch(
    lengths: list[int],
    msa_depths: list[int],
    num_templates: list[int],
    generator: torch.Generator,
    num_atoms_per_token: int = 2,
) -> dict:
    batch_size = len(lengths)
    tokens, rows, temps = max(lengths), max(msa_depths), max(num_templates)
    samples = [_atom_layout(length, num_atoms_per_token) for length in lengths]
    atoms = max(len(sample["atom_to_token"]) for sample in samples)
    bonds = max(max(len(sample["token_bonds"]) for sample in samples), 1)
    sizes = {"token": tokens, "atom": atoms, "token_bond": bonds, "msa": rows, "template": temps}
    batch: dict = {"id": [f"sample{i}" for i in range(batch_size)]}
    for spec in FEATURES:
        shape = [batch_size] + [sizes[a] if isinstance(a, str) else a for a in spec.axes]
        if spec.dtype.kind == "b":
            value = torch.rand(shape, generator=generator) < 0.9
        elif spec.dtype.kind == "f":
            value = torch.randn(shape, generator=generator) * 8.0
        else:
            value = torch.randint(0, NUM_RESTYPES, shape, generator=generator)
        batch[spec.name] = value
    batch["deletion_matrix"] = torch.randint(0, 5, batch["deletion_matrix"].shape, generator=generator).float()
    batch["msa_profile"] = torch.softmax(batch["msa_profile"], dim=-1)
    batch["deletion_mean"] = batch["deletion_mean"].abs()
    # one chain, one entity, consecutive residues: a realistic relative-position pattern
    chain = (torch.arange(tokens) >= tokens // 2).long() + 1
    batch["asym_id"] = chain.expand(batch_size, -1).clone()
    batch["entity_id"] = torch.ones(batch_size, tokens, dtype=torch.long)
    batch["sym_id"] = chain.expand(batch_size, -1).clone()
    batch["residue_index"] = torch.arange(1, tokens + 1).expand(batch_size, -1).clone()
    batch["token_index"] = torch.arange(tokens).expand(batch_size, -1).clone()
    # positions on a rough chain so distances fill the distogram range
    steps = torch.randn(batch_size, tokens, 3, generator=generator)
    batch["token_center_pos"] = torch.cumsum(3.8 * torch.nn.functional.normalize(steps, dim=-1), dim=1)
    batch["token_pad_mask"] = torch.arange(tokens)[None, :] < torch.tensor(lengths)[:, None]
    batch["msa_row_mask"] = torch.arange(rows)[None, :] < torch.tensor(msa_depths)[:, None]
    batch["template_mask"] = torch.arange(temps)[None, :] < torch.tensor(num_templates)[:, None]
    pad = ~batch["token_pad_mask"]
    batch["restype"][pad] = GAP
    batch["token_center_mask"] &= batch["token_pad_mask"]
    _add_atoms(batch, samples, atoms, bonds, generator)
    batch["resolution"] = torch.full((batch_size,), 2.0)  # an X-ray structure the confidence losses train on
    return batch


def first_sample_unpadded(
    batch: dict, tokens: int, atoms: int, bonds: int, msa_rows: int | None = None, templates: int | None = None
) -> dict:
    """Sample 0 of a collated batch, unpadded along tokens, atoms and token bonds, and along MSA
    rows and templates where their counts are given (else the batch's, padding masked)."""
    sizes = {"token": tokens, "atom": atoms, "token_bond": bonds, "msa": msa_rows, "template": templates}
    sizes = {axis: size for axis, size in sizes.items() if size is not None}
    pad_mask_axes = {
        "token_pad_mask": ("token",),
        "atom_pad_mask": ("atom",),
        "token_bond_mask": ("token_bond",),
        "msa_row_mask": ("msa",),
        "template_mask": ("template",),
    }
    alone = {}
    for name, value in batch.items():
        if name == "id":
            continue
        value = value[:1]
        spec = FEATURES_BY_NAME.get(name)
        axes = spec.axes if spec else pad_mask_axes.get(name, ())
        for dim, axis in enumerate(axes, start=1):
            if axis in sizes:
                value = value.narrow(dim, 0, sizes[axis])
        alone[name] = value
    return alone


def _atom_layout(length: int, atoms_per_residue: int) -> dict:
    """Token of each atom, ligand flags and bonds of one sample."""
    ligands = min(2, length // 4)
    residues = length - ligands
    counts = torch.tensor([atoms_per_residue] * residues + [1] * ligands)
    token_bonds = []
    if ligands:
        token_bonds.append((residues - 1, residues))
        token_bonds += [(residues + i, residues + i + 1) for i in range(ligands - 1)]
    return {
        "atom_to_token": torch.repeat_interleave(torch.arange(length), counts),
        "is_ligand": torch.arange(length) >= residues,
        "token_bonds": torch.tensor(token_bonds, dtype=torch.long).view(-1, 2),
    }


def _add_atoms(batch: dict, samples: list[dict], atoms: int, bonds: int, generator: torch.Generator) -> None:
    batch_size, tokens = batch["restype"].shape
    batch["atom_to_token"] = torch.zeros(batch_size, atoms, dtype=torch.long)
    batch["atom_pad_mask"] = torch.zeros(batch_size, atoms, dtype=torch.bool)
    batch["token_bonds"] = torch.full((batch_size, bonds, 2), -1, dtype=torch.long)
    batch["token_bond_mask"] = torch.zeros(batch_size, bonds, dtype=torch.bool)
    batch["distogram_atom_index"] = torch.full((batch_size, tokens), -1, dtype=torch.long)
    batch["frame_atom_index"] = torch.full((batch_size, tokens, 3), -1, dtype=torch.long)
    for name in ("is_protein", "is_rna", "is_dna", "is_ligand"):
        batch[name] = torch.zeros(batch_size, tokens, dtype=torch.bool)
    for row, sample in enumerate(samples):
        count, length = len(sample["atom_to_token"]), len(sample["is_ligand"])
        batch["atom_to_token"][row, :count] = sample["atom_to_token"]
        batch["atom_pad_mask"][row, :count] = True
        batch["token_bonds"][row, : len(sample["token_bonds"])] = sample["token_bonds"]
        batch["token_bond_mask"][row, : len(sample["token_bonds"])] = True
        batch["is_ligand"][row, :length] = sample["is_ligand"]
        batch["is_protein"][row, :length] = ~sample["is_ligand"]
        first = torch.searchsorted(sample["atom_to_token"], torch.arange(length))
        size = torch.bincount(sample["atom_to_token"], minlength=length)
        batch["distogram_atom_index"][row, :length] = first + (size > 1).long()
        has_frame = size >= 3
        batch["frame_atom_index"][row, :length][has_frame] = first[has_frame, None] + torch.arange(3)
    offsets = torch.randn(batch_size, atoms, 3, generator=generator) * 1.2
    centres = torch.gather(batch["token_center_pos"], 1, batch["atom_to_token"].unsqueeze(-1).expand(-1, -1, 3))
    real = batch["atom_pad_mask"]
    batch["atom_mask"] &= real
    batch["atom_pos"] = torch.where(batch["atom_mask"].unsqueeze(-1), centres + offsets, 0.0)
    batch["ref_pos"] = torch.where(
        real.unsqueeze(-1), offsets + 0.1 * torch.randn(offsets.shape, generator=generator), 0.0
    )
    batch["ref_mask"] = real.clone()
    batch["ref_element"] = torch.where(
        real, _ELEMENTS[torch.randint(0, 4, (batch_size, atoms), generator=generator)], 0
    )
    batch["ref_charge"] = torch.where(real, torch.randint(-1, 2, (batch_size, atoms), generator=generator), 0)
    batch["ref_atom_name_chars"] = torch.randint(0, 64, (batch_size, atoms, 4), generator=generator) * real[..., None]
    batch["ref_space_uid"] = batch["atom_to_token"].clone()
    # no symmetric atoms (the loader's features.symmetry computes them from real residues)
    batch["atom_permutations"] = torch.full((batch_size, atoms, MAX_ATOM_PERMUTATIONS), -1, dtype=torch.long)
