"""featurecache's diffusion module (AF3 Algorithms 20-22) against Protenix 2.0's, at noise levels
from the sampler's last steps to its first, in one call (one level per diffusion sample)."""

import pytest
import torch

from featurecache.model.network.diffusion import DiffusionModule
from featurecache.model.network.embedders import atom_single_input_dim
from featurecache.testing.compare import rel_error
from featurecache.testing.protenix import (
    copy_weights,
    diffusion_module_map,
    protenix_atom_transformer_with_keys_normalised_from_input,
    protenix_atom_transformer_without_cross_attention,
    randomise,
)

from tests.equivalence.atoms import atom_batch, protenix_inputs, windows_of
from tests.equivalence.settings import featurecache_config
from tests.equivalence.tolerance import FP32_TOLERANCE


# sigma in Angstrom: 160 sigma_data * 4e-4 (the sampler's last), 1, sigma_data 16, 160 sigma_data
NOISE_LEVELS = (16.0 * 4e-4, 1.0, 16.0, 16.0 * 160.0)


@pytest.mark.parametrize("keys", ["one_adaln", "af3", "protenix"])
def test_diffusion_module_at_several_noise_levels(generator, keys):
    """The atom transformers' keys: "one_adaln" (atom_key_adaln False) against Protenix's with its
    cross_attention_mode off; "af3" (atom_key_adaln, featurecache's default) against Protenix's
    layernorm_kv fed the block's input; "protenix" (atom_key_adaln_nested, its dialect) against
    Protenix's own, unmodified."""
    from protenix.model.modules.diffusion import DiffusionModule as ProtenixDiffusionModule
    from protenix.model.modules.embedders import RelativePositionEncoding

    # Protenix fixes its noise embedding at 256 channels
    config = featurecache_config(
        fourier_dim=256, atom_key_adaln=keys != "one_adaln", atom_key_adaln_nested=keys == "protenix"
    )
    c_s_inputs = atom_single_input_dim(config)
    theirs = ProtenixDiffusionModule(
        sigma_data=config.diffusion.sigma_data,
        c_atom=config.atom_attention.c_atom,
        c_atompair=config.atom_attention.c_atompair,
        c_token=config.diffusion.c_token_diffusion,
        c_s=config.trunk.c_s,
        c_z=config.trunk.c_z,
        c_s_inputs=c_s_inputs,
        atom_encoder={"n_blocks": config.atom_attention.atom_blocks, "n_heads": config.atom_attention.atom_heads},
        transformer={"n_blocks": config.diffusion.diffusion_blocks, "n_heads": config.diffusion.diffusion_heads},
        atom_decoder={"n_blocks": config.atom_attention.atom_blocks, "n_heads": config.atom_attention.atom_heads},
    )
    for encoder_or_decoder in (theirs.atom_attention_encoder, theirs.atom_attention_decoder):
        if keys == "af3":
            protenix_atom_transformer_with_keys_normalised_from_input(encoder_or_decoder.atom_transformer)
        elif keys == "one_adaln":
            protenix_atom_transformer_without_cross_attention(encoder_or_decoder.atom_transformer, config)
    ours = DiffusionModule(config, c_s_inputs)
    randomise(theirs, generator)
    copy_weights(theirs, ours, diffusion_module_map(config))
    theirs.eval(), ours.eval()

    batch = atom_batch(generator)
    # an A2B complex: chains 1 and 2 copies of entity 1, chain 3 of entity 2, where gating the
    # chain offset on the entity (AF3, Protenix) and on the chain (the supplement) differ
    tokens = batch["restype"].shape[1]
    chain = (torch.arange(tokens) >= tokens * 2 // 5).long() + (torch.arange(tokens) >= tokens * 4 // 5).long()
    batch["asym_id"] = (chain + 1)[None]
    batch["entity_id"] = torch.tensor([1, 1, 2])[chain][None]
    batch["sym_id"] = torch.tensor([1, 2, 1])[chain][None]
    atoms = batch["atom_to_token"].shape[1]
    features = protenix_inputs(batch)
    features.update(
        {name: batch[name][0] for name in ("asym_id", "residue_index", "entity_id", "sym_id", "token_index")}
    )
    features = RelativePositionEncoding(config.trunk.relpos_max_residue, config.trunk.relpos_max_chain).generate_relp(
        features
    )
    s_inputs = torch.randn(1, tokens, c_s_inputs, generator=generator)
    trunk_single = torch.randn(1, tokens, config.trunk.c_s, generator=generator)
    trunk_pair = torch.randn(1, tokens, tokens, config.trunk.c_z, generator=generator)
    sigma = torch.tensor([NOISE_LEVELS])  # [B 1, S]
    truth = batch["atom_pos"][:, None]
    noisy = truth + sigma[..., None, None] * torch.randn(1, len(NOISE_LEVELS), atoms, 3, generator=generator)
    with torch.no_grad():
        denoised_theirs = theirs(
            noisy[0], sigma[0], features, s_inputs[0], trunk_single[0], trunk_pair[0], pair_z=None, p_lm=None, c_l=None
        )
        context = ours.prepare(batch, windows_of(batch, config), s_inputs, trunk_single, trunk_pair)
        denoised_ours = ours(noisy, sigma, context)
    for sample, level in enumerate(NOISE_LEVELS):
        # the network's part, c_out F: the c_skip x_noisy both add would hide it at low noise
        skip = config.diffusion.sigma_data**2 / (config.diffusion.sigma_data**2 + level**2) * noisy[0, sample]
        error = rel_error(denoised_ours[0, sample] - skip, denoised_theirs[sample] - skip)
        assert error <= FP32_TOLERANCE, f"sigma {level}: {error}"
