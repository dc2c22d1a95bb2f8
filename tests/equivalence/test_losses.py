"""featurecache's structure and confidence losses against Protenix 2.0's (protenix.model.loss), on
one sample with DNA, RNA, protein and ligand tokens, unresolved atoms and four predictions.

Each loss is compared per prediction (Protenix's reduction=None) where both give one value per
prediction, else after the same mean over predictions. Where Protenix's definition differs from
AF3's and featurecache's, the test says how it maps the difference (docs/FIDELITY.md)."""

import pytest
import torch

from featurecache.model.network.atoms import centre_atom_index
from featurecache.model.network.heads import distogram_loss
from featurecache.model.objectives.confidence_losses import confidence_losses, masked_cross_entropy, plddt_target
from featurecache.model.objectives.losses import aligned_mse_loss, bond_loss, mse_atom_weights, smooth_lddt_loss
from featurecache.testing.compare import rel_error
from featurecache.testing.synthetic import random_batch

from tests.equivalence.settings import featurecache_config
from tests.equivalence.tolerance import FP32_TOLERANCE

TOKENS, SAMPLES = 24, 4


@pytest.fixture(scope="module")
def case():
    """featurecache's batch, four predictions near the truth, and the atom-level views Protenix
    reads (unbatched)."""
    generator = torch.Generator().manual_seed(2033)
    batch = random_batch([TOKENS], [2], [0], generator, num_atoms_per_token=4)
    tokens = torch.arange(TOKENS)
    # tokens 0-3 DNA, 4-7 RNA, the rest protein but the last two (ligands)
    batch["is_dna"][0] = tokens < 4
    batch["is_rna"][0] = (tokens >= 4) & (tokens < 8)
    batch["is_protein"][0] &= tokens >= 8
    atoms = batch["atom_to_token"].shape[1]
    assert batch["atom_mask"][0].sum() < atoms, "some atoms are unresolved"
    predicted = batch["atom_pos"][:, None] + 1.5 * torch.randn(1, SAMPLES, atoms, 3, generator=generator)
    atom_to_token = batch["atom_to_token"][0]
    per_atom = {name: batch[name][0][atom_to_token] for name in ("is_dna", "is_rna", "is_ligand", "is_protein")}
    resolved = batch["atom_mask"][0] & batch["atom_pad_mask"][0]
    return {
        "batch": batch,
        "predicted": predicted,
        "per_atom": per_atom,
        "resolved": resolved,
        "true": batch["atom_pos"][0].float(),
        "generator": generator,
    }


def atom_mask_of(index: torch.Tensor, atoms: int) -> torch.Tensor:
    """[atoms] bool: True at the given atom indices (Protenix's *_rep_atom_mask)."""
    mask = torch.zeros(atoms, dtype=torch.bool)
    mask[index] = True
    return mask


def test_smooth_lddt_loss(case):
    from protenix.model.loss import SmoothLDDTLoss, compute_lddt_mask

    per_atom, resolved, true = case["per_atom"], case["resolved"], case["true"]
    is_nucleotide = per_atom["is_dna"] | per_atom["is_rna"]
    true_distance = torch.cdist(true, true)
    lddt_mask = compute_lddt_mask(true_distance, (resolved[:, None] & resolved[None, :]).float(), is_nucleotide)
    # Protenix averages over the predictions it is given: one at a time, for one value each
    theirs = torch.stack(
        [
            SmoothLDDTLoss(reduction=None).dense_forward(prediction[None], true, lddt_mask)
            for prediction in case["predicted"][0]
        ]
    )
    ours = smooth_lddt_loss(case["predicted"], true[None], is_nucleotide[None], resolved[None])
    assert rel_error(ours[0], theirs) <= FP32_TOLERANCE


def test_weighted_aligned_mse_loss(case):
    from protenix.model.loss import MSELoss

    per_atom, resolved = case["per_atom"], case["resolved"]
    theirs = MSELoss(reduction=None)(
        case["predicted"][0],
        case["true"],
        resolved.float(),
        per_atom["is_dna"].float(),
        per_atom["is_rna"].float(),
        per_atom["is_ligand"].float(),
    )
    weights = mse_atom_weights(per_atom["is_dna"], per_atom["is_rna"], per_atom["is_ligand"], resolved)
    ours = aligned_mse_loss(case["predicted"], case["true"][None], weights[None], resolved[None])
    # Protenix returns the mean over predictions (1/3 included, as featurecache's)
    assert rel_error(ours[0].mean(), theirs) <= FP32_TOLERANCE


