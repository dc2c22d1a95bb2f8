import pytest
import torch

from featurecache.model.network.embedders import (
    TEMPLATE_DISTOGRAM_EDGES,
    TEMPLATE_FEATURE_DIM,
    RelativePositionEncoding,
    template_pair_features,
)
from featurecache.testing.compare import rel_error, summation_tolerance
from featurecache.testing.synthetic import random_batch


def _generator() -> torch.Generator:
    return torch.Generator().manual_seed(int(torch.randint(0, 2**31 - 1, ())))


def test_relative_position_one_hots():
    encoding = RelativePositionEncoding(c_z=4, max_residue=32, max_chain=2)
    batch = {
        "asym_id": torch.tensor([[1, 1, 1, 2]]),
        "residue_index": torch.tensor([[1, 2, 50, 1]]),
        "token_index": torch.tensor([[0, 1, 2, 3]]),
        "entity_id": torch.tensor([[1, 1, 1, 1]]),
        "sym_id": torch.tensor([[1, 1, 1, 2]]),
    }
    x = encoding.features(batch).float()[0]
    residue, token, entity, chain = x[..., :66], x[..., 66:132], x[..., 132], x[..., 133:]
    assert residue[0, 1].argmax() == 32 - 1  # residue 1 vs 2: offset -1
    assert residue[2, 0].argmax() == 64  # offset 49 clipped to r_max
    assert residue[0, 3].argmax() == 65  # other chain
    assert token[0, 1].argmax() == 65  # different residue: no token offset
    assert token[1, 1].argmax() == 32  # same token
    assert entity[0, 3] == 1  # same entity, other copy
    assert chain[0, 3].argmax() == 1 - 2 + 2  # sym 1 vs 2
    assert chain[0, 1].argmax() == 2  # same chain: sym offset 0 (AF3's code gates on the entity)
    supplement = RelativePositionEncoding(c_z=4, max_residue=32, max_chain=2, chain_gate="chain").features(batch)[0]
    assert supplement[0, 1, 133:].long().argmax() == 5  # same chain: "other" as the supplement prints it
    assert supplement[0, 3, 133:].long().argmax() == 1 - 2 + 2


@pytest.mark.parametrize("chain_gate", ["entity", "chain"])
def test_relative_positions_are_the_linear_map_of_the_one_hots(chain_gate):
    """forward sums the weight columns the one-hot features pick: the linear layer on them, in
    value (at most 4 non-zero terms per sum) and in the weight's gradient (sums over the B N N
    pairs, in another order)."""
    generator = torch.Generator().manual_seed(3)
    batch = random_batch([40, 23], [2, 2], [1, 1], generator)
    batch["asym_id"][:, 30:] = 3  # a third chain of the first entity, another copy of it
    batch["sym_id"][:, 30:] = 2
    encoding = RelativePositionEncoding(c_z=8, max_residue=4, max_chain=1, chain_gate=chain_gate)
    upstream = torch.randn(2, 40, 40, 8, generator=generator)
    actual = encoding(batch)
    (actual * upstream).sum().backward()
    actual_grad = encoding.linear.weight.grad.clone()
    encoding.zero_grad()
    expected = encoding.linear(encoding.features(batch).float())
    (expected * upstream).sum().backward()
    assert rel_error(actual, expected) <= summation_tolerance(torch.float32, 4)
    assert rel_error(actual_grad, encoding.linear.weight.grad) <= summation_tolerance(torch.float32, 2 * 40 * 40)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the dtype the linear layer would give
        assert encoding(batch).dtype == encoding.linear(encoding.features(batch).float()).dtype == torch.bfloat16


def test_template_features_do_not_change_under_a_rigid_motion():
    batch = random_batch([9], [2], [1], _generator())
    batch["asym_id"][:] = 1
    features = template_pair_features(batch, 0)
    assert features.shape == (1, 9, 9, TEMPLATE_FEATURE_DIM)
    rotation, _ = torch.linalg.qr(torch.randn(3, 3))
    rotation = rotation * torch.sign(torch.det(rotation))  # proper rotation
    shift = torch.randn(3) * 20
    moved = dict(batch)
    for name in ("template_backbone_pos", "template_pseudo_beta_pos"):
        moved[name] = batch[name] @ rotation.T + shift
    moved_features = template_pair_features(moved, 0)
    # distances within rounding of a bin edge may land in either bin: compare the rest
    pos = batch["template_pseudo_beta_pos"][0, 0]
    distance = (pos[:, None] - pos[None]).norm(dim=-1)
    edges = torch.linspace(*TEMPLATE_DISTOGRAM_EDGES)
    clear = ((distance[..., None] - edges).abs() > 1e-3).all(dim=-1)
    torch.testing.assert_close(moved_features[0][clear], features[0][clear], atol=2e-4, rtol=1e-4)
    assert clear.float().mean() > 0.9


def test_template_geometry_is_zero_across_chains():
    batch = random_batch([8], [2], [1], _generator())
    features = template_pair_features(batch, 0)
    other_chain = batch["asym_id"][0, :, None] != batch["asym_id"][0, None, :]
    geometry = features[0, ..., :44]
    assert other_chain.any() and (geometry[other_chain] == 0).all()
