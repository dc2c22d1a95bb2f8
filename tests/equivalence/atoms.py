"""One small atom batch as both models read it: featurecache's collated batch and Protenix's
input_feature_dict (unbatched, one-hot element (H first, as its featurizer encodes it) and name
characters, its trunked atom pairs)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from featurecache.model.network.atom_attention import NAME_CHAR_CLASSES, NUM_ELEMENTS, AtomWindows
from featurecache.testing.protenix import protenix_element_index
from featurecache.testing.synthetic import random_batch

# 40 tokens of 5 atoms (the last two one-atom ligands): 192 atoms, 6 windows of 32 queries whose
# 128 keys run past both ends of the atoms (sequence-local attention with padded keys)
TOKENS = 40
ATOMS_PER_TOKEN = 5


def atom_batch(generator: torch.Generator, masked_reference_atoms: bool = False) -> dict:
    """featurecache's batch of one sample (no padding: Protenix runs unpadded), charges from -2 to
    2 (where arcsinh(q) differs from q), and with `masked_reference_atoms` a few atoms whose
    reference conformer is missing (ref_mask False: ref_pos zero, as featurizers leave them)."""
    batch = random_batch([TOKENS], [4], [1], generator, num_atoms_per_token=ATOMS_PER_TOKEN)
    atoms = batch["atom_to_token"].shape[1]
    batch["ref_charge"] = torch.randint(-2, 3, (1, atoms), generator=generator)
    if masked_reference_atoms:
        masked = torch.rand(1, atoms, generator=generator) < 0.15
        batch["ref_mask"] = batch["ref_mask"] & ~masked
        batch["ref_pos"] = torch.where(masked.unsqueeze(-1), 0.0, batch["ref_pos"])
    return batch


def protenix_inputs(batch: dict) -> dict:
    """Protenix's input_feature_dict for sample 0, with its d_lm, v_lm and pad_info computed by its
    own update_input_feature_dict (Algorithm 5, lines 1-3)."""
    from protenix.model.protenix import update_input_feature_dict

    features = {
        "ref_pos": batch["ref_pos"][0].float(),
        "ref_charge": batch["ref_charge"][0].float(),
        "ref_mask": batch["ref_mask"][0].float(),
        "ref_element": F.one_hot(protenix_element_index(batch["ref_element"][0]), NUM_ELEMENTS).float(),
        "ref_atom_name_chars": F.one_hot(batch["ref_atom_name_chars"][0].long(), NAME_CHAR_CLASSES).float(),
        "ref_space_uid": batch["ref_space_uid"][0].long(),
        "atom_to_token_idx": batch["atom_to_token"][0].long(),
    }
    return update_input_feature_dict(features)


def encoder_arguments(features: dict) -> dict:
    """Protenix's AtomAttentionEncoder keyword arguments from its input_feature_dict."""
    names = (
        "atom_to_token_idx",
        "ref_pos",
        "ref_charge",
        "ref_mask",
        "ref_atom_name_chars",
        "ref_element",
        "d_lm",
        "v_lm",
        "pad_info",
    )
    return {name: features[name] for name in names}


def windows_of(batch: dict, config) -> AtomWindows:
    return AtomWindows(
        batch["atom_pad_mask"], config.atom_attention.atom_window_queries, config.atom_attention.atom_window_keys
    )
