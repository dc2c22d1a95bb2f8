"""featurecache's AF3 against AlphaFold 3's released code where the supplement leaves room
(docs/FIDELITY.md): each setting's AF3 behaviour on a case checked by hand, and the behaviour it
replaces where a setting keeps it."""

import math

import pytest
import torch

from featurecache.model.af3 import AF3Model
from featurecache.model.config import LEGACY_SETTINGS, preset, saved_model_settings
from featurecache.model.network.atom_attention import AtomAttentionEncoder, AtomWindows, reference_features
from featurecache.model.network.embedders import RelativePositionEncoding
from featurecache.model.network.transformer import ConditionedAttention, TokenLayout
from featurecache.model.objectives.confidence_losses import confidence_losses, confidence_rows
from featurecache.testing.synthetic import random_batch
from featurecache.training.loop import model_differences, settings_differ


def _model_and_context(coordinates_fp32: bool):
    torch.manual_seed(0)
    model = AF3Model(preset("tiny", kernels="torch", diffusion_coordinates_fp32=coordinates_fp32)).eval()
    batch = random_batch([9], [3], [0], torch.Generator().manual_seed(1), num_atoms_per_token=3)
    with torch.no_grad():
        context = model.diffusion_context(batch, model.trunk(batch, num_cycles=1))
    return model, batch, context


def _capture_dtypes(model) -> tuple[dict, list]:
    """Hooks recording the output dtype of the coordinate projections."""
    seen: dict = {}
    module = model.diffusion_module
    layers = {
        "from_positions": module.atom_encoder.from_positions,
        "from_reference": module.atom_encoder.from_reference,
        "pair_from_offset": module.atom_encoder.pair_from_offset,
        "to_positions": module.atom_decoder.to_positions,
    }

    def recorder(name):
        def hook(_module, _inputs, output):
            seen.setdefault(name, output.dtype)

        return hook

    handles = [layer.register_forward_hook(recorder(name)) for name, layer in layers.items()]
    return seen, handles


@pytest.mark.parametrize("coordinates_fp32", [True, False])
def test_coordinate_path_is_fp32_under_bf16_autocast(coordinates_fp32):
    model, batch, _ = _model_and_context(coordinates_fp32)
    seen, handles = _capture_dtypes(model)
    sigma = torch.tensor([[0.5, 30.0]])
    noisy = batch["atom_pos"].float().unsqueeze(1).repeat(1, 2, 1, 1)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        context = model.diffusion_context(batch, model.trunk(batch, num_cycles=1))
        denoised = model.diffusion_module(noisy, sigma, context)
        sampled = model._sample_positions(batch, context, num_samples=1, num_steps=2, generator=None)
    for handle in handles:
        handle.remove()
    expected = torch.float32 if coordinates_fp32 else torch.bfloat16
    assert seen == dict.fromkeys(("from_reference", "pair_from_offset", "from_positions", "to_positions"), expected)
    assert denoised.dtype == torch.float32 and sampled.dtype == torch.float32


@pytest.mark.parametrize("coordinates_fp32", [True, False])
def test_a_hundredth_of_an_angstrom_reaches_the_denoiser_only_in_fp32(coordinates_fp32):
    """At sigma = 0.5 A, c_in = 1 / sqrt(0.25 + 256): 0.01 A moves a scaled coordinate of 1.5 by
    6e-4, under half of bf16's spacing there (2^-7 = 0.0078): bf16 rounds it away."""
    model, batch, context = _model_and_context(coordinates_fp32)
    sigma = torch.tensor([[0.5]])
    c_in = 1.0 / math.sqrt(0.5**2 + model.config.diffusion.sigma_data**2)
    # scaled positions on bf16's grid, so that rounding the unmoved ones is exact
    scaled = torch.rand(batch["atom_pos"].shape, generator=torch.Generator().manual_seed(2)) * 2 - 1
    scaled = scaled.to(torch.bfloat16).float()
    scaled[0, 0, 0] = 1.5
    noisy = (scaled / c_in).unsqueeze(1)
    moved = noisy.clone()
    moved[0, 0, 0, 0] += 0.01
    updates = []
    hook = model.diffusion_module.atom_decoder.register_forward_hook(
        lambda _module, _inputs, output: updates.append(output.float()) and None
    )
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        model.diffusion_module(noisy, sigma, context)
        model.diffusion_module(moved, sigma, context)
    hook.remove()
    changed = (updates[1] - updates[0]).abs().max()
    if coordinates_fp32:
        assert changed > 0
    else:
        assert changed == 0


