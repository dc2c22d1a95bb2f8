"""Model configuration: one small frozen dataclass per part of the network, and the four presets.

`ModelConfig` composes the parts: `trunk` (input embedding, relative positions, the Pairformer,
recycling, the distogram), `msa` (the MSA module), `templates` (the template embedder),
`atom_attention` (Algorithms 5-7), `diffusion` (the diffusion module and its training batch),
`sampler` (the inference noise schedule and steps, Algorithm 18), `confidence` (the confidence
head), `loss` (loss weights and what they cover) and `runtime` (kernels, recomputation). Every
setting has one name, unique across the parts, used from the command line to `forward`:
`config.trunk.c_z` reads it, `config.replace(c_z=64)` and `preset("tiny", c_z=64)` set it, and
`config.settings()` lists every setting by name (the flat layout checkpoints wrote before the
parts existed, which `from_settings` reads back). One more part, `dialect`, holds Protenix 2.x's
dialect: where Protenix computes something other than AF3, a setting whose default is AF3's.

`af3` follows the AlphaFold3 supplement (Abramson et al. 2024): 48 Pairformer blocks with
c_s = 384 and c_z = 128, 4 MSA-module blocks with c_m = 64, 2 template blocks with c = 64, atom
attention with c_atom = 128 and c_atompair = 16 (3 blocks of 4 heads, 32-query x 128-key windows),
a 24-block diffusion transformer of width 768 with 16 heads trained on 48 noised copies per trunk
pass, and the paper's head counts, noise schedule and loss weights. `tiny` keeps every module but
shrinks every width so that CPU tests run in seconds; `small` sits between them, for single-GPU
experiments. `protenix` is AF3's sizes with Protenix 2.x's dialect and fixed sizes
(PROTENIX_SETTINGS, PROTENIX_SIZES): the model of a checkpoint converted from Protenix's base
model, for fine-tuning it. The field defaults are the `af3` preset's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from featurecache.kernels.runtime import KERNEL_CHOICES

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
    # the Protenix dialect (DialectConfig) came later: every checkpoint before it is AF3's
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

# Settings that checkpoints written before the parts existed name otherwise: their old name -> today's.
RENAMED_SETTINGS = {
    "num_pairformer_blocks": "pairformer_blocks",
    "num_msa_blocks": "msa_blocks",
    "num_template_blocks": "template_blocks",
}


def _check_positive(part: object, names: tuple[str, ...]) -> None:
    for name in names:
        if getattr(part, name) <= 0:
            raise ValueError(f"{type(part).__name__}.{name} must be positive, got {getattr(part, name)}")


def _check_depth(part: object, name: str) -> None:
    if getattr(part, name) < 0:
        raise ValueError(f"{type(part).__name__}.{name} must be >= 0, got {getattr(part, name)}")


def _check_heads_divide(part: object, width: str, heads: str) -> None:
    if getattr(part, width) % getattr(part, heads):
        raise ValueError(
            f"{type(part).__name__}.{width} ({getattr(part, width)}) must be a multiple of "
            f"{heads} ({getattr(part, heads)})"
        )


def _check_dropout(part: object, name: str) -> None:
    if not 0.0 <= getattr(part, name) < 1.0:
        raise ValueError(f"{type(part).__name__}.{name} must be in [0, 1), got {getattr(part, name)}")


@dataclass(frozen=True)
class TrunkConfig:
    """The input embedder's outputs, relative positions, the Pairformer, recycling and the distogram."""

    c_s: int = 384  # single representation
    c_z: int = 128  # pair representation
    pairformer_blocks: int = 48
    single_heads: int = 16  # attention with pair bias: 16 heads of 24
    single_head_dim: int = 24
    pair_heads: int = 4  # triangle attention: 4 heads of 32 (also in the MSA module)
    pair_head_dim: int = 32
    transition_expansion: int = 4  # the Pairformer's and the MSA module's transitions
    relpos_max_residue: int = 32  # r_max of AF3's relative position encoding
    relpos_max_chain: int = 2  # s_max
    # Which pairs get a sym_id offset (d_chain of Algorithm 3): "entity" as AF3's and Protenix's
    # code (chains of one entity; the same chain gets offset 0), "chain" as the supplement prints
    # it (every pair of different chains, whatever their entities). docs/FIDELITY.md
    relpos_chain_gate: str = "entity"
    # The distogram's 63 inner edges, evenly spaced (64 bins): AF3's code and Protenix use
    # 2.3125..21.6875 A (bins 0.3125 A wide); the supplement's text says "2 to 22"
    distogram_bins: int = 64
    distogram_min: float = 2.3125
    distogram_max: float = 21.6875
    # row/column-wise dropout after the triangle updates while training (Algorithms 16, 17), in
    # every pair stack: the Pairformer's, the MSA module's and the templates'
    pair_dropout: float = 0.25
    max_recycling_cycles: int = 4  # training draws N_cycle uniformly from 1..this

    def __post_init__(self) -> None:
        _check_positive(self, ("c_s", "c_z", "single_heads", "pair_heads", "max_recycling_cycles"))
        _check_depth(self, "pairformer_blocks")
        _check_dropout(self, "pair_dropout")
        if self.relpos_chain_gate not in RELPOS_CHAIN_GATES:
            raise ValueError(
                f"TrunkConfig.relpos_chain_gate is {self.relpos_chain_gate!r}, expected one of {RELPOS_CHAIN_GATES}"
            )
        if not self.distogram_min < self.distogram_max or self.distogram_bins < 2:
            raise ValueError(
                f"TrunkConfig distogram needs distogram_min < distogram_max and >= 2 bins, got "
                f"{self.distogram_bins} bins over {self.distogram_min}..{self.distogram_max}"
            )


