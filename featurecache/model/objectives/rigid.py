"""Weighted rigid alignment (Kabsch; AF3 Algorithm 28), with elementwise ops only: the one place
the package fits a rotation, used by the structure loss (losses.aligned_mse_loss) and the
permutation alignment (permutation.py).

torch.linalg.svd on CUDA reads the solver's status back to the host, which a CUDA graph capture
forbids (seen on the H200: `featurecache train --cuda-graphs` failed in the loss's alignment).
Horn's quaternion method gives the same rotation as the top eigenvector of a symmetric 4 x 4
matrix; that eigenvector comes here from repeated squaring of the shifted matrix (each squaring
squares the eigenvalue ratios, so 2^32 powers separate any two eigenvalues that float64 tells
apart), then a column of the result. Always a proper rotation (determinant +1), as Kabsch with
the reflection fix is.
"""

from __future__ import annotations

import torch

from featurecache.model.network.rotations import device_constant, quaternion_to_rotation

_SQUARINGS = 32
# Renormalised every 8 squarings, not each (on a GPU each is 3 small kernels): after a
# normalisation the top eigenvalue is in [1/2, 1] (the shifted matrix's eigenvalues are in [0, 2],
# its Frobenius norm at most twice the largest), so 8 squarings take it no lower than 2^-256 and
# none above 1, far inside float64's range.
_SQUARINGS_PER_NORMALISATION = 8


def rigid_fit(mobile: torch.Tensor, target: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The rotation R [..., 3, 3] and translation t [..., 3] minimising sum_l w_l |R x_l + t - y_l|^2
    (Kabsch, no reflection): mobile x, target y [..., L, 3]; weights w [..., L] (0 to ignore)."""
    mobile_centre, target_centre, covariance = _centred_covariance(mobile, target, weights)
    rotation = kabsch_rotation(covariance)
    shift = target_centre.squeeze(-2) - (rotation @ mobile_centre.squeeze(-2).unsqueeze(-1)).squeeze(-1)
    return rotation, shift


def weighted_rigid_align(mobile: torch.Tensor, target: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Algorithm 28, weighted_rigid_align: `mobile` moved by rigid_fit's rotation and translation
    onto `target`; no gradient. mobile, target [..., A, 3]; weights [..., A] -> [..., A, 3]."""
    with torch.no_grad():
        dtype = mobile.dtype
        work = torch.promote_types(dtype, torch.float32)  # the covariance needs fp32 at least
        mobile, target, weights = mobile.to(work), target.to(work), weights.to(work)
        mobile_centre, target_centre, covariance = _centred_covariance(mobile, target, weights)
        rotation = kabsch_rotation(covariance)
        aligned = (mobile - mobile_centre) @ rotation.transpose(-1, -2) + target_centre
        return aligned.to(dtype)


def _centred_covariance(
    mobile: torch.Tensor, target: torch.Tensor, weights: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The weighted centres [..., 1, 3] of mobile and target [..., L, 3] and the covariance
    H [..., 3, 3] = sum_l w_l (x_l - x_c)(y_l - y_c)^T that kabsch_rotation takes."""
    weights = weights.unsqueeze(-1)
    total = weights.sum(dim=-2, keepdim=True).clamp(min=1e-8)
    mobile_centre = (weights * mobile).sum(dim=-2, keepdim=True) / total
    target_centre = (weights * target).sum(dim=-2, keepdim=True) / total
    covariance = torch.einsum("...li,...lj->...ij", weights * (mobile - mobile_centre), target - target_centre)
    return mobile_centre, target_centre, covariance


def kabsch_rotation(covariance: torch.Tensor) -> torch.Tensor:
    """R [..., 3, 3] maximising sum_l w_l y_l . (R x_l) for covariance H [..., 3, 3] =
    sum_l w_l x_l y_l^T of centred mobile points x and target points y; no gradient."""
    with torch.no_grad():
        h = covariance.double()
        n = _horn_matrix(h)
        scale = n.flatten(-2).norm(dim=-1).clamp(min=1e-30)[..., None, None]
        eye = torch.eye(4, dtype=h.dtype, device=h.device)
        power = n / scale + eye  # eigenvalues shifted into [0, 2]: the largest stays largest in size
        for squaring in range(1, _SQUARINGS + 1):
            power = power @ power
            if squaring % _SQUARINGS_PER_NORMALISATION == 0:
                power = power / power.flatten(-2).norm(dim=-1).clamp(min=1e-300)[..., None, None]
        # the power is (close to) a projector onto the top eigenvector(s): take its largest column
        column = power.norm(dim=-2).argmax(dim=-1)  # [...]
        q = torch.gather(power, -1, column[..., None, None].expand(*power.shape[:-1], 1)).squeeze(-1)
        q = q / q.norm(dim=-1, keepdim=True).clamp(min=1e-300)
        return quaternion_to_rotation(q).to(covariance.dtype)


# Horn (1987), eq. 10: the symmetric 4 x 4 matrix N whose top eigenvector is the quaternion, as
# sums of the covariance's entries: N[r, c] = sum_ij T[ij, rc] H_ij (one matrix product, not ~30
# small kernels on a GPU); row by row, with xy = H[0, 1] and so on:
#   [xx + yy + zz, yz - zy,       zx - xz,        xy - yx      ]
#   [yz - zy,      xx - yy - zz,  xy + yx,        zx + xz      ]
#   [zx - xz,      xy + yx,       -xx + yy - zz,  yz + zy      ]
#   [xy - yx,      zx + xz,       yz + zy,        -xx - yy + zz]
_HORN_TERMS = {
    (0, 0): {(0, 0): 1, (1, 1): 1, (2, 2): 1},
    (0, 1): {(1, 2): 1, (2, 1): -1},
    (0, 2): {(2, 0): 1, (0, 2): -1},
    (0, 3): {(0, 1): 1, (1, 0): -1},
    (1, 1): {(0, 0): 1, (1, 1): -1, (2, 2): -1},
    (1, 2): {(0, 1): 1, (1, 0): 1},
    (1, 3): {(2, 0): 1, (0, 2): 1},
    (2, 2): {(0, 0): -1, (1, 1): 1, (2, 2): -1},
    (2, 3): {(1, 2): 1, (2, 1): 1},
    (3, 3): {(0, 0): -1, (1, 1): -1, (2, 2): 1},
}


def _horn_table() -> torch.Tensor:
    """T [9, 16] (symmetric in its row and column of N)."""
    table = torch.zeros(3, 3, 4, 4, dtype=torch.float64)
    for (row, column), terms in _HORN_TERMS.items():
        for (i, j), coefficient in terms.items():
            table[i, j, row, column] = table[i, j, column, row] = coefficient
    return table.view(9, 16)


def _horn_matrix(h: torch.Tensor) -> torch.Tensor:
    """H [..., 3, 3] -> N [..., 4, 4]."""
    return (h.flatten(-2) @ device_constant("horn", _horn_table, h)).unflatten(-1, (4, 4))
