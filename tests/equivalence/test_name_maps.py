"""copy_weights refuses any name map that does not cover both modules exactly."""

import pytest
import torch
from torch import nn

from featurecache.testing.protenix import NameMapError, ProtenixOnly, copy_weights, same, stacked, zeros


def modules():
    theirs = nn.ModuleDict(
        {
            "linear_q": nn.Linear(4, 3, bias=False),
            "linear_k": nn.Linear(4, 3, bias=False),
            "extra": nn.Linear(4, 1, bias=False),
        }
    )
    ours = nn.ModuleDict({"proj": nn.Linear(4, 6)})
    return theirs, ours


def full_map():
    return {
        "proj.weight": stacked(("linear_q.weight", 3), ("linear_k.weight", 3)),
        "proj.bias": zeros("no bias in Protenix"),
    }


def test_a_complete_map_copies_every_tensor():
    theirs, ours = modules()
    copy_weights(theirs, ours, full_map(), {"extra.weight": ProtenixOnly("zeroed", "a term featurecache lacks")})
    assert torch.equal(ours["proj"].weight[:3], theirs["linear_q"].weight)
    assert torch.equal(ours["proj"].weight[3:], theirs["linear_k"].weight)
    assert not ours["proj"].bias.any() and not theirs["extra"].weight.any()


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda m: m.pop("proj.bias"), "featurecache tensor proj.bias (6,) is not mapped"),
        (lambda m: m.update({"proj.scale": same("extra.weight")}), "the map sets proj.scale"),
        (
            lambda m: m.update({"proj.weight": same("linear_q.weight")}),
            "Protenix tensor linear_k.weight (3, 4) is not used",
        ),
        (lambda m: m.update({"proj.bias": same("linear_v.bias")}), "the map reads linear_v.bias"),
    ],
)
def test_an_incomplete_map_names_what_is_wrong(change, message):
    theirs, ours = modules()
    mapping = full_map()
    change(mapping)
    with pytest.raises(NameMapError, match=message.replace("(", r"\(").replace(")", r"\)")):
        copy_weights(theirs, ours, mapping, {"extra.weight": ProtenixOnly("zeroed", "a term featurecache lacks")})


def test_an_unused_protenix_tensor_and_a_wrong_shape_fail():
    theirs, ours = modules()
    with pytest.raises(NameMapError, match=r"Protenix tensor extra.weight \(1, 4\) is not used"):
        copy_weights(theirs, ours, full_map())
    with pytest.raises(NameMapError, match="shapes differ"):
        copy_weights(
            theirs,
            ours,
            {**full_map(), "proj.weight": same("linear_q.weight")},
            {"extra.weight": ProtenixOnly("zeroed", ""), "linear_k.weight": ProtenixOnly("zeroed", "")},
        )


def test_a_constant_that_is_not_featurecache_s_fails():
    theirs, ours = modules()
    with pytest.raises(NameMapError, match="extra.weight"):
        copy_weights(theirs, ours, full_map(), {"extra.weight": ProtenixOnly("constant", "bins", torch.ones(1, 4))})