@dataclass(frozen=True)
class MSAConfig:
    """The MSA module (Algorithm 8)."""

    c_m: int = 64  # MSA representation
    msa_blocks: int = 4
    msa_heads: int = 8  # pair-weighted averaging: 8 heads of 8
    msa_head_dim: int = 8
    outer_product_dim: int = 32
    msa_dropout: float = 0.15  # rowwise after the pair-weighted averaging, while training

    def __post_init__(self) -> None:
        _check_positive(self, ("c_m", "msa_heads"))
        _check_depth(self, "msa_blocks")
        _check_dropout(self, "msa_dropout")


@dataclass(frozen=True)
class TemplateConfig:
    """The template embedder (Algorithm 16)."""

    c_template: int = 64  # template pair representation
    template_blocks: int = 2
    template_pair_heads: int = 4
    template_pair_head_dim: int = 16
    template_transition_expansion: int = 2

    def __post_init__(self) -> None:
        _check_positive(self, ("c_template",))
        _check_depth(self, "template_blocks")


@dataclass(frozen=True)
class AtomAttentionConfig:
    """The atom attention encoder and decoder (Algorithms 5-7), in the input embedder and the
    diffusion module."""

    c_atom: int = 128  # atom single representation
    c_atompair: int = 16  # atom pair representation
    atom_blocks: int = 3  # atom transformer blocks, in every encoder and decoder
    atom_heads: int = 4
    atom_window_queries: int = 32  # sequence-local atom attention: 32 queries ...
    atom_window_keys: int = 128  # ... attend to the 128 keys around them
    # AF3's code: arcsinh of the reference charge before the projection, and the atom single
    # conditioning c_l multiplied by ref_mask (a masked reference atom contributes nothing)
    ref_charge_arcsinh: bool = True
    atom_cond_ref_mask: bool = True
    # AF3's code normalises the atom attention's keys (and values) with their own AdaLN; False
    # shares the queries' (the supplement's Algorithm 24 as printed). docs/FIDELITY.md
    atom_key_adaln: bool = True

    def __post_init__(self) -> None:
        _check_positive(self, ("c_atom", "c_atompair", "atom_heads"))
        _check_depth(self, "atom_blocks")
        _check_heads_divide(self, "c_atom", "atom_heads")
        if (
            self.atom_window_queries % 2
            or self.atom_window_keys % 2
            or self.atom_window_keys < self.atom_window_queries
        ):
            raise ValueError(
                f"AtomAttentionConfig windows must be even with keys >= queries, got "
                f"{self.atom_window_queries} queries x {self.atom_window_keys} keys"
            )


@dataclass(frozen=True)
class DiffusionConfig:
    """The diffusion module (Algorithms 20-24) and how training feeds it (SI 3.7.1)."""

    c_token_diffusion: int = 768  # width of the diffusion transformer's token stream
    diffusion_blocks: int = 24
    diffusion_heads: int = 16
    fourier_dim: int = 256  # noise-level embedding
    sigma_data: float = 16.0  # Angstrom; EDM's data standard deviation
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
    # The diffusion batch: noised copies of the truth per trunk pass while training (AF3: 48);
    # the train command's --diffusion-batch
    diffusion_batch: int = 48

    def __post_init__(self) -> None:
        _check_positive(self, ("c_token_diffusion", "diffusion_heads", "fourier_dim", "diffusion_batch"))
        _check_depth(self, "diffusion_blocks")
        _check_heads_divide(self, "c_token_diffusion", "diffusion_heads")


