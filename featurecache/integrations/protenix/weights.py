"""The name map between Protenix 2.x's model and featurecache's AF3Model: for every featurecache
tensor, the Protenix tensors it is made of and how, in both directions.

A `Source` stacks Protenix tensors along one dimension (featurecache packs q, k, v and gate in one
matrix, Protenix keeps four), optionally reorders that dimension (a feature vector laid out in
another order), and may hold zero parts: featurecache tensors Protenix has no counterpart of
(a LayerNorm offset, a bias), zero so that featurecache computes Protenix's function. Every
operation is a copy, a concatenation or a permutation, so Protenix -> featurecache -> Protenix
gives back the very same bits; the way back refuses a zero part that is no longer zero (a
fine-tuned offset Protenix's model could not hold).

`model_map(config)` is the whole model, `protenix_constants(config)` Protenix's fixed tensors
without a counterpart (its confidence head's distance bins). The module maps below are the parts
tests/equivalence copies random Protenix weights through (featurecache.testing.protenix).
Where the two models compute different functions, the map does not hide it: featurecache's
`protenix` dialect (ModelConfig, docs/FIDELITY.md) computes Protenix's, and
`featurecache.integrations.protenix.convert` checks that a checkpoint it writes records it.
"""

from __future__ import annotations

import dataclasses

import torch

from featurecache.model.network.atom_attention import NAME_CHAR_CLASSES, NAME_CHARS, NUM_ELEMENTS
from featurecache.model.network.confidence import DISTANCE_BIN_MAX, DISTANCE_BIN_MIN, DISTANCE_BINS
from featurecache.model.config import ModelConfig
from featurecache.model.network.embedders import TEMPLATE_DISTOGRAM_EDGES
from featurecache.schema import NUM_RESTYPES


class NameMapError(ValueError):
    """Tensors the map and a model (or a state dict) do not agree on, named."""


@dataclasses.dataclass(frozen=True)
class Part:
    """One slice of a featurecache tensor along the Source's dimension: the Protenix tensor `name`
    (None: zeros Protenix has no tensor for) of `size` entries (None: the whole dimension)."""

    name: str | None
    size: int | None = None


@dataclasses.dataclass(frozen=True)
class Source:
    """How one featurecache tensor is made from Protenix tensors: `parts` concatenated along `dim`,
    then entry j of that dimension taken from entry `order[j]` (None: in order), times `scale`
    (a power of two in the run-time map, so that both ways are exact)."""

    parts: tuple[Part, ...]
    dim: int = 0
    order: tuple[int, ...] | None = None
    why: str = ""
    scale: float = 1.0

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(part.name for part in self.parts if part.name is not None)

    def prefixed(self, protenix_prefix: str) -> Source:
        parts = tuple(
            Part(None if part.name is None else protenix_prefix + part.name, part.size) for part in self.parts
        )
        return dataclasses.replace(self, parts=parts)

    def to_featurecache(
        self, tensors: list[torch.Tensor], shape: torch.Size, dtype: torch.dtype = torch.float32
    ) -> torch.Tensor:
        """The featurecache tensor of `shape` from the Protenix `tensors` (in `names` order)."""
        given = iter(tensors)
        pieces = []
        for part in self.parts:
            if part.name is not None:
                pieces.append(next(given))
                continue
            size = shape[self.dim] if part.size is None else part.size
            like = pieces[0] if pieces else None
            pieces.append(
                torch.zeros(
                    (*shape[: self.dim], size, *shape[self.dim + 1 :]), dtype=like.dtype if like is not None else dtype
                )
            )
        value = pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=self.dim)
        if self.order is not None:
            value = value.index_select(self.dim, torch.tensor(self.order))
        return value * self.scale if self.scale != 1.0 else value

    def to_protenix(self, value: torch.Tensor, featurecache_name: str) -> dict[str, torch.Tensor]:
        """The Protenix tensors of featurecache's `value`; NameMapError where a zero part is not
        zero (Protenix's model has nowhere to put it)."""
        if self.scale != 1.0:
            value = value / self.scale
        if self.order is not None:
            value = value.index_select(self.dim, torch.argsort(torch.tensor(self.order)))
        sizes = [value.shape[self.dim] if part.size is None else part.size for part in self.parts]
        if sum(sizes) != value.shape[self.dim]:
            raise NameMapError(
                f"{featurecache_name} {tuple(value.shape)}: dimension {self.dim} is not "
                f"{' + '.join(map(str, sizes))} as the map's Protenix tensors {self.names}"
            )
        tensors = {}
        for part, piece in zip(self.parts, value.split(sizes, dim=self.dim), strict=True):
            if part.name is not None:
                tensors[part.name] = piece.clone(memory_format=torch.contiguous_format)
            elif piece.any():
                raise NameMapError(
                    f"{featurecache_name} is not zero where Protenix's model has no parameter "
                    f"({self.why or 'a featurecache-only part'}): Protenix cannot hold these weights"
                )
        return tensors


