"""Model configuration and the four presets.

`af3` follows the AlphaFold3 supplement (Abramson et al. 2024): 48 Pairformer blocks with
c_s = 384 and c_z = 128, 4 MSA-module blocks with c_m = 64, 2 template blocks with c = 64, atom
attention with c_atom = 128 and c_atompair = 16 (3 blocks of 4 heads, 32-query x 128-key windows),
a 24-block diffusion transformer of width 768 with 16 heads, and the paper's head counts, noise
schedule and loss weights. `tiny` keeps every module but shrinks every width so that CPU tests
run in seconds; `small` sits between them, for single-GPU experiments. `protenix` is AF3's sizes
with Protenix 2.x's dialect and fixed sizes (PROTENIX_SETTINGS, PROTENIX_SIZES): the model of a
checkpoint converted from Protenix's base model, for fine-tuning it.
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass

from featurecache.kernels.runtime import KERNEL_CHOICES


# Settings that choose how the model runs (kernels, recomputation), not what its weights are:
# a checkpoint resumes and predicts under any values of these.
RUNTIME_SETTINGS = ("kernels", "checkpoint_blocks", "checkpoint_group")

RELPOS_CHAIN_GATES = ("entity", "chain")

# What a checkpoint written before a setting existed was trained with: the behaviour of the code
# then. Its model is rebuilt with these, not today's defaults (docs/FIDELITY.md). A checkpoint
# that records a setting keeps its own value (e.g. its distogram edges).
LEGACY_SETTINGS = {
    "relpos_chain_gate": "chain",
    "ref_charge_arcsinh": False,
    "atom_cond_ref_mask": False,
    "atom_key_adaln": False,
    "diffusion_coordinates_fp32": False,
    "confidence_resolution_range": None,
    "distogram_min": 2.0,
    "distogram_max": 22.0,
    # the Protenix dialect (ModelConfig's block) came later: every checkpoint before it is AF3's
    "pair_init_from_single": False,
    "outer_product_bias_divided": False,
    "atom_key_adaln_nested": False,
    "confidence_single_norm": False,
    "confidence_raw_distance": False,
    "pde_symmetrised_input": False,
    "template_embedder_needs_blocks": False,
    "plddt_bins_protenix": False,
    "pde_distogram_atoms": False,
}

# Loss settings: what a training run optimises, not what its weights compute. They may change
# between training stages (as AF3's loss weights do), so a run resumes under other values.
LOSS_SETTINGS = ("confidence_resolution_range", "plddt_bins_protenix", "pde_distogram_atoms")

# The settings among those that change what the same weights compute: a run resumes a checkpoint
# only with the values it was trained with.
WEIGHT_MEANING_SETTINGS = tuple(name for name in LEGACY_SETTINGS if name not in LOSS_SETTINGS)


def saved_model_settings(saved: dict) -> dict:
    """A checkpoint's model settings with those it predates filled in as it was trained."""
    return {**LEGACY_SETTINGS, **saved}