@dataclass(frozen=True)
class SamplerConfig:
    """The inference sampler's noise schedule and steps (Algorithm 18, SI 3.7.1)."""

    sampler_sigma_max: float = 160.0  # times sigma_data
    sampler_sigma_min: float = 4e-4  # times sigma_data
    sampler_rho: float = 7.0
    sampler_gamma_0: float = 0.8
    sampler_gamma_min: float = 1.0
    sampler_noise_scale: float = 1.003  # lambda
    sampler_step_scale: float = 1.5  # eta
    sampler_steps: int = 200

    def __post_init__(self) -> None:
        _check_positive(self, ("sampler_steps",))


@dataclass(frozen=True)
class ConfidenceConfig:
    """The confidence head (Algorithm 31) and the mini-rollout that trains it (SI 4.3)."""

    confidence_head: bool = True  # False: trunk and diffusion only (no mini-rollout, no head)
    confidence_blocks: int = 4  # the head's own Pairformer blocks
    confidence_rollout_steps: int = 20  # training's mini-rollout of the sampler (no gradient)
    confidence_rollout_samples: int = 1  # structures the mini-rollout gives the head per step

    def __post_init__(self) -> None:
        _check_positive(self, ("confidence_rollout_steps", "confidence_rollout_samples"))
        _check_depth(self, "confidence_blocks")


@dataclass(frozen=True)
class LossConfig:
    """The loss weights and what the losses cover (SI 4.1-4.3)."""

    diffusion_loss_weight: float = 4.0
    distogram_loss_weight: float = 0.03
    bond_loss_weight: float = 0.0  # AF3: 0 in initial training, 1 when fine-tuning
    mse_weight_dna: float = 5.0
    mse_weight_rna: float = 5.0
    mse_weight_ligand: float = 10.0
    # L = confidence_loss_weight (plddt L_plddt + pde L_pde + resolved L_resolved + pae L_pae) + ...
    confidence_loss_weight: float = 1e-4
    plddt_loss_weight: float = 1.0
    pde_loss_weight: float = 1.0
    resolved_loss_weight: float = 1.0
    # AF3: 0 in initial training, 1 in the fine-tuning stages (at 0 the PAE head's weights are frozen)
    pae_loss_weight: float = 0.0
    # SI 4.3: the confidence losses only on structures whose resolution lies in this range
    # (Angstrom, inclusive); a sample with no resolution (NMR, predicted) is left out. None:
    # every sample. A batch without "resolution" (built by hand) counts every sample.
    confidence_resolution_range: tuple[float, float] | None = (0.1, 4.0)
    permutation_alignment: bool = True  # chains and symmetric atoms of the truth matched to the prediction (SI 4.2)

    def __post_init__(self) -> None:
        if self.confidence_resolution_range is not None:
            # a list after a trip through JSON: a tuple, so that configs compare and hash alike
            object.__setattr__(self, "confidence_resolution_range", tuple(self.confidence_resolution_range))
            low, high = self.confidence_resolution_range
            if not 0 <= low <= high:
                raise ValueError(
                    f"LossConfig.confidence_resolution_range must be (low, high) with 0 <= low <= "
                    f"high, got {self.confidence_resolution_range}"
                )


@dataclass(frozen=True)
class RuntimeConfig:
    """How the model runs, not what its weights are: a checkpoint resumes and predicts under any
    values of these."""

    kernels: str = "triton"  # "triton": featurecache.kernels; "torch": pure-PyTorch references
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
            raise ValueError(f"RuntimeConfig.kernels is {self.kernels!r}, expected one of {KERNEL_CHOICES}")
        _check_positive(self, ("checkpoint_group",))


