"""The manifest tables a precompute run computes over the whole cache: "sampling" and "excluded".

During the run, `SamplingIndex` gathers each target's chains and interfaces (TargetChains: from
this run's feature results, and from the metadata of current records the run read anyway to
skip them) and each target curation left out. At the end, `tables` reads the chains of the
cache's other records (from their header entries, not the records: StoreWriter.header),
clusters every chain and interface of the cache (clustering.py) and
weighs them (weights.py). Feature records are never rewritten: adding targets re-clusters the
cache and changes only the manifest. Clustering is skipped when its inputs and settings are
those the last manifest was built from (fingerprints["sampling"]); its table is kept then.

The formats are documented in featurecache.store.manifest.
"""

from __future__ import annotations

import dataclasses
import logging

from featurecache.config import ClusteringConfig, fingerprint
from featurecache.precompute.clustering import TargetChains, cluster_chains
from featurecache.precompute.tasks import ExcludedTarget
from featurecache.precompute.tools import MmseqsCluster, ToolSettings
from featurecache.precompute.weights import sampling_table
from featurecache.schema import FEATURES_TABLE
from featurecache.store.manifest import EXCLUDED_TABLE, SAMPLING_TABLE, Manifest
from featurecache.store.writer import StoreWriter

log = logging.getLogger(__name__)


class SamplingIndex:
    """Collects clustering inputs and exclusions during a run; builds the tables at its end."""

    def __init__(
        self, config: ClusteringConfig, mmseqs: ToolSettings, tmp_dir: str | None, previous: Manifest | None
    ) -> None:
        self.config = config
        self.mmseqs = mmseqs
        self.tmp_dir = tmp_dir
        self.previous = previous
        self.targets: dict[str, TargetChains] = {}
        self.excluded: dict[str, dict] = {}  # target id -> "excluded" entry, decided in this run
        self.clustered = False  # whether tables() ran MMseqs2 (False: reused or nothing to do)

    def mmseqs_tool(self) -> MmseqsCluster:
        """The clustering tool; raises ToolError (ToolNotFoundError) when the binary is missing."""
        return MmseqsCluster(self.mmseqs, self.tmp_dir)

    def add(self, chains: TargetChains | None) -> None:
        if chains is not None:
            self.targets[chains.target_id] = chains
            self.excluded.pop(chains.target_id, None)

    def exclude(self, excluded: ExcludedTarget, feature_fingerprint: str) -> None:
        self.targets.pop(excluded.target_id, None)
        self.excluded[excluded.target_id] = {
            **excluded.exclusion.to_json(),
            "input_hash": excluded.input_hash,
            "fingerprint": feature_fingerprint,
        }

    def was_excluded(self, target_id: str, input_hash: str, feature_fingerprint: str) -> bool:
        """The last manifest lists the target as left out, for this input and these settings."""
        entry = self._previous_table(EXCLUDED_TABLE).get(target_id)
        return bool(entry) and entry.get("input_hash") == input_hash and entry.get("fingerprint") == feature_fingerprint

    def carry_excluded(self, target_id: str) -> None:
        """Keep the last manifest's exclusion of a target this run skipped."""
        self.excluded[target_id] = dict(self._previous_table(EXCLUDED_TABLE)[target_id])

    def tables(self, writer: StoreWriter) -> tuple[dict[str, dict], dict[str, str]]:
        """(derived index tables, fingerprints) for StoreWriter.finish. Raises ToolError if
        MMseqs2 fails."""
        feature_keys = set(writer.keys(FEATURES_TABLE))
        excluded = {
            target_id: entry
            for target_id, entry in self._previous_table(EXCLUDED_TABLE).items()
            if target_id not in feature_keys
        }
        excluded.update(self.excluded)
        tables = {EXCLUDED_TABLE: excluded}
        if not self.config.enabled:
            return tables, {}
        targets = self._all_targets(writer, feature_keys)
        inputs = fingerprint(
            "sampling",
            dataclasses.asdict(self.config),
            self.mmseqs_tool().identity(),
            [targets[target_id].to_json() for target_id in sorted(targets)],
        )
        previous = self._previous_table(SAMPLING_TABLE)
        if self.previous is not None and self.previous.fingerprints.get("sampling") == inputs and previous:
            tables[SAMPLING_TABLE] = previous
        else:
            ordered = [targets[target_id] for target_id in sorted(targets)]
            clusters = cluster_chains(ordered, self.config, self.mmseqs_tool())
            tables[SAMPLING_TABLE] = sampling_table(ordered, clusters, self.config)
            self.clustered = True
        return tables, {"sampling": inputs}

    def _all_targets(self, writer: StoreWriter, feature_keys: set[str]) -> dict[str, TargetChains]:
        """Chains of every feature record: this run's, then the rest from their header entries
        (StoreWriter.header: the records themselves are not read)."""
        targets = {target_id: chains for target_id, chains in self.targets.items() if target_id in feature_keys}
        unknown = []
        for target_id in sorted(feature_keys - set(targets)):
            try:
                chains = TargetChains.from_meta(target_id, writer.header(FEATURES_TABLE, target_id).meta)
            except Exception as error:  # a damaged record (verify names it) is left out of the weights
                log.warning("features/%s: not clustered: %s", target_id, error)
                continue
            if chains is None:
                unknown.append(target_id)
            else:
                targets[target_id] = chains
        if unknown:
            log.warning(
                "%d feature records predate curation metadata and get no sampling weight (rerun "
                "precompute with their inputs to recompute them): %s",
                len(unknown),
                ", ".join(unknown[:5]),
            )
        return targets

    def _previous_table(self, table: str) -> dict:
        return {} if self.previous is None else self.previous.index.get(table, {})
