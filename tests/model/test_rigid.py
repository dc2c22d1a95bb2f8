"""kabsch_rotation (Horn's quaternion by repeated squaring) against the SVD form of Kabsch, and the
fits built on it (rigid_fit, Algorithm 28's weighted_rigid_align)."""

import torch

from featurecache.model.objectives.rigid import kabsch_rotation, rigid_fit, weighted_rigid_align


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
