"""Training loop for the AF3 trunk: one process, or DDP under torchrun.

    featurecache train --cache DIR --preset tiny --steps 100 --out runs/tiny
    torchrun --nproc-per-node 8 -m featurecache.training --cache DIR --preset af3 --out runs/af3

Each step logs one JSON line to RUN_DIR/log.jsonl (loss, step time, time spent waiting for data,
peak memory) and a readable line on stdout. Checkpoints hold everything needed to continue
exactly where the run stopped: model, optimizer, scheduler, step, data position and the RNG
states of every rank; they are written to a temporary file and renamed, so a crash never leaves
a half-written checkpoint behind.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import os
import pathlib
import random
import resource
import time
from dataclasses import dataclass
from typing import Iterator

import click
import numpy as np
import torch
import torch.distributed as dist

from featurecache.training.cuda_graph import CapturedStep
from featurecache.model import AF3Trunk, preset
from featurecache.model.config import KERNEL_IMPLS, PRESETS

CHECKPOINT_PREFIX = "checkpoint-"
LOG_FILE = "log.jsonl"


@dataclass(frozen=True)
class TrainConfig:
    cache: str | None = None           # feature cache (or published generation) to read
    online: str | None = None          # raw files to featurize at load time instead
    alignments: str | None = None      # alignment files for --online (as precompute --alignments)
    template_dir: str | None = None    # template mmCIF folder for --online
    out: str = "runs/train"
    preset: str = "tiny"
    pairformer_blocks: int | None = None  # override the preset's depth (benchmarks on a time budget)
    kernels: str = "triton"
    steps: int = 100
    crop_size: int = 384
    max_msa_rows: int = 1024
    batch_size: int = 1
    lr: float = 1.8e-3                 # AF3's peak learning rate
    warmup: int = 1000                 # linear warmup steps (AF3: 1000)
    weight_decay: float = 0.0
    grad_clip: float = 10.0            # AF3 clips the global gradient norm at 10
    num_workers: int = 2
    prefetch_factor: int = 2
    checkpoint_every: int = 1000
    resume: str | None = None
    compile: bool = False
    # Pad every batch to crop_size tokens, max_msa_rows rows and max_templates templates, so all
    # steps have one shape: torch.compile compiles once (and a step could be a CUDA graph).
    static_shapes: bool = False
    max_templates: int = 4
    # Replay each step as one CUDA graph (featurecache.training.cuda_graph): implies static shapes; one GPU.
    cuda_graphs: bool = False
    seed: int = 0
    device: str = "auto"

    def __post_init__(self) -> None:
        if (self.cache is None) == (self.online is None):
            raise ValueError("give exactly one of --cache DIR or --online DIR")
        if self.preset not in PRESETS:
            raise ValueError(f"unknown preset {self.preset!r}, expected one of {sorted(PRESETS)}")
        if self.kernels not in KERNEL_IMPLS:
            raise ValueError(f"unknown kernels {self.kernels!r}, expected one of {KERNEL_IMPLS}")
        for name in ("steps", "crop_size", "batch_size", "checkpoint_every", "max_msa_rows", "max_templates"):
            if getattr(self, name) <= 0:
                raise ValueError(f"--{name.replace('_', '-')} must be positive, got {getattr(self, name)}")
        if self.warmup < 0 or self.num_workers < 0:
            raise ValueError("--warmup and --num-workers must be >= 0")
        if self.cuda_graphs and self.compile:
            raise ValueError("--cuda-graphs and --compile do not go together: choose one")
        if self.cuda_graphs and self.device == "cpu":
            raise ValueError("--cuda-graphs needs a CUDA device, --device is cpu")

    @property
    def fixed_shapes(self) -> bool:
        """Every batch padded to one shape (asked for, or needed by CUDA graphs)."""
        return self.static_shapes or self.cuda_graphs


# --- distributed -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Dist:
    rank: int
    world_size: int
    device: torch.device

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def setup_distributed(device: str) -> Dist:
    """Join the process group torchrun describes in the environment (gloo on CPU, nccl on GPU)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        torch.cuda.set_device(local_rank)
        target = torch.device("cuda", local_rank)
    else:
        target = torch.device(device)
    if world_size > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if target.type == "cuda" else "gloo")
    return Dist(rank=rank, world_size=world_size, device=target)


