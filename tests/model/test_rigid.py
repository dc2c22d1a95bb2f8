"""kabsch_rotation (Horn's quaternion by repeated squaring) against the SVD form of Kabsch."""

import torch

from featurecache.model.rigid import kabsch_rotation


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
        32, 9, 3, generator=generator, dtype=torch.float64)
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
