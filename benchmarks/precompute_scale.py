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
  of targets shows as rising quarters. The driver's RSS is split by kind: anonymous (its heap: what
  a leak grows), pages of the cache's LMDB files it has mapped (clean, read-only: the kernel drops
  them under pressure), and Ray's shared memory (its object store);
- the run's last steps, clustering the whole cache and writing the manifest, get their own table:
  the driver's peaks by kind, and the Python heap's peak above its level when clustering started
  (tracemalloc);
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
import tracemalloc
from contextlib import contextmanager
from dataclasses import dataclass, field
from unittest import mock

import ray
import psutil  # noqa: E402  (the copy Ray vendors in ray/thirdparty_files is importable once ray is)

from featurecache.io.common import read_bytes
from featurecache.precompute import pipeline
from featurecache.precompute.pipeline import PrecomputeOptions, precompute
from featurecache.store.writer import StoreWriter

AMINO_ACIDS = "ACDEFGHIKLMNPQRSTVWY"
MIN_QUERY_LENGTH = 100  # the 40-residue peptides have 760 single mutants only and a 2-row MSA
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
    driver_mib: float  # RSS: anonymous, file-backed (libraries, LMDB) and shared memory together
    driver_anon_mib: float  # anonymous pages: the Python heap and native allocations (what a leak grows)
    driver_lmdb_mib: float  # file-backed pages of the cache's LMDB maps (clean, read-only: the kernel drops them)
    driver_shm_mib: float  # shared memory: Ray's object store as the driver maps it
    worker_peak_mib: float  # the largest single worker
    workers_mib: float  # all workers together
    services_mib: float  # raylet, GCS and Ray's other helpers (and MMseqs2 while it clusters)
    cache_mib: float  # on disk (allocated blocks)
    phase: str  # "featurize" (everything before the last step), "clustering", "manifest"


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

    def mark(self, phase: str) -> None:
        """A sample that ends the current phase, then `phase` starts (the thread samples it on)."""
        self.samples.append(self._sample())
        self.phase = phase

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
        status = proc_status_kib()
        return Sample(
            time.perf_counter() - self._started,
            status["VmRSS"] / 1024,
            status["RssAnon"] / 1024,
            mapped_mib(".lmdb"),
            status["RssShmem"] / 1024,
            max(workers, default=0.0),
            sum(workers),
            sum(services),
            disk_mib(self.cache),
            self.phase,
        )


def proc_status_kib() -> dict[str, int]:
    """This process's memory lines of /proc/self/status (VmRSS, RssAnon, RssFile, RssShmem), in KiB."""
    values = {}
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name.startswith(("Vm", "Rss")):
            values[name] = int(rest.split()[0])
    return values


def mapped_mib(suffix: str) -> float:
    """Resident pages of this process's mappings of files whose name ends with `suffix` (smaps)."""
    total_kib, current = 0, False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            if line[0] in "0123456789abcdef" and "-" in line.split(" ", 1)[0]:
                current = line.rstrip().endswith(suffix)
            elif current and line.startswith("Rss:"):
                total_kib += int(line.split()[1])
    return total_kib / 1024


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
    return [max(values[start : start + size], default=0.0) for start in range(0, size * 4, size)][:4]


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
    heap_peaks: dict[str, float] = {}
    with Sampler(cache) as sampler, _marking_last_steps(sampler, heap_peaks):
        summary = precompute(
            PrecomputeOptions(inputs=[inputs], cache_dir=cache, alignments_dir=alignments, progress=False)
        )
    wall = time.perf_counter() - started
    ray.shutdown()
    stats_s = _timed_cli("stats", cache)
    verify_s = _timed_cli("verify", cache)
    samples = sampler.samples
    done = summary.stages["featurize"].done
    return {
        "targets": count,
        "chains": chains,
        "done": done,
        "failed": summary.failed,
        "workers": workers,
        "wall_s": wall,
        "targets_per_s": done / wall,
        "targets_per_core_s": done / wall / workers,
        "featurize_core_s_per_target": summary.featurize_seconds / max(1, done),
        "write_s": summary.write_seconds,
        "cluster_s": summary.cluster_seconds,
        "cache_mib": disk_mib(cache),
        "mib_per_target": disk_mib(cache) / max(1, done),
        "driver_quarters": quarters(samples, "driver_mib"),
        "driver_anon_quarters": quarters(samples, "driver_anon_mib"),
        "driver_lmdb_quarters": quarters(samples, "driver_lmdb_mib"),
        "driver_shm_quarters": quarters(samples, "driver_shm_mib"),
        "worker_quarters": quarters(samples, "worker_peak_mib"),
        "workers_sum_peak": max((s.workers_mib for s in samples), default=0.0),
        "services_peak": max((s.services_mib for s in samples), default=0.0),
        "last_steps": last_step_peaks(samples, heap_peaks),
        "stats_s": stats_s,
        "verify_s": verify_s,
        "samples": len(samples),
        "load": os.getloadavg()[0],
    }


