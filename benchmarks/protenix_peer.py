"""Protenix 2.0 (PyPI `protenix`) as the peer of `benchmarks/train_step.py --model af3`.

Its own model (protenix.model.protenix.Protenix), loss (protenix.model.loss.ProtenixLoss),
symmetric permutation and optimizer factory, built from its own config at the benchmark's sizes
and trained one iteration at a time as its trainer does (runner/train.py, AF3Trainer.train_step):
bf16 autocast without the weight-cast cache, forward in train mode (mini-rollout of 20 steps,
label permutation, confidence head, the diffusion batch), its loss outside autocast, backward,
gradient clipping at 10, optimizer step.

Inputs are random features of the shapes and dtypes its featurizer gives
(protenix.data.utils.get_data_shape_dict), laid out like featurecache's random_batch: a protein
chain of `atoms_per_token` atoms per residue and two one-atom ligand tokens, an MSA and templates.

Where this differs from Protenix's defaults, and why:
- N_cycle 1 (the comparison's setting; its training draws 1 to 10 cycles per step);
- every MSA row each step (its `data.msa.min_size.train` raised to its row cutoff), as
  featurecache's runs use all rows; its default draws a uniform number of rows from 1 to all;
- AdamW (its `adam.use_adamw` option, fused on CUDA), as the comparison asks; its default is Adam;
- no learning-rate schedule step and no per-step torch.cuda.empty_cache() (its trainer's
  housekeeping, not the model's work);
- kernels: its defaults (cuEquivariance triangle kernels, a LayerNorm CUDA extension compiled
  at import) where this machine can run them, else its own plain-PyTorch or Triton options;
  `kernel_options` records which, with the reason.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import importlib.util
import io
import logging
import math
import os
import shutil
import subprocess
import sys
import time
import types

import numpy as np
import torch

MODEL_NAME = "protenix_base_default_v1.0.0"  # the model its configs train by default
_STARTED = time.perf_counter()


def _stage(message: str) -> None:
    """One progress line with the seconds since import: when a time budget stops the peer, the
    log says which stage (extension build, kernel autotuning, model build, a step) had the time."""
    print(f"[protenix {time.perf_counter() - _STARTED:6.1f} s] {message}", flush=True)


def unavailable_reason() -> str | None:
    """None when Protenix can be imported, else one line saying why not."""
    try:
        import protenix
    except ImportError:
        return "protenix not installed (pip install protenix==2.0.0)"
    if not protenix.__version__.startswith("2."):
        return f"protenix {protenix.__version__} installed, the peer is written for 2.0"
    return None


# --- its dependencies on scipy ------------------------------------------------------------------
# Protenix imports scipy for two things only: truncated-normal weight initialisation
# (triangular/layers.py) and uniformly random rotations for the coordinate augmentation
# (model/utils.py). scipy's wheel (~35 MB) does not fit what the GPU machine can be sent, so when
# scipy is absent these two are given here, drawing from the same distributions with numpy.


class _TruncatedNormal:
    """scipy.stats.truncnorm's std and rvs for the standard normal cut to [a, b]."""

    @staticmethod
    def std(a: float, b: float, loc: float = 0.0, scale: float = 1.0) -> float:
        pdf = lambda x: math.exp(-x * x / 2) / math.sqrt(2 * math.pi)
        cdf = lambda x: 0.5 * (1 + math.erf(x / math.sqrt(2)))
        mass = cdf(b) - cdf(a)
        mean = (pdf(a) - pdf(b)) / mass
        variance = 1 + (a * pdf(a) - b * pdf(b)) / mass - mean * mean
        return scale * math.sqrt(variance)

    @staticmethod
    def rvs(a: float, b: float, loc: float = 0.0, scale: float = 1.0, size: int = 1) -> np.ndarray:
        samples = np.random.standard_normal(size)
        outside = (samples < a) | (samples > b)
        while outside.any():  # rejection: exact, and [-2, 2] keeps 95 % of draws
            samples[outside] = np.random.standard_normal(int(outside.sum()))
            outside = (samples < a) | (samples > b)
        return loc + scale * samples


