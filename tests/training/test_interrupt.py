"""Ctrl-C and SIGTERM stop `featurecache train` gracefully (featurecache/training/interrupt.py):
the step in flight finishes, a checkpoint and weights.pt are written at it, one line names it,
and the run resumes from it; every rank stops at the same step; a second signal stops at once.
"""

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from featurecache.training import interrupt, train
from featurecache.training.interrupt import StopRequest, TrainingInterrupted, ignore_stop_signals
from tests.training.conftest import read_log, tiny_config

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny matrices: see tests/conftest.py


@pytest.fixture
def handlers():
    """SIGINT with Python's KeyboardInterrupt handler and SIGTERM with a recording stand-in for
    termination, as a test's starting point; the handlers the test found are put back after it."""
    saved = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    terminated = []
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda signum, frame: terminated.append(signum))
    yield terminated
    for signum, handler in saved.items():
        signal.signal(signum, handler)


def test_a_first_sigint_asks_to_stop_a_second_interrupts(handlers):
    before = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    with StopRequest() as stop:
        assert not stop.requested
        signal.raise_signal(signal.SIGINT)
        assert stop.requested and stop.received == signal.SIGINT
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
    assert {signum: signal.getsignal(signum) for signum in before} == before


def test_a_first_sigterm_asks_to_stop_a_second_reaches_the_previous_handler(handlers):
    before = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    with StopRequest() as stop:
        signal.raise_signal(signal.SIGTERM)
        assert stop.received == signal.SIGTERM and handlers == []
        signal.raise_signal(signal.SIGTERM)  # the previous handler again: here the stand-in for termination
        assert handlers == [signal.SIGTERM]
    assert {signum: signal.getsignal(signum) for signum in before} == before


def test_leaving_without_a_signal_restores_the_handlers_and_an_ignored_signal_stays_ignored(handlers):
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a job started in the background by a script
    before = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    with StopRequest() as stop:
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
        assert signal.getsignal(signal.SIGTERM) != before[signal.SIGTERM]
        signal.raise_signal(signal.SIGINT)
        assert not stop.requested
    assert {signum: signal.getsignal(signum) for signum in before} == before


def test_outside_the_main_thread_nothing_is_installed(handlers):
    before = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    seen = []

    def enter() -> None:
        with StopRequest():
            seen.append({signum: signal.getsignal(signum) for signum in before})

    thread = threading.Thread(target=enter)
    thread.start()
    thread.join()
    assert seen == [before]


def test_the_interruption_names_the_checkpoint_and_exits_as_shells_report_the_signal():
    stopped = TrainingInterrupted(signal.SIGINT, 7, "run/checkpoint-00000007.pt", [], report=True)
    assert isinstance(stopped, KeyboardInterrupt) and stopped.exit_code == 130
    assert str(stopped) == (
        "interrupted at step 7 (SIGINT); checkpoint written to run/checkpoint-00000007.pt; "
        "resume with --resume run/checkpoint-00000007.pt"
    )
    assert TrainingInterrupted(signal.SIGTERM, 7, "c.pt", [], report=True).exit_code == 143
    assert TrainingInterrupted(None, 7, "c.pt", [], report=False).exit_code == 130


def _worker(ready, survived) -> None:
    ignore_stop_signals(0)
    ready.set()
    time.sleep(3.0)  # the signals from outside arrive here
    survived.set()
    time.sleep(60.0)  # until the parent's terminate()


def test_loader_workers_ignore_stop_signals_from_others_but_end_on_their_parents_terminate():
    """SIGINT and SIGTERM from another process (a terminal, a scheduler) leave a worker running;
    a SIGTERM from its parent (the DataLoader's terminate()) ends it at once, with exit 0."""
    context = mp.get_context("fork")
    ready, survived = context.Event(), context.Event()
    worker = context.Process(target=_worker, args=(ready, survived))
    worker.start()
    try:
        assert ready.wait(30)
        for signum in (signal.SIGINT, signal.SIGTERM):  # sent by a process other than the parent
            subprocess.run(["kill", f"-{signum.name.removeprefix('SIG')}", str(worker.pid)], check=True)
        assert survived.wait(30) and worker.is_alive()
        started = time.monotonic()
        worker.terminate()
        worker.join(30)
        assert worker.exitcode == 0 and time.monotonic() - started < 10
    finally:
        if worker.is_alive():
            worker.kill()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("signal_in", "steps", "stops", "validated"),
    [
        ("step", 10, True, [0]),  # step 2's validation skipped: the run stops
        ("validation", 10, True, [0, 2]),  # agreed on right after the validation
        ("step", 2, False, [0, 2]),  # at the last step: the run has finished
    ],
)
def test_a_stop_where_a_checkpoint_is_due_writes_it_once(
    recipe_cache, tmp_path, monkeypatch, handlers, signal_in, steps, stops, validated
):
    """SIGINT in step 2 or in its validation, with a checkpoint and a validation due at step 2."""
    from featurecache.training import loop

    saves, validations = [], []
    save, validate, step = loop._save, loop._validate, loop.Trainer.step

    def counted_save(world, trainer, position, *rest):
        saves.append(position.step)
        return save(world, trainer, position, *rest)

    def validate_with_signal(config, world, trainer, held_out, position, run_log):
        validations.append(position.step)
        validate(config, world, trainer, held_out, position, run_log)
        if signal_in == "validation" and position.step == 2:
            signal.raise_signal(signal.SIGINT)

    def step_with_signal(trainer, batches, number):
        if signal_in == "step" and number == 1:  # 0-based: the run's step 2
            signal.raise_signal(signal.SIGINT)
        return step(trainer, batches, number)

    monkeypatch.setattr(loop, "_save", counted_save)
    monkeypatch.setattr(loop, "_validate", validate_with_signal)
    monkeypatch.setattr(loop.Trainer, "step", step_with_signal)
    config = tiny_config(
        recipe_cache,
        tmp_path / "run",
        steps=steps,
        checkpoint_every=2,
        validate_every=2,
        validation_keys=("209d-assembly1",),
        validation_sampler_steps=2,
    )
    if stops:
        with pytest.raises(TrainingInterrupted) as stopped:
            train(config)
        assert stopped.value.step == 2 and [record["step"] for record in stopped.value.records] == [1, 2]
    else:
        assert [record["step"] for record in train(config)] == [1, 2]
    assert saves == [2] and validations == validated
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # train() put it back


