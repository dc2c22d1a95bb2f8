"""AF3Model's trunk alone (`AF3Model.trunk`, a forward without a diffusion batch): shapes,
gradients of the distogram loss through the pair stacks, padding, the config, and missing inputs.
The kernel switch and the full model's losses are in test_af3.py."""

import pytest
import torch

from featurecache.model import AF3Model, ModelConfig, preset
from featurecache.testing.synthetic import first_sample_unpadded, random_batch


def _generator() -> torch.Generator:
    return torch.Generator().manual_seed(int(torch.randint(0, 2**31 - 1, ())))


def _pair_parameters(model: AF3Model):
    """What the distogram loss reaches: the input embedder's pair, the recycled pair, the
    template and MSA stacks, the pair track of the Pairformer and the distogram head. (The single
    track feeds the diffusion module and the confidence head, not the distogram.)"""
    pair_owners = (
        "input_embedder.to_pair_",
        "input_embedder.relpos.",
        "input_embedder.from_token_bonds.",
        "recycle_pair.",
        "template_embedder.",
        "msa_module.",
        "distogram_head.",
    )
    return [
        (name, p)
        for name, p in model.named_parameters()
        if p.requires_grad
        and (name.startswith(pair_owners) or (name.startswith("pairformer.blocks.") and ".pair." in name))
    ]


def test_trunk_shapes_and_distogram_gradients_reach_the_pair_stacks():
    config = preset("tiny", kernels="torch")
    model = AF3Model(config)
    batch = random_batch([13, 9], [6, 4], [2, 0], _generator())
    outputs = model(batch, num_cycles=1, diffusion_batch=0)  # the trunk alone
    assert set(outputs) == {"s_inputs", "single", "pair", "distogram_logits"}
    assert outputs["single"].shape == (2, 13, config.trunk.c_s)
    assert outputs["pair"].shape == (2, 13, 13, config.trunk.c_z)
    assert outputs["distogram_logits"].shape == (2, 13, 13, config.trunk.distogram_bins)
    loss, metrics = model.loss(batch, outputs)
    assert set(metrics) == {"loss", "distogram"}
    assert loss.ndim == 0 and torch.isfinite(loss)
    torch.testing.assert_close(loss, config.loss.distogram_loss_weight * metrics["distogram"])
    loss.backward()
    pair_parameters = _pair_parameters(model)
    assert any(name.startswith("pairformer.") for name, _ in pair_parameters)
    for name, parameter in pair_parameters:
        assert parameter.grad is not None, f"{name} got no gradient"
        assert torch.isfinite(parameter.grad).all(), f"{name} has a non-finite gradient"
    # the single track is still computed and differentiable
    model.zero_grad()
    model.trunk(batch, num_cycles=1)["single"].square().sum().backward()
    single_grad = model.pairformer.blocks[-1].attention.proj.linear.weight.grad
    assert torch.isfinite(single_grad).all() and single_grad.abs().sum() > 0


def test_padding_does_not_change_the_distogram_loss():
    """A sample alone and the same sample padded beside a longer one (more tokens, atoms, MSA
    rows, templates) give the same distogram loss (the trunk outputs: test_af3's padding test)."""
    model = AF3Model(preset("tiny", kernels="torch")).eval()
    batch = random_batch([7, 11], [3, 5], [1, 2], _generator())
    atoms, bonds = int(batch["atom_pad_mask"][0].sum()), int(batch["token_bond_mask"][0].sum())
    alone = first_sample_unpadded(batch, 7, atoms, bonds, msa_rows=3, templates=1)
    with torch.no_grad():
        padded_out = model.trunk(batch, num_cycles=1)
        alone_out = model.trunk(alone, num_cycles=1)
        padded_row = {name: value[:1] for name, value in batch.items() if name != "id"}
        padded_loss = model.loss(padded_row, {name: value[:1] for name, value in padded_out.items()})[1]
        alone_loss = model.loss(alone, alone_out)[1]
    torch.testing.assert_close(padded_out["pair"][0, :7, :7], alone_out["pair"][0], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(padded_loss["distogram"], alone_loss["distogram"], atol=1e-4, rtol=1e-4)


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="kernels"):
        preset("tiny", kernels="cuda")
    with pytest.raises(ValueError, match="pairformer_blocks"):
        preset("tiny", pairformer_blocks=-1)
    with pytest.raises(ValueError, match="unknown model preset 'huge'"):
        preset("huge")


def test_af3_preset_trunk_matches_the_paper():
    config = preset("af3")
    assert (config.trunk.pairformer_blocks, config.trunk.c_s, config.trunk.c_z) == (48, 384, 128)
    assert (config.msa.msa_blocks, config.msa.c_m, config.templates.template_blocks) == (4, 64, 2)
    assert (config.trunk.single_heads, config.trunk.pair_heads, config.msa.msa_heads) == (16, 4, 8)


@pytest.mark.parametrize("name", ["msa_profile", "template_mask", "ref_space_uid", "token_bonds"])
def test_missing_input_is_named(name):
    model = AF3Model(preset("tiny", kernels="torch"))
    batch = random_batch([5], [2], [0], _generator())
    del batch[name]
    with pytest.raises(KeyError, match=name):
        model.trunk(batch, num_cycles=1)


def test_kernel_choices_have_one_definition():
    from featurecache.kernels.runtime import KERNEL_CHOICES
    from featurecache.model import config as model_config

    for kernels in KERNEL_CHOICES:
        assert ModelConfig().replace(kernels=kernels).runtime.kernels == kernels
    assert model_config.KERNEL_CHOICES is KERNEL_CHOICES
    assert not hasattr(model_config, "KERNEL_IMPLS")  # its old name is gone from the Python API
