"""PDB-sized precompute (`benchmarks/precompute.py --scale`): throughput, memory over time, LMDB growth.

Builds N distinct targets from the sample data and runs ingest-mode precompute (`--alignments`,
no searches) over them on a local Ray, into a fresh cache per N:

- targets: FASTA files, each one protein chain (every third a homodimer: two copies) whose
  sequence is a sample MSA's query with 1-3 point mutations drawn from a seeded generator (every
  sequence distinct, >= 95% identical to its query, so the alignments folder's sequence matching
  ingests that query's MSA for it, and every target stores its own MSA record);
- alignments: the sample per-chain A3M files of alignments/pdb (the 100+ residue queries), cut to
  their first `--msa-rows` rows so the per-target cost is that of a typical PDB chain's MSA, not of
  the deepest sample one (said in the recorded section);
- while precompute runs, a sampler thread reads every few seconds the RSS of the driver (this
  process), of each Ray worker (peak of any one, and their sum) and of Ray's own services, and the
  cache's size on disk; the memory is reported per quarter of the run, so growth with the number
  of targets shows as rising quarters;
- after it, `featurecache stats` and `featurecache verify` on the finished cache, timed as
  subprocesses (what a user runs).

The extrapolation to the PDB uses the measured featurize throughput per core and the search cost
per unique chain of the search-mode benchmark (benchmarks/results.csv: "tool s" over "sequences
searched" on the small test databases; real databases are far larger, so that part is a floor).
"""

from __future__ import annotations

import os
import pathlib
import random
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from unittest import mock

import ray
import psutil  # noqa: E402  (the copy Ray vendors in ray/thirdparty_files is importable once ray is)

from featurecache.io.common import read_bytes
from featurecache.precompute import pipeline
from featurecache.precompute.pipeline import PrecomputeOptions, precompute

AMINO_ACIDS = "ACDEFGHIKLMNPQRSTVWY"
MIN_QUERY_LENGTH = 100   # the 40-residue peptides have 760 single mutants only and a 2-row MSA
SAMPLE_SECONDS = 2.0
PDB_ENTRIES = 200_000
MiB = 1024 * 1024


# --- inputs ---------------------------------------------------------------------------------------


def sample_queries(alignments: pathlib.Path) -> dict[str, str]:
    """Query sequence -> A3M file, for each distinct protein query of the sample alignments."""
    queries: dict[str, str] = {}
    for path in sorted(alignments.glob("*_protein.a3m*")):
        lines = read_bytes(path).decode().splitlines()
        query = "".join(c for c in lines[1] if c.isupper())
        if len(query) >= MIN_QUERY_LENGTH:
            queries.setdefault(query, str(path))
    return queries


def write_alignments(queries: dict[str, str], folder: pathlib.Path, rows: int) -> None:
    """Each query's A3M, its first `rows` rows (query included)."""
    folder.mkdir(parents=True)
    for number, path in enumerate(queries.values()):
        lines = read_bytes(pathlib.Path(path)).decode().splitlines()
        kept, count = [], 0
        for line in lines:
            if line.startswith(">"):
                count += 1
                if count > rows:
                    break
            kept.append(line)
        (folder / f"query{number}_protein.a3m").write_text("\n".join(kept) + "\n")


def write_targets(queries: list[str], folder: pathlib.Path, count: int, seed: int = 0) -> int:
    """`count` FASTA targets of distinct point mutants of `queries`; returns the number of chains."""
    folder.mkdir(parents=True)
    seen: set[str] = set()
    chains = 0
    for number in range(count):
        query = queries[number % len(queries)]
        rng = random.Random(f"{seed}-{number}")
        while True:
            residues = list(query)
            for position in rng.sample(range(len(query)), rng.randint(1, 3)):
                residues[position] = rng.choice(AMINO_ACIDS.replace(query[position], ""))
            sequence = "".join(residues)
            if sequence not in seen:
                break
        seen.add(sequence)
        copies = 2 if number % 3 == 0 else 1
        records = "".join(f">chain{copy} mol:protein\n{sequence}\n" for copy in range(copies))
        (folder / f"scale{number:06d}.fasta").write_text(records)
        chains += copies
    return chains


