"""benchmarks/cli_step.py: the figures it takes from a run's log (by hand on written step lines),
and one real `featurecache train` through it on the CPU, recorded into copies of RESULTS.md and
results.csv."""

from __future__ import annotations

import json
import pathlib
import shutil
import sys

import pytest

BENCHMARKS = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def modules():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import cli_step
        import records
    finally:
        sys.path.remove(str(BENCHMARKS))
    return cli_step, records


def _step(step: int, seconds: float, atoms: int = 100, padded: int = 128, wait: float = 0.001, peak: float = 1.0):
    return {
        "kind": "train",
        "step": step,
        "step_time_s": seconds,
        "data_wait_s": wait,
        "peak_memory_gb": peak,
        "tokens": 32,
        "atoms": atoms,
        "padded_atoms": padded,
    }


def test_the_timed_steps_skip_the_first_quarter_and_new_buckets_pass_under_the_median(modules):
    cli_step, _ = modules
    # step 1 compiles; step 6 meets a new bucket (a warm-up and a capture): the median passes over it
    times = [40.0, 0.5, 0.5, 0.5, 0.2, 9.0, 0.2, 0.2, 0.3, 0.2, 0.2, 0.2]
    steps = [_step(number + 1, seconds, peak=2.0 if number == 5 else 1.0) for number, seconds in enumerate(times)]
    figures = cli_step.summarise(steps)
    assert figures["first step s"] == 40.0 and figures["timed steps"] == 9  # max(3, 12 // 4) skipped
    assert figures["step ms"] == pytest.approx(200.0) and figures["fastest ms"] == pytest.approx(200.0)
    assert figures["peak GB"] == 2.0 and figures["padded atoms %"] == pytest.approx(28.0)
    assert cli_step.summarise(steps, skip=11)["timed steps"] == 1
    assert cli_step.summarise(steps[:2])["timed steps"] == 1  # never fewer than one timed step
    with pytest.raises(SystemExit, match="1 step"):
        cli_step.summarise(steps[:1])


def test_the_af3_step_takes_the_flop_counts_label_and_other_runs_their_own(modules):
    cli_step, records = modules

    class Args:
        preset, crop, diffusion_batch, train_args = "af3", 384, None, []

    assert cli_step.shape_label(Args) == records.ITERATION_PREFIX + "full AF3 depth 48, diffusion batch 48, crop 384"
    Args.train_args = ["--pairformer-blocks", "8"]  # no longer the counted step
    assert cli_step.shape_label(Args) == "af3 preset, diffusion batch 48, crop 384, N_cycle 1"
    Args.preset, Args.train_args = "tiny", []
    assert cli_step.shape_label(Args) == "tiny preset, diffusion batch 4, crop 384, N_cycle 1"


def test_a_cpu_run_through_the_cli_is_timed_and_recorded(modules, sample_cache, tmp_path, monkeypatch, capsys):
    cli_step, records = modules
    for name in ("RESULTS_MD", "RESULTS_CSV"):
        copy = tmp_path / getattr(records, name).name
        shutil.copy(getattr(records, name), copy)
        monkeypatch.setattr(records, name, copy)
    out = tmp_path / "run"
    argv = ["--cache", str(sample_cache), "--preset", "tiny", "--crop", "24", "--steps", "3", "--num-workers", "0"]
    cli_step.main([*argv, "--out", str(out), "--minutes", "10", "--record", "--", "--msa-rows-per-sample", "8"])
    lines = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert sum(line.get("kind") == "train" for line in lines) == 3
    printed = capsys.readouterr().out
    assert "--msa-rows-per-sample 8" in printed and "| tiny | 24 | 3 (1) |" in printed
    csv_rows = [row for row in records.read_rows(records.RESULTS_CSV) if row["benchmark"] == "cli_step"]
    assert {row["metric"] for row in csv_rows[-4:]} == {"iteration ms", "first step s", "peak GB", "padded atoms %"}
    assert "<!-- cli_step: begin -->" in records.RESULTS_MD.read_text()
