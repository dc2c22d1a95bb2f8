"""The AF3 trunk: embedders, template embedder, MSA module, Pairformer and the distogram head."""

from __future__ import annotations

import torch
from torch import nn

from featurecache.model.config import ModelConfig
from featurecache.model.embedders import InputEmbedder, TemplateEmbedder, single_inputs
from featurecache.model.heads import DistogramHead, distogram_loss
from featurecache.model.msa import MSAModule, msa_of_cycle
from featurecache.model.pairformer import Pairformer

# What the trunk reads from a collated batch (see featurecache.schema and loader.collate).
REQUIRED_INPUTS = (
    "restype", "residue_index", "token_index", "asym_id", "entity_id", "sym_id",
    "is_protein", "is_rna", "is_dna", "is_ligand", "msa_profile", "deletion_mean",
    "msa", "deletion_matrix", "msa_row_mask", "token_pad_mask",
    "template_restype", "template_backbone_pos", "template_backbone_mask",
    "template_pseudo_beta_pos", "template_pseudo_beta_mask", "template_mask",
)
# What `AF3Trunk.loss` reads besides the outputs.
LOSS_INPUTS = ("token_center_pos", "token_center_mask", "token_pad_mask")


class AF3Trunk(nn.Module):
    """Single and pair representations of a batch, and the distogram logits from the pair."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.input_embedder = InputEmbedder(config)
        self.template_embedder = TemplateEmbedder(config)
        self.msa_module = MSAModule(config)
        self.pairformer = Pairformer(
            config.num_pairformer_blocks, config.c_s, config.c_z, config.single_heads,
            config.single_head_dim, config.pair_heads, config.pair_head_dim,
            config.transition_expansion, checkpoint_blocks=config.checkpoint_blocks, kernels=config.kernels,
            dropout=config.pair_dropout,
        )
        self.distogram_head = DistogramHead(config.c_z, config.distogram_bins)

    def forward(self, batch: dict) -> dict:
        missing = [name for name in REQUIRED_INPUTS if name not in batch]
        if missing:
            raise KeyError(f"AF3Trunk: batch is missing {missing}; build it with featurecache.collate")
        token_mask = batch["token_pad_mask"]
        pair_mask = token_mask[:, :, None] & token_mask[:, None, :]
        inputs = single_inputs(batch)
        s, z = self.input_embedder(batch, inputs)
        z = z + self.template_embedder(batch, z, pair_mask)
        z = self.msa_module(msa_of_cycle(batch, 0), inputs, z, token_mask, pair_mask)
        s, z = self.pairformer(s, z, token_mask, pair_mask)
        return {"single": s, "pair": z, "distogram_logits": self.distogram_head(z)}

    def compile_blocks(self, **options) -> None:
        """torch.compile every block of the Pairformer, MSA and template stacks in place.

        Per block rather than the whole model: blocks of a stack share one compiled graph (their
        parameters are graph inputs), so compile time does not grow with depth, and activation
        checkpointing stays outside the compiled regions.
        """
        for stack in (self.pairformer.blocks, self.msa_module.blocks, self.template_embedder.blocks):
            for block in stack:
                block.compile(**options)

    def loss(self, batch: dict, outputs: dict) -> torch.Tensor:
        """Distogram loss on the resolved, unpadded token centres."""
        mask = batch["token_center_mask"] & batch["token_pad_mask"]
        return distogram_loss(outputs["distogram_logits"], batch["token_center_pos"], mask,
                              self.config.distogram_min, self.config.distogram_max)