@dataclass(frozen=True)
class DialectConfig:
    """Protenix 2.x's dialect (docs/FIDELITY.md, "Protenix vs AlphaFold3"): where Protenix computes
    something other than AF3, a setting whose default is AF3's and whose other value is Protenix's.
    The `protenix` preset turns on all of PROTENIX_SETTINGS, and a checkpoint converted from
    Protenix records them (featurecache.integrations.protenix)."""

    pair_init_from_single: bool = False  # z_init's outer sum from s_init, not s_inputs
    outer_product_bias_divided: bool = False  # OPM: Linear (bias too) of the summed products, / (rows + 1e-3)
    atom_key_adaln_nested: bool = False  # with atom_key_adaln: the keys' AdaLN on the queries' AdaLN output
    confidence_single_norm: bool = False  # confidence head: own LayerNorm of the trunk single (clamped)
    confidence_raw_distance: bool = False  # confidence head: a LinearNoBias of the raw distance too
    pde_symmetrised_input: bool = False  # PDE logits Linear(LayerNorm(z + z^T))
    template_embedder_needs_blocks: bool = False  # 0 template blocks: no template embedding at all
    plddt_bins_protenix: bool = False  # pLDDT target: lDDT / (pairs + 1e-6), (k/50, (k+1)/50] bins
    pde_distogram_atoms: bool = False  # PDE target between distogram atoms (CB, C4 / C2), not centres
    triangle_mult_hidden: int | None = None  # triangle multiplication width; None: c_z (AF3), Protenix 128
    template_triangle_mult_hidden: int | None = None  # the same in the template stack; None: c_template
    input_atom_blocks: int | None = None  # the input embedder's atom transformer; None: atom_blocks
    # the parameters Protenix's layers lack (offsets, biases) held at zero while training, so a
    # fine-tuned model still converts back to Protenix (model/dialect.py); how it trains, not what it computes
    protenix_parameters_only: bool = False

    def __post_init__(self) -> None:
        for name in ("triangle_mult_hidden", "template_triangle_mult_hidden"):
            if getattr(self, name) is not None and getattr(self, name) <= 0:
                raise ValueError(f"DialectConfig.{name} must be positive or None, got {getattr(self, name)}")
        if self.input_atom_blocks is not None and self.input_atom_blocks < 0:
            raise ValueError(f"DialectConfig.input_atom_blocks must be >= 0 or None, got {self.input_atom_blocks}")


# The parts by their attribute name in ModelConfig.
PART_TYPES: dict[str, type] = {
    "trunk": TrunkConfig,
    "msa": MSAConfig,
    "templates": TemplateConfig,
    "atom_attention": AtomAttentionConfig,
    "diffusion": DiffusionConfig,
    "sampler": SamplerConfig,
    "confidence": ConfidenceConfig,
    "loss": LossConfig,
    "runtime": RuntimeConfig,
    "dialect": DialectConfig,
}
# Each setting's part: setting names are unique across the parts, so one name finds one setting.
SETTING_PARTS: dict[str, str] = {
    setting.name: part for part, part_type in PART_TYPES.items() for setting in dataclasses.fields(part_type)
}
RUNTIME_SETTINGS = tuple(setting.name for setting in dataclasses.fields(RuntimeConfig))


