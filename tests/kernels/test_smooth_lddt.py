"""The smooth-LDDT kernel against its dense float64 reference (interpreter on CPU): the pair-score
sums, the pair counts and the gradient, on odd atom counts with unresolved and nucleotide atoms."""

import pytest
import torch

from featurecache.kernels.smooth_lddt import inclusion_radius, smooth_lddt_sums, smooth_lddt_sums_reference
from featurecache.model.objectives.losses import smooth_lddt_loss


def _inputs(batch, samples, atoms, seed):
    generator = torch.Generator().manual_seed(seed)
    # a cloud as dense as a protein's (~6 A per atom along a side): some pairs fall inside 15 A,
    # at 97 atoms some outside
    true = torch.rand(batch, atoms, 3, generator=generator) * 6.0 * atoms ** (1 / 3)
    predicted = true[:, None] + torch.randn(batch, samples, atoms, 3, generator=generator) * 1.5
    resolved = torch.rand(batch, atoms, generator=generator) < 0.85
    is_nucleotide = torch.rand(batch, atoms, generator=generator) < 0.3
    return predicted, true, is_nucleotide, resolved


@pytest.mark.parametrize("batch,samples,atoms", [(1, 1, 5), (2, 3, 37), (1, 2, 97)])
def test_sums_and_gradient_match_the_dense_reference(batch, samples, atoms):
    predicted, true, is_nucleotide, resolved = _inputs(batch, samples, atoms, seed=atoms)
    radius = inclusion_radius(is_nucleotide, resolved)
    upstream = torch.randn(batch, samples, dtype=torch.float64)

    reference_input = predicted.double().requires_grad_()
    expected, expected_count = smooth_lddt_sums_reference(reference_input, true.double(), radius.double())
    (expected * upstream).sum().backward()

    kernel_input = predicted.clone().requires_grad_()
    scores, count = smooth_lddt_sums(kernel_input, true, radius)
    (scores * upstream.float()).sum().backward()

    torch.testing.assert_close(count.double(), expected_count, rtol=0, atol=0)
    torch.testing.assert_close(scores.double(), expected.detach(), rtol=1e-5, atol=1e-3)
    torch.testing.assert_close(kernel_input.grad.double(), reference_input.grad, rtol=1e-4, atol=1e-5)
    assert expected_count.min() > 0 and (radius == 0).any()  # the case exercises both inclusion tests


def test_loss_is_the_same_on_both_kernel_paths():
    predicted, true, is_nucleotide, resolved = _inputs(2, 3, 41, seed=3)
    losses = {}
    for kernels in ("torch", "triton"):
        x = predicted.clone().requires_grad_()
        loss = smooth_lddt_loss(x, true, is_nucleotide, resolved, kernels=kernels)
        loss.sum().backward()
        losses[kernels] = (loss.detach(), x.grad)
    torch.testing.assert_close(losses["triton"][0], losses["torch"][0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(losses["triton"][1], losses["torch"][1], rtol=1e-4, atol=1e-6)


def test_identical_structures_score_the_sigmoid_of_the_thresholds():
    _, true, is_nucleotide, resolved = _inputs(1, 1, 23, seed=5)
    loss = smooth_lddt_loss(true[:, None].clone(), true, is_nucleotide, resolved, kernels="triton")
    perfect = sum(torch.sigmoid(torch.tensor(c)) for c in (0.5, 1.0, 2.0, 4.0)) / 4  # error 0 everywhere
    torch.testing.assert_close(loss, 1.0 - perfect.expand(1, 1), rtol=1e-6, atol=1e-6)
