"""`featurecache stats --plot`: the cache_stats report (inspect.py) drawn as one figure.

One panel per question a person asks of a cache, three to a row: how long the targets are and
how deep their MSAs (logarithmic bins once the values span more than LOG_SPAN, so one large
target does not squeeze the rest into one bar), how many templates they got and how many hits
had no coordinates, what failed, where the reference conformers came from, what curation
removed, and the AF3 sampling: cluster sizes, target weights and each item kind's share of the
weight (or a note that the cache has no clusters). Counts get integer ticks, and an empty
panel says "no failures" or "nothing removed" instead of drawing a blank axis.
matplotlib is imported only when a plot is asked for, so the text report does not need it.
"""

from __future__ import annotations

import math
import textwrap
from collections import Counter
from pathlib import Path

import numpy as np

from featurecache.store.files import atomic_path

_COLORS = {"chains": "#3b75af", "interfaces": "#ef8636"}
# chem.SOURCES, best first, as the panel names them
_CONFORMER_SOURCES = {"rdkit": "RDKit", "ccd_ideal": "CCD\nideal", "ccd_model": "CCD\nmodel", "none": "none"}
_COLUMNS = 3
LOG_SPAN = 10  # a histogram whose values span more than this factor gets logarithmic bins


def plot_stats(report: dict, path: Path) -> None:
    """Write the figure of a cache_stats report to `path` (PNG, PDF or SVG by its suffix)."""
    import matplotlib.pyplot as plt

    figure = stats_figure(report)
    with atomic_path(path) as partial:  # an interrupted plot leaves no half-written image
        figure.savefig(partial, dpi=110)
    plt.close(figure)


def stats_figure(report: dict):
    """The matplotlib Figure of a cache_stats report (Agg backend): one panel per question."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    targets = list(report["targets"].values())
    panels = [
        lambda axis: _histogram(axis, [t["num_tokens"] for t in targets], "tokens per target", "tokens", "#3b75af"),
        lambda axis: _histogram(axis, [t["msa_depth"] for t in targets], "MSA depth per target", "rows", "#519e3e"),
        lambda axis: _templates(axis, targets, report["template_hits_without_structure"]),
        lambda axis: _failures(axis, report["failures_by_stage"]),
        lambda axis: _conformer_sources(axis, report.get("conformer_sources") or {}),
        lambda axis: _curation(axis, report["curation"]),
        *_sampling_panels(report.get("sampling"), [t.get("weight") for t in targets]),
    ]
    rows = math.ceil(len(panels) / _COLUMNS)
    figure, axes = plt.subplots(rows, _COLUMNS, figsize=(13, 3.5 * rows + 0.4), squeeze=False)
    for draw, axis in zip(panels, axes.flat):
        draw(axis)
    for axis in list(axes.flat)[len(panels) :]:
        axis.set_axis_off()
    figure.suptitle(f"{report['cache']}: {len(targets)} targets, {report['bytes'] / 2**20:.1f} MiB", fontsize=10)
    figure.tight_layout()
    return figure


def log_axis(axis, which: str, low: float, high: float) -> None:
    """A log scale on the panel's x or y axis for values from low to high, labelled with plain
    numbers (0.5, 2, 100): ticks at 1, 2, 5 x 10^k over up to two decades, at powers of 10
    beyond (else they crowd). Also training's run plot (training/run_plot.py)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    (axis.set_xscale if which == "x" else axis.set_yscale)("log")
    ticks = axis.xaxis if which == "x" else axis.yaxis
    few_decades = high < 100 * low
    ticks.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0) if few_decades else (1.0,)))
    ticks.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    ticks.set_minor_formatter(NullFormatter())


def _integer_counts(axis, which: str = "y") -> None:
    from matplotlib.ticker import MaxNLocator

    (axis.yaxis if which == "y" else axis.xaxis).set_major_locator(MaxNLocator(integer=True))


