"""Devices and ranks: one process, or one process per GPU under torchrun (DDP).

torchrun describes the job in the environment (WORLD_SIZE, RANK, LOCAL_RANK); without it a run
is rank 0 of 1 and no process group is made.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from featurecache.training.config import TrainSetupError


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


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    """The device `--device` names: auto (CUDA when there is one, else the CPU), cpu, cuda or
    cuda:N; a bare "cuda" is cuda:LOCAL_RANK, so each torchrun rank takes its own GPU."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError:
        raise TrainSetupError(f"--device {name}: expected auto, cpu, cuda or cuda:N") from None
    if device.type not in ("cpu", "cuda"):
        raise TrainSetupError(f"--device {name}: expected auto, cpu, cuda or cuda:N")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise TrainSetupError(f"--device {name}: this machine has no CUDA device (use --device cpu)")
        if device.index is None:
            device = torch.device("cuda", local_rank)
        if device.index >= torch.cuda.device_count():
            raise TrainSetupError(f"--device {device}: this machine has {torch.cuda.device_count()} CUDA devices")
    return device


def setup_distributed(device: str) -> Dist:
    """Pick the device and join the process group torchrun describes (gloo on CPU, nccl on GPU)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    target = resolve_device(device, int(os.environ.get("LOCAL_RANK", "0")))
    if target.type == "cuda":
        torch.cuda.set_device(target)
    if world_size > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if target.type == "cuda" else "gloo")
    return Dist(rank=rank, world_size=world_size, device=target)


def all_ranks(world: Dist, value) -> list:
    """`value` from every rank, in rank order, on every rank (a list of one without DDP)."""
    if not world.enabled:
        return [value]
    gathered: list = [None] * world.world_size
    dist.all_gather_object(gathered, value)
    return gathered


def mean_over_ranks(world: Dist, value: torch.Tensor) -> torch.Tensor:
    """The mean of a tensor over all ranks (a copy; `value` itself is left as it was)."""
    value = value.clone()
    if world.enabled:
        dist.all_reduce(value)
        value /= world.world_size
    return value


def barrier(world: Dist) -> None:
    if world.enabled:
        dist.barrier()


def shutdown(world: Dist) -> None:
    if world.enabled and dist.is_initialized():
        dist.destroy_process_group()
