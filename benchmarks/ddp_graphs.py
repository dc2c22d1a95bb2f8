"""Data-parallel CUDA-graph steps against plain DDP: the same weights after K steps, ranks in step.

    python benchmarks/ddp_graphs.py                    # one GPU: ~2 min on an H200
    python benchmarks/ddp_graphs.py --cpu --steps 2    # the CPU check of the script (tests run it)

Two ranks (torch.multiprocessing, gloo) share one GPU: gloo all-reduces CUDA tensors through the
host, where NCCL refuses two ranks on one device. Each rank trains the `tiny` model on random
batches (featurecache.testing.synthetic) K steps twice from the same seed, through the training
loop's Trainer: once as `featurecache train --cuda-graphs` runs under torchrun (a backward graph per
micro-batch, the gradient buckets all-reduced outside the graphs, a captured update), once as
plain DDP launched from Python. Every rank initializes its weights from its own seed, so the
runs also check that rank 0's weights reach every rank. With --cpu the graph run is the same
update launched instead of captured (Trainer's manual_sync).

Importing benchmarks/harness.py first puts the checkout on sys.path (no install needed).

Prints a markdown table (max |param diff| against plain DDP, whether the ranks hold bitwise equal
weights, median ms per step after the graph's capture) and writes it to $OUT/ddp_graphs.md
when OUT is set. Both runs use bf16 autocast on the GPU, whose roundings differ between a graph
and launched kernels only where the kernels do: expect differences of the order of lr x K, not 0.
"""

from __future__ import annotations

import argparse
import gc
import os
import pathlib
import socket
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from harness import Table, run_stamp

from featurecache.config import SampleConfig
from featurecache.testing.synthetic import random_batch
from featurecache.training.config import TrainConfig, resolve_kernels
from featurecache.training.data import to_device
from featurecache.training.distributed import Dist
from featurecache.training.loop import GRAPH_WARMUP_STEPS, Trainer

WORLD = 2
SEED = 7  # rank r initializes from SEED + r; rank 0's weights must reach both ranks


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu", action="store_true", help="run on the CPU, the graph run launched (no capture)")
    parser.add_argument("--steps", type=int, default=10, help="optimizer steps per run (K)")
    parser.add_argument("--accumulate", type=int, default=2, help="micro-batches per step and rank")
    parser.add_argument("--crop", type=int, default=None, help="tokens per sample (default 64, 16 with --cpu)")
    parser.add_argument("--diffusion-batch", type=int, default=None, help="default 4, 1 with --cpu")
    parser.add_argument("--kernels", default="auto", choices=("auto", "triton", "torch"))
    args = parser.parse_args()
    args.crop = args.crop or (16 if args.cpu else 64)
    args.diffusion_batch = args.diffusion_batch or (1 if args.cpu else 4)
    if args.steps < 1 or args.accumulate < 1:
        parser.error("--steps and --accumulate must be at least 1")
    return args


def _config(args, graphs: bool) -> TrainConfig:
    return TrainConfig(
        cache="unused",
        preset="tiny",
        kernels=args.kernels,
        cuda_graphs=graphs and not args.cpu,
        static_shapes=True,
        accumulate=args.accumulate,
        model_settings={"diffusion_batch": args.diffusion_batch, "max_recycling_cycles": 1},
        warmup=1,
        lr=1e-3,
        num_workers=0,
        sample=SampleConfig(crop_size=args.crop, msa_rows_per_sample=8, max_templates=1),
    )


def _batch(args, step: int, slot: int) -> dict:
    """Micro-batch `slot` of step `step`: one sample of crop size, the same whatever the run."""
    return random_batch([args.crop], [8], [1], torch.Generator().manual_seed(1000 * step + slot))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train_run(args, world: Dist, graphs: bool) -> dict:
    """K steps of one run on this rank: the weights afterwards and the step times."""
    config = _config(args, graphs)
    kernels = resolve_kernels(config.kernels, world.device)
    torch.manual_seed(SEED + world.rank)
    trainer = Trainer(config, kernels, world, manual_sync=graphs)
    trainer.start()
    times, losses = [], []
    for step in range(args.steps):
        batches = [_batch(args, step, trainer.layout.slot(world.rank, micro)) for micro in range(args.accumulate)]
        if not trainer.takes_host_batches:
            batches = [to_device(batch, world.device) for batch in batches]
        _sync(world.device)
        start = time.perf_counter()
        result, _ = trainer.step(batches, step)
        losses.append(result["loss"].item())  # the loop reads the loss each step too
        times.append((time.perf_counter() - start) * 1e3)
    captured = trainer.graphed is not None and trainer.graphed.is_captured
    params = {name: p.detach().cpu().clone() for name, p in trainer.model.named_parameters()}
    del trainer
    gc.collect()
    if world.device.type == "cuda":
        torch.cuda.empty_cache()
    # the graph's capture happens within the first GRAPH_WARMUP_STEPS + 1 steps: time the replays
    timed = times[GRAPH_WARMUP_STEPS + 1 :] or times
    return {"params": params, "ms": statistics.median(timed), "losses": losses, "captured": captured}


def worker(rank: int, args, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # both ranks on this host: the loopback interface
    torch.set_num_threads(1 if args.cpu else 4)
    device = torch.device("cpu") if args.cpu else torch.device("cuda", 0)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        world = Dist(rank=rank, world_size=WORLD, device=device)
        results = {"graphs": train_run(args, world, graphs=True), "plain": train_run(args, world, graphs=False)}
        torch.save(results, pathlib.Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _max_diff(mine: dict, reference: dict) -> float:
    return max((mine[name] - value).abs().max().item() for name, value in reference.items())


def _identical(first: dict, second: dict) -> str:
    return "yes" if all(torch.equal(value, second[name]) for name, value in first.items()) else "no"


def table(args, ranks: list[dict]) -> str:
    graphs, plain = ranks[0]["graphs"], ranks[0]["plain"]
    name = "manual sync, launched" if args.cpu else "CUDA graphs + bucket all-reduce"
    if not args.cpu and not graphs["captured"]:
        name += " (not captured: too few steps)"
    rows = Table(["run", "max abs param diff vs plain DDP", "ranks identical", "ms per step", "last loss"])
    for label, run, key in ((name, graphs, "graphs"), ("plain DDP", plain, "plain")):
        rows.add(
            [
                label,
                _max_diff(run["params"], plain["params"]),
                _identical(run["params"], ranks[1][key]["params"]),
                run["ms"],
                run["losses"][-1],
            ]
        )
    device = "CPU" if args.cpu else "one GPU"
    return (
        f"{run_stamp().header()}\n{WORLD} gloo ranks on {device}, tiny preset, crop {args.crop}, "
        f"--accumulate {args.accumulate}, diffusion batch {args.diffusion_batch}, {args.steps} steps, "
        f"lr 1e-3; max |param diff| over every weight\n\n{rows.markdown()}"
    )


def main() -> None:
    args = parse_args()
    if not args.cpu and not torch.cuda.is_available():
        raise SystemExit("ddp_graphs: no CUDA device (give --cpu to check the script on the CPU)")
    with tempfile.TemporaryDirectory() as out_dir:
        mp.spawn(worker, args=(args, _free_port(), out_dir), nprocs=WORLD, join=True)
        ranks = [torch.load(pathlib.Path(out_dir) / f"rank{rank}.pt") for rank in range(WORLD)]
    text = table(args, ranks)
    if os.environ.get("OUT"):
        (pathlib.Path(os.environ["OUT"]) / "ddp_graphs.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
