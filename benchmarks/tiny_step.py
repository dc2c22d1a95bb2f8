"""The fixed per-step cost of a small model: training steps of a preset (default `tiny`) on a real
cache, through the objects `featurecache train` builds (TrainConfig, the cache's DataLoader, the
Trainer and its step), timed on the host clock with the process's peak resident set.

    python3 benchmarks/tiny_step.py --cache /tmp/fc-cache [--crop 384] [--steps 3] [--record]
    python3 benchmarks/tiny_step.py --cache /tmp/fc-cache --threads 1 --profile 25  # the 25 costliest operators
    python3 benchmarks/tiny_step.py --cache /tmp/fc-cache --memory 15     # the 15 largest tensors at the peak
    python3 benchmarks/tiny_step.py --cache /tmp/fc-cache --threads 1 --modules 3  # CPU time by module, 3 names deep
    python3 benchmarks/tiny_step.py --cache /tmp/fc-cache --threads 1 --variant before=/work/main  # side by side
    python3 benchmarks/tiny_step.py --cache /tmp/fc-cache --device cuda --cuda-graphs --steps 20 --kernel-profile 5

Each step is timed on the host clock (its data wait apart) and in CPU seconds of the process
(user + system, all threads: on a machine shared with other work the CPU time is the steadier
figure; an idle 2-core machine runs the step in between CPU/2 and CPU seconds of wall time); the
peak RSS is the process's (ru_maxrss, what the loop logs as peak_memory_gb on the CPU), read
after each step. With --device cuda the step runs on the Triton kernels (with --cuda-graphs
replayed as CUDA graphs, as `featurecache train --cuda-graphs`), is timed after a synchronize,
and its peak is the GPU memory allocated; --kernel-profile STEPS then shows the kernels a step
(how many, how many are launch-bound, which cost most). The featurecache package measured is
this checkout's (harness.py puts it first on sys.path).

With --variant NAME=CHECKOUT, the same steps run first on another checkout's featurecache package
(a child process of this script with FC_PACKAGE_ROOT=CHECKOUT, on the same cache and settings;
the package it imported is checked), then on this one: one table, one row each, recorded as variant NAME (with that checkout's commit) and
"torch". With --profile, one more step runs under OperatorTimes (this thread's CPU time per
operator and output shape; torch.profiler's events for one step outgrow 23 GB at crop 384), and
the costliest are printed. With --memory, one more step runs under a dispatch mode that follows
every tensor the step makes (bytes of its storage, from its creation until its Python object is
freed): the peak of the bytes alive and the largest tensors alive at that moment, with the
operator that made each. The CPU is shared: compare ratios measured in one run.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import weakref

import harness
import torch
from harness import Table, argument_parser
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

import featurecache
from featurecache.config import SampleConfig
from featurecache.training import TrainConfig
from featurecache.training.config import resolve_kernels
from featurecache.training.data import to_device
from featurecache.training.distributed import setup_distributed
from featurecache.training.loop import Trainer

try:
    from featurecache.training.allocator import reexecute_with_tcmalloc
except ImportError:  # a --variant checkout older than the allocator switch: the allocator it inherits
    reexecute_with_tcmalloc = None

# the label of this checkout's rows, by the kernels its device runs (a --variant names the other
# checkout's): the PyTorch path on the CPU, the Triton kernels on CUDA
OURS = {"cpu": "torch", "cuda": "triton"}


def allocator() -> str:
    """The malloc this process runs on: what LD_PRELOAD names (tcmalloc where `featurecache
    train` preloads it, training/allocator.py), else the system's."""
    preloaded = os.environ.get("LD_PRELOAD", "").strip()
    return pathlib.Path(preloaded.split(":")[0]).name.split(".so")[0] if preloaded else "system"


def memory_metric(device: str) -> str:
    return "peak GPU memory GB" if device == "cuda" else "peak RSS GB"


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def peak_memory_gb(device: str) -> float:
    """The process's peak RSS on the CPU; on a GPU the peak of the tensors allocated there."""
    return torch.cuda.max_memory_allocated() / 1e9 if device == "cuda" else peak_rss_gb()


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6


