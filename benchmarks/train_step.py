"""Training-step benchmark of the AF3 trunk, or of the full AF3 model (`--model af3`: atom
inputs, trunk, the diffusion batch and every loss): featurecache's Triton kernels vs PyTorch eager
vs torch.compile of the PyTorch path, in one run.

    python3 benchmarks/train_step.py --out results/ [--depth 8] [--cache DIR --online DIR ...] [--record]
    python3 benchmarks/train_step.py --model af3 --depth 48 --crop 384 768 --block-lengths --record
    python3 benchmarks/train_step.py --model af3 --depth 48 --crop 384 768 --block-lengths --variants protenix triton+graphs
    python3 benchmarks/train_step.py --smoke --depth 1 --block-lengths 16 --budget-s 120   # a CPU check
    python3 benchmarks/train_step.py --smoke --model af3 --depth 1 --crop 24 --diffusion-batch 2 --msa-rows 8 \
        --templates 1 --block-lengths --no-checks --budget-s 1200   # CPU (TRITON_INTERPRET=1 for triton variants)
    python3 benchmarks/train_step.py ... --merge earlier/train_step.json   # fill this run's table from an earlier run

benchmarks/device_plan.sh runs it on the H200 in three calls (`smoke` there runs those calls at
tiny sizes on the CPU). The protenix variant runs in a child process of this script: a CUDA fault
in its kernels spoils only that process's CUDA context, and its numbers join this run's table.

Sections (each one is skipped, with the reason in the table, when the time budget runs out):

1. one Pairformer block (c_s 384, c_z 128, bf16 autocast, 10 % padding, no checkpointing),
   forward + backward at L = 384 and 768: the issue's reference table;
2. a whole training iteration (forward, loss, backward, AdamW) of the `af3` preset at each
   --crop, with its Pairformer cut to --depth blocks to fit the device time: the trunk
   (AF3Model.trunk, its atom input embedder included) with the distogram loss, or with `--model af3` the full model (N_cycle 1, --diffusion-batch noised
   copies, --atoms-per-token atoms) preceded by two checks on the device: every parameter gets a
   non-zero gradient, and the triton and torch paths give the same fp32 loss from the same weights;
   the variant `protenix` trains Protenix 2.0's own model, loss and optimizer at the same sizes
   (benchmarks/protenix_peer.py), skipped with the reason where protenix is not installed;
3. the largest crop (multiples of --crop-step, from --crop-start) that trains without running out
   of memory, per variant, with --crop-checkpoint-group Pairformer blocks per checkpoint,
   bounded by time: a crop whose predicted time (cubic in L) exceeds the budget is not tried,
   and the result is then a lower bound, marked ">=";
4. the share of step time spent waiting for data, reading the cache vs featurizing online,
   through the real training loop (featurecache.training) with DataLoader workers.

The table is printed last and written, with every number, to OUT/train_step.json and
OUT/train_step.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib

from harness import argument_parser
from step_budget import start_watchdog
from step_checks import full_model_checks
from step_data_wait import data_wait_share
from step_profile import profile_block, profile_full_step
from step_run import StepRun
from step_timing import free_memory
from step_variants import (
    COLUMNS,
    PEERS,
    VARIANTS,
    bench_block,
    is_compiled,
    peer_in_child,
    peer_unavailable,
)

# The parts, one job each: step_variants.py (what each variant is, how it is built and stepped),
# step_timing.py (time and peak memory), step_budget.py (the time budget, its alarm and watchdog),
# step_crop_search.py (the largest crop), step_checks.py, step_profile.py, step_data_wait.py (the
# other sections), step_report.py (the table, results.csv rows, --merge), step_run.py (the state
# the sections share). This file: the command line and the order of the sections.


def build_parser() -> argparse.ArgumentParser:
    parser = argument_parser(__doc__)
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path(os.environ.get("OUT", "bench-out")))
    parser.add_argument("--depth", type=int, default=8, help="Pairformer blocks of the af3 trunk (paper: 48)")
    parser.add_argument(
        "--model",
        choices=("trunk", "af3"),
        default="trunk",
        help="trunk + distogram, or the full AF3 model (diffusion batch, every loss)",
    )
    parser.add_argument("--crop", type=int, nargs="+", default=[384], help="crop sizes of the iteration section")
    parser.add_argument("--diffusion-batch", type=int, default=48, help="--model af3: noised copies per step (AF3: 48)")
    parser.add_argument("--step-reps", type=int, default=5, help="timed iterations per variant and crop")
    parser.add_argument(
        "--step-warmup",
        type=int,
        default=2,
        help="untimed iterations before them (a CUDA graph warms up and captures in the first)",
    )
    parser.add_argument("--atoms-per-token", type=int, default=8, help="--model af3: atoms per polymer token")
    parser.add_argument("--msa-rows", type=int, default=1024)
    parser.add_argument("--templates", type=int, default=4)
    parser.add_argument("--block-lengths", type=int, nargs="*", default=[384, 768])
    parser.add_argument(
        "--variants",
        nargs="*",
        default=list(VARIANTS),
        choices=list(COLUMNS),
        help="order within the cheap (no compile) and costly (compile) groups; protenix "
        "(--model af3) trains Protenix 2.0 at the same sizes: put it first, so no other "
        "variant's model is in memory during its steps",
    )
    parser.add_argument("--peer-reps", type=int, default=3, help="timed iterations of a peer (about 10 s each)")
    parser.add_argument("--crop-limit", type=int, default=3072, help="largest crop the search tries")
    parser.add_argument(
        "--crop-start",
        nargs="*",
        default=[],
        metavar="[VARIANT=]CROP",
        help="first crop the search tries, for every variant or one (default: the first --crop)",
    )
    parser.add_argument("--crop-step", type=int, default=64, help="the search's crops are multiples of this")
    parser.add_argument(
        "--crop-checkpoint-group",
        type=int,
        default=1,
        help="the model's checkpoint_group (Pairformer blocks per activation checkpoint) in the "
        "crop search only; the step and data-wait sections keep the preset's 1",
    )
    parser.add_argument(
        "--crop-budget-s", type=float, default=45.0, help="time per variant for the crop search (0: no search)"
    )
    parser.add_argument("--budget-s", type=float, default=360.0, help="whole-run time budget")
    parser.add_argument(
        "--first-step-s",
        type=float,
        default=150.0,
        help="time a variant's first crop needs left to start when it compiles: the first Triton "
        "variant (cold cache on a fresh machine) and torch.compile variants; else 20 s",
    )
    parser.add_argument(
        "--peer-budget-s",
        type=float,
        help="time for the protenix variant, run in a child process (its CUDA faults stay there); "
        "default: the run's time left",
    )
    parser.add_argument(
        "--peer-in-process",
        action="store_true",
        help="run the protenix variant in this process (what the child process does)",
    )
    parser.add_argument(
        "--merge",
        type=pathlib.Path,
        nargs="*",
        default=[],
        help="train_step.json files of earlier runs (same device kind): their numbers fill the "
        "table's cells this run does not measure, so the ratios span both runs",
    )
    parser.add_argument("--cache", help="feature cache for the data-wait measurement")
    parser.add_argument("--online", help="raw mmCIF folder for the online data-wait measurement")
    parser.add_argument("--alignments")
    parser.add_argument("--template-dir")
    parser.add_argument("--data-steps", type=int, default=21)
    parser.add_argument(
        "--data-kernels",
        choices=("auto", "triton", "torch"),
        default="auto",
        help="kernels of the data-wait runs (auto: triton if it stepped in this run, else torch)",
    )
    parser.add_argument(
        "--data-graphs",
        action="store_true",
        help="measure the data wait with the loop's --cuda-graphs (the fastest step, so the largest share)",
    )
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument(
        "--profile-block",
        action="store_true",
        help="profile the Triton block at the first block length (top CUDA operators)",
    )
    parser.add_argument("--no-checks", action="store_true", help="--model af3: leave out the on-device checks")
    parser.add_argument(
        "--profile-step",
        action="store_true",
        help="--model af3: profile one triton iteration at the first crop (forward time per part)",
    )
    parser.add_argument(
        "--blocks-only",
        action="store_true",
        help="only the Pairformer block section (and the profile), for a short device call",
    )
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on any device: checks the script runs")
    parser.add_argument(
        "--compile-backend",
        default="inductor",
        help="torch.compile backend of the compiled variants (aot_eager: a quick CPU check)",
    )
    return parser


def parse_arguments() -> argparse.Namespace:
    """The command line, checked: a bad option is one line naming it (exit 2)."""
    parser = build_parser()
    args = parser.parse_args()
    if args.smoke and args.record:
        parser.error("--record with --smoke: a smoke run's numbers are not measurements")
    for item in args.crop_start:
        name, _, value = item.rpartition("=")
        if name not in ("", *VARIANTS) or not value.isdigit():
            parser.error(f"--crop-start {item}: expected CROP or VARIANT=CROP, VARIANT one of {', '.join(VARIANTS)}")
    if args.crop_checkpoint_group < 1 or args.crop_step < 1:
        parser.error("--crop-checkpoint-group and --crop-step must be at least 1")
    for path in args.merge:
        try:
            json.loads(path.read_text())
        except (OSError, ValueError) as error:
            parser.error(f"--merge {path}: not a readable train_step.json ({type(error).__name__})")
    return args


def measure_blocks_and_checks(run: StepRun, fast: list[str]) -> None:
    """Blocks first, while no trunk (model, optimizer state, captured graphs) is alive: the
    block's peak memory would otherwise include them (run 4 read 3.3 GB at L = 384 that way,
    1.8 GB alone). Then the full model's checks and profile."""
    args, device = run.args, run.device
    for length in args.block_lengths:
        for variant in [v for v in fast if v in VARIANTS]:
            run.section(
                f"block{length}/{variant}", 15, bench_block, variant, length, run.dims, device, run.warmup, run.reps
            )
    if "triton" in fast and args.profile_block:
        run.section(
            f"profile/block{args.block_lengths[0]}/triton",
            15,
            profile_block,
            "triton",
            args.block_lengths[0],
            run.dims,
            device,
        )
    if args.model == "af3" and not args.blocks_only and not args.no_checks:
        run.section(
            "checks", 30, full_model_checks, run.overrides, device, min(args.crop[0], 128), 4, args.atoms_per_token
        )
    if args.model == "af3" and args.profile_step and device.type == "cuda":
        run.runners["triton"] = run.make_runner("triton")
        run.section(
            "profile/step/triton",
            30,
            profile_full_step,
            run.runners["triton"],
            run.runners["triton"].batch(args.crop[0], args.msa_rows, args.templates),
            device,
            args.out,
        )


