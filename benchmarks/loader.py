"""Per-sample cost of getting a training sample, for the same features stored three ways.

1. text: parse the mmCIF and its alignment files (A3M / HHR / m8) and featurize, every time
   (what an online data pipeline does);
2. npy.gz: one gzipped `np.save` pickle per example (MegaFold's cache layout), loaded with
   `allow_pickle=True`;
3. featurecache: one LMDB lookup + msgpack/zstd decode (CacheDataset).

Every path ends with the same crop (384 tokens) and MSA subsample (1,024 rows), so the numbers
differ only in how the features are stored and read. Reported: median milliseconds per sample
over all sample structures (several rounds, after a warm-up round), bytes per sample, and the
speed-up of featurecache against each. CPU only; run on the development machine:

    python3 benchmarks/loader.py [--rounds 5] [--record]
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import pathlib
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from featurecache import CacheDataset
from featurecache.config import FeatureConfig
from featurecache.features.featurize import featurize_from_files
from featurecache.io.alignments import AlignmentIndex
from featurecache.io.mmcif import read_mmcif
from featurecache.precompute.pipeline import PrecomputeOptions, precompute

REPO = pathlib.Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data"
CROP_SIZE = 384
MSA_ROWS = 1024


def _median_ms(function, rounds: int) -> float:
    function()  # warm-up: imports, page cache, allocator
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        function()
        samples.append((time.perf_counter() - started) * 1e3)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per sample (median reported)")
    parser.add_argument("--record", action="store_true", help="append the table to benchmarks/RESULTS.md")
    args = parser.parse_args()

    work = pathlib.Path(tempfile.mkdtemp(prefix="fc-loader-bench-"))
    cache = work / "cache"
    precompute(PrecomputeOptions(inputs=[DATA / "structures"], cache_dir=cache, alignments_dir=DATA / "alignments",
                                 executor="inline", progress=False))
    dataset = CacheDataset(cache, crop_size=CROP_SIZE, max_msa_rows=MSA_ROWS, seed=0)
    index = AlignmentIndex(DATA / "alignments")
    structure_files = {read_mmcif(path).id: path for path in sorted((DATA / "structures").iterdir())}
    config = FeatureConfig()

    rows = []
    for position, target_id in enumerate(dataset.ids):
        rng_seed = [0, 0, position]
        path = next(p for p in structure_files.values() if dataset.ids[position] in p.name.lower())

        # The same features as a gzipped np.save pickle (MegaFold's per-example file).
        arrays, meta = dataset.load_arrays(target_id)
        pickle_path = work / f"{target_id}.npy.gz"
        with gzip.open(pickle_path, "wb") as handle:
            np.save(handle, {"arrays": dict(arrays), "meta": meta}, allow_pickle=True)

        found, _ = index.for_structure(read_mmcif(path))
        text_files = {str(path)} | {f for chain in found.values() for f in chain.msa_files + chain.hit_files}
        text_bytes = sum(pathlib.Path(f).stat().st_size for f in text_files)

        def from_text():
            features, _ = featurize_from_files(path, index, config)
            return dataset.crop_sample(target_id, features, np.random.default_rng(rng_seed))

        def from_pickle():
            with gzip.open(pickle_path, "rb") as handle:
                loaded = np.load(handle, allow_pickle=True).item()
            return dataset.crop_sample(target_id, loaded["arrays"], np.random.default_rng(rng_seed))

        def from_cache():
            return dataset[position]

        record_bytes = len(dataset.reader.get("features", target_id))
        rows.append({
            "target": target_id,
            "tokens": int(arrays["restype"].shape[0]),
            "msa_rows": int(arrays["msa"].shape[0]),
            "text_ms": _median_ms(from_text, max(1, args.rounds // 2)),
            "pickle_ms": _median_ms(from_pickle, args.rounds),
            "cache_ms": _median_ms(from_cache, args.rounds),
            "text_bytes": text_bytes,
            "pickle_bytes": pickle_path.stat().st_size,
            "cache_bytes": record_bytes,
        })
        print(f"measured {target_id}", file=sys.stderr)

    table = _format(rows)
    print(table)
    if args.record:
        _record(table)


def _format(rows: list[dict]) -> str:
    lines = [
        f"| target | tokens | MSA rows | text ms | npy.gz ms | featurecache ms | vs text | vs npy.gz | "
        f"text KiB | npy.gz KiB | featurecache KiB |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        lines.append(
            f"| {row['target']} | {row['tokens']} | {row['msa_rows']} | {row['text_ms']:.1f} | {row['pickle_ms']:.1f} | "
            f"{row['cache_ms']:.2f} | {row['text_ms'] / row['cache_ms']:.0f}x | {row['pickle_ms'] / row['cache_ms']:.1f}x | "
            f"{row['text_bytes'] / 1024:.0f} | {row['pickle_bytes'] / 1024:.0f} | {row['cache_bytes'] / 1024:.0f} |"
        )
    total = {key: sum(row[key] for row in rows) for key in rows[0] if key.endswith(("_ms", "_bytes"))}
    lines.append(
        f"| **all** | | | {total['text_ms']:.1f} | {total['pickle_ms']:.1f} | {total['cache_ms']:.2f} | "
        f"**{total['text_ms'] / total['cache_ms']:.0f}x** | **{total['pickle_ms'] / total['cache_ms']:.1f}x** | "
        f"{total['text_bytes'] / 1024:.0f} | {total['pickle_bytes'] / 1024:.0f} | {total['cache_bytes'] / 1024:.0f} |"
    )
    return "\n".join(lines)


def _record(table: str) -> None:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    header = (
        f"\n## Loader: per-sample read + decode + crop ({datetime.date.today().isoformat()})\n\n"
        f"`python3 benchmarks/loader.py --record` on the development machine ({platform.processor() or platform.machine()}, "
        f"2 cores, CPU only), commit {commit}. Crop {CROP_SIZE} tokens, {MSA_ROWS} MSA rows; median ms per sample; "
        f"sizes per sample on disk (text = mmCIF + the alignment files it uses).\n\n"
    )
    results = REPO / "benchmarks" / "RESULTS.md"
    with open(results, "a") as handle:
        if results.stat().st_size == 0:
            handle.write("# Benchmark results\n")
        handle.write(header + table + "\n")


if __name__ == "__main__":
    main()
