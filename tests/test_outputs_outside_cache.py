"""No command writes its output into a cache folder: an --out (or stats --plot) that is a cache,
or lies inside one (the cache the command reads, a publish root, or any other cache folder), is
one line naming the option and the cache, exit 2, before anything is written."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from featurecache.cli import cli
from featurecache.config import ClusteringConfig
from featurecache.precompute.pipeline import PrecomputeOptions, precompute

TARGET = "721p-assembly1"


@pytest.fixture(scope="module")
def caches(tmp_path_factory, shared_data):
    """A real cache of one target and a publish root holding it."""
    root = tmp_path_factory.mktemp("outputs")
    cache = root / "cache"
    summary = precompute(
        PrecomputeOptions(
            inputs=[shared_data / "structures" / f"{TARGET}.cif"],
            cache_dir=cache,
            alignments_dir=shared_data / "alignments",
            executor="inline",
            progress=False,
            clustering=ClusteringConfig(enabled=False),
        )
    )
    assert summary.stages["featurize"].done == 1, summary.format()
    assert CliRunner().invoke(cli, ["publish", str(cache), str(root / "published")]).exit_code == 0
    return cache, root / "published"


def _files(folder):
    return sorted(path.relative_to(folder) for path in folder.rglob("*"))


CASES = {
    "export into its cache": lambda c, p: (["export", c, TARGET, "--format", "a3m", "--out", c / "a3m"], "--out", c),
    "export over its cache": lambda c, p: (["export", c, TARGET, "--format", "a3m", "--out", c], "--out", c),
    "export into a publish root": lambda c, p: (
        ["export", p, TARGET, "--format", "af3-json", "--out", p / "json"],
        "--out",
        p,
    ),
    "search into a cache": lambda c, p: (
        ["search", c / "query.fasta", "--config", c / "pipeline.toml", "--out", c / "search"],
        "--out",
        c,
    ),
    "search out is its --cache": lambda c, p: (
        [
            "search",
            c / "query.fasta",
            "--config",
            c / "pipeline.toml",
            "--out",
            c.parent / "new",
            "--cache",
            c.parent / "new",
        ],
        "--out",
        c.parent / "new",
    ),
    "train into its cache": lambda c, p: (
        ["train", "--cache", c, "--out", c / "run", "--preset", "tiny", "--steps", "1", "--kernels", "torch"],
        "--out",
        c,
    ),
    "train into another cache": lambda c, p: (
        ["train", "--cache", p, "--out", c / "run", "--preset", "tiny", "--steps", "1", "--kernels", "torch"],
        "--out",
        c,
    ),
    "predict into its cache": lambda c, p: (
        ["predict", "--cache", c, TARGET, "--checkpoint", c / "missing.pt", "--out", c / "predictions"],
        "--out",
        c,
    ),
    "stats plot into its cache": lambda c, p: (["stats", c, "--plot", c / "stats.png"], "--plot", c),
}


@pytest.mark.parametrize("case", CASES)
def test_output_inside_a_cache_is_refused(caches, case):
    cache, published = caches
    args, option, named_cache = CASES[case](cache, published)
    before = {folder: _files(folder) for folder in (cache, published)}
    result = CliRunner().invoke(cli, [str(arg) for arg in args])
    assert result.exit_code == 2, result.output
    (line,) = result.output.strip().splitlines()
    assert line.startswith(f"Error: {option} ") and f"the cache {named_cache}" in line, line
    assert {folder: _files(folder) for folder in (cache, published)} == before  # nothing written
    assert not (cache.parent / "new").exists()
