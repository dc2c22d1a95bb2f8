"""The Protenix dialect's parameter set (ModelConfig.dialect.protenix_parameters_only).

featurecache's layers have a few parameters Protenix 2.x's lack: LayerNorm offsets (Protenix builds
those LayerNorms with create_offset=False) and biases (its LinearNoBias projections). A model
converted from Protenix holds them at zero, which computes Protenix's function; trained, they
would move off zero, and the model would no longer convert back. With the setting they stay zero:
set to zero when the model is built and their gradient masked to zero, so AdamW (a zero gradient
keeps its moments and the update at zero; weight decay keeps zero at zero) and the EMA leave them
there. The parameters some layer already freezes (`layers.freeze_norm_bias`) are zero anyway.

tests/integrations/protenix checks this list against the name map's zero parts
(featurecache.integrations.protenix.weights), so the two cannot drift apart.
"""

from __future__ import annotations

import torch
from torch import nn

from featurecache.model.network.layers import AttentionPairBias, OuterProductMean, TriangleAttention

# The diffusion module's LayerNorm offsets Protenix lacks (its LayerNorms without offset)
DIFFUSION_NORM_OFFSETS = (
    "conditioning.pair_in.norm.bias",
    "conditioning.single_in.norm.bias",
    "conditioning.noise_in.norm.bias",
    "atom_encoder.from_trunk_single.norm.bias",
    "atom_encoder.from_trunk_pair.norm.bias",
    "single_to_token.norm.bias",
    "token_norm.bias",
)


def protenix_absent(model: nn.Module) -> dict[str, slice]:
    """{parameter name: its rows Protenix has no counterpart of} over `model` (an AF3Model), for
    the parameters that train; a frozen one is left out."""
    absent = {}
    for prefix, module in model.named_modules():
        prefix = f"{prefix}." if prefix else ""
        if isinstance(module, TriangleAttention):  # Protenix's output projection has no bias
            absent[f"{prefix}linear_out.bias"] = slice(None)
        elif isinstance(module, AttentionPairBias):  # only the queries have a bias in Protenix
            absent[f"{prefix}proj.linear.bias"] = slice(module.num_heads * module.head_dim, None)
        elif isinstance(module, OuterProductMean):  # its a, b projections are LinearNoBias
            absent[f"{prefix}proj.linear.bias"] = slice(None)
    diffusion = getattr(model, "diffusion_module", None)
    if diffusion is not None:
        absent.update({f"diffusion_module.{name}": slice(None) for name in DIFFUSION_NORM_OFFSETS})
    parameters = dict(model.named_parameters())
    return {name: rows for name, rows in absent.items() if parameters[name].requires_grad}


@torch.no_grad()
def hold_at_zero(model: nn.Module, absent: dict[str, slice]) -> None:
    """Zero each parameter's `absent` rows and mask their gradient to zero from now on."""
    parameters = dict(model.named_parameters())
    for name, rows in absent.items():
        parameter = parameters[name]
        parameter[rows] = 0.0
        mask = torch.ones_like(parameter)
        mask[rows] = 0.0
        parameter.register_hook(lambda grad, mask=mask: grad * mask.to(grad.dtype))
