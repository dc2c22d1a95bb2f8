"""TrainConfig: every setting of a training run, checked once when it is made.

How samples are cut (crop size, MSA rows, templates, seed) is the SampleConfig shared with the
datasets; everything else (model, optimizer, schedule, checkpoints, devices) is here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from featurecache.config import SampleConfig
from featurecache.kernels.runtime import KERNEL_CHOICES, runs_triton
from featurecache.model.config import PRESETS

# "auto": the Triton kernels on a CUDA device, the PyTorch references on the CPU.
KERNEL_OPTIONS = ("auto", *KERNEL_CHOICES)
# Noised copies of the ground truth per trunk pass when --diffusion-batch is not given: AF3's 48
# for its preset, 16 for `small`, a few for `tiny` so that CPU runs stay quick.
DEFAULT_DIFFUSION_BATCH = {"af3": 48, "protenix": 48, "small": 16, "tiny": 4}
# Atoms a token holds at most (a nucleotide has up to 23 heavy atoms; ligand and modified-residue
# tokens are one atom each) and token bonds per token (heavy atoms have at most 4 covalent
# partners, each bond counted once): the fixed atom and bond axes of --static-shapes batches.
ATOMS_PER_TOKEN_BOUND = 24
BONDS_PER_TOKEN_BOUND = 3
# Fixed atom axes bounded by the cache's largest target are rounded up to whole atom-attention
# key windows (ModelConfig.atom_window_keys in every preset).
ATOM_PAD_MULTIPLE = 128


class TrainSetupError(ValueError):
    """A setting or input that stops a run before its first step (the command's exit 2)."""


@dataclass(frozen=True)
class TrainConfig:
    cache: str | None = None           # feature cache (or published generation) to read
    online: str | None = None          # raw files to featurize at load time instead
    alignments: str | None = None      # alignment files for --online (as precompute --alignments)
    template_dir: str | None = None    # template mmCIF folder for --online
    out: str = "runs/train"
    tensorboard: str | None = None     # also write TensorBoard event files here (needs the tensorboard package)
    preset: str = "tiny"
    pairformer_blocks: int | None = None  # override the preset's depth (benchmarks on a time budget)
    # Pairformer blocks per activation checkpoint (ModelConfig.checkpoint_group): 1 keeps every
    # block's input; K ~ 7 keeps 48/K + K and recomputes the other pair-sized paths in backward,
    # for crops past ~2,000 tokens, at the cost of one more forward of the trunk
    checkpoint_group: int = 1
    kernels: str = "auto"
    steps: int = 100
    # N_cycle is drawn per step from 1..this (AF3: 4); None keeps the preset's max_recycling_cycles
    max_recycling_cycles: int | None = None
    diffusion_batch: int | None = None  # noised copies per trunk pass; None: DEFAULT_DIFFUSION_BATCH
    sample: SampleConfig = field(default_factory=SampleConfig)
    batch_size: int = 1                # samples per micro-batch and rank
    # Micro-batches per optimizer step and rank (gradient accumulation): an optimizer step
    # trains on batch_size * accumulate * world_size samples, the effective (global) batch.
    accumulate: int = 1
    # Ranks that hold one sample, its Pairformer's pair and single representations split by rows
    # (featurecache.model.sharding); the world is data-parallel replicas x pair_shards.
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
    weight_decay: float = 0.0          # AF3 uses plain Adam: no weight decay
    grad_clip: float = 10.0            # AF3 clips the global gradient norm at 10
    ema_decay: float = 0.999           # EMA of the weights, updated after every optimizer step (AF3)
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
    device: str = "auto"

    def __post_init__(self) -> None:
        object.__setattr__(self, "validation_keys", tuple(self.validation_keys))  # a list from callers
        if (self.cache is None) == (self.online is None):
            raise TrainSetupError("give exactly one of --cache DIR or --online DIR")
        if self.preset not in PRESETS:
            raise TrainSetupError(f"unknown preset {self.preset!r}, expected one of {sorted(PRESETS)}")
        if self.kernels not in KERNEL_OPTIONS:
            raise TrainSetupError(f"unknown kernels {self.kernels!r}, expected one of {KERNEL_OPTIONS}")
        if not isinstance(self.sample, SampleConfig):
            raise TrainSetupError(f"sample must be a SampleConfig, got {self.sample!r}")
        for name in ("steps", "batch_size", "accumulate", "pair_shards", "checkpoint_every", "prefetch_factor",
                     "lr_decay_every", "validation_sampler_steps", "checkpoint_group"):
            if getattr(self, name) < 1:
                raise TrainSetupError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        for name in ("max_recycling_cycles", "diffusion_batch"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise TrainSetupError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        if self.pairformer_blocks is not None and self.pairformer_blocks < 0:
            raise TrainSetupError(f"--pairformer-blocks must be >= 0, got {self.pairformer_blocks}")
        if self.init_from is not None and self.pairformer_blocks is not None:
            raise TrainSetupError("--pairformer-blocks does not go with --init-from: the model is the checkpoint's")
        for name in ("warmup", "num_workers", "weight_decay", "validate_every"):
            if getattr(self, name) < 0:
                raise TrainSetupError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(self, name)}")
        if not self.lr > 0 or not self.grad_clip > 0:
            raise TrainSetupError(f"--lr and the gradient clip must be positive, got {self.lr} and {self.grad_clip}")
        for name in ("adam_beta1", "adam_beta2", "ema_decay"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise TrainSetupError(f"--{name.replace('_', '-')} must be in [0, 1), got {getattr(self, name)}")
        if not 0.0 < self.lr_decay_factor <= 1.0 or not self.adam_eps > 0:
            raise TrainSetupError(f"--lr-decay-factor must be in (0, 1] and --adam-eps positive, got "
                                  f"{self.lr_decay_factor} and {self.adam_eps}")
        if not 0.0 <= self.validation_fraction < 1.0:
            raise TrainSetupError(f"--validation-fraction must be in [0, 1), got {self.validation_fraction}")
        if self.validation_keys and self.validation_fraction:
            raise TrainSetupError("give --validation-keys or --validation-fraction, not both")
        if self.validate_every and not (self.validation_keys or self.validation_fraction):
            raise TrainSetupError("--validate-every needs held-out targets: --validation-keys KEY... "
                                  "or --validation-fraction F")
        if self.cuda_graphs and self.pair_shards > 1:
            raise TrainSetupError("--cuda-graphs does not go with --pair-shards (the shards' collectives run "
                                  "inside the step, which is not captured)")
        if self.fixed_shapes and self.sample.crop_size is None:
            raise TrainSetupError("--static-shapes and --cuda-graphs need a crop size (every batch is padded to it)")
        if self.cuda_graphs and self.compile:
            raise TrainSetupError("--cuda-graphs and --compile do not go together: choose one")
        if self.cuda_graphs and self.device == "cpu":
            raise TrainSetupError("--cuda-graphs needs a CUDA device, --device is cpu")

    @property
    def diffusion_samples(self) -> int:
        """The diffusion batch this run trains with."""
        return self.diffusion_batch if self.diffusion_batch is not None else DEFAULT_DIFFUSION_BATCH.get(self.preset, 48)

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
        raise TrainSetupError(f"--kernels triton needs a CUDA device, this run is on {device.type} "
                              "(leave --kernels out or give --kernels torch; TRITON_INTERPRET=1 interprets "
                              "the kernels on the CPU, slowly)")
    return kernels

