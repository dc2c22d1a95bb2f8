"""ProtenixDataset's examples against Protenix's own featurizer, feature by feature.

Protenix 2.0's parser, tokenizer and Featurizer run on the CPU (featurecache.testing.
protenix_featurizer) on the same mmCIF and are given the tokens of featurecache's crop; every
feature, label and full-complex label must then equal the adapter's, but for the differences
the README lists ("Protenix's trainer on the cache"), each checked here for what it is:
reference conformers (featurecache's own), frames of one-atom tokens (the nearest atoms in those
conformers), atom permutations (Protenix's include every graph automorphism, featurecache's are
AF3's symmetries: each of featurecache's must be one of Protenix's) and arginine's NH1 / NH2
(Protenix's parser renames them to the PDB convention).

Targets: 2q2k (protein-DNA with 5-iodouracil, a modified residue tokenized per atom), 5h73
(protein with FMN, orotate and an inhibitor) and 1ncb (three protein chains, glycans bonded to
asparagine: one molecule across chains, a ligand-polymer bond); the MegaFold assembly files of
the other tests lack the _entity_poly_seq Protenix's parser requires.
"""

from __future__ import annotations

import itertools
import shutil

import numpy as np
import pytest
import torch

from featurecache.testing.protenix import import_protenix
from featurecache.testing.protenix_featurizer import (
    ccd_codes,
    import_protenix_data,
    protenix_bioassembly,
    protenix_features,
    use_bundled_ccd,
)
from tests.integrations.protenix_model import OPTIONAL_KEYS, train_step

FILES = {"2q2k": "structures/2q2k.cif", "5h73": "bonded/5h73.cif", "1ncb": "bonded/1ncb.cif"}
CROP = 96
SEED = 5  # crops that hold 5IU atoms (2q2k), ligands (5h73) and an asparagine-NAG bond (1ncb)
# compared on their own terms below; everything else must be equal
OWN_TERMS = {"ref_pos", "frame_atom_index", "atom_perm_list"}


@pytest.fixture(scope="module", autouse=True)
def _protenix():
    """Protenix or its data modules' dependencies missing fail these tests with the fix."""
    import_protenix()
    import_protenix_data()


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, shared_data):
    folder = tmp_path_factory.mktemp("protenix-featurizer-inputs")
    for target, path in FILES.items():
        shutil.copy(shared_data / path, folder / f"{target}.cif")
    return folder


@pytest.fixture(scope="module")
def datasets(inputs, tmp_path_factory):
    """One dataset per target (each its item 0, so a target's crop does not depend on the others)."""
    from featurecache.integrations.protenix import ProtenixDataset
    from featurecache.precompute.pipeline import PrecomputeOptions, precompute

    cache = tmp_path_factory.mktemp("protenix-featurizer-cache") / "cache"
    summary = precompute(
        PrecomputeOptions(inputs=[inputs], cache_dir=cache, num_workers=1, progress=False, executor="inline")
    )
    assert summary.failed == 0, summary.format()
    return {
        target: ProtenixDataset(
            cache, crop_size=CROP, msa_rows_per_sample=4, augment_conformers=False, seed=SEED, ids=[target]
        )
        for target in FILES
    }


def as_numpy(value) -> np.ndarray:
    return value.numpy() if isinstance(value, torch.Tensor) else np.asarray(value)


def residue_permutations(permutations: list[list[int]], uid: np.ndarray) -> list[set[tuple[int, ...]]]:
    """Per residue (a run of one ref_space_uid), its atom permutations as a set of tuples."""
    starts = np.flatnonzero(np.r_[True, uid[1:] != uid[:-1]]).tolist() + [len(uid)]
    return [set(map(tuple, np.array(permutations[start:end]).T.tolist())) for start, end in itertools.pairwise(starts)]


@pytest.mark.parametrize("target", sorted(FILES))
def test_examples_equal_protenixs_featurizer(target, datasets, inputs, tmp_path):
    mmcif = inputs / f"{target}.cif"
    use_bundled_ccd(ccd_codes(mmcif), tmp_path)
    dataset = datasets[target]
    sample, example = dataset.cache[0], dataset[0]
    record, meta = dataset.cache.load_arrays(target)
    bioassembly = protenix_bioassembly(mmcif, meta["chain_ids"])
    assert len(bioassembly["token_array"]) == len(record["restype"])  # the same tokens, whole target
    reference = protenix_features(bioassembly, sample["token_index"].numpy(), "spatial" in sample["crop_mode"])

    ours, theirs = example["input_feature_dict"], reference["input_feature_dict"]
    assert set(theirs) <= set(ours), sorted(set(theirs) - set(ours))
    for name in sorted(set(theirs) - OWN_TERMS):
        assert ours[name].shape == theirs[name].shape, name
        assert np.array_equal(as_numpy(ours[name]).astype(np.float64), as_numpy(theirs[name]).astype(np.float64)), name
    # the ground truth, cropped and of every copy: equal but arginine's NH1 / NH2, which
    # Protenix's parser renames to the PDB convention (its fix_arginine)
    for group in ("label_dict", "label_full_dict"):
        for name, value in reference[group].items():
            if name != "coordinate":
                assert np.array_equal(as_numpy(example[group][name]), as_numpy(value)), (group, name)
        residue_names, atom_names = reference["names"][group]
        mine, its = as_numpy(example[group]["coordinate"]), as_numpy(reference[group]["coordinate"])
        moved = np.flatnonzero(np.abs(mine - its).max(-1) > 0)
        assert all(residue_names[atom] == "ARG" and atom_names[atom] in ("NH1", "NH2") for atom in moved), moved
        for first, second in zip(moved[::2], moved[1::2]):  # NH1 then NH2 of one arginine: swapped
            assert np.array_equal(mine[first], its[second]) and np.array_equal(mine[second], its[first])

    # frames: equal on every residue token; a one-atom token's come from the reference conformer
    atom_to_token = as_numpy(ours["atom_to_token_idx"])
    multi_atom = np.bincount(atom_to_token, minlength=CROP) > 1
    assert np.array_equal(
        as_numpy(ours["frame_atom_index"])[multi_atom], as_numpy(theirs["frame_atom_index"])[multi_atom]
    )
    # symmetries: each of featurecache's is one Protenix has too
    uid = as_numpy(ours["ref_space_uid"])
    for mine_per_residue, its_per_residue in zip(
        residue_permutations(ours["atom_perm_list"], uid), residue_permutations(theirs["atom_perm_list"], uid)
    ):
        assert mine_per_residue <= its_per_residue
    assert ours["ref_pos"].shape == theirs["ref_pos"].shape


def test_the_crops_cover_what_differs_between_molecule_kinds(datasets, protenix_model):
    """The seed's crops hold what these comparisons are for (else they would compare less), and
    Protenix's bond loss trains on 1ncb's asparagine-NAG bond."""
    examples = {target: dataset[0]["input_feature_dict"] for target, dataset in datasets.items()}
    assert examples["2q2k"]["modified_res_mask"].sum() > 0  # 5-iodouracil, per atom
    assert examples["5h73"]["is_ligand"].sum() > 0
    glycosylated = examples["1ncb"]
    assert glycosylated["bond_mask"].sum() == 2  # one asparagine-NAG bond, both directions
    assert len(torch.unique(glycosylated["asym_id"])) == 2 and len(torch.unique(glycosylated["mol_id"])) == 1
    terms, missing = train_step(protenix_model, datasets["1ncb"][0], step=3)
    assert missing <= OPTIONAL_KEYS and np.isfinite(list(terms.values())).all(), (missing, terms)
    assert terms["bond_loss"] > 0
