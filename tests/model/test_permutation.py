"""Permutation alignment of the ground truth (AF3 SI 4.2) on a real homodimer, PDB 721P (two H-Ras
chains, each with its GNP and MG): a swap of the two copies of every entity is undone, as are a
flipped ASP carboxylate, a flipped PHE ring and a rotated GNP gamma-phosphate; inputs without
anything to permute come back unchanged, and the loss never rises."""

import math

import numpy as np
import pytest
import torch

from featurecache.features.symmetry import atom_permutations
from featurecache.features.tokenize import tokenize
from featurecache.io.mmcif import read_mmcif
from featurecache.model import preset
from featurecache.model.af3 import AF3Model
from featurecache.model.objectives.losses import aligned_mse_loss, smooth_lddt_loss
from featurecache.model.objectives.permutation import align_ground_truth, chain_layout
from featurecache.schema import RESTYPES
from featurecache.testing.synthetic import random_batch


@pytest.fixture(scope="module")
def arrays(shared_data):
    """721P with chain B (and its GNP and MG) turned by 20 degrees about its centre: the assembly
    is a crystal's two copies, exactly symmetric, where a chain swap is only a rigid motion of the
    whole; turned, one labelling of the truth fits a prediction and the other does not."""
    arrays = tokenize(read_mmcif(shared_data / "structures" / "721p-assembly1.cif")).arrays
    second = np.isin(arrays["asym_id"][arrays["atom_to_token"]], (4, 5, 6)) & arrays["atom_mask"]
    angle = math.radians(20)
    turn = np.array([[math.cos(angle), -math.sin(angle), 0], [math.sin(angle), math.cos(angle), 0], [0, 0, 1]])
    centre = arrays["atom_pos"][second].mean(axis=0)
    arrays["atom_pos"][second] = ((arrays["atom_pos"][second] - centre) @ turn.T + centre).astype(np.float32)
    return arrays


def _batch(arrays: dict) -> dict:
    """A one-sample batch of a whole record, as collate builds it."""
    batch = {name: torch.from_numpy(np.array(value)).unsqueeze(0) for name, value in arrays.items()}
    batch = {
        name: value.long() if not value.is_floating_point() and value.dtype != torch.bool else value
        for name, value in batch.items()
    }
    batch["atom_permutations"] = torch.from_numpy(atom_permutations(arrays)).long().unsqueeze(0)
    batch["token_pad_mask"] = torch.ones_like(batch["asym_id"], dtype=torch.bool)
    batch["atom_pad_mask"] = torch.ones_like(batch["atom_to_token"], dtype=torch.bool)
    batch["token_bond_mask"] = torch.ones(batch["token_bonds"].shape[:2], dtype=torch.bool)
    return batch