def test_bond_loss(case):
    from protenix.model.loss import BondLoss

    resolved, atoms = case["resolved"], case["resolved"].shape[0]
    # bonds between resolved atoms: each atom to the next of its token, and the ligand's
    index = torch.arange(atoms - 1)
    pairs = torch.stack([index, index + 1], dim=-1)
    pairs = pairs[resolved[pairs].all(-1)][::3]
    bond_mask = torch.zeros(atoms, atoms)
    bond_mask[pairs[:, 0], pairs[:, 1]] = bond_mask[pairs[:, 1], pairs[:, 0]] = 1.0
    eps = 1e-6
    theirs = torch.stack(
        [  # one prediction at a time, as for the smooth LDDT
            BondLoss(eps=eps, reduction=None)(
                torch.cdist(prediction, prediction)[None],
                torch.cdist(case["true"], case["true"]),
                (resolved[:, None] & resolved[None, :]).float(),
                bond_mask,
            )
            for prediction in case["predicted"][0]
        ]
    )
    ours = bond_loss(case["predicted"], case["true"][None], pairs[None])
    # Protenix divides by sum(bond_mask + eps) over all A x A entries, i.e. by 2 E + eps A^2
    # (each bond is in both directions); featurecache (AF3's eq. 5) by E: rescaled here
    entries = bond_mask.sum()
    assert rel_error(ours[0] * entries / (entries + eps * atoms**2), theirs) <= FP32_TOLERANCE


def test_distogram_loss(case):
    from protenix.model.loss import DistogramLoss

    batch, generator = case["batch"], case["generator"]
    config = featurecache_config()
    logits = torch.randn(1, TOKENS, TOKENS, config.trunk.distogram_bins, generator=generator)
    representative = batch["distogram_atom_index"][0]
    # Protenix's own bins (its defaults, AF3's), featurecache's from its settings
    theirs = DistogramLoss(reduction=None)(
        logits[0], case["true"], case["resolved"].float(), atom_mask_of(representative, len(case["resolved"]))
    )
    positions = case["true"][representative][None]
    position_mask = case["resolved"][representative][None]
    ours = distogram_loss(logits, positions, position_mask, config.trunk.distogram_min, config.trunk.distogram_max)
    assert rel_error(ours, theirs) <= FP32_TOLERANCE


@pytest.fixture(scope="module")
def confidence_case(case):
    """Random logits of the four heads and featurecache's four confidence losses on them."""
    generator, batch = case["generator"], case["batch"]
    atoms = batch["atom_to_token"].shape[1]
    outputs = {
        "plddt_logits": torch.randn(1, SAMPLES, atoms, 50, generator=generator),
        "pae_logits": torch.randn(1, SAMPLES, TOKENS, TOKENS, 64, generator=generator),
        "pde_logits": torch.randn(1, SAMPLES, TOKENS, TOKENS, 64, generator=generator),
        "resolved_logits": torch.randn(1, SAMPLES, atoms, 2, generator=generator),
    }
    return outputs, confidence_losses(outputs, case["predicted"], batch)


def test_pae_loss(case, confidence_case):
    from protenix.model.loss import PAELoss

    outputs, ours = confidence_case
    batch = case["batch"]
    frame_atoms = batch["frame_atom_index"][0]
    has_frame = (frame_atoms >= 0).all(-1)
    centre = atom_mask_of(centre_atom_index(batch)[0], len(case["resolved"]))  # PAE's token atoms
    theirs = PAELoss(reduction=None)(
        outputs["pae_logits"][0],
        case["predicted"][0],
        case["true"],
        case["resolved"].float(),
        frame_atoms,
        centre,
        has_frame,
    )
    assert rel_error(ours["pae"], theirs) <= FP32_TOLERANCE


def test_pde_loss(case, confidence_case):
    from protenix.model.loss import PDELoss

    outputs, ours = confidence_case
    centre = atom_mask_of(centre_atom_index(case["batch"])[0], len(case["resolved"]))
    theirs = PDELoss(reduction=None)(
        outputs["pde_logits"][0], case["predicted"][0], case["true"], case["resolved"].float(), centre
    )
    assert rel_error(ours["pde"], theirs) <= FP32_TOLERANCE


def test_experimentally_resolved_loss(case, confidence_case):
    from protenix.model.loss import ExperimentallyResolvedLoss

    outputs, ours = confidence_case
    real = case["batch"]["atom_pad_mask"][0].float()
    theirs = ExperimentallyResolvedLoss(reduction=None)(outputs["resolved_logits"][0], case["resolved"].float(), real)
    assert rel_error(ours["resolved"], theirs) <= FP32_TOLERANCE