# --- data ------------------------------------------------------------------------------------


class EpochBatchSampler(torch.utils.data.Sampler):
    """Batches of (epoch, index) pairs, epoch after epoch, for one DataLoader that serves a run.

    Each epoch is a new shuffle, the same on every rank (seeded by seed and epoch); each rank
    takes every world_size-th index, padded by wrapping so that all ranks run the same number of
    steps, and an incomplete last batch is dropped, so no batch straddles two epochs. Iteration
    starts at (start_epoch, start_batch), which is how a resumed run skips what it already
    trained on without loading it, and runs on through later epochs (`epochs` of them, or without
    end). The epoch travels with each index, so the dataset's workers pick each epoch's crops
    without `set_epoch` and are started once per run, not once per epoch.
    """

    def __init__(self, num_samples: int, batch_size: int, rank: int, world_size: int, seed: int,
                 start_epoch: int = 0, start_batch: int = 0, epochs: int | None = None) -> None:
        if num_samples == 0:
            raise ValueError("the dataset is empty")
        self.num_samples = num_samples
        self.batch_size = batch_size
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.start_epoch = start_epoch
        self.start_batch = start_batch
        self.epochs = epochs

    @property
    def steps_per_epoch(self) -> int:
        return math.ceil(self.num_samples / self.world_size) // self.batch_size

    def epoch_order(self, epoch: int) -> list[int]:
        """This rank's indices for one epoch, in order."""
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        order = torch.randperm(self.num_samples, generator=generator).tolist()
        per_rank = math.ceil(self.num_samples / self.world_size)
        order = (order * math.ceil(per_rank * self.world_size / self.num_samples))[: per_rank * self.world_size]
        return order[self.rank::self.world_size]

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        epoch, first = self.start_epoch, self.start_batch
        while self.epochs is None or epoch < self.start_epoch + self.epochs:
            order = self.epoch_order(epoch)
            for batch in range(first, self.steps_per_epoch):
                yield [(epoch, index) for index in order[batch * self.batch_size:(batch + 1) * self.batch_size]]
            epoch, first = epoch + 1, 0


class OnlineDataset(torch.utils.data.Dataset):
    """Features built from the raw files each time a sample is read: what training pays per
    example without a cache (parse the mmCIF, parse its alignments, featurize), followed by the
    same crop and MSA subsampling as CacheDataset, so the two feed the model identical samples.
    """

    spatial_crop_prob = 0.5  # as CacheDataset's default

    def __init__(self, inputs_dir: str | os.PathLike, alignments_dir: str | os.PathLike | None = None,
                 template_dir: str | os.PathLike | None = None, crop_size: int | None = 384,
                 max_msa_rows: int = 1024, seed: int = 0) -> None:
        from featurecache.io.inputs import InputError, discover_inputs, target_id_for

        inputs_dir = pathlib.Path(inputs_dir)
        if not inputs_dir.is_dir():
            raise click.UsageError(f"--online {inputs_dir}: no such directory")
        for option, folder in (("--alignments", alignments_dir), ("--template-dir", template_dir)):
            if folder is not None and not pathlib.Path(folder).is_dir():
                raise click.UsageError(f"{option} {folder}: no such directory")
        try:
            found = discover_inputs([inputs_dir])
        except InputError as error:
            raise click.UsageError(f"--online {inputs_dir}: {error}") from error
        # featurize_from_files reads mmCIF; FASTA inputs carry no structure to train on
        self.paths = [path for path in found if ".cif" in path.name.lower()]
        if not self.paths:
            raise click.UsageError(f"--online {inputs_dir}: no mmCIF files in it")
        self.ids = [target_id_for(path) for path in self.paths]
        self.alignments_dir = alignments_dir
        self.template_dir = template_dir
        self.crop_size = crop_size
        self.max_msa_rows = max_msa_rows
        self.seed = seed
        self.epoch = 0
        self._alignments = None

    def __len__(self) -> int:
        return len(self.paths)

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_alignments"] = None  # each worker indexes the alignment folder itself
        return state

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __getitem__(self, item: int | tuple[int, int]) -> dict:
        """One sample; `item` is an index (crops of the current epoch) or an (epoch, index) pair."""
        from featurecache.config import FeatureConfig
        from featurecache.features.featurize import featurize_from_files
        from featurecache.io.alignments import AlignmentIndex
        from featurecache.loader import crop_sample

        if self._alignments is None and self.alignments_dir is not None:
            self._alignments = AlignmentIndex(self.alignments_dir)
        epoch, index = item if isinstance(item, tuple) else (self.epoch, item)
        arrays, _ = featurize_from_files(self.paths[index], self._alignments, FeatureConfig(), self.template_dir)
        rng = np.random.default_rng([self.seed, epoch, index])
        # CacheDataset's crop and subsampling, so both datasets yield the same samples
        return crop_sample(self.ids[index], arrays, rng, self.crop_size, self.max_msa_rows, self.spatial_crop_prob)


