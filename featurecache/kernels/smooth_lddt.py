"""Smooth LDDT (AF3 Algorithm 27) summed over atom pairs, for a whole diffusion batch, in one kernel.

Composed from PyTorch ops the loss builds [A, A] distance, error and sigmoid tensors for every
diffusion sample (48 per step, 9.4 M pairs each at 3,072 atoms); profiled on the H200 (crop 384,
2026-12-03) its distance kernels alone took 1.5 s of a 2.8 s step's device time. Here each
program takes a tile of atoms i of one sample and loops over all atoms j, computing predicted
and true distances on the fly, so nothing of size [A, A] is ever stored. The loss is a scalar
per sample, so the same pass also writes its gradient with respect to the predicted positions
(saved; the backward only scales it).

Pair (i, j) counts when i != j, both atoms are resolved and the true distance is below atom i's
inclusion radius (NUCLEOTIDE_INCLUSION_RADIUS, 30 A, for nucleotide atoms, INCLUSION_RADIUS, 15 A,
otherwise): `radius` carries both, 0 for an unresolved atom. The gradient of x_i collects the pairs
(i, j) and (j, i), whose radii differ.

lDDT's numbers (LDDT_THRESHOLDS and the two radii) are defined here, the lowest layer that uses
them; model/objectives/lddt.py imports them (kernels import nothing from the model). The Triton kernel spells
the thresholds out as literals, one sigmoid each.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from featurecache.kernels import runtime

_BLOCK_I = 32
_BLOCK_J = 64
LDDT_THRESHOLDS = (0.5, 1.0, 2.0, 4.0)  # Angstrom
INCLUSION_RADIUS = 15.0  # Angstrom
NUCLEOTIDE_INCLUSION_RADIUS = 30.0  # Angstrom

# --------------------------------------------------------------------------------------------
# Triton kernel
# --------------------------------------------------------------------------------------------


@triton.jit
def _load_xyz(base, index, mask):
    x = tl.load(base + index * 3 + 0, mask=mask, other=0.0).to(tl.float32)
    y = tl.load(base + index * 3 + 1, mask=mask, other=0.0).to(tl.float32)
    z = tl.load(base + index * 3 + 2, mask=mask, other=0.0).to(tl.float32)
    return x, y, z


@triton.jit
def _smooth_lddt_kernel(PRED, TRUE, RADIUS, SCORE, COUNT, GRAD, samples, atoms, tiles,
                        BLOCK_I: tl.constexpr, BLOCK_J: tl.constexpr):
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


# --------------------------------------------------------------------------------------------
# Autograd and the entry points
# --------------------------------------------------------------------------------------------


def _smooth_lddt_launch(predicted, true, radius):
    """(score sums [B, S], pair counts [B], d(score sum)/d(predicted) [B, S, A, 3]), all fp32."""
    batch, samples, atoms, _ = predicted.shape
    predicted32 = predicted.float().contiguous()
    tiles = triton.cdiv(atoms, _BLOCK_I)
    score = torch.empty(batch * samples, tiles, device=predicted.device, dtype=torch.float32)
    count = torch.empty_like(score)
    grad = torch.empty_like(predicted32)
    _smooth_lddt_kernel[(batch * samples, tiles)](
        predicted32, true.float().contiguous(), radius.float().contiguous(), score, count, grad,
        samples, atoms, tiles, BLOCK_I=_BLOCK_I, BLOCK_J=_BLOCK_J)
    count = count.view(batch, samples, tiles)[:, 0].sum(-1)  # the same for every sample
    return score.sum(-1).view(batch, samples), count, grad


def _smooth_lddt_setup(ctx, inputs, output) -> None:
    """What the backward needs, for the eager Function and the custom op alike: the gradient
    (output[2]) and predicted's dtype."""
    ctx.save_for_backward(output[2])
    ctx.dtype = inputs[0].dtype


