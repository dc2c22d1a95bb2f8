"""The full AF3 model (Algorithm 1): atom-aware input embedder, recycled trunk (templates, MSA
module, Pairformer), distogram head, the diffusion module and the confidence head, with their
training losses (SI 4) and the sampler for inference.

Training:   outputs = model(batch, num_cycles=sample_num_cycles(generator, config.trunk.max_recycling_cycles),
                            generator=generator)  # on config.diffusion.diffusion_batch noised copies
            loss, metrics = model.loss(batch, outputs)
Inference:  outputs = model.sample(batch, num_cycles=4, num_samples=5, generator=generator)
            (positions, and the confidence logits of each sample)
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from featurecache.kernels.layernorm_linear import LayerNormLinear
from featurecache.model.config import ModelConfig
from featurecache.model.dialect import hold_at_zero, protenix_absent
from featurecache.model.network.atom_attention import ATOM_INPUTS, AtomWindows
from featurecache.model.network.atoms import atom_flags, distogram_atoms, token_bond_atoms
from featurecache.model.network.checkpointing import maybe_checkpointed
from featurecache.model.network.confidence import ConfidenceHead
from featurecache.model.network.diffusion import DiffusionContext, DiffusionModule
from featurecache.model.network.diffusion_sampler import (
    Denoiser,
    centre_random_augmentation,
    sample_diffusion,
    sample_noise_levels,
    standard_normal,
)
from featurecache.model.network.embedders import AtomInputEmbedder, TemplateEmbedder, atom_single_input_dim
from featurecache.model.network.heads import DistogramHead, distogram_loss
from featurecache.model.network.layers import kernel_module
from featurecache.model.network.msa import MSAModule, msa_of_cycle
from featurecache.model.network.pairformer import Pairformer
from featurecache.model.objectives.confidence_losses import confidence_losses, confidence_rows
from featurecache.model.objectives.losses import (
    aligned_mse_loss,
    bond_loss,
    edm_loss_weight,
    mse_atom_weights,
    smooth_lddt_loss,
)
from featurecache.model.objectives.permutation import align_ground_truth, ground_truth_sources, relabelled

# What the trunk reads per token, MSA row and template from a collated batch (see
# featurecache.schema and loader.collate); the atom inputs are the atom attention's.
TOKEN_INPUTS = (
    "restype",
    "residue_index",
    "token_index",
    "asym_id",
    "entity_id",
    "sym_id",
    "is_protein",
    "is_rna",
    "is_dna",
    "is_ligand",
    "msa_profile",
    "deletion_mean",
    "msa",
    "deletion_matrix",
    "msa_row_mask",
    "token_pad_mask",
    "template_restype",
    "template_backbone_pos",
    "template_backbone_mask",
    "template_pseudo_beta_pos",
    "template_pseudo_beta_mask",
    "template_mask",
)
REQUIRED_INPUTS = (*TOKEN_INPUTS, *ATOM_INPUTS, "token_bonds", "token_bond_mask")
# What `AF3Model.loss` reads besides the outputs.
LOSS_INPUTS = (
    "atom_pos",
    "atom_mask",
    "atom_pad_mask",
    "atom_to_token",
    "distogram_atom_index",
    "frame_atom_index",
    "token_bonds",
    "token_bond_mask",
    "is_dna",
    "is_rna",
    "is_ligand",
    "token_pad_mask",
    "atom_permutations",
)
# What it reads where a batch has it (collate adds it; a hand-built batch may not).
OPTIONAL_LOSS_INPUTS = ("resolution",)


def sample_num_cycles(generator: torch.Generator | None, max_cycles: int = 4) -> int:
    """N_cycle for one training step, uniform in 1..max_cycles (AF3 trains with 1..4)."""
    return int(torch.randint(1, max_cycles + 1, (), generator=generator))


class AF3Model(nn.Module):
    """AF3: `trunk` (Algorithm 1, lines 1-13), `forward` (the trunk, the diffusion training batch
    and the confidence head on a mini-rollout), `loss`, and `sample` (Algorithm 18 and the
    confidence head) for inference. Same parameters on both kernel paths (config.runtime.kernels);
    config.confidence.confidence_head = False leaves the head out."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        kernels, trunk = config.runtime.kernels, config.trunk
        self.input_embedder = AtomInputEmbedder(config)
        # Algorithm 1, lines 8 and 11: the previous cycle's s and z, LayerNorm + LinearNoBias
        self.recycle_single = kernel_module(LayerNormLinear, trunk.c_s, trunk.c_s, bias=False, kernels=kernels)
        self.recycle_pair = kernel_module(LayerNormLinear, trunk.c_z, trunk.c_z, bias=False, kernels=kernels)
        self.template_embedder = TemplateEmbedder(config)
        self.msa_module = MSAModule(config, single_input_dim=atom_single_input_dim(config))
        self.pairformer = Pairformer(
            trunk.pairformer_blocks,
            trunk.c_s,
            trunk.c_z,
            trunk.single_heads,
            trunk.single_head_dim,
            trunk.pair_heads,
            trunk.pair_head_dim,
            trunk.transition_expansion,
            checkpoint_blocks=config.runtime.checkpoint_blocks,
            kernels=kernels,
            dropout=trunk.pair_dropout,
            checkpoint_group=config.runtime.checkpoint_group,
            mult_hidden=config.dialect.triangle_mult_hidden,
        )
        self.distogram_head = DistogramHead(trunk.c_z, trunk.distogram_bins)
        self.diffusion_module = DiffusionModule(config, atom_single_input_dim(config))
        self.confidence_head = (
            ConfidenceHead(config, atom_single_input_dim(config)) if config.confidence.confidence_head else None
        )
        if config.dialect.protenix_parameters_only:  # Protenix's parameter set: what it lacks stays zero
            hold_at_zero(self, protenix_absent(self))

    def compile_blocks(self, **options) -> None:
        """torch.compile every block of the Pairformer, MSA and template stacks in place.

        Per block rather than the whole model: blocks of a stack share one compiled graph (their
        parameters are graph inputs), so compile time does not grow with depth, and activation
        checkpointing stays outside the compiled regions. The conditioned transformers take a
        layout object and are left eager for now."""
        for stack in (self.pairformer.blocks, self.msa_module.blocks, self.template_embedder.blocks):
            for block in stack:
                block.compile(**options)

    def _windows(self, batch: dict) -> AtomWindows:
        atom_attention = self.config.atom_attention
        return AtomWindows(batch["atom_pad_mask"], atom_attention.atom_window_queries, atom_attention.atom_window_keys)

    def trunk(self, batch: dict, num_cycles: int, generator: torch.Generator | None = None) -> dict:
        """Algorithm 1, lines 1-13 and the distogram: s_inputs, single, pair, distogram_logits.

        Only the last cycle keeps a graph: earlier cycles run without gradient (AF3). `generator`
        seeds the dropout of every cycle while training (None: the device's default generator).
        """
        missing = [name for name in REQUIRED_INPUTS if name not in batch]
        if missing:
            raise KeyError(f"AF3Model: batch is missing {missing}; build it with featurecache.collate")
        if num_cycles < 1:
            raise ValueError(f"AF3Model: num_cycles must be >= 1, got {num_cycles}")
        token_mask = batch["token_pad_mask"]
        pair_mask = token_mask[:, :, None] & token_mask[:, None, :]
        s_inputs, s_init, z_init = self.input_embedder(batch, self._windows(batch))
        grad_enabled = torch.is_grad_enabled()
        s, z = torch.zeros_like(s_init), torch.zeros_like(z_init)  # the first cycle recycles zeros
        for cycle in range(num_cycles):
            with torch.set_grad_enabled(grad_enabled and cycle == num_cycles - 1):
                z = z_init + self.recycle_pair(z.detach())
                s = s_init + self.recycle_single(s.detach())
                z = z + self.template_embedder(batch, z, pair_mask, generator)
                z = self.msa_module(msa_of_cycle(batch, cycle), s_inputs, z, token_mask, pair_mask, generator)
                s, z = self.pairformer(s, z, token_mask, pair_mask, generator)
        # re-run in backward with grouped checkpoints: its input z + z^T is a pair kept until the
        # trunk's backward
        logits = maybe_checkpointed(self._recomputes_losses(), self.distogram_head, z)
        return {"s_inputs": s_inputs, "single": s, "pair": z, "distogram_logits": logits}

    def diffusion_context(self, batch: dict, trunk: dict) -> DiffusionContext:
        return self.diffusion_module.prepare(
            batch, self._windows(batch), trunk["s_inputs"], trunk["single"], trunk["pair"]
        )

    def forward(
        self,
        batch: dict,
        num_cycles: int = 1,
        diffusion_batch: int | None = None,
        generator: torch.Generator | None = None,
    ) -> dict:
        """The trunk once, then the diffusion training batch (AF3 SI 3.7.1): diffusion_batch copies
        (None: config.diffusion.diffusion_batch) of the ground truth, each randomly rotated and
        translated, noised at its own level sigma, and denoised with the one trunk output. Adds
        `denoised_positions` [B, S, A, 3] and `noise_level` [B, S] to the trunk's outputs (none
        with diffusion_batch = 0: the trunk alone).

        With the confidence head (SI 4.3): a mini-rollout of the sampler (confidence_rollout_steps,
        no gradient) gives `rollout_positions` [B, R, A, 3], and the head's logits on them
        (`plddt_logits`, `pae_logits`, `pde_logits`, `resolved_logits`) train it. With
        config.loss.permutation_alignment the truth is aligned to the rollout (SI 4.2) before the
        diffusion batch is built from it, and `aligned_atom_pos` / `aligned_atom_mask` carry that
        truth to the loss. The random draws keep their order (augmentation, noise levels, noise,
        then the rollout)."""
        outputs = self.trunk(batch, num_cycles, generator)
        if diffusion_batch is None:
            diffusion_batch = self.config.diffusion.diffusion_batch
        if diffusion_batch < 1:
            return outputs
        atom_resolved = batch["atom_mask"] & batch["atom_pad_mask"]
        true = batch["atom_pos"].float().unsqueeze(1).expand(-1, diffusion_batch, -1, -1)
        clean = centre_random_augmentation(
            true, atom_resolved, generator, self.config.diffusion.augmentation_translation
        )
        sigma = sample_noise_levels(clean.shape[:2], self.config, generator, clean.device)
        noise = standard_normal(clean.shape, generator, clean.device)
        context = self.diffusion_context(batch, outputs)
        if self.confidence_head is not None:
            with torch.no_grad():
                outputs["rollout_positions"] = self._sample_positions(
                    batch,
                    context,
                    self.config.confidence.confidence_rollout_samples,
                    self.config.confidence.confidence_rollout_steps,
                    generator,
                )
            if self.config.loss.permutation_alignment:
                # SI 4.2: the truth relabelled to fit the rollout; its augmented copies follow (the
                # augmentation is a rigid map of each atom about the resolved atoms' centre, which
                # a relabelling keeps)
                sources = ground_truth_sources(batch, outputs)
                clean = torch.gather(clean, 2, sources[:, None, :, None].expand_as(clean))
                batch = relabelled(batch, sources)
                outputs["aligned_atom_pos"], outputs["aligned_atom_mask"] = batch["atom_pos"], batch["atom_mask"]
        noisy = clean + sigma[..., None, None] * noise
        outputs["denoised_positions"] = self.diffusion_module(noisy, sigma, context)
        outputs["noise_level"] = sigma
        if self.confidence_head is not None:
            outputs.update(self._confidence(batch, outputs, outputs["rollout_positions"]))
        return outputs

    def _sample_positions(
        self,
        batch: dict,
        context: DiffusionContext,
        num_samples: int,
        num_steps: int | None,
        generator: torch.Generator | None,
        wrap_denoiser: Callable[[Denoiser], Denoiser] | None = None,
    ) -> torch.Tensor:
        """Algorithm 18 with the diffusion module bound to `context`: [B, num_samples, A, 3]."""
        atom_mask = batch["atom_pad_mask"]
        context = self.diffusion_module.for_sampling(context)  # the steps share the attention biases
        shape = (atom_mask.shape[0], num_samples, atom_mask.shape[1], 3)

        def denoise(noisy: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
            return self.diffusion_module(noisy, sigma, context)

        return sample_diffusion(
            denoise if wrap_denoiser is None else wrap_denoiser(denoise),
            shape,
            atom_mask,
            self.config,
            num_steps=num_steps,
            generator=generator,
            device=atom_mask.device,
        )

    def _confidence(self, batch: dict, outputs: dict, positions: torch.Tensor) -> dict:
        """The confidence head's logits on positions [B, S, A, 3] (the trunk detached inside)."""
        return self.confidence_head(outputs["s_inputs"], outputs["single"], outputs["pair"], positions, batch)

    @torch.no_grad()
    def sample(
        self,
        batch: dict,
        num_cycles: int = 4,
        num_samples: int = 5,
        num_steps: int | None = None,
        generator: torch.Generator | None = None,
        wrap_denoiser: Callable[[Denoiser], Denoiser] | None = None,
        confidences: bool = True,
    ) -> dict:
        """Inference: the trunk, then Algorithm 18 for num_samples structures ([B, S, A, 3] under
        `positions`; padding atoms are meaningless), and with the confidence head (unless
        `confidences` is False: validation scores the positions alone) its logits for each of
        them. num_steps defaults to config.sampler.sampler_steps. `wrap_denoiser` takes
        the diffusion module bound to this batch's trunk outputs, denoise(x_noisy, sigma), and
        returns what the sampler calls in its place (prediction/sampler_graph.py: a CUDA graph)."""
        outputs = self.trunk(batch, num_cycles)
        context = self.diffusion_context(batch, outputs)
        outputs["positions"] = self._sample_positions(batch, context, num_samples, num_steps, generator, wrap_denoiser)
        if self.confidence_head is not None and confidences:
            outputs.update(self._confidence(batch, outputs, outputs["positions"]))
        return outputs

    def loss(self, batch: dict, outputs: dict) -> tuple[torch.Tensor, dict]:
        """AF3's loss (SI 4.1, eq. 2): diffusion_loss_weight * L_diffusion + distogram_loss_weight *
        L_distogram + confidence_loss_weight * L_confidence, with L_diffusion = mean over samples of
        edm_weight(sigma) (L_MSE + bond_loss_weight L_bond) + L_smooth_lddt (SI 4.2, eq. 6) and
        L_confidence = the weighted sum of L_plddt, L_pde, L_resolved and L_pae (SI 4.3) on the
        mini-rollout, over the rows whose resolution is in config.loss.confidence_resolution_range.

        Returns the loss and a dict of detached 0-d tensors (no host sync): loss, distogram,
        diffusion, mse, smooth_lddt, bond, and with the head confidence, plddt, pae, pde, resolved.
        """
        with torch.autocast(outputs["pair"].device.type, enabled=False):  # fp32: the SVD, the distances
            if "aligned_atom_pos" in outputs:  # SI 4.2: aligned in forward, before the diffusion batch
                batch = {**batch, "atom_pos": outputs["aligned_atom_pos"], "atom_mask": outputs["aligned_atom_mask"]}
            elif self.config.loss.permutation_alignment:  # no mini-rollout: to the least noisy denoised sample
                batch = align_ground_truth(batch, outputs)
            return self._loss(batch, outputs)

    def _loss(self, batch: dict, outputs: dict) -> tuple[torch.Tensor, dict]:
        config = self.config
        weights = config.loss
        metrics = {"distogram": self._distogram_loss(batch, outputs)}
        loss = weights.distogram_loss_weight * metrics["distogram"]
        if "denoised_positions" in outputs:
            parts = self._diffusion_losses(batch, outputs)
            metrics.update({name: value.mean() for name, value in parts.items()})
            weight = edm_loss_weight(outputs["noise_level"].float(), config.diffusion.sigma_data)
            diffusion = weight * (parts["mse"] + weights.bond_loss_weight * parts["bond"]) + parts["smooth_lddt"]
            metrics["diffusion"] = diffusion.mean()
            loss = loss + weights.diffusion_loss_weight * metrics["diffusion"]
        if "plddt_logits" in outputs:
            rows = confidence_rows(batch, weights.confidence_resolution_range)  # SI 4.3: 0.1-4 A structures
            parts = confidence_losses(
                outputs,
                outputs["rollout_positions"],
                batch,
                self._recomputes_losses(),
                rows,
                config.dialect.plddt_bins_protenix,
                config.dialect.pde_distogram_atoms,
            )
            metrics.update(parts)
            metrics["confidence"] = (
                weights.plddt_loss_weight * parts["plddt"]
                + weights.pde_loss_weight * parts["pde"]
                + weights.resolved_loss_weight * parts["resolved"]
                + weights.pae_loss_weight * parts["pae"]
            )
            loss = loss + weights.confidence_loss_weight * metrics["confidence"]
        metrics["loss"] = loss
        return loss, {name: value.detach() for name, value in metrics.items()}

    def _distogram_loss(self, batch: dict, outputs: dict) -> torch.Tensor:
        """Distogram on AF3's representative atoms (CB, CA of glycine, C4 / C2 of nucleotides)."""
        positions, mask = distogram_atoms(batch)
        # re-run in backward with grouped checkpoints: its fp32 copy of the logits and their
        # log-softmax are two pair-sized tensors
        return maybe_checkpointed(
            self._recomputes_losses(),
            distogram_loss,
            outputs["distogram_logits"],
            positions,
            mask,
            self.config.trunk.distogram_min,
            self.config.trunk.distogram_max,
        )

    def _recomputes_losses(self) -> bool:
        """With grouped checkpoints (config.runtime.checkpoint_group, for long crops) the losses over
        token pairs are re-run in backward instead of keeping their pair-sized intermediates."""
        return self.config.runtime.checkpoint_blocks and self.config.runtime.checkpoint_group > 1 and self.training

    def _diffusion_losses(self, batch: dict, outputs: dict) -> dict:
        """Per diffusion sample [B, S]: mse, smooth_lddt, bond."""
        config = self.config
        predicted = outputs["denoised_positions"].float()
        true = batch["atom_pos"].float()
        resolved = batch["atom_mask"] & batch["atom_pad_mask"]
        atom_to_token = batch["atom_to_token"]

        is_dna, is_rna, is_ligand = (
            atom_flags(batch[name], atom_to_token) for name in ("is_dna", "is_rna", "is_ligand")
        )
        weights = mse_atom_weights(
            is_dna,
            is_rna,
            is_ligand,
            resolved,
            config.loss.mse_weight_dna,
            config.loss.mse_weight_rna,
            config.loss.mse_weight_ligand,
        )
        bonds = token_bond_atoms(
            batch["token_bonds"], batch["token_bond_mask"], atom_to_token, batch["atom_pad_mask"], true, resolved
        )
        return {
            "mse": aligned_mse_loss(predicted, true, weights, resolved),
            "smooth_lddt": smooth_lddt_loss(predicted, true, is_dna | is_rna, resolved, config.runtime.kernels),
            "bond": bond_loss(predicted, true, bonds),
        }
