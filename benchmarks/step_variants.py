"""The variants benchmarks/train_step.py compares, and how each is built and stepped: one
Pairformer block (block_step), a whole training iteration of the trunk (TrunkRunner) or of the
full model (FullModelRunner), and the protenix peer run in a child process (peer_in_child)."""

from __future__ import annotations

import json
import math
import os
import pathlib
import subprocess
import sys
import tempfile
import time

import harness  # noqa: F401  (puts the repository root on sys.path, for featurecache)
import protenix_peer
import torch
from step_timing import autocast, free_memory, peak_gb, reset_peak, sync, timed

from featurecache.kernels.evo_attention import SizeLimitError
from featurecache.model import AF3Model, preset
from featurecache.model.network.pairformer import PairformerBlock
from featurecache.testing.synthetic import random_batch
from featurecache.training.cuda_graph import CapturedStep

VARIANTS = {
    # name: (kernels, torch.compile the blocks, replay the step as a CUDA graph)
    "triton": ("triton", False, False),
    "eager": ("torch", False, False),
    "compile": ("torch", True, False),
    # the kernels plus torch.compile of the glue around them (norms, gates, residual adds)
    "triton+compile": ("triton", True, False),
    # the kernels, the whole step captured once and replayed (featurecache.training.cuda_graph): no host
    # launch cost; shapes must stay fixed, so this variant has no crop search
    "triton+graphs": ("triton", False, True),
}
# Peers: another project's model at the same sizes (--model af3 only), trained by its own code
# (benchmarks/protenix_peer.py); no block section, no crop search (about 10 s a step).
PEERS = ("protenix",)
COLUMNS = (*VARIANTS, *PEERS)
# torch.compile's options for the compiled variants: the backend (--compile-backend: aot_eager checks
# the tracing where inductor's C++ compilation takes many minutes on a busy CPU) and `dynamic`
# (StepRun sets it: True when a crop search will run, so the search does not recompile per size;
# else None, static shapes first, which compiles faster)
COMPILE = {"backend": "inductor", "dynamic": None}


def is_compiled(variant: str) -> bool:
    return variant in VARIANTS and VARIANTS[variant][1]


def peer_unavailable(variant: str, model: str) -> str | None:
    """Why the peer cannot run here (one line), or None."""
    if model != "af3":
        return "a full-model peer: needs --model af3"
    return protenix_peer.unavailable_reason()


# --- one Pairformer block ------------------------------------------------------------------------


def block_step(variant: str, length: int, dims: dict, device: torch.device):
    """A Pairformer block of `variant` on fp32 inputs of length L (10 % padding): its fwd+bwd step."""
    kernels, compiled, graphs = VARIANTS[variant]
    block = PairformerBlock(
        dims["c_s"],
        dims["c_z"],
        dims["single_heads"],
        dims["single_head_dim"],
        dims["pair_heads"],
        dims["pair_head_dim"],
        4,
        kernels=kernels,
    ).to(device)
    if compiled:
        block.compile(**COMPILE)
    generator = torch.Generator(device=device).manual_seed(length)
    s = torch.randn(1, length, dims["c_s"], device=device, generator=generator, requires_grad=True)
    z = torch.randn(1, length, length, dims["c_z"], device=device, generator=generator, requires_grad=True)
    token_mask = torch.arange(length, device=device)[None] < math.ceil(0.9 * length)  # 10 % padding
    pair_mask = token_mask[:, :, None] & token_mask[:, None, :]
    grad_s = torch.randn_like(s)
    grad_z = torch.randn_like(z)

    def step(inputs: dict | None = None) -> dict:
        s_in, z_in = (s, z) if inputs is None else (inputs["s"], inputs["z"])
        s_in.grad = z_in.grad = None
        block.zero_grad(set_to_none=True)
        with autocast(device, cache=not graphs):
            s_out, z_out = block(s_in, z_in, token_mask, pair_mask)
        torch.autograd.backward([s_out, z_out], [grad_s.to(s_out.dtype), grad_z.to(z_out.dtype)])
        return {}

    if graphs:
        # Captured at the first call, inside timed(): the capture's allocations then count
        # toward the peak (a replay allocates nothing new, so a peak reset after capture would
        # see only the inputs and weights).
        captured = CapturedStep(step, warmup_steps=2)

        def replay() -> None:
            while not captured.is_captured:  # the first call warms up and captures
                captured({"s": s, "z": z})
            captured({"s": s, "z": z})

        return replay
    return step


def bench_block(variant: str, length: int, dims: dict, device: torch.device, warmup: int, reps: int) -> dict:
    ms, peak = timed(block_step(variant, length, dims, device), device, warmup, reps, graphs=VARIANTS[variant][2])
    return {"ms": ms, "peak_gb": peak}


# --- whole training iterations -------------------------------------------------------------------


