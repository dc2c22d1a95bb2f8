"""benchmarks/harness.py's run_budgeted_train: `featurecache train` with --max-minutes, a signal
only when the run overruns its budget by the grace, a failed run as a SystemExit. The command
here is a stand-in script (the real train's --max-minutes is tests/training/test_interrupt.py's)."""

from __future__ import annotations

import pathlib
import sys

import pytest

BENCHMARKS = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def harness():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import harness
    finally:
        sys.path.remove(str(BENCHMARKS))
    return harness


# the stand-in: writes its arguments, then sleeps SLEEP seconds (ignoring --max-minutes) unless a
# SIGINT ends it, and exits with EXIT
STAND_IN = """
import pathlib, signal, sys, time
pathlib.Path(sys.argv[1]).write_text(" ".join(sys.argv[2:]))
signal.signal(signal.SIGINT, lambda *_: sys.exit(130))
time.sleep(float(sys.argv[2]))
sys.exit(int(sys.argv[3]))
"""


def _command(tmp_path: pathlib.Path, sleep: float, exit_code: int) -> list[str]:
    return [sys.executable, "-c", STAND_IN, str(tmp_path / "argv"), str(sleep), str(exit_code)]


def test_a_run_that_ends_by_itself_gets_the_budget_and_is_not_stopped(harness, tmp_path):
    seconds, stopped = harness.run_budgeted_train(_command(tmp_path, 0.0, 0), minutes=2.5)
    assert not stopped and seconds < 60
    assert (tmp_path / "argv").read_text().endswith("--max-minutes 2.5")


def test_a_failed_run_is_a_system_exit(harness, tmp_path):
    with pytest.raises(SystemExit, match="exit code 3"):
        harness.run_budgeted_train(_command(tmp_path, 0.0, 3), minutes=1.0)


def test_a_run_past_its_budget_and_the_grace_is_signalled_and_counted_as_stopped(harness, tmp_path, monkeypatch):
    monkeypatch.setattr(harness, "TRAIN_BUDGET_GRACE_S", 0.5)
    seconds, stopped = harness.run_budgeted_train(_command(tmp_path, 120.0, 0), minutes=0.01)
    assert stopped and seconds < 60  # SIGINT after 0.6 s + 0.5 s, not the stand-in's 120 s
