"""AF3's confidence head (SI Algorithm 31): from the trunk's representations and one or more
predicted structures, logits for pLDDT (50 bins per atom), PAE and PDE (64 bins per token
pair) and the experimentally-resolved flag (2 bins per atom).

The trunk inputs arrive detached (AF3 trains the head without gradient into the trunk); the
predicted structure enters as binned distances between the tokens' representative atoms (the
distogram atoms: CB, CA of glycine, C4 / C2 of nucleotides, a ligand's own atom), as AF3's code
embeds them (39 bins with lower edges 3.25 to 50.75 Angstrom). Its own Pairformer stack
(4 blocks in AF3) refines s and z; per-atom logits come from the token's single vector through
one weight matrix per atom slot of the token (AF3's LinearNoBias_token_atom_idx(l)).

Shapes: B batch, S structures per batch row, N tokens, A atoms.
"""

from __future__ import annotations

import functools
import math

import torch
from torch import nn

from featurecache.model.config import ModelConfig
from featurecache.model.network.atoms import (
    gather_atoms,
    pairwise_distances,
    representative_atom_index,
    token_first_atom,
)
from featurecache.model.network.checkpointing import checkpointed
from featurecache.model.network.layers import Linear
from featurecache.model.network.pairformer import Pairformer

DISTANCE_BIN_MIN, DISTANCE_BIN_MAX, DISTANCE_BINS = 3.25, 50.75, 39
PLDDT_BINS = 50
PAE_BINS = 64
PDE_BINS = 64
RESOLVED_BINS = 2
# Atom slots per token with their own pLDDT / resolved weights: AF3's dense atom layout has 24
# (a standard residue has at most 23 heavy atoms); a larger token shares the last slot.
MAX_ATOMS_PER_TOKEN = 24
OUTPUT_NAMES = ("pae_logits", "pde_logits", "plddt_logits", "resolved_logits")


