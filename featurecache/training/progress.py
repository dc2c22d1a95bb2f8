"""What a person watching a training run sees: a progress bar in a terminal, plain lines in a log.

In a terminal (stdout a TTY) the run shows one tqdm bar: steps done, steps/s, ETA, the loss and
the share of step time spent waiting for data. Written to a file or a pipe, it prints a plain
line for the first step, every `line_every` steps and the last step, so a log stays short and
readable; log.jsonl keeps every step. Before the first step a line says what that step does
(building the model, compiling Triton kernels, capturing the CUDA graph), since it can take a
minute. With --tensorboard DIR every step's numbers also go to TensorBoard. Only the main rank
shows anything.
"""

from __future__ import annotations

import datetime
import sys
from collections import deque
from typing import TextIO

from featurecache.training.config import TrainConfig, TrainSetupError
from featurecache.training.validation import LDDT_KEYS

# Plain lines a log file gets over a whole run, besides the first and last step's.
LINES_PER_RUN = 50
# Steps the data-wait share and the ETA of the plain lines are averaged over.
RECENT_STEPS = 20
# Record fields that are not numbers to plot (TensorBoard gets the rest).
_NOT_SCALARS = ("step", "epoch", "ids", "world_size")


def first_step_work(config: TrainConfig, kernels: str) -> str:
    """What the first step does besides the step itself: the slow one-off work, in order."""
    work = [
        f"starting {config.num_workers} data worker{'s' if config.num_workers != 1 else ''}"
        if config.num_workers
        else "loading the first batch"
    ]
    if kernels == "triton":
        work.append("compiling Triton kernels")
    if config.compile:
        work.append("torch.compile compiling the trunk blocks")
    if config.cuda_graphs:
        work.append("warm-up steps, then capturing the CUDA graph")
    return ", ".join(work)


def _tensorboard_writer_class():
    """torch's SummaryWriter, or a TrainSetupError naming the option and the package to install."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise TrainSetupError(
            "--tensorboard needs the tensorboard package: pip install tensorboard "
            "(or leave --tensorboard out; log.jsonl has every step)"
        ) from None
    return SummaryWriter


class TrainProgress:
    """The bar or the plain lines, and the TensorBoard events, of one run.

    Made before the run directory (a missing tensorboard package is a setup error); `note`
    prints a status line, `begin` opens the bar before the first step, `update` takes each
    step's log record, `close` ends the bar and flushes TensorBoard.
    """

    def __init__(self, config: TrainConfig, enabled: bool = True, stream: TextIO | None = None) -> None:
        self.total_steps = config.steps
        self.enabled = enabled
        self.stream = stream if stream is not None else sys.stdout
        self.interactive = enabled and self.stream.isatty()
        self.line_every = max(1, config.steps // LINES_PER_RUN)
        self.tensorboard_dir = config.tensorboard if enabled else None
        self._writer_class = _tensorboard_writer_class() if self.tensorboard_dir else None
        self.writer = None
        self.bar = None
        self.steps_seen = 0
        self.recent: deque = deque(maxlen=RECENT_STEPS)  # (step time, data wait) of the last steps

    def note(self, text: str) -> None:
        """A status line: what the run is doing now."""
        self.write_line(f"featurecache train: {text}")

    def write_line(self, line: str) -> None:
        """A line of its own, above the bar when there is one."""
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(line, file=self.stream)
        else:
            print(line, file=self.stream, flush=True)

    def begin(self, start_step: int, work: str) -> None:
        """Before the first step of this process (`start_step` steps already done)."""
        if not self.enabled:
            return
        resumed = "resuming; " if start_step else ""
        self.note(
            f"{resumed}first step {start_step + 1}/{self.total_steps}: {work} (one-off work: later steps are quicker)"
        )
        if self._writer_class is not None:
            self.writer = self._writer_class(log_dir=self.tensorboard_dir)
        if self.interactive:
            from tqdm import tqdm

            self.bar = tqdm(
                total=self.total_steps,
                initial=start_step,
                unit="step",
                desc="train",
                file=self.stream,
                dynamic_ncols=True,
                smoothing=0.1,
            )

    def update(self, record: dict) -> None:
        """One log record (as written to log.jsonl): a training step's, or a validation pass's."""
        if not self.enabled:
            return
        if record.get("kind") == "validation":
            self._validation(record)
            return
        self.steps_seen += 1
        if self.steps_seen == 2:
            self.recent.clear()  # the first step's one-off work would skew the ETA and the data-wait share
        self.recent.append((record["step_time_s"], record["data_wait_s"]))
        self._add_scalars("train", record)
        if self.bar is not None:
            self.bar.set_postfix_str(
                f"loss {record['loss']:.4f}, data wait {self.data_wait_share():.0%}", refresh=False
            )
            self.bar.update(1)
        elif self._prints(record["step"]):
            print(self.plain_line(record), file=self.stream, flush=True)

    def _validation(self, record: dict) -> None:
        """A validation pass: one line (above the bar) with its loss and lDDT scores, and TensorBoard."""
        scores = "  ".join(f"{name} {record[name]:.3f}" for name in LDDT_KEYS if record.get(name) is not None)
        self.write_line(f"step {record['step']:>6d}  validation  loss {record['loss']:.4f}  {scores}")
        self._add_scalars("validation", record)

    def _add_scalars(self, group: str, record: dict) -> None:
        if self.writer is None:
            return
        for name, value in record.items():
            if name not in _NOT_SCALARS and isinstance(value, (int, float)) and not isinstance(value, bool):
                self.writer.add_scalar(f"{group}/{name}", value, record["step"])

    def data_wait_share(self) -> float:
        """Share of the recent steps' time spent waiting for a batch."""
        step_time = sum(step for step, _ in self.recent)
        return sum(wait for _, wait in self.recent) / step_time if step_time > 0 else 0.0

    def plain_line(self, record: dict) -> str:
        mean_step = sum(step for step, _ in self.recent) / len(self.recent)
        eta = datetime.timedelta(seconds=round(mean_step * (self.total_steps - record["step"])))
        return (
            f"step {record['step']:>6d}/{self.total_steps}  loss {record['loss']:.4f}  "
            f"cycles {record['num_cycles']}  step {record['step_time_s'] * 1e3:8.1f} ms  "
            f"data wait {record['data_wait_s'] * 1e3:7.1f} ms ({self.data_wait_share():.0%})  "
            f"peak {record['peak_memory_gb']:.2f} GB  eta {eta}"
        )

    def _prints(self, step: int) -> bool:
        return step % self.line_every == 0 or step == self.total_steps or self.steps_seen == 1

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        if self.writer is not None:
            self.writer.close()
            self.writer = None
