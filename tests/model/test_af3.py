"""The full AF3 model end to end: forward/backward with recycling and a diffusion batch, no dead
weights, recycling without gradient through earlier cycles, sampling, and the kernel switch."""

import pytest
import torch

from featurecache.model import preset
from featurecache.model.af3 import AF3Model, sample_num_cycles
from featurecache.testing.synthetic import first_sample_unpadded, random_batch


def _generator(seed: int | None = None) -> torch.Generator:
    return torch.Generator().manual_seed(int(torch.randint(0, 2**31 - 1, ())) if seed is None else seed)


def test_forward_backward_with_two_cycles_and_three_samples_reaches_every_parameter():
    config = preset("tiny", kernels="torch")
    model = AF3Model(config)
    generator = _generator()
    batch = random_batch([13, 9], [6, 4], [2, 0], generator, num_atoms_per_token=3)
    outputs = model(batch, num_cycles=2, diffusion_batch=3, generator=generator)
    num_atoms = batch["atom_pad_mask"].shape[1]
    assert outputs["single"].shape == (2, 13, config.trunk.c_s)
    assert outputs["pair"].shape == (2, 13, 13, config.trunk.c_z)
    assert outputs["distogram_logits"].shape == (2, 13, 13, config.trunk.distogram_bins)
    assert outputs["denoised_positions"].shape == (2, 3, num_atoms, 3)
    assert outputs["noise_level"].shape == (2, 3)
    loss, metrics = model.loss(batch, outputs)
    assert loss.ndim == 0 and torch.isfinite(loss)
    assert set(metrics) == {
        "loss",
        "distogram",
        "diffusion",
        "mse",
        "smooth_lddt",
        "bond",
        "confidence",
        "plddt",
        "pae",
        "pde",
        "resolved",
    }
    assert all(value.ndim == 0 and not value.requires_grad for value in metrics.values())
    expected = (
        config.loss.distogram_loss_weight * metrics["distogram"]
        + config.loss.diffusion_loss_weight * metrics["diffusion"]
        + config.loss.confidence_loss_weight * metrics["confidence"]
    )
    torch.testing.assert_close(metrics["loss"], expected)
    loss.backward()
    # A gradient that is zero in exact arithmetic shows as float noise, ~1e-11 here; the smallest
    # real one is ~1e-6. (The LayerNorm biases of the pair-bias projections and of the decoder's
    # position projection are such weights, see layers.freeze_norm_bias: frozen, not trainable.)
    trainable = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    dead = [name for name, parameter in trainable if parameter.grad is None or not parameter.grad.abs().max() > 1e-8]
    assert not dead, f"parameters without gradient: {dead}"
    for name, parameter in trainable:
        assert torch.isfinite(parameter.grad).all(), name
    frozen = [name for name, p in model.named_parameters() if not p.requires_grad]
    assert frozen and all(name.endswith(("pair_bias.norm.bias", "to_positions.norm.bias")) for name in frozen)


def test_only_the_last_cycle_has_a_graph():
    model = AF3Model(preset("tiny", kernels="torch"))
    grad_enabled = []
    model.pairformer.register_forward_hook(lambda *args: grad_enabled.append(torch.is_grad_enabled()))
    batch = random_batch([6], [2], [1], _generator())
    model(batch, num_cycles=3, diffusion_batch=0)
    assert grad_enabled == [False, False, True]
    grad_enabled.clear()
    with torch.no_grad():
        model(batch, num_cycles=2, diffusion_batch=0)
    assert grad_enabled == [False, False]


def test_recycling_changes_the_trunk_output():
    model = AF3Model(preset("tiny", kernels="torch")).eval()
    batch = random_batch([7], [3], [1], _generator())
    with torch.no_grad():
        one, two = (model.trunk(batch, cycles)["pair"] for cycles in (1, 2))
    assert not torch.allclose(one, two)
    with pytest.raises(ValueError, match="num_cycles"):
        model.trunk(batch, 0)


def test_num_cycles_drawn_from_one_to_max():
    generator = _generator(0)
    drawn = {sample_num_cycles(generator, 4) for _ in range(200)}
    assert drawn == {1, 2, 3, 4}


