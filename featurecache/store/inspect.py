"""What is in a cache, as text: `featurecache stats` and `featurecache show`.

cache_stats gathers counts, sizes, token-count / MSA-depth / template distributions, warnings
and failures from the manifest and the records' headers (for feature records their header
entries, not the records), and what curation removed and the cluster-size and sampling-weight
distributions from the manifest's "sampling" and "excluded" tables; format_stats prints that
report and format_record one record's arrays and metadata. plot.py draws the report (`stats --plot`).
Only records and manifests are read: nothing here knows how features are computed.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np

from featurecache.schema import CONFORMERS_TABLE, CUT_SHORT, ERRORS_TABLE, FEATURES_TABLE, MSA_TABLE
from featurecache.store.codec import RowFrames, decode_record, read_header
from featurecache.store.manifest import EXCLUDED_TABLE, SAMPLING_TABLE, Manifest, read_manifest
from featurecache.store.reader import StoreReader
from featurecache.store.update_marker import read_update_marker

_PERCENTILES = (0, 10, 50, 90, 100)
_HITS_WITHOUT_STRUCTURE = "template_hits_without_coordinates"  # record metadata: hit names; index: count
_LISTED = 20  # warnings and failures listed in the text report (--json has them all)


def _distribution(values: list[int]) -> dict:
    if not values:
        return {"count": 0}
    data = np.asarray(values)
    return {
        "count": int(data.size),
        "mean": float(data.mean()),
        **{f"p{q}": float(np.percentile(data, q)) for q in _PERCENTILES},
    }


def _features_meta(reader: StoreReader, target_id: str) -> dict:
    """A feature record's metadata, from its header entry where it has one, not the record
    ({} if an update deleted the record since the manifest)."""
    header = reader.header(FEATURES_TABLE, target_id)
    return {} if header is None else header.meta


def _hits_without_structure(reader: StoreReader, targets: dict) -> dict:
    """Template hits whose structure the template folder lacked: counts per target, and totals."""
    per_target = {}
    for target_id, entry in sorted(targets.items()):
        count = entry.get(_HITS_WITHOUT_STRUCTURE)
        if count is None:  # a cache written before the index counted them: read the record
            count = len(_features_meta(reader, target_id).get(_HITS_WITHOUT_STRUCTURE) or [])
        if count:
            per_target[target_id] = count
    return {"hits": sum(per_target.values()), "targets": len(per_target), "per_target": per_target}


def cache_stats(cache_dir: Path) -> dict:
    """Everything `featurecache stats` shows, as plain JSON-able values."""
    manifest = read_manifest(cache_dir)
    update = read_update_marker(cache_dir)
    targets = manifest.targets
    failures = []
    with StoreReader(cache_dir, num_shards=manifest.num_shards) as reader:
        for key, blob in reader.items(ERRORS_TABLE):
            meta = read_header(blob, where=reader.where(ERRORS_TABLE, key), key=key).meta
            failures.append({key_: meta.get(key_) for key_ in ("stage", "key", "message", "attempts")})
        warnings = []
        for target_id, entry in targets.items():
            if entry.get("warnings"):
                meta = _features_meta(reader, target_id)
                warnings.extend(f"{target_id}: {warning}" for warning in meta.get("warnings", []))
        hits_without_structure = _hits_without_structure(reader, targets)
    return {
        "cache": str(cache_dir),
        "update": None if update is None else update.describe(),
        "generation": manifest.generation,
        "schema_version": manifest.schema_version,
        "updated": manifest.updated,
        "shards": len(manifest.shards),
        "bytes": sum(shard.size for shard in manifest.shards),
        "counts": dict(manifest.counts),
        # where the reference conformers' positions came from (chem.SOURCES), from their index entries
        "conformer_sources": dict(
            Counter(entry.get("source", "unknown") for entry in manifest.index.get(CONFORMERS_TABLE, {}).values())
        ),
        # why a conformer's positions are not RDKit's (chem.FALLBACK_REASONS); older entries name none
        "conformer_fallbacks": dict(
            Counter(
                entry["fallback"]
                for entry in manifest.index.get(CONFORMERS_TABLE, {}).values()
                if entry.get("fallback")
            )
        ),
        "num_tokens": _distribution([entry["num_tokens"] for entry in targets.values()]),
        "msa_depth": _distribution([entry["msa_depth"] for entry in targets.values()]),
        "num_templates": _distribution([entry.get("num_templates", 0) for entry in targets.values()]),
        "targets": {
            target_id: {
                name: entry.get(name)
                for name in ("num_tokens", "num_atoms", "msa_depth", "num_templates", "num_chains", "weight")
            }
            for target_id, entry in sorted(targets.items())
        },
        "curation": _curation_stats(manifest),
        "sampling": _sampling_stats(manifest),
        "warnings": warnings,
        # input files that ended mid-record (their partial record dropped, or the file refused)
        "files_cut_short": sum(CUT_SHORT in warning for warning in warnings),
        "template_hits_without_structure": hits_without_structure,
        "failures_by_stage": dict(Counter(failure["stage"] for failure in failures)),
        "failures": failures,
        "fingerprints": dict(manifest.fingerprints),
    }


def _curation_stats(manifest: Manifest) -> dict:
    """What curation removed (per reason, over the feature records) and the targets it left out."""
    removed: Counter = Counter()
    for entry in manifest.index.get(FEATURES_TABLE, {}).values():
        removed.update(entry.get("curation") or {})
    excluded = manifest.index.get(EXCLUDED_TABLE, {})
    return {
        "removed": dict(sorted(removed.items())),
        "excluded": dict(sorted(Counter(entry.get("reason") for entry in excluded.values()).items())),
        "excluded_targets": {target_id: entry.get("message") for target_id, entry in sorted(excluded.items())},
    }


def _sampling_stats(manifest: Manifest) -> dict | None:
    """Cluster sizes and AF3 sampling weights of chains and interfaces (None without clustering)."""
    table = manifest.index.get(SAMPLING_TABLE)
    if table is None:
        return None
    report = {"target_weight": _distribution([entry["weight"] for entry in table.values()])}
    mass: Counter = Counter()  # total weight per item kind: what share of samples each kind gets
    for kind in ("chains", "interfaces"):
        items = [item for entry in table.values() for item in entry[kind]]
        sizes = Counter(item["cluster"] for item in items)
        for item in items:
            mass["interface" if kind == "interfaces" else item["molecule_type"]] += item["weight"]
        report[kind] = {
            "items": len(items),
            "clusters": len(sizes),
            "cluster_size": _distribution(list(sizes.values())),
            "clusters_of_size": {str(size): count for size, count in sorted(Counter(sizes.values()).items())},
            "largest": [[cluster, size] for cluster, size in sizes.most_common(3)],
            "weight": _distribution([item["weight"] for item in items]),
        }
    report["weight_by_kind"] = dict(sorted(mass.items()))
    return report


def _format_distribution(name: str, dist: dict, digits: int = 0) -> str:
    if not dist.get("count"):
        return f"{name:<14} (none)"
    width = 7 + digits
    return (
        f"{name:<14} min {dist['p0']:>{width}.{digits}f}  median {dist['p50']:>{width}.{digits}f}  "
        f"p90 {dist['p90']:>{width}.{digits}f}  max {dist['p100']:>{width}.{digits}f}  "
        f"mean {dist['mean']:>{width + 1}.{max(digits, 1)}f}"
    )


def _format_curation(curation: dict) -> list[str]:
    removed = curation["removed"]
    excluded = curation["excluded"]
    line = (
        f"curation     removed {sum(removed.values())}"
        + (" (" + ", ".join(f"{reason} {count}" for reason, count in removed.items()) + ")" if removed else "")
        + f"; targets left out {sum(excluded.values())}"
        + (" (" + ", ".join(f"{reason} {count}" for reason, count in excluded.items()) + ")" if excluded else "")
    )
    return [line] + [
        f"  {target_id}: {message}" for target_id, message in list(curation["excluded_targets"].items())[:_LISTED]
    ]


def _format_sampling(sampling: dict | None) -> list[str]:
    if sampling is None:
        return ["sampling     no clusters (built with clustering off, or before clustering existed)"]
    chains, interfaces = sampling["chains"], sampling["interfaces"]
    share = sum(sampling["weight_by_kind"].values()) or 1.0
    return [
        f"sampling     chains {chains['items']} in {chains['clusters']} clusters, interfaces {interfaces['items']} "
        f"in {interfaces['clusters']} clusters; weight share "
        + ", ".join(f"{kind} {mass / share:.0%}" for kind, mass in sampling["weight_by_kind"].items()),
        _format_distribution("chain cluster", chains["cluster_size"]),
        _format_distribution("iface cluster", interfaces["cluster_size"]),
        _format_distribution("target weight", sampling["target_weight"], 2),
        _format_distribution("chain weight", chains["weight"], 3),
        _format_distribution("iface weight", interfaces["weight"], 3),
    ]


def _format_conformer_sources(sources: dict, fallbacks: dict) -> str:
    """'conformers   rdkit 40, ccd_ideal 2, ccd_model 0, none 1; fallbacks bond_lengths 2, embedding_failed 1'."""
    order = ("rdkit", "ccd_ideal", "ccd_model", "none")
    names = list(order) + sorted(set(sources) - set(order))
    line = "conformers   " + ", ".join(f"{name} {sources.get(name, 0)}" for name in names)
    if fallbacks:
        line += "; fallbacks " + ", ".join(f"{reason} {count}" for reason, count in sorted(fallbacks.items()))
    return line


def format_stats(report: dict) -> str:
    counts = report["counts"]
    lines = [
        f"cache        {report['cache']}" + (f" (generation {report['generation']})" if report["generation"] else ""),
        f"updated      {report['updated']}   schema v{report['schema_version']}   "
        f"{report['shards']} shards, {report['bytes'] / 2**20:.1f} MiB",
        *([f"note         {report['update']}"] if report["update"] else []),
        "records      "
        + "   ".join(
            f"{table} {counts.get(table, 0)}" for table in (FEATURES_TABLE, MSA_TABLE, CONFORMERS_TABLE, ERRORS_TABLE)
        ),
        _format_conformer_sources(report.get("conformer_sources", {}), report.get("conformer_fallbacks", {})),
        _format_distribution("tokens", report["num_tokens"]),
        _format_distribution("msa depth", report["msa_depth"]),
        _format_distribution("templates", report["num_templates"]),
        *_format_sampling(report["sampling"]),
        *_format_curation(report["curation"]),
        "",
        f"{'target':<28} {'tokens':>7} {'atoms':>7} {'chains':>6} {'msa':>7} {'tmpl':>5} {'weight':>8}",
    ]
    for target_id, info in report["targets"].items():
        weight = "-" if info["weight"] is None else f"{info['weight']:.3f}"
        lines.append(
            f"{target_id:<28} {info['num_tokens']:>7} {info['num_atoms'] or 0:>7} "
            f"{info['num_chains'] or 0:>6} {info['msa_depth']:>7} {info['num_templates'] or 0:>5} "
            f"{weight:>8}"
        )
    lines.append("")
    hits = report["template_hits_without_structure"]
    lines.append(f"warnings     {len(report['warnings']) + bool(hits['hits'])}")
    if report["files_cut_short"]:
        lines.append(
            f"  {report['files_cut_short']} about input files cut short (a partial record dropped or the file left out)"
        )
    if hits["hits"]:
        most = sorted(hits["per_target"].items(), key=lambda item: -item[1])[:5]
        lines.append(
            f"  {hits['hits']} template hits in {hits['targets']} targets have no structure in the "
            f"template folder (m8 hits against the whole PDB?): "
            + ", ".join(f"{target_id} {count}" for target_id, count in most)
            + (", ..." if hits["targets"] > len(most) else "")
        )
    for warning in report["warnings"][:_LISTED]:
        lines.append(f"  {warning}")
    by_stage = ", ".join(f"{stage} {count}" for stage, count in sorted(report["failures_by_stage"].items()))
    lines.append(f"failures     {len(report['failures'])}" + (f" ({by_stage})" if by_stage else ""))
    for failure in report["failures"][:_LISTED]:
        lines.append(f"  [{failure['stage']}] {failure['key']}: {failure['message']} (attempts {failure['attempts']})")
    return "\n".join(lines)


def _summarize_array(value: np.ndarray) -> str:
    if value.size == 0:
        return "(empty)"
    if value.dtype.kind == "b":
        return f"true {int(value.sum())}/{value.size}"
    if value.dtype.kind in "iuf":
        data = value.astype(np.float64)
        return f"min {data.min():.4g}  max {data.max():.4g}  mean {data.mean():.4g}"
    return ""


def format_record(cache_dir: Path, table: str, key: str) -> str:
    """`featurecache show`: one record's arrays and metadata."""
    manifest = read_manifest(cache_dir)
    with StoreReader(cache_dir, num_shards=manifest.num_shards) as reader:
        blob = reader.get(table, key)
        if blob is None:
            raise KeyError(f"{cache_dir}: no {table} record {key!r}")
        record = decode_record(blob, where=reader.where(table, key), key=key, lazy_rows=True)
    lines = [
        f"{table}/{key}   fingerprint {record.fingerprint}   schema v{record.schema_version}   "
        f"{len(blob) / 1024:.1f} KiB stored"
    ]
    for name, value in record.arrays.items():
        summary = _summarize_array(np.asarray(value))
        if isinstance(value, RowFrames):  # how a sample reads it: frames of a few rows
            summary += f"  (zstd frames of {value.rows_per_frame} rows)"
        lines.append(f"  {name:<28} {str(value.dtype):<8} {str(tuple(value.shape)):<18} {summary}")
    for name, value in record.meta.items():
        text = repr(value)
        lines.append(f"  meta.{name:<23} {text if len(text) < 100 else text[:97] + '...'}")
    return "\n".join(lines)
