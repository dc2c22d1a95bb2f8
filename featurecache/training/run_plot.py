"""`featurecache plot RUN_DIR`: a training run's log.jsonl drawn as one figure.

Six panels over the optimizer step: the loss (with the validation loss where the run validated),
its terms (distogram, diffusion and the diffusion loss's parts), the validation lDDT, the step
time with the time spent waiting for data, peak memory, and the gradient norm with the learning
rate. Per-step values are noisy, so each curve is drawn faintly and its moving average over
about 1/50 of the run on top. matplotlib is imported only here (Agg backend, no display needed).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from featurecache.store.files import atomic_path
from featurecache.store.plot import log_axis

# The run's log: training/loop.py appends one JSON record a step (and one a validation) to
# RUN_DIR/log.jsonl; this module reads it. Defined here, so reading a log imports no torch.
LOG_FILE = "log.jsonl"
DEFAULT_PLOT = "training.png"
# Fields of a step record that are not loss terms (everything else numeric is one).
_NOT_LOSS_TERMS = {
    "kind",
    "step",
    "epoch",
    "loss",
    "num_cycles",
    "grad_norm",
    "lr",
    "step_time_s",
    "data_wait_s",
    "peak_memory_gb",
    "tokens",
    "atoms",
    "padded_atoms",
    "world_size",
}
# What every training-step record has (featurecache.training.loop writes them all).
_STEP_FIELDS = ("step", "loss", "step_time_s", "data_wait_s", "peak_memory_gb")
_SMOOTHING_POINTS = 50  # the moving average spans about 1/50 of the run
LOG_SPAN = 20  # a panel whose values span more than this factor gets a log axis


class RunLogError(ValueError):
    """A run folder without a readable log of training steps (the command's exit 2)."""


def read_log(run_dir: Path) -> tuple[list[dict], list[dict]]:
    """The run's training-step records and its validation records, each in step order. A resumed
    run appends the steps after its checkpoint again: the later record of a step wins. A last
    line cut short (a run killed mid-write) is left out; any other line that is not JSON is an
    error naming the file and line."""
    path = Path(run_dir) / LOG_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RunLogError(f"{run_dir}: no {LOG_FILE} (give the --out folder of a `featurecache train` run)") from None
    except (OSError, UnicodeDecodeError) as error:
        raise RunLogError(f"{path}: cannot read it ({error})") from None
    lines = text.split("\n")
    by_kind: dict[str, dict[int, dict]] = {"train": {}, "validation": {}}
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            if number == len(lines):  # no newline after it: the writer was stopped mid-line
                continue
            raise RunLogError(f"{path} line {number}: not JSON ({error.msg})") from None
        kind = record.get("kind", "train") if isinstance(record, dict) else None  # older logs have no kind
        if kind not in by_kind:
            continue
        required = _STEP_FIELDS if kind == "train" else ("step",)
        wrong = [
            name
            for name in required
            if not isinstance(record.get(name), (int, float)) or (name == "step" and not math.isfinite(record[name]))
        ]
        if wrong:
            raise RunLogError(f"{path} line {number}: a {kind} record without a number for {', '.join(wrong)}")
        by_kind[kind][int(record["step"])] = record
    if not by_kind["train"]:
        raise RunLogError(f"{path}: no training step logged yet")
    return tuple([records[step] for step in sorted(records)] for records in by_kind.values())


def read_steps(run_dir: Path) -> list[dict]:
    """The run's training-step records in step order (read_log's first list)."""
    return read_log(run_dir)[0]


def _moving_average(values: list[float], window: int) -> list[float]:
    """Mean of each value and the window - 1 before it (NaNs skipped), as long as the input."""
    averaged = []
    for index in range(len(values)):
        finite = [value for value in values[max(0, index - window + 1) : index + 1] if math.isfinite(value)]
        averaged.append(sum(finite) / len(finite) if finite else math.nan)
    return averaged


def _positive(values: list[float]) -> list[float]:
    """Values for a log axis: zero, negative and missing ones become gaps."""
    return [value if isinstance(value, (int, float)) and value > 0 else math.nan for value in values]


def _draw(axis, steps: list[int], values: list[float], window: int, color: str, label: str) -> None:
    values = _positive(values)
    if window > 1:
        axis.plot(steps, values, color=color, alpha=0.25, linewidth=0.8)
        axis.plot(steps, _moving_average(values, window), color=color, linewidth=1.6, label=label)
    else:
        axis.plot(steps, values, color=color, linewidth=1.4, marker="o", markersize=3, label=label)


def _y_scale(axis, values: list[float], unit: str) -> None:
    """A log axis when the values span more than LOG_SPAN (a first step that compiles, a loss that
    falls by orders), labelled with plain numbers (0.5, 2, 100); a linear axis otherwise."""
    positive = [value for value in _positive(values) if math.isfinite(value)]
    if positive and max(positive) > LOG_SPAN * min(positive):
        log_axis(axis, "y", min(positive), max(positive))
        unit += " (log scale)"
    axis.set_ylabel(unit)


def loss_terms(records: list[dict]) -> list[str]:
    """The loss terms the log has, in the order the first record lists them."""
    return [
        name for name, value in records[0].items() if name not in _NOT_LOSS_TERMS and isinstance(value, (int, float))
    ]


def _draw_terms(axis, records: list[dict], steps: list[int], window: int) -> None:
    """Each loss term that is ever above zero; the ones that stay at zero are named in the legend."""
    import matplotlib

    palette = matplotlib.colormaps["tab10"].colors
    drawn, zero, shown = [], [], []
    for name in loss_terms(records):
        values = [record.get(name) for record in records]
        if any(isinstance(value, (int, float)) and value > 0 for value in values):
            _draw(axis, steps, values, window, palette[len(drawn) % len(palette)], name)
            drawn.append(name)
            shown.extend(values)
        else:
            zero.append(name)
    axis.set_title("loss terms")
    _y_scale(axis, shown, "value")
    if drawn:
        bottom, top = axis.get_ylim()  # headroom above the curves for the legend
        axis.set_ylim(
            bottom,
            top * (top / bottom) ** (0.15 * math.ceil(len(drawn) / 3))
            if axis.get_yscale() == "log"
            else top + 0.15 * math.ceil(len(drawn) / 3) * (top - bottom),
        )
        axis.legend(
            fontsize=8,
            ncol=3,
            loc="upper center",
            title=f"zero throughout: {', '.join(zero)}" if zero else None,
            title_fontsize=8,
        )
    else:
        axis.set_yticks([])
        axis.text(
            0.5, 0.5, "this log has no loss terms (only the total)", ha="center", va="center", transform=axis.transAxes
        )


def _draw_validation(axis, validations: list[dict]) -> None:
    """Validation lDDT over the steps: all atoms and each molecule type that was scored."""
    names = [
        name
        for name in ("lddt", "lddt_protein", "lddt_dna", "lddt_rna", "lddt_ligand")
        if any(record.get(name) is not None for record in validations)
    ]
    if not names:
        _note(axis, "validation lDDT", "no validation in this run\n(train --validate-every N)")
        return
    for name, color in zip(names, ("black", "#3b75af", "#ef8636", "#519e3e", "#8d69b8")):
        points = [(record["step"], record[name]) for record in validations if record.get(name) is not None]
        axis.plot(
            *zip(*points),
            color=color,
            marker="o",
            markersize=3,
            linewidth=1.2,
            label="all atoms" if name == "lddt" else name.removeprefix("lddt_"),
        )
    axis.set(title="validation lDDT", ylabel="lDDT", ylim=(0, 1))
    axis.legend(fontsize=8)


def _note(axis, title: str, text: str) -> None:
    axis.set_title(title)
    axis.set_xticks([])
    axis.set_yticks([])
    axis.text(0.5, 0.5, text, ha="center", va="center", color="0.35", transform=axis.transAxes)


def plot_run(run_dir: Path, out: Path) -> Path:
    """Write the figure of `run_dir`'s log to `out` (PNG, PDF or SVG by its suffix); returns `out`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    records, validations = read_log(run_dir)
    steps = [record["step"] for record in records]
    window = max(1, len(records) // _SMOOTHING_POINTS)
    figure, axes = plt.subplots(2, 3, figsize=(16, 7.5))
    (loss, terms, validation), (timing, memory, optimizer) = axes

    losses = [record["loss"] for record in records]
    _draw(loss, steps, losses, window, "#1f4e79", "training")
    validated = [(record["step"], record["loss"]) for record in validations if record.get("loss") is not None]
    if validated:
        loss.plot(*zip(*validated), color="#c53a32", marker="o", markersize=4, linewidth=1.2, label="validation")
        loss.legend(fontsize=8)
    loss.set_title("loss")
    _y_scale(loss, losses + [value for _, value in validated], "loss")

    _draw_terms(terms, records, steps, window)
    _draw_validation(validation, validations)
    validation.set_xlim(loss.get_xlim())  # the same steps as the training panels

    step_ms = [record["step_time_s"] * 1e3 for record in records]
    wait_ms = [record["data_wait_s"] * 1e3 for record in records]
    _draw(timing, steps, step_ms, window, "#3b75af", "step")
    _draw(timing, steps, wait_ms, window, "#c53a32", "waiting for data")
    timing.set(title="step time", xlabel="step")
    _y_scale(timing, step_ms + wait_ms, "ms")
    timing.legend(fontsize=8)

    # the loop logs the GPU's peak allocation, or on the CPU the process's peak resident set
    memory.plot(steps, [record["peak_memory_gb"] for record in records], color="#519e3e", linewidth=1.4)
    memory.set(title="peak memory (GPU allocated, or process RSS on CPU)", xlabel="step", ylabel="GB", ylim=(0, None))

    norms = [record.get("grad_norm") for record in records]
    _draw(optimizer, steps, norms, window, "#7f7f7f", "gradient norm (before clipping)")
    optimizer.set(title="gradient norm and learning rate", xlabel="step")
    _y_scale(optimizer, norms, "gradient norm")
    rate = optimizer.twinx()
    rate.plot(steps, [record.get("lr", math.nan) for record in records], color="#8d69b8", linewidth=1.4)
    rate.set_ylabel("learning rate", color="#8d69b8")
    rate.set_ylim(0, None)
    rate.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:.2g}"))  # 2e-05, not an offset

    for axis in axes.flat:
        if axis.get_xticks().size:
            axis.xaxis.set_major_locator(MaxNLocator(integer=True))
            axis.grid(alpha=0.3)
    smoothing = f"; bold lines: mean of the last {window} steps" if window > 1 else ""
    figure.suptitle(f"{run_dir}: {len(records)} steps logged (last: step {steps[-1]}){smoothing}", fontsize=9)
    figure.tight_layout()
    with atomic_path(out) as partial:  # an interrupted plot leaves no half-written image
        figure.savefig(partial, dpi=110)
    plt.close(figure)
    return out