def _smooth_lddt_backward(ctx, d_score, *_other_grads):
    """The saved d(score sum)/d(predicted) [B, S, A, 3] scaled by d_score [B, S]; the pair
    counts (and, under compile, the saved gradient itself) take no gradient, nor do true and radius."""
    (grad,) = ctx.saved_tensors
    return (d_score[..., None, None] * grad).to(ctx.dtype), None, None


class _SmoothLddtSums(torch.autograd.Function):
    @staticmethod
    def forward(ctx, predicted, true, radius):
        score, count, grad = _smooth_lddt_launch(predicted, true, radius)
        _smooth_lddt_setup(ctx, (predicted, true, radius), (score, count, grad))
        ctx.mark_non_differentiable(count)
        return score, count

    backward = staticmethod(_smooth_lddt_backward)


# Under torch.compile: the same launch as a custom op, so neither Dynamo nor Inductor traces it.
@torch.library.custom_op("featurecache::smooth_lddt_sums", mutates_args=())
def _smooth_lddt_op(predicted: torch.Tensor, true: torch.Tensor,
                    radius: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _smooth_lddt_launch(predicted, true, radius)


@_smooth_lddt_op.register_fake
def _(predicted, true, radius):
    batch, samples = predicted.shape[:2]
    return (predicted.new_empty((batch, samples), dtype=torch.float32),
            predicted.new_empty(batch, dtype=torch.float32),
            predicted.new_empty(predicted.shape, dtype=torch.float32))


_smooth_lddt_op.register_autograd(_smooth_lddt_backward, setup_context=_smooth_lddt_setup)


def inclusion_radius(is_nucleotide: torch.Tensor, resolved: torch.Tensor) -> torch.Tensor:
    """Per atom [B, A]: NUCLEOTIDE_INCLUSION_RADIUS for nucleotide atoms, INCLUSION_RADIUS
    otherwise, 0 for unresolved atoms."""
    return torch.where(resolved, torch.where(is_nucleotide, NUCLEOTIDE_INCLUSION_RADIUS, INCLUSION_RADIUS), 0.0)


def smooth_lddt_sums_reference(predicted: torch.Tensor, true: torch.Tensor,
                               radius: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of the pair scores [B, S], number of pairs [B]) from dense [A, A] tensors; predicted
    [B, S, A, 3], true [B, A, 3], radius [B, A] (inclusion_radius). The tests' ground truth."""
    eye = torch.eye(true.shape[1], dtype=torch.bool, device=true.device)

    def distances(x):  # the diagonal (excluded below) set to 1: sqrt has no gradient at 0
        return ((x[..., :, None, :] - x[..., None, :, :]).square().sum(-1) + eye).sqrt()

    true_distance = distances(true)  # [B, A, A]
    resolved = radius > 0
    included = (true_distance < radius[..., None]) & resolved[:, :, None] & resolved[:, None, :] & ~eye
    error = (distances(predicted) - true_distance[:, None]).abs()
    score = sum(torch.sigmoid(threshold - error) for threshold in LDDT_THRESHOLDS) / len(LDDT_THRESHOLDS)
    included = included.to(score.dtype)
    return (score * included[:, None]).sum(dim=(-1, -2)), included.sum(dim=(-1, -2))


def smooth_lddt_sums(predicted: torch.Tensor, true: torch.Tensor,
                     radius: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """smooth_lddt_sums_reference in one Triton kernel (fp32, with the gradient with respect to
    `predicted`; none for `true`). On CUDA or the interpreter only."""
    if not runtime.runs_triton(predicted.device):
        raise RuntimeError("smooth_lddt_sums: Triton does not run on this device; use the reference")
    if torch.compiler.is_compiling():
        score, count, _ = _smooth_lddt_op(predicted, true.detach(), radius.detach())
        return score, count
    return _SmoothLddtSums.apply(predicted, true.detach(), radius.detach())
