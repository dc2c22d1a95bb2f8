"""Protenix 2.0 (PyPI `protenix`, ByteDance's AF3 reproduction) as an independent reference for
featurecache's model: import it on a CPU, randomise its weights, and copy them into featurecache's
modules through explicit name maps (tests/equivalence), or build its whole model small and
convert it (tests/integrations/protenix).

The name maps are featurecache.integrations.protenix.weights's, the ones `featurecache convert`
uses: for every parameter of the featurecache module, the Protenix parameters it is made from and
how (as it is, stacked, reordered, or zero where Protenix has no such parameter and featurecache's
must be zero to compute the same function). `copy_weights` refuses a map that leaves a
featurecache parameter unset, names one that does not exist, or leaves a Protenix parameter
unused: a parameter one side has and the other ignores is a difference in the model, and must be
written down in the map (and in docs/FIDELITY.md), not passed over.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import io
import math
import os

import torch
import torch.nn.functional as F
from torch import nn

from featurecache.integrations.protenix.weights import (  # noqa: F401 (the module maps, for the comparisons)
    Mapping,
    Part,
    Source,
    adaptive_layernorm_map,
    atom_attention_decoder_map,
    atom_attention_encoder_map,
    blocks,
    confidence_head_constants,
    confidence_head_map,
    conditioned_transformer_map,
    diffusion_module_map,
    msa_block_map,
    outer_product_mean_map,
    pair_stack_map,
    pairformer_block_map,
    relative_position_map,
    same,
    stacked,
    template_embedder_map,
    under,
    zeros,
)
from featurecache.model.network.atom_attention import NAME_CHAR_CLASSES, NUM_ELEMENTS
from featurecache.model.network.atoms import (
    centre_atom_index,
    dense_token_bonds,
    representative_atom_index,
    token_bond_atoms,
)
from featurecache.model.network.confidence import atom_slots
from featurecache.model.config import ModelConfig, preset
from featurecache.model.network.embedders import TEMPLATE_DISTOGRAM_EDGES, template_pair_features
from featurecache.schema import NUM_RESTYPES

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
        raise ImportError(
            f"protenix is not installed ({error}): run ./setup.sh, which installs protenix==2.0.0 without its pins"
        ) from error
    if not protenix.__version__.startswith(PROTENIX_VERSION):
        raise ImportError(
            f"protenix {protenix.__version__} is installed, the name maps are written for "
            f"{PROTENIX_VERSION}: run ./setup.sh"
        )
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


# --- name maps: featurecache.integrations.protenix.weights's, for modules ---------------------------
# The run-time name map (the whole model, and each module's part of it) lives in
# featurecache.integrations.protenix.weights; the comparisons copy random Protenix weights into
# single modules through the same maps. What follows adds what only a comparison needs: copying
# into a module (copy_weights), Protenix tensors a comparison handles by hand (ProtenixOnly), and
# a rescaled parameter (AF3's outer product mean against Protenix's).


class NameMapError(AssertionError):
    """A name map that does not cover both modules exactly."""


def scaled(name: str, factor: float, why: str) -> Source:
    """The Protenix tensor times `factor`: where Protenix applies a constant to a parameter that
    AF3 (and featurecache's default) does not, for the inputs a comparison uses (a comparison's
    map only: the conversion's scales are powers of two, exact both ways)."""
    return Source((Part(name),), why=why, scale=factor)


@dataclasses.dataclass(frozen=True)
class ProtenixOnly:
    """A Protenix tensor featurecache's module has no counterpart of, and what the comparison does
    with it: `kind` "zeroed" (set to zero in Protenix's module, which removes a term AF3 does not
    have), "constant" (a fixed tensor, checked equal to `expected`, featurecache's constant), or
    "input" (part of a Protenix step the comparison applies to featurecache's input)."""

    kind: str
    why: str
    expected: torch.Tensor | None = None


@torch.no_grad()
def copy_weights(
    protenix_module: nn.Module,
    featurecache_module: nn.Module,
    mapping: Mapping,
    protenix_only: dict[str, ProtenixOnly] | None = None,
) -> None:
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
    problems += [
        f"featurecache tensor {name} {tuple(ours[name].shape)} is not mapped"
        for name in sorted(set(ours) - set(mapping))
    ]
    problems += [
        f"the map sets {name}, which featurecache's module does not have" for name in sorted(set(mapping) - set(ours))
    ]
    problems += [
        f"Protenix tensor {name} {tuple(theirs[name].shape)} is not used" for name in sorted(set(theirs) - used)
    ]
    problems += [f"the map reads {name}, which Protenix's module does not have" for name in sorted(used - set(theirs))]
    if problems:
        raise NameMapError("name map does not match the modules:\n  " + "\n  ".join(problems))
    for name, only in protenix_only.items():
        if only.kind == "zeroed":
            theirs[name].zero_()
        elif only.kind == "constant":
            if not torch.allclose(theirs[name].detach().float(), only.expected.float(), rtol=0, atol=1e-6):
                raise NameMapError(
                    f"Protenix's {name} is {theirs[name].tolist()}, featurecache's "
                    f"{only.expected.tolist()} ({only.why})"
                )
        elif only.kind != "input":
            raise ValueError(f"ProtenixOnly kind {only.kind!r}, expected zeroed, constant or input")
    for name, source in mapping.items():
        value = source.to_featurecache([theirs[n].detach() for n in source.names], ours[name].shape)
        if value.shape != ours[name].shape:
            problems.append(f"{name}: featurecache {tuple(ours[name].shape)}, from {source.names} {tuple(value.shape)}")
            continue
        ours[name].copy_(value)
    if problems:
        raise NameMapError("shapes differ:\n  " + "\n  ".join(problems))


def outer_product_mean_af3_map(config: ModelConfig, msa_rows: int) -> Mapping:
    """The outer product mean's map for featurecache's AF3 form (outer_product_bias_divided off):
    Protenix divides its output bias by the row count with everything else, which for `msa_rows`
    valid rows at every pair is featurecache's bias scaled by 1 / (msa_rows + eps)."""
    return {
        **outer_product_mean_map(config),
        "linear_out.bias": scaled(
            "linear_out.bias", 1.0 / (msa_rows + OUTER_PRODUCT_EPS), "Protenix divides its output bias by the row count"
        ),
    }


# Protenix's OuterProductMean (OpenFold's) divides by (valid rows + 1e-3) after its output Linear
OUTER_PRODUCT_EPS = 1e-3


def confidence_head_protenix_only(config: ModelConfig) -> dict[str, ProtenixOnly]:
    """The confidence head's Protenix tensors without a counterpart in featurecache's head built
    from `config`: its fixed distance bins always; with AF3's head (confidence_single_norm and
    confidence_raw_distance off) its raw-distance embedding, zeroed, and its LayerNorm of the trunk
    single, which the comparison applies to featurecache's input."""
    constants = confidence_head_constants()
    only = {
        name: ProtenixOnly("constant", "the distance bins' edges (the last open)", value)
        for name, value in constants.items()
    }
    if not config.dialect.confidence_raw_distance:
        only["linear_no_bias_d_wo_onehot.weight"] = ProtenixOnly(
            "zeroed",
            "Protenix adds a linear embedding of the raw distance beside the one-hot bins; AF3 "
            "(Algorithm 31) and featurecache's default embed the bins only",
        )
    if not config.dialect.confidence_single_norm:
        for name in ("input_strunk_ln.weight", "input_strunk_ln.bias"):
            only[name] = ProtenixOnly(
                "input",
                "Protenix normalises the trunk single (clamped to +-512) before its Pairformer; AF3 and "
                "featurecache's default do not: the comparison gives featurecache the normalised single",
            )
    return only


def protenix_atom_transformer_without_cross_attention(atom_transformer: nn.Module, config: ModelConfig) -> None:
    """Rebuild a Protenix AtomTransformer's blocks with its cross_attention_mode off.

    Protenix's atom transformer (cross_attention_mode=True) computes keys and values from a second
    AdaLN applied to the queries' AdaLN output, AdaLN_kv(AdaLN_q(a, s), s); AF3's code, and
    featurecache with atom_key_adaln=True, apply the keys' AdaLN to a itself. With the mode off,
    Protenix's own code runs one AdaLN for all, featurecache's atom_key_adaln=False
    (docs/FIDELITY.md)."""
    from protenix.model.modules.transformer import DiffusionTransformer

    atom_transformer.diffusion_transformer = DiffusionTransformer(
        n_blocks=config.atom_attention.atom_blocks,
        n_heads=config.atom_attention.atom_heads,
        c_a=config.atom_attention.c_atom,
        c_s=config.atom_attention.c_atom,
        c_z=config.atom_attention.c_atompair,
        cross_attention_mode=False,
    )


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


# --- the whole model: Protenix's own, small, and its inputs from a featurecache batch --------------


def _deep_update(target: dict, update: dict) -> dict:
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(target.get(key), dict):
            _deep_update(target[key], value)
        else:
            target[key] = value
    return target


# Protenix's whole model at small widths (its own constructor, its own fixed sizes: triangle
# updates 128 wide with 4 heads of 32, 16 single heads, 8 x 8 pair-weighted averaging, a 256-wide
# noise embedding, an input embedder of 3 atom blocks), a few blocks of each stack.
SMALL_PROTENIX = {
    "c_s": 32,
    "c_z": 16,
    "c_token": 32,
    "c_s_inputs": 32 + 65,
    "c_atom": 16,
    "c_atompair": 8,
    "n_blocks": 2,
    "model": {
        "template_embedder": {"n_blocks": 1, "c": 8},
        "msa_module": {"n_blocks": 2, "c_m": 8},
        "confidence_head": {"n_blocks": 1},
        "diffusion_module": {
            "c_token": 32,
            "atom_encoder": {"n_blocks": 1},
            "transformer": {"n_blocks": 2},
            "atom_decoder": {"n_blocks": 1},
        },
    },
    # every MSA row, in order (its MSA module otherwise draws a random number of them)
    "data": {"msa": {"strategy": "topk", "min_size": {"train": 1 << 14, "test": 1 << 14}}},
    "triangle_multiplicative": "torch",
    "triangle_attention": "torch",
    "use_wandb": False,
}


def protenix_configs(update: dict | None = None):
    """Protenix's training configs (its configs_base and configs_data) with `update` applied
    (default SMALL_PROTENIX), through its own parse_configs."""
    import_protenix()
    from configs.configs_base import configs as base_configs
    from configs.configs_data import data_configs
    from protenix.config import parse_configs

    configs = copy.deepcopy({**base_configs, "data": data_configs})
    _deep_update(configs, copy.deepcopy(SMALL_PROTENIX if update is None else update))
    return parse_configs(configs, arg_str="", fill_required_with_null=True)


def protenix_model(generator: torch.Generator, update: dict | None = None) -> nn.Module:
    """Protenix's model (protenix.model.protenix.Protenix) built from protenix_configs(update),
    its weights randomised, in eval mode."""
    configs = protenix_configs(update)
    from protenix.model.protenix import Protenix

    tf32 = torch.backends.cuda.matmul.allow_tf32
    with contextlib.redirect_stdout(io.StringIO()):  # its factories print their settings
        model = Protenix(configs)
    torch.backends.cuda.matmul.allow_tf32 = tf32  # its constructor sets the process-wide flag
    randomise(model, generator)
    return model.eval()


def protenix_template_features(batch: dict) -> dict:
    """Protenix's template inputs of sample 0 from featurecache's features (before its multichain
    mask, which Protenix applies itself to the masks and unit vectors; the distogram it reads as
    given, so it gets featurecache's masked one). Protenix's own template featurizer imports
    biopython, which is not installed: this compares the model, not the featurizer."""
    distogram, pb_mask, unit, backbone_mask = [], [], [], []
    bins = TEMPLATE_DISTOGRAM_EDGES[2] + 1
    for index in range(batch["template_mask"].shape[1]):
        features = template_pair_features(batch, index)[0]  # [N, N, 108], chain-masked
        distogram.append(features[..., :bins])
        pb = batch["template_pseudo_beta_mask"][0, index]
        pb_mask.append((pb[:, None] & pb[None, :]).float())
        bb = batch["template_backbone_mask"][0, index].all(dim=-1)
        backbone_mask.append((bb[:, None] & bb[None, :]).float())
        unit.append(features[..., bins + 1 : bins + 4])  # zero across chains, where Protenix's mask zeroes it too
    return {
        "template_distogram": torch.stack(distogram),
        "template_pseudo_beta_mask": torch.stack(pb_mask),
        "template_unit_vector": torch.stack(unit),
        "template_backbone_frame_mask": torch.stack(backbone_mask),
        "template_aatype": batch["template_restype"][0].long(),
        "asym_id": batch["asym_id"][0],
    }


def protenix_element_index(atomic_number: torch.Tensor) -> torch.Tensor:
    """Protenix's ref_element one-hot index of an atomic number: H first (Z - 1); featurecache's
    unknown element 0 in its last slot, as integrations.protenix.weights maps the columns."""
    return (atomic_number.long() - 1) % NUM_ELEMENTS


def protenix_features(batch: dict) -> dict:
    """Protenix's input_feature_dict for sample 0 of a featurecache batch without padding (Protenix
    runs one sample, unpadded): what its featurizer gives for the same tokens, atoms, MSA and
    templates. Its model adds the relative-position features and the atom pairs itself."""
    if not (batch["token_pad_mask"][0].all() and batch["atom_pad_mask"][0].all()):
        raise ValueError("protenix_features: sample 0 has padding; Protenix's model reads unpadded samples")
    one = {name: value[0] for name, value in batch.items() if isinstance(value, torch.Tensor)}
    atom_to_token = one["atom_to_token"].long()
    tokens = one["restype"].shape[0]
    deletions = one["deletion_matrix"].float()
    rows = one["msa_row_mask"]
    centre = centre_atom_index(batch)[0]
    representative = representative_atom_index(batch)[0]
    frame_atoms = one["frame_atom_index"].long()

    def atom_mask(index: torch.Tensor) -> torch.Tensor:
        mask = torch.zeros(atom_to_token.shape[0], dtype=torch.long)
        mask[index] = 1
        return mask

    features = {
        "restype": F.one_hot(one["restype"].long(), NUM_RESTYPES).float(),
        "profile": one["msa_profile"].float(),
        "deletion_mean": one["deletion_mean"].float(),
        **{name: one[name].long() for name in ("asym_id", "residue_index", "entity_id", "sym_id", "token_index")},
        "token_bonds": dense_token_bonds(batch["token_bonds"], batch["token_bond_mask"], tokens)[0].float(),
        "msa": one["msa"][rows].long(),
        "has_deletion": (deletions[rows] > 0).float(),
        "deletion_value": (torch.atan(deletions[rows] / 3.0) * (2.0 / math.pi)),
        "ref_pos": one["ref_pos"].float(),
        "ref_charge": one["ref_charge"].float(),
        "ref_mask": one["ref_mask"].float(),
        "ref_element": F.one_hot(protenix_element_index(one["ref_element"]), NUM_ELEMENTS).float(),
        "ref_atom_name_chars": F.one_hot(one["ref_atom_name_chars"].long(), NAME_CHAR_CLASSES).float(),
        "ref_space_uid": one["ref_space_uid"].long(),
        "atom_to_token_idx": atom_to_token,
        "atom_to_tokatom_idx": atom_slots(batch["atom_to_token"], batch["atom_pad_mask"], tokens)[0],
        "distogram_rep_atom_mask": atom_mask(representative),
        "pae_rep_atom_mask": atom_mask(centre),
        "plddt_m_rep_atom_mask": atom_mask(centre[~one["is_ligand"]]),
        "frame_atom_index": frame_atoms.clamp(min=0),
        "has_frame": (frame_atoms >= 0).all(-1).long(),
        **{name: one[name][atom_to_token].long() for name in ("is_protein", "is_rna", "is_dna", "is_ligand")},
        "resolution": one["resolution"].reshape(1).float(),
    }
    if one["template_mask"].any():
        features.update(
            {
                name: value[one["template_mask"]] if name != "asym_id" else value
                for name, value in protenix_template_features(batch).items()
            }
        )
    bonds = token_bond_atoms(
        batch["token_bonds"],
        batch["token_bond_mask"],
        batch["atom_to_token"],
        batch["atom_pad_mask"],
        batch["atom_pos"],
        batch["atom_mask"],
    )[0]
    bonds = bonds[(bonds >= 0).all(-1)]
    bond_mask = torch.zeros(atom_to_token.shape[0], atom_to_token.shape[0], dtype=torch.long)
    bond_mask[bonds[:, 0], bonds[:, 1]] = bond_mask[bonds[:, 1], bonds[:, 0]] = 1
    features["bond_mask"] = bond_mask
    return features


def protenix_labels(batch: dict) -> dict:
    """Protenix's label_dict of sample 0: the true coordinates and which atoms have them."""
    return {"coordinate": batch["atom_pos"][0].float(), "coordinate_mask": batch["atom_mask"][0].long()}
