"""TrainConfig: every setting of a training run, checked once when it is made.

How samples are cut (crop size, MSA rows, templates, seed) is the SampleConfig shared with the
datasets; the model is a preset of featurecache.model.config with settings overridden by their
ModelConfig names (`model_settings`: the train command's --pairformer-blocks, --checkpoint-group,
--max-recycling-cycles and --diffusion-batch); everything else (optimizer, schedule,
checkpoints, devices) is here.
"""

from __future__ import annotations

import math

from dataclasses import dataclass, field
from typing import Any

import torch

from featurecache.config import SampleConfig
from featurecache.kernels.runtime import KERNEL_CHOICES, runs_triton
from featurecache.model.config import PRESETS, RUNTIME_SETTINGS, ModelConfig, preset

# "auto": the Triton kernels on a CUDA device, the PyTorch references on the CPU.
KERNEL_OPTIONS = ("auto", *KERNEL_CHOICES)
# The model settings an --init-from run may set over its checkpoint's: how the run trains (its
# kernels and recomputation, recycling count and diffusion batch), not what the weights are.
INIT_FROM_SETTINGS = (*RUNTIME_SETTINGS, "max_recycling_cycles", "diffusion_batch")
# Atoms a token holds at most (a nucleotide has up to 23 heavy atoms; ligand and modified-residue
# tokens are one atom each) and token bonds per token (heavy atoms have at most 4 covalent
# partners, each bond counted once): the fixed atom and bond axes of --static-shapes batches.
ATOMS_PER_TOKEN_BOUND = 24
BONDS_PER_TOKEN_BOUND = 3
# Fixed atom axes bounded by the cache's largest target are rounded up to whole atom-attention
# key windows (ModelConfig.atom_attention.atom_window_keys in every preset).
ATOM_PAD_MULTIPLE = 128


class TrainSetupError(ValueError):
    """A setting or input that stops a run before its first step (the command's exit 2)."""


