"""benchmarks/inference.py --smoke: featurecache's inference and Protenix 2.0's own, each in its
child process at one block per stack on the CPU, in one table; the graphed variant is reported
as not run, with the reason, where there is no GPU."""

from __future__ import annotations

import math
import pathlib
import re
import subprocess
import sys

import pytest
import torch

REPO = pathlib.Path(__file__).resolve().parents[1]


def test_smoke_times_featurecache_and_protenix_side_by_side():
    pytest.importorskip("protenix")
    result = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "inference.py"), "--smoke"],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    rows = {}
    for line in result.stdout.splitlines():
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if len(cells) == 6 and cells[1] in ("protenix", "featurecache", "featurecache+graphs"):
            rows[cells[1]] = cells
    for variant in ("protenix", "featurecache"):
        tokens, _, atoms, seconds, _, ratio = rows[variant]
        assert tokens == "24" and int(atoms) > 24, rows[variant]
        assert float(seconds) > 0 and math.isfinite(float(ratio)), rows[variant]
    # the same inputs' sizes on both sides
    assert rows["protenix"][2] == rows["featurecache"][2]
    if not torch.cuda.is_available():
        assert re.search("not run: CUDA graphs need a CUDA device", " ".join(rows["featurecache+graphs"]))


def test_the_headline_sets_each_featurecache_figure_against_protenix_of_the_same_run():
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import records
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    shape = "384 tokens, 5 samples x 200 steps, 4 cycles, 1024 MSA rows, 4 templates"
    run = {"date": "2026-12-05 10:00 UTC", "device": "NVIDIA H200", "commit": "abc1234", "benchmark": "inference"}
    rows = [
        {**run, "variant": variant, "shape": shape, "metric": metric, "value": value}
        for variant, seconds, peak in (
            ("protenix", 30.0, 20.0),
            ("featurecache", 10.0, 8.0),
            ("featurecache+graphs", 7.5, 8.5),
        )
        for metric, value in (("model s", seconds), ("peak GB", peak))
    ]
    table = records.headline_table(rows)
    assert f"| inference | {shape}, model s (featurecache) | 10 | 3.00x (protenix: 30) |" in table
    assert f"| inference | {shape}, model s (featurecache+graphs) | 7.5 | 4.00x (protenix: 30) |" in table
    assert f"| inference | {shape}, peak GB (featurecache+graphs) | 8.5 | 2.35x (protenix: 20) |" in table
