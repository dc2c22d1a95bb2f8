"""Training loop for the AF3 structure model (trunk + diffusion): one process, or DDP under torchrun.

    featurecache train --cache DIR --preset tiny --steps 100 --out runs/tiny
    torchrun --nproc-per-node 8 -m featurecache.training --cache DIR --preset af3 --out runs/af3

A run checks everything it was given (device, kernels, cache, checkpoint) before it creates its
run directory, then steps until `steps`. Each step draws N_cycle (1..max_recycling_cycles, the
same on every rank) and runs the trunk once and the diffusion module on `diffusion_samples`
noised copies of the truth; its random draws come from generators seeded by (seed, step, rank),
so a resumed run draws what the straight run drew. Each step logs one JSON line to
RUN_DIR/log.jsonl (the loss and its terms, N_cycle, step time, time spent waiting for data, peak
memory) and a readable line on stdout; checkpoints (featurecache.training.checkpoint) continue a
run exactly where it stopped.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import pathlib
import random
import resource
import time
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import torch

from featurecache.model import AF3Model, preset, sample_num_cycles
from featurecache.model.af3 import LOSS_INPUTS, REQUIRED_INPUTS
from featurecache.training.checkpoint import (checkpoint_path, load_checkpoint, optimizer_state, rng_state,
                                              save_checkpoint, set_rng_state)
from featurecache.training.config import TrainConfig, TrainSetupError, resolve_kernels
from featurecache.training.cuda_graph import CapturedStep
from featurecache.training.data import build_dataset, fixed_sizes, make_batch_sampler, make_loader, to_device
from featurecache.training.distributed import Dist, all_ranks, barrier, mean_over_ranks, setup_distributed, shutdown
from featurecache.training.sampler import EpochBatchSampler
from featurecache.training.schedule import GraphLearningRate, warmup_schedule

LOG_FILE = "log.jsonl"
# Launched steps before a CUDA graph is captured: they compile the kernels and create the
# optimizer state, neither of which may happen during a capture.
GRAPH_WARMUP_STEPS = 3


@dataclass
class Position:
    """Where a run is: optimizer steps taken, and the next batch's epoch and place in it."""

    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0


class Trainer:
    """The model and everything that updates it: optimizer, warmup schedule, bf16 autocast on
    GPU, DDP across ranks and, with `cuda_graphs`, the step captured as one CUDA graph."""

    def __init__(self, config: TrainConfig, kernels: str, world: Dist) -> None:
        self.config = config
        self.world = world
        overrides = {"kernels": kernels}
        if config.pairformer_blocks is not None:
            overrides["num_pairformer_blocks"] = config.pairformer_blocks
        if config.max_recycling_cycles is not None:
            overrides["max_recycling_cycles"] = config.max_recycling_cycles
        self.model = AF3Model(preset(config.preset, **overrides)).to(world.device)
        if config.compile:
            self.model.compile_blocks()
        # capturable: AdamW's step counter stays on the GPU, so the update can be replayed by a graph
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=config.lr, betas=(0.9, 0.95), eps=1e-8,
                                           weight_decay=config.weight_decay, capturable=config.cuda_graphs)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, warmup_schedule(config.warmup))
        self.trained: torch.nn.Module = self.model
        self.graph_lr: GraphLearningRate | None = None
        self.captured: CapturedStep | None = None
        # A captured step must not use autocast's cache of cast weights (its tensors outlive the graph).
        self.autocast = (torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=not config.cuda_graphs)
                         if world.device.type == "cuda" else contextlib.nullcontext())

    def restore(self, state: dict) -> Position:
        """Load a checkpoint's model, optimizer, scheduler and this rank's RNG states."""
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        set_rng_state(state["rng"][self.world.rank])
        return Position(state["step"], state["epoch"], state["batch_in_epoch"])

    def start(self) -> None:
        """Wrap for DDP and CUDA graphs, once the states are loaded."""
        if self.config.cuda_graphs:
            self.graph_lr = GraphLearningRate(self.optimizer, self.world.device)
            # One graph, so one N_cycle: a graph run always recycles max_recycling_cycles times.
            # Its noise comes from the device's default generator, which the graph replays from
            # the seed step_generators gives it before each replay.
            cycles, noise = self.model.config.max_recycling_cycles, default_generator(self.world.device)
            self.captured = CapturedStep(lambda inputs: self.update(inputs, cycles, noise),
                                         warmup_steps=GRAPH_WARMUP_STEPS)
        if self.world.enabled:
            # static_graph: reentrant checkpointing runs parts of backward inside autograd calls,
            # which a static graph handles (recorded in the first step). The graph is the same
            # whatever N_cycle: only the last cycle builds one.
            device_ids = [self.world.device.index] if self.world.device.type == "cuda" else None
            self.trained = torch.nn.parallel.DistributedDataParallel(self.model, device_ids=device_ids,
                                                                     static_graph=True)
        self.model.train()

    def update(self, batch: dict, num_cycles: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
        """Forward (N_cycle trunk cycles, the diffusion batch), loss, backward, clipping and the
        AdamW update: no host synchronization, so that it can be captured as a CUDA graph.
        Returns the loss terms (AF3Model.loss's metrics) and the gradient norm."""
        with self.autocast:
            outputs = self.trained(batch, num_cycles=num_cycles, num_diffusion_samples=self.config.diffusion_samples,
                                   generator=generator)
        loss, metrics = self.model.loss(batch, outputs)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_clip)
        self.optimizer.step()
        return {**metrics, "grad_norm": grad_norm}

    def step(self, batch: dict, step: int) -> tuple[dict[str, torch.Tensor], int]:
        """Optimizer step number `step` (0-based); the schedule advances. Returns its results
        and its N_cycle. A captured step copies the pinned host batch straight into the graph's
        input buffers, an eager one takes it on the device."""
        cycle_generator, noise_generator = step_generators(self.config.sample.seed, step, self.world)
        if self.captured is not None:
            num_cycles = self.model.config.max_recycling_cycles
            result = self.captured(graph_inputs(batch))
        else:
            num_cycles = sample_num_cycles(cycle_generator, self.model.config.max_recycling_cycles)
            result = self.update(batch, num_cycles, noise_generator)
        self.scheduler.step()
        if self.graph_lr is not None:
            self.graph_lr.set(self.scheduler.get_last_lr()[0])
        return result, num_cycles

    def checkpoint(self, position: Position, rng_states: list[dict]) -> dict:
        return {
            "model": self.model.state_dict(),
            "optimizer": optimizer_state(self.optimizer),
            "scheduler": self.scheduler.state_dict(),
            "step": position.step,
            "epoch": position.epoch,
            "batch_in_epoch": position.batch_in_epoch,
            "rng": rng_states,
            "world_size": self.world.world_size,
            "train_config": dataclasses.asdict(self.config),
            "model_config": dataclasses.asdict(self.model.config),
        }