@dataclass(frozen=True)
class ModelConfig:
    """Every setting of the model, by part (the module docstring lists them)."""

    trunk: TrunkConfig = field(default_factory=TrunkConfig)
    msa: MSAConfig = field(default_factory=MSAConfig)
    templates: TemplateConfig = field(default_factory=TemplateConfig)
    atom_attention: AtomAttentionConfig = field(default_factory=AtomAttentionConfig)
    diffusion: DiffusionConfig = field(default_factory=DiffusionConfig)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    confidence: ConfidenceConfig = field(default_factory=ConfidenceConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    dialect: DialectConfig = field(default_factory=DialectConfig)

    def __post_init__(self) -> None:
        for part, part_type in PART_TYPES.items():
            if not isinstance(getattr(self, part), part_type):
                raise TypeError(f"ModelConfig.{part} must be a {part_type.__name__}, got {getattr(self, part)!r}")
        if self.dialect.atom_key_adaln_nested and not self.atom_attention.atom_key_adaln:
            raise ValueError(
                "DialectConfig.atom_key_adaln_nested needs AtomAttentionConfig.atom_key_adaln "
                "(the keys' own AdaLN to nest)"
            )

    def replace(self, **changes: Any) -> ModelConfig:
        """A copy with settings changed, each by its own name (`c_z=64`, `kernels="torch"`), or a
        part replaced whole (`trunk=TrunkConfig(...)`)."""
        parts = {name: value for name, value in changes.items() if name in PART_TYPES}
        by_part: dict[str, dict[str, Any]] = {}
        for name, value in changes.items():
            if name in PART_TYPES:
                continue
            if name not in SETTING_PARTS:
                raise TypeError(f"ModelConfig has no setting {name!r}")
            by_part.setdefault(SETTING_PARTS[name], {})[name] = value
        for part, values in by_part.items():
            parts[part] = dataclasses.replace(parts.get(part, getattr(self, part)), **values)
        return dataclasses.replace(self, **parts)

    def settings(self) -> dict[str, Any]:
        """Every setting by its name, part after part (the layout of checkpoints written before
        the parts existed)."""
        return {name: getattr(getattr(self, part), name) for name, part in SETTING_PARTS.items()}

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> ModelConfig:
        """The `af3` defaults with `settings` (by name, as `settings()` lists them) changed."""
        return cls().replace(**settings)


def saved_model_settings(saved: Mapping[str, Any]) -> dict[str, Any]:
    """A checkpoint's model settings by today's names, whichever layout it was written in
    (ModelConfig's parts, or the flat one of checkpoints written before them, with its old names:
    RENAMED_SETTINGS), with those it predates filled in as it was trained (LEGACY_SETTINGS)."""
    flat: dict[str, Any] = {}
    for name, value in saved.items():
        if name in PART_TYPES and isinstance(value, Mapping):
            flat.update(value)
        else:
            flat[RENAMED_SETTINGS.get(name, name)] = value
    return {**LEGACY_SETTINGS, **flat}


# The settings that make featurecache compute what Protenix 2.x computes (docs/FIDELITY.md):
# its dialect (DialectConfig) and the fidelity settings where Protenix agrees with AF3's code
# (the defaults, repeated so that this names Protenix's behaviour whole). By setting name.
PROTENIX_SETTINGS: dict[str, Any] = {
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
PROTENIX_SIZES: dict[str, Any] = {
    "triangle_mult_hidden": 128,
    "template_triangle_mult_hidden": 128,
    "template_pair_head_dim": 32,
}


PRESETS: dict[str, ModelConfig] = {
    "af3": ModelConfig(),
    "tiny": ModelConfig(
        trunk=TrunkConfig(
            c_s=32, c_z=16, pairformer_blocks=2, single_heads=2, single_head_dim=8, pair_heads=2, pair_head_dim=8
        ),
        msa=MSAConfig(c_m=8, msa_blocks=1, msa_heads=2, msa_head_dim=4, outer_product_dim=4),
        templates=TemplateConfig(c_template=8, template_blocks=1, template_pair_heads=2, template_pair_head_dim=8),
        atom_attention=AtomAttentionConfig(c_atom=16, c_atompair=8, atom_blocks=1, atom_heads=2),
        # a few noised copies per trunk pass, so that CPU runs stay quick
        diffusion=DiffusionConfig(
            c_token_diffusion=32, diffusion_blocks=2, diffusion_heads=2, fourier_dim=16, diffusion_batch=4
        ),
        sampler=SamplerConfig(sampler_steps=20),
        confidence=ConfidenceConfig(confidence_blocks=1),
        # the PAE loss on (as AF3 fine-tunes) so that one step trains every weight
        loss=LossConfig(pae_loss_weight=1.0),
    ),
    # Between the two: AF3's widths and heads (the shapes the kernels are tuned for) at a sixth of
    # its trunk depth and a third of its diffusion transformer's, for single-GPU experiments such
    # as overfitting one target in minutes (benchmarks/learning.py).
    "small": ModelConfig(
        trunk=TrunkConfig(pairformer_blocks=8),
        msa=MSAConfig(msa_blocks=2),
        templates=TemplateConfig(template_blocks=1),
        diffusion=DiffusionConfig(diffusion_blocks=8, diffusion_batch=16),
        confidence=ConfidenceConfig(confidence_blocks=2),
    ),
    # Protenix's released base model (protenix_base_default_v1.0.0): AF3's sizes but its fixed
    # ones, and its dialect; `featurecache convert` reads the sizes of any Protenix checkpoint
    # from its shapes, so smaller Protenix models (mini, tiny) need no preset.
    "protenix": ModelConfig().replace(**PROTENIX_SETTINGS, **PROTENIX_SIZES),
}


def preset(name: str, **overrides: Any) -> ModelConfig:
    """The named preset, with settings overridden by name (e.g. `kernels="torch"`; ModelConfig.replace)."""
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}, expected one of {sorted(PRESETS)}")
    return PRESETS[name].replace(**overrides)
