"""`featurecache plot RUN_DIR`: a training run's log.jsonl drawn as a PNG; bad run folders are one line."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from featurecache.cli import cli
from featurecache.training.run_plot import loss_terms, read_log, read_steps

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _step(step: int, **changes) -> dict:
    """One step record with the fields featurecache.training.loop logs."""
    record = {
        "kind": "train",
        "step": step,
        "epoch": 0,
        "distogram": 4.0 / step,
        "mse": 50.0 / step,
        "smooth_lddt": 0.8,
        "bond": 0.0,
        "diffusion": 1.5 / step**0.5,
        "loss": 6.0 / step**0.5,
        "num_cycles": 1 + step % 4,
        "grad_norm": 10.0 / step,
        "lr": 1e-3,
        "step_time_s": 0.15 + (20.0 if step == 1 else 0.0),
        "data_wait_s": 0.002,
        "peak_memory_gb": 2.0 + step / 100,
        "tokens": 20,
        "ids": [["a"]],
        "world_size": 1,
    }
    record.update(changes)
    return record


def _write_log(run_dir: Path, records: list[dict], tail: str = "") -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "log.jsonl").write_text("".join(json.dumps(record) + "\n" for record in records) + tail)
    return run_dir


def _invoke(*args: str):
    return CliRunner().invoke(cli, list(args))


def _validation(step: int) -> dict:
    """A validation record as featurecache.training.validation writes it."""
    return {
        "kind": "validation",
        "step": step,
        "targets": ["a"],
        "weights": "ema",
        "lddt": 0.2 + step / 400,
        "lddt_protein": 0.25 + step / 400,
        "lddt_dna": None,
        "lddt_rna": None,
        "lddt_ligand": None,
        "loss": 5.0 / step**0.5,
        "distogram": 4.0 / step,
    }


def test_plot_writes_a_png_beside_the_log(tmp_path):
    records = [_step(step) for step in range(1, 121)]
    records[39:39] = [_validation(40)]  # a validation line after step 40
    run_dir = _write_log(tmp_path / "run", records + [_validation(120)])
    steps, validations = read_log(run_dir)
    assert [record["step"] for record in steps] == list(range(1, 121))
    assert [record["step"] for record in validations] == [40, 120]
    result = _invoke("plot", str(run_dir))
    assert result.exit_code == 0, result.output
    image = run_dir / "training.png"
    assert f"plot written to {image}" in result.output
    assert image.read_bytes()[:8] == PNG_SIGNATURE and image.stat().st_size > 20_000
    other = tmp_path / "other.svg"
    assert _invoke("plot", str(run_dir), "--out", str(other)).exit_code == 0
    assert other.read_text().lstrip().startswith("<?xml")


def test_a_resumed_run_keeps_the_later_record_of_a_step_and_a_cut_last_line_is_left_out(tmp_path):
    first = [_step(step) for step in range(1, 6)]
    resumed = [_step(step, loss=1.0) for step in range(4, 8)]  # resumed from the step-3 checkpoint
    run_dir = _write_log(tmp_path / "run", first + resumed, tail='{"step": 8, "loss": 0.')
    steps = read_steps(run_dir)
    assert [record["step"] for record in steps] == list(range(1, 8))
    assert [record["loss"] for record in steps[3:]] == [1.0] * 4
    assert loss_terms(steps) == ["distogram", "mse", "smooth_lddt", "bond", "diffusion"]
    assert _invoke("plot", str(run_dir)).exit_code == 0


@pytest.mark.parametrize(
    "setup, message",
    [
        (lambda run: None, "no such folder"),
        (lambda run: run.mkdir(), "no log.jsonl"),
        (lambda run: _write_log(run, [], tail="\n"), "no training step logged yet"),
        (lambda run: _write_log(run, [_step(1)], tail="not json\n" + json.dumps(_step(2)) + "\n"), "line 2: not JSON"),
        (
            lambda run: _write_log(run, [_step(1), {**_step(2), "peak_memory_gb": None}]),
            "line 2: a train record without a number for peak_memory_gb",
        ),
    ],
)
def test_a_folder_without_a_readable_log_is_one_line(tmp_path, setup, message):
    run_dir = tmp_path / "run"
    setup(run_dir)
    result = _invoke("plot", str(run_dir))
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1, result.output
    assert message in result.output and str(run_dir) in result.output


def test_out_must_be_an_image_name(tmp_path):
    run_dir = _write_log(tmp_path / "run", [_step(1)])
    result = _invoke("plot", str(run_dir), "--out", str(tmp_path / "plot.txt"))
    assert result.exit_code == 2 and "--out" in result.output and ".png" in result.output


def test_plot_imports_no_torch(tmp_path):
    """The plot command reads a log and draws it: torch (~2 s to import) stays out of the process."""
    run_dir = _write_log(tmp_path / "run", [_step(step) for step in range(1, 6)])
    script = (
        "import sys\n"
        "import featurecache.training.run_plot\n"
        "assert 'torch' not in sys.modules, 'importing run_plot imported torch'\n"
        "from click.testing import CliRunner\n"
        "from featurecache.cli import cli\n"
        "result = CliRunner().invoke(cli, ['plot', sys.argv[1]])\n"
        "assert result.exit_code == 0, result.output\n"
        "print(sorted(name for name in ('torch', 'matplotlib') if name in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(run_dir)],
        check=False,
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[-2] == "['matplotlib']"  # the figure drawn, torch never imported