class _Rotation:
    """scipy.spatial.transform.Rotation.random(num).as_matrix(): a normalised Gaussian quaternion
    is uniform on SO(3), which is how scipy draws it."""

    def __init__(self, quaternions: np.ndarray) -> None:
        self.quaternions = quaternions  # [num, 4] as (x, y, z, w)

    @classmethod
    def random(cls, num: int = 1) -> _Rotation:
        quaternions = np.random.standard_normal((num, 4))
        return cls(quaternions / np.linalg.norm(quaternions, axis=1, keepdims=True))

    def as_matrix(self) -> np.ndarray:
        x, y, z, w = self.quaternions.T
        return np.stack(
            [
                np.stack([1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)], -1),
                np.stack([2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)], -1),
                np.stack([2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)], -1),
            ],
            -2,
        )


@contextlib.contextmanager
def _scipy_for_import():
    """While Protenix's modules import: scipy if installed, else the two objects above under
    scipy's names, removed again afterwards so nothing else sees them."""
    if importlib.util.find_spec("scipy") is not None:
        yield "scipy"
        return
    names = ["scipy", "scipy.stats", "scipy.spatial", "scipy.spatial.transform"]
    modules = {name: types.ModuleType(name) for name in names}
    modules["scipy.stats"].truncnorm = _TruncatedNormal
    modules["scipy.spatial.transform"].Rotation = _Rotation
    sys.modules.update(modules)
    try:
        yield "numpy stand-ins for scipy's truncnorm and Rotation.random (scipy not installed)"
    finally:
        for name in names:
            sys.modules.pop(name, None)


# --- kernel options -------------------------------------------------------------------------------


