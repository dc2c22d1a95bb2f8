"""`featurecache stats --plot`: the cache_stats report (inspect.py) drawn as one figure.

matplotlib is imported only when a plot is asked for, so the text report does not need it.
"""

from __future__ import annotations

from pathlib import Path


def plot_stats(report: dict, path: Path) -> None:
    """PNG with the token-count and MSA-depth histograms and failures by stage."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    targets = report["targets"].values()
    figure, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    axes[0].hist([t["num_tokens"] for t in targets], bins=30, color="#3b75af")
    axes[0].set(title="tokens per target", xlabel="tokens", ylabel="targets")
    axes[1].hist([t["msa_depth"] for t in targets], bins=30, color="#519e3e")
    axes[1].set(title="MSA depth per target", xlabel="rows", ylabel="targets")
    stages = report["failures_by_stage"] or {"(none)": 0}
    axes[2].bar(list(stages), list(stages.values()), color="#c53a32")
    axes[2].set(title="failures by stage", ylabel="records")
    figure.suptitle(report["cache"], fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