Mapping = dict[str, Source]


def same(name: str) -> Source:
    """The Protenix tensor as it is."""
    return Source((Part(name),))


def stacked(*parts: tuple[str | None, int], dim: int = 0, why: str = "") -> Source:
    """Protenix tensors (name, size) side by side along `dim` (0: rows, as featurecache packs
    several projections in one matrix; 1: columns, as it concatenates their inputs)."""
    return Source(tuple(Part(name, size) for name, size in parts), dim=dim, why=why)


def doubled(name: str, why: str) -> Source:
    """Twice the Protenix tensor (exact both ways): where Protenix adds a term twice that
    featurecache adds once."""
    return Source((Part(name),), why=why, scale=2.0)


def zeros(why: str) -> Source:
    """A featurecache tensor Protenix does not have, zero: Protenix's function; `why` says what it is."""
    return Source((Part(None),), why=why)


def reordered(name: str, order: list[int], dim: int = 1) -> Source:
    """The Protenix tensor with dimension `dim` (columns: the features it reads) in featurecache's
    order: featurecache's entry j is Protenix's `order[j]`."""
    return Source((Part(name),), dim=dim, order=tuple(order))


def under(featurecache_prefix: str, protenix_prefix: str, mapping: Mapping) -> Mapping:
    """`mapping` for a submodule: both sides' names prefixed."""
    return {featurecache_prefix + name: source.prefixed(protenix_prefix) for name, source in mapping.items()}


def blocks(count: int, featurecache_prefix: str, protenix_prefix: str, block: Mapping) -> Mapping:
    """`block`'s map for blocks 0..count-1 of a stack."""
    mapping = {}
    for index in range(count):
        mapping.update(under(f"{featurecache_prefix}{index}.", f"{protenix_prefix}{index}.", block))
    return mapping


# --- the pair stack and the Pairformer (Algorithms 11-17) -------------------------------------------


def triangle_multiplication_map() -> Mapping:
    """TriangleMultiplication <- TriangleMultiplication{Outgoing,Incoming}: LayerNorms named norm_*."""
    return {
        "norm_in.weight": same("layer_norm_in.weight"),
        "norm_in.bias": same("layer_norm_in.bias"),
        "norm_out.weight": same("layer_norm_out.weight"),
        "norm_out.bias": same("layer_norm_out.bias"),
        **{
            f"{name}.weight": same(f"{name}.weight")
            for name in ("linear_a_p", "linear_a_g", "linear_b_p", "linear_b_g", "linear_g", "linear_z")
        },
    }


def triangle_attention_map(heads: int, head_dim: int) -> Mapping:
    """model.layers.TriangleAttention <- TriangleAttention: one LayerNorm, then q, k, v, gate and
    the per-head bias packed in one matrix (Protenix: mha.linear_{q,k,v,g} and `linear`).
    featurecache's output projection has a bias Protenix's lacks (zero)."""
    inner = heads * head_dim
    return {
        "proj.norm.weight": same("layer_norm.weight"),
        "proj.norm.bias": same("layer_norm.bias"),
        "proj.linear.weight": stacked(
            ("mha.linear_q.weight", inner),
            ("mha.linear_k.weight", inner),
            ("mha.linear_v.weight", inner),
            ("mha.linear_g.weight", inner),
            ("linear.weight", heads),
        ),
        "linear_out.weight": same("mha.linear_o.weight"),
        "linear_out.bias": zeros("the triangle attention's output bias (Protenix's linear_o has none)"),
    }


