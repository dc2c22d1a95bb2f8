"""The diffusion module (AF3 Algorithms 20-22) with EDM preconditioning.

Symbols: t-hat / sigma (`sigma`, noise level in Angstrom, one per diffusion sample [B, S]),
sigma_data (16 A), x_noisy (`noisy_positions` [B, S, A, 3]), r_noisy (`scaled_positions`),
s_inputs / s_trunk / z_trunk (the trunk's outputs, shared by the S samples of a trunk pass).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
from torch import nn

from featurecache.kernels.layernorm_linear import LayerNormLinear
from featurecache.kernels.transition import Transition
from featurecache.model.config import ModelConfig
from featurecache.model.network.atom_attention import AtomAttentionDecoder, AtomAttentionEncoder, AtomWindows
from featurecache.model.network.checkpointing import maybe_checkpointed
from featurecache.model.network.embedders import RelativePositionEncoding
from featurecache.model.network.layers import full_precision, kernel_module
from featurecache.model.network.transformer import (
    BlockConditioning,
    ConditionedTransformer,
    StackedConditioningWeights,
    TokenLayout,
)


def edm_preconditioning(sigma: torch.Tensor, sigma_data: float):
    """EDM's scalings (Karras et al. 2022) as AF3 uses them (Algorithm 20, SI 3.7.1):
    c_skip = sd^2 / (sd^2 + s^2), c_out = s sd / sqrt(sd^2 + s^2), c_in = 1 / sqrt(sd^2 + s^2),
    c_noise = log(s / sd) / 4."""
    variance = sigma.square() + sigma_data**2
    c_skip = sigma_data**2 / variance
    c_out = sigma * sigma_data / variance.sqrt()
    c_in = variance.rsqrt()
    c_noise = torch.log(sigma / sigma_data) / 4.0
    return c_skip, c_out, c_in, c_noise


class FourierEmbedding(nn.Module):
    """Algorithm 22: cos(2 pi (t w + b)) with w, b ~ N(0, 1) drawn once and frozen (buffers, so
    a checkpoint carries them)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.register_buffer("weight", torch.randn(dim))
        self.register_buffer("bias", torch.randn(dim))

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        """t [...] -> [..., dim]"""
        return torch.cos(2 * math.pi * (t.unsqueeze(-1) * self.weight + self.bias))


