"""`featurecache predict` on a real cache (209d: two DNA strands and a peptide with non-standard
residues) with checkpoints written by the real training loop (CPU, tiny preset)."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import gemmi
import numpy as np
import pytest
import torch
from click.testing import CliRunner

from featurecache.config import SampleConfig
from featurecache.model.config import saved_model_settings
from featurecache.training import TrainConfig, train
from tests.conftest import copy_sample_structures

TARGET = "209d-assembly1"

# The overfit test's schedule and bounds: see test_tiny_overfits_one_real_crop_until_predict_recovers_it
# for the figures they were set from.
OVERFIT_STEPS = 400
OVERFIT_LR = 3e-3
OVERFIT_WARMUP = 50
OVERFIT_DIFFUSION_BATCH = 16
OVERFIT_EMA_DECAY = 0.9  # predict uses the EMA weights: AF3's 0.999 would still weigh the first steps here
OVERFIT_SAMPLES = 5
OVERFIT_SAMPLER_STEPS = 200  # AF3's
OVERFIT_CA_RMSD = 3.5  # the best of the samples, Angstrom
OVERFIT_LDDT = 0.35  # all-atom lDDT of that sample
# Seeds measured by OVERFIT_SEEDS=0,1,2,... (CI runs seed 0); the threads are pinned to one by the
# one_thread fixture, so a seed's arithmetic does not depend on the machine's core count.
OVERFIT_SEEDS = [int(seed) for seed in os.environ.get("OVERFIT_SEEDS", "0").split(",")]

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny matrices: see tests/conftest.py


@pytest.fixture(scope="module")
def cache(tmp_path_factory, shared_data) -> Path:
    from featurecache.precompute.pipeline import PrecomputeOptions, precompute

    inputs = copy_sample_structures(f"{TARGET}.cif", tmp_path_factory.mktemp("inputs"))
    cache_dir = tmp_path_factory.mktemp("cache") / "cache"
    summary = precompute(
        PrecomputeOptions(
            inputs=[inputs],
            cache_dir=cache_dir,
            alignments_dir=shared_data / "alignments",
            num_workers=1,
            progress=False,
            executor="inline",
        )
    )
    assert summary.failed == 0, summary.format()
    return cache_dir


def _train(cache: Path, out: Path, steps: int, **changes) -> Path:
    """Train `steps` steps of the tiny preset on the whole target; returns the last checkpoint."""
    settings = dict(
        cache=str(cache),
        out=str(out),
        preset="tiny",
        kernels="torch",
        steps=steps,
        num_workers=0,
        device="cpu",
        warmup=2,
        lr=1e-3,
        checkpoint_every=steps,
        sample=SampleConfig(crop_size=96, msa_rows_per_sample=8),
    )
    settings.update(changes)
    train(TrainConfig(**settings))
    return out / f"checkpoint-{steps:08d}.pt"


@pytest.fixture(scope="module")
def checkpoint(cache, tmp_path_factory) -> Path:
    return _train(cache, tmp_path_factory.mktemp("run"), steps=2)


def _cli(args: list[str]):
    from featurecache.cli import cli

    return CliRunner().invoke(cli, [str(arg) for arg in args])


def _residues(structure: gemmi.Structure) -> dict[tuple[str, int], gemmi.Residue]:
    """(label_asym_id, label_seq_id or author number) -> residue, over the first model."""
    return {
        (residue.subchain, residue.label_seq if residue.label_seq is not None else residue.seqid.num): residue
        for chain in structure[0]
        for residue in chain
    }


def test_predict_writes_one_mmcif_per_sample_with_the_targets_chains_residues_and_atoms(
    cache, checkpoint, tmp_path, shared_data
):
    out = tmp_path / "predictions"
    result = _cli(
        [
            "predict",
            "--cache",
            cache,
            TARGET,
            "--checkpoint",
            checkpoint,
            "--out",
            out,
            "--samples",
            2,
            "--steps",
            4,
            "--cycles",
            2,
            "--device",
            "cpu",
        ]
    )
    assert result.exit_code == 0, result.output
    written = [out / TARGET / f"seed-0_sample-{i}" / f"{TARGET}_seed-0_sample-{i}_model.cif" for i in (0, 1)]
    # stdout lists the files; the progress lines (stderr, mixed in by older click) name the target's
    # model time
    progress = [line for line in result.output.splitlines() if line.startswith("featurecache predict:")]
    assert [line for line in result.output.splitlines() if line not in progress] == [str(path) for path in written]
    timing = next(line for line in progress if line.startswith(f"featurecache predict: {TARGET}:"))
    assert "2 cycles, 2 samples x 4 steps, fp32" in timing and " model " in timing, progress
    assert any("the whole command" in line for line in progress), progress
    _check_confidences(out / TARGET, written)
    truth = gemmi.read_structure(str(shared_data / "structures" / f"{TARGET}.cif"))
    truth.remove_hydrogens()
    truth.remove_waters()
    true_residues = _residues(truth)
    samples = []
    for path in written:
        predicted = gemmi.read_structure(str(path))
        gemmi.cif.read(str(path))  # the file itself is valid CIF
        assert [chain.name for chain in predicted[0]] == [chain.name for chain in truth[0]] == ["A", "B", "C"]
        residues = _residues(predicted)
        # every residue of the structure, with its CCD name (DNA, PRO, THR and the peptide's
        # non-standard DVA, SAR, MVA, PXA), and every resolved atom under its CCD name
        assert residues.keys() == true_residues.keys()
        for key, residue in residues.items():
            assert residue.name == true_residues[key].name, key
            names = {atom.name for atom in residue}
            assert {atom.name for atom in true_residues[key]} <= names, key
            assert all(atom.element.name != "X" for atom in residue), key  # every atom's element known
        assert {residue.name for residue in residues.values()} >= {"DG", "DA", "THR", "PXA", "MVA", "SAR", "DVA"}
        positions = np.array([atom.pos.tolist() for chain in predicted[0] for residue in chain for atom in residue])
        assert np.isfinite(positions).all() and positions.std() > 0
        samples.append(positions)
    assert not np.allclose(samples[0], samples[1])  # two samples of the sampler, not one copy


SUMMARY_KEYS = {
    "chain_ids",
    "chain_iptm",
    "chain_pair_iptm",
    "chain_pair_pae_min",
    "chain_ptm",
    "fraction_disordered",
    "has_clash",
    "iptm",
    "ptm",
    "ranking_score",
}
FULL_KEYS = {"atom_chain_ids", "atom_plddts", "contact_probs", "pae", "token_chain_ids", "token_res_ids"}


def _check_confidences(folder: Path, models: list[Path]) -> None:
    """AlphaFold 3's documented confidence files (docs/output.md) beside each mmCIF, pLDDT in
    the B-factors, and the best sample by ranking_score copied to the top of the folder."""
    scores = []
    for model in models:
        prefix = model.name.removesuffix("model.cif")
        summary = json.loads((model.parent / f"{prefix}summary_confidences.json").read_text())
        full = json.loads((model.parent / f"{prefix}confidences.json").read_text())
        assert set(summary) == SUMMARY_KEYS and set(full) == FULL_KEYS
        assert summary["chain_ids"] == ["A", "B", "C"]
        assert np.array(summary["chain_pair_iptm"]).shape == np.array(summary["chain_pair_pae_min"]).shape == (3, 3)
        assert len(summary["chain_ptm"]) == len(summary["chain_iptm"]) == 3
        assert 0.0 <= summary["ptm"] <= 1.0 and 0.0 <= summary["iptm"] <= 1.0
        assert summary["has_clash"] in (0.0, 1.0) and 0.0 <= summary["fraction_disordered"] <= 1.0
        expected = (
            0.8 * summary["iptm"]
            + 0.2 * summary["ptm"]
            + 0.5 * summary["fraction_disordered"]
            - 100 * summary["has_clash"]
        )
        assert summary["ranking_score"] == pytest.approx(expected, abs=0.02)  # the file rounds to 2 decimals
        tokens = len(full["token_chain_ids"])
        assert np.array(full["pae"]).shape == np.array(full["contact_probs"]).shape == (tokens, tokens)
        assert len(full["token_res_ids"]) == tokens and set(full["token_chain_ids"]) == {"A", "B", "C"}
        assert np.all(np.array(full["pae"]) >= 0) and np.all(np.array(full["contact_probs"]) <= 1)
        structure = gemmi.read_structure(str(model))
        atoms = [(residue.subchain, atom.b_iso) for chain in structure[0] for residue in chain for atom in residue]
        assert full["atom_chain_ids"] == [chain for chain, _ in atoms]
        plddts = np.array(full["atom_plddts"])
        assert plddts.min() >= 0 and plddts.max() <= 100
        np.testing.assert_allclose(plddts, [b_factor for _, b_factor in atoms], atol=0.011)
        scores.append(summary["ranking_score"])
    ranking = (folder / f"{TARGET}_ranking_scores.csv").read_text().splitlines()
    assert ranking[0] == "seed,sample,ranking_score" and len(ranking) == 1 + len(models)
    exact = [float(line.split(",")[2]) for line in ranking[1:]]
    assert exact == pytest.approx(scores, abs=0.006)
    best = models[int(np.argmax(exact))]
    assert (folder / f"{TARGET}_model.cif").read_bytes() == best.read_bytes()
    prefix = best.name.removesuffix("model.cif")
    for suffix in ("confidences.json", "summary_confidences.json"):
        assert (folder / f"{TARGET}_{suffix}").read_bytes() == (best.parent / f"{prefix}{suffix}").read_bytes()


def test_bad_keys_and_checkpoints_are_one_line_with_exit_2(cache, checkpoint, tmp_path):
    def error_line(args) -> str:
        result = _cli(["predict", "--cache", cache, *args, "--out", tmp_path / "out", "--steps", 2])
        assert result.exit_code == 2, result.output
        assert "Traceback" not in result.output
        lines = [line for line in result.output.splitlines() if line.startswith("Error")]
        assert len(lines) == 1, result.output
        return lines[0]

    assert "no-such-target" in error_line(["no-such-target", "--checkpoint", checkpoint])
    garbled = tmp_path / "garbled.pt"
    garbled.write_bytes(b"not a checkpoint")
    line = error_line([TARGET, "--checkpoint", garbled])
    assert f"--checkpoint {garbled}: not a readable checkpoint" in line
    torch.save({"weights": 1}, garbled)
    assert "not a featurecache training checkpoint" in error_line([TARGET, "--checkpoint", garbled])
    state = torch.load(checkpoint, weights_only=False)
    name = next(name for name in state["model"] if name.startswith("diffusion_module."))
    for weights in (state["model"], state.get("ema", {})):  # the EMA copy too, where training kept one
        weights.pop(name, None)
    torch.save(state, garbled)
    assert "does not load as AF3Model" in error_line([TARGET, "--checkpoint", garbled])
    assert "no such file" in error_line([TARGET, "--checkpoint", tmp_path / "missing.pt"])
    state = torch.load(checkpoint, weights_only=False)  # a diverged run's weights
    name = next(iter(state["model"]))
    for weights in (state["model"], state.get("ema", {})):
        if name in weights:
            weights[name] = torch.full_like(weights[name], float("nan"))
    torch.save(state, garbled)
    line = error_line([TARGET, "--checkpoint", garbled])
    assert "NaN or infinity" in line and name in line and str(garbled) in line
    state = torch.load(checkpoint, weights_only=False)  # finite weights whose positions overflow
    name = "diffusion_module.atom_decoder.to_positions.linear.weight"
    for weights in (state["model"], state.get("ema", {})):
        if name in weights:
            weights[name] = torch.full_like(weights[name], 3e38)
    torch.save(state, garbled)
    line = error_line([TARGET, "--checkpoint", garbled])
    assert f"{TARGET}: sample(s) 0" in line and "NaN or infinite coordinates" in line
    line = error_line([TARGET, "--checkpoint", checkpoint, "--cuda-graphs", "--device", "cpu"])
    assert "--cuda-graphs needs a CUDA device" in line
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_a_checkpoint_from_before_the_confidence_head_predicts_without_confidences(cache, checkpoint, tmp_path):
    from featurecache.prediction import PredictOptions, predict

    state = torch.load(checkpoint, weights_only=False)
    for weights in (state["model"], state.get("ema", {})):
        for name in [name for name in weights if name.startswith("confidence_head.")]:
            del weights[name]
    # in the flat layout checkpoints had then
    state["model_config"] = {
        name: value
        for name, value in saved_model_settings(state["model_config"]).items()
        if not name.startswith(("confidence", "plddt", "pde", "pae", "resolved"))
    }
    old = tmp_path / "old.pt"
    torch.save(state, old)
    written = predict(
        PredictOptions(
            cache=str(cache),
            keys=(TARGET,),
            checkpoint=str(old),
            out=str(tmp_path / "out"),
            samples=1,
            steps=2,
            cycles=1,
            device="cpu",
            kernels="torch",
        )
    )
    assert [path.name for path in written] == [f"{TARGET}_seed-0_sample-0_model.cif"]
    assert sorted(path.name for path in (tmp_path / "out").rglob("*") if path.is_file()) == [written[0].name]
    structure = gemmi.read_structure(str(written[0]))
    assert {atom.b_iso for chain in structure[0] for residue in chain for atom in residue} == {0.0}


def test_train_writes_the_ema_weights_without_optimizer_state_and_they_predict_as_the_checkpoint(
    cache, checkpoint, tmp_path
):
    from featurecache.prediction import PredictOptions, predict

    weights_file = checkpoint.parent / "weights.pt"
    weights = torch.load(weights_file, weights_only=True)  # tensors and plain values only
    state = torch.load(checkpoint, weights_only=False)
    assert weights["step"] == state["step"] == 2 and weights["model_config"] == state["model_config"]
    assert not {"optimizer", "ema", "rng", "scheduler"} & weights.keys()
    # the EMA in place of every averaged parameter (after 2 steps it differs from the live weights)
    assert any(not torch.equal(state["ema"][name], state["model"][name]) for name in state["ema"])
    assert weights["model"].keys() == state["model"].keys()
    for name, value in weights["model"].items():
        assert torch.equal(value, state["ema"].get(name, state["model"][name])), name
    # a checkpoint holds the live weights, the EMA and AdamW's two moments: four copies
    assert weights_file.stat().st_size < 0.35 * checkpoint.stat().st_size
    texts = []
    for path in (checkpoint, weights_file):
        written = predict(
            PredictOptions(
                cache=str(cache),
                keys=(TARGET,),
                checkpoint=str(path),
                out=str(tmp_path / path.stem),
                samples=1,
                steps=2,
                cycles=1,
                device="cpu",
                kernels="torch",
            )
        )
        texts.append(written[0].read_text())
    assert texts[0] == texts[1]


# A child process loads the model and prints its peak resident set (KiB): the parent's memory
# does not count, and each load starts from the same state.
_LOAD_PEAK = """
import pathlib, resource, sys
import torch
from featurecache.prediction.run import load_model
load_model(pathlib.Path(sys.argv[1]), torch.device("cpu"), "torch")
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def _load_peak_mib(path: Path) -> float:
    result = subprocess.run([sys.executable, "-c", _LOAD_PEAK, str(path)], capture_output=True, text=True, check=True)
    return int(result.stdout.split()[-1]) / 1024