# --- sampling ---------------------------------------------------------------------------------------


@dataclass
class Sample:
    seconds: float
    driver_mib: float
    driver_anon_mib: float  # without file-backed pages (LMDB's memory map, libraries): the heap
    worker_peak_mib: float  # the largest single worker
    workers_mib: float      # all workers together
    services_mib: float     # raylet, GCS and Ray's other helpers
    cache_mib: float        # on disk (allocated blocks)
    phase: str              # "featurize" (everything before clustering), then "clustering"


@dataclass
class Sampler:
    """Samples memory and cache size every SAMPLE_SECONDS in a thread, until stopped."""

    cache: pathlib.Path
    samples: list[Sample] = field(default_factory=list)
    phase: str = "featurize"
    _stop: threading.Event = field(default_factory=threading.Event)

    def __enter__(self):
        self._started = time.perf_counter()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.samples.append(self._sample())
            self._stop.wait(SAMPLE_SECONDS)

    def _sample(self) -> Sample:
        driver = psutil.Process()
        workers, services = [], []
        for process in driver.children(recursive=True):
            try:
                name = " ".join(process.cmdline()[:2])
                rss = process.memory_info().rss / MiB
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            (workers if "ray::" in name or "default_worker.py" in name else services).append(rss)
        memory = driver.memory_info()
        return Sample(time.perf_counter() - self._started, memory.rss / MiB, (memory.rss - memory.shared) / MiB,
                      max(workers, default=0.0), sum(workers), sum(services), disk_mib(self.cache), self.phase)


def disk_mib(folder: pathlib.Path) -> float:
    total = 0
    for path in folder.rglob("*"):
        try:
            total += path.stat().st_blocks * 512
        except OSError:
            pass  # a lock file that went away
    return total / MiB


def quarters(samples: list[Sample], field_name: str) -> list[float]:
    """The peak of `field_name` in each quarter of the featurize phase (by sample order)."""
    values = [getattr(sample, field_name) for sample in samples if sample.phase == "featurize"]
    size = max(1, len(values) // 4)
    return [max(values[start:start + size], default=0.0) for start in range(0, size * 4, size)][:4]


# --- one run ------------------------------------------------------------------------------------------


def run_scale(count: int, work: pathlib.Path, workers: int, msa_rows: int, data: pathlib.Path) -> dict:
    queries = sample_queries(data / "alignments" / "pdb")
    alignments = work / "alignments"
    if not alignments.is_dir():
        write_alignments(queries, alignments, msa_rows)
    inputs = work / f"inputs-{count}"
    chains = write_targets(list(queries), inputs, count)
    cache = work / f"cache-{count}"
    ray.shutdown()
    ray.init(num_cpus=workers, include_dashboard=False, logging_level="WARNING", log_to_driver=False)
    started = time.perf_counter()
    with Sampler(cache) as sampler, _marking_clustering(sampler):
        summary = precompute(PrecomputeOptions(inputs=[inputs], cache_dir=cache, alignments_dir=alignments,
                                               progress=False))
    wall = time.perf_counter() - started
    ray.shutdown()
    stats_s = _timed_cli("stats", cache)
    verify_s = _timed_cli("verify", cache)
    samples = sampler.samples
    done = summary.stages["featurize"].done
    return {
        "targets": count, "chains": chains, "done": done, "failed": summary.failed, "workers": workers,
        "wall_s": wall, "targets_per_s": done / wall, "targets_per_core_s": done / wall / workers,
        "featurize_core_s_per_target": summary.featurize_seconds / max(1, done),
        "write_s": summary.write_seconds, "cluster_s": summary.cluster_seconds,
        "cache_mib": disk_mib(cache), "mib_per_target": disk_mib(cache) / max(1, done),
        "driver_quarters": quarters(samples, "driver_mib"),
        "driver_anon_quarters": quarters(samples, "driver_anon_mib"),
        "worker_quarters": quarters(samples, "worker_peak_mib"),
        "workers_sum_peak": max((s.workers_mib for s in samples), default=0.0),
        "services_peak": max((s.services_mib for s in samples), default=0.0),
        "driver_clustering_peak": max((s.driver_mib for s in samples if s.phase == "clustering"), default=0.0),
        "stats_s": stats_s, "verify_s": verify_s, "samples": len(samples),
        "load": os.getloadavg()[0],
    }


@contextmanager
def _marking_clustering(sampler: Sampler):
    """Tell the sampler when the run's last step (clustering the whole cache) starts."""
    original = pipeline.PipelineRun.sampling_tables

    def marked(run):
        sampler.phase = "clustering"
        return original(run)

    with mock.patch.object(pipeline.PipelineRun, "sampling_tables", marked):
        yield


def _timed_cli(command: str, cache: pathlib.Path) -> float:
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "featurecache.cli", command, str(cache)], capture_output=True,
                            text=True)
    seconds = time.perf_counter() - started
    if result.returncode != 0:
        raise RuntimeError(f"featurecache {command} {cache} exited {result.returncode}: {result.stdout[-500:]}"
                           f"{result.stderr[-500:]}")
    return seconds


