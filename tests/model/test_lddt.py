"""model/objectives/lddt.py on structures whose lDDT is counted by hand."""

import math

import pytest
import torch

from featurecache.model.network.atoms import pairwise_distances
from featurecache.model.objectives.lddt import lddt, pair_scores, smooth_pair_scores


def test_lddt_on_hand_built_structures():
    true = torch.tensor([[0.0, 0, 0], [5, 0, 0], [10, 0, 0]])
    resolved = torch.ones(3, dtype=torch.bool)
    protein = torch.zeros(3, dtype=torch.bool)
    moved = true.clone()
    moved[2, 0] = 11.5  # pairs with atom 2 off by 1.5 A: within 2 and 4 A, not 0.5 and 1
    rotation = torch.linalg.qr(torch.randn(3, 3, generator=torch.Generator().manual_seed(1)))[0]
    predicted = torch.stack([true @ rotation.T + 7.0, moved])
    assert lddt(predicted, true, resolved, protein).tolist() == pytest.approx([1.0, (2 * 1.0 + 4 * 0.5) / 6])
    # 20 A apart: outside 15 A, inside the 30 A of a nucleotide atom l (pair (0, 1) only)
    far = torch.tensor([[0.0, 0, 0], [20, 0, 0]])
    stretched = torch.tensor([[[0.0, 0, 0], [20.7, 0, 0]]])
    pair = torch.ones(2, dtype=torch.bool)
    assert math.isnan(lddt(stretched, far, pair, torch.zeros(2, dtype=torch.bool)).item())
    assert lddt(stretched, far, pair, torch.tensor([True, False])).item() == pytest.approx(0.75)
    # unresolved atoms take no part; scored restricts the atoms l
    assert lddt(predicted, true, torch.tensor([True, True, False]), protein).tolist() == [1.0, 1.0]
    assert lddt(predicted[1:], true, resolved, protein, scored=torch.tensor([True, False, False])).item() == 0.75


def test_pair_scores_hard_and_smooth():
    error = torch.tensor([0.0, 0.75, 1.5, 3.0, 10.0])
    assert pair_scores(error).tolist() == [1.0, 0.75, 0.5, 0.25, 0.0]
    smooth = smooth_pair_scores(error)
    assert torch.all(smooth[1:] < smooth[:-1])  # falls as the error grows
    expected = sum(1 / (1 + math.exp(1.5 - c)) for c in (0.5, 1.0, 2.0, 4.0)) / 4  # sigmoid(c - 1.5)
    assert smooth[2].item() == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("grad", [False, True], ids=["without gradient", "with gradient"])
def test_pairwise_distances_match_float64_and_keep_coincident_gradients_finite(grad):
    generator = torch.Generator().manual_seed(3)
    # coordinates of ~100 A, a sample axis broadcast against the truth, odd sizes
    first = 100 * torch.randn(2, 3, 7, 3, generator=generator)
    second = 100 * torch.randn(2, 1, 5, 3, generator=generator)
    second[:, :, 0] = first[:, 0, 0, None]  # one coincident pair per batch
    expected = (first.double()[..., :, None, :] - second.double()[..., None, :, :]).norm(dim=-1)
    first.requires_grad_(grad)
    distance = pairwise_distances(first, second)
    assert distance.shape == (2, 3, 7, 5) and distance.dtype == torch.float32
    # each distance from its 3 differences: fp32 rounding of a few operations at ~300 A
    torch.testing.assert_close(distance.double(), expected, rtol=4 * 2**-24, atol=1e-4)
    assert torch.all(distance[:, 0, 0, 0] == 0)
    if grad:
        distance.sum().backward()
        assert torch.isfinite(first.grad).all()
