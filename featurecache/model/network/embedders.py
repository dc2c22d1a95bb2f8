"""Input, relative-position and template embedders (AF3 Algorithms 1-3 and 16).

The input embedder, `AtomInputEmbedder`, is AF3's: the atom attention encoder over the reference
conformers gives each token its s_inputs, and the initial pair also gets the token bonds.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from featurecache.model.config import ModelConfig
from featurecache.model.network.atom_attention import AtomAttentionEncoder, AtomWindows
from featurecache.model.network.atoms import dense_token_bonds
from featurecache.model.network.checkpointing import maybe_checkpointed
from featurecache.model.network.layers import Linear, derived_seeds, dropout_seed
from featurecache.model.network.pairformer import PairStack, run_blocks
from featurecache.schema import NUM_RESTYPES

# AF3's template distogram: 38 edges from 3.25 to 50.75 Angstrom, 39 bins.
TEMPLATE_DISTOGRAM_EDGES = (3.25, 50.75, 38)
TEMPLATE_FEATURE_DIM = 39 + 1 + 3 + 1 + 2 * NUM_RESTYPES


class RelativePositionEncoding(nn.Module):
    """Algorithm 3: residue, token and chain offsets, clipped and one-hot, projected to c_z.

    `chain_gate` picks the pairs whose sym_id offset is encoded (d_chain): "entity" as AF3's
    and Protenix's code, every pair of one entity (two copies of A in A2B get +-1, a chain with
    itself 0, A with B the "other" class); "chain" as the supplement prints it, every pair of
    different chains (A with B too, from their unrelated sym_ids), a chain with itself "other"."""

    def __init__(self, c_z: int, max_residue: int = 32, max_chain: int = 2, chain_gate: str = "entity") -> None:
        super().__init__()
        self.max_residue = max_residue
        self.max_chain = max_chain
        self.chain_gate = chain_gate
        in_dim = 2 * (2 * max_residue + 2) + 1 + (2 * max_chain + 2)
        self.linear = Linear(in_dim, c_z, bias=False)

    def forward(self, batch: dict) -> torch.Tensor:
        """[B, N, N, c_z]: `linear` of the one-hot features, as the sum of the weight columns they
        pick. The one-hot form is [B, N, N, 139] floats whatever c_z (82 MB at N = 384, kept for
        the weight's gradient): more than the pair itself at small widths. Under autocast, in the
        autocast dtype, as the linear layer's output would be."""
        d_residue, d_token, same_entity, d_chain = self.classes(batch)
        columns = self.linear.weight.t()  # [in_dim, c_z], its rows in the order of `features`
        width = 2 * self.max_residue + 2
        out = (
            F.embedding(d_residue, columns[:width])
            + F.embedding(d_token, columns[width : 2 * width])
            + same_entity.unsqueeze(-1) * columns[2 * width]
            + F.embedding(d_chain, columns[2 * width + 1 :])
        )
        device = out.device.type
        return out.to(torch.get_autocast_dtype(device)) if torch.is_autocast_enabled(device) else out

    def features(self, batch: dict) -> torch.Tensor:
        """[B, N, N, in_dim] bool: one-hot d_residue, one-hot d_token, same entity, one-hot d_chain
        (what `forward` projects; for tests and for reading the encoding)."""
        d_residue, d_token, same_entity, d_chain = self.classes(batch)
        r, c = self.max_residue, self.max_chain
        return torch.cat(
            [
                F.one_hot(d_residue, 2 * r + 2),
                F.one_hot(d_token, 2 * r + 2),
                same_entity.unsqueeze(-1),
                F.one_hot(d_chain, 2 * c + 2),
            ],
            dim=-1,
        ).bool()

    def classes(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The features' classes, [B, N, N] each: d_residue, d_token (long), same entity (bool),
        d_chain (long)."""

        def pairwise(name):
            value = batch[name].long()
            return value[:, :, None], value[:, None, :]

        asym_i, asym_j = pairwise("asym_id")
        res_i, res_j = pairwise("residue_index")
        tok_i, tok_j = pairwise("token_index")
        ent_i, ent_j = pairwise("entity_id")
        sym_i, sym_j = pairwise("sym_id")
        same_chain = asym_i == asym_j
        same_residue = res_i == res_j
        same_entity = ent_i == ent_j
        r, c = self.max_residue, self.max_chain
        d_residue = torch.where(same_chain, (res_i - res_j + r).clamp(0, 2 * r), 2 * r + 1)
        d_token = torch.where(same_chain & same_residue, (tok_i - tok_j + r).clamp(0, 2 * r), 2 * r + 1)
        chain_pairs = same_entity if self.chain_gate == "entity" else ~same_chain
        d_chain = torch.where(chain_pairs, (sym_i - sym_j + c).clamp(0, 2 * c), 2 * c + 1)
        return d_residue, d_token, same_entity, d_chain


def atom_single_input_dim(config: ModelConfig) -> int:
    """Width of AF3's s_inputs: the atom encoder's token single (c_s), restype one-hot, MSA
    profile and deletion mean (449 at AF3's sizes)."""
    return config.trunk.c_s + 2 * NUM_RESTYPES + 1


class AtomInputEmbedder(nn.Module):
    """Algorithm 2 (InputFeatureEmbedder) and Algorithm 1, lines 2-5: s_inputs, s_init, z_init.

    z_init's outer sum projects s_inputs (Algorithm 1 line 3, AF3's code), or with
    config.dialect.pair_init_from_single s_init, as Protenix does."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        inputs, trunk, dialect = atom_single_input_dim(config), config.trunk, config.dialect
        self.pair_from_single = dialect.pair_init_from_single
        pair_source = trunk.c_s if self.pair_from_single else inputs
        self.atom_encoder = AtomAttentionEncoder(
            config, c_token=trunk.c_s, with_trunk=False, num_blocks=dialect.input_atom_blocks
        )
        self.to_single = Linear(inputs, trunk.c_s, bias=False)
        self.to_pair_i = Linear(pair_source, trunk.c_z, bias=False)
        self.to_pair_j = Linear(pair_source, trunk.c_z, bias=False)
        self.relpos = RelativePositionEncoding(
            trunk.c_z, trunk.relpos_max_residue, trunk.relpos_max_chain, trunk.relpos_chain_gate
        )
        self.from_token_bonds = Linear(1, trunk.c_z, bias=False)
        # with grouped checkpoints (a long crop) z_init is re-run in backward: its relative-position
        # one-hot [B, N, N, 139] (1.8 GB at crop 2,560) would otherwise live through the whole step
        self.recompute_pair = config.runtime.checkpoint_blocks and config.runtime.checkpoint_group > 1

    def forward(self, batch: dict, windows: AtomWindows) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """s_inputs [B, N, atom_single_input_dim], s_init [B, N, c_s], z_init [B, N, N, c_z]."""
        atom_cond, atom_pair = self.atom_encoder.condition(batch, windows)
        token_single = self.atom_encoder(batch, windows, atom_cond, atom_pair)[0].squeeze(1)
        s_inputs = torch.cat(
            [
                token_single,
                F.one_hot(batch["restype"].long(), NUM_RESTYPES).to(token_single.dtype),
                batch["msa_profile"].to(token_single.dtype),
                batch["deletion_mean"].to(token_single.dtype).unsqueeze(-1),
            ],
            dim=-1,
        )
        bonds = dense_token_bonds(batch["token_bonds"], batch["token_bond_mask"], s_inputs.shape[1])
        s_init = self.to_single(s_inputs)
        pair_source = s_init if self.pair_from_single else s_inputs
        z = maybe_checkpointed(self.recompute_pair and self.training, self._initial_pair, batch, pair_source, bonds)
        return s_inputs, s_init, z

    def _initial_pair(self, batch: dict, single: torch.Tensor, bonds: torch.Tensor) -> torch.Tensor:
        """z_init [B, N, N, c_z] (Algorithm 1, lines 3-5): outer sum of `single` (s_inputs or
        s_init), relative positions, bonds."""
        return (
            self.to_pair_i(single)[:, :, None]
            + self.to_pair_j(single)[:, None, :]
            + self.relpos(batch)
            + self.from_token_bonds(bonds.unsqueeze(-1).to(single.dtype))
        )


def _backbone_frames(backbone: torch.Tensor) -> torch.Tensor:
    """Rotation [.., 3, 3] (columns e1, e2, e3) of each residue from N, CA, C by Gram-Schmidt."""
    n_pos, ca_pos, c_pos = backbone.unbind(-2)
    e1 = F.normalize(c_pos - ca_pos, dim=-1, eps=1e-6)
    u2 = n_pos - ca_pos
    e2 = F.normalize(u2 - (u2 * e1).sum(-1, keepdim=True) * e1, dim=-1, eps=1e-6)
    return torch.stack([e1, e2, torch.cross(e1, e2, dim=-1)], dim=-1)


def template_pair_features(batch: dict, index: int) -> torch.Tensor:
    """[B, N, N, TEMPLATE_FEATURE_DIM] features of template `index` (Algorithm 16, lines 1-7)."""
    pos = batch["template_pseudo_beta_pos"][:, index].float()
    pb_mask = batch["template_pseudo_beta_mask"][:, index]
    backbone = batch["template_backbone_pos"][:, index].float()
    bb_mask = batch["template_backbone_mask"][:, index].all(dim=-1)
    restype = batch["template_restype"][:, index].long()
    asym = batch["asym_id"]
    same_chain = (asym[:, :, None] == asym[:, None, :]).unsqueeze(-1).float()

    distance = (pos[:, :, None, :] - pos[:, None, :, :]).norm(dim=-1)
    low, high, count = TEMPLATE_DISTOGRAM_EDGES
    edges = torch.linspace(low, high, count, device=pos.device)
    distogram = F.one_hot(torch.bucketize(distance, edges), count + 1).float()
    pb_pair = (pb_mask[:, :, None] & pb_mask[:, None, :]).unsqueeze(-1).float()
    distogram = distogram * pb_pair

    # direction of CA_j in the backbone frame of residue i
    frames = _backbone_frames(backbone)
    ca = backbone[..., 1, :]
    offset = ca[:, None, :, :] - ca[:, :, None, :]
    local = torch.einsum("bidk,bijd->bijk", frames, offset)
    bb_pair = (bb_mask[:, :, None] & bb_mask[:, None, :]).unsqueeze(-1).float()
    unit = F.normalize(local, dim=-1, eps=1e-6) * bb_pair

    onehot = F.one_hot(restype, NUM_RESTYPES).float()
    length = restype.shape[1]
    geometry = torch.cat([distogram, pb_pair, unit, bb_pair], dim=-1) * same_chain
    return torch.cat(
        [
            geometry,
            onehot[:, :, None, :].expand(-1, -1, length, -1),
            onehot[:, None, :, :].expand(-1, length, -1, -1),
        ],
        dim=-1,
    )


class TemplateEmbedder(nn.Module):
    """Algorithm 16: each template's pair features through a small pair stack, averaged. With
    config.dialect.template_embedder_needs_blocks a stack of 0 blocks embeds nothing (Protenix: its 0.5
    models hold the embedder's weights without blocks, and never run it)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        templates = config.templates
        c_t = templates.c_template
        self.off = config.dialect.template_embedder_needs_blocks and templates.template_blocks == 0
        self.checkpoint_blocks = config.runtime.checkpoint_blocks
        # with grouped checkpoints (a long crop), each template's whole path is re-run in backward:
        # it would otherwise keep ~3 pair-sized tensors per template (20 GB at crop 2,560)
        self.recompute_templates = config.runtime.checkpoint_blocks and config.runtime.checkpoint_group > 1
        self.pair_norm = nn.LayerNorm(config.trunk.c_z)
        self.from_pair = Linear(config.trunk.c_z, c_t, bias=False)
        self.from_features = Linear(TEMPLATE_FEATURE_DIM, c_t, bias=False)
        self.blocks = nn.ModuleList(
            PairStack(
                c_t,
                templates.template_pair_heads,
                templates.template_pair_head_dim,
                templates.template_transition_expansion,
                kernels=config.runtime.kernels,
                dropout=config.trunk.pair_dropout,
                recompute_attention=self.recompute_templates,
                mult_hidden=config.dialect.template_triangle_mult_hidden,
            )
            for _ in range(templates.template_blocks)
        )
        self.out_norm = nn.LayerNorm(c_t)
        self.linear_out = Linear(c_t, config.trunk.c_z, bias=False)

    def forward(
        self, batch: dict, z: torch.Tensor, pair_mask: torch.Tensor, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """Update [B, N, N, c_z] to add to z; zeros where a sample has no template. `generator`:
        the step's, for the dropout seed (None: the device's default generator)."""
        template_mask = batch["template_mask"]  # [B, T]
        num_templates = template_mask.shape[1]
        if num_templates == 0 or self.off:
            return torch.zeros_like(z)
        # re-run in backward with grouped checkpoints: the projection's bf16 input is a pair kept
        # until the templates' backward (z itself is kept anyway, as the norm's input)
        z_in = maybe_checkpointed(self.recompute_templates and self.training, self._project_pair, z)
        dropout = self.training and self.blocks and self.blocks[0].dropout > 0
        seeds = derived_seeds(dropout_seed(generator, z.device), num_templates) if dropout else [None] * num_templates
        total = None
        # one template at a time: T pair stacks at once would multiply the peak memory by T
        for index in range(num_templates):
            embed = functools.partial(self._embed_template, batch, pair_mask, index, seeds[index])
            v = maybe_checkpointed(self.recompute_templates and self.training, embed, z_in)
            total = v if total is None else total + v
        count = template_mask.sum(dim=1).clamp(min=1).to(total.dtype)
        return self.linear_out(torch.relu(total / count[:, None, None, None]))

    def _project_pair(self, z: torch.Tensor) -> torch.Tensor:
        return self.from_pair(self.pair_norm(z))

    def _embed_template(
        self, batch: dict, pair_mask: torch.Tensor, index: int, seed: torch.Tensor | None, z_in: torch.Tensor
    ) -> torch.Tensor:
        """Template `index`'s [B, N, N, c_t] contribution: its features through the pair stack."""
        features = template_pair_features(batch, index).to(z_in.dtype)
        v = z_in + self.from_features(features)
        (v,) = run_blocks(self.blocks, self.checkpoint_blocks and self.training, v, masks=(pair_mask,), seed=seed)
        return self.out_norm(v) * batch["template_mask"][:, index, None, None, None].to(v.dtype)
