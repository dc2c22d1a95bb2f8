"""What a person watching `featurecache train` sees: a progress bar in a terminal (checked under a
pseudo-terminal), plain lines when stdout is a file or a pipe, a line before the slow first step,
and --tensorboard's event files or its one-line refusal when the package is missing."""

import fcntl
import io
import os
import pty
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest
from click.testing import CliRunner

from featurecache.config import SampleConfig
from featurecache.training import TrainConfig
from featurecache.training.progress import LINES_PER_RUN, TrainProgress
from tests.conftest import copy_sample_structures

REPO = Path(__file__).resolve().parents[2]
SMALL_RUN = [
    "--steps",
    "3",
    "--crop-size",
    "16",
    "--msa-rows-per-sample",
    "8",
    "--num-workers",
    "0",
    "--device",
    "cpu",
    "--kernels",
    "torch",
    "--checkpoint-every",
    "100",
]


@pytest.fixture(scope="module")
def small_cache(tmp_path_factory, shared_data) -> Path:
    """The smallest sample target (209d, 79 tokens), featurized inline: a CPU step takes a second."""
    from featurecache.precompute.pipeline import PrecomputeOptions, precompute

    inputs = copy_sample_structures("209d-assembly1.cif", tmp_path_factory.mktemp("inputs"))
    cache = tmp_path_factory.mktemp("cache") / "cache"
    summary = precompute(
        PrecomputeOptions(
            inputs=[inputs],
            cache_dir=cache,
            alignments_dir=shared_data / "alignments",
            progress=False,
            executor="inline",
        )
    )
    assert summary.failed == 0, summary.format()
    return cache


def _train_args(cache: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "featurecache.training", "--cache", str(cache), "--out", str(out), *SMALL_RUN]


def _env() -> dict:
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env.update(PYTHONPATH=os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]), OMP_NUM_THREADS="1")
    return env


def _run_in_terminal(args: list[str]) -> tuple[int, str]:
    """Run `args` with stdout and stderr on a pseudo-terminal of 120 columns; returns (exit code, output)."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=follower, stderr=follower, env=_env())
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the child closed its end
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    return process.wait(timeout=600), b"".join(chunks).decode("utf-8", "replace")


def test_a_terminal_gets_a_progress_bar(small_cache, tmp_path):
    code, output = _run_in_terminal(_train_args(small_cache, tmp_path / "run"))
    assert code == 0, output[-3000:]
    assert "featurecache train: building the tiny model on cpu" in output
    assert "featurecache train: first step 1/3: loading the first batch (one-off work" in output
    bar = output[output.index("first step 1/3") :]
    # tqdm redraws one line with carriage returns: steps done, rate, ETA, loss and data-wait share
    assert "\r" in bar and "3/3" in bar and ("step/s" in bar or "s/step" in bar), bar
    assert "loss " in bar and "data wait " in bar and "%" in bar
    assert "step      1/3" not in output  # no plain per-step lines in a terminal


def test_a_pipe_gets_plain_lines(small_cache, tmp_path):
    result = subprocess.run(
        _train_args(small_cache, tmp_path / "run"), env=_env(), capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "\r" not in result.stdout and "\r" not in result.stderr
    lines = result.stdout.splitlines()
    assert any(line.startswith("featurecache train: first step 1/3: loading the first batch") for line in lines)
    steps = [line for line in lines if line.startswith("step ")]
    assert [line.split()[1] for line in steps] == ["1/3", "2/3", "3/3"]
    assert all("loss" in line and "data wait" in line and "eta" in line for line in steps)


def _record(step: int) -> dict:
    return {"step": step, "loss": 2.0, "num_cycles": 1, "step_time_s": 0.5, "data_wait_s": 0.05, "peak_memory_gb": 1.0}


def test_a_log_file_gets_a_line_every_few_steps_and_the_last():
    steps = 4 * LINES_PER_RUN + 3
    log = io.StringIO()  # not a terminal
    progress = TrainProgress(TrainConfig(cache="unused", steps=steps), stream=log)
    progress.begin(0, "loading the first batch")
    for step in range(1, steps + 1):
        progress.update(_record(step))
        if step == 8:  # a validation pass after step 8: its own line, whatever the interval
            progress.update(
                {
                    "kind": "validation",
                    "step": 8,
                    "loss": 3.0,
                    "lddt": 0.25,
                    "lddt_protein": 0.5,
                    "lddt_dna": None,
                    "lddt_rna": None,
                    "lddt_ligand": None,
                    "targets": ["a"],
                }
            )
    progress.close()
    lines = log.getvalue().splitlines()
    printed = [int(line.split()[1].split("/")[0]) for line in lines if line.startswith("step") and "/" in line]
    assert printed == [1, *range(4, steps, 4), steps]
    assert lines[-1].endswith("(10%)  peak 1.00 GB  eta 0:00:00")
    after_step_8 = next(number for number, line in enumerate(lines) if line.startswith(f"step      8/{steps}")) + 1
    assert lines[after_step_8] == "step      8  validation  loss 3.0000  lddt 0.250  lddt_protein 0.500"


def _config(cache: Path, tmp_path: Path, **changes) -> TrainConfig:
    return TrainConfig(
        cache=str(cache),
        out=str(tmp_path / "run"),
        steps=2,
        num_workers=0,
        device="cpu",
        kernels="torch",
        sample=SampleConfig(crop_size=16, msa_rows_per_sample=8),
        **changes,
    )


def test_tensorboard_gets_every_step(small_cache, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from featurecache.training import train

    train(_config(small_cache, tmp_path, tensorboard=str(tmp_path / "tb")))
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    tags = events.Tags()["scalars"]
    assert {"train/loss", "train/distogram", "train/step_time_s", "train/data_wait_s"} <= set(tags)
    assert [event.step for event in events.Scalars("train/loss")] == [1, 2]


def test_tensorboard_without_the_package_is_one_line(small_cache, tmp_path, monkeypatch):
    from featurecache.cli import cli

    # as if the package were not installed: importing it fails
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    result = CliRunner().invoke(
        cli,
        [
            "train",
            "--cache",
            str(small_cache),
            "--out",
            str(tmp_path / "run"),
            "--tensorboard",
            str(tmp_path / "tb"),
            *SMALL_RUN,
        ],
    )
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "--tensorboard" in lines[0] and "pip install tensorboard" in lines[0], result.output
    assert not (tmp_path / "run").exists() and not (tmp_path / "tb").exists()
