"""featurecache's Pairformer and MSA blocks against Protenix 2.0's, with the same random weights."""

import torch

from featurecache.model.pairformer import PairformerBlock
from featurecache.testing.compare import rel_error
from featurecache.testing.protenix import copy_weights, equivalence_config, pairformer_block_map, randomise

from tests.equivalence.tolerance import FP32_TOLERANCE

TOKENS = 11


def test_pairformer_block(generator):
    from protenix.model.modules.pairformer import PairformerBlock as ProtenixPairformerBlock

    config = equivalence_config()
    theirs = ProtenixPairformerBlock(
        n_heads=config.single_heads, c_z=config.c_z, c_s=config.c_s, c_hidden_mul=config.c_z,
        c_hidden_pair_att=config.pair_head_dim, no_heads_pair=config.pair_heads,
        num_intermediate_factor=config.transition_expansion, dropout=0.0).eval()
    ours = PairformerBlock(config.c_s, config.c_z, config.single_heads, config.single_head_dim, config.pair_heads,
                           config.pair_head_dim, config.transition_expansion, kernels=config.kernels).eval()
    randomise(theirs, generator)
    copy_weights(theirs, ours, pairformer_block_map(config.c_s))

    s = torch.randn(1, TOKENS, config.c_s, generator=generator)
    z = torch.randn(1, TOKENS, TOKENS, config.c_z, generator=generator)
    # Protenix's single attention takes no token mask (it runs unpadded): every token valid; the
    # pair mask, which both apply, masks a few pairs
    token_mask = torch.ones(1, TOKENS, dtype=torch.bool)
    pair_mask = torch.rand(1, TOKENS, TOKENS, generator=generator) > 0.1
    with torch.no_grad():
        s_theirs, z_theirs = theirs(s, z, pair_mask.float())
        s_ours, z_ours = ours(s, z, token_mask, pair_mask)
    print(rel_error(z_ours, z_theirs), rel_error(s_ours, s_theirs), z_ours.norm())
    assert rel_error(z_ours, z_theirs) <= FP32_TOLERANCE
    assert rel_error(s_ours, s_theirs) <= FP32_TOLERANCE
