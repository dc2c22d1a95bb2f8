"""The smooth LDDT's Triton kernel: per (sample, tile of atoms i), the score sum, the pair count
and the gradient with respect to the predicted positions, over every atom j. The thresholds
are literals here (one sigmoid each); their values are kernels/reference.py's LDDT_THRESHOLDS."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _load_xyz(base, index, mask):
    x = tl.load(base + index * 3 + 0, mask=mask, other=0.0).to(tl.float32)
    y = tl.load(base + index * 3 + 1, mask=mask, other=0.0).to(tl.float32)
    z = tl.load(base + index * 3 + 2, mask=mask, other=0.0).to(tl.float32)
    return x, y, z


@triton.jit
def _smooth_lddt_kernel(
    PRED, TRUE, RADIUS, SCORE, COUNT, GRAD, samples, atoms, tiles, BLOCK_I: tl.constexpr, BLOCK_J: tl.constexpr
):
    n = tl.program_id(0)  # batch * samples + sample
    tile = tl.program_id(1)
    b = n // samples
    pred = PRED + n.to(tl.int64) * atoms * 3
    true = TRUE + b.to(tl.int64) * atoms * 3
    radius = RADIUS + b.to(tl.int64) * atoms
    i = tile * BLOCK_I + tl.arange(0, BLOCK_I)
    in_i = i < atoms
    pxi, pyi, pzi = _load_xyz(pred, i, in_i)
    txi, tyi, tzi = _load_xyz(true, i, in_i)
    r_i = tl.load(radius + i, mask=in_i, other=0.0)
    score = tl.zeros([BLOCK_I], tl.float32)
    count = tl.zeros([BLOCK_I], tl.float32)
    gx = tl.zeros([BLOCK_I], tl.float32)
    gy = tl.zeros([BLOCK_I], tl.float32)
    gz = tl.zeros([BLOCK_I], tl.float32)
    for start in range(0, atoms, BLOCK_J):
        j = start + tl.arange(0, BLOCK_J)
        in_j = j < atoms
        pxj, pyj, pzj = _load_xyz(pred, j, in_j)
        txj, tyj, tzj = _load_xyz(true, j, in_j)
        r_j = tl.load(radius + j, mask=in_j, other=0.0)
        dx = pxi[:, None] - pxj[None, :]
        dy = pyi[:, None] - pyj[None, :]
        dz = pzi[:, None] - pzj[None, :]
        d_pred = tl.sqrt(dx * dx + dy * dy + dz * dz)
        ex = txi[:, None] - txj[None, :]
        ey = tyi[:, None] - tyj[None, :]
        ez = tzi[:, None] - tzj[None, :]
        d_true = tl.sqrt(ex * ex + ey * ey + ez * ez)
        pair = in_i[:, None] & in_j[None, :] & (i[:, None] != j[None, :]) & (r_i[:, None] > 0) & (r_j[None, :] > 0)
        forward = (pair & (d_true < r_i[:, None])).to(tl.float32)  # pair (i, j) counts
        backward = (pair & (d_true < r_j[None, :])).to(tl.float32)  # pair (j, i) counts
        error = d_pred - d_true
        distance_error = tl.abs(error)
        s1 = tl.sigmoid(0.5 - distance_error)
        s2 = tl.sigmoid(1.0 - distance_error)
        s3 = tl.sigmoid(2.0 - distance_error)
        s4 = tl.sigmoid(4.0 - distance_error)
        score += tl.sum(forward * (s1 + s2 + s3 + s4) * 0.25, axis=1)
        count += tl.sum(forward, axis=1)
        # d score / d |error|, times d |error| / d d_pred (sign(error), 0 at 0 as torch's abs)
        slope = -(s1 * (1.0 - s1) + s2 * (1.0 - s2) + s3 * (1.0 - s3) + s4 * (1.0 - s4)) * 0.25
        sign = tl.where(error > 0, 1.0, tl.where(error < 0, -1.0, 0.0))
        # d d_pred / d x_i = (x_i - x_j) / d_pred (0 for coincident atoms, as torch's cdist)
        weight = slope * sign * (forward + backward) / tl.maximum(d_pred, 1e-12)
        gx += tl.sum(weight * dx, axis=1)
        gy += tl.sum(weight * dy, axis=1)
        gz += tl.sum(weight * dz, axis=1)
    grad = GRAD + n.to(tl.int64) * atoms * 3
    tl.store(grad + i * 3 + 0, gx, mask=in_i)
    tl.store(grad + i * 3 + 1, gy, mask=in_i)
    tl.store(grad + i * 3 + 2, gz, mask=in_i)
    tl.store(SCORE + n * tiles + tile, tl.sum(score, axis=0))
    tl.store(COUNT + n * tiles + tile, tl.sum(count, axis=0))