def _probe_triangle_attention(length: int) -> str | None:
    """None when Protenix's Triton triangle attention runs forward and backward here. At the
    model's head sizes and `length` tokens: its autotuner (48 configurations compiled and timed
    per sequence-length bucket) then keeps the result for the model's first steps."""
    try:
        # (its autotuner writes a cache beside its sources: the import fails where that is read-only)
        from protenix.model import tri_attention

        if not tri_attention.TRITON_AVAILABLE:  # it would fall back silently to an inexact path
            return f"its Triton kernel did not import: {tri_attention.triton_error}"
        # [B, N_i, N_j, heads 4, head dim 32] as its Pairformer's triangle attention
        q, k, v = (
            torch.randn(1, length, length, 4, 32, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            for _ in range(3)
        )
        mask_bias = torch.zeros(1, length, 1, 1, length, device="cuda", dtype=torch.bfloat16)
        pair_bias = torch.randn(1, 1, 4, length, length, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        tri_attention.TriAttentionFunction.apply(q, k, v, mask_bias, pair_bias).sum().backward()
        torch.cuda.synchronize()
    except Exception as error:  # noqa: BLE001 - any failure: the plain path is the honest fallback
        first_line = (str(error).splitlines() or [""])[0]
        return f"its Triton kernel failed: {type(error).__name__}: {first_line[:120]}"
    return None


def _probe_in_child(length: int) -> str | None:
    """_probe_triangle_attention in a child process. A faulting kernel ("illegal memory access",
    seen on the H200 with triton 3.6) leaves its CUDA context unusable for every later call, so
    the probe must not run in the process that then builds and times the model."""
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import protenix_peer; "
        "failure = protenix_peer._probe_triangle_attention(int(sys.argv[2])); "
        "print(failure or ''); sys.exit(3 if failure else 0)"
    )
    here = os.path.dirname(os.path.abspath(__file__))
    child = subprocess.run([sys.executable, "-c", code, here, str(length)], capture_output=True, text=True)
    if child.returncode == 0:
        return None
    lines = (child.stdout.strip() or child.stderr.strip() or f"exit status {child.returncode}").splitlines()
    return lines[-1][:200] if child.returncode == 3 else f"its Triton kernel's check crashed: {lines[-1][:160]}"


def _layernorm_choice(device: torch.device) -> tuple[str, str]:
    """Protenix picks its LayerNorm at import from LAYERNORM_TYPE: "fast_layernorm" (default, a
    CUDA extension compiled with nvcc at import) or anything else for torch's layer_norm."""
    if "LAYERNORM_TYPE" in os.environ:
        return os.environ["LAYERNORM_TYPE"], "LAYERNORM_TYPE set by the caller"
    if device.type != "cuda":
        return "torch", "no CUDA device"
    from torch.utils.cpp_extension import CUDA_HOME

    nvcc = os.path.join(CUDA_HOME, "bin", "nvcc") if CUDA_HOME else shutil.which("nvcc")
    if not nvcc or not os.path.exists(nvcc):
        return "torch", "its default fast_layernorm needs nvcc, absent here"
    if shutil.which("ninja") is None and importlib.util.find_spec("ninja") is None:
        return "torch", "its default fast_layernorm needs ninja, absent here"
    return "fast_layernorm", "its default"


def import_protenix(device: torch.device, first_length: int = 384) -> dict:
    """Import Protenix's model, loss and config with the LayerNorm this machine can run; returns
    the kernel options chosen (with reasons) and the modules. `first_length`: the crop of its
    first steps, where its triangle-attention kernel is tried."""
    layernorm, layernorm_reason = _layernorm_choice(device)
    os.environ["LAYERNORM_TYPE"] = layernorm
    with _scipy_for_import() as scipy_source:
        try:
            modules = _import_modules()
        except Exception as error:  # the extension's build failed: drop the half-imported package
            if layernorm != "fast_layernorm":
                raise
            for name in [n for n in sys.modules if n.split(".")[0] in ("protenix", "configs")]:
                del sys.modules[name]
            layernorm = os.environ["LAYERNORM_TYPE"] = "torch"
            layernorm_reason = f"its fast_layernorm did not build: {type(error).__name__}: {str(error)[:100]}"
            modules = _import_modules()
    options = {"layernorm": f"{layernorm} ({layernorm_reason})", "scipy": scipy_source}
    _stage(f"imported; LayerNorm {options['layernorm']}")
    cuequivariance = importlib.util.find_spec("cuequivariance_torch") is not None
    if device.type != "cuda":
        options["triangle_multiplicative"] = "torch (no CUDA device)"
        options["triangle_attention"] = "torch (no CUDA device)"
    elif cuequivariance:
        options["triangle_multiplicative"] = "cuequivariance (its default)"
        options["triangle_attention"] = "cuequivariance (its default)"
    else:
        options["triangle_multiplicative"] = "torch (its default cuequivariance is not installed)"
        _stage(f"checking its Triton triangle attention at length {first_length} (autotunes) in a child process")
        failure = _probe_in_child(first_length)
        _stage(f"check done: {failure or 'it runs'}")
        options["triangle_attention"] = (
            "triattention (its Triton kernel; its default cuequivariance is not installed)"
            if failure is None
            else f"torch (cuequivariance not installed; {failure})"
        )
    return {"options": options, **modules}


def _import_modules() -> dict:
    from configs.configs_base import configs as base_configs
    from configs.configs_data import data_configs
    from configs.configs_model_type import model_configs
    from protenix.config import parse_configs
    from protenix.model.loss import ProtenixLoss
    from protenix.model.protenix import Protenix
    from protenix.utils.permutation.permutation import SymmetricPermutation
    from protenix.utils.torch_utils import autocasting_disable_decorator
    from protenix.utils.training import get_optimizer

    return {
        "base_configs": base_configs,
        "data_configs": data_configs,
        "model_configs": model_configs,
        "parse_configs": parse_configs,
        "Protenix": Protenix,
        "ProtenixLoss": ProtenixLoss,
        "SymmetricPermutation": SymmetricPermutation,
        "get_optimizer": get_optimizer,
        "autocasting_disable_decorator": autocasting_disable_decorator,
    }


# --- configuration ------------------------------------------------------------------------------

# Fewer blocks everywhere (channels as the real model): a CPU check of the whole code path.
SMALL_BLOCKS = {
    "model": {
        "template_embedder": {"n_blocks": 1},
        "msa_module": {"n_blocks": 1},
        "confidence_head": {"n_blocks": 1},
        "diffusion_module": {
            "atom_encoder": {"n_blocks": 1},
            "transformer": {"n_blocks": 1},
            "atom_decoder": {"n_blocks": 1},
        },
    }
}


def _deep_update(target: dict, update: dict) -> dict:
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(target.get(key), dict):
            _deep_update(target[key], value)
        else:
            target[key] = value
    return target


def build_config(protenix: dict, depth: int, diffusion_batch: int, small: bool = False):
    """Protenix's training config for its default model, at the comparison's sizes."""
    config = copy.deepcopy({**protenix["base_configs"], "data": protenix["data_configs"]})
    _deep_update(config, copy.deepcopy(protenix["model_configs"][MODEL_NAME]))
    options = protenix["options"]
    _deep_update(
        config,
        {
            "n_blocks": depth,  # its Pairformer
            "diffusion_batch_size": diffusion_batch,
            "model": {"N_cycle": 1},
            # the row count drawn each step is uniform in [min_size, rows]: min_size at the cutoff
            # takes every row
            "data": {"msa": {"min_size": {"train": config["data"]["msa"]["sample_cutoff"]["train"]}}},
            "adam": {"use_adamw": True},
            "triangle_multiplicative": options["triangle_multiplicative"].split()[0],
            "triangle_attention": options["triangle_attention"].split()[0],
            "use_wandb": False,
        },
    )
    if small:
        _deep_update(config, copy.deepcopy(SMALL_BLOCKS))
    return protenix["parse_configs"](config, arg_str="", fill_required_with_null=True)


# --- synthetic inputs -----------------------------------------------------------------------------

NUM_RESTYPES = 32  # its token types: 20 amino acids, unknown, nucleotides, gap
NUM_ELEMENTS = 128
LIGAND_TYPE = 20  # "UNK": ligand tokens carry the unknown residue type


def synthetic_example(
    length: int, msa_rows: int, templates: int, atoms_per_token: int, generator: torch.Generator
) -> tuple[dict, dict, dict]:
    """(input features, cropped labels, full labels) for one example of `length` tokens: a protein
    chain with `atoms_per_token` atoms per residue and two bonded one-atom ligand tokens (as
    featurecache's random_batch), random values of its featurizer's shapes and dtypes."""
    ligands = min(2, length // 4)
    residues = length - ligands
    atoms_per = torch.tensor([atoms_per_token] * residues + [1] * ligands)
    atom_to_token = torch.repeat_interleave(torch.arange(length), atoms_per)  # [N_atom]
    atoms = len(atom_to_token)
    first_atom = torch.cumsum(atoms_per, 0) - atoms_per  # [N_token]
    atom_in_token = torch.arange(atoms) - first_atom[atom_to_token]
    is_ligand_token = torch.arange(length) >= residues
    is_ligand = is_ligand_token[atom_to_token].long()
    chain = is_ligand_token.long()  # chain 0 the protein, chain 1 the ligand

    def one_hot(index: torch.Tensor, classes: int) -> torch.Tensor:
        return torch.nn.functional.one_hot(index, classes)

    restype = torch.randint(0, 20, (length,), generator=generator).masked_fill(is_ligand_token, LIGAND_TYPE)
    profile = torch.softmax(torch.randn(length, NUM_RESTYPES, generator=generator), -1)
    token_bonds = torch.zeros(length, length)
    for i in range(residues, length - 1):
        token_bonds[i, i + 1] = token_bonds[i + 1, i] = 1.0
    # a rough chain of atoms, 1.5 Å apart, as the ground truth
    steps = torch.nn.functional.normalize(torch.randn(atoms, 3, generator=generator), dim=-1)
    coordinate = torch.cumsum(1.5 * steps, 0)
    coordinate -= coordinate.mean(0)
    rep_atom = (atom_in_token == 0).long()  # one representative atom per token
    # the atoms of every fourth residue's last two atoms are interchangeable, as in Asp, Glu, Phe,
    # Tyr, Arg (a quarter of a protein's residues)
    atom_perm_list = [[int(k)] for k in atom_in_token]
    # (each atom lists its index under each of its residue's permutations)
    for token in range(0, residues if atoms_per_token >= 2 else 0, 4):
        start = int(first_atom[token])
        for k in range(atoms_per_token):
            atom_perm_list[start + k] = [k, k]
        atom_perm_list[start + atoms_per_token - 2][1] = atoms_per_token - 1
        atom_perm_list[start + atoms_per_token - 1][1] = atoms_per_token - 2
    frame_atoms = first_atom[:, None] + torch.tensor([1, 0, 2])[None, :].clamp(max=atoms_per_token - 1)
    template_positions = torch.randn(templates, length, 3, generator=generator) * 10
    distances = torch.cdist(template_positions, template_positions)  # [T, N, N]
    bins = torch.linspace(3.25, 50.75, 38)
    features = {
        "residue_index": torch.where(is_ligand_token, 1, torch.arange(1, length + 1)),
        "token_index": torch.arange(length),
        "asym_id": chain,
        "entity_id": chain,
        "sym_id": torch.zeros(length, dtype=torch.long),
        "restype": one_hot(restype, NUM_RESTYPES).float(),
        "profile": profile,
        "deletion_mean": torch.rand(length, generator=generator),
        "token_bonds": token_bonds,
        "has_frame": (~is_ligand_token).long(),
        "frame_atom_index": frame_atoms.masked_fill(is_ligand_token[:, None], -1),
        "atom_to_token_idx": atom_to_token,
        "atom_to_tokatom_idx": atom_in_token,
        "ref_pos": torch.randn(atoms, 3, generator=generator) * 2,
        "ref_mask": torch.ones(atoms, dtype=torch.long),
        "ref_element": one_hot(torch.randint(0, 8, (atoms,), generator=generator), NUM_ELEMENTS),
        "ref_charge": torch.zeros(atoms, dtype=torch.long),
        "ref_atom_name_chars": one_hot(torch.randint(0, 64, (atoms, 4), generator=generator), 64),
        "ref_space_uid": atom_to_token.clone(),
        "mol_id": chain[atom_to_token],
        "entity_mol_id": chain[atom_to_token],
        "mol_atom_index": torch.arange(atoms),
        "is_protein": 1 - is_ligand,
        "is_rna": torch.zeros(atoms, dtype=torch.long),
        "is_dna": torch.zeros(atoms, dtype=torch.long),
        "is_ligand": is_ligand,
        "distogram_rep_atom_mask": rep_atom,
        "pae_rep_atom_mask": rep_atom,
        "plddt_m_rep_atom_mask": rep_atom,
        "modified_res_mask": torch.zeros(atoms, dtype=torch.long),
        "bond_mask": torch.zeros(atoms, atoms, dtype=torch.long),
        "resolution": torch.tensor([2.0]),
        "is_distillation": torch.tensor([False]),
        "msa": torch.randint(0, 21, (msa_rows, length), generator=generator),
        "has_deletion": (torch.rand(msa_rows, length, generator=generator) < 0.1).float(),
        "deletion_value": torch.rand(msa_rows, length, generator=generator),
        "template_aatype": torch.randint(0, 20, (templates, length), generator=generator),
        "template_distogram": one_hot(torch.bucketize(distances, bins), 39).float(),
        "template_pseudo_beta_mask": torch.ones(templates, length, length),
        "template_unit_vector": torch.nn.functional.normalize(
            torch.randn(templates, length, length, 3, generator=generator), dim=-1
        ),
        "template_backbone_frame_mask": torch.ones(templates, length, length),
        "atom_perm_list": atom_perm_list,
    }
    features["msa"][0] = restype  # the query row
    if ligands:  # the polymer-ligand bond
        polymer_atom, ligand_atom = int(first_atom[residues]) - 1, int(first_atom[residues])
        features["bond_mask"][polymer_atom, ligand_atom] = features["bond_mask"][ligand_atom, polymer_atom] = 1
    labels = {"coordinate": coordinate, "coordinate_mask": torch.ones(atoms, dtype=torch.long)}
    full_labels = {
        **labels,
        "mol_id": features["mol_id"],
        "entity_mol_id": features["entity_mol_id"],
        "mol_atom_index": features["mol_atom_index"],
        "pae_rep_atom_mask": rep_atom,
    }
    return features, labels, full_labels


# --- one training iteration -------------------------------------------------------------------------


class _PermutationErrors(logging.Handler):
    """Protenix's permutation code logs a warning and goes on when it fails; a benchmark must not
    time a step that silently skipped it."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage().splitlines()[0])


class ProtenixPeer:
    """Protenix's model, loss, permutation and optimizer at the given sizes; `iteration` trains
    once on a batch from `batch` (train_step.py's runner interface)."""

    graphs = False  # its step is not captured

    def __init__(
        self,
        device: torch.device,
        depth: int,
        diffusion_batch: int,
        atoms_per_token: int,
        small: bool = False,
        first_length: int = 384,
    ) -> None:
        self.device = device
        self.atoms_per_token = atoms_per_token
        self.protenix = import_protenix(device, first_length)
        self.kernel_options = self.protenix["options"]
        self.config = build_config(self.protenix, depth, diffusion_batch, small)
        tf32 = torch.backends.cuda.matmul.allow_tf32
        with contextlib.redirect_stdout(io.StringIO()):  # its factories print their settings
            self.model = self.protenix["Protenix"](self.config).to(device)
            self.optimizer = self.protenix["get_optimizer"](self.config, self.model)
        # its constructor sets the process-wide TF32 flag: held for its steps only
        self.tf32, torch.backends.cuda.matmul.allow_tf32 = torch.backends.cuda.matmul.allow_tf32, tf32
        self.loss = self.protenix["ProtenixLoss"](self.config)
        self.permutation = self.protenix["SymmetricPermutation"](self.config)
        self.errors = _PermutationErrors()
        logging.getLogger("protenix").addHandler(self.errors)
        self.step_count = 0
        self.model.train()
        _stage(f"model and optimizer built ({self.parameters_millions():.1f} M parameters)")

    def settings(self) -> str:
        """The settings behind its numbers, for the benchmark's table."""
        model = self.config.model
        return (
            f"{MODEL_NAME}: {model.pairformer.n_blocks} Pairformer, {model.template_embedder.n_blocks} template, "
            f"{model.msa_module.n_blocks} MSA blocks, {model.diffusion_module.transformer.n_blocks}-block "
            f"diffusion transformer, {model.confidence_head.n_blocks}-block confidence head after a "
            f"{self.config.sample_diffusion.N_step_mini_rollout}-step mini-rollout; N_cycle {model.N_cycle}, "
            f"diffusion batch {self.config.diffusion_batch_size}, every MSA row, AdamW; its defaults otherwise "
            f"(activation checkpoint every {self.config.blocks_per_ckpt} block, diffusion chunks of "
            f"{self.config.diffusion_chunk_size})"
        )

    def parameters_millions(self) -> float:
        return sum(p.numel() for p in self.model.parameters()) / 1e6

    def batch(self, length: int, msa_rows: int, templates: int) -> dict:
        generator = torch.Generator().manual_seed(length)
        features, labels, full_labels = synthetic_example(length, msa_rows, templates, self.atoms_per_token, generator)
        move = lambda d: {k: v.to(self.device) if isinstance(v, torch.Tensor) else v for k, v in d.items()}
        return {"input_feature_dict": move(features), "label_dict": move(labels), "label_full_dict": move(full_labels)}

    def forward_loss(self, batch: dict) -> torch.Tensor:
        # copies: its forward adds derived features (relp, d_lm, ...) to the dicts it is given
        features, labels = dict(batch["input_feature_dict"]), dict(batch["label_dict"])
        autocast = torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False, enabled=self.device.type == "cuda")
        with autocast:
            predictions, labels, _ = self.model(
                input_feature_dict=features,
                label_dict=labels,
                label_full_dict=batch["label_full_dict"],
                mode="train",
                current_step=self.step_count,
                symmetric_permutation=self.permutation,
                mc_dropout_apply_rate=0,
            )
            # outside autocast (its skip_amp.loss default), as its trainer's get_loss does
            loss, _ = self.protenix["autocasting_disable_decorator"](self.config.skip_amp.loss)(self.loss)(
                feat_dict=features, pred_dict=predictions, label_dict=labels, mode="train"
            )
        return loss

    def iteration(self, batch: dict) -> None:
        outer_tf32 = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = self.tf32
        try:
            loss = self.forward_loss(batch)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_clip_norm)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = outer_tf32
        self.step_count += 1
        if self.errors.messages:
            raise RuntimeError(f"Protenix's permutation failed: {self.errors.messages[0]}")
        if not torch.isfinite(loss):
            raise FloatingPointError(f"non-finite Protenix loss {loss.item()}")
        _stage(f"step {self.step_count} done (its loss read back: the GPU's work included)")
