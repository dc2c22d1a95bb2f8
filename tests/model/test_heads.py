import math

import torch

from featurecache.model.heads import distogram_bin_edges, distogram_loss


def test_uniform_logits_give_log_of_the_bin_count():
    positions = torch.randn(2, 6, 3) * 10
    mask = torch.ones(2, 6, dtype=torch.bool)
    loss = distogram_loss(torch.zeros(2, 6, 6, 64), positions, mask)
    torch.testing.assert_close(loss, torch.tensor(math.log(64)))


def test_confident_correct_logits_give_near_zero_and_masks_apply():
    positions = torch.cumsum(torch.rand(1, 7, 3) * 4, dim=1)
    distance = (positions[:, :, None] - positions[:, None]).norm(dim=-1)
    target = torch.bucketize(distance, distogram_bin_edges(64, 2.0, 22.0))
    logits = torch.nn.functional.one_hot(target, 64).float() * 50.0
    mask = torch.ones(1, 7, dtype=torch.bool)
    assert distogram_loss(logits, positions, mask) < 1e-6
    # wrong logits only on pairs touching a masked token: the loss does not see them
    mask[0, 3] = False
    logits[0, 3, :] = torch.roll(logits[0, 3, :], 5, dims=-1)
    logits[0, :, 3] = torch.roll(logits[0, :, 3], 5, dims=-1)
    assert distogram_loss(logits, positions, mask) < 1e-6


def test_bins_follow_af3():
    edges = distogram_bin_edges(64, 2.0, 22.0)
    assert edges.shape == (63,) and edges[0] == 2.0 and edges[-1] == 22.0


def test_sample_without_valid_pairs_contributes_zero():
    logits = torch.randn(2, 4, 4, 64)
    positions = torch.randn(2, 4, 3)
    mask = torch.ones(2, 4, dtype=torch.bool)
    mask[1] = False
    both = distogram_loss(logits, positions, mask)
    first = distogram_loss(logits[:1], positions[:1], mask[:1])
    torch.testing.assert_close(both, first / 2)
