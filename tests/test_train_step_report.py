"""benchmarks/train_step.py's table, results.csv rows and --merge (benchmarks/step_report.py), on
results written by hand: every number below can be checked against the formatting rules."""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

import pytest

BENCHMARKS = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def step_report():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import step_report
    finally:
        sys.path.remove(str(BENCHMARKS))
    return step_report


ARGS = argparse.Namespace(
    model="af3",
    depth=48,
    diffusion_batch=48,
    block_lengths=[384],
    crop=[384],
    crop_checkpoint_group=7,
    crop_step=128,
    num_workers=2,
)
STAMP = {"date": "2026-12-04 06:00 UTC", "device": "NVIDIA H200", "commit": "abc1234", "args": {}}


def row(text: str, start: str) -> list[str]:
    """The cells of the table's row that starts with `start`."""
    line = next(line for line in text.splitlines() if line.startswith(start))
    return [cell.strip() for cell in line.strip("|").split("|")]


def test_table_cells_and_ratios(step_report):
    results = {
        **STAMP,
        "step384/triton": {"ms": 10.0, "peak_gb": 2.0},
        "step384/eager": {"ms": 25.0, "peak_gb": 3.0},
        "step384/compile": {"skipped": "time budget (12 s left)"},
        "step384/triton+graphs": {"oom": True},
        "maxcrop/triton": {"max_crop": 2304, "bound": "exact", "first_oom": 2432, "tried": []},
        "maxcrop/eager": {"max_crop": 768, "bound": ">=", "first_oom": None, "tried": []},
    }
    text = step_report.table(results, ARGS)
    header = row(text, "| measure")
    step = row(text, "| training iteration, full AF3 depth 48, diffusion batch 48, crop 384 |")
    assert len(step) == len(header) == 1 + 6 + 6
    cells = dict(zip(header, step))
    assert cells["triton"] == "10.0 ms / 2.0 GB" and cells["eager"] == "25.0 ms / 3.0 GB"
    assert cells["torch.compile"] == "skipped: time budget (12 s left)" and cells["triton + CUDA graph"] == "OOM"
    assert cells["triton vs eager"] == "2.50x faster" and cells["triton vs torch.compile"] == "- faster"
    memory = dict(
        zip(header, row(text, "| training iteration, full AF3 depth 48, diffusion batch 48, crop 384: memory"))
    )
    assert memory["triton vs eager"] == "1.50x less" and memory["triton"] == ""
    largest = dict(
        zip(
            header,
            row(
                text,
                "| largest crop without OOM, full AF3 depth 48, diffusion batch 48, checkpoint_group 7, steps of 128 |",
            ),
        )
    )
    assert largest["triton"] == "2304" and largest["eager"] == ">= 768" and largest["triton vs eager"] == "3.00x"
    assert row(text, "| data wait share, cache")[1] == "-"


def test_csv_rows_are_the_measured_numbers(step_report):
    results = {
        **STAMP,
        "block384/triton": {"ms": 1.5, "peak_gb": 0.5},
        "step384/eager": {"skipped": "no time"},
        "maxcrop/eager": {"max_crop": 768, "bound": ">=", "first_oom": None, "tried": []},
        "datawait/cache": {"share": 0.012},
        "profile/block384/triton": {"device_ms": 1.0},
    }
    rows = {(r.variant, r.shape, r.metric): r.value for r in step_report.csv_rows(results, ARGS)}
    assert rows == {
        ("triton", "Pairformer block L=384", "fwd+bwd ms"): 1.5,
        ("triton", "Pairformer block L=384", "peak GB"): 0.5,
        (
            "eager",
            "full AF3 depth 48, diffusion batch 48, checkpoint_group 7, steps of 128",
            "largest crop, at least",
        ): 768,
        ("cache", "af3 depth 48, crop 384, 2 workers", "data wait %"): 1.2,
    }


def test_merge_fills_only_missing_or_skipped_cells_first_file_first(step_report, tmp_path):
    first, second = tmp_path / "first.json", tmp_path / "second.json"
    first.write_text(
        json.dumps(
            {
                **STAMP,
                "commit": "first",
                "step384/eager": {"ms": 25.0, "peak_gb": 3.0},
                "step384/triton": {"ms": 99.0, "peak_gb": 9.0},
                "step384/compile": {"skipped": "time budget (1 s left)"},
            }
        )
    )
    second.write_text(
        json.dumps(
            {
                **STAMP,
                "commit": "second",
                "step384/eager": {"ms": 50.0, "peak_gb": 6.0},
                "step384/compile": {"ms": 20.0, "peak_gb": 2.0},
            }
        )
    )
    results = {**STAMP, "step384/triton": {"ms": 10.0, "peak_gb": 2.0}, "step384/eager": {"skipped": "time budget"}}
    view = step_report.with_earlier_runs(results, [first, second])
    assert view["step384/triton"]["ms"] == 10.0  # this run's own cell stays
    assert view["step384/eager"]["ms"] == 25.0  # the first file that measured it
    assert view["step384/compile"]["ms"] == 20.0  # a skipped earlier cell is not taken
    assert view["commit"] == "abc1234" and view["merged"] == [
        "2026-12-04 06:00 UTC, NVIDIA H200, first: step384/eager",
        "2026-12-04 06:00 UTC, NVIDIA H200, second: step384/compile",
    ]
    assert "merged" not in results and results["step384/eager"] == {"skipped": "time budget"}
    text = step_report.table(view, ARGS)
    assert "| cells from an earlier run (2026-12-04 06:00 UTC, NVIDIA H200, first: step384/eager) |" in text
