"""The padding tax of fixed shapes: `featurecache train --cuda-graphs` on a real cache with one
atom size for every batch (`--atom-buckets 1`) against a few buckets (training/buckets.py), side
by side: seconds per step, atoms padded, peak memory.

    python3 benchmarks/atom_buckets.py --cache /tmp/fc-cache [--crop 384] [--steps 40] [--buckets 1 4] [--record]
    python3 benchmarks/atom_buckets.py --cache /tmp/fc-cache --smoke    # the CPU: tiny preset, --static-shapes

Each setting is one run of the command (`featurecache train` through harness.train_command), read
back from its log.jsonl. "steady s/step" is the median over the steps that replayed a captured
graph: a bucket's first four steps (three launched warm-ups and the capture) are left out, which
a long run pays once per bucket ("all s/step" includes them). With --smoke the steps run launched
on the CPU (no graphs): only each bucket's first step is left out, and the times are not to quote.
"""

from __future__ import annotations

import collections
import os
import pathlib
import statistics
import subprocess
import tempfile

import harness
from harness import Table, argument_parser

# A bucket's steps before its graph replays: training/loop.py's GRAPH_WARMUP_STEPS launched, one capture.
GRAPH_FIRST_STEPS = 4


def run_training(args, buckets: int, out: pathlib.Path) -> list[dict]:
    """One `featurecache train` run with --atom-buckets `buckets`; its training-step records."""
    command = harness.train_command(
        args,
        out,
        "--atom-buckets",
        str(buckets),
        *(["--static-shapes", "--device", "cpu"] if args.smoke else ["--cuda-graphs"]),
        *(["--diffusion-batch", str(args.diffusion_batch)] if args.diffusion_batch else []),
        *(["--pairformer-blocks", str(args.pairformer_blocks)] if args.pairformer_blocks else []),
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(harness.REPO), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise SystemExit(f"atom_buckets: `{' '.join(command)}` failed:\n{result.stdout[-3000:]}{result.stderr[-3000:]}")
    return harness.train_steps(out / "log.jsonl")


def summary(records: list[dict], first_steps: int) -> dict:
    """Step times over all steps and over the steady ones (a bucket's `first_steps` left out)."""
    seen: collections.Counter = collections.Counter()
    steady = []
    for record in records:
        seen[record["padded_atoms"]] += 1
        if seen[record["padded_atoms"]] > first_steps:
            steady.append(record["step_time_s"])
    return {
        "buckets used": len(seen),
        "steady s/step": statistics.median(steady) if steady else float("nan"),
        "steady steps": len(steady),
        "all s/step": statistics.fmean(record["step_time_s"] for record in records),
        "atoms / step": statistics.fmean(record["atoms"] for record in records),
        "padded atoms / step": statistics.fmean(record["padded_atoms"] for record in records),
        "peak memory GB": max(record["peak_memory_gb"] for record in records),
    }


def main() -> None:
    parser = argument_parser(__doc__)
    parser.add_argument("--cache", type=pathlib.Path, required=True)
    parser.add_argument("--preset", default="af3")
    parser.add_argument("--crop", type=int, default=384)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--buckets", type=int, nargs="+", default=[1, 4], help="--atom-buckets settings to compare")
    parser.add_argument("--diffusion-batch", type=int, help="default: the preset's")
    parser.add_argument("--pairformer-blocks", type=int, help="default: the preset's")
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--smoke", action="store_true", help="the CPU: tiny preset, crop 96, 4 steps, --static-shapes")
    args = parser.parse_args()
    if args.smoke:
        args.preset, args.crop, args.steps, args.num_workers = "tiny", min(args.crop, 96), min(args.steps, 4), 0
    first_steps = 1 if args.smoke else GRAPH_FIRST_STEPS
    stamp = harness.run_stamp()
    columns = [
        "--atom-buckets",
        "buckets used",
        "steady s/step",
        "steady steps",
        "all s/step",
        "atoms / step",
        "padded atoms / step",
        "peak memory GB",
    ]
    table = Table(columns)
    results = {}
    for buckets in args.buckets:
        with tempfile.TemporaryDirectory(prefix=f"atom-buckets-{buckets}-") as out:
            results[buckets] = summary(run_training(args, buckets, pathlib.Path(out)), first_steps)
        table.add([buckets, *(results[buckets][name] for name in columns[1:])])
        print(f"--atom-buckets {buckets}: {results[buckets]}", flush=True)
    print(f"\n{stamp.header()}\n\n{table.markdown()}")
    if args.record:
        from records import Row, record

        way = "--static-shapes (CPU)" if args.smoke else "--cuda-graphs"
        shape = f"{args.preset}, crop {args.crop}, {way}, {args.steps} steps on {args.cache.name}"
        rows = [
            Row("atom_buckets", f"{buckets} buckets", shape, metric, result[metric])
            for buckets, result in results.items()
            for metric in ("steady s/step", "padded atoms / step", "peak memory GB")
        ]
        section = (
            f"### {shape}, {stamp.date}, {stamp.device}, commit {stamp.commit}\n\n"
            f"`featurecache train` with one atom size against a few buckets.\n\n{table.markdown()}"
        )
        record(stamp, rows, "atom_buckets", section, title="Atom padding buckets")


if __name__ == "__main__":
    main()
