import math

import torch

from featurecache.model.config import preset
from featurecache.model.network.heads import distogram_bin_edges, distogram_loss

EDGES = (2.3125, 21.6875)  # AF3's code


def test_uniform_logits_give_log_of_the_bin_count():
    positions = torch.randn(2, 6, 3) * 10
    mask = torch.ones(2, 6, dtype=torch.bool)
    loss = distogram_loss(torch.zeros(2, 6, 6, 64), positions, mask, *EDGES)
    torch.testing.assert_close(loss, torch.tensor(math.log(64)))


def test_confident_correct_logits_give_near_zero_and_masks_apply():
    positions = torch.cumsum(torch.rand(1, 7, 3) * 4, dim=1)
    distance = (positions[:, :, None] - positions[:, None]).norm(dim=-1)
    target = torch.bucketize(distance, distogram_bin_edges(64, *EDGES))
    logits = torch.nn.functional.one_hot(target, 64).float() * 50.0
    mask = torch.ones(1, 7, dtype=torch.bool)
    assert distogram_loss(logits, positions, mask, *EDGES) < 1e-6
    # wrong logits only on pairs touching a masked token: the loss does not see them
    mask[0, 3] = False
    logits[0, 3, :] = torch.roll(logits[0, 3, :], 5, dims=-1)
    logits[0, :, 3] = torch.roll(logits[0, :, 3], 5, dims=-1)
    assert distogram_loss(logits, positions, mask, *EDGES) < 1e-6


def test_bins_follow_af3s_code():
    config = preset("af3")
    assert (config.trunk.distogram_bins, config.trunk.distogram_min, config.trunk.distogram_max) == (
        64,
        2.3125,
        21.6875,
    )
    edges = distogram_bin_edges(
        config.trunk.distogram_bins, config.trunk.distogram_min, config.trunk.distogram_max, dtype=torch.float64
    )
    # 63 edges 0.3125 A apart: 2.3125, 2.625, ..., 21.6875 (exact in binary)
    assert edges.shape == (63,)
    torch.testing.assert_close(edges, 2.3125 + 0.3125 * torch.arange(63, dtype=torch.float64), rtol=0, atol=1e-12)


def test_a_distance_falls_in_the_bin_of_the_edges_below_it():
    # tokens on a line at 0, 2.3, 2.3125 (on the first edge), 2.4, 30 A: bins by hand
    positions = torch.tensor([[[0.0, 0, 0], [2.3, 0, 0], [2.3125, 0, 0], [2.4, 0, 0], [30.0, 0, 0]]])
    expected = {(0, 1): 0, (0, 2): 0, (0, 3): 1, (0, 4): 63}
    for (i, j), target in expected.items():
        pair = torch.zeros(1, 5, dtype=torch.bool)
        pair[0, [i, j]] = True
        right = torch.zeros(1, 5, 5, 64)
        right[..., 0] = 100.0  # a token with itself: 0 A, bin 0
        right[0, [i, j], [j, i]] = 0.0
        right[0, [i, j], [j, i], target] = 100.0
        assert distogram_loss(right, positions, pair, *EDGES) < 1e-6, (i, j)
        wrong = right.clone()  # certain of the neighbouring bin instead: 2 of the 4 pairs cost 100
        wrong[0, [i, j], [j, i]] = 0.0
        wrong[0, [i, j], [j, i], target + 1 if target < 63 else 62] = 100.0
        torch.testing.assert_close(distogram_loss(wrong, positions, pair, *EDGES), torch.tensor(50.0))


def test_sample_without_valid_pairs_contributes_zero():
    logits = torch.randn(2, 4, 4, 64)
    positions = torch.randn(2, 4, 3)
    mask = torch.ones(2, 4, dtype=torch.bool)
    mask[1] = False
    both = distogram_loss(logits, positions, mask, *EDGES)
    first = distogram_loss(logits[:1], positions[:1], mask[:1], *EDGES)
    torch.testing.assert_close(both, first / 2)
