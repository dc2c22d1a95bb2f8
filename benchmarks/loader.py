"""Per-sample cost of getting a training sample, for the same features stored three ways.

1. text: parse the mmCIF and its alignment files (A3M / HHR / m8) and featurize, every time
   (what an online data pipeline does);
2. npy.gz: one gzipped `np.save` pickle per example (MegaFold's cache layout) of the same arrays
   with the MSA dense ([msa, token] msa and deletion_matrix, as schema 2 stored it), loaded with
   `allow_pickle=True`;
3. featurecache: one LMDB lookup + msgpack/zstd decode (CacheDataset), the MSA stored once per
   entity and only the frames holding the drawn rows decoded.

Every path ends with the same crop (384 tokens) and MSA subsample (1,024 rows), so the numbers
differ only in how the features are stored and read. Reported: median milliseconds per sample
over all sample structures (several rounds, after a warm-up round), bytes per sample, and the
speed-up of featurecache against each. CPU only; run on the development machine:

    python3 benchmarks/loader.py [--rounds 5] [--record]

`--rounds 1` is the smallest run (a few seconds a target after the cache is built).
"""

from __future__ import annotations

import gzip
import os
import pathlib
import sys
import tempfile

import numpy as np
from harness import REPO, argument_parser, host_median_ms, run_stamp
from records import Row, record

from featurecache import CacheDataset
from featurecache.config import FeatureConfig, SampleConfig
from featurecache.features.featurize import featurize_from_files
from featurecache.io import AlignmentIndex, read_mmcif
from featurecache.features.msa import expand_msa
from featurecache.loader import crop_sample
from featurecache.precompute.pipeline import PrecomputeOptions, precompute
from featurecache.schema import FEATURES_TABLE, MSA_STORAGE

DATA = pathlib.Path(os.environ.get("FC_SHARED_DATA", REPO.parent / "shared" / "data"))
CROP_SIZE = 384
MSA_ROWS = 1024
STORED_MSA = {spec.name for spec in MSA_STORAGE}
WAYS = (("text", "text"), ("pickle", "npy.gz"), ("cache", "featurecache"))  # row key, variant name


def main() -> None:
    parser = argument_parser(__doc__)
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per sample (median reported)")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    stamp = run_stamp()

    work = pathlib.Path(tempfile.mkdtemp(prefix="fc-loader-bench-"))
    cache = work / "cache"
    precompute(
        PrecomputeOptions(
            inputs=[DATA / "structures"],
            cache_dir=cache,
            alignments_dir=DATA / "alignments",
            executor="inline",
            progress=False,
        )
    )
    # every way ends in the same crop: the dataset's, drawn from (seed, epoch 0, position)
    sample = SampleConfig(crop_size=CROP_SIZE, msa_rows_per_sample=MSA_ROWS, seed=0)
    dataset = CacheDataset(cache, sample)
    index = AlignmentIndex(DATA / "alignments")
    structure_files = {read_mmcif(path).id: path for path in sorted((DATA / "structures").iterdir())}
    config = FeatureConfig()

    rows = []
    for position, target_id in enumerate(dataset.ids):
        path = next(p for p in structure_files.values() if dataset.ids[position] in p.name.lower())

        # The same features as a gzipped np.save pickle (MegaFold's per-example file), MSA dense.
        arrays, meta = dataset.load_arrays(target_id)
        dense = {name: np.asarray(value) for name, value in arrays.items() if name not in STORED_MSA}
        dense["msa"], dense["deletion_matrix"] = expand_msa(arrays)
        pickle_path = work / f"{target_id}.npy.gz"
        with gzip.open(pickle_path, "wb") as handle:
            np.save(handle, {"arrays": dense, "meta": meta}, allow_pickle=True)

        found, _ = index.for_structure(read_mmcif(path))
        text_files = {str(path)} | {f for chain in found.values() for f in chain.msa_files + chain.hit_files}
        text_bytes = sum(pathlib.Path(f).stat().st_size for f in text_files)

        def from_text():
            features, _ = featurize_from_files(path, index, config)
            return crop_sample(target_id, features, sample, 0, position)

        def from_pickle():
            with gzip.open(pickle_path, "rb") as handle:
                loaded = np.load(handle, allow_pickle=True).item()
            return crop_sample(target_id, loaded["arrays"], sample, 0, position)

        def from_cache():
            return dataset[position]

        record_bytes = len(dataset.reader.get(FEATURES_TABLE, target_id))
        rows.append(
            {
                "target": target_id,
                "tokens": int(arrays["restype"].shape[0]),
                "msa_rows": int(arrays["msa_species"].shape[0]),
                "text_ms": host_median_ms(from_text, max(1, args.rounds // 2)),
                "pickle_ms": host_median_ms(from_pickle, args.rounds),
                "cache_ms": host_median_ms(from_cache, args.rounds),
                "text_bytes": text_bytes,
                "pickle_bytes": pickle_path.stat().st_size,
                "cache_bytes": record_bytes,
            }
        )
        print(f"measured {target_id}", file=sys.stderr)

    table = _format(rows)
    print(table)
    if args.record:
        section = (
            f"### Run of {stamp.header()}\n\n`python3 benchmarks/loader.py --record --rounds {args.rounds}`. "
            f"Crop {CROP_SIZE} tokens, {MSA_ROWS} MSA rows; median ms per sample; sizes per sample on disk "
            f"(text = mmCIF + the alignment files it uses).\n\n{table}\n"
        )
        record(stamp, _csv_rows(rows), "loader", section, "Loader: per-sample read + decode + crop")


def _totals(rows: list[dict]) -> dict:
    return {key: sum(row[key] for row in rows) for key in rows[0] if key.endswith(("_ms", "_bytes"))}


def _csv_rows(rows: list[dict]) -> list[Row]:
    """Per target and summed over all targets: ms and KiB of each way."""
    total = _totals(rows)
    out = []
    for shape, numbers in [*((row["target"], row) for row in rows), ("all targets", total)]:
        for key, variant in WAYS:
            out.append(Row("loader", variant, shape, "read ms", numbers[f"{key}_ms"]))
            out.append(Row("loader", variant, shape, "stored KiB", numbers[f"{key}_bytes"] / 1024))
    return out


def _format(rows: list[dict]) -> str:
    lines = [
        "| target | tokens | MSA rows | text ms | npy.gz ms | featurecache ms | vs text | vs npy.gz | "
        "text KiB | npy.gz KiB | featurecache KiB |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        lines.append(
            f"| {row['target']} | {row['tokens']} | {row['msa_rows']} | {row['text_ms']:.1f} | {row['pickle_ms']:.1f} | "
            f"{row['cache_ms']:.2f} | {row['text_ms'] / row['cache_ms']:.0f}x | {row['pickle_ms'] / row['cache_ms']:.1f}x | "
            f"{row['text_bytes'] / 1024:.0f} | {row['pickle_bytes'] / 1024:.0f} | {row['cache_bytes'] / 1024:.0f} |"
        )
    total = _totals(rows)
    lines.append(
        f"| **all** | | | {total['text_ms']:.1f} | {total['pickle_ms']:.1f} | {total['cache_ms']:.2f} | "
        f"**{total['text_ms'] / total['cache_ms']:.0f}x** | **{total['pickle_ms'] / total['cache_ms']:.1f}x** | "
        f"{total['text_bytes'] / 1024:.0f} | {total['pickle_bytes'] / 1024:.0f} | {total['cache_bytes'] / 1024:.0f} |"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