def measure_steps(run: StepRun, fast: list[str]) -> None:
    """The training iteration of each cheap variant at each crop; the protenix peer in a child
    process (unless this is that child)."""
    args = run.args
    for variant in fast:
        reason = peer_unavailable(variant, args.model) if variant in PEERS else None
        if variant in PEERS and not reason and not args.peer_in_process and not args.blocks_only:
            run.runners.clear()  # the child needs the device's memory
            free_memory()
            seconds = min(args.peer_budget_s or math.inf, run.budget.left() - 10)
            if seconds < 60:
                reason = f"time budget ({run.budget.left():.0f} s left)"
            else:
                run.results.update(peer_in_child(args, seconds))
                run.write_results()
                continue
        for crop in [] if args.blocks_only else args.crop:
            if reason:
                run.skip(f"step{crop}/{variant}", reason)
            else:
                run.section(f"step{crop}/{variant}", run.step_reserve(variant, crop), run.step_bench, variant, crop)
        if variant in PEERS:  # not searched: free its model for the next variant
            run.drop_runner(variant)


def measure_data_wait(run: StepRun) -> None:
    """The data wait with the fastest kernels that stepped: the share depends on the step time."""
    args = run.args
    ran = [v for v in ("triton", "eager") if run.measured(f"step{args.crop[0]}/{v}")]
    data_kernels = args.data_kernels if args.data_kernels != "auto" else VARIANTS[ran[0]][0] if ran else "torch"
    for source, option in (("cache", args.cache), ("online", args.online)):
        if option and not args.blocks_only:
            run.section(f"datawait/{source}", 20, data_wait_share, args, run.device, source, data_kernels)