# --- the table and the extrapolation ----------------------------------------------------------------


def table(runs: list[dict]) -> str:
    lines = ["| targets (chains) | failed | wall s | targets/s | targets/s per core | featurize core-s / target | "
             "MiB / target | cache MiB | driver RSS MiB by quarter | driver anonymous RSS MiB by quarter | "
             "driver RSS MiB clustering | "
             "largest worker RSS MiB by quarter | all workers peak MiB | Ray services peak MiB | clustering s | "
             "stats s | verify s |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- | ---: | --- | ---: | ---: | ---: | ---: "
             "| ---: |"]
    for run in runs:
        lines.append(
            f"| {run['done']} ({run['chains']}) | {run['failed']} | {run['wall_s']:.0f} | {run['targets_per_s']:.2f} | "
            f"{run['targets_per_core_s']:.2f} | {run['featurize_core_s_per_target']:.3f} | {run['mib_per_target']:.3f} | "
            f"{run['cache_mib']:.0f} | {' / '.join(f'{v:.0f}' for v in run['driver_quarters'])} | "
            f"{' / '.join(f'{v:.0f}' for v in run['driver_anon_quarters'])} | {run['driver_clustering_peak']:.0f} | "
            f"{' / '.join(f'{v:.0f}' for v in run['worker_quarters'])} | {run['workers_sum_peak']:.0f} | "
            f"{run['services_peak']:.0f} | {run['cluster_s']:.0f} | {run['stats_s']:.1f} | {run['verify_s']:.1f} |")
    return "\n".join(lines)


def extrapolation(run: dict, search_s_per_chain: float | None) -> str:
    """Core-hours and disk for the 200k-entry PDB from one measured run."""
    core_s_per_target = 1.0 / run["targets_per_core_s"]
    featurize_hours = PDB_ENTRIES * core_s_per_target / 3600
    disk_gib = PDB_ENTRIES * run["mib_per_target"] / 1024
    text = (f"At the measured {run['targets_per_core_s']:.2f} targets/s per core (wall, pipeline included), "
            f"ingesting and featurizing {PDB_ENTRIES:,} entries takes **{featurize_hours:.0f} core-hours** "
            f"({featurize_hours / 64:.1f} h on 64 cores) and **{disk_gib:.0f} GiB** of LMDB at "
            f"{run['mib_per_target']:.3f} MiB per target.")
    if search_s_per_chain is not None:
        search_hours = PDB_ENTRIES * search_s_per_chain / 3600
        text += (f" Searching adds {search_s_per_chain:.2f} core-s per unique chain on the small test databases "
                 f"(search-mode benchmark): {search_hours:.0f} core-hours for one unique chain per entry; real "
                 "UniRef90 / BFD / MGnify searches cost minutes per chain, so the search figure is a floor and "
                 "dominates at PDB scale.")
    return text