def default_generator(device: torch.device) -> torch.Generator:
    """The default generator of a CUDA device (the one CUDA graphs replay with its current seed)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    return torch.cuda.default_generators[index]


def step_generators(seed: int, step: int, world: Dist) -> tuple[torch.Generator, torch.Generator]:
    """The random draws of optimizer step `step`, seeded so that a resumed run repeats them:
    N_cycle from (seed, step), the same on every rank (ranks stay in step), and the diffusion
    batch's rotations and noise from (seed, step, rank), on the device (on CUDA its default
    generator, reseeded here)."""
    cycle_seed, noise_seed = (int(np.random.SeedSequence(words).generate_state(1, dtype=np.uint64)[0])
                              for words in ([seed, step], [seed, step, world.rank]))
    cycles = torch.Generator().manual_seed(cycle_seed)
    if world.device.type == "cuda":
        return cycles, default_generator(world.device).manual_seed(noise_seed)
    return cycles, torch.Generator().manual_seed(noise_seed)


def graph_inputs(batch: dict) -> dict[str, torch.Tensor]:
    """The tensors a captured step reads: the model's and its loss's inputs."""
    return {name: batch[name] for name in dict.fromkeys(REQUIRED_INPUTS + LOSS_INPUTS)}


def peak_memory_gb(device: torch.device) -> float:
    """Peak accelerator memory of this step, or the process's peak resident set on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 1e9
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kib / 1e6


class RunLog:
    """log.jsonl and the stdout lines, written by the main rank only."""

    def __init__(self, run_dir: pathlib.Path, world: Dist) -> None:
        self.file = open(run_dir / LOG_FILE, "a") if world.is_main else None

    def write(self, record: dict) -> None:
        if self.file is None:
            return
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()
        print(f"step {record['step']:>6d}  loss {record['loss']:.4f}  cycles {record['num_cycles']}  step {record['step_time_s'] * 1e3:8.1f} ms"
              f"  data wait {record['data_wait_s'] * 1e3:7.1f} ms  peak {record['peak_memory_gb']:.2f} GB",
              flush=True)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


def train(config: TrainConfig) -> list[dict]:
    """Run the loop; returns this rank's per-step log records. Anything wrong with what the run
    was given is a TrainSetupError (a ValueError) raised before the run directory is made."""
    world = setup_distributed(config.device)
    try:
        kernels = _check_setup(config, world)
        dataset = build_dataset(config)
        pad_to = fixed_sizes(config, dataset)
        steps_per_epoch = _steps_per_epoch(len(dataset), config, world)
        resumed = load_checkpoint(pathlib.Path(config.resume), world.world_size) if config.resume else None

        run_dir = pathlib.Path(config.out)
        if world.is_main:
            run_dir.mkdir(parents=True, exist_ok=True)
        _seed(config.sample.seed, world.rank)
        trainer = Trainer(config, kernels, world)
        position = trainer.restore(resumed) if resumed is not None else Position()
        trainer.start()
        run_log = RunLog(run_dir, world)
        try:
            return _run(config, world, trainer, dataset, pad_to, position, steps_per_epoch, run_log, run_dir)
        finally:
            run_log.close()
    finally:
        shutdown(world)