def test_a_time_budget_is_spent_only_once_its_minutes_have_passed(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(interrupt, "monotonic", lambda: clock[0])
    with StopRequest(max_minutes=0.5) as budget, StopRequest() as unlimited:
        clock[0] += 29.9
        assert not budget.out_of_time and not budget.requested
        clock[0] += 0.1
        assert budget.out_of_time and not budget.requested  # a spent budget is not a signal
        clock[0] += 1e9
        assert not unlimited.out_of_time


@pytest.mark.slow
def test_max_minutes_stops_after_the_step_that_spends_them_as_a_finished_run(
    recipe_cache, tmp_path, monkeypatch, capsys
):
    """--max-minutes 1 and a clock that passes a minute in step 3: the run returns after step 3,
    with its checkpoint and weights (none was due) and no exception; a validation due there is skipped."""
    from featurecache.training import loop

    clock = [0.0]
    monkeypatch.setattr(interrupt, "monotonic", lambda: clock[0])
    step, validations = loop.Trainer.step, []
    validate = loop._validate

    def step_spending_time(trainer, batches, number):
        if number == 2:  # 0-based: the run's step 3
            clock[0] += 61.0
        return step(trainer, batches, number)

    def counted_validate(config, world, trainer, held_out, position, run_log):
        validations.append(position.step)
        validate(config, world, trainer, held_out, position, run_log)

    monkeypatch.setattr(loop.Trainer, "step", step_spending_time)
    monkeypatch.setattr(loop, "_validate", counted_validate)
    run_dir = tmp_path / "run"
    config = tiny_config(
        recipe_cache,
        run_dir,
        steps=10,
        checkpoint_every=100,
        max_minutes=1.0,
        validate_every=3,
        validation_keys=("209d-assembly1",),
        validation_sampler_steps=2,
    )
    assert [record["step"] for record in train(config)] == [1, 2, 3]
    assert validations == [0]
    assert sorted(path.name for path in run_dir.glob("*.pt")) == ["checkpoint-00000003.pt", "weights.pt"]
    assert "--max-minutes 1 spent at step 3" in capsys.readouterr().out


def test_max_minutes_must_be_a_positive_number(recipe_cache, tmp_path):
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="--max-minutes"):
            tiny_config(recipe_cache, tmp_path / "run", max_minutes=bad)