def _note(axis, title: str, text: str, color: str = "0.35") -> None:
    """A panel with nothing to draw: its title and one sentence, no axes."""
    axis.set_axis_off()
    axis.set_title(title)
    axis.text(0.5, 0.5, text, ha="center", va="center", fontsize=12, color=color, wrap=True, transform=axis.transAxes)


def _bins(values: list[float]) -> tuple[np.ndarray, bool]:
    """Histogram bins and whether they are logarithmic (positive values spanning more than
    LOG_SPAN); one bar per value for a few distinct integers, else about two bins per
    sqrt(count), 5 to 30."""
    data = np.asarray(values, dtype=float)
    count = int(np.clip(2 * math.sqrt(data.size), 5, 30))
    low, high = float(data.min()), float(data.max())
    if low > 0 and high > LOG_SPAN * low:
        return np.geomspace(low, high * 1.0001, count + 1), True
    if high - low < count and low.is_integer() and high.is_integer():
        return np.arange(low - 0.5, high + 1.5), False
    return np.linspace(low, high + 1e-9, count + 1), False


def _histogram(axis, values: list, title: str, unit: str, color: str, ylabel: str = "targets") -> None:
    values = [value for value in values if value is not None]
    if not values:
        _note(axis, title, "no targets")
        return
    bins, logarithmic = _bins(values)
    axis.hist(values, bins=bins, color=color, edgecolor="white", linewidth=0.5)
    if len(set(values)) == 1:  # one bar: room on both sides, not a bar as wide as the panel
        width = bins[-1] - bins[0]
        axis.set_xlim(bins[0] - 2 * width, bins[-1] + 2 * width)
    if logarithmic:
        log_axis(axis, "x", bins[0], bins[-1])
        unit += " (log scale)"
    axis.set(title=title, xlabel=unit, ylabel=ylabel)
    _integer_counts(axis)


def _labelled_bars(axis, labels: list[str], counts: list[float], color: str, fmt: str = "{:g}") -> None:
    """One bar per label with its value on top; one or two bars get room as if there were three."""
    bars = axis.bar(labels, counts, color=color, width=0.6)
    axis.bar_label(bars, labels=[fmt.format(count) for count in counts], fontsize=8, padding=2)
    pad = max(0.0, (3 - len(labels)) / 2)
    axis.set_xlim(-0.5 - pad, len(labels) - 0.5 + pad)
    axis.margins(y=0.15)


def _templates(axis, targets: list[dict], hits: dict) -> None:
    """Targets by number of templates stored, and the hits that had no structure to use."""
    per_target = Counter(t.get("num_templates") or 0 for t in targets)
    largest = max(per_target)
    if largest <= 30:
        shown = range(max(largest, 4) + 1)  # a few empty bars show that no target got more
        _labelled_bars(axis, [str(n) for n in shown], [per_target.get(n, 0) for n in shown], "#8d69b8")
    else:
        axis.hist([t.get("num_templates") or 0 for t in targets], bins=30, color="#8d69b8")
    axis.set(title="templates per target", xlabel="templates stored", ylabel="targets")
    _integer_counts(axis)
    if hits["hits"]:
        axis.text(
            0.98,
            0.95,
            f"{hits['hits']} hits in {hits['targets']} target(s)\nhad no coordinates (not used)",
            ha="right",
            va="top",
            fontsize=8,
            color="#c53a32",
            transform=axis.transAxes,
        )


def _failures(axis, by_stage: dict) -> None:
    if not by_stage:
        _note(axis, "failures by stage", "no failures", color="#519e3e")
        return
    stages = sorted(by_stage)
    _labelled_bars(axis, stages, [by_stage[stage] for stage in stages], "#c53a32")
    axis.set(title="failures by stage", ylabel="records")
    _integer_counts(axis)


