"""featurecache's atom attention encoder and decoder (AF3 Algorithms 5-7) against Protenix 2.0's.

Protenix's atom transformer runs with its cross_attention_mode off (one AdaLN for queries, keys
and values: featurecache's atom_key_adaln=False); its default nests a second AdaLN for the keys
and values on the queries', where AF3 and featurecache's default normalise the input itself
(docs/FIDELITY.md, "Protenix vs AlphaFold3"): a strict xfail below, and the same comparison with
featurecache's atom_key_adaln_nested (Protenix's dialect), which passes."""

import pytest
import torch

from featurecache.model.network.atom_attention import AtomAttentionDecoder, AtomAttentionEncoder
from featurecache.testing.compare import rel_error
from featurecache.testing.protenix import (
    atom_attention_decoder_map,
    atom_attention_encoder_map,
    copy_weights,
    protenix_atom_transformer_with_keys_normalised_from_input,
    protenix_atom_transformer_without_cross_attention,
    randomise,
)

from tests.equivalence.atoms import atom_batch, encoder_arguments, protenix_inputs, windows_of
from tests.equivalence.settings import featurecache_config
from tests.equivalence.tolerance import FP32_TOLERANCE


def encoders(config, generator, with_trunk: bool, keys_from_input: bool = False):
    """Protenix's encoder, its atom transformer's cross_attention_mode as the key AdaLN setting
    (on: Protenix's own, or with `keys_from_input` AF3's form; off: rebuilt), and featurecache's
    with its weights."""
    from protenix.model.modules.transformer import AtomAttentionEncoder as ProtenixAtomAttentionEncoder

    c_token = config.diffusion.c_token_diffusion if with_trunk else config.trunk.c_s
    theirs = ProtenixAtomAttentionEncoder(
        has_coords=with_trunk,
        c_token=c_token,
        c_atom=config.atom_attention.c_atom,
        c_atompair=config.atom_attention.c_atompair,
        c_s=config.trunk.c_s,
        c_z=config.trunk.c_z,
        n_blocks=config.atom_attention.atom_blocks,
        n_heads=config.atom_attention.atom_heads,
        n_queries=config.atom_attention.atom_window_queries,
        n_keys=config.atom_attention.atom_window_keys,
    )
    if not config.atom_attention.atom_key_adaln:
        protenix_atom_transformer_without_cross_attention(theirs.atom_transformer, config)
    elif keys_from_input:
        protenix_atom_transformer_with_keys_normalised_from_input(theirs.atom_transformer)
    ours = AtomAttentionEncoder(config, c_token=c_token, with_trunk=with_trunk)
    randomise(theirs, generator)
    copy_weights(theirs, ours, atom_attention_encoder_map(config, with_trunk))
    return theirs.eval(), ours.eval()


def test_encoder_of_the_input_embedder_with_charged_atoms(generator):
    config = featurecache_config()
    theirs, ours = encoders(config, generator, with_trunk=False)
    batch = atom_batch(generator)
    windows = windows_of(batch, config)
    with torch.no_grad():
        a_theirs, q_theirs, c_theirs, _ = theirs(**encoder_arguments(protenix_inputs(batch)))
        atom_cond, atom_pair = ours.condition(batch, windows)
        a_ours, q_ours, c_ours, _ = ours(batch, windows, atom_cond, atom_pair)
    assert rel_error(c_ours[0, 0], c_theirs) <= FP32_TOLERANCE
    assert rel_error(q_ours[0, 0], q_theirs) <= FP32_TOLERANCE
    assert rel_error(a_ours[0, 0], a_theirs) <= FP32_TOLERANCE


def test_encoder_with_masked_reference_atoms(generator):
    """Atoms without a reference conformer condition nothing (atom_cond_ref_mask, as Protenix)."""
    config = featurecache_config()
    theirs, ours = encoders(config, generator, with_trunk=False)
    batch = atom_batch(generator, masked_reference_atoms=True)
    windows = windows_of(batch, config)
    with torch.no_grad():
        a_theirs = theirs(**encoder_arguments(protenix_inputs(batch)))[0]
        a_ours = ours(batch, windows, *ours.condition(batch, windows))[0]
    assert rel_error(a_ours[0, 0], a_theirs) <= FP32_TOLERANCE