def test_sampling_gives_finite_structures():
    model = AF3Model(preset("tiny", kernels="torch")).eval()
    batch = random_batch([8, 5], [2, 2], [0, 0], _generator(), num_atoms_per_token=2)
    outputs = model.sample(batch, num_cycles=1, num_samples=2, num_steps=4, generator=_generator())
    assert outputs["positions"].shape == (2, 2, batch["atom_pad_mask"].shape[1], 3)
    assert torch.isfinite(outputs["positions"]).all()


def test_loss_falls_when_overfitting_one_example():
    torch.manual_seed(0)
    model = AF3Model(preset("tiny", kernels="torch", checkpoint_blocks=False))
    batch = random_batch([8], [2], [0], _generator(1), num_atoms_per_token=2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _step in range(25):
        # the same noise every step: the loss falls only by learning
        loss, _ = model.loss(batch, model(batch, num_cycles=1, diffusion_batch=2, generator=_generator(7)))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0], losses


def test_missing_atom_input_is_named():
    model = AF3Model(preset("tiny", kernels="torch"))
    batch = random_batch([5], [2], [0], _generator())
    del batch["ref_space_uid"]
    with pytest.raises(KeyError, match="ref_space_uid"):
        model(batch)


def test_both_kernel_paths_build_identical_parameters():
    torch_state = AF3Model(preset("tiny", kernels="torch")).state_dict()
    triton_model = AF3Model(preset("tiny", kernels="triton"))
    assert list(torch_state) == list(triton_model.state_dict())
    triton_model.load_state_dict(torch_state)  # strict: names and shapes match


def test_triton_and_torch_paths_give_the_same_loss_and_gradients():
    """One block of every stack on a small batch, the kernels under the interpreter on CPU."""
    config = preset(
        "tiny",
        pairformer_blocks=1,
        msa_blocks=0,
        template_blocks=0,
        diffusion_blocks=1,
        checkpoint_blocks=False,
        atom_window_queries=8,
        atom_window_keys=16,
    )
    torch_model = AF3Model(config.replace(kernels="torch"))
    triton_model = AF3Model(config.replace(kernels="triton"))
    triton_model.load_state_dict(torch_model.state_dict())
    batch = random_batch([7], [2], [0], _generator(), num_atoms_per_token=2)
    batch["token_pad_mask"][0, 6:] = False  # token padding on the kernel path too
    batch["atom_pad_mask"][0, 11:] = False
    seed = int(torch.randint(0, 2**31 - 1, ()))
    losses, grads = {}, {}
    for name, model in (("torch", torch_model), ("triton", triton_model)):
        loss, _ = model.loss(batch, model(batch, num_cycles=2, diffusion_batch=2, generator=_generator(seed)))
        loss.backward()
        losses[name] = loss.detach()
        grads[name] = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    torch.testing.assert_close(losses["triton"], losses["torch"], atol=1e-4, rtol=1e-4)
    assert grads["triton"].keys() == grads["torch"].keys()
    for name, reference in grads["torch"].items():
        error = (grads["triton"][name] - reference).norm() / reference.norm().clamp(min=1e-12)
        assert error < 1e-3, f"{name}: relative gradient error {error:.2e}"


def test_af3_preset_matches_the_paper():
    config = preset("af3")
    assert (
        config.atom_attention.c_atom,
        config.atom_attention.c_atompair,
        config.atom_attention.atom_blocks,
        config.atom_attention.atom_heads,
    ) == (128, 16, 3, 4)
    assert (config.atom_attention.atom_window_queries, config.atom_attention.atom_window_keys) == (32, 128)
    assert (
        config.diffusion.c_token_diffusion,
        config.diffusion.diffusion_blocks,
        config.diffusion.diffusion_heads,
    ) == (768, 24, 16)
    assert (
        config.diffusion.sigma_data,
        config.sampler.sampler_sigma_max,
        config.sampler.sampler_sigma_min,
        config.sampler.sampler_rho,
    ) == (16.0, 160.0, 4e-4, 7.0)
    assert (
        config.sampler.sampler_gamma_0,
        config.sampler.sampler_gamma_min,
        config.sampler.sampler_noise_scale,
        config.sampler.sampler_step_scale,
        config.sampler.sampler_steps,
    ) == (0.8, 1.0, 1.003, 1.5, 200)
    assert (config.loss.diffusion_loss_weight, config.loss.distogram_loss_weight) == (4.0, 0.03)
    with pytest.raises(ValueError, match="c_token_diffusion"):
        preset("tiny", diffusion_heads=3)


