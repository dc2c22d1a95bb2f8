"""featurecache's template embedder (AF3 Algorithm 16) against Protenix 2.0's, on two templates of
a two-chain sample.

Protenix's embedder reads features its data pipeline computes (template_distogram, unit vectors,
masks); that pipeline does not import without biopython, so both embedders read the features
featurecache computes (featurecache.model.network.embedders.template_pair_features), laid out as Protenix
reads them: this compares the embedding network and the multichain masking, not the featurizer."""

import torch

from featurecache.model.network.embedders import TemplateEmbedder, template_pair_features
from featurecache.schema import NUM_RESTYPES
from featurecache.testing.compare import rel_error
from featurecache.testing.protenix import copy_weights, randomise, template_embedder_map
from featurecache.testing.synthetic import random_batch

from tests.equivalence.settings import featurecache_config
from tests.equivalence.tolerance import FP32_TOLERANCE

TOKENS, TEMPLATES = 12, 2


def protenix_template_features(batch: dict) -> dict:
    """Protenix's template inputs of sample 0 from featurecache's features (before its multichain
    mask, which Protenix applies itself to the masks and unit vectors; the distogram it reads as
    given, so it gets featurecache's masked one)."""
    distogram, pb_mask, unit, backbone_mask = [], [], [], []
    for index in range(batch["template_mask"].shape[1]):
        features = template_pair_features(batch, index)[0]  # [N, N, 108], chain-masked
        distogram.append(features[..., :39])
        pb = batch["template_pseudo_beta_mask"][0, index]
        pb_mask.append((pb[:, None] & pb[None, :]).float())
        bb = batch["template_backbone_mask"][0, index].all(dim=-1)
        backbone_mask.append((bb[:, None] & bb[None, :]).float())
        unit.append(features[..., 40:43])  # zero across chains, where Protenix's mask zeroes it too
    return {"template_distogram": torch.stack(distogram), "template_pseudo_beta_mask": torch.stack(pb_mask),
            "template_unit_vector": torch.stack(unit), "template_backbone_frame_mask": torch.stack(backbone_mask),
            "template_aatype": batch["template_restype"][0].long(), "asym_id": batch["asym_id"][0]}


def test_template_embedder(generator):
    from protenix.model.modules.pairformer import PairformerBlock as ProtenixPairformerBlock
    from protenix.model.modules.pairformer import TemplateEmbedder as ProtenixTemplateEmbedder

    config = featurecache_config()
    theirs = ProtenixTemplateEmbedder(n_blocks=config.templates.template_blocks, c=config.templates.c_template, c_z=config.trunk.c_z,
                                      num_intermediate_factor=config.templates.template_transition_expansion, dropout=0.0)
    # its PairformerStack builds blocks at AF3's fixed pair sizes: rebuilt at featurecache's
    theirs.pairformer_stack.blocks = torch.nn.ModuleList(
        ProtenixPairformerBlock(c_z=config.templates.c_template, c_s=0, c_hidden_mul=config.templates.c_template,
                                c_hidden_pair_att=config.templates.template_pair_head_dim,
                                no_heads_pair=config.templates.template_pair_heads,
                                num_intermediate_factor=config.templates.template_transition_expansion, dropout=0.0)
        for _ in range(config.templates.template_blocks))
    ours = TemplateEmbedder(config)
    randomise(theirs, generator)
    copy_weights(theirs, ours, template_embedder_map(config.templates.template_blocks, NUM_RESTYPES))
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
