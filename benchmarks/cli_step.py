"""The training step as a user runs it: `featurecache train` through the CLI on a real cache,
timed from the run's own log (issue 34: "the user's path as fast as the benchmark's").

    python3 benchmarks/cli_step.py --cache CACHE --preset af3 --crop 384 --steps 60 [--record]
    python3 benchmarks/cli_step.py --cache CACHE --preset tiny --crop 384 --steps 80 --record
    python3 benchmarks/cli_step.py --cache CACHE --preset tiny --crop 32 --steps 4   # a CPU check

The command is `featurecache train --cache CACHE --preset P --crop-size N --steps S
--max-recycling-cycles 1` with --cuda-graphs on a GPU (--device cpu without one), checkpoints
only at the end, and --max-minutes as the budget (harness.run_budgeted_train); any further
arguments after `--` go to it unchanged. From OUT/log.jsonl's step lines (train's own
step_time_s, data_wait_s, peak_memory_gb, atoms and padded_atoms):

  first step s       step 1: data workers, kernel compilation, warm-up, the first graph capture
  step ms            the median of the timed steps: those after --skip (default: the first
                     quarter, at least 3; a step that meets a new atom bucket warms up and captures
                     its graph, which the median passes over), and the fastest of them
  data wait ms       the median of the timed steps' waits for their batch
  peak GB            the largest peak of any step
  padded atoms %     padding over real atoms, summed over the timed steps (the padding tax)

Recorded as benchmark "cli_step" (variant "featurecache train"); the step time's metric is
"iteration ms", and for the af3 preset at N_cycle 1 and diffusion batch 48 its shape is
flops.py's (benchmarks/records.py then puts the achieved TFLOP/s beside it in the headline
table). That count assumes 8 atoms a token, 1,024 MSA rows and 4 templates; the section says
what the cache's batches held.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import tempfile

import harness
from harness import Table, argument_parser
from records import ITERATION_PREFIX, Row, record

from featurecache.model import preset

BENCHMARK = "cli_step"
VARIANT = "featurecache train"


def train_command(args, out: pathlib.Path, cuda: bool) -> list[str]:
    return harness.train_command(
        args,
        out,
        *(["--diffusion-batch", str(args.diffusion_batch)] if args.diffusion_batch else []),
        *(["--cuda-graphs"] if cuda else ["--device", "cpu"]),
        *args.train_args,
    )


def summarise(steps: list[dict], skip: int | None = None) -> dict:
    """The figures of a run's step lines (see the module's docstring)."""
    if len(steps) < 2:
        raise SystemExit(f"cli_step: the run logged {len(steps)} step(s); at least 2 are needed (1 untimed)")
    skip = max(3, len(steps) // 4) if skip is None else skip
    skip = min(skip, len(steps) - 1)  # at least one timed step
    timed = steps[skip:]
    atoms = sum(step["atoms"] for step in timed)
    padded = sum(step["padded_atoms"] for step in timed)
    return {
        "first step s": steps[0]["step_time_s"],
        "timed steps": len(timed),
        "step ms": 1e3 * statistics.median(step["step_time_s"] for step in timed),
        "fastest ms": 1e3 * min(step["step_time_s"] for step in timed),
        "data wait ms": 1e3 * statistics.median(step["data_wait_s"] for step in timed),
        "peak GB": max(step["peak_memory_gb"] for step in steps),
        "tokens (median)": statistics.median(step["tokens"] for step in timed),
        "atoms (median)": statistics.median(step["atoms"] for step in timed),
        "padded atoms (median)": statistics.median(step["padded_atoms"] for step in timed),
        "padded atoms %": 100.0 * (padded - atoms) / atoms if atoms else float("nan"),
    }


def shape_label(args) -> str:
    """flops.py's label where the step is the one it counts, else the run's own description."""
    diffusion_batch = args.diffusion_batch or preset(args.preset).diffusion.diffusion_batch
    if args.preset == "af3" and diffusion_batch == 48 and not args.train_args:
        depth = preset("af3").trunk.pairformer_blocks
        return f"{ITERATION_PREFIX}full AF3 depth {depth}, diffusion batch 48, crop {args.crop}"
    return f"{args.preset} preset, diffusion batch {diffusion_batch}, crop {args.crop}, N_cycle 1"


def main(argv=None) -> None:
    parser = argument_parser(__doc__)
    parser.add_argument("--cache", type=pathlib.Path, required=True)
    parser.add_argument("--preset", default="af3")
    parser.add_argument("--crop", type=int, default=384)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--diffusion-batch", type=int, help="default: the preset's")
    parser.add_argument("--num-workers", type=int, default=4)
    parser.add_argument("--skip", type=int, help="untimed steps (default: a quarter of the run, at least 3)")
    parser.add_argument("--minutes", type=float, default=8.0, help="the run's budget (its --max-minutes)")
    parser.add_argument("--out", type=pathlib.Path, help="the run's folder (default: a temporary one)")
    parser.add_argument("train_args", nargs=argparse.REMAINDER, help="-- then more `featurecache train` arguments")
    args = parser.parse_args(argv)
    args.train_args = [word for word in args.train_args if word != "--"]
    import torch

    cuda = torch.cuda.is_available()
    out = args.out or pathlib.Path(tempfile.mkdtemp(prefix="cli-step-"))
    command = train_command(args, out, cuda)
    print("$", " ".join(command), flush=True)
    # on the CPU one thread: a small model's OpenMP threads only wait on each other (tests/conftest.py)
    environment = None if cuda else {**os.environ, "OMP_NUM_THREADS": "1"}
    train_s, stopped = harness.run_budgeted_train(command, args.minutes, environment)
    steps = harness.train_steps(out / "log.jsonl")
    figures = summarise(steps, args.skip)
    stamp = harness.run_stamp()
    table = Table(["preset", "crop", "steps (timed)", *(name for name in figures if name != "timed steps")])
    table.add(
        [
            args.preset,
            args.crop,
            f"{len(steps)} ({figures['timed steps']})",
            *(value for name, value in figures.items() if name != "timed steps"),
        ]
    )
    print(f"\n{stamp.header()}\n\n{table.markdown()}")
    if not args.record:
        return
    shape = shape_label(args)
    rows = [
        Row(BENCHMARK, VARIANT, shape, "iteration ms", figures["step ms"]),
        Row(BENCHMARK, VARIANT, shape, "first step s", figures["first step s"]),
        Row(BENCHMARK, VARIANT, shape, "peak GB", figures["peak GB"]),
        Row(BENCHMARK, VARIANT, shape, "padded atoms %", figures["padded atoms %"]),
    ]
    section = "\n".join(
        [
            f"### {shape} ({stamp.header()})",
            "",
            f"`{' '.join(command[2:])}` on `{args.cache}`: {len(steps)} steps in {train_s:.0f} s"
            f"{' (stopped by --minutes)' if stopped else ''}.",
            "",
            table.markdown(),
            "",
            "The TFLOP/s of the headline table, where shown, divide flops.py's count of the synthetic step "
            "(8 atoms a token, 1,024 MSA rows, 4 templates) by this median; the batches here held the "
            "tokens and atoms above.",
        ]
    )
    record(stamp, rows, BENCHMARK, section, "The training step through `featurecache train` (issue 34)")


if __name__ == "__main__":
    main()