LAST_STEPS = ("clustering", "manifest")


@contextmanager
def _marking_last_steps(sampler: Sampler, heap_peaks: dict[str, float]):
    """Tell the sampler when the run's last steps start: clustering the whole cache
    (PipelineRun.sampling_tables), then writing the manifest (StoreWriter.finish). Over them,
    tracemalloc measures the Python heap's peak in each step, above its level when clustering
    started (MiB into `heap_peaks`); samples are taken at each step's start and end too."""
    original_tables, original_finish = pipeline.PipelineRun.sampling_tables, StoreWriter.finish

    def tables(run):
        sampler.mark("clustering")
        tracemalloc.start()
        try:
            return original_tables(run)
        finally:
            heap_peaks["clustering"] = tracemalloc.get_traced_memory()[1] / MiB

    def finish(writer, *args, **kwargs):
        sampler.mark("manifest")
        tracemalloc.reset_peak()
        try:
            return original_finish(writer, *args, **kwargs)
        finally:
            heap_peaks["manifest"] = tracemalloc.get_traced_memory()[1] / MiB
            sampler.mark("done")
            tracemalloc.stop()

    with (
        mock.patch.object(pipeline.PipelineRun, "sampling_tables", tables),
        mock.patch.object(StoreWriter, "finish", finish),
    ):
        yield


def last_step_peaks(samples: list[Sample], heap_peaks: dict[str, float]) -> dict[str, dict[str, float]]:
    """Per last step: the peaks of the driver's RSS and of its three kinds, and of its Python heap."""
    peaks = {}
    for step in LAST_STEPS:
        chosen = [sample for sample in samples if sample.phase == step]
        peaks[step] = {
            name: max((getattr(sample, name) for sample in chosen), default=0.0)
            for name in ("driver_mib", "driver_anon_mib", "driver_lmdb_mib", "driver_shm_mib")
        }
        peaks[step]["python_heap_mib"] = heap_peaks.get(step, 0.0)
    return peaks


def _timed_cli(command: str, cache: pathlib.Path) -> float:
    started = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "featurecache.cli", command, str(cache)], capture_output=True, text=True
    )
    seconds = time.perf_counter() - started
    if result.returncode != 0:
        raise RuntimeError(
            f"featurecache {command} {cache} exited {result.returncode}: {result.stdout[-500:]}{result.stderr[-500:]}"
        )
    return seconds


# --- the table and the extrapolation ----------------------------------------------------------------


def table(runs: list[dict]) -> str:
    lines = [
        "| targets (chains) | failed | wall s | targets/s | targets/s per core | featurize core-s / target | "
        "MiB / target | cache MiB | driver RSS MiB by quarter | driver anonymous MiB by quarter | "
        "driver LMDB-mapped MiB by quarter | driver Ray shared memory MiB by quarter | "
        "largest worker RSS MiB by quarter | all workers peak MiB | Ray services peak MiB | clustering s | "
        "stats s | verify s |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- | --- | --- | --- | ---: | ---: "
        "| ---: | ---: | ---: |",
    ]
    for run in runs:
        lines.append(
            f"| {run['done']} ({run['chains']}) | {run['failed']} | {run['wall_s']:.0f} | {run['targets_per_s']:.2f} | "
            f"{run['targets_per_core_s']:.2f} | {run['featurize_core_s_per_target']:.3f} | {run['mib_per_target']:.3f} | "
            f"{run['cache_mib']:.0f} | {_quarters(run['driver_quarters'])} | "
            f"{_quarters(run['driver_anon_quarters'])} | {_quarters(run['driver_lmdb_quarters'])} | "
            f"{_quarters(run['driver_shm_quarters'])} | {_quarters(run['worker_quarters'])} | "
            f"{run['workers_sum_peak']:.0f} | "
            f"{run['services_peak']:.0f} | {run['cluster_s']:.0f} | {run['stats_s']:.1f} | {run['verify_s']:.1f} |"
        )
    return "\n".join(lines) + "\n\n" + last_steps_table(runs)


def _quarters(values: list[float]) -> str:
    return " / ".join(f"{value:.0f}" for value in values)