def build_dataset(config: TrainConfig):
    from featurecache.loader import CacheDataset

    if config.cache is not None:
        cache = pathlib.Path(config.cache)
        if not cache.is_dir():
            raise click.UsageError(f"--cache {cache}: no such directory")
        return CacheDataset(cache, crop_size=config.crop_size, max_msa_rows=config.max_msa_rows, seed=config.seed)
    return OnlineDataset(config.online, config.alignments, config.template_dir, crop_size=config.crop_size,
                         max_msa_rows=config.max_msa_rows, seed=config.seed)


def make_loader(dataset, batch_sampler: EpochBatchSampler, config: TrainConfig, device: torch.device):
    from featurecache.loader import collate

    extra = {}
    if config.num_workers > 0:
        extra["prefetch_factor"] = config.prefetch_factor
    collate_fn = collate
    if config.fixed_shapes:
        pad_to = {"token": config.crop_size, "msa": config.max_msa_rows, "template": config.max_templates}
        collate_fn = functools.partial(collate, pad_to=pad_to)
    return torch.utils.data.DataLoader(
        dataset,
        batch_sampler=batch_sampler,
        num_workers=config.num_workers,
        collate_fn=collate_fn,
        pin_memory=device.type == "cuda",
        **extra,
    )


def to_device(batch: dict, device: torch.device) -> dict:
    return {
        name: value.to(device, non_blocking=True) if isinstance(value, torch.Tensor) else value
        for name, value in batch.items()
    }


# --- checkpoints -----------------------------------------------------------------------------


def rng_state() -> dict:
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def checkpoint_path(run_dir: pathlib.Path, step: int) -> pathlib.Path:
    return run_dir / f"{CHECKPOINT_PREFIX}{step:08d}.pt"


def latest_checkpoint(path: pathlib.Path) -> pathlib.Path:
    """`path` itself if it is a file, else the newest checkpoint in that run directory."""
    if path.is_file():
        return path
    found = sorted(path.glob(f"{CHECKPOINT_PREFIX}*.pt")) if path.is_dir() else []
    if not found:
        raise click.UsageError(f"--resume {path}: no checkpoint file and no {CHECKPOINT_PREFIX}*.pt in it")
    return found[-1]