def search_crops(run: StepRun, fast: list[str]) -> None:
    """The largest crop of each cheap variant that stepped (not triton+graphs: a graph per size)."""
    args = run.args
    for variant in fast:
        searched = args.crop_budget_s > 0 and variant in VARIANTS and not VARIANTS[variant][2]
        if run.measured(f"step{args.crop[0]}/{variant}") and searched:
            run.section(f"maxcrop/{variant}", 20, run.crop_search, variant)
        run.drop_runner(variant)


def measure_compiled(run: StepRun, slow: list[str]) -> None:
    """The torch.compile variants last, each whole (blocks, steps, crop search): the budget cuts them first."""
    args = run.args
    for variant in slow:
        for length in args.block_lengths:
            run.section(
                f"block{length}/{variant}", 15, bench_block, variant, length, run.dims, run.device, run.warmup, run.reps
            )
        for crop in [] if args.blocks_only else args.crop:
            run.section(f"step{crop}/{variant}", run.step_reserve(variant, crop), run.step_bench, variant, crop)
        if variant in run.runners and args.crop_budget_s > 0:
            run.section(f"maxcrop/{variant}", 20, run.crop_search, variant)
        run.drop_runner(variant)


def main() -> None:
    run = StepRun(parse_arguments())
    # Cheapest and most important first: when the budget runs out, torch.compile (minutes of
    # compilation) is what is left out, and the table says so.
    fast = [v for v in run.args.variants if not is_compiled(v)]
    slow = [v for v in run.args.variants if is_compiled(v)]
    watchdog = start_watchdog(run.budget, run.out_of_time)
    measure_blocks_and_checks(run, fast)
    measure_steps(run, fast)
    measure_data_wait(run)
    search_crops(run, fast)
    measure_compiled(run, slow)
    watchdog.cancel()
    run.finish()  # also when no section ran (every variant skipped)


if __name__ == "__main__":
    main()
