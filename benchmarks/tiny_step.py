"""The fixed per-step cost of a small model: training steps of a preset (default `tiny`) on a real
cache, through the objects `featurecache train` builds (TrainConfig, the cache's DataLoader, the
Trainer and its step), timed on the host clock with the process's peak resident set.

    python3 benchmarks/tiny_step.py --cache /tmp/fc-cache [--crop 384] [--steps 3] [--record]
    python3 benchmarks/tiny_step.py --cache /tmp/fc-cache --profile 25    # the 25 costliest operators

Each step is timed on the host clock (its data wait apart) and in CPU seconds of the process
(user + system, all threads: on a machine shared with other work the CPU time is the steadier
figure; an idle 2-core machine runs the step in between CPU/2 and CPU seconds of wall time); the
peak RSS is the process's (ru_maxrss, what the loop logs as peak_memory_gb on the CPU), read
after each step. With --profile, one more step runs
under torch.profiler (CPU time and memory per operator, with input shapes) and the top operators
by self CPU time and by memory are printed. The CPU is shared: compare ratios measured in one run.
"""

from __future__ import annotations

import os
import pathlib
import resource
import statistics
import tempfile
import time

import harness
import torch
from harness import Table, argument_parser

from featurecache.config import SampleConfig
from featurecache.training import TrainConfig
from featurecache.training.buckets import padding_buckets
from featurecache.training.data import build_datasets, make_batch_sampler, make_loader
from featurecache.training.distributed import setup_distributed
from featurecache.training.loop import Trainer


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6


def build(args, out: pathlib.Path) -> tuple[Trainer, object]:
    """The Trainer and batch iterator `featurecache train --cache ... --preset ...` builds."""
    sample = SampleConfig(crop_size=args.crop, msa_rows_per_sample=args.msa_rows)
    config = TrainConfig(
        cache=str(args.cache),
        out=str(out),
        preset=args.preset,
        kernels="torch",
        steps=args.steps + 2,
        num_workers=0,
        device="cpu",
        sample=sample,
        model_settings={"diffusion_batch": args.diffusion_batch, "max_recycling_cycles": args.cycles},
    )
    world = setup_distributed("cpu")
    dataset, _ = build_datasets(config)
    loader = make_loader(
        dataset, make_batch_sampler(dataset, config, world), config, world.device, padding_buckets(config, dataset)
    )
    trainer = Trainer(config, "torch", world)
    trainer.start()
    return trainer, iter(loader)


def profile_step(trainer: Trainer, batch: dict, step: int, top: int) -> None:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, profile_memory=True) as prof:
        trainer.step([batch], step)
    averages = prof.key_averages(group_by_input_shape=True)
    print(
        averages.table(
            sort_by="self_cpu_time_total", row_limit=top, max_name_column_width=40, max_shapes_column_width=80
        )
    )
    print(
        averages.table(
            sort_by="self_cpu_memory_usage", row_limit=top, max_name_column_width=40, max_shapes_column_width=80
        )
    )


def main() -> None:
    parser = argument_parser(__doc__)
    parser.add_argument("--cache", type=pathlib.Path, required=True)
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--crop", type=int, default=384)
    parser.add_argument("--msa-rows", type=int, default=SampleConfig.msa_rows_per_sample)
    parser.add_argument("--diffusion-batch", type=int, help="default: the preset's (tiny: 4)")
    parser.add_argument("--cycles", type=int, default=1, help="--max-recycling-cycles (N_cycle drawn from 1..this)")
    parser.add_argument("--steps", type=int, default=3, help="timed steps after one untimed")
    parser.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's, one per core)")
    parser.add_argument(
        "--profile", type=int, default=0, metavar="TOP", help="profile one more step, print TOP operators"
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    stamp = harness.run_stamp()
    with tempfile.TemporaryDirectory() as out:
        trainer, batches = build(args, pathlib.Path(out))
        times, cpu_times, waits, peaks, tokens, atoms = [], [], [], [], [], []
        for step in range(args.steps + 1):
            started, cpu_started = time.perf_counter(), time.process_time()
            batch = next(batches)
            waits.append(time.perf_counter() - started)
            trainer.step([batch], step)
            times.append(time.perf_counter() - started)
            cpu_times.append(time.process_time() - cpu_started)
            peaks.append(peak_rss_gb())
            tokens.append(int(batch["token_pad_mask"].sum()))
            atoms.append(int(batch["atom_pad_mask"].shape[1]))
            print(
                f"step {step}: {times[-1]:.2f} s, CPU {cpu_times[-1]:.2f} s (data {waits[-1]:.2f} s), peak RSS {peaks[-1]:.2f} GB, "
                f"{tokens[-1]} tokens, {atoms[-1]} atoms ({batch['id']})",
                flush=True,
            )
        if args.profile:
            profile_step(trainer, next(batches), args.steps + 1, args.profile)
    table = Table(
        [
            "preset",
            "crop",
            "diffusion batch",
            "threads",
            "step s (median of timed)",
            "step CPU s",
            "first step s",
            "peak RSS GB",
            "load average (1 min)",
        ]
    )
    step_s, step_cpu_s = statistics.median(times[1:]), statistics.median(cpu_times[1:])
    table.add(
        [
            args.preset,
            args.crop,
            trainer.model.config.diffusion.diffusion_batch,
            torch.get_num_threads(),
            step_s,
            step_cpu_s,
            times[0],
            max(peaks),
            os.getloadavg()[0],
        ]
    )
    print(f"\n{stamp.header()}\n\n{table.markdown()}")
    if args.record:
        from records import Row, record

        shape = (
            f"{args.preset}, crop {args.crop}, diffusion batch {trainer.model.config.diffusion.diffusion_batch}, "
            f"N_cycle {args.cycles}, {torch.get_num_threads()} threads"
        )
        rows = [
            Row("tiny_step", "torch", shape, "step s", step_s),
            Row("tiny_step", "torch", shape, "step CPU s", step_cpu_s),
            Row("tiny_step", "torch", shape, "peak RSS GB", max(peaks)),
        ]
        section = (
            f"### {shape}, {stamp.date}, {stamp.device}, commit {stamp.commit}\n\n"
            f"`featurecache train`'s objects on a real cache (median of {args.steps} steps after one).\n\n"
            f"{table.markdown()}"
        )
        record(stamp, rows, "tiny_step", section, title="The tiny preset's step on the CPU")


if __name__ == "__main__":
    main()