def _conformer_sources(axis, sources: dict) -> None:
    """Where each stored reference conformer's coordinates came from (RDKit, else the CCD's)."""
    if not sum(sources.values()):
        _note(axis, "reference conformers", "no conformers stored")
        return
    names = list(_CONFORMER_SOURCES) + sorted(set(sources) - set(_CONFORMER_SOURCES))
    _labelled_bars(
        axis,
        [_CONFORMER_SOURCES.get(name, name) for name in names],
        [sources.get(name, 0) for name in names],
        "#3b75af",
    )
    axis.set(title="reference conformers by source", ylabel="CCD codes")
    _integer_counts(axis)


def _curation(axis, curation: dict) -> None:
    """Atoms and chains curation removed (per reason) and targets it left out (per reason)."""
    items = [(reason, count, "removed from targets", "#7f7f7f") for reason, count in curation["removed"].items()]
    items += [(reason, count, "targets left out", "#c53a32") for reason, count in curation["excluded"].items()]
    if not items:
        _note(axis, "curation (AF3 filters)", "nothing removed")
        return
    rows = range(len(items))
    bars = axis.barh(rows, [count for _, count, _, _ in items], height=0.6, color=[item[3] for item in items])
    axis.bar_label(bars, fontsize=8, padding=2)
    axis.set_yticks(
        list(rows),
        [textwrap.fill(reason.replace("_", " "), 16, break_long_words=False) for reason, *_ in items],
        fontsize=8,
    )
    axis.set_ylim(max(len(items), 4) - 0.5, -0.5)  # thin bars, first on top, even for one reason
    axis.margins(x=0.2)
    from matplotlib.patches import Patch

    kinds = dict((kind, color) for _, _, kind, color in items)
    axis.legend(
        handles=[Patch(color=color, label=kind) for kind, color in kinds.items()], fontsize=8, loc="lower right"
    )
    axis.set(title="curation (AF3 filters)", xlabel="count")
    _integer_counts(axis, "x")


def _sampling_panels(sampling: dict | None, target_weights: list) -> list:
    if sampling is None:
        return [
            lambda axis: _note(
                axis, "AF3 sampling", "no clusters in this cache\n(clustering off, or built before clustering)"
            )
        ]
    return [
        lambda axis: _cluster_sizes(axis, sampling),
        lambda axis: _target_weights(axis, target_weights),
        lambda axis: _weight_shares(axis, sampling["weight_by_kind"]),
    ]


def _cluster_sizes(axis, sampling: dict) -> None:
    kinds = ("chains", "interfaces")
    sizes = [[int(size) for size in sampling[kind]["clusters_of_size"]] for kind in kinds]
    counts = [list(sampling[kind]["clusters_of_size"].values()) for kind in kinds]
    largest = max((max(found) for found in sizes if found), default=1)
    # one bar per size while sizes are few; logarithmic bins for a PDB-sized cache
    bins = np.arange(0.5, largest + 1.5) if largest <= 30 else np.unique(np.geomspace(1, largest + 1, 30).astype(int))
    axis.hist(
        sizes,
        bins=bins,
        weights=counts,
        color=[_COLORS[kind] for kind in kinds],
        label=[f"{kind} ({sampling[kind]['clusters']} clusters)" for kind in kinds],
    )
    if largest > 30:
        axis.set_xscale("log")
    else:
        _integer_counts(axis, "x")
    axis.set(title="cluster sizes", xlabel="members per cluster", ylabel="clusters")
    _integer_counts(axis)
    axis.set_ylim(0, axis.get_ylim()[1] * 1.3)  # headroom for the legend
    axis.legend(fontsize=8, loc="upper right")


def _target_weights(axis, target_weights: list) -> None:
    _histogram(axis, target_weights, "AF3 sampling weight per target", "weight (chains + interfaces)", "#8d69b8")


def _weight_shares(axis, by_kind: dict) -> None:
    total = sum(by_kind.values()) or 1.0
    kinds = sorted(by_kind, key=lambda kind: -by_kind[kind])
    _labelled_bars(axis, kinds, [100 * by_kind[kind] / total for kind in kinds], "#519e3e", "{:.0f}%")
    axis.set(title="share of sampling weight", ylabel="% of samples drawn")
