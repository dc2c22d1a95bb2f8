"""ModelConfig in parts: one name per setting, presets that own every default, and checkpoints
written in the flat layout of before the parts (old names included) read back."""

import dataclasses

import pytest
import torch

from featurecache.model import AF3Model, ModelConfig, preset
from featurecache.model.config import (
    LEGACY_SETTINGS,
    PART_TYPES,
    PRESETS,
    PROTENIX_SETTINGS,
    PROTENIX_SIZES,
    RENAMED_SETTINGS,
    SETTING_PARTS,
    DialectConfig,
    DiffusionConfig,
    TrunkConfig,
    saved_model_settings,
)


def test_every_setting_has_one_name_across_the_parts():
    names = [setting.name for part in PART_TYPES.values() for setting in dataclasses.fields(part)]
    assert len(names) == len(set(names)) == len(SETTING_PARTS)
    assert [field.name for field in dataclasses.fields(ModelConfig)] == list(PART_TYPES)
    assert not set(PART_TYPES) & set(SETTING_PARTS)  # a part's name never reads as a setting's


def test_replace_routes_each_name_to_its_part():
    tiny = preset("tiny")
    changed = tiny.replace(c_z=24, diffusion_batch=2, kernels="torch")
    assert (changed.trunk.c_z, changed.diffusion.diffusion_batch, changed.runtime.kernels) == (24, 2, "torch")
    # everything else kept, the original untouched
    assert changed.trunk.c_s == tiny.trunk.c_s and changed.msa == tiny.msa and tiny.trunk.c_z == 16
    whole = tiny.replace(trunk=TrunkConfig(), c_s=64)  # a part replaced, then one of its settings
    assert whole.trunk == TrunkConfig(c_s=64)
    with pytest.raises(TypeError, match="no setting 'c_q'"):
        tiny.replace(c_q=3)
    with pytest.raises(TypeError, match="ModelConfig.trunk must be a TrunkConfig"):
        ModelConfig(trunk=DiffusionConfig())
    assert preset("tiny", c_z=24) == changed.replace(diffusion_batch=4, kernels="triton")


def test_each_part_checks_its_own_settings():
    with pytest.raises(ValueError, match="DiffusionConfig.diffusion_batch must be positive"):
        preset("tiny", diffusion_batch=0)
    with pytest.raises(ValueError, match="TrunkConfig.max_recycling_cycles must be positive"):
        preset("tiny", max_recycling_cycles=0)
    with pytest.raises(ValueError, match="AtomAttentionConfig.c_atom .* multiple of atom_heads"):
        preset("tiny", atom_heads=3)


def test_presets_own_every_model_default_including_the_diffusion_batch():
    assert {name: config.diffusion.diffusion_batch for name, config in PRESETS.items()} == {
        "af3": 48,
        "small": 16,
        "tiny": 4,
        "protenix": 48,
    }
    assert {name: config.trunk.max_recycling_cycles for name, config in PRESETS.items()} == {
        "af3": 4,
        "small": 4,
        "tiny": 4,
        "protenix": 4,
    }
    assert PRESETS["af3"] == ModelConfig()  # the field defaults are AF3's
    # the settings list round-trips through their names
    for config in PRESETS.values():
        assert ModelConfig.from_settings(config.settings()) == config


def test_the_protenix_dialect_is_one_part_set_by_name():
    protenix = PRESETS["protenix"]
    settings = protenix.settings()
    assert all(settings[name] == value for name, value in {**PROTENIX_SETTINGS, **PROTENIX_SIZES}.items())
    # the dialect's own settings live in its part; the fidelity settings Protenix shares with AF3 in theirs
    assert protenix.dialect == DialectConfig(
        **{
            name: value
            for name, value in {**PROTENIX_SETTINGS, **PROTENIX_SIZES}.items()
            if SETTING_PARTS[name] == "dialect"
        }
    )
    assert protenix.templates.template_pair_head_dim == 32 and protenix.trunk == PRESETS["af3"].trunk
    assert PRESETS["af3"].dialect == DialectConfig()  # AF3's behaviour by default
    # a dialect setting that needs another part's is checked across them, by its own part's name
    with pytest.raises(ValueError, match="DialectConfig.atom_key_adaln_nested needs AtomAttentionConfig"):
        protenix.replace(atom_key_adaln=False)
    with pytest.raises(ValueError, match="DialectConfig.triangle_mult_hidden must be positive"):
        preset("tiny", triangle_mult_hidden=0)
    # a flat checkpoint of before the dialect is AF3's model
    flat = {name: value for name, value in protenix.settings().items() if SETTING_PARTS[name] != "dialect"}
    assert ModelConfig.from_settings(saved_model_settings(flat)).dialect.pair_init_from_single is False


