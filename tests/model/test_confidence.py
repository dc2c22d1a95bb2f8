"""The confidence head (AF3 Alg. 31), its loss targets (SI 4.3) and the pTM / ipTM metrics
(SI 5.9.1) on hand-built cases."""

import math

import pytest
import torch

from featurecache.model import preset
from featurecache.model.af3 import AF3Model
from featurecache.model.network.atoms import centre_atom_index
from featurecache.model.network.confidence import (
    MAX_ATOMS_PER_TOKEN,
    ConfidenceHead,
    atom_slots,
    distance_features,
)
from featurecache.model.objectives.confidence_losses import (
    aligned_errors,
    confidence_losses,
    error_bins,
    lddt_bins,
    plddt_target,
)
from featurecache.model.objectives.confidence_metrics import (
    confidence_summary,
    contact_probabilities,
    plddt,
    tm_d0,
)
from featurecache.model.network.diffusion_sampler import random_rotations
from featurecache.model.network.embedders import atom_single_input_dim
from featurecache.testing.synthetic import random_batch


def _batch(seed: int = 0, lengths=(12, 9)):
    generator = torch.Generator().manual_seed(seed)
    return random_batch(list(lengths), [3] * len(lengths), [0] * len(lengths), generator, num_atoms_per_token=3)


def _moved(batch, samples: int = 2) -> torch.Tensor:
    """The truth as `samples` structures, each rigidly rotated and translated: a perfect prediction."""
    rotation = random_rotations(samples, torch.Generator().manual_seed(5)).view(1, samples, 1, 3, 3)
    true = batch["atom_pos"][:, None]
    return (rotation @ true.unsqueeze(-1)).squeeze(-1) + torch.tensor([3.0, -7.0, 11.0])


def _targets(batch, predicted):
    atom_resolved = batch["atom_mask"] & batch["atom_pad_mask"]
    centre = centre_atom_index(batch)
    centre_resolved = torch.gather(atom_resolved, 1, centre) & batch["token_pad_mask"]
    lddt, has_reference = plddt_target(
        predicted,
        batch["atom_pos"],
        atom_resolved,
        centre,
        centre_resolved & ~batch["is_ligand"],
        batch["is_dna"] | batch["is_rna"],
    )
    return lddt, has_reference, centre, centre_resolved


def test_a_perfect_prediction_gets_the_best_bins():
    batch = _batch()
    predicted = _moved(batch)
    lddt, has_reference, centre, centre_resolved = _targets(batch, predicted)
    atom_resolved = batch["atom_mask"] & batch["atom_pad_mask"]
    scored = has_reference & atom_resolved
    assert scored.sum() > 20
    assert (lddt_bins(lddt, 50)[scored[:, None].expand_as(lddt)] == 49).all()
    errors = aligned_errors(predicted, batch["atom_pos"], batch["frame_atom_index"], centre)
    assert errors.shape == (2, 2, 12, 12)
    frames = (batch["frame_atom_index"] >= 0).all(-1)
    valid = (frames[:, :, None] & centre_resolved[:, None, :])[:, None].expand_as(errors)
    assert valid.sum() > 50
    assert (error_bins(errors, 64)[valid] == 0).all() and errors[valid].max() < 1e-3


def test_an_lddt_on_a_bin_edge_falls_in_the_bin_above():
    """An lDDT of k/50 is in bin k (the top edge, 1, in bin 49): AlphaFold 2's released pLDDT loss,
    floor(50 lDDT), the bins AF3's head gives centres for (docs/FIDELITY.md). Every edge an lDDT
    can land on, as plddt_target computes it in fp32: a sum of quarter scores over its pairs."""
    quarters, pairs = torch.meshgrid(torch.arange(0, 4 * 120 + 1), torch.arange(1, 121), indexing="ij")
    on_edge = (quarters <= 4 * pairs) & (quarters * 50 % (4 * pairs) == 0)
    quarters, pairs = quarters[on_edge], pairs[on_edge]
    lddt = (quarters.float() / 4) / pairs.float()
    edge = (quarters * 50) // (4 * pairs)
    assert lddt_bins(lddt, 50).tolist() == edge.clamp(max=49).tolist()
    assert set(edge.tolist()) == set(range(51))