def test_predict_leaves_a_checkpoints_optimizer_state_on_disk(checkpoint, tmp_path):
    """The checkpoint's optimizer state grown by 256 MiB (as AdamW's moments grow with the model)
    adds nothing to what loading the model for predict holds in memory (read memory-mapped)."""
    state = torch.load(checkpoint, weights_only=False)
    padding_mib = 256
    state["optimizer"]["state"][0]["padding"] = torch.ones(padding_mib * 2**20 // 4)
    grown = tmp_path / "grown.pt"
    torch.save(state, grown)
    assert _load_peak_mib(grown) - _load_peak_mib(checkpoint) < padding_mib / 4


def _ras_helix(shared_data: Path, folder: Path) -> Path:
    """H-Ras (721p chain A) residues 86-105, helix alpha3 with its flanks, as an mmCIF of its own:
    a real, fixed crop (20 tokens, 179 atoms) small enough to overfit on a CPU."""
    structure = gemmi.read_structure(str(shared_data / "structures" / "721p-assembly1.cif"))
    model = structure[0]
    for name in [chain.name for chain in model if chain.name != "A"]:
        model.remove_chain(name)
    chain = model["A"]
    for index in reversed(range(len(chain))):
        if not (chain[index].het_flag == "A" and 86 <= chain[index].seqid.num <= 105):
            del chain[index]
    for number, residue in enumerate(chain, start=1):
        residue.label_seq = number
    structure.entities.clear()
    structure.setup_entities()
    structure.entities[0].full_sequence = [residue.name for residue in chain]
    path = folder / "ras-helix.cif"
    structure.make_mmcif_document().write_file(str(path))
    return path


@pytest.mark.parametrize("seed", OVERFIT_SEEDS)
def test_tiny_overfits_one_real_crop_until_predict_recovers_it(shared_data, tmp_path, seed):
    """The tiny preset trained by the real loop on one fixed real crop (through the cache and
    CacheDataset: the crop size holds it whole) until `predict` writes a structure within
    OVERFIT_CA_RMSD of the truth, as `featurecache evaluate` scores it (one training step leaves
    it 15-16 A away, lDDT 0.07-0.10).

    Schedule: OVERFIT_* above, N_cycle 1, deterministic, the confidence head off: its
    mini-rollout and head are ~40 % of a step here, and its losses reach neither the trunk
    (detached) nor the diffusion module; without it the truth's symmetric atoms are matched to
    the least noisy denoised sample instead of the rollout (SI 4.2). (Seed 0 with it on, 300
    steps, warm-up 10, otherwise as now: 2.78 and 2.92 A for 2 samples, at 1.5x the step time.)

    Measured 2026-12-05 on the 2-core CPU, one thread, two seeds at a time beside other jobs
    (load 3-4), hence the wall times; seed 0 run alone afterwards: the same figures bit for bit,
    in 133 s:

    | seed | CA-RMSD of the 5 samples (A) | best | lDDT of the best | wall time (s) |
    | --- | --- | --- | --- | --- |
    | 0 | 2.37, 2.64, 2.12, 3.91, 2.63 | 2.12 | 0.560 | 380 |
    | 1 | 2.00, 2.30, 3.10, 4.60, 2.94 | 2.00 | 0.508 | 425 |
    | 2 | 2.14, 2.99, 2.57, 3.95, 2.18 | 2.14 | 0.480 | 381 |
    | 3 | 1.96, 2.39, 2.60, 3.25, 2.48 | 1.96 | 0.553 | 344 |
    | 4 | 2.64, 4.29, 4.75, 2.68, 2.84 | 2.64 | 0.466 | 421 |
    | 5 | 2.99, 3.94, 2.07, 4.68, 3.43 | 2.07 | 0.562 | 409 |

    The bounds lie ~1/3 beyond the worst seed (3.5 A over 2.64 A, lDDT 0.35 under 0.47): a
    seed's arithmetic is fixed (one thread; seeded weights, data, noise and sampler), but another
    CPU's kernels round differently and 400 steps carry that as far as another seed would.

    The previous schedule (300 steps, warm-up 10, diffusion batch 8, confidence head on, 20
    sampler steps, best of 2 samples; bound 10 A) gave 4.5-7.2 A, lDDT 0.08-0.14 on seeds 0 and
    1. At 300 steps and warm-up 10 with the rest as now, seeds 0-3 reached 1.78-2.24 A (lDDT
    0.41-0.56) but seeds 4 and 5 only 3.14 and 4.15 A (lDDT 0.30, 0.18); the warm-up of 50 and
    100 more steps took those two to the rows above. Issue 33's aim of 2 A is not met by every
    seed in this budget: the best samples stay near 2-3 A (lDDT ~0.5); a higher learning rate
    (6e-3), a decaying one, EMA decay 0.98 and a lower noise distribution (log-mean -2.0) did
    not help (one seed each, 300-450 steps). Measure seeds with
    `OVERFIT_SEEDS=0,1,2 pytest -s tests/test_predict.py -k overfits` (each prints its row)."""
    from featurecache.precompute.pipeline import PrecomputeOptions, precompute
    from featurecache.prediction import PredictOptions, compare, predict
    from featurecache.prediction.evaluate import read_atoms

    started = time.perf_counter()
    (tmp_path / "inputs").mkdir()
    truth = _ras_helix(shared_data, tmp_path / "inputs")
    summary = precompute(
        PrecomputeOptions(
            inputs=[tmp_path / "inputs"], cache_dir=tmp_path / "cache", num_workers=1, progress=False, executor="inline"
        )
    )
    assert summary.failed == 0, summary.format()
    checkpoint = _train(
        tmp_path / "cache",
        tmp_path / "run",
        steps=OVERFIT_STEPS,
        lr=OVERFIT_LR,
        warmup=OVERFIT_WARMUP,
        model_settings={
            "diffusion_batch": OVERFIT_DIFFUSION_BATCH,
            "max_recycling_cycles": 1,
            "confidence_head": False,
        },
        ema_decay=OVERFIT_EMA_DECAY,
        deterministic=True,
        sample=SampleConfig(crop_size=32, msa_rows_per_sample=8, seed=seed),
    )
    written = predict(
        PredictOptions(
            cache=str(tmp_path / "cache"),
            keys=("ras-helix",),
            checkpoint=str(checkpoint),
            out=str(tmp_path / "predictions"),
            samples=OVERFIT_SAMPLES,
            steps=OVERFIT_SAMPLER_STEPS,
            cycles=1,
            device="cpu",
            kernels="torch",
        )
    )
    scores = [compare(path, truth) for path in written]  # featurecache evaluate's scores
    best = min(scores, key=lambda score: score.ca_rmsd)
    rmsds = ", ".join(f"{score.ca_rmsd:.2f}" for score in scores)
    print(
        f"\n| {seed} | {rmsds} | {best.ca_rmsd:.2f} | {best.lddt:.3f} | {time.perf_counter() - started:.0f} |"
    )  # a row of the docstring's table, under pytest -s
    # every heavy atom of the truth is predicted and scored
    assert all(score.ca_atoms == 20 and score.atoms == len(read_atoms(truth)) for score in scores), scores
    assert all(0.0 < score.lddt <= 1.0 for score in scores), scores
    assert best.ca_rmsd < OVERFIT_CA_RMSD and best.lddt > OVERFIT_LDDT, scores


def _protein_chain(shared_data: Path) -> dict:
    """721p chain A (H-Ras, 166 residues) as the per-atom arrays the ranking checks read."""
    structure = gemmi.read_structure(str(shared_data / "structures" / "721p-assembly1.cif"))
    structure.remove_hydrogens()
    structure.remove_ligands_and_waters()
    atoms = [(number, residue, atom) for number, residue in enumerate(structure[0]["A"]) for atom in residue]
    return {
        "positions": np.array([atom.pos.tolist() for _, _, atom in atoms]),
        "atom_names": [atom.name for _, _, atom in atoms],
        "elements": [atom.element.name for _, _, atom in atoms],
        "residue": np.array([number for number, _, _ in atoms]),
        "residue_names": [residue.name for _, residue, _ in atoms],
    }


def test_fraction_disordered_of_a_folded_protein_and_of_it_blown_apart(shared_data):
    from featurecache.prediction.ranking import fraction_disordered, relative_accessibility

    chain = _protein_chain(shared_data)
    count = len(chain["positions"])
    rsa = relative_accessibility(
        chain["positions"], chain["atom_names"], chain["elements"], chain["residue"], chain["residue_names"]
    )
    assert len(rsa) == len(set(chain["residue"].tolist())) and 0.15 < rsa.mean() < 0.4  # a folded globular protein

    def disorder(positions):
        return fraction_disordered(
            positions,
            chain["atom_names"],
            chain["elements"],
            np.zeros(count, int),
            chain["residue"],
            chain["residue_names"],
            np.ones(count, bool),
        )

    assert disorder(chain["positions"]) < 0.1
    assert disorder(3.0 * chain["positions"]) == 1.0  # every atom exposed
    assert (
        fraction_disordered(
            chain["positions"],
            chain["atom_names"],
            chain["elements"],
            np.zeros(count, int),
            chain["residue"],
            chain["residue_names"],
            np.zeros(count, bool),
        )
        == 0.0
    )


def test_accessible_area_in_blocks_equals_biotites_and_stays_bounded_for_strewn_atoms(shared_data, monkeypatch):
    """A barely trained model's sample strews atoms over kilometres: biotite's cell list over that
    box asked for 25 GB (MemoryError in predict). Measured block by block, the areas are biotite's
    own, atom for atom, and a strewn structure takes bounded memory."""
    import biotite.structure as struc

    from featurecache.prediction import ranking

    chain = _protein_chain(shared_data)
    atoms = struc.AtomArray(len(chain["positions"]))
    atoms.coord = chain["positions"].astype(np.float32)
    atoms.element = np.array(chain["elements"])
    radii = np.array([ranking.DSSP_RADII.get(name, ranking.DSSP_OTHER_RADIUS) for name in chain["atom_names"]])
    whole = struc.sasa(atoms, probe_radius=ranking.DSSP_PROBE, vdw_radii=radii, ignore_ions=False)
    monkeypatch.setattr(ranking, "SASA_MAX_CELLS", 0)
    monkeypatch.setattr(ranking, "SASA_BLOCK", 9.0)  # many blocks, each cutting through the protein
    np.testing.assert_array_equal(ranking.accessible_area(atoms, radii), whole)
    monkeypatch.undo()

    strewn = atoms.copy()  # every atom 1,000x farther from the others: a box of some 40,000 A a side
    strewn.coord = atoms.coord * 1000.0
    area = ranking.accessible_area(strewn, radii)
    isolated = 4 * np.pi * (radii + ranking.DSSP_PROBE) ** 2  # no atom within reach of another
    np.testing.assert_allclose(area, isolated, rtol=1e-5)


def test_has_clash_and_ranking_score(shared_data):
    from featurecache.prediction.ranking import has_clash, ranking_score

    chain = _protein_chain(shared_data)
    count = len(chain["positions"])
    two = np.concatenate([chain["positions"], chain["positions"] + np.array([0.3, 0.0, 0.0])])
    chains, residues, polymer = np.repeat([0, 1], count), np.tile(chain["residue"], 2), np.ones(2 * count, bool)
    assert not has_clash(chain["positions"], np.zeros(count, int), chain["residue"], np.ones(count, bool))
    assert has_clash(two, chains, residues, polymer)  # a copy 0.3 A away: every atom clashes
    far = np.concatenate([chain["positions"], chain["positions"] + 100.0])
    assert not has_clash(far, chains, residues, polymer)
    assert not has_clash(two, chains, residues, np.repeat([True, False], count))  # a ligand copy is no clash
    assert ranking_score(0.5, float("nan"), 0.2, False) == pytest.approx(0.6)
    assert ranking_score(0.5, 0.7, 0.0, True) == pytest.approx(0.8 * 0.7 + 0.2 * 0.5 - 100.0)
