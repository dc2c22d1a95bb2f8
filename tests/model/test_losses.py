"""Structure losses against cases computed by hand (AF3 SI 4.2, Algorithms 27-28)."""

import math

import pytest
import torch

from featurecache.model.network.atoms import (
    dense_token_bonds,
    mean_over_token_atoms,
    token_bond_atoms,
)
from featurecache.model.objectives.losses import (
    aligned_mse_loss,
    bond_loss,
    edm_loss_weight,
    mse_atom_weights,
    smooth_lddt_loss,
)


def _rotation(generator: torch.Generator) -> torch.Tensor:
    q, r = torch.linalg.qr(torch.randn(3, 3, generator=generator, dtype=torch.float64))
    q = q * torch.sign(torch.diagonal(r))
    return q if torch.linalg.det(q) > 0 else -q


def test_aligned_mse_on_a_stretched_pair():
    """True atoms at x = -1, +1; predicted at -2, +2: the alignment is the identity and each atom
    is off by 1 A, so the loss is sum(w * 1) / 2 atoms / 3."""
    true = torch.tensor([[[-1.0, 0, 0], [1.0, 0, 0], [0.0, 0.0, 0.0]]])
    predicted = torch.tensor([[[[-2.0, 0, 0], [2.0, 0, 0], [50.0, 3.0, 1.0]]]])  # third atom unresolved
    resolved = torch.tensor([[True, True, False]])
    no = torch.zeros(1, 3, dtype=torch.bool)
    protein = mse_atom_weights(no, no, no, resolved)
    ligand = mse_atom_weights(no, no, torch.ones(1, 3, dtype=torch.bool), resolved)
    torch.testing.assert_close(protein, torch.tensor([[1.0, 1.0, 0.0]]))
    torch.testing.assert_close(aligned_mse_loss(predicted, true, protein, resolved), torch.tensor([[1 / 3]]))
    torch.testing.assert_close(aligned_mse_loss(predicted, true, ligand, resolved), torch.tensor([[11 / 3]]))
    dna = mse_atom_weights(torch.ones(1, 3, dtype=torch.bool), no, no, resolved)
    torch.testing.assert_close(dna, torch.tensor([[6.0, 6.0, 0.0]]))


def test_aligned_mse_is_zero_for_a_moved_copy():
    generator = torch.Generator().manual_seed(5)
    true = torch.randn(1, 9, 3, generator=generator, dtype=torch.float64)
    predicted = (true @ _rotation(generator).T + 3.0).unsqueeze(1)
    resolved = torch.ones(1, 9, dtype=torch.bool)
    loss = aligned_mse_loss(predicted, true, resolved.double(), resolved)
    assert loss.abs().max() < 1e-10


def _sigmoid_score(error: float) -> float:
    return sum(1 / (1 + math.exp(-(c - error))) for c in (0.5, 1.0, 2.0, 4.0)) / 4


def test_smooth_lddt_of_identical_structures_is_its_floor():
    """Algorithm 27 scores an exact pair 1/4 sum_c sigmoid(c), not 1: identical structures give
    1 - that, the lowest value the loss takes."""
    generator = torch.Generator().manual_seed(1)
    true = torch.randn(1, 6, 3, generator=generator) * 3
    resolved = torch.ones(1, 6, dtype=torch.bool)
    nucleotide = torch.zeros(1, 6, dtype=torch.bool)
    floor = 1 - _sigmoid_score(0.0)
    same = smooth_lddt_loss(true.unsqueeze(1), true, nucleotide, resolved)
    torch.testing.assert_close(same, torch.tensor([[floor]]))
    moved = true.unsqueeze(1) + 0.3 * torch.randn(1, 1, 6, 3, generator=generator)
    assert smooth_lddt_loss(moved, true, nucleotide, resolved) > same


def test_smooth_lddt_of_a_known_perturbation():
    """Three atoms on a line at 0, 10, 20 A; the last moves to 22 A in the prediction. Pairs
    within 15 A: (0,1), (1,2) both ways; (0,2) at 20 A is out unless atom l is a nucleotide."""
    true = torch.tensor([[[0.0, 0, 0], [10.0, 0, 0], [20.0, 0, 0]]])
    predicted = torch.tensor([[[[0.0, 0, 0], [10.0, 0, 0], [22.0, 0, 0]]]])
    resolved = torch.ones(1, 3, dtype=torch.bool)
    protein = torch.zeros(1, 3, dtype=torch.bool)
    # pairs (0,1), (1,0) exact; (1,2), (2,1) off by 2
    expected = 1 - (2 * _sigmoid_score(0.0) + 2 * _sigmoid_score(2.0)) / 4
    torch.testing.assert_close(smooth_lddt_loss(predicted, true, protein, resolved), torch.tensor([[expected]]))
    # atom 0 a nucleotide: (0,2) joins (radius 30 for l = 0), off by 2; (2,0) stays out
    nucleotide = torch.tensor([[True, False, False]])
    expected = 1 - (2 * _sigmoid_score(0.0) + 3 * _sigmoid_score(2.0)) / 5
    torch.testing.assert_close(smooth_lddt_loss(predicted, true, nucleotide, resolved), torch.tensor([[expected]]))
    # atom 2 unresolved: only (0,1), (1,0) remain
    resolved[0, 2] = False
    torch.testing.assert_close(
        smooth_lddt_loss(predicted, true, protein, resolved), torch.tensor([[1 - _sigmoid_score(0.0)]])
    )