def build(args, out: pathlib.Path) -> tuple[Trainer, object]:
    """The Trainer and batch iterator `featurecache train --cache ... --preset ...` builds."""
    sample = SampleConfig(crop_size=args.crop, msa_rows_per_sample=args.msa_rows)
    model_settings = {"max_recycling_cycles": args.cycles}
    if args.diffusion_batch is not None:  # otherwise the preset's
        model_settings["diffusion_batch"] = args.diffusion_batch
    for setting in args.setting:
        name, _, value = setting.partition("=")
        model_settings[name] = json.loads(value)
    config = TrainConfig(
        cache=str(args.cache),
        out=str(out),
        preset=args.preset,
        kernels="torch" if args.device == "cpu" else "auto",
        steps=args.steps + 3 + args.kernel_profile,
        num_workers=0,
        device=args.device,
        cuda_graphs=args.cuda_graphs,
        sample=sample,
        model_settings=model_settings,
    )
    world = setup_distributed(args.device)
    loader = harness.training_loader(config, world)
    # the kernels `featurecache train` resolves for this device (Triton on CUDA): before 2026-12-06
    # this passed "torch", so every --device cuda row measured the PyTorch path
    trainer = Trainer(config, resolve_kernels(config.kernels, world.device), world)
    trainer.start()
    # on the device as the training loop hands them to the step (without CUDA graphs the step reads
    # them in place; before 2026-12-06 an eager --device cuda step failed on host tensors)
    return trainer, (to_device(batch, world.device) for batch in loader)


