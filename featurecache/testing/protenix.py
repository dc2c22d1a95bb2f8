"""Protenix 2.0 (PyPI `protenix`, ByteDance's AF3 reproduction) as an independent reference for
featurecache's model: import it on a CPU, randomise its weights, and copy them into featurecache's
modules through explicit name maps (tests/equivalence).

A name map says, for every parameter of the featurecache module, which Protenix parameters it is
made from and how (`same`, rows stacked with `rows`, or `zeros` where Protenix has no such
parameter and featurecache's must be zero to compute the same function). `copy_weights` refuses a
map that leaves a featurecache parameter unset, names one that does not exist, or leaves a Protenix
parameter unused: a parameter one side has and the other ignores is a difference in the model, and
must be written down in the map (and in docs/FIDELITY.md), not passed over.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable

import torch
from torch import nn

from featurecache.model.config import ModelConfig, preset

PROTENIX_VERSION = "2.0"


def equivalence_config(**overrides) -> ModelConfig:
    """The tiny preset on the PyTorch path, with the single attention's width c_s as Protenix
    builds it (heads x head dim = c_s), and `overrides`: the featurecache settings a comparison
    chooses to match Protenix where it has one."""
    config = preset("tiny", kernels="torch")
    return config.replace(**{"single_head_dim": config.c_s // config.single_heads, **overrides})


def import_protenix() -> None:
    """Make Protenix's model modules importable on this machine, or raise ImportError saying how.

    Its LayerNorm is chosen at import from LAYERNORM_TYPE: the default "fast_layernorm" compiles a
    CUDA extension with nvcc (OSError without CUDA_HOME); any other value is torch's layer_norm,
    the fp32 CPU path these comparisons want (benchmarks/protenix_peer.py picks the same way)."""
    os.environ.setdefault("LAYERNORM_TYPE", "torch")
    if os.environ["LAYERNORM_TYPE"] == "fast_layernorm":
        raise ImportError("LAYERNORM_TYPE=fast_layernorm: Protenix would build its CUDA LayerNorm; unset it")
    try:
        import protenix
    except ImportError as error:
        raise ImportError(f"protenix is not installed ({error}): run ./setup.sh, which installs "
                          "protenix==2.0.0 without its pins") from error
    if not protenix.__version__.startswith(PROTENIX_VERSION):
        raise ImportError(f"protenix {protenix.__version__} is installed, the name maps are written for "
                          f"{PROTENIX_VERSION}: run ./setup.sh")


# --- randomised weights ---------------------------------------------------------------------------


@torch.no_grad()
def randomise(module: nn.Module, generator: torch.Generator) -> None:
    """Replace every parameter by random values of its usual scale.

    Protenix initialises many weights to zero (output projections, AdaLN-Zero gates, the
    diffusion module's last linear); compared at their initial values those paths would compute
    zeros on both sides and test nothing. Matrices get N(0, 1/fan_in); vectors (biases, LayerNorm
    scales and offsets) their value plus N(0, 0.2^2), so LayerNorm scales stay near one."""
    for parameter in module.parameters():
        noise = torch.randn(parameter.shape, generator=generator, dtype=parameter.dtype)
        if parameter.dim() >= 2:
            parameter.copy_(noise / parameter.shape[-1] ** 0.5)
        else:
            parameter.add_(0.2 * noise)


# --- name maps ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Source:
    """How one featurecache parameter is made from Protenix's: `combine` of the named tensors."""

    names: tuple[str, ...]
    combine: Callable[[list[torch.Tensor], torch.Size], torch.Tensor]
    why: str = ""

    def prefixed(self, protenix_prefix: str) -> Source:
        return dataclasses.replace(self, names=tuple(protenix_prefix + name for name in self.names))


def same(name: str) -> Source:
    """The Protenix parameter as it is."""
    return Source((name,), lambda tensors, shape: tensors[0])


def rows(*names: str) -> Source:
    """Protenix's matrices (or vectors) stacked along the output dimension, as featurecache packs
    several projections into one matrix product."""
    return Source(tuple(names), lambda tensors, shape: torch.cat(tensors, dim=0))


def padded_rows(*names: str, zero_rows: int) -> Source:
    """rows(...) followed by `zero_rows` zeros (a packed bias where only the first part has one)."""
    def combine(tensors, shape):
        stacked = torch.cat(tensors, dim=0)
        return torch.cat([stacked, stacked.new_zeros((zero_rows, *stacked.shape[1:]))], dim=0)
    return Source(tuple(names), combine)


def zeros(why: str) -> Source:
    """A featurecache parameter Protenix does not have, set to zero, which makes the function
    Protenix's; `why` says what the parameter is."""
    return Source((), lambda tensors, shape: torch.zeros(shape), why)


def ones(why: str) -> Source:
    """A featurecache scale Protenix does not have, set to one (Protenix's function)."""
    return Source((), lambda tensors, shape: torch.ones(shape), why)


Mapping = dict[str, Source]


def under(featurecache_prefix: str, protenix_prefix: str, mapping: Mapping) -> Mapping:
    """`mapping` for a submodule: both sides' names prefixed."""
    return {featurecache_prefix + name: source.prefixed(protenix_prefix) for name, source in mapping.items()}


class NameMapError(AssertionError):
    """A name map that does not cover both modules exactly."""


@torch.no_grad()
def copy_weights(protenix_module: nn.Module, featurecache_module: nn.Module, mapping: Mapping) -> None:
    """Set every parameter of `featurecache_module` from `protenix_module` through `mapping`.

    Raises NameMapError naming every featurecache parameter the map does not set, every name it
    sets that is no parameter, every Protenix parameter it does not use, every Protenix name it
    reads that does not exist, and every shape that differs."""
    ours = dict(featurecache_module.named_parameters())
    theirs = dict(protenix_module.named_parameters())
    used = {name for source in mapping.values() for name in source.names}
    problems = []
    problems += [f"featurecache parameter {name} {tuple(ours[name].shape)} is not mapped"
                 for name in sorted(set(ours) - set(mapping))]
    problems += [f"the map sets {name}, which featurecache's module does not have"
                 for name in sorted(set(mapping) - set(ours))]
    problems += [f"Protenix parameter {name} {tuple(theirs[name].shape)} is not used"
                 for name in sorted(set(theirs) - used)]
    problems += [f"the map reads {name}, which Protenix's module does not have"
                 for name in sorted(used - set(theirs))]
    if problems:
        raise NameMapError("name map does not match the modules:\n  " + "\n  ".join(problems))
    for name, source in mapping.items():
        value = source.combine([theirs[n].detach() for n in source.names], ours[name].shape)
        if value.shape != ours[name].shape:
            problems.append(f"{name}: featurecache {tuple(ours[name].shape)}, from {source.names} "
                            f"{tuple(value.shape)}")
            continue
        ours[name].copy_(value)
    if problems:
        raise NameMapError("shapes differ:\n  " + "\n  ".join(problems))


# --- maps of the shared building blocks -----------------------------------------------------------


def triangle_multiplication_map() -> Mapping:
    """featurecache.kernels.triangle_mult.TriangleMultiplication <- TriangleMultiplication{Outgoing,
    Incoming}: the same projections; LayerNorms named norm_* instead of layer_norm_*."""
    return {
        "norm_in.weight": same("layer_norm_in.weight"), "norm_in.bias": same("layer_norm_in.bias"),
        "norm_out.weight": same("layer_norm_out.weight"), "norm_out.bias": same("layer_norm_out.bias"),
        **{f"{name}.weight": same(f"{name}.weight")
           for name in ("linear_a_p", "linear_a_g", "linear_b_p", "linear_b_g", "linear_g", "linear_z")},
    }


def triangle_attention_map() -> Mapping:
    """featurecache.model.layers.TriangleAttention <- TriangleAttention: one LayerNorm, then q, k,
    v, gate and the per-head bias packed in one matrix (Protenix: mha.linear_{q,k,v,g} and
    `linear`). featurecache's output projection has a bias Protenix's lacks (zero here)."""
    return {
        "proj.norm.weight": same("layer_norm.weight"), "proj.norm.bias": same("layer_norm.bias"),
        "proj.linear.weight": rows("mha.linear_q.weight", "mha.linear_k.weight", "mha.linear_v.weight",
                                   "mha.linear_g.weight", "linear.weight"),
        "linear_out.weight": same("mha.linear_o.weight"),
        "linear_out.bias": zeros("the triangle attention's output bias (Protenix's linear_o has none)"),
    }


def transition_map() -> Mapping:
    """featurecache.kernels.transition.Transition <- primitives.Transition (SwiGLU)."""
    return {
        "norm.weight": same("layernorm1.weight"), "norm.bias": same("layernorm1.bias"),
        "linear_a.weight": same("linear_no_bias_a.weight"), "linear_b.weight": same("linear_no_bias_b.weight"),
        "linear_out.weight": same("linear_no_bias.weight"),
    }


def pair_stack_map() -> Mapping:
    """featurecache.model.pairformer.PairStack <- the pair half of Protenix's PairformerBlock."""
    return {
        **under("tri_mul_out.", "tri_mul_out.", triangle_multiplication_map()),
        **under("tri_mul_in.", "tri_mul_in.", triangle_multiplication_map()),
        **under("tri_att_start.", "tri_att_start.", triangle_attention_map()),
        **under("tri_att_end.", "tri_att_end.", triangle_attention_map()),
        **under("transition.", "pair_transition.", transition_map()),
    }


def attention_pair_bias_map(heads_dim: int) -> Mapping:
    """featurecache.model.layers.AttentionPairBias <- AttentionPairBias(has_s=False): q, k, v and
    gate packed in one matrix with q's bias first (k, v, gate have none: zeros)."""
    return {
        "proj.norm.weight": same("layernorm_a.weight"), "proj.norm.bias": same("layernorm_a.bias"),
        "proj.linear.weight": rows("attention.linear_q.weight", "attention.linear_k.weight",
                                   "attention.linear_v.weight", "attention.linear_g.weight"),
        "proj.linear.bias": padded_rows("attention.linear_q.bias", zero_rows=3 * heads_dim),
        "pair_bias.norm.weight": same("layernorm_z.weight"), "pair_bias.norm.bias": same("layernorm_z.bias"),
        "pair_bias.linear.weight": same("linear_nobias_z.weight"),
        "linear_out.weight": same("attention.linear_o.weight"),
    }


def pairformer_block_map(c_s: int) -> Mapping:
    """featurecache.model.pairformer.PairformerBlock <- protenix PairformerBlock."""
    return {
        **under("pair.", "", pair_stack_map()),
        **under("attention.", "attention_pair_bias.", attention_pair_bias_map(c_s)),
        **under("transition.", "single_transition.", transition_map()),
    }


def scaled(name: str, factor: float, why: str) -> Source:
    """The Protenix parameter times `factor`: where Protenix applies a constant to a parameter
    that AF3 (and featurecache) does not, for the inputs a comparison uses."""
    return Source((name,), lambda tensors, shape: tensors[0] * factor, why)


# Protenix's OuterProductMean (OpenFold's) divides by (valid rows + 1e-3) after its output Linear
# (bias included); AF3's Algorithm 9 and featurecache take the mean first, then the Linear.
OUTER_PRODUCT_EPS = 1e-3


def outer_product_mean_map(msa_rows: int) -> Mapping:
    """featurecache.model.layers.OuterProductMean <- OuterProductMean. featurecache packs a and b
    in one matrix with a bias (zero here: Protenix's and AF3's are LinearNoBias); Protenix's
    output bias is divided by the row count with everything else, which for `msa_rows` valid rows
    at every pair is featurecache's bias scaled by 1 / (msa_rows + eps)."""
    return {
        "proj.norm.weight": same("layer_norm.weight"), "proj.norm.bias": same("layer_norm.bias"),
        "proj.linear.weight": rows("linear_1.weight", "linear_2.weight"),
        "proj.linear.bias": zeros("the a, b projections' bias (Protenix and AF3: LinearNoBias)"),
        "linear_out.weight": same("linear_out.weight"),
        "linear_out.bias": scaled("linear_out.bias", 1.0 / (msa_rows + OUTER_PRODUCT_EPS),
                                  "Protenix divides its output bias by the row count"),
    }


def pair_weighted_averaging_map() -> Mapping:
    """featurecache.model.layers.PairWeightedAveraging <- MSAPairWeightedAveraging: values and
    gate packed in one matrix."""
    return {
        "proj.norm.weight": same("layernorm_m.weight"), "proj.norm.bias": same("layernorm_m.bias"),
        "proj.linear.weight": rows("linear_no_bias_mv.weight", "linear_no_bias_mg.weight"),
        "pair_bias.norm.weight": same("layernorm_z.weight"), "pair_bias.norm.bias": same("layernorm_z.bias"),
        "pair_bias.linear.weight": same("linear_no_bias_z.weight"),
        "linear_out.weight": same("linear_no_bias_out.weight"),
    }


def msa_block_map(msa_rows: int, last: bool) -> Mapping:
    """featurecache.model.msa.MSABlock <- protenix MSABlock (its pair stack a PairformerBlock with
    c_s = 0)."""
    mapping = {
        **under("outer_product_mean.", "outer_product_mean_msa.", outer_product_mean_map(msa_rows)),
        **under("pair.", "pair_stack.", pair_stack_map()),
    }
    if not last:
        mapping.update(under("pair_weighted_averaging.", "msa_stack.msa_pair_weighted_averaging.",
                             pair_weighted_averaging_map()))
        mapping.update(under("msa_transition.", "msa_stack.transition_m.", transition_map()))
    return mapping
