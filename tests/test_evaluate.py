"""`featurecache evaluate` on the real 721p assembly (H-Ras homodimer with GppNHp and Mg) moved
and perturbed by hand, where each score has a value worked out from the perturbation."""

from pathlib import Path

import gemmi
import numpy as np
import pytest
from click.testing import CliRunner

from featurecache.cli import cli
from featurecache.prediction.evaluate import compare, lddt, superposed_rmsd

TARGET = "721p-assembly1.cif"


def _write(structure: gemmi.Structure, path: Path) -> Path:
    structure.make_mmcif_document().write_file(str(path))
    return path


def _moved(structure: gemmi.Structure) -> None:
    """A rigid motion of the whole model: 90 degrees about z and a shift."""
    transform = gemmi.Transform()
    transform.mat.fromlist([[0, -1, 0], [1, 0, 0], [0, 0, 1]])
    transform.vec.fromlist([5.0, -3.0, 12.0])
    structure[0].transform_pos_and_adp(transform)


@pytest.fixture()
def truth(shared_data) -> Path:
    return shared_data / "structures" / TARGET


def test_a_rigidly_moved_copy_with_its_chains_swapped_scores_perfect(truth, tmp_path):
    structure = gemmi.read_structure(str(truth))
    chain_a, chain_b = structure[0]["A"], structure[0]["B"]
    chain_a.name, chain_b.name = "B", "A"
    for chain in structure[0]:
        for residue in chain:
            residue.subchain = chain.name
    _moved(structure)
    scores = compare(_write(structure, tmp_path / "moved.cif"), truth)
    assert scores.chain_map == {"A": "B", "B": "A"}
    assert scores.ca_atoms == 2 * 166 and scores.ligand_atoms == 2 * (32 + 1)  # GNP + MG per chain
    assert scores.ca_rmsd < 1e-6 and scores.ligand_rmsd < 1e-6
    assert scores.lddt == pytest.approx(1.0) and scores.ca_lddt == pytest.approx(1.0)


def test_one_chain_shifted_rigidly_keeps_its_own_fit_and_loses_the_interface(truth, tmp_path):
    structure = gemmi.read_structure(str(truth))
    shift = gemmi.Position(30.0, 0.0, 0.0)
    for residue in structure[0]["B"]:
        for atom in residue:
            atom.pos += shift
    scores = compare(_write(structure, tmp_path / "shifted.cif"), truth)
    assert scores.chain_ca_rmsd["A"] < 1e-6 and scores.chain_ca_rmsd["B"] < 1e-6
    assert scores.ca_rmsd > 5.0
    # only pairs across the interface change: lDDT stays high but not perfect
    assert 0.8 < scores.lddt < 1.0


def test_uniform_noise_gives_the_expected_rmsd(truth, tmp_path):
    structure = gemmi.read_structure(str(truth))
    rng = np.random.default_rng(0)
    sigma = 0.5
    for chain in structure[0]:
        for residue in chain:
            for atom in residue:
                atom.pos += gemmi.Position(*rng.normal(0.0, sigma, 3))
    scores = compare(_write(structure, tmp_path / "noisy.cif"), truth)
    # sqrt(3) sigma per atom, less what the superposition absorbs (6 of 3n degrees of freedom)
    expected = np.sqrt(3) * sigma
    assert scores.ca_rmsd == pytest.approx(expected, rel=0.15)
    assert scores.ligand_rmsd == pytest.approx(expected, rel=0.35)  # 66 atoms: a noisier estimate
    assert scores.lddt < 1.0


def test_lddt_and_rmsd_by_hand():
    truth = np.array([[0.0, 0, 0], [3.0, 0, 0], [0, 4.0, 0]])
    predicted = truth.copy()
    predicted[2, 1] = 5.0  # |1-3| pair still 3 A; pairs with atom 2: 4 -> 5 and 5 -> sqrt(34)
    errors = [0.0, 1.0, np.sqrt(34) - 5.0]
    expected = np.mean([np.mean([e < t for e in errors]) for t in (0.5, 1.0, 2.0, 4.0)])
    assert lddt(predicted, truth, np.arange(3)) == pytest.approx(expected)
    # atoms of one residue are not scored against each other
    assert lddt(predicted, truth, np.array([0, 0, 1])) == pytest.approx(
        np.mean([np.mean([e < t for e in errors[1:]]) for t in (0.5, 1.0, 2.0, 4.0)])
    )
    rotation = np.array([[0.0, -1, 0], [1, 0, 0], [0, 0, 1]])
    assert superposed_rmsd(truth @ rotation.T + 7.0, truth) < 1e-12