def test_real_cropped_targets_run_forward_loss_backward_and_sampling(shared_data, tmp_path):
    """Records featurized from real mmCIF files, cropped and collated as training sees them: a
    crop of Ras that keeps its nucleotide analogue (token bonds inside the ligand), and one of a
    glycoprotein."""
    from featurecache.loader import collate
    from featurecache.online import OnlineDataset

    inputs = tmp_path / "inputs"
    inputs.mkdir()
    for name in ("structures/721p-assembly1.cif", "bonded/1ncb.cif"):
        (inputs / name.split("/")[1]).write_bytes((shared_data / name).read_bytes())
    dataset = OnlineDataset(inputs, crop_size=48)
    glycoprotein, ras = dataset.ids.index("1ncb"), dataset.ids.index("721p-assembly1")
    # the first epoch whose crop of Ras keeps its bonded ligand
    ras_crop = next(sample for epoch in range(20) for sample in [dataset[(epoch, ras)]] if len(sample["token_bonds"]))
    batch = collate([dataset[(0, glycoprotein)], ras_crop])
    assert batch["token_bond_mask"].any()
    model = AF3Model(preset("tiny", kernels="torch"))
    outputs = model(batch, num_cycles=2, diffusion_batch=2, generator=_generator(0))
    loss, metrics = model.loss(batch, outputs)
    assert torch.isfinite(loss) and metrics["bond"] > 0
    loss.backward()
    for name, parameter in model.named_parameters():  # no templates here: that module is idle
        if parameter.requires_grad and not name.startswith("template_embedder."):
            assert parameter.grad is not None and torch.isfinite(parameter.grad).all(), name
    model.eval()
    positions = model.sample(batch, num_cycles=1, num_samples=1, num_steps=3, generator=_generator(0))["positions"]
    assert positions.shape == (2, 1, batch["atom_pad_mask"].shape[1], 3) and torch.isfinite(positions).all()


def test_padding_does_not_change_a_sample():
    """A sample alone and the same sample padded beside a longer one (more tokens, atoms, bonds)
    give the same trunk outputs and the same denoised positions from the same noisy input."""
    model = AF3Model(preset("tiny", kernels="torch")).eval()
    batch = random_batch([7, 11], [3, 3], [1, 1], _generator(), num_atoms_per_token=3)
    atoms, bonds = int(batch["atom_pad_mask"][0].sum()), int(batch["token_bond_mask"][0].sum())
    alone = first_sample_unpadded(batch, 7, atoms, bonds)
    noisy = torch.randn(1, 2, atoms, 3, generator=_generator()) * 10
    sigma = torch.tensor([[3.0, 40.0]])
    with torch.no_grad():
        results = []
        for inputs in (batch, alone):
            trunk = model.trunk(inputs, num_cycles=2)
            context = model.diffusion_context(inputs, trunk)
            padded_noisy = torch.zeros(inputs["atom_pad_mask"].shape[0], 2, inputs["atom_pad_mask"].shape[1], 3)
            padded_noisy[:1, :, :atoms] = noisy
            denoised = model.diffusion_module(padded_noisy, sigma.expand(padded_noisy.shape[0], -1), context)
            results.append((trunk["single"][:1, :7], trunk["pair"][:1, :7, :7], denoised[:1, :, :atoms]))
    for padded, single in zip(*results):
        torch.testing.assert_close(padded, single, atol=1e-4, rtol=1e-4)