@dataclass(frozen=True)
class TrainConfig:
    cache: str | None = None  # feature cache (or published generation) to read
    online: str | None = None  # raw files to featurize at load time instead
    alignments: str | None = None  # alignment files for --online (as precompute --alignments)
    template_dir: str | None = None  # template mmCIF folder for --online
    out: str = "runs/train"
    tensorboard: str | None = None  # also write TensorBoard event files here (needs the tensorboard package)
    preset: str = "tiny"
    # ModelConfig settings that differ from the preset's, by name (featurecache.model.config), e.g.
    # {"pairformer_blocks": 8, "checkpoint_group": 7, "max_recycling_cycles": 1, "diffusion_batch": 16};
    # the kernels are `kernels` below
    model_settings: dict[str, Any] = field(default_factory=dict)
    kernels: str = "auto"
    steps: int = 100
    sample: SampleConfig = field(default_factory=SampleConfig)
    batch_size: int = 1  # samples per micro-batch and rank
    # Micro-batches per optimizer step and rank (gradient accumulation): an optimizer step
    # trains on batch_size * accumulate * world_size samples, the effective (global) batch.
    accumulate: int = 1
    # Ranks that hold one sample, its Pairformer's pair and single representations split by rows
    # (featurecache.model.parallel.sharding); the world is data-parallel replicas x pair_shards.
    pair_shards: int = 1
    # AF3's optimizer (SI 5.4): Adam with these settings, the learning rate rising linearly over
    # `warmup` steps to `lr`, then multiplied by `lr_decay_factor` every `lr_decay_every` steps.
    lr: float = 1.8e-3
    adam_beta1: float = 0.9
    adam_beta2: float = 0.95
    adam_eps: float = 1e-8
    warmup: int = 1000
    lr_decay_factor: float = 0.95
    lr_decay_every: int = 50_000
    weight_decay: float = 0.0  # AF3 uses plain Adam: no weight decay
    grad_clip: float = 10.0  # AF3 clips the global gradient norm at 10
    ema_decay: float = 0.999  # EMA of the weights, updated after every optimizer step (AF3)
    # Validation: every `validate_every` steps (0: never), on held-out cache keys that training
    # never samples, either named or a seeded fraction of the cache's targets.
    validate_every: int = 0
    validation_keys: tuple[str, ...] = ()
    validation_fraction: float = 0.0
    validation_sampler_steps: int = 20  # diffusion sampler steps of a validation prediction
    # Bitwise reproducible steps: deterministic algorithms, cuBLAS workspace, seeded generators.
    deterministic: bool = False
    num_workers: int = 2
    prefetch_factor: int = 2
    checkpoint_every: int = 1000
    # A time budget in minutes (None: none): the run stops after the step that spends it, with a
    # checkpoint there (training/interrupt.py), as a finished run does.
    max_minutes: float | None = None
    resume: str | None = None
    # Start from a checkpoint's weights and model settings (a model converted from Protenix by
    # `featurecache convert`, or another run's) instead of --preset's fresh ones: fine-tuning.
    # The optimizer, schedule and data position start afresh; --resume continues such a run.
    init_from: str | None = None
    compile: bool = False
    # Pad every batch to the sample's crop size, MSA rows and templates, so all steps have one
    # shape: torch.compile compiles once (and a step could be a CUDA graph).
    static_shapes: bool = False
    # Replay each step from CUDA graphs (featurecache.training.cuda_graph): implies static shapes; one GPU
    # or data-parallel ranks (gradients all-reduced between the graphs), not with pair shards.
    cuda_graphs: bool = False
    # With fixed shapes, the atom axis (and token bonds with it) pads to the smallest of at most this
    # many sizes chosen from the cache (training/buckets.py): one CUDA graph each. 1: one size for
    # every batch, what the largest crop can hold (~2x a 384-token protein crop's ~3,000 atoms on
    # real PDB data). Each more bucket costs one more graph to warm up and capture, once per run.
    atom_buckets: int = 4
    device: str = "auto"

    def __post_init__(self) -> None:
        object.__setattr__(self, "validation_keys", tuple(self.validation_keys))  # a list from callers
        object.__setattr__(self, "model_settings", dict(self.model_settings))  # a copy: the config stays as it was made
        if (self.cache is None) == (self.online is None):
            raise TrainSetupError("give exactly one of --cache DIR or --online DIR")
        if self.preset not in PRESETS:
            raise TrainSetupError(f"unknown preset {self.preset!r}, expected one of {sorted(PRESETS)}")
        if self.kernels not in KERNEL_OPTIONS:
            raise TrainSetupError(f"unknown kernels {self.kernels!r}, expected one of {KERNEL_OPTIONS}")
        if "kernels" in self.model_settings:
            raise TrainSetupError("the model's kernels are TrainConfig.kernels (--kernels), not a model setting")
        try:
            self.model_config("torch")
        except (TypeError, ValueError) as error:
            raise TrainSetupError(f"model settings {self.model_settings}: {error}") from None
        if self.init_from is not None:
            fixed = sorted(name for name in self.model_settings if name not in INIT_FROM_SETTINGS)
            if fixed:
                raise TrainSetupError(
                    f"model settings {fixed} do not go with --init-from: the model is the "
                    f"checkpoint's (a run may set only {', '.join(INIT_FROM_SETTINGS)})"
                )
        if not isinstance(self.sample, SampleConfig):
            raise TrainSetupError(f"sample must be a SampleConfig, got {self.sample!r}")
        for name in (
            "steps",
            "batch_size",
            "accumulate",
            "pair_shards",
            "checkpoint_every",
            "prefetch_factor",
            "lr_decay_every",
            "validation_sampler_steps",
            "atom_buckets",
        ):
            if getattr(self, name) < 1:
                raise TrainSetupError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        for name in ("warmup", "num_workers", "weight_decay", "validate_every"):
            if getattr(self, name) < 0:
                raise TrainSetupError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(self, name)}")
        if self.max_minutes is not None and not 0.0 < self.max_minutes < math.inf:
            raise TrainSetupError(f"--max-minutes must be a positive number of minutes, got {self.max_minutes}")
        if not self.lr > 0 or not self.grad_clip > 0:
            raise TrainSetupError(f"--lr and the gradient clip must be positive, got {self.lr} and {self.grad_clip}")
        for name in ("adam_beta1", "adam_beta2", "ema_decay"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise TrainSetupError(f"--{name.replace('_', '-')} must be in [0, 1), got {getattr(self, name)}")
        if not 0.0 < self.lr_decay_factor <= 1.0 or not self.adam_eps > 0:
            raise TrainSetupError(
                f"--lr-decay-factor must be in (0, 1] and --adam-eps positive, got "
                f"{self.lr_decay_factor} and {self.adam_eps}"
            )
        if not 0.0 <= self.validation_fraction < 1.0:
            raise TrainSetupError(f"--validation-fraction must be in [0, 1), got {self.validation_fraction}")
        if self.validation_keys and self.validation_fraction:
            raise TrainSetupError("give --validation-keys or --validation-fraction, not both")
        if self.validate_every and not (self.validation_keys or self.validation_fraction):
            raise TrainSetupError(
                "--validate-every needs held-out targets: --validation-keys KEY... or --validation-fraction F"
            )
        if self.cuda_graphs and self.pair_shards > 1:
            raise TrainSetupError(
                "--cuda-graphs does not go with --pair-shards (the shards' collectives run "
                "inside the step, which is not captured)"
            )
        if self.fixed_shapes and self.sample.crop_size is None:
            raise TrainSetupError("--static-shapes and --cuda-graphs need a crop size (every batch is padded to it)")
        if self.cuda_graphs and self.compile:
            raise TrainSetupError("--cuda-graphs and --compile do not go together: choose one")
        if self.cuda_graphs and self.device == "cpu":
            raise TrainSetupError("--cuda-graphs needs a CUDA device, --device is cpu")

    def model_config(self, kernels: str) -> ModelConfig:
        """The model this run trains: its preset with its `model_settings`, on `kernels`
        (resolve_kernels' choice for the run's device)."""
        return preset(self.preset, **self.model_settings, kernels=kernels)

    @property
    def fixed_shapes(self) -> bool:
        """Every batch padded to one shape (asked for, or needed by CUDA graphs)."""
        return self.static_shapes or self.cuda_graphs


def resolve_kernels(kernels: str, device: torch.device) -> str:
    """The kernels a run uses on `device`: "auto" picks Triton on CUDA and the PyTorch path on
    the CPU; Triton on the CPU runs only under Triton's interpreter (TRITON_INTERPRET=1)."""
    if kernels == "auto":
        return "triton" if device.type == "cuda" else "torch"
    if kernels == "triton" and not runs_triton(device):
        raise TrainSetupError(
            f"--kernels triton needs a CUDA device, this run is on {device.type} "
            "(leave --kernels out or give --kernels torch; TRITON_INTERPRET=1 interprets "
            "the kernels on the CPU, slowly)"
        )
    return kernels