def transition_map() -> Mapping:
    """featurecache.kernels.transition.Transition <- primitives.Transition (SwiGLU)."""
    return {
        "norm.weight": same("layernorm1.weight"),
        "norm.bias": same("layernorm1.bias"),
        "linear_a.weight": same("linear_no_bias_a.weight"),
        "linear_b.weight": same("linear_no_bias_b.weight"),
        "linear_out.weight": same("linear_no_bias.weight"),
    }


def pair_stack_map(heads: int, head_dim: int) -> Mapping:
    """model.pairformer.PairStack <- the pair half of Protenix's PairformerBlock."""
    return {
        **under("tri_mul_out.", "tri_mul_out.", triangle_multiplication_map()),
        **under("tri_mul_in.", "tri_mul_in.", triangle_multiplication_map()),
        **under("tri_att_start.", "tri_att_start.", triangle_attention_map(heads, head_dim)),
        **under("tri_att_end.", "tri_att_end.", triangle_attention_map(heads, head_dim)),
        **under("transition.", "pair_transition.", transition_map()),
    }


def attention_pair_bias_map(heads: int, head_dim: int) -> Mapping:
    """model.layers.AttentionPairBias <- AttentionPairBias(has_s=False): q, k, v and gate packed
    in one matrix with q's bias first (k, v and the gate have none: zeros)."""
    inner = heads * head_dim
    return {
        "proj.norm.weight": same("layernorm_a.weight"),
        "proj.norm.bias": same("layernorm_a.bias"),
        "proj.linear.weight": stacked(*((f"attention.linear_{name}.weight", inner) for name in "qkvg")),
        "proj.linear.bias": stacked(
            ("attention.linear_q.bias", inner), (None, 3 * inner), why="the key, value and gate biases (Protenix: none)"
        ),
        "pair_bias.norm.weight": same("layernorm_z.weight"),
        "pair_bias.norm.bias": same("layernorm_z.bias"),
        "pair_bias.linear.weight": same("linear_nobias_z.weight"),
        "linear_out.weight": same("attention.linear_o.weight"),
    }


def pairformer_block_map(config: ModelConfig) -> Mapping:
    """model.pairformer.PairformerBlock <- PairformerBlock (the trunk's and the confidence head's)."""
    return {
        **under("pair.", "", pair_stack_map(config.trunk.pair_heads, config.trunk.pair_head_dim)),
        **under(
            "attention.",
            "attention_pair_bias.",
            attention_pair_bias_map(config.trunk.single_heads, config.trunk.single_head_dim),
        ),
        **under("transition.", "single_transition.", transition_map()),
    }


# --- the MSA module (Algorithms 8-10) ----------------------------------------------------------------


def outer_product_mean_map(config: ModelConfig) -> Mapping:
    """model.layers.OuterProductMean <- OuterProductMean: a and b packed in one matrix with a bias
    (zero: Protenix's and AF3's are LinearNoBias). The output bias is Protenix's as it is: with
    outer_product_bias_divided featurecache divides it by the row count as Protenix does."""
    hidden = config.msa.outer_product_dim
    return {
        "proj.norm.weight": same("layer_norm.weight"),
        "proj.norm.bias": same("layer_norm.bias"),
        "proj.linear.weight": stacked(("linear_1.weight", hidden), ("linear_2.weight", hidden)),
        "proj.linear.bias": zeros("the a, b projections' bias (Protenix and AF3: LinearNoBias)"),
        "linear_out.weight": same("linear_out.weight"),
        "linear_out.bias": same("linear_out.bias"),
    }


def pair_weighted_averaging_map(config: ModelConfig) -> Mapping:
    """model.layers.PairWeightedAveraging <- MSAPairWeightedAveraging: values and gate packed."""
    inner = config.msa.msa_heads * config.msa.msa_head_dim
    return {
        "proj.norm.weight": same("layernorm_m.weight"),
        "proj.norm.bias": same("layernorm_m.bias"),
        "proj.linear.weight": stacked(("linear_no_bias_mv.weight", inner), ("linear_no_bias_mg.weight", inner)),
        "pair_bias.norm.weight": same("layernorm_z.weight"),
        "pair_bias.norm.bias": same("layernorm_z.bias"),
        "pair_bias.linear.weight": same("linear_no_bias_z.weight"),
        "linear_out.weight": same("linear_no_bias_out.weight"),
    }


