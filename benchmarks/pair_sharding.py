"""Pair sharding on GPUs: per-rank peak memory, step time and bytes communicated of a Pairformer
stack at AF3's widths, whole (one process) or sharded over the ranks of torchrun.

    python benchmarks/pair_sharding.py --lengths 384 768 1024 --out $OUT                 # P = 1
    torchrun --standalone --nproc-per-node 2 benchmarks/pair_sharding.py --lengths 384 768 1024 1536 --out $OUT
    torchrun --standalone --nproc-per-node 4 benchmarks/pair_sharding.py --lengths 768 1536 2048 2560 --out $OUT

Each length runs `--blocks` Pairformer blocks (activation checkpointing, Triton kernels, bf16
autocast, fp32 residual stream as in training) forward and backward on one sample. Rank 0 prints
a markdown table (per-rank peak memory above the inputs, median step time, bytes through the
collectives per rank and block) and writes it to OUT/pair_sharding_P<P>.md. docs/SHARDING.md
predicts these numbers; this measures them. A length past the memory stops the script (the
ranks would fail at different collectives), so give the lengths in increasing order. Without
CUDA it runs the PyTorch path on gloo with small widths: a check of the script, not a measurement.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from featurecache.model.network.pairformer import Pairformer  # noqa: E402
from featurecache.model.parallel import collectives  # noqa: E402
from featurecache.model.parallel.sharding import ShardedPairformer, reduce_gradients  # noqa: E402

AF3_PAIRFORMER = dict(
    c_s=384, c_z=128, single_heads=16, single_head_dim=24, pair_heads=4, pair_head_dim=32, transition_expansion=4
)


class ByteCounter:
    """Bytes each rank receives through the collectives of featurecache.model.parallel.collectives."""

    def __init__(self) -> None:
        self.total = 0
        gather, scatter, all_to_all = (
            collectives._all_gather_into,
            collectives._reduce_scatter_into,
            collectives.dist.all_to_all_single,
        )

        def counted_gather(out, inp, group=None):
            self.total += out.numel() * out.element_size() * (1 - 1 / dist.get_world_size(group))
            return gather(out, inp, group=group)

        def counted_scatter(out, inp, group=None):
            self.total += inp.numel() * inp.element_size() * (1 - 1 / dist.get_world_size(group))
            return scatter(out, inp, group=group)

        def counted_all_to_all(out, inp, group=None):
            self.total += inp.numel() * inp.element_size() * (1 - 1 / dist.get_world_size(group))
            return all_to_all(out, inp, group=group)

        collectives._all_gather_into, collectives._reduce_scatter_into = counted_gather, counted_scatter
        collectives.dist = _DistWith(all_to_all_single=counted_all_to_all)


class _DistWith:
    """torch.distributed with some functions replaced (for the counter)."""

    def __init__(self, **replaced) -> None:
        self.__dict__.update(replaced)

    def __getattr__(self, name):
        return getattr(dist, name)


CPU_CHECK = dict(
    c_s=16, c_z=16, single_heads=2, single_head_dim=8, pair_heads=2, pair_head_dim=8, transition_expansion=2
)


def measure(length: int, blocks: int, rounds: int, group, counter: ByteCounter | None) -> dict:
    cuda = torch.cuda.is_available()
    device, widths = (torch.device("cuda"), AF3_PAIRFORMER) if cuda else (torch.device("cpu"), CPU_CHECK)
    torch.manual_seed(0)
    stack = Pairformer(blocks, **widths, checkpoint_blocks=True, kernels="triton" if cuda else "torch")
    stack = stack.to(device).train()
    model = stack if group is None else ShardedPairformer(stack, group)
    s = torch.randn(1, length, widths["c_s"], device=device, requires_grad=True)
    z = torch.randn(1, length, length, widths["c_z"], device=device, requires_grad=True)
    token_mask = torch.ones(1, length, dtype=torch.bool, device=device)
    pair_mask = token_mask[:, :, None] & token_mask[:, None, :]

    def step():
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
            s_out, z_out = model(s, z, token_mask, pair_mask)
        (s_out.float().sum() + z_out.float().sum()).backward()
        if group is not None:
            reduce_gradients(model)

    sync = torch.cuda.synchronize if cuda else (lambda: None)
    step()  # compile the kernels
    sync()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated() if cuda else 0
    sent = counter.total if counter else 0
    times = []
    for _ in range(rounds):
        if group is not None:
            dist.barrier(group)
        sync()
        start = time.perf_counter()
        step()
        sync()
        times.append((time.perf_counter() - start) * 1e3)
    peak = (torch.cuda.max_memory_allocated() - before) / 1e9 if cuda else float("nan")
    return {
        "peak_gb": peak,
        "step_ms": statistics.median(times),
        "mb_per_block": ((counter.total - sent) / rounds / blocks / 1e6) if counter else 0.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[384, 768])
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path(os.environ.get("OUT", ".")))
    args = parser.parse_args()
    shards = int(os.environ.get("WORLD_SIZE", "1"))
    group, counter = None, None
    if shards > 1:
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        group, counter = dist.group.WORLD, ByteCounter()
    main_rank = not dist.is_initialized() or dist.get_rank() == 0
    lines = [
        f"Pairformer, {args.blocks} blocks at AF3 widths, bf16, Triton, checkpointed; P = {shards} "
        f"({torch.cuda.get_device_name() if torch.cuda.is_available() else 'CPU check'}, "
        f"torch {torch.__version__})",
        "",
        "| L | P | peak per rank GB | step ms | MB per rank and block (fwd x2 + bwd) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for length in args.lengths:
        result = measure(length, args.blocks, args.rounds, group, counter)
        lines.append(
            f"| {length} | {shards} | {result['peak_gb']:.2f} | {result['step_ms']:.1f} | "
            f"{result['mb_per_block']:.3f} |"
        )
        if main_rank:
            print(lines[-1], flush=True)
    if main_rank:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"pair_sharding_P{shards}.md").write_text("\n".join(lines) + "\n")
        print("\n".join(lines))
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
