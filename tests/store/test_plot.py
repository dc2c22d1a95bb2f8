"""`featurecache stats --plot` on real caches: the panels a person reads, with integer ticks on
counts, log bins where values span orders of magnitude, and sentences instead of empty axes."""

import matplotlib.pyplot as plt
import pytest

from featurecache.store.inspect import cache_stats
from featurecache.store.plot import plot_stats, stats_figure
from tests.conftest import copy_sample_structures

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
COUNT_PANELS = (
    "tokens per target",
    "MSA depth per target",
    "templates per target",
    "reference conformers by source",
    "cluster sizes",
    "AF3 sampling weight per target",
)


def _panels(figure) -> dict:
    return {axis.get_title(): axis for axis in figure.axes if axis.get_title()}


def _visible_ticks(axis) -> list[float]:
    low, high = sorted(axis.get_ylim())
    return [tick for tick in axis.get_yticks() if low <= tick <= high]


def _texts(axis) -> list[str]:
    return [text.get_text() for text in axis.texts]


def test_the_sample_cache_figure(sample_cache, tmp_path):
    report = cache_stats(sample_cache)
    figure = stats_figure(report)
    panels = _panels(figure)
    assert set(COUNT_PANELS) | {"failures by stage", "curation (AF3 filters)", "share of sampling weight"} <= set(
        panels
    )
    for title in COUNT_PANELS:  # counts of targets, codes or clusters: whole numbers only
        ticks = _visible_ticks(panels[title])
        assert ticks and all(float(tick).is_integer() for tick in ticks), (title, ticks)
    depths = [target["msa_depth"] for target in report["targets"].values()]
    tokens = [target["num_tokens"] for target in report["targets"].values()]
    assert max(depths) > 10 * min(depths) and panels["MSA depth per target"].get_xscale() == "log"
    assert max(tokens) < 10 * min(tokens) and panels["tokens per target"].get_xscale() == "linear"
    assert not report["failures"]
    failures = panels["failures by stage"]
    assert not failures.axison and _texts(failures) == ["no failures"]
    hits = report["template_hits_without_structure"]["hits"]
    assert hits > 0 and any(f"{hits} hits" in text for text in _texts(panels["templates per target"]))
    bars = panels["templates per target"].patches
    assert sum(bar.get_height() for bar in bars) == len(report["targets"])
    conformers = panels["reference conformers by source"].patches
    assert sum(bar.get_height() for bar in conformers) == report["counts"]["conformers"]
    shares = [bar.get_height() for bar in panels["share of sampling weight"].patches]
    assert sum(shares) == pytest.approx(100.0) and shares == sorted(shares, reverse=True)
    plt.close(figure)
    plot_stats(report, tmp_path / "stats.png")
    assert (tmp_path / "stats.png").read_bytes()[:8] == PNG_SIGNATURE


def test_failures_are_bars_by_stage(tmp_path, shared_data):
    from featurecache.precompute.pipeline import PrecomputeOptions, precompute

    inputs = copy_sample_structures("209d-assembly1.cif", tmp_path / "inputs")
    # the first 3000 bytes of a real entry: a loop cut mid-row, a parse failure
    (inputs / "cut.cif").write_bytes((shared_data / "structures" / "721p-assembly1.cif").read_bytes()[:3000])
    summary = precompute(
        PrecomputeOptions(
            inputs=[inputs],
            cache_dir=tmp_path / "cache",
            progress=False,
            alignments_dir=shared_data / "alignments",
            executor="inline",
        )
    )
    assert summary.failed == 1
    report = cache_stats(tmp_path / "cache")
    figure = stats_figure(report)
    failures = _panels(figure)["failures by stage"]
    assert failures.axison and [label.get_text() for label in failures.get_xticklabels()] == ["parse"]
    assert [bar.get_height() for bar in failures.patches] == [1]
    assert all(float(tick).is_integer() for tick in _visible_ticks(failures))
    # one target: its histograms still draw a bar with room around it
    tokens = _panels(figure)["tokens per target"]
    low, high = tokens.get_xlim()
    assert [bar.get_height() for bar in tokens.patches if bar.get_height()] == [1]
    assert high - low > 3 * max(bar.get_width() for bar in tokens.patches if bar.get_height())
    plt.close(figure)