class OperatorTimes(TorchDispatchMode):
    """CPU time of this thread (time.thread_time: steady on a shared machine) spent in each
    operator, by operator and output shape, summed as the step runs: constant memory, unlike
    torch.profiler's events. Run with one thread (--threads 1): an operator's other threads are
    not counted."""

    def __init__(self) -> None:
        super().__init__()
        self.seconds: dict[tuple[str, tuple], list[float]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        started = time.thread_time()
        output = func(*args, **(kwargs or {}))
        spent = time.thread_time() - started
        first = next((t for t in tree_leaves(output) if isinstance(t, torch.Tensor)), None)
        entry = self.seconds.setdefault((str(func), tuple(first.shape) if first is not None else ()), [0.0, 0])
        entry[0] += spent
        entry[1] += 1
        return output


def profile_step(trainer: Trainer, batch: dict, step: int, top: int) -> None:
    times = OperatorTimes()
    with times:
        trainer.step([batch], step)
    total = sum(seconds for seconds, _ in times.seconds.values())
    calls = sum(count for _, count in times.seconds.values())
    print(f"\n{calls} operator calls, {total:.1f} s of CPU in them; the costliest (operator, output shape):")
    table = Table(["CPU s", "share", "calls", "operator", "output shape"])
    for (op, shape), (seconds, count) in sorted(times.seconds.items(), key=lambda item: -item[1][0])[:top]:
        table.add([seconds, f"{100 * seconds / total:.1f} %", count, op, str(list(shape))])
    print(table.markdown())


class LiveTensors(TorchDispatchMode):
    """Bytes of the tensors made under it that are still referenced, their peak, and which were
    alive at the peak. A storage is counted once (views of it are not new bytes), from the first
    tensor made on it until that tensor's Python object is freed: a view that outlives its base
    is missed, so the figure is a lower bound of what the step holds."""

    def __init__(self) -> None:
        super().__init__()
        self.alive: dict[int, tuple[int, str, tuple]] = {}
        self.bytes = self.peak = 0
        self.at_peak: list[tuple[int, str, tuple]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        output = func(*args, **(kwargs or {}))
        for tensor in tree_leaves(output):
            if not isinstance(tensor, torch.Tensor) or tensor.device.type != "cpu":
                continue
            storage = tensor.untyped_storage()
            key, size = storage.data_ptr(), storage.nbytes()
            if size == 0 or key in self.alive:
                continue
            self.alive[key] = (size, str(func), tuple(tensor.shape))
            self.bytes += size
            weakref.finalize(tensor, self._freed, key)
            if self.bytes > self.peak:
                self.peak = self.bytes
                self.at_peak = list(self.alive.values())
        return output

    def _freed(self, key: int) -> None:
        size, _, _ = self.alive.pop(key)
        self.bytes -= size


class ModuleTimes(TorchDispatchMode):
    """CPU time of this thread per module, `depth` names deep ("trunk.pairformer"), forward and
    backward apart, attributed by flops.py's PartTracker: in forward the module running, in
    backward the module whose forward made the autograd node running (a checkpoint's re-run in
    backward counts as its module's backward); the mini-rollout as one part."""

    def __init__(self, tracker) -> None:
        super().__init__()
        self.tracker = tracker
        self.seconds: dict[str, list[float]] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        started = time.thread_time()
        output = func(*args, **(kwargs or {}))
        spent = time.thread_time() - started
        tracker = self.tracker
        if torch._C._current_autograd_node() is None:
            key = "forward " + tracker.part()
        else:
            key = "backward " + (tracker.part() if tracker.stack or tracker.in_rollout else tracker.backward_part)
        entry = self.seconds.setdefault(key, [0.0, 0])
        entry[0] += spent
        entry[1] += 1
        return output


def module_step(trainer: Trainer, batch: dict, step: int, depth: int) -> None:
    from flops import PartTracker

    model = trainer.model
    tracker = PartTracker(model, part_of=lambda name: ".".join(name.split(".")[:depth]) or "(model)")
    times = ModuleTimes(tracker)
    with tracker.active(model), times:
        trainer.step([batch], step)
    total = sum(seconds for seconds, _ in times.seconds.values())
    print(f"\n{total:.1f} s of CPU in operators, by module ({depth} names deep):")
    table = Table(["CPU s", "share", "calls", "where"])
    for key, (seconds, count) in sorted(times.seconds.items(), key=lambda item: -item[1][0]):
        if seconds >= 0.005 * total:
            table.add([seconds, f"{100 * seconds / total:.1f} %", count, key])
    print(table.markdown())


def memory_step(trainer: Trainer, batch: dict, step: int, top: int) -> None:
    tracker = LiveTensors()
    with tracker:
        trainer.step([batch], step)
    print(
        f"\npeak of the tensors the step made, alive at once: {tracker.peak / 1e9:.2f} GB; the largest then "
        "(tensors of one operator and shape together):"
    )
    groups: dict[tuple[str, tuple], list[int]] = {}
    for size, op, shape in tracker.at_peak:
        groups.setdefault((op, shape), []).append(size)
    table = Table(["MB", "tensors", "made by", "shape"])
    for (op, shape), sizes in sorted(groups.items(), key=lambda item: -sum(item[1]))[:top]:
        table.add([sum(sizes) / 1e6, len(sizes), op, str(list(shape))])
    print(table.markdown())


# A kernel this short is launch-bound: its time is mostly the GPU's fixed cost per kernel.
SHORT_KERNEL_US = 5.0


def kernel_profile(trainer: Trainer, batches, first_step: int, steps: int, top: int = 25) -> None:
    """`steps` more steps under torch.profiler with the GPU's activity: kernels a step, their
    summed time against the wall time, how many are shorter than SHORT_KERNEL_US and what they
    cost, and the kernels with the most time. Inside CUDA graphs each replayed kernel still shows."""
    from torch.profiler import ProfilerActivity, profile

    batch_list = [next(batches) for _ in range(steps)]
    sync("cuda")
    started = time.perf_counter()
    with profile(activities=[ProfilerActivity.CUDA]) as profiler:
        for index, batch in enumerate(batch_list):
            trainer.step([batch], first_step + index)
        sync("cuda")
    wall_ms = (time.perf_counter() - started) * 1e3 / steps
    kernels = [event for event in profiler.events() if event.device_type == torch.autograd.DeviceType.CUDA]
    if not kernels:
        print(f"\n{steps} steps on the GPU: {wall_ms:.1f} ms wall a step; the profiler saw no kernel (graph replays")
        print("hidden from it on this driver?): run it again without --cuda-graphs for the kernels")
        return
    durations = [event.device_time for event in kernels]  # microseconds
    short = [duration for duration in durations if duration < SHORT_KERNEL_US]
    print(
        f"\n{steps} steps on the GPU: {wall_ms:.1f} ms wall a step, {sum(durations) / 1e3 / steps:.1f} ms of "
        f"kernels a step ({len(kernels) / steps:.0f} kernels a step; {len(short) / steps:.0f} of them under "
        f"{SHORT_KERNEL_US:g} us, {sum(short) / 1e3 / steps:.1f} ms a step)"
    )
    by_name: dict[str, list[float]] = {}
    for event in kernels:
        entry = by_name.setdefault(event.name[:90], [0.0, 0])
        entry[0] += event.device_time
        entry[1] += 1
    table = Table(["ms a step", "share", "calls a step", "mean us", "kernel"])
    total = sum(durations) or 1.0
    for name, (micro, count) in sorted(by_name.items(), key=lambda item: -item[1][0])[:top]:
        table.add([micro / 1e3 / steps, f"{100 * micro / total:.1f} %", count / steps, micro / count, name])
    print(table.markdown())


def gpu_operator_profile(trainer: Trainer, batch: dict, step: int, top: int) -> None:
    """One more eager step under torch.profiler with the host's operators and their input shapes:
    the operators whose kernels take the most GPU time, each with the shapes it was called on
    (a graphed step's kernels have no operator to name: this is where they come from)."""
    from torch.profiler import ProfilerActivity, profile

    sync("cuda")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as profiler:
        trainer.step([batch], step)
        sync("cuda")
    averages = profiler.key_averages(group_by_input_shape=True)
    total = sum(event.self_device_time_total for event in averages) or 1.0
    table = Table(["GPU ms (self)", "share", "calls", "operator", "input shapes"])
    for event in sorted(averages, key=lambda event: -event.self_device_time_total)[:top]:
        table.add(
            [
                event.self_device_time_total / 1e3,
                f"{100 * event.self_device_time_total / total:.1f} %",
                event.count,
                event.key,
                str(event.input_shapes)[:110],
            ]
        )
    print(f"\none eager step: {total / 1e3:.1f} ms of kernels, by operator and input shapes")
    print(table.markdown())


def graph_state(trainer: Trainer) -> tuple | None:
    """How many backward graphs the trainer holds, how many are captured, and whether its update
    is: a step that leaves this unchanged, all captured, only replayed graphs."""
    graphed = trainer.graphed
    if graphed is None:
        return None
    steps = graphed.backward_steps.values()
    return len(steps), sum(step.is_captured for step in steps), graphed.apply.is_captured


def is_replay(before: tuple | None, after: tuple | None) -> bool:
    return before is not None and before == after and before[0] == before[1] and before[2]


def timed(values: list[float], replays: list[bool]) -> list[float]:
    """The timed steps: the replays where there are any, else every step after the first."""
    replayed = [value for value, replay in zip(values, replays) if replay]
    return replayed or values[1:] or values


def run_steps(args, label: str) -> dict:
    """One untimed step and args.steps timed ones (then the --profile and --memory steps): the
    figures of one table row."""
    commit = harness.git_commit()  # the code imported now, whatever is committed while the steps run
    with tempfile.TemporaryDirectory() as out:
        trainer, batches = build(args, pathlib.Path(out))
        times, cpu_times, peaks, replays = [], [], [], []
        for step in range(args.steps + 1):
            waited = time.perf_counter()
            batch = next(batches)
            wait = time.perf_counter() - waited
            graphs_before = graph_state(trainer)
            started, cpu_started = time.perf_counter(), time.process_time()
            trainer.step([batch], step)
            sync(args.device)
            times.append(time.perf_counter() - started)
            cpu_times.append(time.process_time() - cpu_started)
            peaks.append(peak_memory_gb(args.device))
            replays.append(is_replay(graphs_before, graph_state(trainer)))
            print(
                f"{label} step {step}: {times[-1]:.2f} s{' (replay)' if replays[-1] else ''}, "
                f"CPU {cpu_times[-1]:.2f} s (data {wait:.2f} s), "
                f"peak {'GPU memory' if args.device == 'cuda' else 'RSS'} {peaks[-1]:.2f} GB, "
                f"{int(batch['token_pad_mask'].sum())} tokens, "
                f"{batch['atom_pad_mask'].shape[1]} atoms ({batch['id']})",
                flush=True,
            )
        if args.kernel_profile:
            kernel_profile(trainer, batches, args.steps + 1, args.kernel_profile)
        if args.gpu_operators:
            gpu_operator_profile(trainer, next(batches), args.steps + 1, args.gpu_operators)
        if args.profile:
            profile_step(trainer, next(batches), args.steps + 1, args.profile)
        if args.modules:
            module_step(trainer, next(batches), args.steps + 3, args.modules)
        if args.memory:
            memory_step(trainer, next(batches), args.steps + 2, args.memory)
    return {
        "diffusion batch": trainer.model.config.diffusion.diffusion_batch,
        "threads": torch.get_num_threads(),
        # with CUDA graphs the steps that only replayed (a bucket's warm-up and capture steps are
        # eager and slow); else every step after the first
        "step s": statistics.median(timed(times, replays)),
        "step CPU s": statistics.median(timed(cpu_times, replays)),
        "replayed steps": sum(replays),
        "first step s": times[0],
        memory_metric(args.device): max(peaks),
        "load average": os.getloadavg()[0],
        "allocator": allocator(),
        "commit": commit,
        "package": str(pathlib.Path(featurecache.__file__).resolve().parent),
    }


def refuse(message: str) -> None:
    """A bad --variant: one line and exit status 2, as for any bad option."""
    print(f"tiny_step.py: {message}", file=sys.stderr)
    sys.exit(2)


def checkout_commit(checkout: pathlib.Path) -> str:
    """The commit of a checkout: its git HEAD where it is a repository's top level; for an
    exported tree (`git archive COMMIT featurecache`, as carried to a device inside another
    checkout) the commit named in its COMMIT file; else ''."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=checkout, capture_output=True, text=True, check=False).stdout.strip()

    top = git("rev-parse", "--show-toplevel")
    if top and pathlib.Path(top).resolve() == checkout:
        return git("rev-parse", "--short", "HEAD")
    named = checkout / "COMMIT"
    return named.read_text().strip() if named.is_file() else ""


def run_variant(name: str, checkout: pathlib.Path, argv: list[str]) -> dict:
    """This script's steps on the featurecache package of `checkout`, in a child process."""
    if not (checkout / "featurecache" / "__init__.py").is_file():
        refuse(f"--variant {name}={checkout}: no featurecache package there")
    commit = checkout_commit(checkout)
    env = dict(os.environ, FC_PACKAGE_ROOT=str(checkout), FC_COMMIT=commit or "unknown")
    with tempfile.NamedTemporaryFile(suffix=".json") as result:
        child = [sys.executable, __file__, *argv, "--label", name, "--result-json", result.name]
        if subprocess.run(child, env=env, check=False).returncode != 0:
            refuse(f"--variant {name}={checkout}: its run failed (its output is above)")
        run = json.loads(pathlib.Path(result.name).read_text())
    if not pathlib.Path(run["package"]).is_relative_to(checkout):
        refuse(f"--variant {name}={checkout}: its run imported featurecache from {run['package']}, not from there")
    return run


def child_argv(argv: list[str]) -> list[str]:
    """The command line without --variant, --record and the extra profiles (and their values)."""
    drop, kept, skip = {"--variant", "--record", "--profile", "--modules", "--memory", "--gpu-operators"}, [], False
    for word in argv:
        if skip:
            skip = False
        elif word in drop:
            skip = word != "--record"
        elif not any(word.startswith(option + "=") for option in drop):
            kept.append(word)
    return kept


def main() -> None:
    parser = argument_parser(__doc__)
    parser.add_argument("--cache", type=pathlib.Path, required=True)
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--crop", type=int, default=384)
    parser.add_argument("--msa-rows", type=int, default=SampleConfig.msa_rows_per_sample)
    parser.add_argument("--diffusion-batch", type=int, help="default: the preset's (tiny: 4)")
    parser.add_argument("--cycles", type=int, default=1, help="--max-recycling-cycles (N_cycle drawn from 1..this)")
    parser.add_argument("--steps", type=int, default=3, help="timed steps after one untimed")
    parser.add_argument(
        "--setting",
        action="append",
        default=[],
        metavar="NAME=JSON",
        help="a model setting by name, e.g. checkpoint_blocks=false (repeatable)",
    )
    parser.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's, one per core)")
    parser.add_argument(
        "--device", choices=["cpu", "cuda"], default="cpu", help="cuda: the Triton kernels (kernels auto)"
    )
    parser.add_argument(
        "--cuda-graphs", action="store_true", help="replay each step as CUDA graphs (with --device cuda)"
    )
    parser.add_argument(
        "--kernel-profile",
        type=int,
        default=0,
        metavar="STEPS",
        help="with --device cuda: STEPS more steps under torch.profiler, kernels a step and the costliest",
    )
    parser.add_argument(
        "--gpu-operators",
        type=int,
        default=0,
        metavar="TOP",
        help="with --device cuda, without --cuda-graphs: one more step under torch.profiler, the TOP "
        "operators by their kernels' GPU time, with their input shapes",
    )
    parser.add_argument(
        "--profile", type=int, default=0, metavar="TOP", help="profile one more step, print TOP operators"
    )
    parser.add_argument(
        "--modules",
        type=int,
        default=0,
        metavar="DEPTH",
        help="profile one more step by module, names DEPTH deep (forward and backward apart)",
    )
    parser.add_argument(
        "--memory",
        type=int,
        default=0,
        metavar="TOP",
        help="one more step under LiveTensors: the peak and the TOP largest tensors at it",
    )
    parser.add_argument(
        "--variant",
        metavar="NAME=CHECKOUT",
        help="first run the same steps on another checkout's featurecache (e.g. before=/work/main), side by side",
    )
    parser.add_argument(
        "--label", help="this run's variant name in its output (default: torch on the CPU, triton on CUDA)"
    )
    parser.add_argument("--result-json", type=pathlib.Path, help="write this run's figures here (for --variant)")
    args = parser.parse_args()
    if args.device == "cpu" and (args.cuda_graphs or args.kernel_profile):
        parser.error("--cuda-graphs and --kernel-profile need --device cuda")
    if args.gpu_operators and (args.device != "cuda" or args.cuda_graphs):
        parser.error("--gpu-operators needs --device cuda without --cuda-graphs (a replayed graph names no operator)")
    args.label = args.label or OURS[args.device]
    if reexecute_with_tcmalloc is not None:  # the allocator `featurecache train` runs on
        reexecute_with_tcmalloc()  # (FEATURECACHE_ALLOCATOR=system: the system's)
    variant = None
    if args.variant:
        name, separator, checkout = args.variant.partition("=")
        if not (name and separator and checkout) or name == args.label:
            parser.error(f"--variant {args.variant!r}: expected NAME=CHECKOUT with a NAME other than {args.label!r}")
        variant = (name, pathlib.Path(checkout).resolve())
    if args.threads:
        torch.set_num_threads(args.threads)
    stamp = harness.run_stamp()
    runs = {}
    if variant is not None:
        runs[variant[0]] = run_variant(*variant, child_argv(sys.argv[1:]))
    runs[args.label] = run_steps(args, args.label)
    if args.result_json:
        args.result_json.write_text(json.dumps(runs[args.label]))
        return
    columns = ["variant", "commit", "preset", "crop", "diffusion batch", "threads", "step s (median of timed)"]
    columns += ["replayed steps"] if args.cuda_graphs else []
    memory = memory_metric(args.device)
    columns += ["step CPU s", "first step s", memory, "allocator", "load average (1 min)"]
    table = Table(columns)
    for label, run in runs.items():
        table.add(
            [label, run["commit"], args.preset, args.crop, run["diffusion batch"], run["threads"], run["step s"]]
            + ([run["replayed steps"]] if args.cuda_graphs else [])
            + [run["step CPU s"], run["first step s"], run[memory], run["allocator"], run["load average"]]
        )
    print(f"\n{stamp.header()}\n\n{table.markdown()}")
    if args.record:
        from records import Row, append_rows, record

        ours = runs[args.label]
        shape = (
            f"{args.preset}, crop {args.crop}, diffusion batch {ours['diffusion batch']}, "
            f"N_cycle {args.cycles}, "
            + (f"{ours['threads']} threads" if args.device == "cpu" else "CUDA graphs" if args.cuda_graphs else "eager")
        )
        rows = {
            label: [Row("tiny_step", label, shape, metric, run[metric]) for metric in ("step s", "step CPU s", memory)]
            for label, run in runs.items()
        }
        if variant is not None:  # its own commit, this run's date: the headline pairs rows of one date
            append_rows(dataclasses.replace(stamp, commit=runs[variant[0]]["commit"]), rows[variant[0]])
        beside = f", side by side with {variant[0]} ({variant[1]})" if variant is not None else ""
        section = (
            f"### {shape}, {stamp.date}, {stamp.device}, commit {stamp.commit}\n\n"
            f"`featurecache train`'s objects on a real cache (median of {args.steps} steps after one; with "
            f"CUDA graphs of the steps that only replayed; the data wait apart){beside}.\n\n"
            f"{table.markdown()}"
        )
        record(stamp, rows[args.label], "tiny_step", section, title="The tiny preset's step on the CPU")


if __name__ == "__main__":
    main()
