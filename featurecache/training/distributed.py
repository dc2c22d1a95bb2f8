"""Devices and ranks: one process, or one process per GPU under torchrun (DDP), optionally with
each sample's MSA module and Pairformers sharded over P ranks (--pair-shards,
featurecache.model.parallel.sharding).

torchrun describes the job in the environment (WORLD_SIZE, RANK, LOCAL_RANK); without it a run
is rank 0 of 1 and no process group is made. With P pair shards the world is data-parallel
replicas x P: the P consecutive ranks of a shard group (one host's GPUs) hold one sample, and
`Dist.rank` / `Dist.world_size` count replicas, which is what the data, the seeds, the
checkpoints and DDP see; `Dist.shard_rank` is the place within the shard group.

CUDA-graph runs do not use DDP (its reducer hooks run host code inside backward, which a graph
cannot hold, and gloo cannot be captured): `GradientBuckets` keeps the gradients in a few flat
buffers that are all-reduced between a step's backward and its update, outside any graph, and
`broadcast_from_rank_0` starts every rank from rank 0's weights, as DDP's constructor does.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from featurecache.model.parallel.sharding import reduce_gradients, shard_trunk
from featurecache.training.config import TrainSetupError


@dataclass(frozen=True)
class Dist:
    rank: int  # data-parallel replica
    world_size: int  # data-parallel replicas
    device: torch.device
    pair_shards: int = 1
    shard_rank: int = 0
    shard_group: Any = None  # the process group of this replica's shards (None: not sharded)
    data_group: Any = None  # the ranks of every replica with this shard_rank (None: the default group)

    @property
    def enabled(self) -> bool:
        """Data parallel: more than one replica (DDP)."""
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0 and self.shard_rank == 0


def rank_layout(world_size: int, pair_shards: int) -> tuple[list[list[int]], list[list[int]]]:
    """The shard groups (consecutive ranks, one replica each) and the data-parallel groups (one
    rank of every replica, the same shard_rank) of a world of world_size ranks."""
    if pair_shards < 1 or world_size % pair_shards:
        raise TrainSetupError(f"--pair-shards {pair_shards} does not divide the {world_size} ranks of this run")
    replicas = world_size // pair_shards
    shard_groups = [list(range(r * pair_shards, (r + 1) * pair_shards)) for r in range(replicas)]
    data_groups = [list(range(s, world_size, pair_shards)) for s in range(pair_shards)]
    return shard_groups, data_groups


def _make_groups(global_rank: int, world_size: int, pair_shards: int) -> tuple[Any, Any]:
    """This rank's shard group and data-parallel group (every rank creates every group, in one order)."""
    shard_groups, data_groups = rank_layout(world_size, pair_shards)
    mine = {}
    for kind, groups in (("shard", shard_groups), ("data", data_groups)):
        for ranks in groups:
            group = dist.new_group(ranks)
            if global_rank in ranks:
                mine[kind] = group
    return mine["shard"], mine["data"]


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


