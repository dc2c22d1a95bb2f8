"""benchmarks/train_step.py's options for the device plan (benchmarks/device_plan.sh), run on the
CPU at tiny sizes (--smoke, the eager variant): the crop search's start, step and checkpoint group,
and the merge of an earlier run's numbers into the table."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
SMOKE = [
    "--smoke",
    "--model",
    "af3",
    "--depth",
    "2",
    "--crop",
    "16",
    "--diffusion-batch",
    "2",
    "--msa-rows",
    "8",
    "--templates",
    "1",
    "--block-lengths",
    "--no-checks",
    "--step-reps",
    "1",
    "--budget-s",
    "900",
]


def run_train_step(out: pathlib.Path, *arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "train_step.py"), *SMOKE, "--out", str(out), *arguments],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )


def test_crop_search_start_step_and_group_then_merged_into_a_later_table(tmp_path):
    first = tmp_path / "first"
    completed = run_train_step(
        first,
        "--variants",
        "eager",
        "--crop-start",
        "eager=16",
        "--crop-step",
        "16",
        "--crop-limit",
        "32",
        "--crop-checkpoint-group",
        "2",
        "--crop-budget-s",
        "600",
        "--step-warmup",
        "1",
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    earlier = json.loads((first / "train_step.json").read_text())
    search = earlier["maxcrop/eager"]
    # from 16 in steps of 16 up to the limit: nothing runs out of memory on the CPU
    assert [crop for crop, _ in search["tried"]] == [16, 32] and search["max_crop"] == 32
    assert search["bound"] == ">=" and search["checkpoint_group"] == 2
    row = next(line for line in (first / "train_step.md").read_text().splitlines() if line.startswith("| largest crop"))
    assert "checkpoint_group 2, steps of 16" in row and ">= 32" in row

    # a run measuring nothing shows the earlier run's cells, says where they came from, and keeps
    # them out of its own JSON (results.csv gets each run's own numbers only)
    later = tmp_path / "later"
    completed = run_train_step(later, "--variants", "--merge", str(first / "train_step.json"))
    assert completed.returncode == 0, completed.stderr[-3000:]
    table = (later / "train_step.md").read_text()
    step_row = next(line for line in table.splitlines() if line.startswith("| training iteration"))
    assert f"{earlier['step16/eager']['ms']:.1f} ms" in step_row
    assert "| cells from an earlier run (" in table and "maxcrop/eager" in table
    assert "step16/eager" not in json.loads((later / "train_step.json").read_text())


def test_bad_crop_start_is_one_line(tmp_path):
    completed = run_train_step(tmp_path, "--variants", "eager", "--crop-start", "fast=128")
    assert completed.returncode == 2
    assert "--crop-start fast=128: expected CROP or VARIANT=CROP" in completed.stderr.strip().splitlines()[-1]