def test_reference_charge_enters_through_arcsinh():
    batch = random_batch([5], [2], [0], torch.Generator().manual_seed(3))
    charges = torch.tensor([-2, -1, 0, 1, 3])
    batch["ref_charge"][0, :5] = charges
    column = 3  # after ref_pos
    af3 = reference_features(batch)[0, :5, column]
    raw = reference_features(batch, charge_arcsinh=False)[0, :5, column]
    # asinh(x) = ln(x + sqrt(x^2 + 1)): asinh(1) = 0.8814, asinh(3) = 1.8184
    expected = torch.tensor(
        [
            -math.log(2 + math.sqrt(5)),
            -math.log(1 + math.sqrt(2)),
            0.0,
            math.log(1 + math.sqrt(2)),
            math.log(3 + math.sqrt(10)),
        ]
    )
    torch.testing.assert_close(af3, expected)
    torch.testing.assert_close(raw, charges.float())


@pytest.mark.parametrize("masked", [True, False])
def test_atom_conditioning_of_a_masked_reference_atom(masked):
    config = preset("tiny", kernels="torch", atom_cond_ref_mask=masked)
    torch.manual_seed(0)
    encoder = AtomAttentionEncoder(config, c_token=config.trunk.c_s, with_trunk=False)
    batch = random_batch([6], [2], [0], torch.Generator().manual_seed(4))
    batch["ref_mask"][0, 2] = False
    atom_cond, _ = encoder.condition(batch, AtomWindows(batch["atom_pad_mask"]))
    assert bool((atom_cond[0, 0, 2] == 0).all()) == masked
    assert (atom_cond[0, 0, 1] != 0).any()


def _a2b_batch() -> dict:
    """A2B: chains A (asym 1) and A (asym 2) of entity 1, copies 1 and 2; chain B (asym 3) of
    entity 2, copy 1. Two residues per chain."""

    def tokens(values):
        return torch.tensor([values])

    return {
        "asym_id": tokens([1, 1, 2, 2, 3, 3]),
        "entity_id": tokens([1, 1, 1, 1, 2, 2]),
        "sym_id": tokens([1, 1, 2, 2, 1, 1]),
        "residue_index": tokens([1, 2, 1, 2, 1, 2]),
        "token_index": tokens([0, 1, 2, 3, 4, 5]),
    }


@pytest.mark.parametrize(
    "gate, expected",
    [
        # d_chain class by hand, rows/columns A1 A1 A2 A2 B B; 2 + sym_i - sym_j, 5 = "other"
        (
            "entity",
            [
                [2, 2, 1, 1, 5, 5],
                [2, 2, 1, 1, 5, 5],
                [3, 3, 2, 2, 5, 5],
                [3, 3, 2, 2, 5, 5],
                [5, 5, 5, 5, 2, 2],
                [5, 5, 5, 5, 2, 2],
            ],
        ),
        (
            "chain",
            [
                [5, 5, 1, 1, 2, 2],
                [5, 5, 1, 1, 2, 2],
                [3, 3, 5, 5, 3, 3],
                [3, 3, 5, 5, 3, 3],
                [2, 2, 1, 1, 5, 5],
                [2, 2, 1, 1, 5, 5],
            ],
        ),
    ],
)
def test_relative_chain_encoding_of_an_a2b_complex(gate, expected):
    encoding = RelativePositionEncoding(c_z=4, max_residue=32, max_chain=2, chain_gate=gate)
    features = encoding.features(_a2b_batch())[0]  # [N, N, 66 + 66 + 1 + 6]
    d_chain = features[..., -6:].long().argmax(-1)
    assert d_chain.tolist() == expected
    same_entity = features[..., -7]
    assert same_entity.tolist() == [[e_i == e_j for e_j in [1, 1, 1, 1, 2, 2]] for e_i in [1, 1, 1, 1, 2, 2]]
    # the residue offset is gated on the same chain in both: A1 residue 1 with A2 residue 2 is "other"
    d_residue = features[..., :66].long().argmax(-1)
    assert d_residue[0, 1] == 32 - 1 and d_residue[0, 3] == 65


def test_relative_chain_gate_is_af3s_by_default():
    assert preset("af3").trunk.relpos_chain_gate == "entity"
    with pytest.raises(ValueError, match="relpos_chain_gate"):
        preset("tiny", relpos_chain_gate="sym")


