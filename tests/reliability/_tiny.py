"""The smallest real cache, training run and checkpoint the command-line tests need.

One sample structure with its ingested alignments, and one optimizer step of the tiny preset
with no Pairformer block on a 16-token crop: seconds, not minutes, on a CPU.
"""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from featurecache.cli import cli

TARGET = "2q2k"
# A training step and a prediction as small as the model allows (options given later win).
TINY_TRAIN = [
    "--device",
    "cpu",
    "--num-workers",
    "0",
    "--steps",
    "1",
    "--pairformer-blocks",
    "0",
    "--diffusion-batch",
    "1",
    "--max-recycling-cycles",
    "1",
    "--crop-size",
    "16",
    "--msa-rows-per-sample",
    "4",
]
TINY_PREDICT = ["--samples", "1", "--steps", "2", "--cycles", "1", "--device", "cpu", "--max-tokens", "16"]


def build_cache(data: Path, cache: Path) -> Path:
    result = CliRunner().invoke(
        cli,
        [
            "precompute",
            str(data / "structures" / f"{TARGET}.cif"),
            "--alignments",
            str(data / "alignments"),
            "--cache",
            str(cache),
            "--executor",
            "inline",
            "--no-progress",
        ],
    )
    assert result.exit_code == 0, result.output
    return cache


def train_run(cache: Path, run_dir: Path) -> Path:
    """A finished one-step run: RUN_DIR/log.jsonl and RUN_DIR/checkpoint-00000001.pt."""
    result = CliRunner().invoke(cli, ["train", "--cache", str(cache), "--out", str(run_dir), *TINY_TRAIN])
    assert result.exit_code == 0, result.output
    return run_dir


def checkpoint_of(run_dir: Path) -> Path:
    return next(run_dir.glob("checkpoint-*.pt"))


def pipeline_config(folder: Path) -> Path:
    """A real pipeline TOML: jackhmmer over a two-sequence FASTA database (searches take a second)."""
    database = folder / "tiny-db.fasta"
    database.write_text(">s1\nMKTAYIAKQRQISFVKSHFSRQ\n>s2\nMKTAYIAKQRQISFVKSHFSRA\n")
    config = folder / "pipeline.toml"
    config.write_text(
        f'[search]\nthreads = 1\ntimeout_s = 60\n\n[[databases]]\nname = "tiny"\ntool = "jackhmmer"\n'
        f'role = "msa"\npath = "{database}"\nmax_hits = 10\n'
    )
    return config