def save_checkpoint(path: pathlib.Path, state: dict) -> None:
    """Write to a temporary file beside `path`, then rename: readers never see a partial file."""
    partial = path.with_name(path.name + ".partial")
    with open(partial, "wb") as handle:
        torch.save(state, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(partial, path)


def gather_rng_states(world: Dist) -> list[dict]:
    """Every rank's RNG states, on every rank (each rank restores its own on resume)."""
    local = rng_state()
    if not world.enabled:
        return [local]
    gathered: list = [None] * world.world_size
    dist.all_gather_object(gathered, local)
    return gathered


# --- the loop --------------------------------------------------------------------------------


def peak_memory_gb(device: torch.device) -> float:
    """Peak accelerator memory of this step, or the process's peak resident set on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 1e9
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kib / 1e6


def warmup_schedule(warmup: int):
    return lambda step: min(1.0, (step + 1) / warmup) if warmup > 0 else 1.0


class GraphLearningRate:
    """The learning rate of a CUDA-graph run, kept in one GPU tensor that the captured AdamW
    step reads: the scheduler computes each step's value, this writes it into the tensor (a
    float would be frozen into the graph at capture)."""

    def __init__(self, optimizer: torch.optim.Optimizer, device: torch.device) -> None:
        self.optimizer = optimizer
        self.value = torch.tensor(float(optimizer.param_groups[0]["lr"]), device=device)
        self.set(float(optimizer.param_groups[0]["lr"]))

    def set(self, lr: float) -> None:
        # LR schedulers of some torch versions assign a float to group["lr"], newer ones fill
        # the tensor in place: either way the group reads the tensor again afterwards.
        self.value.fill_(float(lr))
        for group in self.optimizer.param_groups:
            group["lr"] = self.value


def optimizer_state(optimizer: torch.optim.Optimizer) -> dict:
    """The optimizer's state_dict with a tensor learning rate written as a float, so that a
    checkpoint of a CUDA-graph run resumes in any mode (a non-capturable AdamW refuses tensor lr)."""
    state = optimizer.state_dict()
    for group in state["param_groups"]:
        if isinstance(group.get("lr"), torch.Tensor):
            group["lr"] = float(group["lr"])
    return state


def graph_inputs(batch: dict) -> dict[str, torch.Tensor]:
    """The tensors a captured step reads: the trunk's and its loss's inputs. Atom-level arrays
    vary in size even in padded batches, and the token-level trunk does not read them."""
    from featurecache.model.trunk import LOSS_INPUTS, REQUIRED_INPUTS

    return {name: batch[name] for name in dict.fromkeys(REQUIRED_INPUTS + LOSS_INPUTS)}


def train(config: TrainConfig) -> list[dict]:
    """Run the loop; returns this rank's per-step log records."""
    world = setup_distributed(config.device)
    run_dir = pathlib.Path(config.out)
    if world.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)

    random.seed(config.seed + world.rank)
    np.random.seed(config.seed + world.rank)
    torch.manual_seed(config.seed)  # same initial weights on every rank

    dataset = build_dataset(config)
    steps_per_epoch = EpochBatchSampler(len(dataset), config.batch_size, world.rank, world.world_size,
                                        config.seed).steps_per_epoch
    if steps_per_epoch == 0:
        raise click.UsageError(
            f"{len(dataset)} samples over {world.world_size} ranks give no full batch of {config.batch_size}")

    overrides = {"kernels": config.kernels}
    if config.pairformer_blocks is not None:
        overrides["num_pairformer_blocks"] = config.pairformer_blocks
    model = AF3Trunk(preset(config.preset, **overrides)).to(world.device)
    if config.compile:
        model.compile_blocks()
    if config.cuda_graphs and (world.device.type != "cuda" or world.enabled):
        raise click.UsageError("--cuda-graphs runs on one CUDA device (not on the CPU, not under DDP yet)")
    # capturable: AdamW's step counter stays on the GPU, so the update can be replayed by a graph
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, betas=(0.9, 0.95), eps=1e-8,
                                  weight_decay=config.weight_decay, capturable=config.cuda_graphs)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_schedule(config.warmup))

    step, epoch, batch_in_epoch = 0, 0, 0
    if config.resume:
        source = latest_checkpoint(pathlib.Path(config.resume))
        state = torch.load(source, map_location="cpu", weights_only=False)
        if state["world_size"] != world.world_size:
            raise click.UsageError(
                f"--resume {source}: written by {state['world_size']} ranks, this run has {world.world_size}")
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        step, epoch, batch_in_epoch = state["step"], state["epoch"], state["batch_in_epoch"]
        set_rng_state(state["rng"][world.rank])
    graph_lr = GraphLearningRate(optimizer, world.device) if config.cuda_graphs else None

    # static_graph: the single track feeds no loss, so its parameters never get a gradient, and
    # reentrant checkpointing runs parts of backward inside autograd calls; a static graph
    # handles both (recorded in the first step).
    trained = model
    if world.enabled:
        trained = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[world.device.index] if world.device.type == "cuda" else None,
            static_graph=True)
    # A captured step must not use autocast's cache of cast weights (its tensors outlive the graph).
    autocast = (torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=not config.cuda_graphs)
                if world.device.type == "cuda" else contextlib.nullcontext())

    def train_step(batch: dict) -> dict[str, torch.Tensor]:
        """Forward, loss, backward, clipping and the AdamW update: no host synchronization, so
        that it can be captured as a CUDA graph."""
        with autocast:
            outputs = trained(batch)
        loss = model.loss(batch, outputs)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        optimizer.step()
        return {"loss": loss.detach(), "grad_norm": grad_norm}

    captured = CapturedStep(train_step, warmup_steps=3) if config.cuda_graphs else None

    log_file = open(run_dir / LOG_FILE, "a") if world.is_main else None
    records: list[dict] = []
    # One loader (and one set of workers) for the whole run, unless the dataset must switch to a
    # newly published generation at each epoch: then set_epoch runs here and the loader is
    # rebuilt per epoch, since workers hold a copy of the dataset.
    loader_per_epoch = getattr(dataset, "follow_latest", False)
    batches = None
    model.train()
    try:
        while step < config.steps:
            if batches is None:
                if loader_per_epoch:
                    dataset.set_epoch(epoch)  # before the iterator exists: workers copy the dataset
                batch_sampler = EpochBatchSampler(len(dataset), config.batch_size, world.rank, world.world_size,
                                                  config.seed, start_epoch=epoch, start_batch=batch_in_epoch,
                                                  epochs=1 if loader_per_epoch else None)
                batches = iter(make_loader(dataset, batch_sampler, config, world.device))
            while step < config.steps and batch_in_epoch < steps_per_epoch:
                start = time.perf_counter()
                if world.device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(world.device)
                batch = next(batches)
                if captured is None:
                    batch = to_device(batch, world.device)
                data_wait = time.perf_counter() - start

                if captured is not None:
                    # straight from the pinned batch into the graph's input buffers
                    result = captured(graph_inputs(batch))
                else:
                    result = train_step(batch)
                scheduler.step()
                if graph_lr is not None:
                    graph_lr.set(scheduler.get_last_lr()[0])
                step += 1
                batch_in_epoch += 1

                loss_value, grad_norm = result["loss"].clone(), result["grad_norm"]
                ids = [batch["id"]]
                if world.enabled:
                    dist.all_reduce(loss_value)
                    loss_value /= world.world_size
                    ids = [None] * world.world_size
                    dist.all_gather_object(ids, batch["id"])
                record = {
                    "step": step,
                    "epoch": epoch,
                    "loss": loss_value.item(),
                    "grad_norm": grad_norm.item(),
                    "lr": float(scheduler.get_last_lr()[0]),
                    "step_time_s": time.perf_counter() - start,
                    "data_wait_s": data_wait,
                    "peak_memory_gb": peak_memory_gb(world.device),
                    "tokens": int(batch["token_pad_mask"].sum()),
                    "ids": ids,  # per rank
                    "world_size": world.world_size,
                }
                records.append(record)
                if log_file is not None:
                    log_file.write(json.dumps(record) + "\n")
                    log_file.flush()
                    print(
                        f"step {step:>6d}  loss {record['loss']:.4f}  step {record['step_time_s'] * 1e3:8.1f} ms"
                        f"  data wait {data_wait * 1e3:7.1f} ms  peak {record['peak_memory_gb']:.2f} GB",
                        flush=True,
                    )

                if step % config.checkpoint_every == 0 or step == config.steps:
                    end_of_epoch = batch_in_epoch >= steps_per_epoch
                    rng_states = gather_rng_states(world)
                    if world.is_main:
                        save_checkpoint(checkpoint_path(run_dir, step), {
                            "model": model.state_dict(),
                            "optimizer": optimizer_state(optimizer),
                            "scheduler": scheduler.state_dict(),
                            "step": step,
                            "epoch": epoch + 1 if end_of_epoch else epoch,
                            "batch_in_epoch": 0 if end_of_epoch else batch_in_epoch,
                            "rng": rng_states,
                            "world_size": world.world_size,
                            "train_config": dataclasses.asdict(config),
                            "model_config": dataclasses.asdict(model.config),
                        })
                    if world.enabled:
                        dist.barrier()
            if batch_in_epoch >= steps_per_epoch:
                epoch += 1
                batch_in_epoch = 0
                if loader_per_epoch:
                    batches = None
    finally:
        if log_file is not None:
            log_file.close()
        if world.enabled:
            dist.destroy_process_group()
    return records