def test_separate_key_adaln_conditions_keys_and_values_on_their_own_weights():
    torch.manual_seed(0)
    shared = ConditionedAttention(8, 6, 4, num_heads=2, kernels="torch")
    separate = ConditionedAttention(8, 6, 4, num_heads=2, kernels="torch", key_adaln=True)
    separate.load_state_dict(shared.state_dict(), strict=False)
    a, s, pair = torch.randn(1, 1, 5, 8), torch.randn(1, 1, 5, 6), torch.randn(1, 5, 5, 4)
    layout = TokenLayout(torch.ones(1, 5, dtype=torch.bool))
    with torch.no_grad():
        # the key AdaLN a copy of the query one: Algorithm 24's single AdaLN exactly
        separate.key_adaln.load_state_dict(shared.adaln.state_dict())
        torch.testing.assert_close(separate(a, s, pair, layout), shared(a, s, pair, layout))
        # only the keys' and values' conditioning moves
        separate.key_adaln.shift.weight.add_(torch.randn(separate.key_adaln.shift.weight.shape))
        assert not torch.allclose(separate(a, s, pair, layout), shared(a, s, pair, layout))
    assert preset("af3").atom_attention.atom_key_adaln
    names = {name for name, _ in AF3Model(preset("tiny", kernels="torch")).named_parameters()}
    assert any("atom_transformer" in name and "key_adaln" in name for name in names)
    assert not any("diffusion_module.transformer" in name and "key_adaln" in name for name in names)


def test_resolution_picks_the_rows_that_train_the_confidence_head():
    batch = {
        "atom_pad_mask": torch.ones(5, 3, dtype=torch.bool),
        "resolution": torch.tensor([2.0, 0.05, 4.0, 5.0, math.nan]),
    }
    assert confidence_rows(batch, (0.1, 4.0)).tolist() == [True, False, True, False, False]
    assert confidence_rows(batch, None).all()
    del batch["resolution"]
    assert confidence_rows(batch, (0.1, 4.0)).all()


def test_a_row_left_out_contributes_zero_to_every_confidence_loss():
    generator = torch.Generator().manual_seed(5)
    batch = random_batch([7, 7], [2, 2], [0, 0], generator, num_atoms_per_token=3)
    batch = {name: value for name, value in batch.items() if name != "id"}
    atoms, tokens = batch["atom_pad_mask"].shape[1], batch["token_pad_mask"].shape[1]
    outputs = {
        "plddt_logits": torch.randn(2, 1, atoms, 50, generator=generator),
        "pae_logits": torch.randn(2, 1, tokens, tokens, 64, generator=generator),
        "pde_logits": torch.randn(2, 1, tokens, tokens, 64, generator=generator),
        "resolved_logits": torch.randn(2, 1, atoms, 2, generator=generator),
    }
    positions = batch["atom_pos"].unsqueeze(1) + torch.randn(2, 1, atoms, 3, generator=generator)
    both = confidence_losses(outputs, positions, batch, rows=torch.tensor([True, False]))
    first = confidence_losses(
        {name: value[:1] for name, value in outputs.items()},
        positions[:1],
        {name: value[:1] for name, value in batch.items()},
    )
    for name in ("plddt", "pae", "pde", "resolved"):
        assert first[name] > 0
        torch.testing.assert_close(both[name], first[name] / 2)


def test_collate_carries_each_samples_resolution():
    from featurecache.loader import collate

    generator = torch.Generator().manual_seed(6)
    rows = random_batch([4, 4], [2, 2], [0, 0], generator)
    samples = []
    for row, resolution in enumerate((1.5, None)):
        sample = {
            name: value[row] for name, value in rows.items() if isinstance(value, torch.Tensor) and name != "resolution"
        }
        sample["id"] = f"s{row}"
        if resolution is not None:
            sample["resolution"] = torch.tensor(resolution)
        samples.append(sample)
    resolution = collate(samples)["resolution"]
    assert resolution.dtype == torch.float32 and resolution[0] == 1.5 and resolution[1].isnan()


def test_a_checkpoint_predating_the_settings_keeps_its_behaviour():
    here = preset("tiny", kernels="torch")
    # the flat layout checkpoints wrote before ModelConfig had parts, without the newer settings
    old = {name: value for name, value in here.settings().items() if name not in LEGACY_SETTINGS}
    old.update(distogram_min=2.0, distogram_max=22.0)  # recorded: the edges it was trained with
    settings = saved_model_settings(old)
    assert settings["relpos_chain_gate"] == "chain" and not settings["atom_key_adaln"]
    assert (settings["distogram_min"], settings["distogram_max"]) == (2.0, 22.0)
    assert settings_differ({"model_config": old}, here)
    reason = model_differences({"model_config": old}, here)
    assert "atom_key_adaln False there, True here" in reason and "\n" not in reason
    legacy = here.replace(**LEGACY_SETTINGS)
    assert not settings_differ({"model_config": old}, legacy)
    # its model builds and takes its own weights
    AF3Model(legacy).load_state_dict(AF3Model(legacy).state_dict())