class DiffusionConditioning(nn.Module):
    """Algorithm 21: the pair conditioning (trunk pair + relative positions, two transitions) and
    the single conditioning (trunk single + s_inputs + the noise level's Fourier embedding, two
    transitions)."""

    def __init__(self, config: ModelConfig, c_s_inputs: int) -> None:
        super().__init__()
        kernels, trunk = config.runtime.kernels, config.trunk
        self.sigma_data = config.diffusion.sigma_data
        self.relpos = RelativePositionEncoding(
            trunk.c_z, trunk.relpos_max_residue, trunk.relpos_max_chain, trunk.relpos_chain_gate
        )
        self.pair_in = kernel_module(LayerNormLinear, 2 * trunk.c_z, trunk.c_z, bias=False, kernels=kernels)
        self.pair_transitions = nn.ModuleList(
            kernel_module(Transition, trunk.c_z, expansion=2, kernels=kernels) for _ in range(2)
        )
        # Always the PyTorch path (same parameters): the fused kernel keeps a whole input row in
        # shared memory, and 833 fp32 columns (padded to 1024) need 320 KB, over the H200's 227 KB.
        # It runs on [B, N, 833] once per denoising call, a negligible cost.
        self.single_in = kernel_module(LayerNormLinear, trunk.c_s + c_s_inputs, trunk.c_s, bias=False, kernels="torch")
        self.fourier = FourierEmbedding(config.diffusion.fourier_dim)
        self.noise_in = kernel_module(
            LayerNormLinear, config.diffusion.fourier_dim, trunk.c_s, bias=False, kernels=kernels
        )
        self.single_transitions = nn.ModuleList(
            kernel_module(Transition, trunk.c_s, expansion=2, kernels=kernels) for _ in range(2)
        )

    def pair(self, batch: dict, trunk_pair: torch.Tensor) -> torch.Tensor:
        """[B, N, N, c_z], independent of the noise: once per trunk pass."""
        z = self.pair_in(torch.cat([trunk_pair, self.relpos(batch).to(trunk_pair.dtype)], dim=-1))
        for transition in self.pair_transitions:
            z = z + transition(z)
        return z

    def single_of_trunk(self, s_inputs: torch.Tensor, trunk_single: torch.Tensor) -> torch.Tensor:
        """Algorithm 21's single before the noise: [B, 1, N, c_s], once per trunk pass."""
        return self.single_in(torch.cat([trunk_single, s_inputs], dim=-1)).unsqueeze(1)

    def single(
        self,
        s_inputs: torch.Tensor,
        trunk_single: torch.Tensor,
        sigma: torch.Tensor,
        of_trunk: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """[B, N, ...] trunk features and sigma [B, S] -> [B, S, N, c_s]; of_trunk:
        single_of_trunk(s_inputs, trunk_single) if already computed."""
        s = self.single_of_trunk(s_inputs, trunk_single) if of_trunk is None else of_trunk  # [B, 1, N, c_s]
        noise = self.fourier(torch.log(sigma / self.sigma_data) / 4.0)  # c_noise, [B, S, fourier]
        s = s + self.noise_in(noise.to(s.dtype)).unsqueeze(2)
        for transition in self.single_transitions:
            s = s + transition(s)
        return s


@dataclass
class DiffusionContext:
    """What every denoising call of one trunk pass shares (the sampler's 200 steps reuse it)."""

    batch: dict
    windows: AtomWindows
    s_inputs: torch.Tensor  # [B, N, c_s_inputs]
    trunk_single: torch.Tensor  # [B, N, c_s]
    pair: torch.Tensor  # conditioned pair [B, N, N, c_z]
    atom_cond: torch.Tensor  # c_l [B, 1, A, c_atom]
    atom_pair: torch.Tensor  # p_lm [B, W, Q, K, c_atompair]
    # What the denoiser computes from the trunk alone, not the noise: the single conditioning's
    # trunk part, each transformer block's attention bias and each atom transformer block's s
    # side (from c_l), computed once for the calls of a sampler (DiffusionModule.for_sampling);
    # None where each call computes its own (training's call, which takes their gradients).
    single_of_trunk: torch.Tensor | None = None  # [B, 1, N, c_s]: Algorithm 21's single before the noise
    encoder_biases: list[torch.Tensor] | None = None
    transformer_biases: list[torch.Tensor] | None = None
    decoder_biases: list[torch.Tensor] | None = None
    encoder_conditioning: list[BlockConditioning] | None = None
    decoder_conditioning: list[BlockConditioning] | None = None
    transformer_weights: StackedConditioningWeights | None = None  # s changes per call: its weights only


class DiffusionModule(nn.Module):
    """Algorithm 20: x_noisy and sigma -> the denoised positions, D(x; sigma) = c_skip x +
    c_out F(c_in x; c_noise)."""

    def __init__(self, config: ModelConfig, c_s_inputs: int) -> None:
        super().__init__()
        c_token = config.diffusion.c_token_diffusion
        self.config = config
        self.conditioning = DiffusionConditioning(config, c_s_inputs)
        self.atom_encoder = AtomAttentionEncoder(config, c_token, with_trunk=True)
        self.single_to_token = kernel_module(
            LayerNormLinear, config.trunk.c_s, c_token, bias=False, kernels=config.runtime.kernels
        )
        self.transformer = ConditionedTransformer(
            c_token,
            config.trunk.c_s,
            config.trunk.c_z,
            config.diffusion.diffusion_blocks,
            config.diffusion.diffusion_heads,
            config.runtime.kernels,
            checkpoint_blocks=config.runtime.checkpoint_blocks,
            checkpoint_group=config.runtime.checkpoint_group,
            # 7.5 M weights a block at c_token 768: held as bf16 copies through the step they
            # would raise its peak by 0.34 GB (benchmarks/NOTES.md section 24)
            transient_weight_casts=True,
        )
        self.token_norm = nn.LayerNorm(c_token)
        self.atom_decoder = AtomAttentionDecoder(config, c_token)

    def prepare(
        self,
        batch: dict,
        windows: AtomWindows,
        s_inputs: torch.Tensor,
        trunk_single: torch.Tensor,
        trunk_pair: torch.Tensor,
    ) -> DiffusionContext:
        """The noise-independent half: conditioned pair, atom conditioning and atom pair."""
        # re-run in backward with grouped checkpoints (a long crop): its concatenation, norms and
        # transitions would keep ~12 pair-sized tensors
        runtime = self.config.runtime
        recompute = runtime.checkpoint_blocks and runtime.checkpoint_group > 1 and self.training
        pair = maybe_checkpointed(recompute, self.conditioning.pair, batch, trunk_pair)
        atom_cond, atom_pair = self.atom_encoder.condition(batch, windows, trunk_single, pair)
        return DiffusionContext(batch, windows, s_inputs, trunk_single, pair, atom_cond, atom_pair)

    def for_sampling(self, context: DiffusionContext) -> DiffusionContext:
        """The context with what every call computes from the trunk alone (the single
        conditioning's trunk part, every transformer block's attention bias, the atom
        transformers' s side) computed once, without gradient, for the many calls of a sampler
        (the mini-rollout's 20, inference's 200): the LayerNorms and projections of the pair, the
        atom pair, the trunk single and c_l would otherwise run per call."""
        encoder, decoder = self.atom_encoder.atom_transformer, self.atom_decoder.atom_transformer
        with torch.no_grad():
            return dataclasses.replace(
                context,
                single_of_trunk=self.conditioning.single_of_trunk(context.s_inputs, context.trunk_single),
                encoder_biases=encoder.attention_biases(context.atom_pair, context.windows),
                transformer_biases=self.transformer.attention_biases(
                    context.pair, TokenLayout(context.batch["token_pad_mask"])
                ),
                decoder_biases=decoder.attention_biases(context.atom_pair, context.windows),
                encoder_conditioning=encoder.conditioning(context.atom_cond),
                decoder_conditioning=decoder.conditioning(context.atom_cond),
                transformer_weights=self.transformer.conditioning_weights(),
            )

    def forward(self, noisy_positions: torch.Tensor, sigma: torch.Tensor, context: DiffusionContext) -> torch.Tensor:
        """noisy_positions [B, S, A, 3], sigma [B, S] -> denoised positions [B, S, A, 3].

        With config.diffusion.diffusion_coordinates_fp32 (AF3's behaviour) the positions, their
        scaling, the update and D(x; sigma) are fp32 under autocast; the transformers run in the
        autocast dtype."""
        batch = context.batch
        if self.config.diffusion.diffusion_coordinates_fp32:
            noisy_positions, sigma = noisy_positions.float(), sigma.float()
        c_skip, c_out, c_in, _ = (
            c[..., None, None] for c in edm_preconditioning(sigma, self.config.diffusion.sigma_data)
        )
        single = self.conditioning.single(context.s_inputs, context.trunk_single, sigma, context.single_of_trunk)
        token_single, atom_single, atom_cond, atom_pair = self.atom_encoder(
            batch,
            context.windows,
            context.atom_cond,
            context.atom_pair,
            scaled_positions=noisy_positions * c_in,
            biases=context.encoder_biases,
            conditioning=context.encoder_conditioning,
        )
        token_single = token_single + self.single_to_token(single)
        layout = TokenLayout(batch["token_pad_mask"])
        token_single = self.transformer(
            token_single, single, context.pair, layout, context.transformer_biases, context.transformer_weights
        )
        token_single = self.token_norm(token_single)
        update = self.atom_decoder(
            batch,
            context.windows,
            token_single,
            atom_single,
            atom_cond,
            atom_pair,
            context.decoder_biases,
            context.decoder_conditioning,
        )
        with full_precision(self.config.diffusion.diffusion_coordinates_fp32, noisy_positions.device.type):
            return c_skip * noisy_positions + c_out * update.to(noisy_positions.dtype)
