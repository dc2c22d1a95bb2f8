"""A converted Protenix model computes Protenix's numbers: Protenix's whole model, built small by
its own constructor with random weights (fp32, CPU), converted by `protenix_to_featurecache`,
and both run on the same inputs (featurecache's batch and the input_feature_dict Protenix's
featurizer gives for it): the trunk after two recycling cycles, one denoising step at fixed noise
levels, the confidence head's logits, and every loss term, within FP32_TOLERANCE
(tests/equivalence/tolerance.py: fp32 sums in different orders).

The converted model runs featurecache's own code with the `protenix` dialect the conversion
records (docs/FIDELITY.md): nothing is remapped or zeroed to make the numbers agree."""

import pytest
import torch

from featurecache.model import AF3Model
from featurecache.testing.compare import rel_error
from featurecache.testing.protenix import protenix_configs, protenix_features, protenix_labels
from featurecache.testing.synthetic import random_batch

from tests.equivalence.tolerance import FP32_TOLERANCE

TOKENS, MSA_ROWS, TEMPLATES, ATOMS_PER_TOKEN = 40, 6, 2, 5
CYCLES = 2
# sigma in Angstrom: sigma_data / 32, sigma_data, 10 sigma_data
NOISE_LEVELS = (0.5, 16.0, 160.0)
STRUCTURES = 2  # the confidence head judges two structures


def distinct_distogram_atoms(batch: dict) -> dict:
    """The batch with each residue's distogram atom (its 4th, as a CB) other than its centre atom
    (its 2nd, as a CA), as in real residues, so a loss reading the wrong one shows it."""
    atom_to_token = batch["atom_to_token"][0]
    first = torch.searchsorted(atom_to_token, torch.arange(TOKENS))
    size = torch.bincount(atom_to_token, minlength=TOKENS)
    batch["distogram_atom_index"][0] = torch.where(size >= 4, first + 3, batch["distogram_atom_index"][0])
    return batch


@pytest.fixture(scope="module")
def run(small_protenix):
    """Both models' trunk, denoising and confidence outputs on one batch."""
    from protenix.model.protenix import update_input_feature_dict

    theirs, config, state = small_protenix
    ours = AF3Model(config.replace(kernels="torch", checkpoint_blocks=False)).eval()
    ours.load_state_dict(state)
    generator = torch.Generator().manual_seed(7)
    batch = distinct_distogram_atoms(
        random_batch([TOKENS], [MSA_ROWS], [TEMPLATES], generator, num_atoms_per_token=ATOMS_PER_TOKEN)
    )
    features = update_input_feature_dict(theirs.relative_position_encoding.generate_relp(protenix_features(batch)))
    atoms = batch["atom_pos"].shape[1]
    sigma = torch.tensor([NOISE_LEVELS])  # [B 1, S]
    noisy = batch["atom_pos"][:, None].float() + sigma[..., None, None] * torch.randn(
        1, len(NOISE_LEVELS), atoms, 3, generator=generator
    )
    structures = batch["atom_pos"][:, None].float() + 1.5 * torch.randn(1, STRUCTURES, atoms, 3, generator=generator)
    with torch.no_grad():
        trunk = ours.trunk(batch, num_cycles=CYCLES)
        s_inputs, single, pair = theirs.get_pairformer_output(
            features, N_cycle=CYCLES, inplace_safe=False, chunk_size=None
        )
        denoised = ours.diffusion_module(noisy, sigma, ours.diffusion_context(batch, trunk))
        denoised_theirs = theirs.diffusion_module(
            noisy[0], sigma[0], features, s_inputs, single, pair, pair_z=None, p_lm=None, c_l=None
        )
        confidence = ours.confidence_head(trunk["s_inputs"], trunk["single"], trunk["pair"], structures, batch)
        confidence_theirs = theirs.confidence_head(
            input_feature_dict=features,
            s_inputs=s_inputs,
            s_trunk=single,
            z_trunk=pair,
            pair_mask=None,
            x_pred_coords=structures[0],
        )
        distogram_theirs = theirs.distogram_head(pair)
    return {
        "ours": ours,
        "config": config,
        "batch": batch,
        "features": features,
        "sigma": sigma,
        "noisy": noisy,
        "structures": structures,
        "trunk": trunk,
        "denoised": denoised,
        "confidence": confidence,
        "theirs": {
            "s_inputs": s_inputs,
            "single": single,
            "pair": pair,
            "distogram_logits": distogram_theirs,
            "denoised": denoised_theirs,
            **dict(zip(("plddt_logits", "pae_logits", "pde_logits", "resolved_logits"), confidence_theirs)),
        },
    }