def test_plddt_target(case):
    """The per-atom lDDT both bin: Protenix's calculate_atom_bespoke_lddt (normalised by its pair
    count) against featurecache's plddt_target, over resolved atoms with at least one pair."""
    from protenix.model.loss import calculate_atom_bespoke_lddt

    batch, resolved, per_atom = case["batch"], case["resolved"], case["per_atom"]
    centre = centre_atom_index(batch)
    centre_valid = resolved[centre[0]] & batch["token_pad_mask"][0] & ~batch["is_ligand"][0]
    is_nucleotide_token = batch["is_dna"] | batch["is_rna"]
    lddt, has_reference = plddt_target(
        case["predicted"], case["true"][None], resolved[None], centre, centre_valid[None], is_nucleotide_token
    )
    # Protenix: the m atoms are representative atoms of polymer tokens (its plddt_m_rep_atom_mask);
    # only atoms with true coordinates enter, as l and as m
    m_atoms = atom_mask_of(centre[0][centre_valid], len(resolved))
    score, count = calculate_atom_bespoke_lddt(
        case["predicted"][0][:, resolved],
        case["true"][resolved],
        (per_atom["is_dna"] | per_atom["is_rna"])[resolved],
        ~per_atom["is_ligand"][resolved],
        m_atoms[resolved],
    )
    theirs = (score / count.clamp(min=1)).squeeze(-1)  # [S, resolved atoms]
    scored = has_reference[0][resolved]
    assert scored.float().mean() > 0.9
    assert rel_error(lddt[0][:, resolved][:, scored], theirs[:, scored]) <= FP32_TOLERANCE


def protenix_plddt_loss(case, outputs) -> torch.Tensor:
    from protenix.model.loss import PLDDTLoss

    batch, resolved, per_atom = case["batch"], case["resolved"], case["per_atom"]
    centre = centre_atom_index(batch)[0]
    centre_valid = resolved[centre] & ~batch["is_ligand"][0]
    return PLDDTLoss(reduction=None)(
        outputs["plddt_logits"][0],
        case["predicted"][0],
        case["true"],
        resolved,
        per_atom["is_dna"] | per_atom["is_rna"],
        ~per_atom["is_ligand"],
        atom_mask_of(centre[centre_valid], len(resolved)),
    )


# An lDDT within this of a bin edge is on it: lDDT is a multiple of 1 / (4 x pairs), so one that is
# not on an edge is at least 1 / (4 x pairs x 50) = 5e-5 from it at this sample's < 100 pairs;
# fp32 rounding of the ratio moves one on an edge by ~1e-7
ON_EDGE = 1e-6


def lower_open_bins(lddt: torch.Tensor, num_bins: int) -> torch.Tensor:
    """Protenix's pLDDT bins: (k / n, (k + 1) / n] is bin k (its lDDT is score / (pairs + 1e-6),
    just under an edge it is on), 0 in bin 0; featurecache's (lddt_bins) are [k / n, (k + 1) / n).
    lDDT lands on an edge often (0.5, 0.6, ...)."""
    edges = torch.linspace(0, 1, num_bins + 1)
    return (lddt[..., None] - ON_EDGE > edges).sum(-1).clamp(1, num_bins) - 1


def test_plddt_loss_with_protenix_bin_edges(case, confidence_case):
    """featurecache's pLDDT target and masked cross-entropy, binned as Protenix bins (every
    resolved atom here has a reference pair: Protenix would put one without in bin 0,
    featurecache leaves it out)."""
    outputs, _ = confidence_case
    batch, resolved = case["batch"], case["resolved"]
    centre = centre_atom_index(batch)
    centre_valid = resolved[centre[0]] & batch["token_pad_mask"][0] & ~batch["is_ligand"][0]
    lddt, has_reference = plddt_target(
        case["predicted"],
        case["true"][None],
        resolved[None],
        centre,
        centre_valid[None],
        batch["is_dna"] | batch["is_rna"],
    )
    assert has_reference[0][resolved].all()
    ours = masked_cross_entropy(
        outputs["plddt_logits"], lower_open_bins(lddt, 50), (has_reference & resolved[None])[:, None], item_dims=1
    )
    assert rel_error(ours, protenix_plddt_loss(case, outputs)) <= FP32_TOLERANCE


def test_plddt_loss_with_protenix_bins_setting(case, confidence_case):
    """featurecache's pLDDT loss with plddt_bins_protenix (Protenix's dialect) is Protenix's: its
    bins, and every resolved atom counted."""
    outputs, _ = confidence_case
    ours = confidence_losses(outputs, case["predicted"], case["batch"], plddt_bins_protenix=True)
    assert rel_error(ours["plddt"], protenix_plddt_loss(case, outputs)) <= FP32_TOLERANCE


@pytest.mark.xfail(
    strict=True,
    reason="pLDDT bin edges: Protenix bins an lDDT on an edge k/50 into the bin "
    "below, featurecache into the bin above, as AlphaFold 2's released loss does (floor(lddt x 50)); "
    "AF3's released code has no pLDDT loss (docs/FIDELITY.md)",
)
def test_plddt_loss(case, confidence_case):
    outputs, ours = confidence_case
    assert rel_error(ours["plddt"], protenix_plddt_loss(case, outputs)) <= FP32_TOLERANCE