@click.command("train")
@click.option("--cache", type=click.Path(file_okay=False), help="Feature cache (or published generation) to train from.")
@click.option("--online", type=click.Path(file_okay=False),
              help="Featurize raw files from this folder at load time instead of reading a cache (to measure what caching saves).")
@click.option("--alignments", type=click.Path(file_okay=False),
              help="With --online: folder of alignment files, as for precompute --alignments.")
@click.option("--template-dir", type=click.Path(file_okay=False), help="With --online: template mmCIF folder.")
@click.option("--out", default="runs/train", show_default=True, type=click.Path(file_okay=False),
              help="Run directory: log.jsonl and checkpoints.")
@click.option("--preset", default="tiny", show_default=True, type=click.Choice(sorted(PRESETS)), help="Model size.")
@click.option("--pairformer-blocks", type=int, help="Override the preset's number of Pairformer blocks.")
@click.option("--kernels", default="triton", show_default=True, type=click.Choice(KERNEL_IMPLS),
              help="triton: featurecache's kernels; torch: the pure-PyTorch references.")
@click.option("--steps", default=100, show_default=True, type=int, help="Optimizer steps to run in total (a resumed run continues to this step).")
@click.option("--crop-size", default=384, show_default=True, type=int, help="Tokens per cropped sample.")
@click.option("--max-msa-rows", default=1024, show_default=True, type=int, help="MSA rows kept per sample.")
@click.option("--batch-size", default=1, show_default=True, type=int, help="Samples per step and rank.")
@click.option("--lr", default=1.8e-3, show_default=True, type=float, help="Peak learning rate (AdamW).")
@click.option("--warmup", default=1000, show_default=True, type=int, help="Linear warmup steps.")
@click.option("--num-workers", default=2, show_default=True, type=int, help="DataLoader worker processes per rank.")
@click.option("--checkpoint-every", default=1000, show_default=True, type=int, help="Steps between checkpoints (and one at the end).")
@click.option("--resume", type=click.Path(exists=True), help="Checkpoint file, or a run directory to resume from its newest checkpoint.")
@click.option("--compile", "compile_model", is_flag=True, help="torch.compile every block of the trunk.")
@click.option("--static-shapes", is_flag=True,
              help="Pad every batch to --crop-size tokens, --max-msa-rows rows and --max-templates templates: one "
                   "shape for every step, so --compile compiles once.")
