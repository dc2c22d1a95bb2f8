"""featurecache's relative position encoding (AF3 Algorithm 3) against Protenix 2.0's, on a
homodimer (one entity) and a heterotrimer with two copies of one entity."""

import torch

from featurecache.model.network.embedders import RelativePositionEncoding
from featurecache.testing.compare import rel_error
from featurecache.testing.protenix import copy_weights, randomise, relative_position_map

from tests.equivalence.settings import featurecache_config
from tests.equivalence.tolerance import FP32_TOLERANCE


def chains(entities: list[int], sym_ids: list[int], length: int) -> dict:
    """Token features of chains of `length` residues (asym_id 1, 2, ...; residue_index from 1;
    a few residues split into two tokens, as a modified residue's atoms are)."""
    count = len(entities)
    asym = torch.arange(1, count + 1).repeat_interleave(length)
    residue = torch.arange(1, length + 1).repeat(count)
    residue[3::7] = residue[2::7][: len(residue[3::7])]  # token 3 of 7 shares its residue with token 2
    return {
        "asym_id": asym,
        "residue_index": residue,
        "token_index": torch.arange(count * length),
        "entity_id": torch.tensor(entities).repeat_interleave(length),
        "sym_id": torch.tensor(sym_ids).repeat_interleave(length),
    }


def encodings(generator, features: dict) -> tuple[torch.Tensor, torch.Tensor]:
    from protenix.model.modules.embedders import RelativePositionEncoding as ProtenixRelativePositionEncoding

    config = featurecache_config()
    theirs = ProtenixRelativePositionEncoding(
        config.trunk.relpos_max_residue, config.trunk.relpos_max_chain, config.trunk.c_z
    )
    ours = RelativePositionEncoding(config.trunk.c_z, config.trunk.relpos_max_residue, config.trunk.relpos_max_chain)
    randomise(theirs, generator)
    copy_weights(theirs, ours, relative_position_map(config))
    with torch.no_grad():
        expected = theirs(theirs.generate_relp(dict(features))["relp"])
        actual = ours({name: value[None] for name, value in features.items()})[0]
    return actual, expected


def test_homodimer(generator):
    actual, expected = encodings(generator, chains([1, 1], [1, 2], length=40))
    assert rel_error(actual, expected) <= FP32_TOLERANCE


def test_two_entities():
    actual, expected = encodings(torch.Generator().manual_seed(3), chains([1, 1, 2], [1, 2, 1], length=20))
    assert rel_error(actual, expected) <= FP32_TOLERANCE