def last_steps_table(runs: list[dict]) -> str:
    """The driver's memory in the run's last steps, by kind: only anonymous memory and the Python
    heap are the driver's own; LMDB pages are the file's, clean, and the kernel drops them when
    it needs the memory; Ray's shared memory is its object store's."""
    lines = [
        "| targets | last step | driver RSS peak MiB | anonymous MiB | LMDB-mapped MiB | Ray shared memory MiB | "
        "Python heap peak MiB (above its level when clustering started) |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for run in runs:
        for step, peaks in run["last_steps"].items():
            lines.append(
                f"| {run['done']} | {step} | {peaks['driver_mib']:.0f} | {peaks['driver_anon_mib']:.0f} | "
                f"{peaks['driver_lmdb_mib']:.0f} | {peaks['driver_shm_mib']:.0f} | "
                f"{peaks['python_heap_mib']:.1f} |"
            )
    return "\n".join(lines)


def extrapolation(run: dict, search_s_per_chain: float | None) -> str:
    """Core-hours and disk for the 200k-entry PDB from one measured run."""
    core_s_per_target = 1.0 / run["targets_per_core_s"]
    featurize_hours = PDB_ENTRIES * core_s_per_target / 3600
    disk_gib = PDB_ENTRIES * run["mib_per_target"] / 1024
    text = (
        f"At the measured {run['targets_per_core_s']:.2f} targets/s per core (wall, pipeline included), "
        f"ingesting and featurizing {PDB_ENTRIES:,} entries takes **{featurize_hours:.0f} core-hours** "
        f"({featurize_hours / 64:.1f} h on 64 cores) and **{disk_gib:.0f} GiB** of LMDB at "
        f"{run['mib_per_target']:.3f} MiB per target."
    )
    if search_s_per_chain is not None:
        search_hours = PDB_ENTRIES * search_s_per_chain / 3600
        text += (
            f" Searching adds {search_s_per_chain:.2f} core-s per unique chain on the small test databases "
            f"(search-mode benchmark): {search_hours:.0f} core-hours for one unique chain per entry; real "
            "UniRef90 / BFD / MGnify searches cost minutes per chain, so the search figure is a floor and "
            "dominates at PDB scale."
        )
    return text


def search_seconds_per_chain(results_csv: pathlib.Path) -> float | None:
    """Latest 1-worker search-mode run: tool seconds / sequences searched (from its shape column)."""
    import csv

    if not results_csv.is_file():
        return None
    with open(results_csv, newline="") as handle:
        rows = [
            r
            for r in csv.DictReader(handle)
            if r["benchmark"] == "precompute" and r["variant"] == "1 worker" and r["metric"] == "tool s"
        ]
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
            command = (
                f"python3 benchmarks/precompute.py --scale --targets {count} --workers {args.workers} "
                f"--msa-rows {args.msa_rows} --record"
            )
            section = (
                f"### Run of {stamp.header()}, {count} targets\n\n`{command}`: ingest mode (no searches), "
                f"{run['workers']} local Ray workers, FASTA point mutants of the sample MSAs' queries "
                f"(alignments cut to {args.msa_rows} rows); machine shared with other jobs (1-min load "
                f"average {run['load']:.1f} at the end). Memory sampled every {SAMPLE_SECONDS:.0f} s "
                f'({run["samples"]} samples); "by quarter": the peak in each quarter of the run before its last '
                f"steps, clustering the whole cache (MMseqs2) and writing the manifest, which are in the wall "
                f"time and have their own table (RSS by kind from /proc/self/status and smaps, the Python heap "
                f"by tracemalloc).\n\n{text}\n"
            )
            record(
                stamp,
                _rows(run),
                "precompute_scale",
                section,
                "PDB-sized precompute: throughput, memory over time, LMDB growth",
            )
        # the inputs and cache of this size are not needed by the next
        subprocess.run(["rm", "-rf", str(work / f"inputs-{count}"), str(work / f"cache-{count}")], check=False)


def _rows(run: dict):
    from records import Row

    shape = f"{run['done']} targets"
    variant = f"ingest, {run['workers']} workers"
    metrics = {
        "wall s": run["wall_s"],
        "targets/s": run["targets_per_s"],
        "targets/s per core": run["targets_per_core_s"],
        "featurize core-s per target": run["featurize_core_s_per_target"],
        "MiB per target": run["mib_per_target"],
        "driver peak RSS MiB": max(run["driver_quarters"]),
        "driver RSS MiB, first quarter": run["driver_quarters"][0],
        "driver RSS MiB, last quarter": run["driver_quarters"][-1],
        "driver anonymous RSS MiB, first quarter": run["driver_anon_quarters"][0],
        "driver anonymous RSS MiB, last quarter": run["driver_anon_quarters"][-1],
        "worker peak RSS MiB": max(run["worker_quarters"]),
        "workers total peak RSS MiB": run["workers_sum_peak"],
        "stats s": run["stats_s"],
        "verify s": run["verify_s"],
        "clustering s": run["cluster_s"],
        "failed": run["failed"],
    }
    for step, peaks in run["last_steps"].items():
        metrics.update(
            {
                f"driver peak RSS MiB, {step}": peaks["driver_mib"],
                f"driver peak anonymous MiB, {step}": peaks["driver_anon_mib"],
                f"driver peak LMDB-mapped MiB, {step}": peaks["driver_lmdb_mib"],
                f"driver peak Python heap MiB, {step}": peaks["python_heap_mib"],
            }
        )
    return [Row("precompute_scale", variant, shape, metric, value) for metric, value in metrics.items()]
