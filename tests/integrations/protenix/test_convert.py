"""Protenix state dicts to featurecache's and back (featurecache.integrations.protenix.convert):
bit for bit, the released base model's layout, and one line naming what does not convert."""

import copy
import dataclasses

import pytest
import torch

from featurecache.integrations.protenix.convert import (
    ConversionError,
    featurecache_to_protenix,
    protenix_to_featurecache,
)
from featurecache.model import AF3Model
from featurecache.model.config import PRESETS
from featurecache.testing.protenix import protenix_configs, protenix_model


def test_a_round_trip_is_bitwise_and_protenix_loads_it_strictly(small_protenix):
    model, config, state = small_protenix
    original = model.state_dict()
    back = featurecache_to_protenix(config, state)
    assert set(back) == set(original)
    differ = [name for name in original if not torch.equal(back[name], original[name])]
    assert not differ, differ[:5]
    fresh = protenix_model(torch.Generator().manual_seed(1))
    fresh.load_state_dict(back, strict=True)
    # and featurecache's model takes the converted weights as they are
    AF3Model(config.replace(kernels="torch")).load_state_dict(state, strict=True)


@pytest.mark.parametrize(
    "name",
    ["protenix_base_default_v1.0.0", "protenix_base_default_v0.5.0", "protenix_mini_default_v0.5.0", "protenix-v2"],
)
def test_the_released_models_convert_both_ways(monkeypatch, name):
    """Protenix's released architectures (its configs_model_type entries, its model class, a DDP
    checkpoint's names): the sizes read from the state dict (the base model's are the `protenix`
    preset's; v0.5.0's has no template blocks, mini's a 1-block diffusion atom transformer beside
    the input embedder's 3, v2's c_z 256 with its hidden_scale_up), and back bit for bit. Its
    Linear layers draw their initial weights from scipy's truncated normal (minutes for 368 M
    parameters); only names and shapes matter here, so they start at zero."""
    from configs.configs_model_type import model_configs

    configs = protenix_configs(
        {
            **copy.deepcopy(model_configs[name]),
            "triangle_multiplicative": "torch",
            "triangle_attention": "torch",
            "use_wandb": False,
        }
    )
    import protenix.model.modules.primitives as primitives
    import protenix.model.triangular.layers as layers
    from protenix.model.protenix import Protenix

    def zero_init(weights, scale=1.0, fan="fan_in"):
        with torch.no_grad():
            weights.zero_()

    monkeypatch.setattr(primitives, "trunc_normal_init_", zero_init)
    monkeypatch.setattr(layers, "trunc_normal_init_", zero_init)
    state = Protenix(configs).state_dict()
    config, converted = protenix_to_featurecache({"module." + key: value for key, value in state.items()})
    if name == "protenix_base_default_v1.0.0":
        assert dataclasses.asdict(config) == dataclasses.asdict(PRESETS["protenix"])
    back = featurecache_to_protenix(config, converted)
    assert set(back) == set(state) and all(torch.equal(back[key], state[key]) for key in state)


def test_the_parameters_protenix_lacks_are_those_held_at_zero(small_protenix):
    """model/dialect.py's list (protenix_parameters_only) against the name map's zero parts: the
    parameters held at zero while training, or frozen by their layer, are exactly those."""
    from featurecache.integrations.protenix.weights import model_map
    from featurecache.model.dialect import protenix_absent

    _, config, _ = small_protenix
    model = AF3Model(config.replace(kernels="torch"))
    parameters = dict(model.named_parameters())
    zero_parts = set()
    for name, source in model_map(config).items():  # (name, first row, past the last row)
        start = 0
        for part in source.parts:
            size = model.state_dict()[name].shape[source.dim] if part.size is None else part.size
            if part.name is None:
                zero_parts.add((name, start, start + size))
            start += size
    held = {
        (name, rows.start or 0, parameters[name].shape[0] if rows.stop is None else rows.stop)
        for name, rows in protenix_absent(model).items()
    }
    frozen = {(name, 0, value.shape[0]) for name, value in parameters.items() if not value.requires_grad}
    assert held <= zero_parts and zero_parts <= held | frozen, (
        sorted(zero_parts - held - frozen),
        sorted(held - zero_parts),
    )
    assert all(not parameters[name][start:stop].any() for name, start, stop in zero_parts)


def _one_line_error(function, *args) -> str:
    with pytest.raises(ConversionError) as raised:
        function(*args)
    message = str(raised.value)
    assert "\n" not in message
    return message


def test_keys_no_map_covers_are_named(small_protenix):
    model, _, _ = small_protenix
    state = dict(model.state_dict())
    # an ESM input embedding (protenix_mini_esm_v0.5.0) and a lost tensor
    state["input_embedder.linear_esm.weight"] = torch.zeros(32 + 65, 2560)
    del state["diffusion_module.layernorm_a.weight"]
    message = _one_line_error(protenix_to_featurecache, state)
    assert "1 unknown key(s) (input_embedder.linear_esm.weight)" in message
    assert "1 missing key(s) (diffusion_module.layernorm_a.weight)" in message


def test_a_tensor_of_another_shape_or_value_is_named(small_protenix):
    model, _, _ = small_protenix
    state = dict(model.state_dict())
    state["confidence_head.lower_bins"] = state["confidence_head.lower_bins"] + 1.0
    assert "confidence_head.lower_bins" in _one_line_error(protenix_to_featurecache, state)
    state = dict(model.state_dict())
    state["msa_module.linear_no_bias_s.weight"] = torch.zeros(8, 10)
    assert "msa_module.from_single.weight" in _one_line_error(protenix_to_featurecache, state)


def test_weights_protenix_cannot_hold_are_refused(small_protenix):
    _, config, state = small_protenix
    # a LayerNorm offset Protenix's model lacks, no longer zero (a fine-tuned featurecache model)
    changed = {
        **state,
        "diffusion_module.token_norm.bias": torch.full_like(state["diffusion_module.token_norm.bias"], 0.5),
    }
    assert "diffusion_module.token_norm.bias is not zero" in _one_line_error(featurecache_to_protenix, config, changed)
    # AF3's model: its settings named
    message = _one_line_error(featurecache_to_protenix, config.replace(pair_init_from_single=False), state)
    assert "pair_init_from_single False (Protenix: True)" in message
    message = _one_line_error(featurecache_to_protenix, config.replace(fourier_dim=16), state)
    assert "fourier_dim 16 (Protenix fixes 256)" in message
    missing = {name: value for name, value in state.items() if name != "distogram_head.linear.bias"}
    assert "1 missing key(s) (distogram_head.linear.bias)" in _one_line_error(featurecache_to_protenix, config, missing)
