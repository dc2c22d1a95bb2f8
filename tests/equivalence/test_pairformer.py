"""featurecache's Pairformer and MSA blocks against Protenix 2.0's, with the same random weights."""

import pytest
import torch

from featurecache.model.network.msa import MSABlock
from featurecache.model.network.pairformer import PairformerBlock
from featurecache.testing.compare import rel_error
from featurecache.testing.protenix import (
    copy_weights,
    msa_block_map,
    outer_product_mean_af3_map,
    pairformer_block_map,
    randomise,
    under,
)

from tests.equivalence.settings import featurecache_config
from tests.equivalence.tolerance import FP32_TOLERANCE

TOKENS = 11
MSA_ROWS = 5


def test_pairformer_block(generator):
    from protenix.model.modules.pairformer import PairformerBlock as ProtenixPairformerBlock

    config = featurecache_config()
    theirs = ProtenixPairformerBlock(
        n_heads=config.trunk.single_heads,
        c_z=config.trunk.c_z,
        c_s=config.trunk.c_s,
        c_hidden_mul=config.trunk.c_z,
        c_hidden_pair_att=config.trunk.pair_head_dim,
        no_heads_pair=config.trunk.pair_heads,
        num_intermediate_factor=config.trunk.transition_expansion,
        dropout=0.0,
    ).eval()
    ours = PairformerBlock(
        config.trunk.c_s,
        config.trunk.c_z,
        config.trunk.single_heads,
        config.trunk.single_head_dim,
        config.trunk.pair_heads,
        config.trunk.pair_head_dim,
        config.trunk.transition_expansion,
        kernels=config.runtime.kernels,
    ).eval()
    randomise(theirs, generator)
    copy_weights(theirs, ours, pairformer_block_map(config))

    s = torch.randn(1, TOKENS, config.trunk.c_s, generator=generator)
    z = torch.randn(1, TOKENS, TOKENS, config.trunk.c_z, generator=generator)
    # Protenix's single attention takes no token mask (it runs unpadded): every token valid; the
    # pair mask, which both apply, masks a few pairs
    token_mask = torch.ones(1, TOKENS, dtype=torch.bool)
    pair_mask = torch.rand(1, TOKENS, TOKENS, generator=generator) > 0.1
    with torch.no_grad():
        s_theirs, z_theirs = theirs(s, z, pair_mask.float())
        s_ours, z_ours = ours(s, z, token_mask, pair_mask)
    assert rel_error(z_ours, z_theirs) <= FP32_TOLERANCE
    assert rel_error(s_ours, s_theirs) <= FP32_TOLERANCE


def protenix_pair_stack(config):
    """Protenix's PairformerBlock without the single half (c_s = 0), at featurecache's pair sizes.
    Its MSABlock and TemplateEmbedder build theirs at fixed sizes (triangle-multiplication
    hidden 128, 4 heads of 32, or c_z // 32 heads with hidden_scale_up) that the small sizes here
    do not have; the block is the same class either way."""
    from protenix.model.modules.pairformer import PairformerBlock as ProtenixPairformerBlock

    return ProtenixPairformerBlock(
        c_z=config.trunk.c_z,
        c_s=0,
        c_hidden_mul=config.trunk.c_z,
        c_hidden_pair_att=config.trunk.pair_head_dim,
        no_heads_pair=config.trunk.pair_heads,
        num_intermediate_factor=config.trunk.transition_expansion,
        dropout=0.0,
    )


@pytest.mark.parametrize("bias_divided", [False, True], ids=["af3", "protenix"])
@pytest.mark.parametrize("last", [False, True])
def test_msa_block(generator, last, bias_divided):
    """With outer_product_bias_divided (Protenix's dialect) the outer product mean's bias is
    Protenix's as it is; with AF3's order (mean, then Linear) the map rescales it for this MSA."""
    from protenix.model.modules.pairformer import MSABlock as ProtenixMSABlock

    # Protenix's pair-weighted averaging has 8 heads of 8 (fixed); its MSA transition expands 4x
    config = featurecache_config(msa_heads=8, msa_head_dim=8, outer_product_bias_divided=bias_divided)
    theirs = ProtenixMSABlock(
        c_m=config.msa.c_m,
        c_z=config.trunk.c_z,
        c_hidden=config.msa.outer_product_dim,
        is_last_block=last,
        msa_dropout=0.0,
        pair_dropout=0.0,
    )
    theirs.pair_stack = protenix_pair_stack(config)
    theirs.eval()
    ours = MSABlock(config, last=last).eval()
    randomise(theirs, generator)
    mapping = msa_block_map(config, last)
    if not bias_divided:
        mapping.update(
            under("outer_product_mean.", "outer_product_mean_msa.", outer_product_mean_af3_map(config, MSA_ROWS))
        )
    copy_weights(theirs, ours, mapping)

    m = torch.randn(1, MSA_ROWS, TOKENS, config.msa.c_m, generator=generator)
    z = torch.randn(1, TOKENS, TOKENS, config.trunk.c_z, generator=generator)
    # Protenix's MSA block reads no MSA or token mask (it runs unpadded): all valid
    msa_mask = torch.ones(1, MSA_ROWS, TOKENS, dtype=torch.bool)
    token_mask = torch.ones(1, TOKENS, dtype=torch.bool)
    pair_mask = torch.rand(1, TOKENS, TOKENS, generator=generator) > 0.1
    with torch.no_grad():
        m_theirs, z_theirs = theirs(m.clone(), z.clone(), pair_mask.float())
        m_ours, z_ours = ours(m, z, msa_mask, token_mask, pair_mask)
    assert rel_error(z_ours, z_theirs) <= FP32_TOLERANCE
    if not last:
        assert rel_error(m_ours, m_theirs) <= FP32_TOLERANCE
