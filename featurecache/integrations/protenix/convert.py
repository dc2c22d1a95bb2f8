"""Protenix 2.x checkpoints to featurecache checkpoints and back (`featurecache convert`).

Protenix's checkpoint files (its runner's save_checkpoint; the released weights, e.g.
protenix_base_default_v1.0.0.pt) are `torch.save`d dicts whose "model" entry is the state dict
of protenix.model.protenix.Protenix, its names prefixed "module." when saved from DDP (its loader
strips the prefix); a training checkpoint also holds "optimizer", "scheduler" and "step", and
its EMA weights are a separate file of the same layout ("<step>_ema_<decay>.pt").

A checkpoint carries no model config, so the model's sizes are read from the tensors' shapes
(`infer_config`: blocks counted, widths and head counts from the projections) and its behaviour
is Protenix's: featurecache's `protenix` dialect (model.config.PROTENIX_SETTINGS). The result is a
featurecache checkpoint with "model" and "model_config", which `featurecache predict` loads and
`featurecache train --init-from` fine-tunes. The way back writes {"model": state dict} that
Protenix's model loads with strict=True, from a featurecache checkpoint's EMA weights where it
has them (as predict uses), else its weights.
"""

from __future__ import annotations

import dataclasses
import pathlib
import pickle
import re

import torch

from featurecache.model.af3 import AF3Model
from featurecache.model.network.confidence import MAX_ATOMS_PER_TOKEN
from featurecache.model.config import (
    PROTENIX_SETTINGS,
    RUNTIME_SETTINGS,
    WEIGHT_MEANING_SETTINGS,
    ModelConfig,
    preset,
    saved_model_settings,
)
from featurecache.model.network.embedders import atom_single_input_dim
from featurecache.integrations.protenix.weights import NameMapError, model_map, protenix_constants
from featurecache.store.files import write_atomic

# Protenix's DDP checkpoints prefix every name (its runner strips it when it loads them)
DDP_PREFIX = "module."
# Sizes Protenix's code fixes (it offers no setting): a featurecache model with other values has
# no Protenix counterpart. Its triangle updates are checked apart (128 wide, 4 heads, or with its
# hidden_scale_up as wide as the pair, heads of 32).
PROTENIX_FIXED_SIZES = {
    "fourier_dim": 256,
    "atom_window_queries": 32,
    "atom_window_keys": 128,
    "atom_heads": 4,
    "msa_heads": 8,
    "msa_head_dim": 8,
    "outer_product_dim": 32,
    "pair_head_dim": 32,
    "template_pair_head_dim": 32,
    "transition_expansion": 4,
    "template_transition_expansion": 2,
    "relpos_max_chain": 2,
    "single_heads": 16,
}
# The atom transformer of Protenix's input embedder: 3 blocks whatever its diffusion module's
PROTENIX_INPUT_ATOM_BLOCKS = 3
# Protenix's own defaults where a checkpoint's shapes cannot tell (a stack of 0 blocks)
PROTENIX_DEFAULTS = {
    "template_pair_heads": 4,
    "template_pair_head_dim": 32,
    "template_triangle_mult_hidden": 128,
    "msa_heads": 8,
    "msa_head_dim": 8,
    "single_heads": 16,
}
# How many names of each kind an error line shows
NAMES_SHOWN = 6


class ConversionError(ValueError):
    """A checkpoint that cannot be converted, in one line naming the file and what is wrong."""


# --- Protenix -> featurecache ----------------------------------------------------------------------


