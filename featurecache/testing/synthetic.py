"""A schema-valid random batch, shaped as featurecache.loader.collate returns it: for tests, and
for benchmarks on machines that have no cache.

Integer arrays are torch.long, deletion_matrix float32, booleans bool; every sample but the
longest is padded along tokens, MSA rows and templates, with the pad masks collate adds.
"""

from __future__ import annotations

import torch

from featurecache.schema import FEATURES, GAP, NUM_RESTYPES


def random_batch(lengths: list[int], msa_depths: list[int], num_templates: list[int],
                 generator: torch.Generator, num_atoms_per_token: int = 2) -> dict:
    batch_size = len(lengths)
    tokens, rows, temps = max(lengths), max(msa_depths), max(num_templates)
    atoms = tokens * num_atoms_per_token
    sizes = {"token": tokens, "atom": atoms, "token_bond": tokens, "msa": rows, "template": temps}
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
    batch["atom_pad_mask"] = torch.arange(atoms)[None, :] < torch.tensor(lengths)[:, None] * num_atoms_per_token
    batch["msa_row_mask"] = torch.arange(rows)[None, :] < torch.tensor(msa_depths)[:, None]
    batch["template_mask"] = torch.arange(temps)[None, :] < torch.tensor(num_templates)[:, None]
    pad = ~batch["token_pad_mask"]
    batch["restype"][pad] = GAP
    batch["token_center_mask"] &= batch["token_pad_mask"]
    return batch