def test_perfect_prediction_with_logits_on_the_best_bins_has_zero_loss():
    """Every loss's target and mask together: logits put all mass on the bins a perfect
    prediction earns (pLDDT top, PAE and PDE bin 0, resolved = atom_mask) -> losses ~0."""
    batch = _batch(1)
    predicted = _moved(batch)
    b, s, a, n = 2, predicted.shape[1], batch["atom_pad_mask"].shape[1], batch["token_pad_mask"].shape[1]

    plddt_logits = torch.full((b, s, a, 50), -50.0)
    plddt_logits[..., 49] = 50.0
    pae_logits = torch.full((b, s, n, n, 64), -50.0)
    pae_logits[..., 0] = 50.0
    resolved_logits = torch.full((b, s, a, 2), -50.0)
    resolved_logits[..., 1] = torch.where(batch["atom_mask"][:, None], 50.0, -50.0)
    resolved_logits[..., 0] = -resolved_logits[..., 1]
    outputs = {
        "plddt_logits": plddt_logits,
        "pae_logits": pae_logits,
        "pde_logits": pae_logits.clone(),
        "resolved_logits": resolved_logits,
    }
    losses = confidence_losses(outputs, predicted, batch)
    assert set(losses) == {"plddt", "pae", "pde", "resolved"}
    for name, value in losses.items():
        assert value.ndim == 0 and value < 1e-6, name
    # a prediction off by far more than 32 A loses on PAE and PDE, and on pLDDT
    scrambled = predicted + 40.0 * torch.randn(predicted.shape, generator=torch.Generator().manual_seed(2))
    worse = confidence_losses(outputs, scrambled, batch)
    assert all(worse[name] > 10.0 for name in ("plddt", "pae", "pde"))
    torch.testing.assert_close(worse["resolved"], losses["resolved"])


def test_plddt_target_of_one_moved_atom_matches_a_direct_count():
    """Three protein tokens (one atom each, the centre), one moved 1.5 A along the line to
    another: atom-by-atom lDDT counted by hand."""
    true = torch.tensor([[[0.0, 0, 0], [3.8, 0, 0], [7.6, 0, 0]]])
    predicted = true.clone()[:, None]
    predicted[0, 0, 2, 0] += 1.5  # token 2: distance to 0 is 9.1 instead of 7.6, to 1 is 5.3 instead of 3.8
    centre = torch.arange(3)[None]
    resolved = torch.ones(1, 3, dtype=torch.bool)
    lddt, has_reference = plddt_target(predicted, true, resolved, centre, resolved, torch.zeros(1, 3, dtype=torch.bool))
    # error 1.5 passes the 2 and 4 A thresholds (score 0.5); error 0 passes all four
    expected = torch.tensor([(1.0 + 0.5) / 2, (1.0 + 0.5) / 2, (0.5 + 0.5) / 2])
    torch.testing.assert_close(lddt[0, 0], expected)
    assert has_reference.all()
    assert lddt_bins(lddt, 50)[0, 0].tolist() == [37, 37, 25]


def test_nucleotide_references_reach_30_angstrom():
    true = torch.tensor([[[0.0, 0, 0], [20.0, 0, 0]]])
    resolved = torch.ones(1, 2, dtype=torch.bool)
    centre = torch.arange(2)[None]
    for nucleotide, reached in ((False, False), (True, True)):
        _, has_reference = plddt_target(true[:, None], true, resolved, centre, resolved, torch.full((1, 2), nucleotide))
        assert bool(has_reference.all()) == reached
    # a ligand centre (not valid as a reference) gives its neighbours nothing
    _, has_reference = plddt_target(
        true[:, None], true, resolved, centre, torch.tensor([[True, False]]), torch.ones(1, 2, dtype=torch.bool)
    )
    assert has_reference.tolist() == [[False, True]]


def test_aligned_error_of_a_displaced_token_in_an_unmoved_frame():
    """Two tokens with frames N-CA-C: token 1 shifted 1.2 A in the prediction. Token 0's frame
    sees token 1 off by 1.2 A (bin 2); token 1's own frame moves with it (error 0 for itself)."""
    backbone = torch.tensor([[-1.2, 0.8, 0.0], [0.0, 0.0, 0.0], [1.3, 0.6, 0.3]])
    true = torch.cat([backbone, backbone + torch.tensor([3.8, 0.5, 0.0])])[None]
    predicted = true.clone()[:, None]
    predicted[0, 0, 3:] += torch.tensor([0.0, 0.0, 1.2])
    frame_atoms = torch.tensor([[[0, 1, 2], [3, 4, 5]]])
    errors = aligned_errors(predicted, true, frame_atoms, frame_atoms[..., 1])
    torch.testing.assert_close(errors[0, 0], torch.tensor([[0.0, 1.2], [1.2, 0.0]]), atol=1e-3, rtol=0)
    assert error_bins(errors, 64)[0, 0].tolist() == [[0, 2], [2, 0]]
    assert error_bins(torch.tensor([0.49, 0.5, 31.6, 500.0]), 64).tolist() == [0, 1, 63, 63]


