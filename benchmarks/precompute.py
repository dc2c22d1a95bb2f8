"""Search-mode precompute on this machine: tool time versus pipeline overhead, 1 versus 2 workers.

Builds the small real search databases from ../shared/data (featurecache.testing.testdb),
then runs `precompute --config` over the sample structures plus protein sequences taken from
the mmseqs2-examples UniProt FASTA (as FASTA targets), into a fresh cache each time:

- with 1 Ray worker: wall time, time inside the tools (summed over tasks), and the overhead
  (everything else: Ray scheduling, parsing, featurization, encoding, LMDB writes);
- with 2 Ray workers: the speed-up of the wall time.

Ray's own start-up (a few seconds, once per job) is timed separately and not counted as
overhead. Then, inline and query-only, the reference-conformer cost per target: the first
run computes every CCD code's conformer, a rerun with changed feature settings (every record
recomputed) finds them all in the `conformers` table.
Run: python3 benchmarks/precompute.py [--extra-sequences 12] [--record]

`--scale` measures PDB-sized ingest-mode precompute instead (precompute_scale.py):
python3 benchmarks/precompute.py --scale --targets 1000 5000 20000 [--workers 2] [--msa-rows 2048] [--record]
"""

from __future__ import annotations

import gzip
import os
import pathlib
import tempfile
import time

import ray
from harness import REPO, argument_parser, run_stamp
from records import Row, record

from featurecache.precompute.pipeline import PrecomputeOptions, precompute
from featurecache.testing.testdb import build_test_databases, write_pipeline_config

HERE = pathlib.Path(__file__).resolve().parent
DATA = pathlib.Path(os.environ.get("FC_SHARED_DATA", REPO.parent / "shared" / "data"))
UNIPROT = pathlib.Path("/usr/share/doc/mmseqs2/example-data/DB.fasta.gz")


def _uniprot_targets(folder: pathlib.Path, count: int, skip: int = 5000) -> None:
    """Write `count` single-chain FASTA targets (100-400 residues) from the UniProt example set."""
    written, seen = 0, 0
    name, sequence = None, []
    with gzip.open(UNIPROT, "rt") as handle:
        for line in list(handle) + [">end\n"]:
            if line.startswith(">"):
                if name is not None and 100 <= len("".join(sequence)) <= 400:
                    seen += 1
                    if seen > skip:
                        (folder / f"uniprot_{written:03d}.fasta").write_text(
                            f">{name} mol:protein\n{''.join(sequence)}\n"
                        )
                        written += 1
                        if written == count:
                            return
                name, sequence = line[1:].split()[0], []
            else:
                sequence.append(line.strip())


def _run(inputs: pathlib.Path, config: pathlib.Path, cache: pathlib.Path, workers: int) -> dict:
    ray.shutdown()
    started = time.perf_counter()
    ray.init(num_cpus=workers, include_dashboard=False, logging_level="WARNING")
    ray_startup = time.perf_counter() - started
    started = time.perf_counter()
    summary = precompute(PrecomputeOptions(inputs=[inputs], cache_dir=cache, config_path=config, progress=False))
    wall = time.perf_counter() - started
    ray.shutdown()
    return {
        "workers": workers,
        "ray_startup_s": ray_startup,
        "wall_s": wall,
        "tool_s": summary.tool_seconds,
        "featurize_s": summary.featurize_seconds,
        "write_s": summary.write_seconds,
        "searched": summary.stages["search"].done,
        "targets": summary.stages["featurize"].done,
        "failed": summary.failed + summary.stages["search"].failed,
    }


def _conformer_runs(inputs: pathlib.Path, cache: pathlib.Path) -> list[dict]:
    """Conformer cost per target: first run (computed) vs a rerun whose records are all stale
    (conformers read from the cache). Inline, query-only: no tools, no Ray."""
    runs = []
    for label, rows in (("first", 16384), ("cached", 8192)):
        started = time.perf_counter()
        summary = precompute(
            PrecomputeOptions(inputs=[inputs], cache_dir=cache, executor="inline", progress=False, msa_rows_stored=rows)
        )
        targets = max(1, summary.stages["featurize"].done)
        counts = summary.stages["conformers"]
        runs.append(
            {
                "run": label,
                "targets": summary.stages["featurize"].done,
                "computed": counts.done,
                "cached": counts.skipped,
                "conformer_s": summary.conformer_seconds,
                "conformer_ms_per_target": 1000 * summary.conformer_seconds / targets,
                "featurize_ms_per_target": 1000 * summary.featurize_seconds / targets,
                "wall_s": time.perf_counter() - started,
            }
        )
    return runs