def msa_block_map(config: ModelConfig, last: bool) -> Mapping:
    """model.msa.MSABlock <- MSABlock (its pair stack a PairformerBlock with c_s = 0)."""
    mapping = {
        **under("outer_product_mean.", "outer_product_mean_msa.", outer_product_mean_map(config)),
        **under("pair.", "pair_stack.", pair_stack_map(config.trunk.pair_heads, config.trunk.pair_head_dim)),
    }
    if not last:
        mapping.update(
            under(
                "pair_weighted_averaging.",
                "msa_stack.msa_pair_weighted_averaging.",
                pair_weighted_averaging_map(config),
            )
        )
        mapping.update(under("msa_transition.", "msa_stack.transition_m.", transition_map()))
    return mapping


def msa_module_map(config: ModelConfig) -> Mapping:
    """model.msa.MSAModule <- MSAModule: the same MSA features [class 32 | has_deletion | value]."""
    mapping = {
        "from_msa.weight": same("linear_no_bias_m.weight"),
        "from_single.weight": same("linear_no_bias_s.weight"),
    }
    for index in range(config.msa.msa_blocks):
        last = index == config.msa.msa_blocks - 1
        mapping.update(under(f"blocks.{index}.", f"blocks.{index}.", msa_block_map(config, last)))
    return mapping


# --- the template embedder (Algorithm 16) ------------------------------------------------------------


def template_feature_columns(num_restypes: int = NUM_RESTYPES) -> list[int]:
    """For each column of featurecache's template features [distogram | pseudo-beta mask | unit
    vector 3 | backbone mask | restype of i | restype of j], the column of Protenix's
    [distogram | pseudo-beta mask | restype of j | restype of i | unit vector 3 | backbone mask]
    (its first restype block is expanded along i, so it holds token j's)."""
    d = TEMPLATE_DISTOGRAM_EDGES[2] + 1
    restype_j, restype_i = d + 1, d + 1 + num_restypes
    unit, backbone = d + 1 + 2 * num_restypes, d + 4 + 2 * num_restypes
    return (
        [*range(d), d, unit, unit + 1, unit + 2, backbone]
        + list(range(restype_i, restype_i + num_restypes))
        + list(range(restype_j, restype_j + num_restypes))
    )


def template_embedder_map(config: ModelConfig) -> Mapping:
    """model.embedders.TemplateEmbedder <- TemplateEmbedder (its Pairformer blocks with c_s = 0)."""
    return {
        "pair_norm.weight": same("layernorm_z.weight"),
        "pair_norm.bias": same("layernorm_z.bias"),
        "from_pair.weight": same("linear_no_bias_z.weight"),
        "from_features.weight": reordered("linear_no_bias_a.weight", template_feature_columns()),
        "out_norm.weight": same("layernorm_v.weight"),
        "out_norm.bias": same("layernorm_v.bias"),
        "linear_out.weight": same("linear_no_bias_u.weight"),
        **blocks(
            config.templates.template_blocks,
            "blocks.",
            "pairformer_stack.blocks.",
            pair_stack_map(config.templates.template_pair_heads, config.templates.template_pair_head_dim),
        ),
    }


# --- the conditioned transformer (Algorithms 23-26) and atom attention (Algorithms 5-7) --------------


def adaptive_layernorm_map() -> Mapping:
    """model.transformer.AdaptiveLayerNorm <- primitives.AdaptiveLayerNorm."""
    return {
        "norm_s.weight": same("layernorm_s.weight"),
        "scale.weight": same("linear_s.weight"),
        "scale.bias": same("linear_s.bias"),
        "shift.weight": same("linear_nobias_s.weight"),
    }