def test_the_model_trains_on_its_configs_diffusion_batch():
    from featurecache.testing.synthetic import random_batch

    model = AF3Model(preset("tiny", kernels="torch", diffusion_batch=3, confidence_head=False))
    batch = random_batch([6], [2], [0], torch.Generator().manual_seed(0))
    outputs = model(batch, num_cycles=1, generator=torch.Generator().manual_seed(1))
    assert outputs["denoised_positions"].shape[1] == outputs["noise_level"].shape[1] == 3
    assert "denoised_positions" not in model(batch, num_cycles=1, diffusion_batch=0)  # the trunk alone


def _flat_checkpoint_settings(config: ModelConfig) -> dict:
    """`config` as checkpoints wrote it before ModelConfig had parts: one flat dict, the blocks
    under their old names, without the settings that came later (the fidelity settings, the
    diffusion batch)."""
    old_names = {new: old for old, new in RENAMED_SETTINGS.items()}
    return {
        old_names.get(name, name): value
        for name, value in config.settings().items()
        if name not in LEGACY_SETTINGS and name != "diffusion_batch"
    }


def test_a_flat_checkpoint_of_before_the_parts_maps_onto_them():
    trained = preset("tiny", kernels="torch", pairformer_blocks=1, msa_blocks=2).replace(**LEGACY_SETTINGS)
    flat = _flat_checkpoint_settings(trained)
    assert "num_pairformer_blocks" in flat and "trunk" not in flat and "relpos_chain_gate" not in flat
    settings = saved_model_settings(flat)
    restored = ModelConfig.from_settings(settings)
    # every setting it records, by its old name or today's; those it predates as it was trained
    assert restored.trunk.pairformer_blocks == 1 and restored.msa.msa_blocks == 2
    assert restored.trunk.relpos_chain_gate == "chain" and not restored.atom_attention.atom_key_adaln
    assert restored.replace(diffusion_batch=trained.diffusion.diffusion_batch) == trained
    # its weights load into the model it describes
    AF3Model(restored).load_state_dict(AF3Model(trained).state_dict())
    # the nested layout of today's checkpoints reads back the same
    assert ModelConfig.from_settings(saved_model_settings(dataclasses.asdict(trained))) == trained


def test_resume_compares_a_flat_checkpoint_setting_by_setting():
    from featurecache.training.loop import model_differences, settings_differ

    here = preset("tiny", kernels="torch")
    flat = _flat_checkpoint_settings(here.replace(**LEGACY_SETTINGS))
    assert not settings_differ({"model_config": flat}, here.replace(**LEGACY_SETTINGS))
    wider = {**flat, "c_z": 32, "num_msa_blocks": 3}
    message = model_differences({"model_config": wider}, here.replace(**LEGACY_SETTINGS))
    assert "c_z 32 there, 16 here" in message and "msa_blocks 3 there, 1 here" in message


def test_prediction_loads_a_checkpoint_with_flat_settings(tmp_path):
    from featurecache.prediction.run import load_model

    trained = preset("tiny", kernels="torch").replace(**LEGACY_SETTINGS)
    weights = AF3Model(trained).state_dict()
    path = tmp_path / "old.pt"
    torch.save({"model": weights, "model_config": _flat_checkpoint_settings(trained)}, path)
    model = load_model(path, torch.device("cpu"), "torch")
    assert model.config.trunk == trained.trunk and model.config.atom_attention == trained.atom_attention
    assert not model.config.runtime.checkpoint_blocks
    for name, value in model.state_dict().items():
        assert torch.equal(value, weights[name]), name
