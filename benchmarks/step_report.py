"""benchmarks/train_step.py's table and records: the markdown table (printed, and written to
OUT/train_step.md), the rows it records in results.csv, and the cells it takes from earlier runs'
train_step.json files (--merge) where this run did not measure them."""

from __future__ import annotations

import json
import pathlib

from records import Row
from step_variants import COLUMNS

NAMES = {
    "triton": "triton",
    "eager": "eager",
    "compile": "torch.compile",
    "triton+compile": "triton + compiled glue",
    "triton+graphs": "triton + CUDA graph",
    "protenix": "Protenix 2.0",
}
# (numerator variant, denominator variant): "a vs b" is b's time over a's
COMPARISONS = [
    ("triton", "eager"),
    ("triton", "compile"),
    ("triton+graphs", "eager"),
    ("triton+graphs", "compile"),
    ("triton", "protenix"),
    ("triton+graphs", "protenix"),
]
BLANK = " |" * len(COMPARISONS)  # the comparison cells of a row without them


def table(results: dict, args) -> str:
    """The run's markdown table: a column per variant, then one per comparison; a time row and a
    memory row per block length and crop, the largest crop, one-cell notes, the data wait."""
    rows = [
        "| measure | "
        + " | ".join(NAMES[v] for v in COLUMNS)
        + " | "
        + " | ".join(f"{NAMES[a]} vs {NAMES[b]}" for a, b in COMPARISONS)
        + " |",
        "| --- |" + " --- |" * (len(COLUMNS) + len(COMPARISONS)),
    ]
    for length in args.block_lengths:
        rows += time_rows(results, f"Pairformer block fwd+bwd, L={length}", f"block{length}")
    for crop in args.crop:
        rows += time_rows(results, f"training iteration, {model_label(args)}, crop {crop}", f"step{crop}")
    crops = [cell(results.get(f"maxcrop/{v}"), largest_crop) for v in COLUMNS]
    longer = [
        ratio(field(results, f"maxcrop/{a}", "max_crop"), field(results, f"maxcrop/{b}", "max_crop"))
        for a, b in COMPARISONS
    ]
    rows.append(f"| largest crop without OOM, {search_label(args)} | {' | '.join(crops)} | {' | '.join(longer)} |")
    rows += note_rows(results)
    for source in ("cache", "online"):
        result = results.get(f"datawait/{source}")
        rows.append(
            f"| data wait share, {source} | "
            + cell(
                result,
                lambda r: (
                    f"{100 * r['share']:.2f} % ({r['wait_ms']:.0f} of {r['step_ms']:.0f} ms); "
                    f"within epochs {100 * (r['share_within_epoch'] or 0):.2f} % ({r['kernels']} kernels)"
                ),
            )
            + " |" * len(COLUMNS)
            + BLANK
        )
    return "\n".join(rows)


def field(results: dict, key: str, name: str):
    value = results.get(key, {})
    return value.get(name) if isinstance(value, dict) else None


def time_rows(results: dict, label: str, prefix: str) -> list[str]:
    """Time and peak memory of each variant at one size, and the ratios between them."""
    cells = [cell(results.get(f"{prefix}/{v}"), lambda r: f"{r['ms']:.1f} ms / {r['peak_gb']:.1f} GB") for v in COLUMNS]
    speed = [
        ratio(field(results, f"{prefix}/{b}", "ms"), field(results, f"{prefix}/{a}", "ms")) + " faster"
        for a, b in COMPARISONS
    ]
    memory = [
        ratio(field(results, f"{prefix}/{b}", "peak_gb"), field(results, f"{prefix}/{a}", "peak_gb")) + " less"
        for a, b in COMPARISONS
    ]
    return [
        f"| {label} | {' | '.join(cells)} | {' | '.join(speed)} |",
        f"| {label}: memory |{' |' * len(COLUMNS)} {' | '.join(memory)} |",
    ]


def largest_crop(r: dict) -> str:
    if r["max_crop"] is None:  # nothing fitted: below the smallest crop that ran out of memory
        return f"< {r['first_oom']}" if r["first_oom"] else f"stopped at {r.get('stopped_at')}"
    return f"{'' if r['bound'] == 'exact' else '>= '}{r['max_crop']}"


