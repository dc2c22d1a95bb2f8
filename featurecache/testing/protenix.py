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
    return config.replace(**{"single_head_dim": config.trunk.c_s // config.trunk.single_heads, **overrides})


def import_protenix() -> None:
    """Make Protenix's model modules importable on this machine, or raise ImportError saying how.

    Its LayerNorm is chosen when protenix.model.triangular.layers is imported, from LAYERNORM_TYPE:
    the default "fast_layernorm" compiles a CUDA extension with nvcc (OSError without CUDA_HOME);
    any other value is torch's layer_norm, the fp32 CPU path these comparisons want
    (benchmarks/protenix_peer.py picks the same way). The variable is set for that import only,
    so processes the tests start later do not inherit it."""
    try:
        import protenix
    except ImportError as error:
        raise ImportError(f"protenix is not installed ({error}): run ./setup.sh, which installs "
                          "protenix==2.0.0 without its pins") from error
    if not protenix.__version__.startswith(PROTENIX_VERSION):
        raise ImportError(f"protenix {protenix.__version__} is installed, the name maps are written for "
                          f"{PROTENIX_VERSION}: run ./setup.sh")
    previous = os.environ.get("LAYERNORM_TYPE")
    os.environ["LAYERNORM_TYPE"] = "torch"
    try:
        import protenix.model.triangular.layers as layers
    finally:
        if previous is None:
            del os.environ["LAYERNORM_TYPE"]
        else:
            os.environ["LAYERNORM_TYPE"] = previous
    if layers.fastln_is_installed:
        raise ImportError("protenix.model.triangular.layers was imported before with its CUDA LayerNorm")


# --- randomised weights ---------------------------------------------------------------------------


@torch.no_grad()
def randomise(module: nn.Module, generator: torch.Generator) -> None:
    """Replace every parameter by random values of its usual scale.

    Protenix initialises many weights to zero (output projections, AdaLN-Zero gates, the
    diffusion module's last linear); compared at their initial values those paths would compute
    zeros on both sides and test nothing. Matrices get N(0, 1 / their last dimension) (an
    nn.Linear's fan-in); vectors (biases, LayerNorm
    scales and offsets) their value plus N(0, 0.2^2), so LayerNorm scales stay near one. Frozen
    parameters (the Fourier embedding's random draws, the confidence head's bin edges) are kept."""
    for parameter in module.parameters():
        if not parameter.requires_grad:
            continue
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


@dataclasses.dataclass(frozen=True)
class ProtenixOnly:
    """A Protenix tensor featurecache has no counterpart of, and what the comparison does with it:
    `kind` "zeroed" (set to zero in Protenix's module, which removes a term AF3 does not have),
    "constant" (a fixed tensor, checked equal to `expected`, featurecache's constant), or "input"
    (part of a Protenix step the comparison applies to featurecache's input)."""

    kind: str
    why: str
    expected: torch.Tensor | None = None


@torch.no_grad()
def copy_weights(protenix_module: nn.Module, featurecache_module: nn.Module, mapping: Mapping,
                 protenix_only: dict[str, ProtenixOnly] | None = None) -> None:
    """Set every parameter and persistent buffer (the Fourier embedding's frozen weights) of
    `featurecache_module` from `protenix_module`'s through `mapping`; deal with the Protenix
    tensors featurecache lacks as `protenix_only` says.

    Raises NameMapError naming every featurecache tensor the map does not set, every name it sets
    that is no tensor there, every Protenix tensor neither it nor `protenix_only` uses, every
    Protenix name they read that does not exist, every shape that differs and every constant that
    is not featurecache's."""
    protenix_only = protenix_only or {}
    ours = featurecache_module.state_dict(keep_vars=True)
    theirs = protenix_module.state_dict(keep_vars=True)
    used = {name for source in mapping.values() for name in source.names} | set(protenix_only)
    problems = []
    problems += [f"featurecache tensor {name} {tuple(ours[name].shape)} is not mapped"
                 for name in sorted(set(ours) - set(mapping))]
    problems += [f"the map sets {name}, which featurecache's module does not have"
                 for name in sorted(set(mapping) - set(ours))]
    problems += [f"Protenix tensor {name} {tuple(theirs[name].shape)} is not used"
                 for name in sorted(set(theirs) - used)]
    problems += [f"the map reads {name}, which Protenix's module does not have"
                 for name in sorted(used - set(theirs))]
    if problems:
        raise NameMapError("name map does not match the modules:\n  " + "\n  ".join(problems))
    for name, only in protenix_only.items():
        if only.kind == "zeroed":
            theirs[name].zero_()
        elif only.kind == "constant":
            if not torch.allclose(theirs[name].detach().float(), only.expected.float(), rtol=0, atol=1e-6):
                raise NameMapError(f"Protenix's {name} is {theirs[name].tolist()}, featurecache's "
                                   f"{only.expected.tolist()} ({only.why})")
        elif only.kind != "input":
            raise ValueError(f"ProtenixOnly kind {only.kind!r}, expected zeroed, constant or input")
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
    """featurecache.model.network.layers.TriangleAttention <- TriangleAttention: one LayerNorm, then q, k,
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
    """featurecache.model.network.pairformer.PairStack <- the pair half of Protenix's PairformerBlock."""
    return {
        **under("tri_mul_out.", "tri_mul_out.", triangle_multiplication_map()),
        **under("tri_mul_in.", "tri_mul_in.", triangle_multiplication_map()),
        **under("tri_att_start.", "tri_att_start.", triangle_attention_map()),
        **under("tri_att_end.", "tri_att_end.", triangle_attention_map()),
        **under("transition.", "pair_transition.", transition_map()),
    }


def attention_pair_bias_map(heads_dim: int) -> Mapping:
    """featurecache.model.network.layers.AttentionPairBias <- AttentionPairBias(has_s=False): q, k, v and
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
    """featurecache.model.network.pairformer.PairformerBlock <- protenix PairformerBlock."""
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
    """featurecache.model.network.layers.OuterProductMean <- OuterProductMean. featurecache packs a and b
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
    """featurecache.model.network.layers.PairWeightedAveraging <- MSAPairWeightedAveraging: values and
    gate packed in one matrix."""
    return {
        "proj.norm.weight": same("layernorm_m.weight"), "proj.norm.bias": same("layernorm_m.bias"),
        "proj.linear.weight": rows("linear_no_bias_mv.weight", "linear_no_bias_mg.weight"),
        "pair_bias.norm.weight": same("layernorm_z.weight"), "pair_bias.norm.bias": same("layernorm_z.bias"),
        "pair_bias.linear.weight": same("linear_no_bias_z.weight"),
        "linear_out.weight": same("linear_no_bias_out.weight"),
    }


def msa_block_map(msa_rows: int, last: bool) -> Mapping:
    """featurecache.model.network.msa.MSABlock <- protenix MSABlock (its pair stack a PairformerBlock with
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


# --- the conditioned transformer (Algorithms 23-26) and atom attention (Algorithms 5-7) ------------


def adaptive_layernorm_map() -> Mapping:
    """featurecache.model.network.transformer.AdaptiveLayerNorm <- primitives.AdaptiveLayerNorm."""
    return {"norm_s.weight": same("layernorm_s.weight"), "scale.weight": same("linear_s.weight"),
            "scale.bias": same("linear_s.bias"), "shift.weight": same("linear_nobias_s.weight")}


def conditioned_transformer_block_map(key_adaln: bool = False) -> Mapping:
    """featurecache.model.network.transformer.ConditionedTransformerBlock <- DiffusionTransformerBlock (q, k,
    v and gate packed, q's bias separate; the pair LayerNorm without offset in Protenix, zero here).

    `key_adaln`: featurecache's keys' own AdaLN from Protenix's `layernorm_kv` (its
    cross_attention_mode=True); without it both run one AdaLN (Protenix's mode off). The weights
    correspond one to one, the functions do not: Protenix applies layernorm_kv to the queries'
    AdaLN output, featurecache (as AF3) to the block's input (docs/FIDELITY.md)."""
    key_norm = (under("attention.key_adaln.", "attention_pair_bias.layernorm_kv.", adaptive_layernorm_map())
                if key_adaln else {})
    return {
        **under("attention.adaln.", "attention_pair_bias.layernorm_a.", adaptive_layernorm_map()),
        **key_norm,
        "attention.proj.weight": rows(*(f"attention_pair_bias.attention.linear_{name}.weight"
                                        for name in ("q", "k", "v", "g"))),
        "attention.query_bias": same("attention_pair_bias.attention.linear_q.bias"),
        "attention.pair_bias.norm.weight": same("attention_pair_bias.layernorm_z.weight"),
        "attention.pair_bias.norm.bias": zeros("the pair LayerNorm's offset (Protenix: create_offset=False)"),
        "attention.pair_bias.linear.weight": same("attention_pair_bias.linear_nobias_z.weight"),
        "attention.linear_out.weight": same("attention_pair_bias.attention.linear_o.weight"),
        "attention.output_gate.weight": same("attention_pair_bias.linear_a_last.weight"),
        "attention.output_gate.bias": same("attention_pair_bias.linear_a_last.bias"),
        **under("transition.adaln.", "conditioned_transition_block.adaln.", adaptive_layernorm_map()),
        "transition.linear_a.weight": same("conditioned_transition_block.linear_nobias_a1.weight"),
        "transition.linear_b.weight": same("conditioned_transition_block.linear_nobias_a2.weight"),
        "transition.linear_out.weight": same("conditioned_transition_block.linear_nobias_b.weight"),
        "transition.output_gate.weight": same("conditioned_transition_block.linear_s.weight"),
        "transition.output_gate.bias": same("conditioned_transition_block.linear_s.bias"),
    }


def conditioned_transformer_map(num_blocks: int, key_adaln: bool = False) -> Mapping:
    """featurecache.model.network.transformer.ConditionedTransformer <- DiffusionTransformer."""
    mapping = {}
    for index in range(num_blocks):
        mapping.update(under(f"blocks.{index}.", f"blocks.{index}.", conditioned_transformer_block_map(key_adaln)))
    return mapping


def columns(*names: str) -> Source:
    """Protenix's matrices side by side along the input dimension, as featurecache concatenates
    their inputs into one feature vector."""
    return Source(tuple(names), lambda tensors, shape: torch.cat(tensors, dim=1))


def atom_attention_encoder_map(config: ModelConfig, with_trunk: bool) -> Mapping:
    """featurecache.model.network.atom_attention.AtomAttentionEncoder <- AtomAttentionEncoder.

    featurecache's reference features are [ref_pos 3 | ref_charge 1 | ref_mask 1 | element 128 |
    name characters 4 x 64] through one matrix; Protenix has one matrix for ref_pos, one for the
    charge and one for [ref_mask | element | name characters]: side by side, they are the same
    product. (Protenix embeds arcsinh(ref_charge) and multiplies the result by ref_mask, as
    featurecache does with ref_charge_arcsinh and atom_cond_ref_mask.)"""
    mapping = {
        "from_reference.weight": columns("linear_no_bias_ref_pos.weight", "linear_no_bias_ref_charge.weight",
                                         "linear_no_bias_f.weight"),
        "pair_from_offset.weight": same("linear_no_bias_d.weight"),
        "pair_from_distance.weight": same("linear_no_bias_invd.weight"),
        "pair_from_same_space.weight": same("linear_no_bias_v.weight"),
        "pair_from_query.weight": same("linear_no_bias_cl.weight"),
        "pair_from_key.weight": same("linear_no_bias_cm.weight"),
        **{f"pair_mlp.{index}.weight": same(f"small_mlp.{index}.weight") for index in (1, 3, 5)},
        **under("atom_transformer.transformer.", "atom_transformer.diffusion_transformer.",
                conditioned_transformer_map(config.atom_attention.atom_blocks, config.atom_attention.atom_key_adaln)),
        "to_token.weight": same("linear_no_bias_q.weight"),
    }
    if with_trunk:
        mapping.update({
            "from_trunk_single.norm.weight": same("layernorm_s.weight"),
            "from_trunk_single.norm.bias": zeros("the trunk single's LayerNorm offset (Protenix: none)"),
            "from_trunk_single.linear.weight": same("linear_no_bias_s.weight"),
            "from_trunk_pair.norm.weight": same("layernorm_z.weight"),
            "from_trunk_pair.norm.bias": zeros("the trunk pair's LayerNorm offset (Protenix: none)"),
            "from_trunk_pair.linear.weight": same("linear_no_bias_z.weight"),
            "from_positions.weight": same("linear_no_bias_r.weight"),
        })
    return mapping


def atom_attention_decoder_map(config: ModelConfig) -> Mapping:
    """featurecache.model.network.atom_attention.AtomAttentionDecoder <- AtomAttentionDecoder."""
    return {
        "from_token.weight": same("linear_no_bias_a.weight"),
        **under("atom_transformer.transformer.", "atom_transformer.diffusion_transformer.",
                conditioned_transformer_map(config.atom_attention.atom_blocks, config.atom_attention.atom_key_adaln)),
        "to_positions.norm.weight": same("layernorm_q.weight"),
        "to_positions.norm.bias": zeros("the output LayerNorm's offset (Protenix: none)"),
        "to_positions.linear.weight": same("linear_no_bias_out.weight"),
    }


def protenix_atom_transformer_without_cross_attention(atom_transformer: nn.Module, config: ModelConfig) -> None:
    """Rebuild a Protenix AtomTransformer's blocks with its cross_attention_mode off.

    Protenix's atom transformer (cross_attention_mode=True) computes keys and values from a second
    AdaLN applied to the queries' AdaLN output, AdaLN_kv(AdaLN_q(a, s), s); AF3's code, and
    featurecache with atom_key_adaln=True, apply the keys' AdaLN to a itself. With the mode off,
    Protenix's own code runs one AdaLN for all, featurecache's atom_key_adaln=False
    (docs/FIDELITY.md)."""
    from protenix.model.modules.transformer import DiffusionTransformer

    atom_transformer.diffusion_transformer = DiffusionTransformer(
        n_blocks=config.atom_attention.atom_blocks, n_heads=config.atom_attention.atom_heads,
        c_a=config.atom_attention.c_atom, c_s=config.atom_attention.c_atom,
        c_z=config.atom_attention.c_atompair, cross_attention_mode=False)


def protenix_atom_transformer_with_keys_normalised_from_input(atom_transformer: nn.Module) -> None:
    """Make a Protenix AtomTransformer (cross_attention_mode=True) compute AF3's cross attention:
    its `layernorm_kv` reads the block's input a instead of the queries' AdaLN output, so keys and
    values are AdaLN_kv(a, s), as AF3's `diffusion_transformer.cross_attention` and featurecache's
    atom_key_adaln compute them. Forward pre-hooks hand the block's a to layernorm_kv; Protenix's
    modules and parameter names are otherwise untouched."""
    for block in atom_transformer.diffusion_transformer.blocks:
        attention = block.attention_pair_bias
        if not attention.cross_attention_mode:
            raise ValueError("the atom transformer was built without cross_attention_mode: no layernorm_kv to feed")
        block_input = {}

        def keep_input(module, args, kwargs, block_input=block_input):
            block_input["a"] = kwargs["a"]

        def feed_input(module, args, kwargs, block_input=block_input):
            return args, {**kwargs, "a": block_input.pop("a")}

        attention.register_forward_pre_hook(keep_input, with_kwargs=True)
        attention.layernorm_kv.register_forward_pre_hook(feed_input, with_kwargs=True)


# --- the diffusion module (Algorithms 20-22) and the relative position encoding (Algorithm 3) ------


def layernorm_linear_map(norm: str, linear: str, norm_offset: bool = False) -> Mapping:
    """featurecache's LayerNormLinear (no linear bias) <- a Protenix LayerNorm and LinearNoBias;
    Protenix builds most of these LayerNorms without offset (create_offset=False: zero here)."""
    return {
        "norm.weight": same(f"{norm}.weight"),
        "norm.bias": same(f"{norm}.bias") if norm_offset else zeros(f"{norm}'s offset (Protenix: none)"),
        "linear.weight": same(f"{linear}.weight"),
    }


def relative_position_map(config: ModelConfig) -> Mapping:
    """featurecache.model.network.embedders.RelativePositionEncoding <- RelativePositionEncoding: the same
    features [residue offset | token offset | same entity | chain offset] in the same order.

    Protenix (as AF3) gives the chain offset sym_i - sym_j to pairs of one entity: featurecache's
    relpos_chain_gate "entity". Its "chain" gate (the supplement's) is a different function on
    any complex, which no weight map makes equal."""
    if config.trunk.relpos_chain_gate != "entity":
        raise NameMapError(f"relpos_chain_gate {config.trunk.relpos_chain_gate!r}: Protenix gates the relative chain "
                           "encoding on the entity; only 'entity' has a weight map")
    return {"linear.weight": same("linear_no_bias.weight")}


def diffusion_module_map(config: ModelConfig) -> Mapping:
    """featurecache.model.network.diffusion.DiffusionModule <- DiffusionModule (Algorithms 20-21)."""
    conditioning = {
        **under("relpos.", "relpe.", relative_position_map(config)),
        **under("pair_in.", "", layernorm_linear_map("layernorm_z", "linear_no_bias_z")),
        **under("single_in.", "", layernorm_linear_map("layernorm_s", "linear_no_bias_s")),
        **under("noise_in.", "", layernorm_linear_map("layernorm_n", "linear_no_bias_n")),
        "fourier.weight": same("fourier_embedding.w"), "fourier.bias": same("fourier_embedding.b"),
    }
    for index in range(2):
        conditioning.update(under(f"pair_transitions.{index}.", f"transition_z{index + 1}.", transition_map()))
        conditioning.update(under(f"single_transitions.{index}.", f"transition_s{index + 1}.", transition_map()))
    return {
        **under("conditioning.", "diffusion_conditioning.", conditioning),
        **under("atom_encoder.", "atom_attention_encoder.",
                atom_attention_encoder_map(config, with_trunk=True)),
        **under("single_to_token.", "", layernorm_linear_map("layernorm_s", "linear_no_bias_s")),
        **under("transformer.", "diffusion_transformer.",
                conditioned_transformer_map(config.diffusion.diffusion_blocks)),
        "token_norm.weight": same("layernorm_a.weight"),
        "token_norm.bias": zeros("the token LayerNorm's offset (Protenix: none)"),
        **under("atom_decoder.", "atom_attention_decoder.", atom_attention_decoder_map(config)),
    }


# --- the confidence head (Algorithm 31) -----------------------------------------------------------


def pairformer_stack_map(num_blocks: int, c_s: int) -> Mapping:
    """featurecache.model.network.pairformer.Pairformer <- PairformerStack."""
    mapping = {}
    for index in range(num_blocks):
        mapping.update(under(f"blocks.{index}.", f"blocks.{index}.", pairformer_block_map(c_s)))
    return mapping


def confidence_head_map(config: ModelConfig) -> Mapping:
    """featurecache.model.network.confidence.ConfidenceHead <- ConfidenceHead. Protenix's
    linear_no_bias_s2 reads token i of z_ij, linear_no_bias_s1 token j; the per-atom-slot weights
    have the same [slot, c_s, bins] layout (Protenix built with featurecache's 24 slots)."""
    return {
        "left_inputs.weight": same("linear_no_bias_s2.weight"),
        "right_inputs.weight": same("linear_no_bias_s1.weight"),
        "distance.weight": same("linear_no_bias_d.weight"),
        **under("pairformer.", "pairformer_stack.",
                pairformer_stack_map(config.confidence.confidence_blocks, config.trunk.c_s)),
        "pae_norm.weight": same("pae_ln.weight"), "pae_norm.bias": same("pae_ln.bias"),
        "pae.weight": same("linear_no_bias_pae.weight"),
        "pde_norm.weight": same("pde_ln.weight"), "pde_norm.bias": same("pde_ln.bias"),
        "pde.weight": same("linear_no_bias_pde.weight"),
        "plddt_norm.weight": same("plddt_ln.weight"), "plddt_norm.bias": same("plddt_ln.bias"),
        "resolved_norm.weight": same("resolved_ln.weight"), "resolved_norm.bias": same("resolved_ln.bias"),
        "plddt": same("plddt_weight"), "resolved": same("resolved_weight"),
    }


def confidence_head_protenix_only(distance_lower_edges: torch.Tensor) -> dict[str, ProtenixOnly]:
    """The confidence head's Protenix tensors without a featurecache counterpart."""
    upper = torch.cat([distance_lower_edges[1:], distance_lower_edges.new_tensor([1e6])])
    return {
        "linear_no_bias_d_wo_onehot.weight": ProtenixOnly(
            "zeroed", "Protenix adds a linear embedding of the raw distance beside the one-hot bins; AF3 "
                      "(Algorithm 31) and featurecache embed the bins only"),
        "input_strunk_ln.weight": ProtenixOnly(
            "input", "Protenix normalises the trunk single (clamped to +-512) before its Pairformer; AF3 and "
                     "featurecache do not: the comparison gives featurecache the normalised single"),
        "input_strunk_ln.bias": ProtenixOnly("input", "as input_strunk_ln.weight"),
        "lower_bins": ProtenixOnly("constant", "distance bins' lower edges", distance_lower_edges),
        "upper_bins": ProtenixOnly("constant", "distance bins' upper edges (the last open)", upper),
    }


# --- the template embedder (Algorithm 16) ---------------------------------------------------------


def template_feature_columns(num_restypes: int, distogram_bins: int = 39) -> list[int]:
    """For each column of featurecache's template features [distogram | pseudo-beta mask | unit
    vector 3 | backbone mask | restype of i | restype of j], the column of Protenix's
    [distogram | pseudo-beta mask | restype of j | restype of i | unit vector 3 | backbone mask]
    (its first restype block is expanded along i, so it holds token j's)."""
    d = distogram_bins
    restype_j, restype_i = d + 1, d + 1 + num_restypes
    unit, backbone = d + 1 + 2 * num_restypes, d + 4 + 2 * num_restypes
    return ([*range(d), d, unit, unit + 1, unit + 2, backbone]
            + list(range(restype_i, restype_i + num_restypes)) + list(range(restype_j, restype_j + num_restypes)))


def template_embedder_map(num_blocks: int, num_restypes: int) -> Mapping:
    """featurecache.model.network.embedders.TemplateEmbedder <- TemplateEmbedder."""
    order = template_feature_columns(num_restypes)
    mapping = {
        "pair_norm.weight": same("layernorm_z.weight"), "pair_norm.bias": same("layernorm_z.bias"),
        "from_pair.weight": same("linear_no_bias_z.weight"),
        "from_features.weight": Source(("linear_no_bias_a.weight",), lambda tensors, shape: tensors[0][:, order]),
        "out_norm.weight": same("layernorm_v.weight"), "out_norm.bias": same("layernorm_v.bias"),
        "linear_out.weight": same("linear_no_bias_u.weight"),
    }
    for index in range(num_blocks):
        mapping.update(under(f"blocks.{index}.", f"pairformer_stack.blocks.{index}.", pair_stack_map()))
    return mapping