def atom_slots(atom_to_token: torch.Tensor, atom_pad_mask: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """[B, A] each atom's place within its token (0 for its first atom), at most MAX_ATOMS_PER_TOKEN - 1."""
    first = token_first_atom(atom_to_token, atom_pad_mask, num_tokens)
    atom_index = torch.arange(atom_to_token.shape[1], device=atom_to_token.device)
    slot = atom_index - torch.gather(first, 1, atom_to_token.long())
    return torch.where(atom_pad_mask, slot, 0).clamp(0, MAX_ATOMS_PER_TOKEN - 1)


def distance_features(distance: torch.Tensor) -> torch.Tensor:
    """[...] distances -> [..., 39] one-hot of AF3's bins (lower edge, next lower edge]: lower
    edges 3.25..50.75 A, the last bin open above; a distance up to 3.25 A sets no bin."""
    lower = torch.linspace(DISTANCE_BIN_MIN, DISTANCE_BIN_MAX, DISTANCE_BINS, device=distance.device)
    upper = torch.cat([lower[1:], lower.new_full((1,), math.inf)])
    distance = distance.unsqueeze(-1)
    return ((distance > lower) & (distance <= upper)).float()


class ConfidenceHead(nn.Module):
    """Algorithm 31. forward(s_inputs, single, pair, positions, batch) -> plddt_logits
    [B, S, A, 50], pae_logits [B, S, N, N, 64], pde_logits [B, S, N, N, 64] (symmetric),
    resolved_logits [B, S, A, 2].

    Protenix's head, with its dialect's settings (docs/FIDELITY.md): the trunk single clamped to
    +-512 and normalised by the head's own LayerNorm (confidence_single_norm), a LinearNoBias of the
    raw distance beside its bins (confidence_raw_distance), and the PDE logits of the symmetrised
    pair, Linear(LayerNorm(z + z^T)), instead of AF3's Linear(LayerNorm(z)) plus its transpose
    (pde_symmetrised_input)."""

    # Protenix's clamp of the trunk single before its LayerNorm (its confidence head)
    SINGLE_CLAMP = 512.0

    def __init__(self, config: ModelConfig, single_input_dim: int) -> None:
        super().__init__()
        trunk, runtime = config.trunk, config.runtime
        c_s, c_z = trunk.c_s, trunk.c_z
        self.left_inputs = Linear(single_input_dim, c_z, bias=False)
        self.right_inputs = Linear(single_input_dim, c_z, bias=False)
        self.distance = Linear(DISTANCE_BINS, c_z, bias=False)
        self.single_norm = nn.LayerNorm(c_s) if config.dialect.confidence_single_norm else None
        self.raw_distance = Linear(1, c_z, bias=False) if config.dialect.confidence_raw_distance else None
        # The distances computed directly (AF3's head; None), or as Protenix's head computes them
        # (torch's default: a matrix product past 25 tokens), since its raw-distance embedding passes
        # their rounding (~1e-6 relative at 50 A) straight into the pair: the same bins and values.
        self.distance_mode = "use_mm_for_euclid_dist_if_necessary" if config.dialect.confidence_raw_distance else None
        self.pde_symmetrised_input = config.dialect.pde_symmetrised_input
        self.pairformer = Pairformer(
            config.confidence.confidence_blocks,
            c_s,
            c_z,
            trunk.single_heads,
            trunk.single_head_dim,
            trunk.pair_heads,
            trunk.pair_head_dim,
            trunk.transition_expansion,
            checkpoint_blocks=runtime.checkpoint_blocks,
            kernels=runtime.kernels,
            recompute_attention=runtime.checkpoint_group > 1,
            mult_hidden=config.dialect.triangle_mult_hidden,
        )
        # with grouped checkpoints (a long crop) the whole head is re-run in backward: its z, the
        # distance features, norms and logits would keep ~6 pair-sized tensors
        self.recompute = runtime.checkpoint_blocks and runtime.checkpoint_group > 1
        self.pae_norm, self.pae = nn.LayerNorm(c_z), Linear(c_z, PAE_BINS, bias=False)
        if config.loss.pae_loss_weight == 0:
            # AF3 trains PAE only in its fine-tuning stages: with no loss the head would be a
            # trainable weight that never gets a gradient, so it stays frozen until the weight is set
            for parameter in (*self.pae_norm.parameters(), *self.pae.parameters()):
                parameter.requires_grad_(False)
        self.pde_norm, self.pde = nn.LayerNorm(c_z), Linear(c_z, PDE_BINS, bias=False)
        self.plddt_norm, self.resolved_norm = nn.LayerNorm(c_s), nn.LayerNorm(c_s)
        bound = 1.0 / math.sqrt(c_s)  # nn.Linear's initialisation, per atom slot
        self.plddt = nn.Parameter(torch.empty(MAX_ATOMS_PER_TOKEN, c_s, PLDDT_BINS).uniform_(-bound, bound))
        self.resolved = nn.Parameter(torch.empty(MAX_ATOMS_PER_TOKEN, c_s, RESOLVED_BINS).uniform_(-bound, bound))

    def forward(
        self, s_inputs: torch.Tensor, single: torch.Tensor, pair: torch.Tensor, positions: torch.Tensor, batch: dict
    ) -> dict:
        """s_inputs [B, N, C], single [B, N, c_s], pair [B, N, N, c_z]: the trunk's (detached
        here); positions [B, S, A, 3]: the structures to judge (no gradient)."""
        if self.recompute and self.training and torch.is_grad_enabled():
            # The inputs arrive detached: an empty input that requires grad makes the reentrant
            # checkpoint's outputs carry the gradient of the head's own weights.
            anchor = single.new_empty(0, requires_grad=True)
            logits = checkpointed(
                functools.partial(self._logit_tuple, batch), s_inputs, single, pair, positions, anchor
            )
            return dict(zip(OUTPUT_NAMES, logits))
        return self._logits(s_inputs, single, pair, positions, batch)

    def _logit_tuple(self, batch: dict, s_inputs, single, pair, positions, _anchor) -> tuple:
        logits = self._logits(s_inputs, single, pair, positions, batch)  # once, then each output by name
        return tuple(logits[name] for name in OUTPUT_NAMES)

    def _logits(
        self, s_inputs: torch.Tensor, single: torch.Tensor, pair: torch.Tensor, positions: torch.Tensor, batch: dict
    ) -> dict:
        batch_size, samples = positions.shape[:2]
        num_tokens = single.shape[1]
        token_mask = batch["token_pad_mask"]
        pair_mask = token_mask[:, :, None] & token_mask[:, None, :]
        s_inputs, single, pair = s_inputs.detach(), single.detach(), pair.detach()
        if self.single_norm is not None:
            single = self.single_norm(single.clamp(-self.SINGLE_CLAMP, self.SINGLE_CLAMP))
        z = pair + self.left_inputs(s_inputs)[:, :, None] + self.right_inputs(s_inputs)[:, None, :]
        represented = gather_atoms(positions.detach().float(), representative_atom_index(batch))  # [B, S, N, 3]
        distance = (
            pairwise_distances(represented, represented)
            if self.distance_mode is None
            else torch.cdist(represented, represented, compute_mode=self.distance_mode)
        )
        features = distance_features(distance) * pair_mask[:, None, :, :, None]
        z = z[:, None] + self.distance(features)  # [B, S, N, N, c_z]
        if self.raw_distance is not None:
            z = z + self.raw_distance((distance * pair_mask[:, None]).unsqueeze(-1).to(z.dtype))
        s = single[:, None].expand(-1, samples, -1, -1)
        flat = batch_size * samples
        s, z = self.pairformer(
            s.reshape(flat, num_tokens, -1),
            z.reshape(flat, num_tokens, num_tokens, -1),
            token_mask.repeat_interleave(samples, 0),
            pair_mask.repeat_interleave(samples, 0),
        )
        s, z = s.view(batch_size, samples, num_tokens, -1), z.view(batch_size, samples, num_tokens, num_tokens, -1)
        if self.pde_symmetrised_input:
            pde = self.pde(self.pde_norm(z + z.transpose(2, 3)))
        else:
            pde = self.pde(self.pde_norm(z))
            pde = pde + pde.transpose(2, 3)
        slots = atom_slots(batch["atom_to_token"], batch["atom_pad_mask"], num_tokens)
        return {
            "pae_logits": self.pae(self.pae_norm(z)),
            "pde_logits": pde,
            "plddt_logits": self._per_atom(self.plddt_norm(s), self.plddt, batch["atom_to_token"], slots),
            "resolved_logits": self._per_atom(self.resolved_norm(s), self.resolved, batch["atom_to_token"], slots),
        }

    @staticmethod
    def _per_atom(
        s: torch.Tensor, weight: torch.Tensor, atom_to_token: torch.Tensor, slots: torch.Tensor
    ) -> torch.Tensor:
        """s [B, S, N, c_s] through the weight of each atom's slot -> [B, S, A, bins]."""
        per_slot = torch.einsum("bsnc,kcd->bsnkd", s, weight.to(s.dtype)).flatten(2, 3)  # [B, S, N * K, bins]
        index = (atom_to_token.long() * MAX_ATOMS_PER_TOKEN + slots)[:, None, :, None]
        return torch.gather(per_slot, 2, index.expand(-1, s.shape[1], -1, per_slot.shape[-1]))