def _rotated(positions: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """positions moved by a random rotation and translation: a prediction in another frame."""
    generator = torch.Generator().manual_seed(seed)
    rotation, _ = torch.linalg.qr(torch.randn(3, 3, generator=generator, dtype=torch.float64))
    rotation = rotation * torch.sign(torch.linalg.det(rotation))
    return (positions.double() @ rotation.T + 20 * torch.randn(3, generator=generator, dtype=torch.float64)).float()


def _outputs(predicted: torch.Tensor) -> dict:
    return {"denoised_positions": predicted[:, None], "noise_level": torch.ones(predicted.shape[0], 1)}


def _atoms_of_chain(arrays: dict, asym: int) -> np.ndarray:
    return np.flatnonzero(arrays["asym_id"][arrays["atom_to_token"]] == asym)


def test_the_two_copies_of_each_721p_entity_are_interchangeable(arrays):
    layout = chain_layout(_batch(arrays))
    starts = layout["is_chain"][0].nonzero().squeeze(1).tolist()
    asym = arrays["asym_id"][starts].tolist()
    interchangeable = layout["interchangeable"][0][starts][:, starts]
    entity = torch.tensor(arrays["entity_id"][starts])
    assert asym == [1, 2, 3, 4, 5, 6]
    assert torch.equal(interchangeable, entity[:, None] == entity[None, :])


def test_a_swap_of_the_homodimer_chains_is_undone(arrays):
    batch = _batch(arrays)
    original, resolved = batch["atom_pos"].clone(), batch["atom_mask"].clone()
    predicted = _rotated(original)
    predicted[0, ~resolved[0]] = 0.0
    # the truth with chain A and B swapped, and their GNPs and MGs
    order = torch.arange(original.shape[1])
    for first, second in ((1, 4), (2, 5), (3, 6)):
        a, b = _atoms_of_chain(arrays, first), _atoms_of_chain(arrays, second)
        order[a], order[b] = torch.from_numpy(b), torch.from_numpy(a)
    swapped = dict(batch, atom_pos=original[:, order], atom_mask=resolved[:, order])
    assert not torch.equal(swapped["atom_pos"], original)
    aligned = align_ground_truth(swapped, _outputs(predicted))
    assert torch.equal(aligned["atom_pos"], original)
    assert torch.equal(aligned["atom_mask"], resolved)
    # the truth as it was is left alone
    unchanged = align_ground_truth(batch, _outputs(predicted))
    assert torch.equal(unchanged["atom_pos"], original) and torch.equal(unchanged["atom_mask"], resolved)


def _residue_atoms(arrays: dict, code: str, names: tuple[str, ...]) -> list[np.ndarray]:
    """Atom indices of `names` in every resolved residue `code` of chain A."""
    decoded = ["".join(chr(c + 32) for c in row if c) for row in arrays["ref_atom_name_chars"]]
    token_class = arrays["restype"][arrays["atom_to_token"]]
    found = []
    for uid in np.unique(arrays["ref_space_uid"][_atoms_of_chain(arrays, 1)]):
        atoms = np.flatnonzero(arrays["ref_space_uid"] == uid)
        if RESTYPES[token_class[atoms[0]]] != code:
            continue
        index = [atoms[[decoded[a] for a in atoms].index(name)] for name in names]
        if arrays["atom_mask"][index].all():
            found.append(np.array(index))
    return found


def test_flipped_side_chains_and_a_rotated_phosphate_are_undone(arrays):
    batch = _batch(arrays)
    original = batch["atom_pos"].clone()
    predicted = _rotated(original, seed=1)
    (asp, *_), (phe, *_) = (
        _residue_atoms(arrays, "ASP", ("OD1", "OD2")),
        _residue_atoms(arrays, "PHE", ("CD1", "CD2", "CE1", "CE2")),
    )
    gnp = _residue_atoms_of_ligand(arrays, ("O1G", "O2G", "O3G"))
    order = torch.arange(original.shape[1])
    order[asp] = torch.from_numpy(asp[[1, 0]])
    order[phe] = torch.from_numpy(phe[[1, 0, 3, 2]])
    order[gnp] = torch.from_numpy(gnp[[1, 2, 0]])
    flipped = dict(batch, atom_pos=original[:, order])
    moved = (flipped["atom_pos"] - original).norm(dim=-1)[0]
    assert (moved[np.concatenate([asp, phe, gnp])] > 1.0).all()  # each flip moves its atoms by over 1 A
    aligned = align_ground_truth(flipped, _outputs(predicted))
    assert torch.equal(aligned["atom_pos"], original)


def _residue_atoms_of_ligand(arrays: dict, names: tuple[str, ...]) -> np.ndarray:
    decoded = ["".join(chr(c + 32) for c in row if c) for row in arrays["ref_atom_name_chars"]]
    atoms = _atoms_of_chain(arrays, 3)  # chain A's GNP (chain 2 is its MG)
    return np.array([atoms[[decoded[a] for a in atoms].index(name)] for name in names])


def test_symmetries_the_loader_computes_for_721p(arrays):
    permutations = atom_permutations(arrays)
    decoded = ["".join(chr(c + 32) for c in row if c) for row in arrays["ref_atom_name_chars"]]
    moved: dict[str, set] = {}
    for atom, _column in zip(*np.nonzero((permutations >= 0) & (permutations != np.arange(len(decoded))[:, None]))):
        token = arrays["atom_to_token"][atom]
        code = "GNP" if arrays["is_ligand"][token] else RESTYPES[arrays["restype"][token]]
        moved.setdefault(code, set()).add(decoded[atom])
    expected = {
        "ASP": {"OD1", "OD2"},
        "GLU": {"OE1", "OE2"},
        "PHE": {"CD1", "CD2", "CE1", "CE2"},
        "TYR": {"CD1", "CD2", "CE1", "CE2"},
        "ARG": {"NH1", "NH2"},
        "GNP": {"O1G", "O2G", "O3G"},
    }
    for code, names in moved.items():  # and a chain's last residue its terminal carboxylate
        assert names == expected.get(code, set()) | ({"O", "OXT"} & names), code
    assert expected.keys() <= moved.keys()
    # the GNP's gamma-phosphate turns (two rotations), it is never mirrored; MG has none
    gnp = _atoms_of_chain(arrays, 3)
    assert ((permutations[gnp] >= 0).sum(axis=1) == 2).all()
    assert (permutations[_atoms_of_chain(arrays, 2)] == -1).all()


def test_inputs_without_symmetry_come_back_unchanged():
    generator = torch.Generator().manual_seed(int(torch.randint(0, 2**31 - 1, ())))
    batch = random_batch([14, 9], [3, 2], [0, 0], generator, num_atoms_per_token=3)
    noisy = batch["atom_pos"] + 2.0 * torch.randn(batch["atom_pos"].shape, generator=generator)
    aligned = align_ground_truth(batch, _outputs(noisy))
    assert torch.equal(aligned["atom_pos"], batch["atom_pos"])
    assert torch.equal(aligned["atom_mask"], batch["atom_mask"])


def _structure_losses(predicted, batch):
    resolved = batch["atom_mask"]
    mse = aligned_mse_loss(predicted[:, None], batch["atom_pos"], resolved.float(), resolved)
    lddt = smooth_lddt_loss(predicted[:, None], batch["atom_pos"], torch.zeros_like(resolved), resolved)
    return mse.item(), lddt.item()


def test_the_loss_after_alignment_is_no_larger(arrays):
    batch = _batch(arrays)
    original = batch["atom_pos"].clone()
    generator = torch.Generator().manual_seed(2)
    predicted = _rotated(original + 0.5 * torch.randn(original.shape, generator=generator), seed=2)
    order = torch.arange(original.shape[1])
    a, b = _atoms_of_chain(arrays, 1), _atoms_of_chain(arrays, 4)
    order[a], order[b] = torch.from_numpy(b), torch.from_numpy(a)
    for truth in (batch, dict(batch, atom_pos=original[:, order], atom_mask=batch["atom_mask"][:, order])):
        before = _structure_losses(predicted, truth)
        after = _structure_losses(predicted, align_ground_truth(truth, _outputs(predicted)))
        assert all(x <= y * (1 + 1e-6) for x, y in zip(after, before)), (after, before)
    assert after[0] < 0.1 * before[0]  # the swapped truth: the MSE falls from ~chain distances to the noise


def test_af3_model_loss_aligns_when_its_setting_is_on(arrays):
    """AF3Model.loss reads the aligned truth (config.loss.permutation_alignment), the same batch without."""
    batch = _batch(arrays)
    original = batch["atom_pos"].clone()
    order = torch.arange(original.shape[1])
    a, b = _atoms_of_chain(arrays, 1), _atoms_of_chain(arrays, 4)
    order[a], order[b] = torch.from_numpy(b), torch.from_numpy(a)
    swapped = dict(batch, atom_pos=original[:, order], atom_mask=batch["atom_mask"][:, order])
    predicted = _rotated(original, seed=3)
    losses = {}
    for setting in (True, False):
        config = preset("tiny", kernels="torch", confidence_head=False, permutation_alignment=setting)
        model = AF3Model(config)
        num_tokens = batch["restype"].shape[1]
        outputs = {
            **_outputs(predicted),
            "pair": torch.zeros(1, num_tokens, num_tokens, config.trunk.c_z),
            "distogram_logits": torch.zeros(1, num_tokens, num_tokens, config.trunk.distogram_bins),
        }
        losses[setting] = model.loss(swapped, outputs)[1]
    assert losses[True]["mse"] < 0.01 * losses[False]["mse"]
    assert losses[True]["smooth_lddt"] < losses[False]["smooth_lddt"]
    assert math.isfinite(losses[True]["loss"].item())


def test_af3_model_aligns_the_truth_to_its_mini_rollout_in_forward():
    """With the confidence head, forward aligns the truth to the mini-rollout and builds the
    diffusion batch from it, drawing its noise as without the alignment; the loss reads that truth."""
    seed = int(torch.randint(0, 2**31 - 1, ()))
    batch = random_batch([9], [3], [0], torch.Generator().manual_seed(seed), num_atoms_per_token=2)
    runs = {}
    for setting in (True, False):
        torch.manual_seed(0)
        model = AF3Model(preset("tiny", kernels="torch", confidence_rollout_steps=2, permutation_alignment=setting))
        runs[setting] = model(batch, num_cycles=1, diffusion_batch=2, generator=torch.Generator().manual_seed(seed))
    outputs = runs[True]
    expected = align_ground_truth(batch, {"rollout_positions": outputs["rollout_positions"]})
    assert torch.equal(outputs["aligned_atom_pos"], expected["atom_pos"])
    assert torch.equal(outputs["aligned_atom_mask"], expected["atom_mask"])
    assert "aligned_atom_pos" not in runs[False]
    # nothing to permute here: the same draws give the same diffusion batch either way
    assert torch.equal(outputs["denoised_positions"], runs[False]["denoised_positions"])
    assert torch.equal(outputs["rollout_positions"], runs[False]["rollout_positions"])
    assert torch.isfinite(model.loss(batch, outputs)[0])