def test_bond_loss_is_the_mean_squared_length_error():
    true = torch.tensor([[[0.0, 0, 0], [1.5, 0, 0], [3.0, 0, 0]]])
    predicted = torch.tensor([[[[0.0, 0, 0], [2.0, 0, 0], [3.0, 1.0, 0]]]])
    bonds = torch.tensor([[[0, 1], [1, 2], [-1, -1]]])
    # bond (0,1): 2.0 vs 1.5; bond (1,2): sqrt(2) vs 1.5
    expected = (0.5**2 + (math.sqrt(2) - 1.5) ** 2) / 2
    torch.testing.assert_close(bond_loss(predicted, true, bonds), torch.tensor([[expected]]))
    assert bond_loss(predicted, true, torch.full((1, 2, 2), -1)).item() == 0.0


def test_edm_loss_weight_matches_its_formula():
    sigma = torch.tensor([16.0, 4.0, 160.0])
    expected = torch.tensor([2 / 16.0**2, (16 + 256) / (64.0**2), (160.0**2 + 256) / (160.0 * 16) ** 2])
    torch.testing.assert_close(edm_loss_weight(sigma, 16.0), expected)


def test_token_bonds_become_the_closest_atom_pair():
    """Token 0 is a residue of three atoms, token 1 a one-atom ligand bonded to it; the bond is
    the residue atom nearest the ligand atom in the ground truth."""
    atom_to_token = torch.tensor([[0, 0, 0, 1, 0]])
    atom_pad_mask = torch.tensor([[True, True, True, True, False]])
    atom_pos = torch.tensor([[[0.0, 0, 0], [1.5, 0, 0], [3.0, 0, 0], [4.6, 0, 0], [4.5, 0, 0]]])
    resolved = atom_pad_mask.clone()
    bonds = torch.tensor([[[0, 1], [-1, -1]]])
    bond_mask = torch.tensor([[True, False]])
    pairs = token_bond_atoms(bonds, bond_mask, atom_to_token, atom_pad_mask, atom_pos, resolved)
    assert pairs.tolist() == [[[2, 3], [-1, -1]]]
    reversed_pairs = token_bond_atoms(bonds.flip(-1), bond_mask, atom_to_token, atom_pad_mask, atom_pos, resolved)
    assert reversed_pairs.tolist() == [[[3, 2], [-1, -1]]]
    resolved[0, 2] = False  # its nearest atom unresolved: the next one
    pairs = token_bond_atoms(bonds, bond_mask, atom_to_token, atom_pad_mask, atom_pos, resolved)
    assert pairs.tolist() == [[[1, 3], [-1, -1]]]
    resolved[0, 3] = False  # the ligand atom unresolved: no bond to score
    pairs = token_bond_atoms(bonds, bond_mask, atom_to_token, atom_pad_mask, atom_pos, resolved)
    assert pairs.tolist() == [[[-1, -1], [-1, -1]]]
    dense = dense_token_bonds(bonds, bond_mask, 3)
    assert dense[0].nonzero().tolist() == [[0, 1], [1, 0]]


def test_mean_over_token_atoms_skips_padding():
    values = torch.tensor([[[1.0], [3.0], [10.0], [99.0]]])
    atom_to_token = torch.tensor([[0, 0, 1, 0]])
    pad = torch.tensor([[True, True, True, False]])
    torch.testing.assert_close(
        mean_over_token_atoms(values, atom_to_token, pad, 3), torch.tensor([[[2.0], [10.0], [0.0]]])
    )


@pytest.mark.parametrize("listed", [True, False])
def test_smooth_lddt_on_the_cpu_path_equals_the_float64_dense_sums(listed, monkeypatch):
    """On the CPU the loss lists the included pairs (losses.LISTED_PAIR_DEVICES); elsewhere it
    sums dense [A, A] terms. Either way: the float64 dense reference's loss and gradient, to the
    rounding of fp32 sums over the A^2 pairs, on two targets with unresolved and nucleotide atoms."""
    from featurecache.kernels.smooth_lddt import inclusion_radius, smooth_lddt_sums_reference
    from featurecache.model.objectives import losses
    from featurecache.testing.compare import rel_error, summation_tolerance

    monkeypatch.setattr(losses, "LISTED_PAIR_DEVICES", ("cpu",) if listed else ())
    generator = torch.Generator().manual_seed(7)
    batch, samples, atoms = 2, 3, 150
    true = torch.rand(batch, atoms, 3, generator=generator) * 6.0 * atoms ** (1 / 3)  # protein-dense
    predicted = true[:, None] + torch.randn(batch, samples, atoms, 3, generator=generator) * 1.5
    resolved = torch.rand(batch, atoms, generator=generator) < 0.85
    is_nucleotide = torch.rand(batch, atoms, generator=generator) < 0.3
    upstream = torch.randn(batch, samples, generator=generator)

    reference_input = predicted.double().requires_grad_()
    sums, count = smooth_lddt_sums_reference(
        reference_input, true.double(), inclusion_radius(is_nucleotide, resolved).double()
    )
    expected = 1.0 - sums / count[:, None]
    (expected * upstream.double()).sum().backward()
    actual_input = predicted.clone().requires_grad_()
    actual = smooth_lddt_loss(actual_input, true, is_nucleotide, resolved)
    (actual * upstream).sum().backward()
    tolerance = summation_tolerance(torch.float32, atoms * atoms)
    assert 0 < count.min() < atoms * (atoms - 1)  # some pairs in, some out
    assert rel_error(actual, expected) <= tolerance
    assert rel_error(actual_input.grad, reference_input.grad) <= tolerance