class TrunkRunner:
    """One model and optimizer per variant, reused across crop sizes (compiled graphs too)."""

    atoms_per_token = 2

    def __init__(self, variant: str, config_overrides: dict, device: torch.device) -> None:
        kernels, compiled, self.graphs = VARIANTS[variant]
        self.device = device
        self.model = self.build(preset("af3", kernels=kernels, **config_overrides)).to(device)
        if compiled:
            self.model.compile_blocks(**COMPILE)
        self.model.train()
        # capturable: the step counter lives on the GPU, so the update can be replayed
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4, capturable=self.graphs)
        self.captured: dict = {}

    def build(self, config) -> torch.nn.Module:
        return AF3Model(config)

    def batch(self, length: int, msa_rows: int, templates: int) -> dict:
        generator = torch.Generator().manual_seed(length)
        batch = random_batch([length], [msa_rows], [templates], generator, num_atoms_per_token=self.atoms_per_token)
        return {k: v.to(self.device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}

    def forward_loss(self, batch: dict) -> torch.Tensor:
        # the trunk alone (no diffusion batch): its loss is the distogram's
        with autocast(self.device, cache=not self.graphs):
            outputs = self.model(batch, num_cycles=1, diffusion_batch=0)
        return self.model.loss(batch, outputs)[0]

    def step(self, batch: dict) -> dict:
        loss = self.forward_loss(batch)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 10.0)
        self.optimizer.step()
        return {"loss": loss}

    def iteration(self, batch: dict) -> None:
        if self.graphs:
            tensors = {k: v for k, v in batch.items() if isinstance(v, torch.Tensor)}
            others = {k: v for k, v in batch.items() if not isinstance(v, torch.Tensor)}
            shapes = tuple((k, tuple(v.shape)) for k, v in tensors.items())
            if shapes not in self.captured:
                # one size at a time: an earlier size's graph and memory pool would count in this
                # size's peak (the step table measures 384, then 768)
                self.captured.clear()
                free_memory()
                self.captured[shapes] = CapturedStep(lambda inputs: self.step({**inputs, **others}), warmup_steps=2)
            graph = self.captured[shapes]
            while not graph.is_captured:  # the first call at a size warms up and captures
                graph(tensors)
            loss = graph(tensors)["loss"]
        else:
            loss = self.step(batch)["loss"]
        if not torch.isfinite(loss):
            raise FloatingPointError(f"non-finite loss {loss.item()}")

    def fits(self, length: int, msa_rows: int, templates: int) -> tuple[bool, float, float]:
        """One iteration at `length`: (fits in memory, seconds, peak GB)."""
        free_memory()
        reset_peak(self.device)
        start = time.perf_counter()
        try:
            self.iteration(self.batch(length, msa_rows, templates))
            sync(self.device)
        except (torch.cuda.OutOfMemoryError, SizeLimitError) as error:
            if isinstance(error, SizeLimitError):
                print(f"    L={length}: {error}", flush=True)
            self.optimizer.zero_grad(set_to_none=True)
            free_memory()
            return False, time.perf_counter() - start, float("nan")
        return True, time.perf_counter() - start, peak_gb(self.device)


class FullModelRunner(TrunkRunner):
    """The full AF3 model: N_cycle 1 (as peers report their step), the diffusion batch of
    `diffusion_batch` noised copies drawn from the default generator (a CUDA graph replays it)."""

    def __init__(
        self, variant: str, config_overrides: dict, device: torch.device, diffusion_batch: int, atoms_per_token: int
    ) -> None:
        self.atoms_per_token = atoms_per_token
        self.diffusion_batch = diffusion_batch
        super().__init__(variant, config_overrides, device)

    def forward_loss(self, batch: dict) -> torch.Tensor:
        with autocast(self.device, cache=not self.graphs):
            outputs = self.model(batch, num_cycles=1, diffusion_batch=self.diffusion_batch)
        return self.model.loss(batch, outputs)[0]


# --- the peer in a child process -----------------------------------------------------------------


def peer_in_child(args, seconds: float) -> dict:
    """The protenix variant run by train_step.py in a child process (--peer-in-process): a CUDA
    fault in its kernels (sticky for the whole CUDA context, seen on the H200) or a crash then
    cannot reach the other variants, and its memory is gone before theirs is built. Returns its
    result keys (step<crop>/protenix, peer), an error per crop the child did not report."""
    out = pathlib.Path(tempfile.mkdtemp(prefix="train-step-peer-"))
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "train_step.py")
    argv = [
        sys.executable,
        script,
        "--peer-in-process",
        "--variants",
        "protenix",
        "--model",
        args.model,
        "--depth",
        str(args.depth),
        "--crop",
        *map(str, args.crop),
        "--diffusion-batch",
        str(args.diffusion_batch),
        "--atoms-per-token",
        str(args.atoms_per_token),
        "--msa-rows",
        str(args.msa_rows),
        "--templates",
        str(args.templates),
        "--peer-reps",
        str(args.peer_reps),
        "--block-lengths",
        "--no-checks",
        "--crop-budget-s",
        "0",
        "--budget-s",
        f"{seconds:.0f}",
        "--out",
        str(out),
        *(["--smoke"] if args.smoke else []),
    ]
    try:
        status = subprocess.run(argv, timeout=seconds + 60, check=False).returncode
    except subprocess.TimeoutExpired:
        status = "killed at its time limit"
    try:
        child = json.loads((out / "train_step.json").read_text())
    except (OSError, ValueError):
        child = {}
    found = {key: value for key, value in child.items() if key == "peer" or key.endswith("/protenix")}
    for crop in args.crop:
        found.setdefault(f"step{crop}/protenix", {"error": f"its child process ended first (exit status {status})"})
    return found