def test_command_prints_a_table_and_refuses_a_missing_file_in_one_line(truth, tmp_path):
    runner = CliRunner()
    result = runner.invoke(cli, ["evaluate", str(truth), "--truth", str(truth)])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[1].split("\t")[1:4] == ["0.00", "1.000", "1.000"]
    missing = tmp_path / "missing.cif"
    result = runner.invoke(cli, ["evaluate", str(missing), "--truth", str(truth)])
    assert result.exit_code == 2 and str(missing) in result.output
    assert "Traceback" not in result.output


def _renamed(structure: gemmi.Structure, names: dict[str, str]) -> None:
    """Author chains renamed (label chains follow), as another tool or a prediction names them."""
    for chain in structure[0]:
        chain.name = names[chain.name]
        for residue in chain:
            residue.subchain = chain.name


def test_chains_are_matched_by_sequence_whatever_their_names(shared_data, tmp_path):
    """2q2k: author chains F (DNA), A and B (protein), label chains A, B, C. A prediction names
    chains by the cache's label ids, so its A is the truth's F: matching by name would compare the
    DNA with a protein. Under any renaming, even names swapped between different molecules, the
    copy scores perfect and the map follows the sequences."""
    truth = shared_data / "structures" / "2q2k.cif"
    for names in ({"F": "A", "A": "B", "B": "C"}, {"F": "H", "A": "L", "B": "F"}):
        structure = gemmi.read_structure(str(truth))
        _renamed(structure, names)
        _moved(structure)
        scores = compare(_write(structure, tmp_path / "renamed.cif"), truth)
        # the two protein chains share a sequence: either assignment of them fits only one way
        assert scores.chain_map == names, names
        assert scores.ca_atoms == compare(truth, truth).ca_atoms > 100
        assert scores.ca_rmsd < 1e-6 and scores.lddt == pytest.approx(1.0)


def test_a_chain_of_another_sequence_under_the_truths_name_is_not_compared(truth, tmp_path):
    """721p's chain B replaced by a poly-alanine chain named B: nothing of it is matched (by name it
    would be, wherever an alanine sits at the same number), and chain A still scores."""
    structure = gemmi.read_structure(str(truth))
    for residue in structure[0]["B"]:
        residue.name = "ALA"
    _moved(structure)
    scores = compare(_write(structure, tmp_path / "other.cif"), truth)
    assert scores.chain_map == {"A": "A"}
    assert scores.ca_atoms == 166 and scores.ca_rmsd < 1e-6


def test_a_pdb_file_is_numbered_by_its_seqres_and_without_them_refused_in_one_line(shared_data, tmp_path):
    """2q2k's author numbers start at 4 (protein) and 12 (DNA) where its sequence places start at
    23 and 1: a PDB file is numbered in the sequence through its SEQRES records, as the mmCIF
    file is, so the one scores perfect against the other; without SEQRES it is refused, naming
    the file and the reason."""
    truth = shared_data / "structures" / "2q2k.cif"
    structure = gemmi.read_structure(str(truth))
    structure.setup_entities()
    pdb = tmp_path / "2q2k.pdb"
    structure.write_pdb(str(pdb))
    for predicted, reference in ((truth, pdb), (pdb, truth)):
        scores = compare(predicted, reference)
        assert scores.ca_atoms == compare(truth, truth).ca_atoms and scores.ca_rmsd < 1e-3
    bare = tmp_path / "bare.pdb"
    bare.write_text("".join(line for line in pdb.read_text().splitlines(True) if not line.startswith("SEQRES")))
    result = CliRunner().invoke(cli, ["evaluate", str(truth), "--truth", str(bare)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert f"{bare}: its polymer residues have no place in a sequence" in result.output
