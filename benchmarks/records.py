"""Recorded runs: benchmarks/results.csv (one row per number) and benchmarks/RESULTS.md (the prose).

A script run with --record calls `record`, which
  1. appends its rows to results.csv: date, device, commit, benchmark, variant, shape, metric,
     value (one measured number per row; a failed or unmeasured number has no row);
  2. puts the run's markdown section at the top of the benchmark's block in RESULTS.md (between
     `<!-- NAME: begin -->` and `<!-- NAME: end -->`, newest run first), creating the block at
     the end of the file the first time;
  3. rewrites RESULTS.md's headline table from results.csv.

    python3 benchmarks/records.py    # rewrite the headline table only (after editing results.csv)

The headline has one line per figure in HEADLINES: the latest run's value for our variant, and
its ratio against the best peer measured in that same run (same date and device). A full
training step's time whose FLOPs benchmarks/flops.py counted (the same shape) also shows the
achieved TFLOP/s (counted FLOPs / time) and its share of the H200's dense bf16 peak.
"""

from __future__ import annotations

import argparse
import csv
import math
import pathlib
from dataclasses import dataclass
from collections.abc import Iterable

HERE = pathlib.Path(__file__).resolve().parent
RESULTS_MD = HERE / "RESULTS.md"
RESULTS_CSV = HERE / "results.csv"
COLUMNS = ("date", "device", "commit", "benchmark", "variant", "shape", "metric", "value")
HEADLINE_BEGIN, HEADLINE_END = "<!-- headline: begin -->", "<!-- headline: end -->"


@dataclass(frozen=True)
class Row:
    """One measured number of a run (the run's date, device and commit are added on writing)."""

    benchmark: str  # the script's stem: "transition", "train_step"
    variant: str  # who computed it: "triton", "eager", "compile", "featurecache", "2 workers"
    shape: str  # the case: "L=384 C=128 n=4"
    metric: str  # what and its unit: "fwd+bwd ms", "extra peak MiB", "err out"
    value: float


@dataclass(frozen=True)
class Headline:
    """One figure of the headline table: `metric` of each `ours` variant against its peers."""

    benchmark: str
    metric: str
    ours: tuple[str, ...]
    lower_is_better: bool = True
    shapes: tuple[str, ...] | None = None  # None: every shape the benchmark recorded
    peers: tuple[str, ...] | None = None  # None: every variant not in `ours`; (): no comparison


_KERNEL_OPS = ("layernorm_linear", "transition", "triangle_mult", "gated_attention", "residual", "window_attention")
HEADLINES = [
    Headline("evo_attention", "fwd+bwd ms", ("featurecache",)),
    # as called from Python (host launch cost included), and replayed as a CUDA graph (GPU time)
    *(Headline(op, metric, ("triton",)) for op in _KERNEL_OPS for metric in ("fwd+bwd ms", "graph replay ms")),
    Headline("train_step", "fwd+bwd ms", ("triton", "triton+graphs")),
    Headline("train_step", "iteration ms", ("triton", "triton+graphs")),
    Headline("train_step", "largest crop", ("triton",), lower_is_better=False),
    Headline("train_step", "data wait %", ("cache",), peers=()),
    # the same step through `featurecache train` on a real cache (cli_step.py)
    Headline("cli_step", "iteration ms", ("featurecache train",), peers=()),
    Headline("loader", "read ms", ("featurecache",), shapes=("all targets",)),
    Headline("precompute", "wall s", ("2 workers",)),
    Headline("precompute", "overhead % of tool time", ("1 worker",), peers=()),
    Headline("flops", "TFLOP total", ("reference path",), peers=()),
    # a preset's step through train's objects (tiny_step.py; the CPU target is wall time on 2
    # cores; "torch" the CPU's rows, "triton" the GPU's), against a checkout run beside it (--variant)
    Headline("tiny_step", "step s", ("torch", "triton")),
    Headline("tiny_step", "step CPU s", ("torch", "triton")),
    Headline("tiny_step", "peak RSS GB", ("torch",)),
    Headline("tiny_step", "peak GPU memory GB", ("triton",)),
    # AF3Model.sample against Protenix 2.0's inference at the same sizes (inference.py)
    Headline("inference", "model s", ("featurecache", "featurecache+graphs"), peers=("protenix",)),
    Headline("inference", "peak GB", ("featurecache", "featurecache+graphs"), peers=("protenix",)),
]