def test_ptm_of_a_perfect_one_hot_pae_is_the_formula_by_hand():
    tokens = 30
    logits = torch.full((tokens, tokens, 64), -1e4)
    logits[..., 0] = 0.0  # all mass at bin 0, centre 0.25 A
    d0 = 1.24 * (30 - 15) ** (1 / 3) - 1.8
    by_hand = 1.0 / (1.0 + (0.25 / d0) ** 2)
    one_chain = confidence_summary(logits, torch.ones(tokens, dtype=torch.long), torch.ones(tokens, dtype=torch.bool))
    assert one_chain["ptm"] == pytest.approx(by_hand, abs=1e-9)
    assert math.isnan(one_chain["iptm"])
    assert one_chain["chain_ptm"].tolist() == pytest.approx([by_hand])
    assert one_chain["pae"].shape == (tokens, tokens)
    torch.testing.assert_close(one_chain["pae"], torch.full((tokens, tokens), 0.25, dtype=torch.float64))
    asym = torch.tensor([1] * 20 + [2] * 10)
    two_chains = confidence_summary(logits, asym, torch.ones(tokens, dtype=torch.bool))
    assert two_chains["iptm"] == pytest.approx(by_hand, abs=1e-9)
    # a chain pair's d0 counts the pair's tokens; a chain alone its own (clipped at 19)
    pair = two_chains["chain_pair_iptm"]
    tm = lambda n: 1.0 / (1.0 + (0.25 / (1.24 * (max(n, 19) - 15) ** (1 / 3) - 1.8)) ** 2)
    torch.testing.assert_close(pair, torch.tensor([[tm(20), tm(30)], [tm(30), tm(19)]], dtype=torch.float64))
    assert two_chains["chain_ptm"].tolist() == pytest.approx([tm(20), tm(19)])
    assert two_chains["chain_iptm"].tolist() == pytest.approx([tm(30), tm(30)])
    torch.testing.assert_close(two_chains["chain_pair_pae_min"], torch.full((2, 2), 0.25, dtype=torch.float64))
    assert tm_d0(5) == pytest.approx(1.24 * 4 ** (1 / 3) - 1.8)


def test_ptm_leaves_out_tokens_without_frames_and_orders_errors():
    tokens = 24
    logits = torch.full((tokens, tokens, 64), -1e4)
    logits[..., 0] = 0.0
    logits[0, :, 0], logits[0, :, 63] = -1e4, 0.0  # token 0's frame sees everything 31.75 A off
    frames = torch.ones(tokens, dtype=torch.bool)
    asym = torch.ones(tokens, dtype=torch.long)
    with_bad_row = confidence_summary(logits, asym, frames)["ptm"]
    frames[1:] = False  # only the bad frame left
    only_bad = confidence_summary(logits, asym, frames)
    assert only_bad["ptm"] < 0.1 < with_bad_row
    frames[:] = False
    assert math.isnan(confidence_summary(logits, asym, frames)["ptm"])


def test_plddt_and_contact_probabilities():
    logits = torch.full((3, 50), -1e4)
    logits[0, 49] = logits[1, 0] = logits[2, 24] = 0.0
    assert plddt(logits).tolist() == pytest.approx([99.0, 1.0, 49.0])
    distogram = torch.full((1, 2, 2, 64), -1e4)
    edges = torch.linspace(2.0, 22.0, 63)
    last_contact_bin = int((edges <= 8.0).nonzero().max())
    distogram[0, 0, 0, last_contact_bin] = 0.0  # within 8 A
    distogram[0, 0, 1, last_contact_bin + 1] = 0.0  # the next bin reaches past 8 A
    distogram[0, 1, :, 63] = 0.0
    torch.testing.assert_close(
        contact_probabilities(distogram, 2.0, 22.0), torch.tensor([[[1.0, 0.0], [0.0, 0.0]]], dtype=torch.float64)
    )


def test_atom_slots_centres_and_distance_features():
    batch = _batch(2)
    slots = atom_slots(batch["atom_to_token"], batch["atom_pad_mask"], batch["token_pad_mask"].shape[1])
    real = batch["atom_pad_mask"][0]
    assert slots[0][real][:9].tolist() == [0, 1, 2] * 3 and slots.max() < MAX_ATOMS_PER_TOKEN
    centre = centre_atom_index(batch)
    assert (
        batch["atom_to_token"].gather(1, centre)[batch["token_pad_mask"]]
        == torch.arange(12).expand(2, -1)[batch["token_pad_mask"]]
    ).all()
    features = distance_features(torch.tensor([1.0, 3.3, 4.5, 100.0]))
    assert features.sum(-1).tolist() == [0.0, 1.0, 1.0, 1.0]
    assert features.argmax(-1)[1:].tolist() == [0, 0, 38]  # 4.5 A: the first bin's upper edge


