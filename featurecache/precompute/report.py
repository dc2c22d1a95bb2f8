"""What a precompute run tells its user: the summary (counts per stage, failures, time spent
where) and the progress bars."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

STAGES = ("search", "conformers", "featurize")  # conformers: done = computed, skipped = already cached
FAILURES_SHOWN = 20  # failures listed in the text summary; `featurecache stats` lists them all


@dataclass
class StageCounts:
    done: int = 0
    skipped: int = 0
    failed: int = 0


@dataclass
class PrecomputeSummary:
    cache_dir: str
    targets: int = 0
    excluded: int = 0  # targets curation left out in this run (no feature record)
    stages: dict[str, StageCounts] = field(default_factory=lambda: {stage: StageCounts() for stage in STAGES})
    warnings: int = 0
    failures: list[dict] = field(default_factory=list)
    seconds: float = 0.0
    tool_seconds: float = 0.0  # inside the search tools (summed over tasks)
    featurize_seconds: float = 0.0  # parsing + featurization + encoding (summed over tasks)
    conformer_seconds: float = 0.0  # reference conformers computed in this run (summed over tasks)
    write_seconds: float = 0.0  # driver time in LMDB writes
    clustered: bool = False  # chains were clustered again (False: nothing changed, or clustering off)
    cluster_seconds: float = 0.0  # clustering and sampling weights over the whole cache
    # template hits whose structure is not in the template folder (e.g. m8 hits against the whole PDB)
    unplaced_template_hits: int = 0
    targets_with_unplaced_templates: int = 0
    # --recheck: records the run would keep, read in full; damaged ones found, and rewritten
    recheck: bool = False
    rechecked: int = 0
    damaged: dict[str, int] = field(default_factory=dict)  # table -> damaged records found
    recomputed: dict[str, int] = field(default_factory=dict)  # table -> of those, rewritten
    damaged_left: list[str] = field(default_factory=list)  # "table/key" still damaged

    def count_unplaced_templates(self, hits: int) -> None:
        if hits:
            self.unplaced_template_hits += hits
            self.targets_with_unplaced_templates += 1

    @property
    def failed(self) -> int:
        return self.stages["featurize"].failed

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        data["failed"] = self.failed
        return data

    def _recheck_line(self) -> str:
        found, recomputed = sum(self.damaged.values()), sum(self.recomputed.values())
        line = f"  recheck: {self.rechecked} kept record(s) read in full, {found} damaged"
        if found:
            line += f" ({_by_table(self.damaged)})"
        line += f", {recomputed} damaged record(s) recomputed"
        if recomputed:
            line += f" ({_by_table(self.recomputed)})"
        return line

    def format(self) -> str:
        lines = [f"cache {self.cache_dir}: {self.targets} target(s) in {self.seconds:.1f} s"]
        for stage, counts in self.stages.items():
            lines.append(f"  {stage:<10} done {counts.done:>6}  skipped {counts.skipped:>6}  failed {counts.failed:>6}")
        if self.excluded:
            lines.append(f"  excluded by curation: {self.excluded} target(s) (see `featurecache stats`)")
        if self.clustered:
            lines.append(f"  clustered every chain and interface of the cache in {self.cluster_seconds:.1f} s")
        if self.warnings:
            lines.append(f"  warnings: {self.warnings} (see `featurecache stats`)")
        if self.unplaced_template_hits:
            lines.append(
                f"  template hits without a structure in the template folder: {self.unplaced_template_hits} "
                f"in {self.targets_with_unplaced_templates} target(s), not used as templates "
                "(m8 hits against the whole PDB? add their mmCIF files to --templates)"
            )
        if self.recheck:
            lines.append(self._recheck_line())
            if self.damaged_left:
                shown = ", ".join(self.damaged_left[:FAILURES_SHOWN])
                extra = len(self.damaged_left) - FAILURES_SHOWN
                more = f" and {extra} more" if extra > 0 else ""
                lines.append(f"  still damaged (failed, or used by no input of this run): {shown}{more}")
        for failure in self.failures[:FAILURES_SHOWN]:
            lines.append(f"  FAILED {failure['stage']} {failure['key']}: {failure['message']}")
        if len(self.failures) > FAILURES_SHOWN:
            lines.append(f"  ... and {len(self.failures) - FAILURES_SHOWN} more failures (see `featurecache stats`)")
        return "\n".join(lines)


def _by_table(counts: dict[str, int]) -> str:
    return ", ".join(f"{table} {count}" for table, count in counts.items() if count)


def progress_bars(enabled: bool):
    """A factory of tqdm bars (``make(total=..., desc=..., unit=...)``), silent when not enabled
    and when stderr is not a terminal (a log file would get every redraw as a `\r` line; the
    summary says what was done)."""
    from tqdm.auto import tqdm

    def make(**kwargs):
        # disable=None: tqdm's own "only on a terminal"
        return tqdm(disable=None if enabled else True, dynamic_ncols=True, **kwargs)

    return make
