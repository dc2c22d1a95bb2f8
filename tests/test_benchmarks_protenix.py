"""The Protenix peer of benchmarks/train_step.py (benchmarks/protenix_peer.py).

With protenix installed: its synthetic example has the shapes Protenix's featurizer declares,
one iteration at reduced depth runs forward, loss, backward and the optimizer step on the CPU,
and train_step.py reports the variant with its settings. Without it (CI): train_step.py reports
the variant skipped, with the reason, and still writes its table.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest
import torch

REPO = pathlib.Path(__file__).resolve().parents[1]
BENCHMARKS = REPO / "benchmarks"


@pytest.fixture(scope="module")
def protenix_peer():
    pytest.importorskip("protenix")
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import protenix_peer
    finally:
        sys.path.remove(str(BENCHMARKS))
    return protenix_peer


def run_train_step(tmp_path: pathlib.Path, *arguments: str, hide_protenix: bool = False) -> dict:
    """train_step.py --smoke --model af3 at crop 24 with only the given variants; its JSON."""
    out = tmp_path / "out"
    argv = [
        "train_step.py",
        "--smoke",
        "--model",
        "af3",
        "--depth",
        "1",
        "--crop",
        "24",
        "--diffusion-batch",
        "2",
        "--msa-rows",
        "8",
        "--templates",
        "1",
        "--block-lengths",
        "--no-checks",
        "--budget-s",
        "600",
        "--out",
        str(out),
        *arguments,
    ]
    # sys.modules["protenix"] = None makes `import protenix` fail, as where it is not installed
    hide = "sys.modules['protenix'] = None; " if hide_protenix else ""
    code = (
        f"import sys, runpy; {hide}"
        f"sys.path.insert(0, {str(BENCHMARKS)!r}); sys.argv = {argv!r}; "
        f"runpy.run_path({str(BENCHMARKS / 'train_step.py')!r}, run_name='__main__')"
    )
    completed = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=900, check=False
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    return {"json": json.loads((out / "train_step.json").read_text()), "table": (out / "train_step.md").read_text()}


def test_variant_skipped_with_reason_without_protenix(tmp_path):
    result = run_train_step(tmp_path, "--variants", "protenix", hide_protenix=True)
    assert result["json"]["step24/protenix"] == {"skipped": "protenix not installed (pip install protenix==2.0.0)"}
    row = next(line for line in result["table"].splitlines() if line.startswith("| training iteration"))
    assert "skipped: protenix not installed" in row


def protenix_shapes(tokens: int, atoms: int, rows: int, templates: int) -> dict:
    """The shapes Protenix 2.0 declares for its features and labels (protenix/data/utils.py,
    get_data_shape_dict: that module needs pandas to import, so they are copied here), with the
    two template masks as its template featurizer gives them, pair masks [T, N, N]."""
    token, atom = (tokens,), (atoms,)
    return {
        "residue_index": token,
        "token_index": token,
        "asym_id": token,
        "entity_id": token,
        "sym_id": token,
        "restype": (tokens, 32),
        "entity_mol_id": atom,
        "mol_id": atom,
        "mol_atom_index": atom,
        "ref_pos": (atoms, 3),
        "ref_mask": atom,
        "ref_element": (atoms, 128),
        "ref_charge": atom,
        "ref_atom_name_chars": (atoms, 4, 64),
        "ref_space_uid": atom,
        "msa": (rows, tokens),
        "has_deletion": (rows, tokens),
        "deletion_value": (rows, tokens),
        "profile": (tokens, 32),
        "deletion_mean": token,
        "template_pseudo_beta_mask": (templates, tokens, tokens),
        "template_backbone_frame_mask": (templates, tokens, tokens),
        "template_distogram": (templates, tokens, tokens, 39),
        "template_unit_vector": (templates, tokens, tokens, 3),
        "token_bonds": (tokens, tokens),
        "is_protein": atom,
        "is_rna": atom,
        "is_dna": atom,
        "is_ligand": atom,
        "distogram_rep_atom_mask": atom,
        "pae_rep_atom_mask": atom,
        "plddt_m_rep_atom_mask": atom,
        "modified_res_mask": atom,
        "bond_mask": (atoms, atoms),
        "resolution": (1,),
        "atom_to_token_idx": atom,
        "atom_to_tokatom_idx": atom,
        "is_distillation": (1,),
        "coordinate": (atoms, 3),
        "coordinate_mask": atom,
        "has_frame": token,
        "frame_atom_index": (tokens, 3),
    }


def test_synthetic_example_has_protenix_shapes(protenix_peer):
    length, rows, templates, atoms_per_token = 20, 6, 2, 8
    features, labels, full_labels = protenix_peer.synthetic_example(
        length, rows, templates, atoms_per_token, torch.Generator().manual_seed(0)
    )
    atoms = (length - 2) * atoms_per_token + 2  # two one-atom ligand tokens
    for name, shape in protenix_shapes(length, atoms, rows, templates).items():
        value = features[name] if name in features else labels[name]
        assert tuple(value.shape) == shape, name
    assert features["template_aatype"].shape == (templates, length)
    assert len(features["atom_perm_list"]) == atoms
    for name in ("coordinate", "coordinate_mask", "mol_id", "entity_mol_id", "mol_atom_index"):
        assert full_labels[name].shape[0] == atoms
    assert int(features["distogram_rep_atom_mask"].sum()) == length  # one representative atom per token


def test_one_iteration_trains(protenix_peer):
    peer = protenix_peer.ProtenixPeer(torch.device("cpu"), depth=1, diffusion_batch=2, atoms_per_token=4, small=True)
    assert peer.config.model.N_cycle == 1 and peer.config.diffusion_batch_size == 2
    assert peer.config.model.pairformer.n_blocks == 1
    assert type(peer.optimizer).__name__ == "AdamW"
    before = {name: p.detach().clone() for name, p in peer.model.named_parameters()}
    batch = peer.batch(20, 6, 1)
    peer.iteration(batch)
    moved = [name for name, p in peer.model.named_parameters() if not torch.equal(before[name], p)]
    # the diffusion module, the trunk and the confidence head all took the step
    for part in ("diffusion_module.", "pairformer_stack.", "confidence_head.", "msa_module.", "template_embedder."):
        assert any(name.startswith(part) for name in moved), part
    assert torch.isfinite(peer.forward_loss(batch))


def test_train_step_reports_protenix(tmp_path, protenix_peer):
    result = run_train_step(tmp_path, "--variants", "protenix")
    step = result["json"]["step24/protenix"]
    assert step["ms"] > 0, step
    assert "torch (no CUDA device)" in result["json"]["peer"]["kernel_options"]["triangle_attention"]
    assert "| Protenix: " in result["table"]


def test_kernel_probe_failure_stays_in_its_child_process():
    """The probe of Protenix's Triton triangle attention runs in a child process: a kernel that
    faults there (on the H200 it left the CUDA context unusable for the model built next) comes
    back as a one-line reason, and this process carries on. Here it fails for want of CUDA (or of
    protenix), the same path."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import protenix_peer
    finally:
        sys.path.remove(str(BENCHMARKS))
    reason = protenix_peer._probe_in_child(8)
    assert reason and "\n" not in reason and "its Triton kernel" in reason
    assert torch.ones(2).sum().item() == 2.0