# A Hopper GPU's dense bf16 matrix rate, TFLOP/s: what an 8192^3 product reached on random data on
# this workplace's H200s (788) and H100s (769-798; /work/.library/device/KINDS.md) — the two share
# the SM and its rates. The headline's share is of this ceiling, on those GPUs.
HOPPER_BF16_PEAK_TFLOPS = 790.0
HOPPER_GPUS = ("H100", "H200")
# The train_step benchmark's shape of a whole iteration is flops.py's shape after this prefix.
ITERATION_PREFIX = "training iteration, "
# tiny_step.py's shapes are flops.py --cache's shape and one of these
TINY_STEP_MODES = ("CUDA graphs", "eager")
# the step-time metrics a counted step's TFLOP divides, in seconds per unit
STEP_TIME_SECONDS = {"iteration ms": 1e-3, "step s": 1.0}


def record(stamp, rows: Iterable[Row], benchmark: str, section: str, title: str | None = None) -> None:
    """Append rows to results.csv and `section` (markdown, starting with a ### heading) to the
    benchmark's block of RESULTS.md (a new block is headed `title`); then refresh the headline.
    `stamp` is a harness.RunStamp."""
    append_rows(stamp, rows, RESULTS_CSV)
    add_section(benchmark, section, title, RESULTS_MD)
    write_headline(RESULTS_MD, RESULTS_CSV)
    print(f"recorded in {RESULTS_MD.name} and {RESULTS_CSV.name}")


def append_rows(stamp, rows: Iterable[Row], path: pathlib.Path = RESULTS_CSV) -> None:
    new_file = not path.is_file() or path.stat().st_size == 0
    with open(path, "a", newline="") as handle:
        writer = csv.writer(handle)
        if new_file:
            writer.writerow(COLUMNS)
        for row in rows:
            if row.value is None or math.isnan(row.value):
                continue  # an unmeasured number has no row
            writer.writerow(
                [
                    stamp.date,
                    stamp.device,
                    stamp.commit,
                    row.benchmark,
                    row.variant,
                    row.shape,
                    row.metric,
                    f"{row.value:.6g}",
                ]
            )