def _conformer_table(runs: list[dict]) -> str:
    lines = [
        "| run | targets | conformers computed | found cached | conformer s | conformer ms / target | "
        "featurize ms / target | wall s |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for run in runs:
        lines.append(
            f"| {run['run']} | {run['targets']} | {run['computed']} | {run['cached']} | "
            f"{run['conformer_s']:.2f} | {run['conformer_ms_per_target']:.0f} | "
            f"{run['featurize_ms_per_target']:.0f} | {run['wall_s']:.1f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argument_parser(__doc__)
    parser.add_argument("--extra-sequences", type=int, default=12, help="UniProt FASTA targets added to the structures")
    parser.add_argument("--scale", action="store_true", help="PDB-sized ingest-mode runs instead (precompute_scale.py)")
    parser.add_argument("--targets", type=int, nargs="+", default=[1000, 5000, 20000], help="--scale: target counts")
    parser.add_argument("--workers", type=int, default=2, help="--scale: local Ray workers")
    parser.add_argument("--msa-rows", type=int, default=2048, help="--scale: rows kept of each sample A3M")
    args = parser.parse_args()
    stamp = run_stamp()
    if args.scale:
        from precompute_scale import scale_main

        scale_main(args, stamp, DATA, HERE / "results.csv")
        return

    work = pathlib.Path(tempfile.mkdtemp(prefix="fc-precompute-bench-"))
    databases = build_test_databases(work / "databases", DATA)
    config = write_pipeline_config(databases, work / "pipeline.toml", threads=1, template_tool="hhsearch")
    inputs = work / "inputs"
    inputs.mkdir()
    for path in (DATA / "structures").iterdir():
        (inputs / path.name).write_bytes(path.read_bytes())
    if args.extra_sequences:
        _uniprot_targets(inputs, args.extra_sequences)

    conformer_runs = _conformer_runs(inputs, work / "cache-conformers")
    runs = [_run(inputs, config, work / f"cache-{workers}", workers) for workers in (1, 2)]
    one, two = runs
    lines = [
        "| workers | targets | sequences searched | failed | wall s | in tools s | featurize s | LMDB write s | "
        "overhead s (wall - tools) | overhead / tools | Ray start-up s |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for run in runs:
        overhead = _overhead_s(run)
        lines.append(
            f"| {run['workers']} | {run['targets']} | {run['searched']} | {run['failed']} | {run['wall_s']:.1f} | "
            f"{run['tool_s']:.1f} | {run['featurize_s']:.1f} | {run['write_s']:.2f} | {overhead:.1f} | "
            f"{overhead / run['tool_s']:.1%} | {run['ray_startup_s']:.1f} |"
        )
    lines.append("")
    lines.append(
        f"Speed-up from 1 to 2 workers (wall time): **{one['wall_s'] / two['wall_s']:.2f}x**; "
        f"pipeline overhead with 1 worker: **{(one['wall_s'] - one['tool_s']) / one['tool_s']:.1%}** of tool time."
    )
    lines += [
        "",
        "Reference conformers (inline, query-only; the first run computes each CCD code once, the "
        "rerun reads them from the `conformers` table):",
        "",
        _conformer_table(conformer_runs),
    ]
    table = "\n".join(lines)
    print(table)
    if args.record:
        section = (
            f"### Run of {stamp.header()}\n\n`python3 benchmarks/precompute.py --record --extra-sequences "
            f"{args.extra_sequences}`: jackhmmer + hhblits + nhmmer + hhsearch on the small test databases; "
            f"the sample structures + {args.extra_sequences} UniProt sequences. With 2 workers the wall time "
            f"is compared with tool time / 2.\n\n{table}\n"
        )
        conformer_rows = [
            Row("precompute", f"conformers-{run['run']}", f"{run['targets']} targets", metric, run[metric])
            for run in conformer_runs
            for metric in ("conformer_ms_per_target", "computed", "cached")
        ]
        record(
            stamp, _csv_rows(runs) + conformer_rows, "precompute", section, "Precompute: tool time vs pipeline overhead"
        )


def _overhead_s(run: dict) -> float:
    """Wall time not spent in the tools (their summed time shared among the workers)."""
    return run["wall_s"] - run["tool_s"] / run["workers"]


def _csv_rows(runs: list[dict]) -> list[Row]:
    rows = []
    for run in runs:
        variant = f"{run['workers']} worker{'s' if run['workers'] > 1 else ''}"
        shape = f"{run['targets']} targets, {run['searched']} sequences searched"
        for metric, value in (
            ("wall s", run["wall_s"]),
            ("tool s", run["tool_s"]),
            ("featurize s", run["featurize_s"]),
            ("LMDB write s", run["write_s"]),
            ("overhead s", _overhead_s(run)),
            ("overhead % of tool time", 100 * _overhead_s(run) / run["tool_s"]),
            ("Ray start-up s", run["ray_startup_s"]),
        ):
            rows.append(Row("precompute", variant, shape, metric, value))
    return rows


if __name__ == "__main__":
    main()