@dataclass(frozen=True)
class ModelConfig:
    c_s: int = 384                  # single representation
    c_z: int = 128                  # pair representation
    c_m: int = 64                   # MSA representation
    c_template: int = 64            # template pair representation
    num_pairformer_blocks: int = 48
    num_msa_blocks: int = 4
    num_template_blocks: int = 2
    single_heads: int = 16          # attention with pair bias: 16 heads of 24
    single_head_dim: int = 24
    pair_heads: int = 4             # triangle attention: 4 heads of 32
    pair_head_dim: int = 32
    template_pair_heads: int = 4
    template_pair_head_dim: int = 16
    msa_heads: int = 8              # pair-weighted averaging: 8 heads of 8
    msa_head_dim: int = 8
    outer_product_dim: int = 32
    transition_expansion: int = 4
    template_transition_expansion: int = 2
    relpos_max_residue: int = 32    # r_max of AF3's relative position encoding
    relpos_max_chain: int = 2       # s_max
    # Which pairs get a sym_id offset (d_chain of Algorithm 3): "entity" as AF3's and Protenix's
    # code (chains of one entity; the same chain gets offset 0), "chain" as the supplement prints
    # it (every pair of different chains, whatever their entities). docs/FIDELITY.md
    relpos_chain_gate: str = "entity"
    # The distogram's 63 inner edges, evenly spaced (64 bins): AF3's code and Protenix use
    # 2.3125..21.6875 A (bins 0.3125 A wide); the supplement's text says "2 to 22"
    distogram_bins: int = 64
    distogram_min: float = 2.3125
    distogram_max: float = 21.6875
    # --- atom attention (Algorithms 5-7) ---
    # AF3's code: arcsinh of the reference charge before the projection, and the atom single
    # conditioning c_l multiplied by ref_mask (a masked reference atom contributes nothing)
    ref_charge_arcsinh: bool = True
    atom_cond_ref_mask: bool = True
    # AF3's code normalises the atom attention's keys (and values) with their own AdaLN; False
    # shares the queries' (the supplement's Algorithm 24 as printed). docs/FIDELITY.md
    atom_key_adaln: bool = True
    c_atom: int = 128               # atom single representation
    c_atompair: int = 16            # atom pair representation
    atom_blocks: int = 3            # atom transformer blocks, in every encoder and decoder
    atom_heads: int = 4
    atom_window_queries: int = 32   # sequence-local atom attention: 32 queries ...
    atom_window_keys: int = 128     # ... attend to the 128 keys around them
    # --- diffusion module (Algorithms 20-24) ---
    c_token_diffusion: int = 768    # width of the diffusion transformer's token stream
    diffusion_blocks: int = 24
    diffusion_heads: int = 16
    fourier_dim: int = 256          # noise-level embedding
    sigma_data: float = 16.0        # Angstrom; EDM's data standard deviation
    augmentation_translation: float = 1.0  # Angstrom, s_trans of Algorithm 19
    # Under autocast, the coordinate path in fp32 (noisy positions, c_in scaling, the position
    # and reference-position projections, the pair offsets, the position-update projection and
    # the x update, the sampler's arithmetic) while the transformers run in bf16: bf16 keeps 8
    # bits, 0.1-0.25 A at sigma_data's scale, the size of what the denoiser corrects at low
    # noise. AF3 runs these layers at precision "highest", Protenix the whole module in fp32.
    diffusion_coordinates_fp32: bool = True
    # training noise: sigma = sigma_data * exp(mean + std * N(0, 1)) (SI 3.7.1)
    noise_log_mean: float = -1.2
    noise_log_std: float = 1.5
    # --- sampler (Algorithm 18, SI 3.7.1) ---
    sampler_sigma_max: float = 160.0  # times sigma_data
    sampler_sigma_min: float = 4e-4   # times sigma_data
    sampler_rho: float = 7.0
    sampler_gamma_0: float = 0.8
    sampler_gamma_min: float = 1.0
    sampler_noise_scale: float = 1.003  # lambda
    sampler_step_scale: float = 1.5     # eta
    sampler_steps: int = 200
    # --- losses (SI 4.1-4.2) ---
    diffusion_loss_weight: float = 4.0
    distogram_loss_weight: float = 0.03
    bond_loss_weight: float = 0.0   # AF3: 0 in initial training, 1 when fine-tuning
    mse_weight_dna: float = 5.0
    mse_weight_rna: float = 5.0
    mse_weight_ligand: float = 10.0
    # --- confidence head (Algorithm 31, SI 4.3) ---
    confidence_head: bool = True     # False: trunk and diffusion only (no mini-rollout, no head)
    confidence_blocks: int = 4       # the head's own Pairformer blocks
    confidence_rollout_steps: int = 20    # training's mini-rollout of the sampler (no gradient)
    confidence_rollout_samples: int = 1   # structures the mini-rollout gives the head per step
    # L = confidence_loss_weight (plddt L_plddt + pde L_pde + resolved L_resolved + pae L_pae) + ...
    confidence_loss_weight: float = 1e-4
    plddt_loss_weight: float = 1.0
    pde_loss_weight: float = 1.0
    resolved_loss_weight: float = 1.0
    pae_loss_weight: float = 0.0    # AF3: 0 in initial training, 1 in the fine-tuning stages
    # SI 4.3: the confidence losses only on structures whose resolution lies in this range
    # (Angstrom, inclusive); a sample with no resolution (NMR, predicted) is left out. None:
    # every sample. A batch without "resolution" (built by hand) counts every sample.
    confidence_resolution_range: tuple[float, float] | None = (0.1, 4.0)
    max_recycling_cycles: int = 4   # training draws N_cycle uniformly from 1..this
    # --- Protenix dialect (docs/FIDELITY.md, "Protenix vs AlphaFold3") ---
    # Where Protenix 2.x computes something other than AF3, a setting whose default is AF3's and
    # whose other value is Protenix's; the `protenix` preset turns on all of PROTENIX_SETTINGS, and
    # a checkpoint converted from Protenix records them (featurecache.integrations.protenix).
    pair_init_from_single: bool = False       # z_init's outer sum from s_init, not s_inputs
    outer_product_bias_divided: bool = False  # OPM: Linear (bias too) of the summed products, / (rows + 1e-3)
    atom_key_adaln_nested: bool = False       # with atom_key_adaln: the keys' AdaLN on the queries' AdaLN output
    confidence_single_norm: bool = False      # confidence head: own LayerNorm of the trunk single (clamped)
    confidence_raw_distance: bool = False     # confidence head: a LinearNoBias of the raw distance too
    pde_symmetrised_input: bool = False       # PDE logits Linear(LayerNorm(z + z^T))
    template_embedder_needs_blocks: bool = False  # 0 template blocks: no template embedding at all
    plddt_bins_protenix: bool = False         # pLDDT target: lDDT / (pairs + 1e-6), (k/50, (k+1)/50] bins
    pde_distogram_atoms: bool = False         # PDE target between distogram atoms (CB, C4 / C2), not centres
    triangle_mult_hidden: int | None = None   # triangle multiplication width; None: c_z (AF3), Protenix 128
    template_triangle_mult_hidden: int | None = None  # the same in the template stack; None: c_template
    input_atom_blocks: int | None = None      # the input embedder's atom transformer; None: atom_blocks
    # the parameters Protenix's layers lack (offsets, biases) held at zero while training, so a
    # fine-tuned model still converts back to Protenix (model/dialect.py); how it trains, not what it computes
    protenix_parameters_only: bool = False
    # --- end of the Protenix dialect ---
    # --- dropout while training (Algorithms 8, 16, 17) and the ground truth's permutation (SI 4.2) ---
    pair_dropout: float = 0.25      # row/column-wise after the triangle updates (Pairformer, MSA, templates)
    msa_dropout: float = 0.15       # rowwise after the MSA module's pair-weighted averaging
    permutation_alignment: bool = True  # chains and symmetric atoms of the truth matched to the prediction
    kernels: str = "triton"         # "triton": featurecache.kernels; "torch": pure-PyTorch references
    checkpoint_blocks: bool = True  # activation checkpointing per block while training
    # Pairformer blocks per outer checkpoint while training (with checkpoint_blocks). 1: every
    # block's input is kept for backward (48 bf16 pairs under autocast: 1.8 GB at crop 384, 80 GB
    # at 2,560). K > 1: only every K-th is kept, and backward re-runs each group of K blocks with
    # a checkpoint per block inside (about 48/K + K pairs held, K ~ 7), and a re-run block's two
    # triangle attentions keep only their inputs (re-run once more in backward); the diffusion
    # transformer's 24 blocks are grouped by the same K; the MSA module's 4 blocks run as one
    # group; z_init, each template's embedding, the diffusion pair conditioning, the confidence
    # head, the distogram head and loss are re-run in backward instead of keeping their
    # pair-sized intermediates. About one more forward of the trunk; the same results.
    checkpoint_group: int = 1

    def __post_init__(self) -> None:
        if self.kernels not in KERNEL_CHOICES:
            raise ValueError(f"ModelConfig.kernels is {self.kernels!r}, expected one of {KERNEL_CHOICES}")
        for name in ("c_s", "c_z", "c_m", "c_template", "single_heads", "pair_heads", "msa_heads",
                     "c_atom", "c_atompair", "atom_heads", "c_token_diffusion", "diffusion_heads",
                     "fourier_dim", "sampler_steps", "max_recycling_cycles", "confidence_rollout_steps",
                     "confidence_rollout_samples", "checkpoint_group"):
            if getattr(self, name) <= 0:
                raise ValueError(f"ModelConfig.{name} must be positive, got {getattr(self, name)}")
        for name in ("triangle_mult_hidden", "template_triangle_mult_hidden"):
            if getattr(self, name) is not None and getattr(self, name) <= 0:
                raise ValueError(f"ModelConfig.{name} must be positive or None, got {getattr(self, name)}")
        if self.input_atom_blocks is not None and self.input_atom_blocks < 0:
            raise ValueError(f"ModelConfig.input_atom_blocks must be >= 0 or None, got {self.input_atom_blocks}")
        if self.atom_key_adaln_nested and not self.atom_key_adaln:
            raise ValueError("ModelConfig.atom_key_adaln_nested needs atom_key_adaln (the keys' own AdaLN to nest)")
        for name in ("num_pairformer_blocks", "num_msa_blocks", "num_template_blocks", "atom_blocks",
                     "diffusion_blocks", "confidence_blocks"):
            if getattr(self, name) < 0:
                raise ValueError(f"ModelConfig.{name} must be >= 0, got {getattr(self, name)}")
        for width, heads in (("c_atom", "atom_heads"), ("c_token_diffusion", "diffusion_heads")):
            if getattr(self, width) % getattr(self, heads):
                raise ValueError(f"ModelConfig.{width} ({getattr(self, width)}) must be a multiple of "
                                 f"{heads} ({getattr(self, heads)})")
        for name in ("pair_dropout", "msa_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"ModelConfig.{name} must be in [0, 1), got {getattr(self, name)}")
        if self.relpos_chain_gate not in RELPOS_CHAIN_GATES:
            raise ValueError(f"ModelConfig.relpos_chain_gate is {self.relpos_chain_gate!r}, expected one of "
                             f"{RELPOS_CHAIN_GATES}")
        if not self.distogram_min < self.distogram_max or self.distogram_bins < 2:
            raise ValueError(f"ModelConfig distogram needs distogram_min < distogram_max and >= 2 bins, got "
                             f"{self.distogram_bins} bins over {self.distogram_min}..{self.distogram_max}")
        if self.confidence_resolution_range is not None:
            # a list after a trip through JSON: a tuple, so that configs compare and hash alike
            object.__setattr__(self, "confidence_resolution_range", tuple(self.confidence_resolution_range))
            low, high = self.confidence_resolution_range
            if not 0 <= low <= high:
                raise ValueError(f"ModelConfig.confidence_resolution_range must be (low, high) with 0 <= low <= "
                                 f"high, got {self.confidence_resolution_range}")
        if self.atom_window_queries % 2 or self.atom_window_keys % 2 \
                or self.atom_window_keys < self.atom_window_queries:
            raise ValueError(f"ModelConfig atom windows must be even with keys >= queries, got "
                             f"{self.atom_window_queries} queries x {self.atom_window_keys} keys")

    def replace(self, **changes) -> "ModelConfig":
        return dataclasses.replace(self, **changes)


# The settings that make featurecache compute what Protenix 2.x computes (docs/FIDELITY.md):
# its dialect (the block of ModelConfig above) and the fidelity settings where Protenix agrees
# with AF3's code (the defaults, repeated so that this names Protenix's behaviour whole).
PROTENIX_SETTINGS: dict = {
    "relpos_chain_gate": "entity",
    "ref_charge_arcsinh": True,
    "atom_cond_ref_mask": True,
    "distogram_min": 2.3125,
    "distogram_max": 21.6875,
    "confidence_resolution_range": (0.1, 4.0),
    "atom_key_adaln": True,
    "pair_init_from_single": True,
    "outer_product_bias_divided": True,
    "atom_key_adaln_nested": True,
    "confidence_single_norm": True,
    "confidence_raw_distance": True,
    "pde_symmetrised_input": True,
    "template_embedder_needs_blocks": True,
    "plddt_bins_protenix": True,
    "pde_distogram_atoms": True,
    "protenix_parameters_only": True,
}
# Sizes Protenix fixes where AF3's differ: its triangle multiplications are 128 wide in every
# stack, its template stack's triangle attention 4 heads of 32 (AF3: 64 wide, 4 heads of 16).
PROTENIX_SIZES: dict = {
    "triangle_mult_hidden": 128,
    "template_triangle_mult_hidden": 128,
    "template_pair_head_dim": 32,
}


PRESETS: dict[str, ModelConfig] = {
    "af3": ModelConfig(),
    "tiny": ModelConfig(
        c_s=32, c_z=16, c_m=8, c_template=8,
        num_pairformer_blocks=2, num_msa_blocks=1, num_template_blocks=1,
        single_heads=2, single_head_dim=8,
        pair_heads=2, pair_head_dim=8,
        template_pair_heads=2, template_pair_head_dim=8,
        msa_heads=2, msa_head_dim=4,
        outer_product_dim=4,
        c_atom=16, c_atompair=8, atom_blocks=1, atom_heads=2,
        c_token_diffusion=32, diffusion_blocks=2, diffusion_heads=2, fourier_dim=16,
        sampler_steps=20,
        # one confidence block; the PAE loss on (as AF3 fine-tunes) so that one step trains every weight
        confidence_blocks=1, pae_loss_weight=1.0,
    ),
    # Between the two: AF3's widths and heads (the shapes the kernels are tuned for) at a sixth of
    # its trunk depth and a third of its diffusion transformer's, for single-GPU experiments such
    # as overfitting one target in minutes (benchmarks/learning.py).
    "small": ModelConfig(
        num_pairformer_blocks=8, num_msa_blocks=2, num_template_blocks=1,
        diffusion_blocks=8, confidence_blocks=2,
    ),
    # Protenix's released base model (protenix_base_default_v1.0.0): AF3's sizes but its fixed
    # ones, and its dialect; `featurecache convert` reads the sizes of any Protenix checkpoint
    # from its shapes, so smaller Protenix models (mini, tiny) need no preset.
    "protenix": ModelConfig(**PROTENIX_SETTINGS, **PROTENIX_SIZES),
}


def preset(name: str, **overrides) -> ModelConfig:
    """The named preset, with any field overridden (e.g. `kernels="torch"`)."""
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}, expected one of {sorted(PRESETS)}")
    return PRESETS[name].replace(**overrides)


def __getattr__(name: str):
    # KERNEL_IMPLS is the old name of featurecache.kernels.runtime.KERNEL_CHOICES.
    if name == "KERNEL_IMPLS":
        warnings.warn("featurecache.model.config.KERNEL_IMPLS is deprecated, use "
                      "featurecache.kernels.runtime.KERNEL_CHOICES", DeprecationWarning, stacklevel=2)
        return KERNEL_CHOICES
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
