"""One run of benchmarks/train_step.py: its sizes, its time budget, its results (what
train_step.json holds), the models alive between sections, and how a section is run, written and
recorded. train_step.py decides which sections run, in which order."""

from __future__ import annotations

import dataclasses
import json
import os
import sys

import protenix_peer
import torch
from harness import run_stamp
from records import record
from step_budget import Budget, run_section
from step_crop_search import crop_start, max_crop
from step_report import csv_rows, table, with_earlier_runs
from step_timing import free_memory, timed
from step_variants import (
    COMPILE,
    PEERS,
    VARIANTS,
    FullModelRunner,
    TrunkRunner,
    is_compiled,
)

from featurecache.model import preset

# One Pairformer block's sizes: the af3 preset's, or tiny ones for --smoke.
BLOCK_DIMS = {"c_s": 384, "c_z": 128, "single_heads": 16, "single_head_dim": 24, "pair_heads": 4, "pair_head_dim": 32}
SMOKE_BLOCK_DIMS = {"c_s": 32, "c_z": 16, "single_heads": 2, "single_head_dim": 8, "pair_heads": 2, "pair_head_dim": 8}


class StepRun:
    """The state every section of one train_step.py run shares."""

    def __init__(self, args) -> None:
        COMPILE["backend"] = args.compile_backend
        COMPILE["dynamic"] = True if args.crop_budget_s > 0 else None
        self.args = args
        self.budget = Budget(args.budget_s)
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.dims = BLOCK_DIMS
        self.overrides = {"pairformer_blocks": args.depth}  # of the af3 preset
        self.warmup, self.reps = 3, 10  # of the block section
        if args.smoke:
            self.dims = SMOKE_BLOCK_DIMS
            self.overrides = {k: v for k, v in preset("tiny").settings().items() if k != "kernels"}
            self.overrides["pairformer_blocks"] = args.depth
            self.warmup, self.reps = 1, 2
        args.out.mkdir(parents=True, exist_ok=True)
        self.stamp = run_stamp()
        self.results: dict = {**dataclasses.asdict(self.stamp), "args": {k: str(v) for k, v in vars(args).items()}}
        print(self.stamp.header(), flush=True)
        self.runners: dict = {}  # variant -> its model and optimizer, while alive
        config = preset("af3", **self.overrides)
        model = f"full model (diffusion batch {args.diffusion_batch})" if args.model == "af3" else "trunk"
        self.header = (
            f"{self.stamp.header()}; {'tiny (smoke)' if args.smoke else 'af3'} {model} with "
            f"{config.trunk.pairformer_blocks} Pairformer blocks, {config.msa.msa_blocks} MSA blocks "
            f"({args.msa_rows} rows), {config.templates.template_blocks} template blocks "
            f"({args.templates} templates)"
        )

    def measured(self, key: str) -> bool:
        return "ms" in self.results.get(key, {})

    # --- models ------------------------------------------------------------------------------------

    def make_runner(self, variant: str, config: dict | None = None) -> TrunkRunner | protenix_peer.ProtenixPeer:
        args, config = self.args, self.overrides if config is None else config
        if variant == "protenix":
            peer = protenix_peer.ProtenixPeer(
                self.device,
                args.depth,
                args.diffusion_batch,
                args.atoms_per_token,
                small=args.smoke,
                first_length=args.crop[0],
            )
            self.results["peer"] = {
                "parameters_millions": peer.parameters_millions(),
                "kernel_options": peer.kernel_options,
                "settings": peer.settings(),
            }
            return peer
        if args.model == "af3":
            return FullModelRunner(variant, config, self.device, args.diffusion_batch, args.atoms_per_token)
        return TrunkRunner(variant, config, self.device)

    def drop_runner(self, variant: str) -> None:
        self.runners.pop(variant, None)
        free_memory()

    # --- sections ----------------------------------------------------------------------------------

    def step_bench(self, variant: str, crop: int) -> dict:
        args = self.args
        if variant not in self.runners:
            # one model at a time: another variant's weights and optimizer state would count in
            # this one's peak memory (the crop search builds its runner anew)
            for other in [v for v in self.runners if v != variant]:
                self.runners.pop(other)
            free_memory()
            self.runners[variant] = self.make_runner(variant)
        runner = self.runners[variant]
        batch = runner.batch(crop, args.msa_rows, args.templates)
        peer = variant in PEERS  # its first call at a size also autotunes its Triton kernel
        ms, peak = timed(
            lambda: runner.iteration(batch),
            self.device,
            1 if args.smoke or peer else args.step_warmup,
            2 if args.smoke else args.peer_reps if peer else args.step_reps,
            graphs=runner.graphs,
        )
        return {"ms": ms, "peak_gb": peak}

    def crop_search(self, variant: str) -> dict:
        args = self.args
        runner = self.runners.pop(variant, None) if args.crop_checkpoint_group == 1 else None
        self.runners.clear()  # no other model in memory while searching
        free_memory()
        runner = runner or self.make_runner(variant, {**self.overrides, "checkpoint_group": args.crop_checkpoint_group})
        share = min(args.crop_budget_s, max(0.0, self.budget.left() - 30))
        found = max_crop(
            runner, crop_start(args, variant), args.crop_limit, args.msa_rows, args.templates, share, args.crop_step
        )
        return {**found, "checkpoint_group": runner.model.config.runtime.checkpoint_group}  # as the model was built

    def step_reserve(self, variant: str, crop: int) -> float:
        """Time left that a step section needs to start: a variant's first crop compiles when it is
        the first Triton variant to step (a cold cache on a fresh machine) or uses torch.compile."""
        args = self.args
        if args.smoke or crop != args.crop[0] or variant not in VARIANTS:
            return 20
        triton_stepped = any(
            self.measured(f"step{c}/{v}") for v in VARIANTS for c in args.crop if VARIANTS[v][0] == "triton"
        )
        compiles = is_compiled(variant) or (VARIANTS[variant][0] == "triton" and not triton_stepped)
        return args.first_step_s if compiles else 20

    def section(self, key: str, reserve_s: float, function, *section_args) -> None:
        run_section(self.results, key, self.budget, reserve_s, function, *section_args)
        self.write_results()  # after every section: a run cut short still returns what it measured

    def skip(self, key: str, reason: str) -> None:
        self.results[key] = {"skipped": reason}
        print(f"[skip] {key}: {reason}", flush=True)

    # --- output ------------------------------------------------------------------------------------

    def write_results(self) -> None:
        out, merge = self.args.out, self.args.merge
        (out / "train_step.json").write_text(json.dumps(self.results, indent=1, default=str))
        (out / "train_step.md").write_text(
            self.header + "\n\n" + table(with_earlier_runs(self.results, merge), self.args) + "\n"
        )

    def finish(self) -> None:
        """The table (with earlier runs' cells) written, printed last, and recorded with --record."""
        self.write_results()
        text = table(with_earlier_runs(self.results, self.args.merge), self.args)
        print()
        print(self.header)
        print(text, flush=True)
        if self.args.record:
            command = f"`python3 benchmarks/train_step.py {' '.join(sys.argv[1:])}`"
            # results.csv: this run's numbers only (an earlier run recorded its own)
            record(
                self.stamp,
                csv_rows(self.results, self.args),
                "train_step",
                f"### Run of {self.header}\n\n{command}\n\n{text}\n",
                "Training step",
            )

    def out_of_time(self) -> None:
        """The watchdog's end of the run (step_budget.start_watchdog): the table of what was
        measured, then exit status 3."""
        self.results["stopped"] = "watchdog: time budget exceeded"
        self.finish()
        os._exit(3)