def test_head_shapes_stop_gradient_and_gradient_to_every_head_parameter():
    config = preset("tiny", kernels="torch", confidence_blocks=2)
    batch = _batch(3)
    n, a = batch["token_pad_mask"].shape[1], batch["atom_pad_mask"].shape[1]
    head = ConfidenceHead(config, atom_single_input_dim(config))
    generator = torch.Generator().manual_seed(0)
    s_inputs = torch.randn(2, n, atom_single_input_dim(config), generator=generator, requires_grad=True)
    single = torch.randn(2, n, config.trunk.c_s, generator=generator, requires_grad=True)
    pair = torch.randn(2, n, n, config.trunk.c_z, generator=generator, requires_grad=True)
    predicted = _moved(batch, samples=3) + torch.randn(2, 3, a, 3, generator=generator)
    outputs = head(s_inputs, single, pair, predicted, batch)
    assert outputs["plddt_logits"].shape == (2, 3, a, 50)
    assert outputs["resolved_logits"].shape == (2, 3, a, 2)
    assert outputs["pae_logits"].shape == outputs["pde_logits"].shape == (2, 3, n, n, 64)
    torch.testing.assert_close(outputs["pde_logits"], outputs["pde_logits"].transpose(2, 3))
    losses = confidence_losses(outputs, predicted, batch)
    sum(losses.values()).backward()
    for name, parameter in head.named_parameters():
        if parameter.requires_grad:
            assert parameter.grad is not None and parameter.grad.abs().max() > 1e-8, name
    assert s_inputs.grad is None and single.grad is None and pair.grad is None  # the trunk is detached


def test_the_switch_leaves_the_head_out():
    model = AF3Model(preset("tiny", kernels="torch", confidence_head=False))
    assert model.confidence_head is None
    assert not any(name.startswith("confidence") for name, _ in model.named_parameters())
    batch = _batch(4, lengths=(8,))
    generator = torch.Generator().manual_seed(1)
    outputs = model(batch, num_cycles=1, diffusion_batch=2, generator=generator)
    assert "plddt_logits" not in outputs and "rollout_positions" not in outputs
    _, metrics = model.loss(batch, outputs)
    assert "confidence" not in metrics
    with pytest.raises(ValueError, match="confidence_blocks"):
        preset("tiny", confidence_blocks=-1)
    af3 = preset("af3")
    assert af3.confidence.confidence_blocks == 4 and af3.loss.pae_loss_weight == 0.0
    assert af3.loss.confidence_loss_weight == 1e-4 and af3.confidence.confidence_rollout_steps == 20


def test_training_step_runs_the_mini_rollout_and_sampling_judges_every_sample():
    config = preset("tiny", kernels="torch", confidence_rollout_steps=3)
    model = AF3Model(config)
    batch = _batch(5, lengths=(8,))
    steps = []
    original = model.diffusion_module.forward
    model.diffusion_module.forward = lambda *args, **kwargs: (
        steps.append(torch.is_grad_enabled()),
        original(*args, **kwargs),
    )[1]
    outputs = model(batch, num_cycles=1, diffusion_batch=2, generator=torch.Generator().manual_seed(0))
    # 3 rollout steps without gradient, then the training batch (built from the truth aligned to the rollout)
    assert steps == [False, False, False, True]
    assert outputs["rollout_positions"].shape == (1, 1, batch["atom_pad_mask"].shape[1], 3)
    assert not outputs["rollout_positions"].requires_grad
    model.eval()
    sampled = model.sample(batch, num_cycles=1, num_samples=2, num_steps=2, generator=torch.Generator().manual_seed(0))
    assert sampled["plddt_logits"].shape[:3] == (1, 2, batch["atom_pad_mask"].shape[1])
    assert sampled["pae_logits"].shape[:2] == (1, 2)
    # validation's sampling: the same positions (the head draws no noise), no head run
    bare = model.sample(
        batch, num_cycles=1, num_samples=2, num_steps=2, generator=torch.Generator().manual_seed(0), confidences=False
    )
    torch.testing.assert_close(bare["positions"], sampled["positions"], rtol=0, atol=0)
    assert not any(name.endswith("_logits") and name != "distogram_logits" for name in bare), sorted(bare)


def test_pae_head_is_frozen_while_its_loss_weight_is_zero():
    """AF3's initial training has no PAE loss: its head must not sit among the trainable weights
    without a gradient (the `af3` preset), and trains once the weight is set (fine-tuning)."""
    for weight, trainable in ((0.0, False), (1.0, True)):
        model = AF3Model(preset("tiny", kernels="torch", pae_loss_weight=weight))
        pae = [p.requires_grad for name, p in model.named_parameters() if name.startswith("confidence_head.pae")]
        assert pae and all(flag == trainable for flag in pae)
    assert preset("af3").loss.pae_loss_weight == 0.0