def conditioned_transformer_block_map(width: int, key_adaln: bool = False) -> Mapping:
    """model.transformer.ConditionedTransformerBlock <- DiffusionTransformerBlock (q, k, v and gate
    packed, q's bias separate; the pair LayerNorm without offset in Protenix, zero here).

    `key_adaln`: featurecache's keys' own AdaLN from Protenix's `layernorm_kv` (its
    cross_attention_mode). The weights correspond one to one; the functions are the same only
    where featurecache nests it as Protenix does (atom_key_adaln_nested, docs/FIDELITY.md)."""
    key_norm = (
        under("attention.key_adaln.", "attention_pair_bias.layernorm_kv.", adaptive_layernorm_map())
        if key_adaln
        else {}
    )
    return {
        **under("attention.adaln.", "attention_pair_bias.layernorm_a.", adaptive_layernorm_map()),
        **key_norm,
        "attention.proj.weight": stacked(
            *((f"attention_pair_bias.attention.linear_{name}.weight", width) for name in "qkvg")
        ),
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


def conditioned_transformer_map(num_blocks: int, width: int, key_adaln: bool = False) -> Mapping:
    """model.transformer.ConditionedTransformer <- DiffusionTransformer."""
    return blocks(num_blocks, "blocks.", "blocks.", conditioned_transformer_block_map(width, key_adaln))


def reference_feature_columns() -> list[int]:
    """For each column of featurecache's reference features [ref_pos 3 | charge | mask | element
    128 | name characters 4 x 64], its column in Protenix's three matrices side by side [ref_pos 3 |
    charge | mask | element 128 | name characters]. The element one-hot differs: featurecache's
    column Z is atomic number Z (AF3's code; 0 an unknown element), Protenix's column Z - 1 (H
    first; its last ten "UNK_ELEM_119..128" never set): featurecache's column 0 takes Protenix's
    last, an element slot neither model's data sets, so the permutation loses nothing."""
    elements = 5  # first element column in both layouts
    order = list(range(elements + NUM_ELEMENTS + NAME_CHARS * NAME_CHAR_CLASSES))
    for atomic_number in range(NUM_ELEMENTS):
        order[elements + atomic_number] = elements + (atomic_number - 1) % NUM_ELEMENTS
    return order


def atom_attention_encoder_map(config: ModelConfig, with_trunk: bool, num_blocks: int | None = None) -> Mapping:
    """model.atom_attention.AtomAttentionEncoder <- AtomAttentionEncoder: featurecache's one
    reference-feature matrix is Protenix's ref_pos, ref_charge and [mask | element | name] matrices
    side by side, its element columns permuted (reference_feature_columns)."""
    stacked_columns = stacked(
        ("linear_no_bias_ref_pos.weight", 3),
        ("linear_no_bias_ref_charge.weight", 1),
        ("linear_no_bias_f.weight", 1 + NUM_ELEMENTS + NAME_CHARS * NAME_CHAR_CLASSES),
        dim=1,
    )
    mapping = {
        "from_reference.weight": dataclasses.replace(stacked_columns, order=tuple(reference_feature_columns())),
        "pair_from_offset.weight": same("linear_no_bias_d.weight"),
        "pair_from_distance.weight": same("linear_no_bias_invd.weight"),
        "pair_from_same_space.weight": same("linear_no_bias_v.weight"),
        "pair_from_query.weight": same("linear_no_bias_cl.weight"),
        "pair_from_key.weight": same("linear_no_bias_cm.weight"),
        **{f"pair_mlp.{index}.weight": same(f"small_mlp.{index}.weight") for index in (1, 3, 5)},
        **under(
            "atom_transformer.transformer.",
            "atom_transformer.diffusion_transformer.",
            conditioned_transformer_map(
                config.atom_attention.atom_blocks if num_blocks is None else num_blocks,
                config.atom_attention.c_atom,
                config.atom_attention.atom_key_adaln,
            ),
        ),
        "to_token.weight": same("linear_no_bias_q.weight"),
    }
    if with_trunk:
        mapping.update(
            {
                **layernorm_linear_map("from_trunk_single.", "layernorm_s", "linear_no_bias_s"),
                **layernorm_linear_map("from_trunk_pair.", "layernorm_z", "linear_no_bias_z"),
                "from_positions.weight": same("linear_no_bias_r.weight"),
            }
        )
    return mapping


def atom_attention_decoder_map(config: ModelConfig) -> Mapping:
    """model.atom_attention.AtomAttentionDecoder <- AtomAttentionDecoder."""
    return {
        "from_token.weight": same("linear_no_bias_a.weight"),
        **under(
            "atom_transformer.transformer.",
            "atom_transformer.diffusion_transformer.",
            conditioned_transformer_map(
                config.atom_attention.atom_blocks, config.atom_attention.c_atom, config.atom_attention.atom_key_adaln
            ),
        ),
        **layernorm_linear_map("to_positions.", "layernorm_q", "linear_no_bias_out"),
    }


# --- the diffusion module (Algorithms 20-22) and the relative position encoding (Algorithm 3) --------


def layernorm_linear_map(prefix: str, norm: str, linear: str) -> Mapping:
    """featurecache's LayerNormLinear (no linear bias) <- a Protenix LayerNorm without offset
    (create_offset=False: zero here) and a LinearNoBias."""
    return {
        f"{prefix}norm.weight": same(f"{norm}.weight"),
        f"{prefix}norm.bias": zeros(f"{norm}'s offset (Protenix: none)"),
        f"{prefix}linear.weight": same(f"{linear}.weight"),
    }


def relative_position_map(config: ModelConfig) -> Mapping:
    """model.embedders.RelativePositionEncoding <- RelativePositionEncoding: the same features
    [residue offset | token offset | same entity | chain offset] in the same order. Protenix gates
    the chain offset on the entity, as AF3's code (relpos_chain_gate "entity"); the supplement's
    "chain" gate is another function, which no weight map makes equal."""
    if config.trunk.relpos_chain_gate != "entity":
        raise NameMapError(
            f"relpos_chain_gate {config.trunk.relpos_chain_gate!r}: Protenix gates the relative chain "
            "encoding on the entity; only 'entity' maps"
        )
    return {"linear.weight": same("linear_no_bias.weight")}


def diffusion_module_map(config: ModelConfig) -> Mapping:
    """model.diffusion.DiffusionModule <- DiffusionModule (Algorithms 20-21)."""
    conditioning = {
        **under("relpos.", "relpe.", relative_position_map(config)),
        **layernorm_linear_map("pair_in.", "layernorm_z", "linear_no_bias_z"),
        **layernorm_linear_map("single_in.", "layernorm_s", "linear_no_bias_s"),
        **layernorm_linear_map("noise_in.", "layernorm_n", "linear_no_bias_n"),
        "fourier.weight": same("fourier_embedding.w"),
        "fourier.bias": same("fourier_embedding.b"),
    }
    for index in range(2):
        conditioning.update(under(f"pair_transitions.{index}.", f"transition_z{index + 1}.", transition_map()))
        conditioning.update(under(f"single_transitions.{index}.", f"transition_s{index + 1}.", transition_map()))
    return {
        **under("conditioning.", "diffusion_conditioning.", conditioning),
        **under("atom_encoder.", "atom_attention_encoder.", atom_attention_encoder_map(config, with_trunk=True)),
        **layernorm_linear_map("single_to_token.", "layernorm_s", "linear_no_bias_s"),
        **under(
            "transformer.",
            "diffusion_transformer.",
            conditioned_transformer_map(config.diffusion.diffusion_blocks, config.diffusion.c_token_diffusion),
        ),
        "token_norm.weight": same("layernorm_a.weight"),
        "token_norm.bias": zeros("the token LayerNorm's offset (Protenix: none)"),
        **under("atom_decoder.", "atom_attention_decoder.", atom_attention_decoder_map(config)),
    }


# --- the confidence head (Algorithm 31) --------------------------------------------------------------


def confidence_head_map(config: ModelConfig) -> Mapping:
    """model.confidence.ConfidenceHead <- ConfidenceHead. Protenix's linear_no_bias_s2 reads token
    i of z_ij, linear_no_bias_s1 token j; the per-atom-slot weights have the same [slot, c_s, bins]
    layout. Protenix's LayerNorm of the trunk single and its raw-distance embedding are
    featurecache's single_norm and raw_distance, which only a head with confidence_single_norm and
    confidence_raw_distance has: without them the map leaves those Protenix tensors unused, which
    a conversion refuses (and tests/equivalence states what it does with them)."""
    mapping = {
        "left_inputs.weight": same("linear_no_bias_s2.weight"),
        "right_inputs.weight": same("linear_no_bias_s1.weight"),
        "distance.weight": same("linear_no_bias_d.weight"),
        **blocks(
            config.confidence.confidence_blocks,
            "pairformer.blocks.",
            "pairformer_stack.blocks.",
            pairformer_block_map(config),
        ),
        "pae_norm.weight": same("pae_ln.weight"),
        "pae_norm.bias": same("pae_ln.bias"),
        "pae.weight": same("linear_no_bias_pae.weight"),
        "pde_norm.weight": same("pde_ln.weight"),
        "pde_norm.bias": same("pde_ln.bias"),
        "pde.weight": same("linear_no_bias_pde.weight"),
        "plddt_norm.weight": same("plddt_ln.weight"),
        "plddt_norm.bias": same("plddt_ln.bias"),
        "resolved_norm.weight": same("resolved_ln.weight"),
        "resolved_norm.bias": same("resolved_ln.bias"),
        "plddt": same("plddt_weight"),
        "resolved": same("resolved_weight"),
    }
    if config.dialect.confidence_single_norm:
        mapping.update(
            {"single_norm.weight": same("input_strunk_ln.weight"), "single_norm.bias": same("input_strunk_ln.bias")}
        )
    if config.dialect.confidence_raw_distance:
        mapping["raw_distance.weight"] = same("linear_no_bias_d_wo_onehot.weight")
    return mapping


def confidence_head_constants() -> dict[str, torch.Tensor]:
    """Protenix's confidence head's fixed tensors (parameters without gradient) that featurecache
    computes instead: the distance bins' lower and upper edges (the last open), AF3's 39 bins."""
    lower = torch.linspace(DISTANCE_BIN_MIN, DISTANCE_BIN_MAX, DISTANCE_BINS)  # model.confidence's edges
    return {"lower_bins": lower, "upper_bins": torch.cat([lower[1:], lower.new_tensor([1e6])])}


# --- the whole model (Algorithm 1) -------------------------------------------------------------------


def model_map(config: ModelConfig) -> Mapping:
    """Every tensor of featurecache's AF3Model (with the confidence head) <- Protenix's model."""
    if not config.confidence.confidence_head:
        raise NameMapError("confidence_head is off: Protenix's model always has its confidence head")
    input_embedder = {
        **under(
            "atom_encoder.",
            "input_embedder.atom_attention_encoder.",
            atom_attention_encoder_map(config, with_trunk=False, num_blocks=config.dialect.input_atom_blocks),
        ),
        "to_single.weight": same("linear_no_bias_sinit.weight"),
        # Protenix's z_init: zinit1 of token i, zinit2 of token j
        "to_pair_i.weight": same("linear_no_bias_zinit1.weight"),
        "to_pair_j.weight": same("linear_no_bias_zinit2.weight"),
        **under("relpos.", "relative_position_encoding.", relative_position_map(config)),
        "from_token_bonds.weight": same("linear_no_bias_token_bond.weight"),
    }
    return {
        **under("input_embedder.", "", input_embedder),
        "recycle_single.norm.weight": same("layernorm_s.weight"),
        "recycle_single.norm.bias": same("layernorm_s.bias"),
        "recycle_single.linear.weight": same("linear_no_bias_s.weight"),
        "recycle_pair.norm.weight": same("layernorm_z_cycle.weight"),
        "recycle_pair.norm.bias": same("layernorm_z_cycle.bias"),
        "recycle_pair.linear.weight": same("linear_no_bias_z_cycle.weight"),
        **under("template_embedder.", "template_embedder.", template_embedder_map(config)),
        **under("msa_module.", "msa_module.", msa_module_map(config)),
        **blocks(
            config.trunk.pairformer_blocks,
            "pairformer.blocks.",
            "pairformer_stack.blocks.",
            pairformer_block_map(config),
        ),
        # Protenix (as AF3's code) symmetrises the logits, Linear(z) + Linear(z)^T, its bias twice;
        # featurecache symmetrises the pair, Linear(z + z^T): the same function with twice the bias
        "distogram_head.linear.weight": same("distogram_head.linear.weight"),
        "distogram_head.linear.bias": doubled(
            "distogram_head.linear.bias", "the logits' bias, added twice by Protenix's symmetrisation"
        ),
        **under("diffusion_module.", "diffusion_module.", diffusion_module_map(config)),
        **under("confidence_head.", "confidence_head.", confidence_head_map(config)),
    }


def protenix_constants() -> dict[str, torch.Tensor]:
    """Protenix's tensors that featurecache holds no counterpart of, with their fixed values."""
    return {f"confidence_head.{name}": value for name, value in confidence_head_constants().items()}