def test_each_recycling_cycle_reads_its_own_msa_rows():
    """msa_of_cycle gathers cycle c's rows (AF3's fresh draw per cycle) from the pool with tensor
    ops only: under a CUDA graph the same ops replay with new rows in the same buffers."""
    from featurecache.model.network.msa import msa_of_cycle

    generator = torch.Generator().manual_seed(0)
    pool, tokens = 7, 5
    batch = {
        "msa": torch.randint(0, 20, (2, pool, tokens), generator=generator),
        "deletion_matrix": torch.rand(2, pool, tokens, generator=generator),
        "msa_row_mask": torch.tensor([[True] * 7, [True] * 4 + [False] * 3]),
        "msa_cycle_rows": torch.tensor([[[0, 2, 5], [0, 1, 6]], [[0, 1, 2], [0, 3, -1]]], dtype=torch.int32),
    }
    for cycle in range(4):  # cycles past the draws reuse them in turn
        rows = batch["msa_cycle_rows"][:, cycle % 2].long()
        got = msa_of_cycle(batch, cycle)
        for sample in range(2):
            for slot, row in enumerate(rows[sample].tolist()):
                valid = row >= 0 and bool(batch["msa_row_mask"][sample, row])
                assert bool(got["msa_row_mask"][sample, slot]) == valid
                if row >= 0:
                    assert torch.equal(got["msa"][sample, slot], batch["msa"][sample, row])
                    assert torch.equal(got["deletion_matrix"][sample, slot], batch["deletion_matrix"][sample, row])
    assert not torch.equal(msa_of_cycle(batch, 0)["msa"], msa_of_cycle(batch, 1)["msa"])
    without = {name: value for name, value in batch.items() if name != "msa_cycle_rows"}
    assert msa_of_cycle(without, 3) is without
    # no host sync: the gather traces into one graph with the cycle as a constant and no data-
    # dependent control flow (torch.fx would fail on a .item() or a Python branch on values)
    traced = torch.fx.symbolic_trace(
        lambda msa, deletions, mask, cycle_rows: tuple(
            msa_of_cycle(
                {"msa": msa, "deletion_matrix": deletions, "msa_row_mask": mask, "msa_cycle_rows": cycle_rows}, 1
            )[name]
            for name in ("msa", "deletion_matrix", "msa_row_mask")
        )
    )
    expected = msa_of_cycle(batch, 1)
    outputs = traced(batch["msa"], batch["deletion_matrix"], batch["msa_row_mask"], batch["msa_cycle_rows"])
    assert all(
        torch.equal(out, expected[name]) for out, name in zip(outputs, ("msa", "deletion_matrix", "msa_row_mask"))
    )


@pytest.mark.parametrize("kernels", ["torch", "triton"])
def test_a_samplers_shared_attention_biases_change_no_denoised_position(kernels):
    """DiffusionModule.for_sampling computes the single conditioning's trunk part, every
    transformer block's attention bias and the atom transformers' s side once for a sampler's
    steps, and the token transformer takes every block's s side from batched products: the
    denoiser gives what it gives computing them per call and per block, on both kernel paths."""
    model = AF3Model(preset("tiny", kernels=kernels)).eval()
    generator = _generator()
    batch = random_batch([7], [2], [1], generator, num_atoms_per_token=3)
    with torch.no_grad():
        # the trunk on the torch path whatever `kernels` (the interpreter is slow); same weights
        trunk_model = AF3Model(preset("tiny", kernels="torch")).eval()
        trunk_model.load_state_dict(model.state_dict())
        trunk = trunk_model.trunk(batch, 1)
        context = model.diffusion_context(batch, trunk)
        shared = model.diffusion_module.for_sampling(context)
        num_atoms = batch["atom_pad_mask"].shape[1]
        noisy = 10 * torch.randn(1, 2, num_atoms, 3, generator=generator)
        sigma = torch.rand(1, 2, generator=generator) * 50 + 0.1
        expected = model.diffusion_module(noisy, sigma, context)
        got = model.diffusion_module(noisy, sigma, shared)
    assert len(shared.encoder_biases) == len(shared.decoder_biases) == model.config.atom_attention.atom_blocks
    assert len(shared.transformer_biases) == model.config.diffusion.diffusion_blocks
    assert len(shared.encoder_conditioning) == len(shared.decoder_conditioning) == len(shared.encoder_biases)
    assert shared.single_of_trunk.shape == (1, 1, 7, model.config.trunk.c_s)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_shared_attention_biases_are_refused_where_blocks_take_gradients():
    model = AF3Model(preset("tiny", kernels="torch")).train()
    generator = _generator()
    batch = random_batch([6], [2], [0], generator, num_atoms_per_token=2)
    trunk = model.trunk(batch, 1)
    shared = model.diffusion_module.for_sampling(model.diffusion_context(batch, trunk))
    noisy = torch.randn(1, 2, batch["atom_pad_mask"].shape[1], 3, generator=generator)
    with pytest.raises(ValueError, match="without gradient"):
        model.diffusion_module(noisy, torch.ones(1, 2), shared)