@click.option("--max-templates", default=4, show_default=True, type=int,
              help="With --static-shapes: templates per sample (precompute's max_templates).")
@click.option("--cuda-graphs", is_flag=True,
              help="Replay each step as one CUDA graph (implies --static-shapes; one GPU, no DDP): removes the "
                   "host's launch overhead, which at crop 384 costs about a third of a step.")
@click.option("--seed", default=0, show_default=True, type=int, help="Seed for weights, shuffling, crops and MSA subsampling.")
@click.option("--device", default="auto", show_default=True, help="auto, cpu or cuda (torchrun: cuda:LOCAL_RANK).")
def train_command(cache, online, alignments, template_dir, out, preset, pairformer_blocks, kernels, steps,
                  crop_size, max_msa_rows, batch_size, lr, warmup, num_workers, checkpoint_every, resume,
                  compile_model, static_shapes, max_templates, cuda_graphs, seed, device) -> None:
    """Train the AF3 trunk from a feature cache."""
    try:
        config = TrainConfig(
            cache=cache, online=online, alignments=alignments, template_dir=template_dir, out=out,
            preset=preset, pairformer_blocks=pairformer_blocks, kernels=kernels, steps=steps,
            crop_size=crop_size, max_msa_rows=max_msa_rows, batch_size=batch_size, lr=lr, warmup=warmup,
            num_workers=num_workers, checkpoint_every=checkpoint_every, resume=resume,
            compile=compile_model, static_shapes=static_shapes, max_templates=max_templates,
            cuda_graphs=cuda_graphs, seed=seed,
            device=device,
        )
    except ValueError as error:
        raise click.UsageError(str(error)) from error
    train(config)