def strip_ddp_prefix(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The state dict without Protenix's DDP "module." prefix, when every name has it."""
    if state and all(name.startswith(DDP_PREFIX) for name in state):
        return {name[len(DDP_PREFIX) :]: value for name, value in state.items()}
    return state


def _block_count(state: dict, prefix: str) -> int:
    """Blocks 0..n-1 under `prefix` ("pairformer_stack.blocks.")."""
    pattern = re.compile(re.escape(prefix) + r"(\d+)\.")
    indices = {int(match.group(1)) for name in state if (match := pattern.match(name))}
    if indices != set(range(len(indices))):
        raise ConversionError(f"the blocks under {prefix} are numbered {sorted(indices)}, not 0..n-1")
    return len(indices)


def _shape(state: dict, name: str) -> torch.Size:
    if name not in state:
        raise ConversionError(f"no tensor {name}: not a Protenix model checkpoint")
    return state[name].shape


def infer_config(state: dict[str, torch.Tensor]) -> ModelConfig:
    """The featurecache ModelConfig of a Protenix state dict: its sizes from the tensors' shapes,
    Protenix's dialect and AF3's (= Protenix's) training and sampler settings for the rest."""
    sizes = {}
    sizes["c_s"], c_s_inputs = _shape(state, "linear_no_bias_sinit.weight")
    sizes["c_z"] = _shape(state, "linear_no_bias_zinit1.weight")[0]
    sizes["c_m"] = _shape(state, "msa_module.linear_no_bias_m.weight")[0]
    sizes["c_template"] = _shape(state, "template_embedder.linear_no_bias_z.weight")[0]
    sizes["pairformer_blocks"] = _block_count(state, "pairformer_stack.blocks.")
    sizes["msa_blocks"] = _block_count(state, "msa_module.blocks.")
    sizes["template_blocks"] = _block_count(state, "template_embedder.pairformer_stack.blocks.")
    sizes["confidence_blocks"] = _block_count(state, "confidence_head.pairformer_stack.blocks.")
    # a Pairformer block's sizes, from the trunk's or else the confidence head's first block
    pairformer = (
        "pairformer_stack.blocks.0." if sizes["pairformer_blocks"] else "confidence_head.pairformer_stack.blocks.0."
    )
    if f"{pairformer}tri_att_start.linear.weight" in state:
        sizes.update(_pair_stack_sizes(state, pairformer, "pair_heads", "pair_head_dim", "triangle_mult_hidden"))
        sizes["transition_expansion"] = (
            _shape(state, f"{pairformer}pair_transition.linear_no_bias_a.weight")[0] // sizes["c_z"]
        )
        sizes["single_heads"] = _shape(state, f"{pairformer}attention_pair_bias.linear_nobias_z.weight")[0]
    sizes.setdefault("single_heads", PROTENIX_DEFAULTS["single_heads"])
    sizes["single_head_dim"] = sizes["c_s"] // sizes["single_heads"]
    template = "template_embedder.pairformer_stack.blocks.0."
    if sizes["template_blocks"]:
        sizes.update(
            _pair_stack_sizes(
                state, template, "template_pair_heads", "template_pair_head_dim", "template_triangle_mult_hidden"
            )
        )
        sizes["template_transition_expansion"] = (
            _shape(state, f"{template}pair_transition.linear_no_bias_a.weight")[0] // sizes["c_template"]
        )
    else:
        sizes.update(
            {
                name: PROTENIX_DEFAULTS[name]
                for name in ("template_pair_heads", "template_pair_head_dim", "template_triangle_mult_hidden")
            }
        )
    if sizes["msa_blocks"]:
        msa = "msa_module.blocks.0."
        sizes["outer_product_dim"] = _shape(state, f"{msa}outer_product_mean_msa.linear_1.weight")[0]
        averaging = f"{msa}msa_stack.msa_pair_weighted_averaging."
        if f"{averaging}linear_no_bias_z.weight" in state:  # a last (only) block has none
            sizes["msa_heads"] = _shape(state, f"{averaging}linear_no_bias_z.weight")[0]
            sizes["msa_head_dim"] = _shape(state, f"{averaging}linear_no_bias_mv.weight")[0] // sizes["msa_heads"]
    relpos_inputs = _shape(state, "relative_position_encoding.linear_no_bias.weight")[1]
    sizes["relpos_max_chain"] = PROTENIX_FIXED_SIZES["relpos_max_chain"]
    sizes["relpos_max_residue"] = (relpos_inputs - 2 * sizes["relpos_max_chain"] - 7) // 4  # 4 r + 2 s + 7 inputs
    encoder = "diffusion_module.atom_attention_encoder."
    sizes["c_atom"], sizes["c_atompair"] = (
        _shape(state, f"{encoder}linear_no_bias_r.weight")[0],
        _shape(state, f"{encoder}linear_no_bias_d.weight")[0],
    )
    sizes["atom_blocks"] = _block_count(state, f"{encoder}atom_transformer.diffusion_transformer.blocks.")
    input_atom_blocks = _block_count(
        state, "input_embedder.atom_attention_encoder.atom_transformer.diffusion_transformer.blocks."
    )
    # None where it is the diffusion module's count (the base models): the `protenix` preset's value
    sizes["input_atom_blocks"] = None if input_atom_blocks == sizes["atom_blocks"] else input_atom_blocks
    atom_block = f"{encoder}atom_transformer.diffusion_transformer.blocks.0."
    input_atom_block = "input_embedder.atom_attention_encoder.atom_transformer.diffusion_transformer.blocks.0."
    for block in (atom_block, input_atom_block):
        if f"{block}attention_pair_bias.linear_nobias_z.weight" in state:
            sizes["atom_heads"] = _shape(state, f"{block}attention_pair_bias.linear_nobias_z.weight")[0]
    sizes["c_token_diffusion"] = _shape(state, "diffusion_module.linear_no_bias_s.weight")[0]
    sizes["diffusion_blocks"] = _block_count(state, "diffusion_module.diffusion_transformer.blocks.")
    if sizes["diffusion_blocks"]:
        sizes["diffusion_heads"] = _shape(
            state, "diffusion_module.diffusion_transformer.blocks.0.attention_pair_bias.linear_nobias_z.weight"
        )[0]
    sizes["fourier_dim"] = _shape(state, "diffusion_module.diffusion_conditioning.fourier_embedding.w")[0]
    sizes["distogram_bins"] = _shape(state, "distogram_head.linear.weight")[0]
    slots = _shape(state, "confidence_head.plddt_weight")[0]
    if slots != MAX_ATOMS_PER_TOKEN:
        raise ConversionError(
            f"its confidence head has {slots} atom slots per token (max_atoms_per_token), "
            f"featurecache's {MAX_ATOMS_PER_TOKEN}"
        )
    try:
        config = preset("af3").replace(**PROTENIX_SETTINGS, **sizes)
    except ValueError as error:
        raise ConversionError(f"its shapes give no featurecache model: {error}") from None
    if atom_single_input_dim(config) != c_s_inputs:
        raise ConversionError(
            f"its s_inputs are {c_s_inputs} wide, featurecache's c_s + 65 = "
            f"{atom_single_input_dim(config)} (an extra input embedding?)"
        )
    return config


def _pair_stack_sizes(state: dict, block: str, heads_name: str, head_dim_name: str, hidden_name: str) -> dict:
    """The triangle updates' sizes of one Pairformer block: attention heads, head width, the
    multiplication's hidden width."""
    heads = _shape(state, f"{block}tri_att_start.linear.weight")[0]
    return {
        heads_name: heads,
        head_dim_name: _shape(state, f"{block}tri_att_start.mha.linear_q.weight")[0] // heads,
        hidden_name: _shape(state, f"{block}tri_mul_out.linear_a_p.weight")[0],
    }


def _names(names, kind: str) -> str:
    names = sorted(names)
    shown = ", ".join(names[:NAMES_SHOWN])
    more = f" and {len(names) - NAMES_SHOWN} more" if len(names) > NAMES_SHOWN else ""
    return f"{len(names)} {kind} ({shown}{more})"


def _featurecache_shapes(config: ModelConfig) -> dict[str, tuple[torch.Size, torch.dtype]]:
    """Names, shapes and dtypes of AF3Model(config)'s state dict, without allocating it."""
    with torch.device("meta"):
        model = AF3Model(config.replace(kernels="torch"))
    return {name: (value.shape, value.dtype) for name, value in model.state_dict().items()}


def _checked_map(config: ModelConfig) -> tuple[dict, dict[str, tuple[torch.Size, torch.dtype]]]:
    mapping, expected = model_map(config), _featurecache_shapes(config)
    if set(mapping) != set(expected):  # a map out of step with the model: a bug, named
        raise NameMapError(
            f"the name map and AF3Model differ: {_names(set(expected) - set(mapping), 'unmapped')}, "
            f"{_names(set(mapping) - set(expected), 'mapped but absent')}"
        )
    return mapping, expected


def protenix_to_featurecache(state: dict[str, torch.Tensor]) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """(ModelConfig, AF3Model state dict) of a Protenix model's state dict. ConversionError naming
    the keys that no map covers (another model, e.g. with ESM or constraint embedders) and those
    it lacks (a truncated or other file), or the tensors whose shapes or values differ."""
    state = strip_ddp_prefix(state)
    config = infer_config(state)
    mapping, expected = _checked_map(config)
    constants = protenix_constants()
    used = {name for source in mapping.values() for name in source.names} | set(constants)
    unknown, missing = set(state) - used, used - set(state)
    if unknown or missing:
        problems = ([_names(unknown, "unknown key(s)")] if unknown else []) + (
            [_names(missing, "missing key(s)")] if missing else []
        )
        raise ConversionError(f"not a Protenix model the map covers: {'; '.join(problems)}")
    for name, value in constants.items():
        if not torch.equal(state[name].float(), value):
            raise ConversionError(
                f"{name} is {state[name].tolist()[:4]}..., Protenix's fixed values are "
                f"{value.tolist()[:4]}... (featurecache computes these)"
            )
    converted, wrong = {}, []
    dtype = state["linear_no_bias_sinit.weight"].dtype
    for name, source in mapping.items():
        shape = expected[name][0]
        value = source.to_featurecache([state[n] for n in source.names], shape, dtype)
        if value.shape != shape:
            wrong.append(f"{name} {tuple(shape)} from {'+'.join(source.names) or 'zeros'} {tuple(value.shape)}")
        converted[name] = value
    if wrong:
        raise ConversionError(f"shapes featurecache's model cannot take: {'; '.join(wrong[:NAMES_SHOWN])}")
    return config, converted


# --- featurecache -> Protenix ----------------------------------------------------------------------


def protenix_differences(config: ModelConfig) -> list[str]:
    """Why Protenix's model cannot compute what `config`'s does: the weight-meaning settings that
    are not Protenix's, the sizes Protenix fixes otherwise."""
    settings = config.settings()  # by name, whatever part each lives in
    differ = [
        f"{name} {settings[name]!r} (Protenix: {value!r})"
        for name, value in PROTENIX_SETTINGS.items()
        if name in WEIGHT_MEANING_SETTINGS and settings[name] != value
    ]
    differ += [
        f"{name} {settings[name]!r} (Protenix fixes {value!r})"
        for name, value in PROTENIX_FIXED_SIZES.items()
        if settings[name] != value
    ]
    input_atom_blocks = settings["input_atom_blocks"]
    if input_atom_blocks is None:
        input_atom_blocks = settings["atom_blocks"]
    if input_atom_blocks != PROTENIX_INPUT_ATOM_BLOCKS:
        differ.append(
            f"{input_atom_blocks} atom blocks in the input embedder (Protenix's has {PROTENIX_INPUT_ATOM_BLOCKS})"
        )
    if not settings["confidence_head"]:
        differ.append("confidence_head False (Protenix always has one)")
    stacks = (
        ("triangle_mult_hidden", "pair_heads", settings["c_z"]),
        ("template_triangle_mult_hidden", "template_pair_heads", settings["c_template"]),
    )
    for hidden_name, heads_name, width in stacks:
        hidden, heads = settings[hidden_name], settings[heads_name]
        if (hidden, heads) not in ((128, 4), (width, width // 32)):
            differ.append(
                f"{hidden_name} {hidden!r} with {heads_name} {heads} (Protenix: 128 and 4, or "
                f"{width} and {width // 32} with its hidden_scale_up)"
            )
    return differ


def featurecache_to_protenix(config: ModelConfig, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The Protenix state dict of an AF3Model(config)'s `state`. ConversionError where the model is
    not Protenix's (its settings or sizes), where tensors are missing or left over, or where a
    tensor Protenix has no place for is not zero."""
    differ = protenix_differences(config)
    if differ:
        raise ConversionError(f"its model is not Protenix's: {'; '.join(differ)}")
    mapping, expected = _checked_map(config)
    unknown, missing = set(state) - set(mapping), set(mapping) - set(state)
    if unknown or missing:
        problems = ([_names(unknown, "unknown key(s)")] if unknown else []) + (
            [_names(missing, "missing key(s)")] if missing else []
        )
        raise ConversionError(f"its weights are not those of its model config: {'; '.join(problems)}")
    converted = {}
    for name, source in mapping.items():
        if state[name].shape != expected[name][0]:
            raise ConversionError(
                f"{name} is {tuple(state[name].shape)}, its model config's {tuple(expected[name][0])}"
            )
        try:
            converted.update(source.to_protenix(state[name], name))
        except NameMapError as error:
            raise ConversionError(str(error)) from None
    dtype = state["input_embedder.to_single.weight"].dtype
    converted.update({name: value.to(dtype) for name, value in protenix_constants().items()})
    return converted


# --- checkpoint files ------------------------------------------------------------------------------


def _load(path: pathlib.Path, what: str, weights_only: bool) -> dict:
    """A torch.save'd dict. `weights_only`: read without running pickled code (a downloaded
    file); featurecache's own training checkpoints hold RNG states (tuples, NumPy arrays) that only
    a full unpickling reads, so, as for predict, convert only those you wrote."""
    if not path.is_file():
        raise ConversionError(f"{path}: {'is a folder, expected a file' if path.is_dir() else 'no such file'}")
    try:
        state = torch.load(path, map_location="cpu", weights_only=weights_only)
    except (OSError, RuntimeError, EOFError, pickle.UnpicklingError, ValueError) as error:
        reason = " ".join(str(error).split())[:200] or type(error).__name__
        raise ConversionError(f"{path}: not a readable {what} ({reason})") from None
    if not isinstance(state, dict):
        raise ConversionError(f"{path}: not a {what} (a {type(state).__name__}, expected a dict)")
    return state


def read_protenix_checkpoint(path: pathlib.Path) -> dict[str, torch.Tensor]:
    """The model state dict of a Protenix checkpoint file (its "model" entry, as Protenix's runner
    reads it; the DDP prefix stripped)."""
    state = _load(path, "Protenix checkpoint", weights_only=True)
    if "model_config" in state:
        raise ConversionError(
            f"{path}: a featurecache checkpoint (it has a model_config), not a Protenix one: "
            "convert it with --to protenix"
        )
    weights = state.get("model")
    if not isinstance(weights, dict) or not weights:
        found = ", ".join(sorted(map(str, state))[:NAMES_SHOWN]) or "nothing"
        raise ConversionError(f'{path}: not a Protenix checkpoint: no "model" state dict (it holds {found})')
    if not all(isinstance(value, torch.Tensor) for value in weights.values()):
        raise ConversionError(f'{path}: its "model" entry holds values that are not tensors')
    return strip_ddp_prefix(weights)


def read_featurecache_checkpoint(path: pathlib.Path) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """A featurecache checkpoint's model config and weights (its EMA where it keeps one, as
    `featurecache predict` uses)."""
    state = _load(path, "featurecache checkpoint", weights_only=False)
    if not isinstance(state.get("model"), dict) or not isinstance(state.get("model_config"), dict):
        hint = " (a Protenix checkpoint? convert it with --to featurecache)" if "model" in state else ""
        raise ConversionError(f'{path}: not a featurecache checkpoint: no "model" and "model_config"{hint}')
    settings = {
        name: value
        for name, value in saved_model_settings(state["model_config"]).items()
        if name not in RUNTIME_SETTINGS
    }
    try:
        config = ModelConfig.from_settings(settings)
    except (TypeError, ValueError) as error:
        raise ConversionError(f"{path}: its model_config does not build a ModelConfig ({error})") from None
    return config, {**state["model"], **state.get("ema", {})}


def write_featurecache_checkpoint(
    path: pathlib.Path, config: ModelConfig, weights: dict[str, torch.Tensor], source: pathlib.Path
) -> None:
    """A featurecache checkpoint `predict` loads and `train --init-from` starts from."""
    state = {
        "model": weights,
        "model_config": dataclasses.asdict(config),
        "converted_from": {"format": "protenix", "file": source.name},
    }
    write_atomic(path, lambda handle: torch.save(state, handle), binary=True)


def write_protenix_checkpoint(path: pathlib.Path, weights: dict[str, torch.Tensor]) -> None:
    """Protenix's checkpoint layout: {"model": state dict} (what its runner's loaders read)."""
    write_atomic(path, lambda handle: torch.save({"model": weights}, handle), binary=True)


def convert_from_protenix(source: pathlib.Path, dest: pathlib.Path) -> ModelConfig:
    """Protenix checkpoint `source` -> featurecache checkpoint `dest`; returns its model config."""
    try:
        config, weights = protenix_to_featurecache(read_protenix_checkpoint(source))
    except ConversionError as error:
        raise ConversionError(error.args[0] if str(source) in error.args[0] else f"{source}: {error}") from None
    write_featurecache_checkpoint(dest, config, weights, source)
    return config


def convert_to_protenix(source: pathlib.Path, dest: pathlib.Path) -> ModelConfig:
    """featurecache checkpoint `source` -> Protenix checkpoint `dest`; returns the model config."""
    config, weights = read_featurecache_checkpoint(source)
    try:
        converted = featurecache_to_protenix(config, weights)
    except ConversionError as error:
        raise ConversionError(f"{source}: {error}") from None
    write_protenix_checkpoint(dest, converted)
    return config