def note_rows(results: dict) -> list[str]:
    """One-cell rows: the on-device checks, the profiles, the peer's settings, the merged runs."""
    rows = []
    checks = results.get("checks")
    if isinstance(checks, dict) and "max_relative_difference" in checks:
        rows.append(
            f"| checks: {checks['parameters'] / 1e6:.1f} M parameters, {len(checks['dead_parameters'])} without "
            f"gradient; triton vs torch fp32 loss terms, largest relative difference "
            f"{checks['max_relative_difference']:.2e} |{' |' * len(COLUMNS)}{BLANK}"
        )
    elif checks is not None:
        rows.append(f"| checks | {cell(checks, str)} |{' |' * (len(COLUMNS) - 1)}{BLANK}")
    for key, value in results.items():
        if key.startswith("profile/") and "forward_ms" in value:
            parts = ", ".join(f"{name} {v['ms']:.0f} ms ({v['calls']}x)" for name, v in value["forward_ms"].items())
            rows.append(
                f"| {key}: device time {value['device_ms']:.0f} ms of {value['wall_ms_profiled']:.0f} ms wall; "
                f"forward by part: {parts} |{' |' * len(COLUMNS)}{BLANK}"
            )
        elif key.startswith("profile/") and "device_ms" in value:
            rows.append(
                f"| {key}: device time {value['device_ms']:.1f} ms of {value['wall_ms_profiled']:.1f} ms wall, "
                f"host enqueue {value['host_enqueue_ms']:.1f} ms, {value['kernels_per_step']} kernels "
                f"|{' |' * len(COLUMNS)}{BLANK}"
            )
    peer = results.get("peer")
    if isinstance(peer, dict):
        rows.append(
            f"| Protenix: {peer['parameters_millions']:.1f} M parameters; kernels: "
            + "; ".join(f"{k} {v}" for k, v in peer["kernel_options"].items())
            + f"; {peer['settings']} |{' |' * len(COLUMNS)}{BLANK}"
        )
    for merged in results.get("merged", []):
        rows.append(f"| cells from an earlier run ({merged}) |{' |' * len(COLUMNS)}{BLANK}")
    return rows


def cell(result: dict | None, fmt) -> str:
    if result is None:
        return "-"
    for flag in ("skipped", "error"):
        if flag in result:
            return f"{flag}: {str(result[flag])[:60]}"
    if result.get("oom"):
        return "OOM"
    return fmt(result)


def ratio(numerator, denominator) -> str:
    try:
        return f"{numerator / denominator:.2f}x"
    except (TypeError, ZeroDivisionError, KeyError):
        return "-"


def model_label(args) -> str:
    if args.model == "af3":
        return f"full AF3 depth {args.depth}, diffusion batch {args.diffusion_batch}"
    return f"af3 depth {args.depth}"


def search_label(args) -> str:
    group = f", checkpoint_group {args.crop_checkpoint_group}" if args.crop_checkpoint_group != 1 else ""
    return f"{model_label(args)}{group}, steps of {args.crop_step}"


def csv_rows(results: dict, args) -> list[Row]:
    """Every measured number of the run, keyed as the table's rows are."""
    rows = []
    for key, result in results.items():
        kind, _, variant = key.partition("/")
        if not isinstance(result, dict) or not variant or kind == "profile":
            continue
        if kind.startswith("block") and "ms" in result:
            shape = f"Pairformer block L={kind[len('block') :]}"
            rows += [
                Row("train_step", variant, shape, "fwd+bwd ms", result["ms"]),
                Row("train_step", variant, shape, "peak GB", result["peak_gb"]),
            ]
        elif kind.startswith("step") and "ms" in result:
            shape = f"training iteration, {model_label(args)}, crop {kind[len('step') :]}"
            rows += [
                Row("train_step", variant, shape, "iteration ms", result["ms"]),
                Row("train_step", variant, shape, "peak GB", result["peak_gb"]),
            ]
        elif kind == "maxcrop" and result.get("max_crop") is not None:
            metric = "largest crop" if result["bound"] == "exact" else "largest crop, at least"
            rows.append(Row("train_step", variant, search_label(args), metric, result["max_crop"]))
        elif kind == "datawait" and "share" in result:
            shape = f"af3 depth {args.depth}, crop {args.crop[0]}, {args.num_workers} workers"
            rows.append(Row("train_step", variant, shape, "data wait %", 100 * result["share"]))
    return rows


def with_earlier_runs(results: dict, paths: list[pathlib.Path]) -> dict:
    """`results` with the cells it lacks (absent or skipped) taken from earlier runs' JSON files,
    the first file that measured a cell winning; "merged" lists each run and the cells taken."""
    view, merged = dict(results), []
    for path in paths:
        earlier = json.loads(path.read_text())
        taken = [
            key
            for key, value in earlier.items()
            if ("/" in key or key in ("peer", "checks"))
            and isinstance(value, dict)
            and "skipped" not in value
            and (not isinstance(view.get(key), dict) or "skipped" in view[key])
        ]
        view.update({key: earlier[key] for key in taken})
        if taken:
            run = ", ".join(str(earlier.get(field)) for field in ("date", "device", "commit"))
            merged.append(f"{run}: {', '.join(taken)}")
    if merged:
        view["merged"] = merged
    return view
