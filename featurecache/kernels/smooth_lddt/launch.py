"""The smooth LDDT's launcher: fp32 inputs, one program per (sample, tile of atoms i), the
tiles' partial sums added on the host side of the graph."""

from __future__ import annotations

import torch
import triton

from featurecache.kernels.smooth_lddt.kernels import _smooth_lddt_kernel

# A program holds BLOCK_I atoms i of one sample and loops over every atom j in blocks of BLOCK_J.
BLOCK_I = 32
BLOCK_J = 64


def smooth_lddt_sums_fwd(predicted, true, radius):
    """(score sums [B, S], pair counts [B], d(score sum)/d(predicted) [B, S, A, 3]), all fp32."""
    batch, samples, atoms, _ = predicted.shape
    predicted32 = predicted.float().contiguous()
    tiles = triton.cdiv(atoms, BLOCK_I)
    score = torch.empty(batch * samples, tiles, device=predicted.device, dtype=torch.float32)
    count = torch.empty_like(score)
    grad = torch.empty_like(predicted32)
    _smooth_lddt_kernel[(batch * samples, tiles)](
        predicted32,
        true.float().contiguous(),
        radius.float().contiguous(),
        score,
        count,
        grad,
        samples,
        atoms,
        tiles,
        BLOCK_I=BLOCK_I,
        BLOCK_J=BLOCK_J,
    )
    count = count.view(batch, samples, tiles)[:, 0].sum(-1)  # the same for every sample
    return score.sum(-1).view(batch, samples), count, grad
