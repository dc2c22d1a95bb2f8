"""`featurecache predict` on a real cache (209d: two DNA strands and a peptide with non-standard
residues) with checkpoints written by the real training loop (CPU, tiny preset)."""

import shutil
from pathlib import Path

import gemmi
import numpy as np
import pytest
import torch
from click.testing import CliRunner

from featurecache.config import SampleConfig
from featurecache.training import TrainConfig, train

TARGET = "209d-assembly1"

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny matrices: see tests/conftest.py


@pytest.fixture(scope="module")
def cache(tmp_path_factory, shared_data) -> Path:
    from featurecache.precompute.pipeline import PrecomputeOptions, precompute

    inputs = tmp_path_factory.mktemp("inputs")
    shutil.copy(shared_data / "structures" / f"{TARGET}.cif", inputs)
    cache_dir = tmp_path_factory.mktemp("cache") / "cache"
    summary = precompute(PrecomputeOptions(
        inputs=[inputs], cache_dir=cache_dir, alignments_dir=shared_data / "alignments", num_workers=1,
        progress=False, executor="inline"))
    assert summary.failed == 0, summary.format()
    return cache_dir


def _train(cache: Path, out: Path, steps: int, **changes) -> Path:
    """Train `steps` steps of the tiny preset on the whole target; returns the last checkpoint."""
    settings = dict(cache=str(cache), out=str(out), preset="tiny", kernels="torch", steps=steps, num_workers=0,
                    device="cpu", warmup=2, lr=1e-3, checkpoint_every=steps,
                    sample=SampleConfig(crop_size=96, msa_rows_per_sample=8))
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
    return {(residue.subchain, residue.label_seq if residue.label_seq is not None else residue.seqid.num): residue
            for chain in structure[0] for residue in chain}


def test_predict_writes_one_mmcif_per_sample_with_the_targets_chains_residues_and_atoms(
        cache, checkpoint, tmp_path, shared_data):
    out = tmp_path / "predictions"
    result = _cli(["predict", "--cache", cache, TARGET, "--checkpoint", checkpoint, "--out", out,
                   "--samples", 2, "--steps", 4, "--cycles", 2, "--device", "cpu"])
    assert result.exit_code == 0, result.output
    written = sorted(out.iterdir())
    assert [path.name for path in written] == [f"{TARGET}_sample_0.cif", f"{TARGET}_sample_1.cif"]
    assert result.output.split() == [str(path) for path in written]
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
    del state["model"][next(name for name in state["model"] if name.startswith("diffusion_module."))]
    torch.save(state, garbled)
    assert "does not load as AF3Model" in error_line([TARGET, "--checkpoint", garbled])
    assert "no such file" in error_line([TARGET, "--checkpoint", tmp_path / "missing.pt"])
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