def _check_setup(config: TrainConfig, world: Dist) -> str:
    """The kernels this run uses; device settings that cannot work are a TrainSetupError."""
    if config.cuda_graphs and (world.device.type != "cuda" or world.enabled):
        raise TrainSetupError("--cuda-graphs runs on one CUDA device (not on the CPU, not under DDP yet)")
    kernels = resolve_kernels(config.kernels, world.device)
    if config.kernels == "auto" and world.is_main:
        path = "featurecache's Triton kernels" if kernels == "triton" else "the PyTorch path (no CUDA device)"
        print(f"featurecache train: {world.device.type}, --kernels auto: {kernels}, {path}", flush=True)
    return kernels


def _steps_per_epoch(num_samples: int, config: TrainConfig, world: Dist) -> int:
    steps = EpochBatchSampler(num_samples, config.batch_size, world.rank, world.world_size,
                              config.sample.seed).steps_per_epoch
    if steps == 0:
        raise TrainSetupError(f"{num_samples} samples over {world.world_size} ranks give no full batch of "
                              f"--batch-size {config.batch_size}")
    return steps


def _seed(seed: int, rank: int) -> None:
    random.seed(seed + rank)
    np.random.seed(seed + rank)
    torch.manual_seed(seed)  # same initial weights on every rank


def _run(config: TrainConfig, world: Dist, trainer: Trainer, dataset, pad_to: dict[str, int] | None,
         position: Position, steps_per_epoch: int, run_log: RunLog, run_dir: pathlib.Path) -> list[dict]:
    """Step until `config.steps`, epoch after epoch, logging and checkpointing as configured.

    One loader (and one set of workers) serves the whole run, unless the dataset must switch to
    a newly published generation at each epoch: then set_epoch runs here and the loader is
    rebuilt per epoch, since workers hold a copy of the dataset.
    """
    loader_per_epoch = getattr(dataset, "follow_latest", False)
    records: list[dict] = []
    batches: Iterator[dict] | None = None
    while position.step < config.steps:
        if batches is None:
            if loader_per_epoch:
                dataset.set_epoch(position.epoch)  # before the iterator exists: workers copy the dataset
            sampler = make_batch_sampler(dataset, config, world, start_epoch=position.epoch,
                                         start_batch=position.batch_in_epoch, epochs=1 if loader_per_epoch else None)
            batches = iter(make_loader(dataset, sampler, config, world.device, pad_to))
        while position.step < config.steps and position.batch_in_epoch < steps_per_epoch:
            record = _step(world, trainer, batches, position)
            records.append(record)
            run_log.write(record)
            if position.step % config.checkpoint_every == 0 or position.step == config.steps:
                _save(world, trainer, position, steps_per_epoch, run_dir)
        if position.batch_in_epoch >= steps_per_epoch:
            position.epoch += 1
            position.batch_in_epoch = 0
            if loader_per_epoch:
                batches = None
    return records


def _step(world: Dist, trainer: Trainer, batches: Iterator[dict], position: Position) -> dict:
    """Fetch a batch, take one step, and return its log record (losses averaged over ranks)."""
    start = time.perf_counter()
    if world.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(world.device)
    batch = next(batches)
    if trainer.captured is None:
        batch = to_device(batch, world.device)
    data_wait = time.perf_counter() - start
    result, num_cycles = trainer.step(batch, position.step)
    position.step += 1
    position.batch_in_epoch += 1
    terms = [name for name in result if name != "grad_norm"]  # loss, distogram, diffusion, mse, ...
    means = mean_over_ranks(world, torch.stack([result[name].float() for name in terms])).tolist()
    return {
        "step": position.step,
        "epoch": position.epoch,
        **dict(zip(terms, means)),
        "num_cycles": num_cycles,
        "grad_norm": result["grad_norm"].item(),
        "lr": float(trainer.scheduler.get_last_lr()[0]),
        "step_time_s": time.perf_counter() - start,
        "data_wait_s": data_wait,
        "peak_memory_gb": peak_memory_gb(world.device),
        "tokens": int(batch["token_pad_mask"].sum()),
        "ids": all_ranks(world, batch["id"]),  # per rank
        "world_size": world.world_size,
    }


def _save(world: Dist, trainer: Trainer, position: Position, steps_per_epoch: int, run_dir: pathlib.Path) -> None:
    """A checkpoint at `position`; one that ends an epoch resumes at the next epoch's start."""
    end_of_epoch = position.batch_in_epoch >= steps_per_epoch
    saved = Position(position.step, position.epoch + 1, 0) if end_of_epoch else position
    rng_states = all_ranks(world, rng_state())
    if world.is_main:
        save_checkpoint(checkpoint_path(run_dir, position.step), trainer.checkpoint(saved, rng_states))
    barrier(world)
