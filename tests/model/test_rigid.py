"""kabsch_rotation (Horn's quaternion by repeated squaring) against the SVD form of Kabsch, and the
fits built on it (rigid_fit, Algorithm 28's weighted_rigid_align)."""

import torch

from featurecache.model.network.rotations import quaternion_to_rotation
from featurecache.model.objectives.rigid import _horn_matrix, kabsch_rotation, rigid_fit, weighted_rigid_align


def _svd_kabsch(covariance):
    u, _, vh = torch.linalg.svd(covariance)
    v = vh.transpose(-1, -2)
    sign = torch.sign(torch.linalg.det(v @ u.transpose(-1, -2)))
    flip = torch.ones(*sign.shape, 3, dtype=covariance.dtype)
    flip[..., 2] = sign
    return (v * flip.unsqueeze(-2)) @ u.transpose(-1, -2)


def _random_rotations(count, generator):
    q, r = torch.linalg.qr(torch.randn(count, 3, 3, generator=generator, dtype=torch.float64))
    q = q * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1)).unsqueeze(-2)
    return q * torch.linalg.det(q)[:, None, None]  # proper rotations


def _covariance(mobile, target):
    mobile = mobile - mobile.mean(-2, keepdim=True)
    target = target - target.mean(-2, keepdim=True)
    return torch.einsum("...li,...lj->...ij", mobile, target)


def test_recovers_a_known_rotation_exactly():
    generator = torch.Generator().manual_seed(0)
    points = torch.randn(16, 11, 3, generator=generator, dtype=torch.float64)
    rotation = _random_rotations(16, generator)
    moved = points @ rotation.transpose(-1, -2) + torch.randn(16, 1, 3, generator=generator, dtype=torch.float64)
    torch.testing.assert_close(kabsch_rotation(_covariance(points, moved)), rotation, rtol=0, atol=1e-10)


def test_matches_the_svd_form_on_noisy_and_mirrored_targets():
    generator = torch.Generator().manual_seed(1)
    points = torch.randn(32, 9, 3, generator=generator, dtype=torch.float64)
    noisy = points @ _random_rotations(32, generator).transpose(-1, -2) + 0.5 * torch.randn(
        32, 9, 3, generator=generator, dtype=torch.float64
    )
    mirrored = noisy * torch.tensor([-1.0, 1.0, 1.0], dtype=torch.float64)  # best orthogonal map: a reflection
    for target in (noisy, mirrored):
        covariance = _covariance(points, target)
        rotation = kabsch_rotation(covariance)
        torch.testing.assert_close(rotation, _svd_kabsch(covariance), rtol=0, atol=1e-9)
        torch.testing.assert_close(torch.linalg.det(rotation), torch.ones(32, dtype=torch.float64))


def test_degenerate_inputs_give_a_rotation_that_is_still_optimal():
    zero = kabsch_rotation(torch.zeros(2, 3, 3))
    torch.testing.assert_close(zero, torch.eye(3).expand(2, 3, 3))
    line = torch.zeros(1, 6, 3, dtype=torch.float64)
    line[..., 0] = torch.arange(6.0)
    covariance = _covariance(line, line)  # rank one: many optimal rotations, all about the x axis
    rotation = kabsch_rotation(covariance)
    centred = line - line.mean(-2, keepdim=True)
    torch.testing.assert_close(centred @ rotation.transpose(-1, -2), centred, rtol=0, atol=1e-9)
    assert kabsch_rotation(_covariance(line.float(), line.float())).dtype == torch.float32


def test_rigid_alignment_removes_a_known_rotation_and_translation():
    generator = torch.Generator().manual_seed(3)
    mobile = torch.randn(2, 7, 3, generator=generator, dtype=torch.float64) * 10
    rotation = _random_rotations(2, generator)
    translation = torch.randn(2, 1, 3, generator=generator, dtype=torch.float64) * 5
    target = mobile @ rotation.transpose(-1, -2) + translation
    weights = torch.ones(2, 7, dtype=torch.float64)
    # atoms with weight 0 do not pull the fit: move them anywhere
    weights[:, 5:] = 0
    target[:, 5:] += 100.0
    aligned = weighted_rigid_align(mobile, target, weights)
    torch.testing.assert_close(aligned[:, :5], target[:, :5], atol=1e-9, rtol=0)


def test_rigid_alignment_never_reflects():
    points = torch.tensor([[[1.0, 0, 0], [0, 1, 0], [0, 0, 1], [0, 0, 0]]])
    mirrored = points * torch.tensor([1.0, 1.0, -1.0])
    aligned = weighted_rigid_align(points, mirrored, torch.ones(1, 4))
    assert not torch.allclose(aligned, mirrored, atol=1e-3)
    # a proper rotation keeps every distance
    torch.testing.assert_close(torch.cdist(aligned, aligned), torch.cdist(points, points), atol=1e-5, rtol=0)


def test_rigid_fit_returns_the_rotation_and_translation():
    generator = torch.Generator().manual_seed(5)
    mobile = torch.randn(3, 9, 3, generator=generator, dtype=torch.float64) * 10
    rotation = _random_rotations(3, generator)
    translation = torch.randn(3, 3, generator=generator, dtype=torch.float64) * 5
    target = mobile @ rotation.transpose(-1, -2) + translation[:, None]
    fitted_rotation, fitted_translation = rigid_fit(mobile, target, torch.ones(3, 9, dtype=torch.float64))
    torch.testing.assert_close(fitted_rotation, rotation, atol=1e-9, rtol=0)
    torch.testing.assert_close(fitted_translation, translation, atol=1e-8, rtol=0)


def test_quaternion_rotation_is_the_written_out_matrix_for_any_length():
    """quaternion_to_rotation's table against Shepperd's entries of a unit quaternion, for
    quaternions of any length (it divides by |q|^2), and the quarter turn about z by hand."""
    q = torch.randn(64, 4, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    w, x, y, z = (q / q.norm(dim=-1, keepdim=True)).unbind(-1)
    expected = torch.stack(
        [
            torch.stack([1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)], -1),
            torch.stack([2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)], -1),
            torch.stack([2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)], -1),
        ],
        -2,
    )
    torch.testing.assert_close(quaternion_to_rotation(3.0 * q), expected, rtol=0, atol=1e-14)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # as the sampler runs: still fp32 products
        rotations = quaternion_to_rotation(q.float())
    assert rotations.dtype == torch.float32
    torch.testing.assert_close(rotations, expected.float(), rtol=0, atol=1e-6)
    quarter = quaternion_to_rotation(torch.tensor([1.0, 0.0, 0.0, 1.0]))  # 90 degrees about z, unnormalised
    torch.testing.assert_close(quarter, torch.tensor([[0.0, -1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0]]))


def test_horn_matrix_entries():
    """N's entries as Horn's eq. 10 writes them, from a covariance with distinct entries."""
    h = torch.arange(1.0, 10.0, dtype=torch.float64).view(3, 3) ** 2  # xx=1, xy=4, xz=9, yx=16, ...
    (xx, xy, xz), (yx, yy, yz), (zx, zy, zz) = h.tolist()
    expected = torch.tensor(
        [
            [xx + yy + zz, yz - zy, zx - xz, xy - yx],
            [yz - zy, xx - yy - zz, xy + yx, zx + xz],
            [zx - xz, xy + yx, -xx + yy - zz, yz + zy],
            [xy - yx, zx + xz, yz + zy, -xx - yy + zz],
        ],
        dtype=torch.float64,
    )
    assert torch.equal(_horn_matrix(h), expected)