def test_encoder_of_the_diffusion_module_and_decoder(generator):
    """The diffusion module's encoder (trunk single and pair, noisy positions of 2 samples), and
    the decoder on its skips."""
    from protenix.model.modules.transformer import AtomAttentionDecoder as ProtenixAtomAttentionDecoder

    config = featurecache_config()
    theirs, ours = encoders(config, generator, with_trunk=True)
    decoder_theirs = ProtenixAtomAttentionDecoder(
        n_blocks=config.atom_attention.atom_blocks,
        n_heads=config.atom_attention.atom_heads,
        c_token=config.diffusion.c_token_diffusion,
        c_atom=config.atom_attention.c_atom,
        c_atompair=config.atom_attention.c_atompair,
        n_queries=config.atom_attention.atom_window_queries,
        n_keys=config.atom_attention.atom_window_keys,
    )
    protenix_atom_transformer_without_cross_attention(decoder_theirs.atom_transformer, config)
    decoder_ours = AtomAttentionDecoder(config, c_token=config.diffusion.c_token_diffusion)
    randomise(decoder_theirs, generator)
    copy_weights(decoder_theirs, decoder_ours, atom_attention_decoder_map(config))
    decoder_theirs.eval(), decoder_ours.eval()

    batch = atom_batch(generator)
    windows = windows_of(batch, config)
    atoms = batch["atom_to_token"].shape[1]
    trunk_single = torch.randn(1, batch["restype"].shape[1], config.trunk.c_s, generator=generator)
    trunk_pair = torch.randn(
        1, batch["restype"].shape[1], batch["restype"].shape[1], config.trunk.c_z, generator=generator
    )
    positions = torch.randn(1, 2, atoms, 3, generator=generator)  # 2 diffusion samples
    token_update = torch.randn(1, 2, batch["restype"].shape[1], config.diffusion.c_token_diffusion, generator=generator)
    features = protenix_inputs(batch)
    with torch.no_grad():
        a_theirs, q_theirs, c_theirs, p_theirs = theirs(
            **encoder_arguments(features), r_l=positions[0], s=trunk_single[0, None], z=trunk_pair[0, None]
        )
        atom_cond, atom_pair = ours.condition(batch, windows, trunk_single, trunk_pair)
        a_ours, q_ours, c_ours, p_ours = ours(batch, windows, atom_cond, atom_pair, positions)
        r_theirs = decoder_theirs(features["atom_to_token_idx"], token_update[0], q_theirs, c_theirs, p_theirs)
        r_ours = decoder_ours(batch, windows, token_update, q_ours, c_ours, p_ours)
    assert rel_error(q_ours[0], q_theirs) <= FP32_TOLERANCE
    assert rel_error(a_ours[0], a_theirs) <= FP32_TOLERANCE
    assert rel_error(r_ours[0], r_theirs) <= FP32_TOLERANCE


@pytest.mark.xfail(
    strict=True,
    reason="keys' AdaLN: Protenix's cross_attention_mode computes "
    "AdaLN_kv(AdaLN_q(a, s), s), AF3's code and featurecache's atom_key_adaln "
    "AdaLN_k(a, s): the weights map one to one, the functions differ (docs/FIDELITY.md)",
)
def test_encoder_with_the_keys_own_adaln(generator):
    """AF3's atom transformer (featurecache's default) against Protenix's own cross attention."""
    config = featurecache_config(atom_key_adaln=True)
    theirs, ours = encoders(config, generator, with_trunk=False)
    batch = atom_batch(generator)
    windows = windows_of(batch, config)
    with torch.no_grad():
        a_theirs = theirs(**encoder_arguments(protenix_inputs(batch)))[0]
        a_ours = ours(batch, windows, *ours.condition(batch, windows))[0]
    assert rel_error(a_ours[0, 0], a_theirs) <= FP32_TOLERANCE


@pytest.mark.parametrize("with_trunk", [False, True])
def test_encoder_with_protenix_nested_key_adaln(generator, with_trunk):
    """featurecache's atom_key_adaln_nested (Protenix's dialect) against Protenix's own atom
    transformer, unmodified: AdaLN_kv(AdaLN_q(a, s), s)."""
    config = featurecache_config(atom_key_adaln=True, atom_key_adaln_nested=True)
    theirs, ours = encoders(config, generator, with_trunk=with_trunk)
    batch = atom_batch(generator)
    windows = windows_of(batch, config)
    tokens = batch["restype"].shape[1]
    trunk = {}
    if with_trunk:
        trunk = {
            "s": torch.randn(1, tokens, config.trunk.c_s, generator=generator),
            "z": torch.randn(1, tokens, tokens, config.trunk.c_z, generator=generator),
            "r_l": torch.randn(1, batch["atom_to_token"].shape[1], 3, generator=generator),
        }
    with torch.no_grad():
        a_theirs = theirs(**encoder_arguments(protenix_inputs(batch)), **trunk)[0]
        if with_trunk:
            conditioning = ours.condition(batch, windows, trunk["s"], trunk["z"])
            a_ours = ours(batch, windows, *conditioning, trunk["r_l"][:, None])[0][0]
        else:
            a_ours = ours(batch, windows, *ours.condition(batch, windows))[0][0, 0]
    assert rel_error(a_ours, a_theirs) <= FP32_TOLERANCE


@pytest.mark.parametrize("with_trunk", [False, True])
def test_encoder_with_the_keys_own_adaln_as_af3(generator, with_trunk):
    """featurecache's default (atom_key_adaln, AF3's cross attention) against Protenix's atom
    transformer with its layernorm_kv fed the block's input: AF3's AdaLN_k(a, s) from Protenix's
    own layers."""
    config = featurecache_config(atom_key_adaln=True)
    theirs, ours = encoders(config, generator, with_trunk=with_trunk, keys_from_input=True)
    batch = atom_batch(generator)
    windows = windows_of(batch, config)
    tokens = batch["restype"].shape[1]
    trunk = {}
    if with_trunk:
        trunk = {
            "s": torch.randn(1, tokens, config.trunk.c_s, generator=generator),
            "z": torch.randn(1, tokens, tokens, config.trunk.c_z, generator=generator),
            "r_l": torch.randn(1, batch["atom_to_token"].shape[1], 3, generator=generator),
        }
    with torch.no_grad():
        a_theirs = theirs(**encoder_arguments(protenix_inputs(batch)), **trunk)[0]
        if with_trunk:
            conditioning = ours.condition(batch, windows, trunk["s"], trunk["z"])
            a_ours = ours(batch, windows, *conditioning, trunk["r_l"][:, None])[0][0]
        else:
            a_ours = ours(batch, windows, *ours.condition(batch, windows))[0][0, 0]
    assert rel_error(a_ours, a_theirs) <= FP32_TOLERANCE
