"""AF3's per-sample rotation and translation of the reference conformers (SI 2.8)."""

import numpy as np

from featurecache.features.conformer_augmentation import augment_reference_conformers, random_rotations

# fp32 rounding of a coordinate of magnitude |x| is |x| * 2^-24; a distance is a difference of two
# rounded coordinates, each rotated through a 3-term sum: a few ulps of the largest magnitude.
FP32_EPS = float(np.finfo(np.float32).eps)


def _tolerance(*positions: np.ndarray) -> float:
    return 16 * FP32_EPS * max(float(np.abs(p).max()) for p in positions)


def assert_rigid_per_space(before: np.ndarray, after: np.ndarray, uid: np.ndarray, mask: np.ndarray) -> None:
    """`after` equals `before` moved rigidly (a proper rotation and a translation) per reference space."""
    tolerance = _tolerance(before, after)
    for space in np.unique(uid):
        atoms = (uid == space) & mask
        a, b = before[atoms].astype(np.float64), after[atoms].astype(np.float64)
        np.testing.assert_allclose(
            np.linalg.norm(b[:, None] - b[None], axis=-1),
            np.linalg.norm(a[:, None] - a[None], axis=-1),
            rtol=0,
            atol=tolerance,
        )
        if atoms.sum() >= 4:  # a proper rotation keeps the handedness of every atom quadruple
            va, vb = a[1:4] - a[0], b[1:4] - b[0]
            assert np.sign(np.linalg.det(va)) == np.sign(np.linalg.det(vb)) or abs(np.linalg.det(va)) < tolerance


def _example(rng):
    # three reference spaces, one with an atom without a conformer position, uids not in order
    uid = np.array([4, 4, 4, 4, 4, 0, 0, 0, 0, 9, 9], np.int32)
    positions = (rng.normal(0, 3, (len(uid), 3)) + np.array([40.0, -25.0, 60.0])).astype(np.float32)
    mask = np.ones(len(uid), bool)
    mask[7] = False
    positions[7] = 0.0
    return positions, uid, mask


def test_rotations_are_proper_and_orthonormal():
    rotations = random_rotations(100, np.random.default_rng(0))
    eye = np.broadcast_to(np.eye(3), rotations.shape)
    np.testing.assert_allclose(rotations @ rotations.transpose(0, 2, 1), eye, atol=1e-12)
    np.testing.assert_allclose(np.linalg.det(rotations), 1.0, atol=1e-12)
    # uniform on SO(3): the mean rotation matrix is 0 (a fixed one would give itself), within
    # 5 standard errors of a mean of 10^4 entries bounded by 1
    many = random_rotations(10_000, np.random.default_rng(1))
    assert np.abs(many.mean(axis=0)).max() < 5 / np.sqrt(10_000)


def test_each_space_moves_rigidly_and_is_centred_without_translation():
    positions, uid, mask = _example(np.random.default_rng(3))
    centred = augment_reference_conformers(positions, uid, mask, np.random.default_rng(7), translation_std=0.0)
    assert centred.dtype == np.float32 and centred.shape == positions.shape
    assert_rigid_per_space(positions, centred, uid, mask)
    for space in np.unique(uid):
        atoms = (uid == space) & mask
        np.testing.assert_allclose(centred[atoms].astype(np.float64).mean(axis=0), 0.0, atol=_tolerance(positions))
    assert not centred[~mask].any()  # an atom without a position stays at zero
    moved = augment_reference_conformers(positions, uid, mask, np.random.default_rng(7), translation_std=1.0)
    assert_rigid_per_space(positions, moved, uid, mask)
    means = np.stack([moved[(uid == space) & mask].mean(axis=0) for space in np.unique(uid)])
    assert np.abs(means).max() > 0.01  # translated: the spaces' centres left the origin


def test_the_same_seed_gives_the_same_draw_and_spaces_get_their_own():
    positions, uid, mask = _example(np.random.default_rng(3))
    first = augment_reference_conformers(positions, uid, mask, np.random.default_rng([1, 2, 3]))
    again = augment_reference_conformers(positions, uid, mask, np.random.default_rng([1, 2, 3]))
    assert first.tobytes() == again.tobytes()
    other = augment_reference_conformers(positions, uid, mask, np.random.default_rng([1, 2, 4]))
    assert not np.array_equal(first, other)
    # each space has its own motion: distances between atoms of two spaces change
    a, b = np.flatnonzero((uid == 4) & mask)[0], np.flatnonzero((uid == 0) & mask)[0]
    before = np.linalg.norm(positions[a].astype(np.float64) - positions[b])
    after = np.linalg.norm(first[a].astype(np.float64) - first[b])
    assert abs(before - after) > 1.0