def _from_a_terminal() -> None:
    """In the child before exec: SIGINT's default action, so Python installs KeyboardInterrupt's
    handler (a test runner started in the background may have SIGINT ignored, and children
    inherit that)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _wait_for_steps(process: subprocess.Popen, run_dir: Path, steps: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        log = run_dir / "log.jsonl"
        if log.exists() and sum(record["kind"] == "train" for record in read_log(run_dir)) >= steps:
            return
        if process.poll() is not None:
            pytest.fail(f"train ended before the signal: {process.communicate()[1][-3000:]}")
        time.sleep(0.1)
    pytest.fail(f"no {steps} steps logged in {timeout} s")


@pytest.mark.slow
@pytest.mark.parametrize("sent", [signal.SIGINT, signal.SIGTERM], ids=lambda sent: sent.name)
def test_a_signal_to_the_process_group_stops_after_a_checkpoint_that_resumes(recipe_cache, tmp_path, sent):
    """`featurecache train` with a DataLoader worker, the signal to the whole process group (as a
    terminal's Ctrl-C or a scheduler's kill): the worker ignores it, the run checkpoints the
    step it stopped at and says so in one line; --resume goes on from there."""
    run_dir = tmp_path / "run"
    command = [
        sys.executable,
        "-m",
        "featurecache.cli",
        "train",
        "--cache",
        str(recipe_cache),
        "--out",
        str(run_dir),
        "--preset",
        "tiny",
        "--kernels",
        "torch",
        "--device",
        "cpu",
        "--steps",
        "1000",
        "--crop-size",
        "16",
        "--msa-rows-per-sample",
        "8",
        "--diffusion-batch",
        "1",
        "--max-recycling-cycles",
        "1",
        "--warmup",
        "2",
        "--lr",
        "1e-3",
        "--num-workers",
        "1",
        "--checkpoint-every",
        "1000",
    ]
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])))
    # A new session: the signal goes to its process group (the DataLoader worker too), as a terminal's Ctrl-C does
    process = subprocess.Popen(
        command,
        cwd=tmp_path,
        env=env,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_from_a_terminal,
    )
    try:
        _wait_for_steps(process, run_dir, 3, timeout=120)
        os.killpg(process.pid, sent)
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert process.returncode == 128 + sent, f"exit {process.returncode}: {stderr[-3000:]}"
    assert "Traceback" not in stderr and "featurecache: interrupted" not in stderr, stderr[-3000:]
    found = re.search(
        rf"^featurecache train: interrupted at step (\d+) \({sent.name}\); checkpoint written to (\S+); "
        r"resume with --resume (\S+)$",
        stderr,
        re.MULTILINE,
    )
    assert found, stderr[-3000:]
    step, checkpoint = int(found.group(1)), Path(found.group(2))
    assert found.group(3) == found.group(2) and checkpoint == run_dir / f"checkpoint-{step:08d}.pt"
    logged = [record["step"] for record in read_log(run_dir) if record["kind"] == "train"]
    assert logged[-1] == step >= 3 and logged == list(range(1, step + 1))
    assert sorted(path.name for path in run_dir.iterdir()) == [checkpoint.name, "log.jsonl", "weights.pt"]
    assert torch.load(checkpoint, weights_only=False)["step"] == step
    assert torch.load(run_dir / "weights.pt", weights_only=True)["step"] == step

    resumed = train(tiny_config(recipe_cache, run_dir, steps=step + 2, resume=str(checkpoint)))
    assert [record["step"] for record in resumed] == [step + 1, step + 2]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _signal_after_steps(run_dir: Path, steps: int) -> None:
    """From a thread of rank 0: SIGINT to this process alone once `steps` steps are logged."""
    log = run_dir / "log.jsonl"
    while not (log.exists() and sum(line.count('"kind": "train"') for line in log.read_text().splitlines()) >= steps):
        time.sleep(0.05)
    os.kill(os.getpid(), signal.SIGINT)


def _rank(rank: int, port: int, cache: str, run_dir: str, out_dir: str) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2"
    )
    signal.signal(signal.SIGINT, signal.default_int_handler)
    torch.set_num_threads(1)
    if rank == 0:
        threading.Thread(target=_signal_after_steps, args=(Path(run_dir), 2), daemon=True).start()
    try:
        train(tiny_config(Path(cache), Path(run_dir), steps=200, checkpoint_every=1000))
        outcome = {"finished": True}
    except TrainingInterrupted as stopped:
        outcome = {"step": stopped.step, "signal": stopped.exit_code, "report": stopped.report, "text": str(stopped)}
        outcome["steps"] = [record["step"] for record in stopped.records]
    torch.save(outcome, Path(out_dir) / f"rank{rank}.pt")


@pytest.mark.slow
def test_ranks_stop_at_the_same_step_when_one_rank_gets_the_signal(recipe_cache, tmp_path):
    """Two gloo ranks; only rank 0 gets SIGINT. Both stop after the same step (the request rides
    on the step's all-reduce): a rank that stepped on alone would wait in a collective forever."""
    run_dir = tmp_path / "run"
    context = mp.spawn(_rank, args=(_free_port(), str(recipe_cache), str(run_dir), str(tmp_path)), nprocs=2, join=False)
    deadline = time.monotonic() + 120
    try:
        while not context.join(timeout=1):
            assert time.monotonic() < deadline, "the ranks did not stop together (deadlocked in a collective?)"
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
    first, second = (torch.load(tmp_path / f"rank{rank}.pt") for rank in (0, 1))
    assert "finished" not in first and "finished" not in second, (first, second)
    step = first["step"]
    assert second["step"] == step and first["steps"] == second["steps"] == list(range(1, step + 1))
    assert first["report"] and not second["report"] and first["signal"] == second["signal"] == 130
    assert "(SIGINT)" in first["text"] and "(a signal to another rank)" in second["text"]
    state = torch.load(run_dir / f"checkpoint-{step:08d}.pt", weights_only=False)
    assert state["step"] == step and state["world_size"] == 2
    assert [record["step"] for record in read_log(run_dir) if record["kind"] == "train"][-1] == step
