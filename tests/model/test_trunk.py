"""The AF3 trunk end to end: shapes, gradients, padding, overfitting, and the kernel switch."""

import pytest
import torch

from featurecache.model import AF3Trunk, ModelConfig, preset
from featurecache.testing.synthetic import random_batch


def _generator() -> torch.Generator:
    return torch.Generator().manual_seed(int(torch.randint(0, 2**31 - 1, ())))


def _pair_parameters(model: AF3Trunk):
    # The single track feeds no loss of the trunk (in AF3 it feeds the diffusion module).
    return [(n, p) for n, p in model.named_parameters()
            if not n.startswith(("pairformer.blocks.", "input_embedder.to_single"))
            or ".pair." in n]


def test_forward_backward_shapes_and_gradients():
    config = preset("tiny", kernels="torch")
    model = AF3Trunk(config)
    batch = random_batch([13, 9], [6, 4], [2, 0], _generator())
    outputs = model(batch)
    assert outputs["single"].shape == (2, 13, config.c_s)
    assert outputs["pair"].shape == (2, 13, 13, config.c_z)
    assert outputs["distogram_logits"].shape == (2, 13, 13, config.distogram_bins)
    loss = model.loss(batch, outputs)
    assert loss.ndim == 0 and torch.isfinite(loss)
    loss.backward()
    for name, parameter in _pair_parameters(model):
        assert parameter.grad is not None, f"{name} got no gradient"
        assert torch.isfinite(parameter.grad).all(), f"{name} has a non-finite gradient"
    # the single track is still computed and differentiable
    model.zero_grad()
    model(batch)["single"].square().sum().backward()
    single_grad = model.pairformer.blocks[-1].attention.proj.linear.weight.grad
    assert torch.isfinite(single_grad).all() and single_grad.abs().sum() > 0


def test_padding_does_not_change_a_sample():
    """A sample alone and the same sample padded beside a longer one give the same outputs."""
    model = AF3Trunk(preset("tiny", kernels="torch")).eval()
    batch = random_batch([7, 11], [3, 5], [1, 2], _generator())
    alone = {name: value[:1] for name, value in batch.items() if name != "id"}
    alone = {name: (value[:, :7] if value.ndim >= 2 and value.shape[1] == 11 and name not in
                    ("msa", "deletion_matrix", "template_restype", "template_backbone_pos",
                     "template_backbone_mask", "template_pseudo_beta_pos", "template_pseudo_beta_mask",
                     "msa_species", "msa_is_paired", "msa_row_mask", "template_mask")
                    else value)
             for name, value in alone.items()}
    for name in ("msa", "deletion_matrix"):
        alone[name] = batch[name][:1, :3, :7]
    alone["msa_row_mask"] = batch["msa_row_mask"][:1, :3]
    for name in ("template_restype", "template_backbone_pos", "template_backbone_mask",
                 "template_pseudo_beta_pos", "template_pseudo_beta_mask"):
        alone[name] = batch[name][:1, :1, :7]
    alone["template_mask"] = batch["template_mask"][:1, :1]
    with torch.no_grad():
        padded_out = model(batch)
        alone_out = model(alone)
    torch.testing.assert_close(padded_out["pair"][0, :7, :7], alone_out["pair"][0], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(padded_out["single"][0, :7], alone_out["single"][0], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(model.loss({**batch, **{k: v[:1] for k, v in batch.items() if k != "id"}},
                                          {k: v[:1] for k, v in padded_out.items()}),
                               model.loss(alone, alone_out), atol=1e-4, rtol=1e-4)


def test_loss_falls_when_overfitting_one_example():
    torch.manual_seed(int(torch.randint(0, 2**31 - 1, ())))
    model = AF3Trunk(preset("tiny", kernels="torch"))
    batch = random_batch([16], [4], [1], _generator())
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        loss = model.loss(batch, model(batch))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], losses


def test_both_kernel_paths_build_identical_parameters():
    torch_model = AF3Trunk(preset("tiny", kernels="torch"))
    triton_model = AF3Trunk(preset("tiny", kernels="triton"))
    torch_state = torch_model.state_dict()
    triton_state = triton_model.state_dict()
    assert list(torch_state) == list(triton_state)
    for name, value in torch_state.items():
        assert triton_state[name].shape == value.shape, name
    triton_model.load_state_dict(torch_state)  # strict: names and shapes match


def test_triton_and_torch_paths_give_the_same_loss_and_gradients():
    """One Pairformer block at crop 10, the kernels under the interpreter on CPU (slow: kept
    minimal; the MSA and template modules reuse the same layers, compared in test_layers)."""
    config = preset("tiny", num_pairformer_blocks=1, num_msa_blocks=0, num_template_blocks=0,
                    checkpoint_blocks=False)
    torch_model = AF3Trunk(config.replace(kernels="torch"))
    triton_model = AF3Trunk(config.replace(kernels="triton"))
    triton_model.load_state_dict(torch_model.state_dict())
    batch = random_batch([10], [3], [1], _generator())
    batch["token_pad_mask"][0, 8:] = False  # padding on the kernel path too
    losses = {}
    grads = {}
    for name, model in (("torch", torch_model), ("triton", triton_model)):
        torch.manual_seed(0)  # one dropout seed for both paths (AF3Trunk draws it from the default generator)
        loss = model.loss(batch, model(batch))
        loss.backward()
        losses[name] = loss.detach()
        grads[name] = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    torch.testing.assert_close(losses["triton"], losses["torch"], atol=1e-4, rtol=1e-4)
    assert grads["triton"].keys() == grads["torch"].keys()
    for name, reference in grads["torch"].items():
        error = (grads["triton"][name] - reference).norm() / reference.norm().clamp(min=1e-12)
        assert error < 1e-3, f"{name}: relative gradient error {error:.2e}"


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="kernels"):
        ModelConfig(kernels="cuda")
    with pytest.raises(ValueError, match="num_pairformer_blocks"):
        preset("tiny", num_pairformer_blocks=-1)
    with pytest.raises(ValueError, match="unknown model preset 'huge'"):
        preset("huge")


def test_af3_preset_matches_the_paper():
    config = preset("af3")
    assert (config.num_pairformer_blocks, config.c_s, config.c_z) == (48, 384, 128)
    assert (config.num_msa_blocks, config.c_m, config.num_template_blocks) == (4, 64, 2)
    assert (config.single_heads, config.pair_heads, config.msa_heads) == (16, 4, 8)


def test_missing_input_is_named():
    model = AF3Trunk(preset("tiny", kernels="torch"))
    batch = random_batch([5], [2], [0], _generator())
    del batch["msa_profile"]
    with pytest.raises(KeyError, match="msa_profile"):
        model(batch)


def test_kernel_choices_have_one_definition_and_the_old_name_warns():
    from featurecache.kernels.runtime import KERNEL_CHOICES
    from featurecache.model import config as model_config

    for kernels in KERNEL_CHOICES:
        assert ModelConfig(kernels=kernels).kernels == kernels
    with pytest.warns(DeprecationWarning, match="KERNEL_CHOICES"):
        assert model_config.KERNEL_IMPLS is KERNEL_CHOICES