def search_seconds_per_chain(results_csv: pathlib.Path) -> float | None:
    """Latest 1-worker search-mode run: tool seconds / sequences searched (from its shape column)."""
    import csv

    if not results_csv.is_file():
        return None
    with open(results_csv, newline="") as handle:
        rows = [r for r in csv.DictReader(handle)
                if r["benchmark"] == "precompute" and r["variant"] == "1 worker" and r["metric"] == "tool s"]
    if not rows:
        return None
    latest = rows[-1]
    searched = int(latest["shape"].split(", ")[1].split()[0])
    return float(latest["value"]) / searched


# --- the command ---------------------------------------------------------------------------------------


def scale_main(args, stamp, data: pathlib.Path, results_csv: pathlib.Path) -> None:
    """`precompute.py --scale`: one run per --targets size, each printed (and recorded) when done."""
    from records import record

    work = pathlib.Path(tempfile.mkdtemp(prefix="fc-precompute-scale-"))
    search_s = search_seconds_per_chain(results_csv)
    for count in args.targets:
        run = run_scale(count, work, args.workers, args.msa_rows, data)
        text = table([run]) + "\n\n" + extrapolation(run, search_s)
        print(text, flush=True)
        if args.record:
            command = (f"python3 benchmarks/precompute.py --scale --targets {count} --workers {args.workers} "
                       f"--msa-rows {args.msa_rows} --record")
            section = (f"### Run of {stamp.header()}, {count} targets\n\n`{command}`: ingest mode (no searches), "
                       f"{run['workers']} local Ray workers, FASTA point mutants of the sample MSAs' queries "
                       f"(alignments cut to {args.msa_rows} rows); machine shared with other jobs (1-min load "
                       f"average {run['load']:.1f} at the end). Memory sampled every {SAMPLE_SECONDS:.0f} s "
                       f"({run['samples']} samples); \"by quarter\": the peak in each quarter of the run before its last "
                       f"step, clustering the whole cache (MMseqs2), which is in the wall time and has its own "
                       f"columns.\n\n{text}\n")
            record(stamp, _rows(run), "precompute_scale", section,
                   "PDB-sized precompute: throughput, memory over time, LMDB growth")
        # the inputs and cache of this size are not needed by the next
        subprocess.run(["rm", "-rf", str(work / f"inputs-{count}"), str(work / f"cache-{count}")], check=False)


def _rows(run: dict):
    from records import Row

    shape = f"{run['done']} targets"
    variant = f"ingest, {run['workers']} workers"
    metrics = {"wall s": run["wall_s"], "targets/s": run["targets_per_s"],
               "targets/s per core": run["targets_per_core_s"],
               "featurize core-s per target": run["featurize_core_s_per_target"],
               "MiB per target": run["mib_per_target"], "driver peak RSS MiB": max(run["driver_quarters"]),
               "driver RSS MiB, first quarter": run["driver_quarters"][0],
               "driver RSS MiB, last quarter": run["driver_quarters"][-1],
               "driver peak RSS MiB, clustering": run["driver_clustering_peak"],
               "driver anonymous RSS MiB, first quarter": run["driver_anon_quarters"][0],
               "driver anonymous RSS MiB, last quarter": run["driver_anon_quarters"][-1],
               "worker peak RSS MiB": max(run["worker_quarters"]),
               "workers total peak RSS MiB": run["workers_sum_peak"], "stats s": run["stats_s"],
               "verify s": run["verify_s"], "clustering s": run["cluster_s"], "failed": run["failed"]}
    return [Row("precompute_scale", variant, shape, metric, value) for metric, value in metrics.items()]