def setup_distributed(device: str, pair_shards: int = 1) -> Dist:
    """Pick the device and join the process group torchrun describes (gloo on CPU, nccl on GPU);
    with pair_shards > 1, also the shard and data-parallel groups (see rank_layout)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    rank_layout(world_size, pair_shards)  # checks that the shards divide the world
    target = resolve_device(device, int(os.environ.get("LOCAL_RANK", "0")))
    if target.type == "cuda":
        torch.cuda.set_device(target)
    if world_size > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if target.type == "cuda" else "gloo")
    if pair_shards == 1:
        return Dist(rank=rank, world_size=world_size, device=target)
    shard_group, data_group = _make_groups(rank, world_size, pair_shards)
    if rank == 0:
        print(
            f"featurecache train: {world_size} ranks, {world_size // pair_shards} data-parallel replica(s) x "
            f"{pair_shards} pair shards",
            flush=True,
        )
    return Dist(
        rank=rank // pair_shards,
        world_size=world_size // pair_shards,
        device=target,
        pair_shards=pair_shards,
        shard_rank=rank % pair_shards,
        shard_group=shard_group,
        data_group=data_group,
    )


def shard_model(model: torch.nn.Module, world: Dist) -> torch.nn.Module:
    """The model with its MSA module and Pairformer sharded over the replica's shard group (as is
    without shards)."""
    return shard_trunk(model, world.shard_group) if world.pair_shards > 1 else model


# Bytes per gradient bucket (DDP's default is 25 MiB): large enough that a step's all-reduces
# are a handful of calls, small enough that no single buffer holds a large share of the weights.
BUCKET_BYTES = 25 * 1024 * 1024


class GradientBuckets:
    """The gradients of `model`'s trainable parameters as views into a few flat buffers, so
    that a backward (launched or replayed from a graph) accumulates into fixed addresses and
    one all-reduce per buffer averages them over the data-parallel ranks.

    Every trainable parameter has a gradient from here on (zeros where a step does not reach
    it, as DDP gives a parameter that only some ranks used); frozen ones (requires_grad False,
    e.g. the PAE head while its loss weight is 0) are left out. Never call
    optimizer.zero_grad(): `zero()` clears the buffers in place.
    """

    def __init__(self, model: torch.nn.Module, world: Dist, bucket_bytes: int = BUCKET_BYTES) -> None:
        self.world = world
        self.parameters = [parameter for parameter in model.parameters() if parameter.requires_grad]
        self.buffers: list[torch.Tensor] = []
        for bucket in _buckets(self.parameters, bucket_bytes):
            flat = torch.zeros(sum(p.numel() for p in bucket), dtype=bucket[0].dtype, device=bucket[0].device)
            offset = 0
            for parameter in bucket:
                parameter.grad = flat[offset : offset + parameter.numel()].view_as(parameter)
                offset += parameter.numel()
            self.buffers.append(flat)
        self.addresses = [parameter.grad.data_ptr() for parameter in self.parameters]

    def zero(self) -> None:
        for flat in self.buffers:
            flat.zero_()

    def all_reduce(self) -> None:
        """The mean of every gradient over the data-parallel ranks, in place (nothing on one rank).
        Divided before the sum, as DDP does."""
        self._check_attached()
        if not self.world.enabled:
            return
        for flat in self.buffers:
            flat.div_(self.world.world_size)
            dist.all_reduce(flat, group=self.world.data_group)

    def _check_attached(self) -> None:
        # a zero_grad(set_to_none=True) would leave gradients outside the buffers, which the
        # all-reduce would then silently skip
        for parameter, address in zip(self.parameters, self.addresses):
            if parameter.grad is None or parameter.grad.data_ptr() != address:
                raise RuntimeError(
                    "GradientBuckets: a gradient is no longer a view of its bucket (replaced by "
                    "optimizer.zero_grad(set_to_none=True)?), so the all-reduce would skip it"
                )


def _buckets(parameters: list[torch.Tensor], bucket_bytes: int) -> Iterable[list[torch.Tensor]]:
    """Consecutive parameters of one dtype and device, about bucket_bytes each."""
    bucket: list[torch.Tensor] = []
    size = 0
    for parameter in parameters:
        if bucket and (
            size >= bucket_bytes or parameter.dtype != bucket[0].dtype or parameter.device != bucket[0].device
        ):
            yield bucket
            bucket, size = [], 0
        bucket.append(parameter)
        size += parameter.numel() * parameter.element_size()
    if bucket:
        yield bucket


@torch.no_grad()
def broadcast_from_rank_0(tensors: list[torch.Tensor], world: Dist) -> None:
    """Rank 0's values of `tensors` on every data-parallel rank, in place, one broadcast per
    dtype (DDP's constructor does this for the parameters and buffers)."""
    if not world.enabled:
        return
    source = dist.get_global_rank(world.data_group, 0) if world.data_group is not None else 0
    for dtype in dict.fromkeys(tensor.dtype for tensor in tensors):
        same = [tensor for tensor in tensors if tensor.dtype == dtype]
        flat = torch.cat([tensor.reshape(-1) for tensor in same])
        dist.broadcast(flat, source, group=world.data_group)
        for tensor, value in zip(same, flat.split([tensor.numel() for tensor in same])):
            tensor.copy_(value.view_as(tensor))


def reduce_shard_gradients(model: torch.nn.Module) -> None:
    """Sum the sharded stacks' gradients over their shard group (each rank holds its rows'
    share); once per optimizer step, after the last backward. Nothing without shards."""
    reduce_gradients(model)


def all_ranks(world: Dist, value) -> list:
    """`value` from every rank, in rank order, on every rank (a list of one without DDP)."""
    if not world.enabled:
        return [value]
    gathered: list = [None] * world.world_size
    dist.all_gather_object(gathered, value, group=world.data_group)
    return gathered


def mean_over_ranks(world: Dist, value: torch.Tensor) -> torch.Tensor:
    """The mean of a tensor over all ranks (a copy; `value` itself is left as it was)."""
    value = value.clone()
    if world.enabled:
        dist.all_reduce(value, group=world.data_group)
        value /= world.world_size
    return value


def max_over_shards(world: Dist, value: torch.Tensor) -> torch.Tensor:
    """The max of a tensor over this replica's shard group, in place (as it is without shards)."""
    if world.pair_shards > 1:
        dist.all_reduce(value, op=dist.ReduceOp.MAX, group=world.shard_group)
    return value


def barrier(world: Dist) -> None:
    if world.enabled or world.pair_shards > 1:
        dist.barrier()


def shutdown(world: Dist) -> None:
    """Leave the process groups; first free what still holds them or their work (Trainer.close
    dropped DDP; a reference cycle would otherwise keep it until the interpreter's exit)."""
    if (world.enabled or world.pair_shards > 1) and dist.is_initialized():
        gc.collect()
        dist.destroy_process_group()
