"""featurecache's template embedder (AF3 Algorithm 16) against Protenix 2.0's, on two templates of
a two-chain sample.

Protenix's embedder reads features its data pipeline computes (template_distogram, unit vectors,
masks); that pipeline does not import without biopython, so both embedders read the features
featurecache computes (featurecache.model.network.embedders.template_pair_features), laid out as Protenix
reads them: this compares the embedding network and the multichain masking, not the featurizer."""

import torch

from featurecache.model.network.embedders import TemplateEmbedder
from featurecache.testing.compare import rel_error
from featurecache.testing.protenix import copy_weights, protenix_template_features, randomise, template_embedder_map
from featurecache.testing.synthetic import random_batch

from tests.equivalence.settings import featurecache_config
from tests.equivalence.tolerance import FP32_TOLERANCE

TOKENS, TEMPLATES = 12, 2


def test_template_embedder(generator):
    from protenix.model.modules.pairformer import PairformerBlock as ProtenixPairformerBlock
    from protenix.model.modules.pairformer import TemplateEmbedder as ProtenixTemplateEmbedder

    config = featurecache_config()
    theirs = ProtenixTemplateEmbedder(
        n_blocks=config.templates.template_blocks,
        c=config.templates.c_template,
        c_z=config.trunk.c_z,
        num_intermediate_factor=config.templates.template_transition_expansion,
        dropout=0.0,
    )
    # its PairformerStack builds blocks at AF3's fixed pair sizes: rebuilt at featurecache's
    theirs.pairformer_stack.blocks = torch.nn.ModuleList(
        ProtenixPairformerBlock(
            c_z=config.templates.c_template,
            c_s=0,
            c_hidden_mul=config.templates.c_template,
            c_hidden_pair_att=config.templates.template_pair_head_dim,
            no_heads_pair=config.templates.template_pair_heads,
            num_intermediate_factor=config.templates.template_transition_expansion,
            dropout=0.0,
        )
        for _ in range(config.templates.template_blocks)
    )
    ours = TemplateEmbedder(config)
    randomise(theirs, generator)
    copy_weights(theirs, ours, template_embedder_map(config))
    theirs.eval(), ours.eval()

    batch = random_batch([TOKENS], [4], [TEMPLATES], generator, num_atoms_per_token=5)
    # pseudo-beta and backbone positions spread like a chain's, with a few unresolved
    batch["template_pseudo_beta_pos"] = batch["template_pseudo_beta_pos"] * 2.0
    z = torch.randn(1, TOKENS, TOKENS, config.trunk.c_z, generator=generator)
    pair_mask = torch.ones(1, TOKENS, TOKENS, dtype=torch.bool)  # Protenix's default, all pairs
    assert batch["template_mask"].all() and batch["asym_id"].unique().numel() == 2
    with torch.no_grad():
        update_theirs = theirs(protenix_template_features(batch), z[0])
        update_ours = ours(batch, z, pair_mask)
    assert rel_error(update_ours[0], update_theirs) <= FP32_TOLERANCE
