"""`featurecache stats --plot`: the cache_stats report (inspect.py) drawn as one figure.

The top row is the records (tokens, MSA depth, failures), the bottom row the AF3 sampling
(cluster sizes, target weights, each item kind's share of the sampling weight), or a note
that the cache has no clusters. matplotlib is imported only when a plot is asked for, so the
text report does not need it.
"""

from __future__ import annotations

from pathlib import Path

_COLORS = {"chains": "#3b75af", "interfaces": "#ef8636"}


def plot_stats(report: dict, path: Path) -> None:
    """PNG with the token-count and MSA-depth histograms, failures by stage, and the cluster-size,
    target-weight and weight-share panels."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    targets = report["targets"].values()
    figure, axes = plt.subplots(2, 3, figsize=(13, 7.2))
    axes[0, 0].hist([t["num_tokens"] for t in targets], bins=30, color="#3b75af")
    axes[0, 0].set(title="tokens per target", xlabel="tokens", ylabel="targets")
    axes[0, 1].hist([t["msa_depth"] for t in targets], bins=30, color="#519e3e")
    axes[0, 1].set(title="MSA depth per target", xlabel="rows", ylabel="targets")
    stages = report["failures_by_stage"] or {"(none)": 0}
    axes[0, 2].bar(list(stages), list(stages.values()), color="#c53a32")
    axes[0, 2].set(title="failures by stage", ylabel="records")
    _plot_sampling(axes[1], report.get("sampling"), [t.get("weight") for t in targets])
    figure.suptitle(report["cache"], fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _plot_sampling(axes, sampling: dict | None, target_weights: list) -> None:
    if sampling is None:
        for axis in axes:
            axis.set_axis_off()
        axes[1].text(0.5, 0.5, "no clusters in this cache", ha="center", va="center")
        return
    import numpy as np

    kinds = ("chains", "interfaces")
    sizes = [[int(size) for size in sampling[kind]["clusters_of_size"]] for kind in kinds]
    counts = [list(sampling[kind]["clusters_of_size"].values()) for kind in kinds]
    largest = max((max(found) for found in sizes if found), default=1)
    # one bar per size while sizes are few; logarithmic bins for a PDB-sized cache
    bins = np.arange(0.5, largest + 1.5) if largest <= 30 else np.unique(np.geomspace(1, largest + 1, 30).astype(int))
    axes[0].hist(sizes, bins=bins, weights=counts, color=[_COLORS[kind] for kind in kinds],
                 label=[f"{kind} ({sampling[kind]['clusters']} clusters)" for kind in kinds])
    if largest > 30:
        axes[0].set_xscale("log")
    axes[0].set(title="cluster sizes", xlabel="members per cluster", ylabel="clusters")
    axes[0].legend(fontsize=8)
    axes[1].hist([weight for weight in target_weights if weight is not None], bins=30, color="#8d69b8")
    axes[1].set(title="AF3 sampling weight per target", xlabel="weight (chains + interfaces)", ylabel="targets")
    shares = sampling["weight_by_kind"]
    total = sum(shares.values()) or 1.0
    axes[2].bar(list(shares), [mass / total for mass in shares.values()], color="#519e3e")
    axes[2].set(title="share of sampling weight", ylabel="fraction")