@pytest.mark.parametrize("name", ["s_inputs", "single", "pair", "distogram_logits"])
def test_trunk_outputs(run, name):
    assert rel_error(run["trunk"][name][0], run["theirs"][name]) <= FP32_TOLERANCE


@pytest.mark.parametrize("sample", range(len(NOISE_LEVELS)))
def test_one_denoising_step_at_fixed_noise(run, sample):
    """D(x; sigma) from each side's own trunk, compared on the network's part c_out F (the c_skip
    x_noisy both add would hide it at low noise)."""
    sigma, sigma_data = NOISE_LEVELS[sample], run["config"].diffusion.sigma_data
    skip = sigma_data**2 / (sigma_data**2 + sigma**2) * run["noisy"][0, sample]
    error = rel_error(run["denoised"][0, sample] - skip, run["theirs"]["denoised"][sample] - skip)
    assert error <= FP32_TOLERANCE, f"sigma {sigma}: {error}"


@pytest.mark.parametrize("name", ["plddt_logits", "pae_logits", "pde_logits", "resolved_logits"])
def test_confidence_logits(run, name):
    assert rel_error(run["confidence"][name][0], run["theirs"][name]) <= FP32_TOLERANCE


@pytest.fixture(scope="module")
def losses(run):
    """featurecache's AF3Model.loss and Protenix's ProtenixLoss (its training mode) on the same
    predictions: the denoised structures, the distogram and the confidence head's logits on the
    structures it judged (Protenix's mini-rollout). Both with the bond and PAE losses on (AF3's
    fine-tuning weights), so every term enters the total."""
    from protenix.model.loss import ProtenixLoss

    ours = AF3Model(
        run["config"].replace(kernels="torch", checkpoint_blocks=False, bond_loss_weight=1.0, pae_loss_weight=1.0)
    )
    batch, confidence = run["batch"], run["confidence"]
    outputs = {
        **run["trunk"],
        "denoised_positions": run["denoised"],
        "noise_level": run["sigma"],
        "rollout_positions": run["structures"],
        **confidence,
        # the truth as it is (Protenix's permutation runs in its model's forward, not its loss)
        "aligned_atom_pos": batch["atom_pos"],
        "aligned_atom_mask": batch["atom_mask"],
    }
    _, metrics = ours.loss(batch, outputs)
    configs = protenix_configs()
    configs.loss.weight.alpha_bond = 1.0
    configs.loss.weight.alpha_pae = 1.0
    loss = ProtenixLoss(configs)
    predictions = {
        "coordinate": run["denoised"][0],
        "noise_level": run["sigma"][0],
        "distogram": run["trunk"]["distogram_logits"][0],
        "coordinate_mini": run["structures"][0],
        **{name.removesuffix("_logits"): value[0] for name, value in confidence.items()},
    }
    labels = protenix_labels(batch)
    with torch.no_grad():
        _, theirs = loss(run["features"], predictions, labels, mode="train")
        # the MSE and bond terms without the noise level's weight, as featurecache reports them
        label_dict = loss.calculate_label(run["features"], dict(labels))
        features = run["features"]
        theirs["mse"] = loss.mse_loss(
            predictions["coordinate"],
            labels["coordinate"],
            labels["coordinate_mask"],
            features["is_rna"],
            features["is_dna"],
            features["is_ligand"],
        )
        theirs["bond"] = loss.bond_loss.sparse_forward(
            predictions["coordinate"], labels["coordinate"], label_dict["distance_mask"], features["bond_mask"]
        )
    return metrics, theirs


@pytest.mark.parametrize(
    "ours, theirs",
    [
        ("distogram", "distogram_loss"),
        ("smooth_lddt", "smooth_lddt_loss"),
        ("mse", "mse"),
        ("bond", "bond"),
        ("plddt", "plddt_loss"),
        ("pae", "pae_loss"),
        ("pde", "pde_loss"),
        ("resolved", "resolved_loss"),
        ("loss", "loss"),
    ],
)
def test_loss_terms(losses, ours, theirs):
    metrics, protenix = losses
    assert protenix[theirs] > 0
    assert rel_error(metrics[ours], protenix[theirs]) <= FP32_TOLERANCE


def test_the_diffusion_loss_weighs_its_terms_as_protenix(losses):
    """L_diffusion = mean over samples of w(sigma) (L_MSE + L_bond) + L_smooth_lddt: Protenix keeps
    the weighted terms apart (mse_loss, bond_loss)."""
    metrics, protenix = losses
    assert (
        rel_error(metrics["diffusion"], protenix["mse_loss"] + protenix["bond_loss"] + protenix["smooth_lddt_loss"])
        <= FP32_TOLERANCE
    )
