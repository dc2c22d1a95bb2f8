"""The featurecache settings every comparison here builds its modules with.

Where AF3's code and the supplement differ, featurecache has a ModelConfig setting whose default
is AF3's behaviour (docs/FIDELITY.md). PROTENIX_MATCHING names the values that make featurecache
compute what Protenix 2.0 computes, per the table there; every module below is built from
`featurecache_config()`, so a comparison reads featurecache's real behaviour, not an input or
weight remapped to imitate it."""

from featurecache.model.config import ModelConfig
from featurecache.testing.protenix import equivalence_config

# ModelConfig fields set to Protenix's behaviour for every featurecache module built here
PROTENIX_MATCHING: dict = {
    "ref_charge_arcsinh": True,  # Protenix (as AF3) embeds arcsinh(ref_charge)
    "atom_cond_ref_mask": True,  # ... and multiplies the atom conditioning by ref_mask
    "relpos_chain_gate": "entity",  # ... and gates the chain offset on the same entity
    "distogram_min": 2.3125,  # DistogramLoss: min_bin, max_bin, 64 bins
    "distogram_max": 21.6875,
    "distogram_bins": 64,
    # Protenix's cross_attention_mode nests the keys' AdaLN on the queries' output,
    # AdaLN_kv(AdaLN_q(a, s), s), where AF3 (atom_key_adaln=True) normalises a itself: no setting
    # is Protenix's. The comparisons run Protenix's atom transformers with the mode off (one AdaLN,
    # its own code), which is featurecache's False; those of True (AF3's) pass it themselves and
    # feed Protenix's layernorm_kv the block's input.
    "atom_key_adaln": False,
}


def featurecache_config(**overrides) -> ModelConfig:
    """equivalence_config with PROTENIX_MATCHING and a comparison's own `overrides` (sizes
    Protenix fixes)."""
    return equivalence_config(**{**PROTENIX_MATCHING, **overrides})