def read_rows(path: pathlib.Path = RESULTS_CSV) -> list[dict]:
    with open(path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    for number, row in enumerate(rows, start=2):
        try:
            row["value"] = float(row["value"])
        except (TypeError, ValueError):
            raise ValueError(f"{path}:{number}: value {row['value']!r} is not a number") from None
    return rows


def add_section(benchmark: str, section: str, title: str | None = None, path: pathlib.Path = RESULTS_MD) -> None:
    """Put `section` first in the benchmark's block (after its introduction, before older runs)."""
    text = path.read_text()
    begin, end = f"<!-- {benchmark}: begin -->", f"<!-- {benchmark}: end -->"
    section = section.strip() + "\n\n"
    if begin not in text:
        heading = f"{title or benchmark} (`benchmarks/{benchmark}.py`)"
        text = text.rstrip("\n") + f"\n\n{begin}\n## {heading}\n\n{section}{end}\n"
    else:
        start = text.index(begin)
        stop = text.index(end, start)
        older = text.find("\n### ", start, stop)
        at = older + 1 if older >= 0 else stop
        text = text[:at] + section + text[at:]
    path.write_text(text)


def headline_table(rows: list[dict]) -> str:
    lines = [
        "| benchmark | what (variant) | value | ours vs the best peer of the same run (> 1: ours better) "
        "| date | device | commit | TFLOP/s (share of 790, Hopper bf16) |",
        "| --- | --- | ---: | --- | --- | --- | --- | --- |",
    ]
    step_flops = counted_step_tflop(rows)
    for spec in HEADLINES:
        measured = [
            r
            for r in rows
            if r["benchmark"] == spec.benchmark
            and r["metric"] == spec.metric
            and (spec.shapes is None or r["shape"] in spec.shapes)
        ]
        shapes = list(dict.fromkeys(r["shape"] for r in measured))  # first-recorded order
        for shape in shapes:
            for variant in spec.ours:
                line = _headline_line(spec, shape, variant, [r for r in measured if r["shape"] == shape], step_flops)
                if line:
                    lines.append(line)
    return "\n".join(lines)


def counted_step_tflop(rows: list[dict]) -> dict[str, float]:
    """{timed step's shape: TFLOP of that step} from the latest count of each shape (flops.py): a
    synthetic count under train_step's iteration shape, a real-data count (flops.py --cache)
    under tiny_step's af3 shapes, with and without CUDA graphs (the same arithmetic)."""
    counts = sorted(
        (r for r in rows if r["benchmark"] == "flops" and r["metric"] == "TFLOP total"), key=lambda r: r["date"]
    )
    step_flops = {}
    for r in counts:
        for timed in (ITERATION_PREFIX + r["shape"], *(f"{r['shape']}, {how}" for how in TINY_STEP_MODES)):
            step_flops[timed] = r["value"]
    return step_flops


def achieved(shape: str, metric: str, value: float, device: str, step_flops: dict[str, float]) -> str:
    """ "85.2 (10.8 %)": a counted step's TFLOP over its measured time (train_step's iteration ms,
    tiny_step's step s), and the share of a Hopper GPU's bf16 rate (on an H100 or H200); "–" for any
    other figure."""
    if metric not in STEP_TIME_SECONDS or shape not in step_flops or not value > 0:
        return "–"
    tflops = step_flops[shape] / (value * STEP_TIME_SECONDS[metric])
    hopper = any(name in device for name in HOPPER_GPUS)
    share = f" ({100 * tflops / HOPPER_BF16_PEAK_TFLOPS:.1f} %)" if hopper else ""
    return f"{tflops:.1f}{share}"


def _headline_line(
    spec: Headline, shape: str, variant: str, rows: list[dict], step_flops: dict[str, float]
) -> str | None:
    ours = [r for r in rows if r["variant"] == variant]
    if not ours:
        return None
    latest = max(ours, key=lambda r: r["date"])
    peers = [
        r
        for r in rows
        if r["date"] == latest["date"]
        and r["device"] == latest["device"]
        and (r["variant"] not in spec.ours if spec.peers is None else r["variant"] in spec.peers)
    ]
    comparison = "–"
    if peers:
        best = (min if spec.lower_is_better else max)(peers, key=lambda r: r["value"])
        ratio = best["value"] / latest["value"] if spec.lower_is_better else latest["value"] / best["value"]
        comparison = f"{ratio:.2f}x ({best['variant']}: {best['value']:g})"
    rate = achieved(shape, spec.metric, latest["value"], latest["device"], step_flops)
    return (
        f"| {spec.benchmark} | {shape}, {spec.metric} ({variant}) | {latest['value']:g} | {comparison} | "
        f"{latest['date']} | {latest['device']} | {latest['commit']} | {rate} |"
    )


def write_headline(md: pathlib.Path = RESULTS_MD, csv_path: pathlib.Path = RESULTS_CSV) -> None:
    text = md.read_text()
    if HEADLINE_BEGIN not in text or HEADLINE_END not in text:
        raise ValueError(f"{md} has no headline block ({HEADLINE_BEGIN} ... {HEADLINE_END})")
    start = text.index(HEADLINE_BEGIN) + len(HEADLINE_BEGIN)
    stop = text.index(HEADLINE_END)
    md.write_text(text[:start] + "\n" + headline_table(read_rows(csv_path)) + "\n" + text[stop:])


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    write_headline()
    print(f"headline of {RESULTS_MD} rewritten from {RESULTS_CSV.name}")
