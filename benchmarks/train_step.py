"""Training-step benchmark of the AF3 trunk, or of the full AF3 model (`--model af3`: atom
inputs, trunk, the diffusion batch and every loss): featurecache's Triton kernels vs PyTorch eager
vs torch.compile of the PyTorch path, in one run.

    python3 benchmarks/train_step.py --out results/ [--depth 8] [--cache DIR --online DIR ...] [--record]
    python3 benchmarks/train_step.py --model af3 --depth 48 --crop 384 768 --block-lengths --record
    python3 benchmarks/train_step.py --model af3 --depth 48 --crop 384 768 --block-lengths --variants protenix triton+graphs
    python3 benchmarks/train_step.py --smoke --depth 1 --block-lengths 16 --budget-s 120   # a CPU check
    python3 benchmarks/train_step.py --smoke --model af3 --depth 1 --crop 24 --diffusion-batch 2 --msa-rows 8 \
        --templates 1 --block-lengths --no-checks --budget-s 1200   # CPU (TRITON_INTERPRET=1 for triton variants)
    python3 benchmarks/train_step.py ... --merge earlier/train_step.json   # fill this run's table from an earlier run

benchmarks/device_plan.sh runs it on the H200 in three calls (`smoke` there runs those calls at
tiny sizes on the CPU). The protenix variant runs in a child process of this script: a CUDA fault
in its kernels spoils only that process's CUDA context, and its numbers join this run's table.

Sections (each one is skipped, with the reason in the table, when the time budget runs out):

1. one Pairformer block (c_s 384, c_z 128, bf16 autocast, 10 % padding, no checkpointing),
   forward + backward at L = 384 and 768: the issue's reference table;
2. a whole training iteration (forward, loss, backward, AdamW) of the `af3` preset at each
   --crop, with its Pairformer cut to --depth blocks to fit the device time: the trunk with the
   distogram loss, or with `--model af3` the full model (N_cycle 1, --diffusion-batch noised
   copies, --atoms-per-token atoms) preceded by two checks on the device: every parameter gets a
   non-zero gradient, and the triton and torch paths give the same fp32 loss from the same weights;
   the variant `protenix` trains Protenix 2.0's own model, loss and optimizer at the same sizes
   (benchmarks/protenix_peer.py), skipped with the reason where protenix is not installed;
3. the largest crop (multiples of --crop-step, from --crop-start) that trains without running out
   of memory, per variant, with --crop-checkpoint-group Pairformer blocks per checkpoint,
   bounded by time: a crop whose predicted time (cubic in L) exceeds the budget is not tried,
   and the result is then a lower bound, marked ">=";
4. the share of step time spent waiting for data, reading the cache vs featurizing online,
   through the real training loop (featurecache.training) with DataLoader workers.

The table is printed last and written, with every number, to OUT/train_step.json and
OUT/train_step.md.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import math
import os
import pathlib
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback

import protenix_peer
import torch
from harness import argument_parser, run_stamp
from records import Row, record

from featurecache.kernels.evo_attention import SizeLimitError
from featurecache.model import AF3Model, AF3Trunk, preset
from featurecache.model.pairformer import PairformerBlock
from featurecache.testing.synthetic import random_batch
from featurecache.training.cuda_graph import CapturedStep

VARIANTS = {
    # name: (kernels, torch.compile the blocks, replay the step as a CUDA graph)
    "triton": ("triton", False, False),
    "eager": ("torch", False, False),
    "compile": ("torch", True, False),
    # the kernels plus torch.compile of the glue around them (norms, gates, residual adds)
    "triton+compile": ("triton", True, False),
    # the kernels, the whole step captured once and replayed (featurecache.training.cuda_graph): no host
    # launch cost; shapes must stay fixed, so this variant has no crop search
    "triton+graphs": ("triton", False, True),
}
# Peers: another project's model at the same sizes (--model af3 only), trained by its own code
# (benchmarks/protenix_peer.py); no block section, no crop search (about 10 s a step).
PEERS = ("protenix",)
COLUMNS = (*VARIANTS, *PEERS)
# torch.compile's backend for the compiled variants (--compile-backend): aot_eager checks the
# tracing where inductor's C++ compilation takes many minutes (a CPU shared by several jobs)
COMPILE = {"backend": "inductor"}


def is_compiled(variant: str) -> bool:
    return variant in VARIANTS and VARIANTS[variant][1]


def peer_unavailable(variant: str, model: str) -> str | None:
    """Why the peer cannot run here (one line), or None."""
    if model != "af3":
        return "a full-model peer: needs --model af3"
    return protenix_peer.unavailable_reason()


class Budget:
    def __init__(self, seconds: float) -> None:
        self.deadline = time.perf_counter() + seconds

    def left(self) -> float:
        return self.deadline - time.perf_counter()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_gb(device: torch.device) -> float:
    return torch.cuda.max_memory_allocated(device) / 1e9 if device.type == "cuda" else float("nan")


def total_memory_gb(device: torch.device) -> float:
    return torch.cuda.get_device_properties(device).total_memory / 1e9 if device.type == "cuda" else float("inf")


def free_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def autocast(device: torch.device, cache: bool = True):
    # A captured step must not use autocast's cache of cast weights (its tensors outlive the graph).
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda", cache_enabled=cache)


def timed(step, device: torch.device, warmup: int, reps: int, graphs: bool = False) -> tuple[float, float]:
    """Median milliseconds of `step` after warm-up, and the peak memory (GB) of one call.

    A captured step allocates its memory once, during capture in the first warm-up call, and
    replays reuse it: for it (`graphs`) the peak counts from before the warm-up."""
    if graphs:
        reset_peak(device)
    for _ in range(warmup):
        step()
    sync(device)
    if not graphs:
        reset_peak(device)
    step()
    sync(device)
    peak = peak_gb(device)
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        step()
        sync(device)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times), peak


# --- 1. one Pairformer block ---------------------------------------------------------------------


def block_step(variant: str, length: int, dims: dict, device: torch.device):
    """A Pairformer block of `variant` on fp32 inputs of length L (10 % padding): its fwd+bwd step."""
    kernels, compiled, graphs = VARIANTS[variant]
    block = PairformerBlock(dims["c_s"], dims["c_z"], dims["single_heads"], dims["single_head_dim"],
                            dims["pair_heads"], dims["pair_head_dim"], 4, kernels=kernels).to(device)
    if compiled:
        block.compile(**COMPILE)
    generator = torch.Generator(device=device).manual_seed(length)
    s = torch.randn(1, length, dims["c_s"], device=device, generator=generator, requires_grad=True)
    z = torch.randn(1, length, length, dims["c_z"], device=device, generator=generator, requires_grad=True)
    token_mask = torch.arange(length, device=device)[None] < math.ceil(0.9 * length)  # 10 % padding
    pair_mask = token_mask[:, :, None] & token_mask[:, None, :]
    grad_s = torch.randn_like(s)
    grad_z = torch.randn_like(z)

    def step(inputs: dict | None = None) -> dict:
        s_in, z_in = (s, z) if inputs is None else (inputs["s"], inputs["z"])
        s_in.grad = z_in.grad = None
        block.zero_grad(set_to_none=True)
        with autocast(device, cache=not graphs):
            s_out, z_out = block(s_in, z_in, token_mask, pair_mask)
        torch.autograd.backward([s_out, z_out], [grad_s.to(s_out.dtype), grad_z.to(z_out.dtype)])
        return {}

    if graphs:
        # Captured at the first call, inside timed(): the capture's allocations then count
        # toward the peak (a replay allocates nothing new, so a peak reset after capture would
        # see only the inputs and weights).
        captured = CapturedStep(step, warmup_steps=2)

        def replay() -> None:
            while not captured.is_captured:  # the first call warms up and captures
                captured({"s": s, "z": z})
            captured({"s": s, "z": z})

        return replay
    return step


def bench_block(variant: str, length: int, dims: dict, device: torch.device, warmup: int, reps: int) -> dict:
    ms, peak = timed(block_step(variant, length, dims, device), device, warmup, reps, graphs=VARIANTS[variant][2])
    return {"ms": ms, "peak_gb": peak}


def profile_block(variant: str, length: int, dims: dict, device: torch.device) -> dict:
    """Where one block's fwd+bwd spends device time: the top operators by their own CUDA time,
    and device time against wall time (a gap means the host, not the GPU, sets the pace)."""
    from torch.profiler import ProfilerActivity, profile

    step = block_step(variant, length, dims, device)
    for _ in range(3):
        step()
    sync(device)
    steps = 3
    start = time.perf_counter()
    activity = ProfilerActivity.CUDA if device.type == "cuda" else ProfilerActivity.CPU
    with profile(activities=[activity]) as prof:
        for _ in range(steps):
            step()
        sync(device)
    wall_ms = (time.perf_counter() - start) * 1e3 / steps
    # Host time to enqueue one step (no sync inside it): when it is close to the wall time, the
    # host sets the pace and fewer launches, not faster kernels, would help.
    host_ms = []
    for _ in range(steps):
        sync(device)
        started = time.perf_counter()
        step()
        host_ms.append((time.perf_counter() - started) * 1e3)
    sync(device)
    own = (lambda e: e.self_device_time_total) if device.type == "cuda" else (lambda e: e.self_cpu_time_total)
    events = sorted((e for e in prof.key_averages() if own(e) > 0), key=own, reverse=True)
    device_ms = sum(own(e) for e in events) / 1e3 / steps
    kernels = sum(e.count for e in events) // steps
    top = [(e.key[:90], round(own(e) / 1e3 / steps, 3), e.count // steps) for e in events[:45]]
    print(f"    wall {wall_ms:.2f} ms, device {device_ms:.2f} ms, host enqueue {statistics.median(host_ms):.2f} ms,"
          f" {kernels} kernels per step", flush=True)
    for name, ms, count in top:
        print(f"    {ms:8.3f} ms  x{count:<4d} {name}", flush=True)
    return {"wall_ms_profiled": wall_ms, "device_ms": device_ms, "host_enqueue_ms": statistics.median(host_ms),
            "kernels_per_step": kernels, "top": top}


# --- 2. and 3. whole training iterations -----------------------------------------------------------


class TrunkRunner:
    """One model and optimizer per variant, reused across crop sizes (compiled graphs too)."""

    atoms_per_token = 2

    def __init__(self, variant: str, config_overrides: dict, device: torch.device) -> None:
        kernels, compiled, self.graphs = VARIANTS[variant]
        self.device = device
        self.model = self.build(preset("af3", kernels=kernels, **config_overrides)).to(device)
        if compiled:
            # dynamic shapes from the start: the crop search must not recompile per size
            self.model.compile_blocks(dynamic=True, **COMPILE)
        self.model.train()
        # capturable: the step counter lives on the GPU, so the update can be replayed
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-4, capturable=self.graphs)
        self.captured: dict = {}

    def build(self, config) -> torch.nn.Module:
        return AF3Trunk(config)

    def batch(self, length: int, msa_rows: int, templates: int) -> dict:
        generator = torch.Generator().manual_seed(length)
        batch = random_batch([length], [msa_rows], [templates], generator, num_atoms_per_token=self.atoms_per_token)
        return {k: v.to(self.device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}

    def forward_loss(self, batch: dict) -> torch.Tensor:
        with autocast(self.device, cache=not self.graphs):
            outputs = self.model(batch)
        return self.model.loss(batch, outputs)

    def step(self, batch: dict) -> dict:
        loss = self.forward_loss(batch)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 10.0)
        self.optimizer.step()
        return {"loss": loss}

    def iteration(self, batch: dict) -> None:
        if self.graphs:
            tensors = {k: v for k, v in batch.items() if isinstance(v, torch.Tensor)}
            others = {k: v for k, v in batch.items() if not isinstance(v, torch.Tensor)}
            shapes = tuple((k, tuple(v.shape)) for k, v in tensors.items())
            if shapes not in self.captured:
                # one size at a time: an earlier size's graph and memory pool would count in this
                # size's peak (the step table measures 384, then 768)
                self.captured.clear()
                free_memory()
                self.captured[shapes] = CapturedStep(lambda inputs: self.step({**inputs, **others}), warmup_steps=2)
            graph = self.captured[shapes]
            while not graph.is_captured:  # the first call at a size warms up and captures
                graph(tensors)
            loss = graph(tensors)["loss"]
        else:
            loss = self.step(batch)["loss"]
        if not torch.isfinite(loss):
            raise FloatingPointError(f"non-finite loss {loss.item()}")

    def fits(self, length: int, msa_rows: int, templates: int) -> tuple[bool, float, float]:
        """One iteration at `length`: (fits in memory, seconds, peak GB)."""
        free_memory()
        reset_peak(self.device)
        start = time.perf_counter()
        try:
            self.iteration(self.batch(length, msa_rows, templates))
            sync(self.device)
        except (torch.cuda.OutOfMemoryError, SizeLimitError) as error:
            if isinstance(error, SizeLimitError):
                print(f"    L={length}: {error}", flush=True)
            self.optimizer.zero_grad(set_to_none=True)
            free_memory()
            return False, time.perf_counter() - start, float("nan")
        return True, time.perf_counter() - start, peak_gb(self.device)


def max_crop(runner: TrunkRunner, start: int, limit: int, msa_rows: int, templates: int,
             budget_s: float, step: int = 64) -> dict:
    """Largest multiple of `step` in [start, limit] that trains: doubling, then bisection; when
    `start` itself runs out of memory, one step down at a time (a start is a guess near the
    limit). A trial the time budget stops (SIGALRM) ends the search with what it found."""
    deadline = time.perf_counter() + budget_s
    capacity_gb = total_memory_gb(runner.device)
    tried: list = []
    good = bad = stopped = None
    last_time = last_peak = 0.0

    def affordable(length: int) -> bool:
        if good is None:  # nothing fitted yet: the last trial's time is the estimate
            return time.perf_counter() + last_time < deadline
        # Peak memory grows at least as L² (the pair): past the device's memory the trial is a
        # sure OOM, and an OOM fails within the first oversized block, long before a full step.
        if last_peak * (length / good) ** 2 > capacity_gb:
            return True
        # compute is cubic in L (triangle updates)
        predicted = last_time * (length / good) ** 3
        return time.perf_counter() + predicted < deadline

    def trial(candidate: int) -> bool:
        """Train one iteration at `candidate` if time allows; False when it does not."""
        nonlocal good, bad, last_time, last_peak, stopped
        if stopped is not None or (tried and not affordable(candidate)):
            return False
        try:
            ok, last_time, peak = runner.fits(candidate, msa_rows, templates)
        except OutOfTime:
            stopped = candidate
            return False
        tried.append((candidate, ok))
        if ok:
            good, last_peak = candidate, peak
        else:
            bad = candidate
        return True

    trial(start)
    while good is None and bad is not None and bad - step >= step and trial(bad - step):
        pass
    while good is not None and bad is None and good < limit and trial(min(limit, good * 2)):
        pass
    while good is not None and bad is not None and bad - good > step and trial((good + bad) // 2 // step * step):
        pass
    exact = good is not None and bad is not None and bad - good <= step
    found = {"max_crop": good, "bound": "exact" if exact else ">=", "first_oom": bad, "tried": tried}
    if good is None:
        found["bound"] = "none fits"
    if stopped is not None:
        found["stopped_at"] = stopped  # the time budget ended this trial
    return found


class FullModelRunner(TrunkRunner):
    """The full AF3 model: N_cycle 1 (as peers report their step), the diffusion batch of
    `diffusion_batch` noised copies drawn from the default generator (a CUDA graph replays it)."""

    def __init__(self, variant: str, config_overrides: dict, device: torch.device, diffusion_batch: int,
                 atoms_per_token: int) -> None:
        self.atoms_per_token = atoms_per_token
        self.diffusion_batch = diffusion_batch
        super().__init__(variant, config_overrides, device)

    def build(self, config) -> torch.nn.Module:
        return AF3Model(config)

    def forward_loss(self, batch: dict) -> torch.Tensor:
        with autocast(self.device, cache=not self.graphs):
            outputs = self.model(batch, num_cycles=1, num_diffusion_samples=self.diffusion_batch)
        return self.model.loss(batch, outputs)[0]


def full_model_checks(config_overrides: dict, device: torch.device, length: int, diffusion_batch: int,
                      atoms_per_token: int) -> dict:
    """On the device, before timing: (1) one bf16 step of the triton model leaves no parameter
    without a gradient (None or all zero); (2) from the same weights, batch and random draws, the
    triton and torch paths give the same fp32 loss terms (relative difference per term)."""
    torch.manual_seed(0)
    models = {kernels: AF3Model(preset("af3", kernels=kernels, **config_overrides)).to(device)
              for kernels in ("triton", "torch")}
    models["torch"].load_state_dict(models["triton"].state_dict())
    generator = torch.Generator().manual_seed(length)
    batch = random_batch([length], [64], [2], generator, num_atoms_per_token=atoms_per_token)
    batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    model = models["triton"]
    with autocast(device):
        outputs = model(batch, num_cycles=2, num_diffusion_samples=diffusion_batch,
                        generator=torch.Generator(device).manual_seed(1))
    loss, _ = model.loss(batch, outputs)
    loss.backward()
    dead = [name for name, p in model.named_parameters()
            if p.requires_grad and (p.grad is None or not bool(p.grad.abs().sum() > 0))]
    terms = {}
    for kernels, model in models.items():
        model.zero_grad(set_to_none=True)
        outputs = model(batch, num_cycles=1, num_diffusion_samples=diffusion_batch,
                        generator=torch.Generator(device).manual_seed(2))
        _, metrics = model.loss(batch, outputs)
        terms[kernels] = {name: float(value) for name, value in metrics.items()}
    differences = {name: abs(terms["triton"][name] - terms["torch"][name]) / max(abs(terms["torch"][name]), 1e-12)
                   for name in terms["torch"]}
    del models, outputs, loss
    free_memory()
    return {"parameters": sum(p.numel() for p in model.parameters() if p.requires_grad), "dead_parameters": dead,
            "loss_fp32": terms, "relative_difference": differences,
            "max_relative_difference": max(differences.values())}


def profile_full_step(runner: FullModelRunner, batch: dict, device: torch.device, out: pathlib.Path) -> dict:
    """One profiled iteration after a warm one: forward time of each top-level part (CUDA events
    around each child module's calls) and the top CUDA operators (written to OUT/profile_step.txt)."""
    runner.iteration(batch)
    sync(device)
    spans: dict = {}
    handles = []
    for name, module in runner.model.named_children():
        def before(_module, _args, name=name):
            spans.setdefault(name, []).append([torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)])
            spans[name][-1][0].record()

        def after(_module, _args, _output, name=name):
            spans[name][-1][1].record()

        handles += [module.register_forward_pre_hook(before), module.register_forward_hook(after)]
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.profiler.profile(activities=activities) as profiler:
        start.record()
        runner.iteration(batch)
        stop.record()
        sync(device)
    for handle in handles:
        handle.remove()
    averages = profiler.key_averages()
    text = averages.table(sort_by="cuda_time_total", row_limit=30)
    (out / "profile_step.txt").write_text(text)
    print(text, flush=True)
    device_ms = sum(e.self_device_time_total for e in averages) / 1e3
    forward = {name: {"ms": sum(a.elapsed_time(b) for a, b in calls), "calls": len(calls)} for name, calls in spans.items()}
    return {"wall_ms_profiled": start.elapsed_time(stop), "device_ms": device_ms, "forward_ms": forward}


# --- 4. data wait through the training loop --------------------------------------------------------


def data_wait_share(args, device: torch.device, source: str, kernels: str) -> dict:
    from featurecache.config import SampleConfig
    from featurecache.training import TrainConfig, train

    # the run's final checkpoint is large: keep it out of OUT
    run_dir = tempfile.mkdtemp(prefix=f"train-step-{source}-")
    common = dict(out=run_dir, preset="af3", pairformer_blocks=args.depth, kernels=kernels, steps=args.data_steps,
                  sample=SampleConfig(crop_size=args.crop[0], msa_rows_per_sample=args.msa_rows),
                  num_workers=args.num_workers, checkpoint_every=10**9, warmup=10, lr=1e-4, device=device.type,
                  cuda_graphs=args.data_graphs)
    if args.smoke:
        common.update(preset="tiny", pairformer_blocks=1)
    if source == "cache":
        config = TrainConfig(cache=args.cache, **common)
    else:
        config = TrainConfig(online=args.online, alignments=args.alignments, template_dir=args.template_dir,
                             **common)
    records = train(config)
    # The first epoch (three targets, three steps) starts the workers and compiles the kernels
    # for each new length: left out, as a long run pays it once. With CUDA graphs, so is the
    # step that captures the graph (the fourth).
    captured_at = 4 if args.data_graphs else 0
    steady = [r for r in records if r["epoch"] > 0 and r["step"] > captured_at]
    wait = sum(r["data_wait_s"] for r in steady)
    total = sum(r["step_time_s"] for r in steady)
    # Steps that are not the first of their epoch (where a per-epoch loader would restart workers).
    inside = [r for previous, r in zip(records, records[1:])
              if r["epoch"] == previous["epoch"] and r["epoch"] > 0 and r["step"] > captured_at]
    inside_wait = sum(r["data_wait_s"] for r in inside)
    inside_total = sum(r["step_time_s"] for r in inside)
    return {"share": wait / total, "wait_ms": 1e3 * wait / len(steady), "step_ms": 1e3 * total / len(steady),
            "steps": len(steady), "share_within_epoch": inside_wait / inside_total if inside else None,
            "steps_within_epoch": len(inside), "kernels": kernels, "cuda_graphs": args.data_graphs}


# --- driver ---------------------------------------------------------------------------------------


class OutOfTime(Exception):
    pass


def _out_of_time(signum, frame):
    raise OutOfTime()


def run_section(results: dict, key: str, budget: Budget, reserve_s: float, function, *args) -> None:
    """Run one measurement; record its result, OOM, error, or the time budget that stopped it.

    A SIGALRM at the end of the budget interrupts a section that overruns (torch.compile can take
    minutes), so the run always ends with its table written.
    """
    if budget.left() < reserve_s:
        results[key] = {"skipped": f"time budget ({budget.left():.0f} s left)"}
        print(f"[skip] {key}: time budget", flush=True)
        return
    start = time.perf_counter()
    signal.signal(signal.SIGALRM, _out_of_time)
    signal.setitimer(signal.ITIMER_REAL, max(1.0, budget.left()))
    try:
        results[key] = function(*args)
    except OutOfTime:
        results[key] = {"skipped": f"stopped by the time budget after {time.perf_counter() - start:.0f} s"}
    except torch.cuda.OutOfMemoryError:
        results[key] = {"oom": True}
    except Exception as error:  # one broken variant must not lose the others' numbers
        if budget.left() <= 1.0:  # the alarm, wrapped by the code it interrupted (dynamo does)
            results[key] = {"skipped": f"stopped by the time budget after {time.perf_counter() - start:.0f} s"}
        else:
            results[key] = {"error": f"{type(error).__name__}: {error}"}
            traceback.print_exc()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    free_memory()
    print(f"[{time.perf_counter() - start:6.1f} s] {key}: {results[key]}", flush=True)


def cell(result: dict | None, fmt) -> str:
    if result is None:
        return "-"
    for flag in ("skipped", "error"):
        if flag in result:
            return f"{flag}: {str(result[flag])[:60]}"
    if result.get("oom"):
        return "OOM"
    return fmt(result)


def ratio(numerator, denominator) -> str:
    try:
        return f"{numerator / denominator:.2f}x"
    except (TypeError, ZeroDivisionError, KeyError):
        return "-"


def table(results: dict, args) -> str:
    names = {"triton": "triton", "eager": "eager", "compile": "torch.compile",
             "triton+compile": "triton + compiled glue", "triton+graphs": "triton + CUDA graph",
             "protenix": "Protenix 2.0"}
    # (numerator variant, denominator variant): "a vs b" is b's time over a's
    comparisons = [("triton", "eager"), ("triton", "compile"), ("triton+graphs", "eager"), ("triton+graphs", "compile"),
                   ("triton", "protenix"), ("triton+graphs", "protenix")]
    blank = " |" * len(comparisons)
    rows = ["| measure | " + " | ".join(names[v] for v in COLUMNS) + " | "
            + " | ".join(f"{names[a]} vs {names[b]}" for a, b in comparisons) + " |",
            "| --- |" + " --- |" * (len(COLUMNS) + len(comparisons))]

    def get(key, field):
        value = results.get(key, {})
        return value.get(field) if isinstance(value, dict) else None

    def time_row(label, prefix):
        cells = [cell(results.get(f"{prefix}/{v}"), lambda r: f"{r['ms']:.1f} ms / {r['peak_gb']:.1f} GB")
                 for v in COLUMNS]
        speed = [ratio(get(f"{prefix}/{b}", "ms"), get(f"{prefix}/{a}", "ms")) + " faster" for a, b in comparisons]
        rows.append(f"| {label} | {' | '.join(cells)} | {' | '.join(speed)} |")
        memory = [ratio(get(f"{prefix}/{b}", "peak_gb"), get(f"{prefix}/{a}", "peak_gb")) + " less"
                  for a, b in comparisons]
        rows.append(f"| {label}: memory |{' |' * len(COLUMNS)} {' | '.join(memory)} |")

    for length in args.block_lengths:
        time_row(f"Pairformer block fwd+bwd, L={length}", f"block{length}")
    for crop in args.crop:
        time_row(f"training iteration, {model_label(args)}, crop {crop}", f"step{crop}")
    def largest(r: dict) -> str:
        if r["max_crop"] is None:  # nothing fitted: below the smallest crop that ran out of memory
            return f"< {r['first_oom']}" if r["first_oom"] else f"stopped at {r.get('stopped_at')}"
        return f"{'' if r['bound'] == 'exact' else '>= '}{r['max_crop']}"

    crops = [cell(results.get(f"maxcrop/{v}"), largest) for v in COLUMNS]
    longer = [ratio(get(f"maxcrop/{a}", "max_crop"), get(f"maxcrop/{b}", "max_crop")) for a, b in comparisons]
    rows.append(f"| largest crop without OOM, {search_label(args)} | {' | '.join(crops)} | {' | '.join(longer)} |")
    checks = results.get("checks")
    if isinstance(checks, dict) and "max_relative_difference" in checks:
        rows.append(f"| checks: {checks['parameters'] / 1e6:.1f} M parameters, {len(checks['dead_parameters'])} without "
                    f"gradient; triton vs torch fp32 loss terms, largest relative difference "
                    f"{checks['max_relative_difference']:.2e} |{' |' * len(COLUMNS)}{blank}")
    elif checks is not None:
        rows.append(f"| checks | {cell(checks, str)} |{' |' * (len(COLUMNS) - 1)}{blank}")
    for key, value in results.items():
        if key.startswith("profile/") and "forward_ms" in value:
            parts = ", ".join(f"{name} {v['ms']:.0f} ms ({v['calls']}x)" for name, v in value["forward_ms"].items())
            rows.append(f"| {key}: device time {value['device_ms']:.0f} ms of {value['wall_ms_profiled']:.0f} ms wall; "
                        f"forward by part: {parts} |{' |' * len(COLUMNS)}{blank}")
        elif key.startswith("profile/") and "device_ms" in value:
            rows.append(f"| {key}: device time {value['device_ms']:.1f} ms of {value['wall_ms_profiled']:.1f} ms wall, "
                        f"host enqueue {value['host_enqueue_ms']:.1f} ms, {value['kernels_per_step']} kernels "
                        f"|{' |' * len(COLUMNS)}{blank}")
    peer = results.get("peer")
    if isinstance(peer, dict):
        rows.append(f"| Protenix: {peer['parameters_millions']:.1f} M parameters; kernels: "
                    + "; ".join(f"{k} {v}" for k, v in peer["kernel_options"].items())
                    + f"; {peer['settings']} |{' |' * len(COLUMNS)}{blank}")
    for merged in results.get("merged", []):
        rows.append(f"| cells from an earlier run ({merged}) |{' |' * len(COLUMNS)}{blank}")
    for source in ("cache", "online"):
        result = results.get(f"datawait/{source}")
        rows.append(f"| data wait share, {source} | "
                    + cell(result, lambda r: f"{100 * r['share']:.2f} % ({r['wait_ms']:.0f} of {r['step_ms']:.0f} ms); "
                           f"within epochs {100 * (r['share_within_epoch'] or 0):.2f} % ({r['kernels']} kernels)")
                    + " |" * len(COLUMNS) + blank)
    return "\n".join(rows)


def model_label(args) -> str:
    if args.model == "af3":
        return f"full AF3 depth {args.depth}, diffusion batch {args.diffusion_batch}"
    return f"af3 depth {args.depth}"


def search_label(args) -> str:
    group = f", checkpoint_group {args.crop_checkpoint_group}" if args.crop_checkpoint_group != 1 else ""
    return f"{model_label(args)}{group}, steps of {args.crop_step}"


def csv_rows(results: dict, args) -> list[Row]:
    """Every measured number of the run, keyed as the table's rows are."""
    rows = []
    for key, result in results.items():
        kind, _, variant = key.partition("/")
        if not isinstance(result, dict) or not variant or kind == "profile":
            continue
        if kind.startswith("block") and "ms" in result:
            shape = f"Pairformer block L={kind[len('block'):]}"
            rows += [Row("train_step", variant, shape, "fwd+bwd ms", result["ms"]),
                     Row("train_step", variant, shape, "peak GB", result["peak_gb"])]
        elif kind.startswith("step") and "ms" in result:
            shape = f"training iteration, {model_label(args)}, crop {kind[len('step'):]}"
            rows += [Row("train_step", variant, shape, "iteration ms", result["ms"]),
                     Row("train_step", variant, shape, "peak GB", result["peak_gb"])]
        elif kind == "maxcrop" and result.get("max_crop") is not None:
            metric = "largest crop" if result["bound"] == "exact" else "largest crop, at least"
            rows.append(Row("train_step", variant, search_label(args), metric,
                            result["max_crop"]))
        elif kind == "datawait" and "share" in result:
            shape = f"af3 depth {args.depth}, crop {args.crop[0]}, {args.num_workers} workers"
            rows.append(Row("train_step", variant, shape, "data wait %", 100 * result["share"]))
    return rows


def crop_start(args, variant: str) -> int:
    """Where `variant`'s crop search starts: its VARIANT=CROP item of --crop-start, else a plain
    CROP item, else the first --crop."""
    starts = dict(item.rpartition("=")[::2] for item in args.crop_start)
    return int(starts.get(variant, starts.get("", args.crop[0])))


def peer_in_child(args, seconds: float) -> dict:
    """The protenix variant run by this script in a child process (--peer-in-process): a CUDA
    fault in its kernels (sticky for the whole CUDA context, seen on the H200) or a crash then
    cannot reach the other variants, and its memory is gone before theirs is built. Returns its
    result keys (step<crop>/protenix, peer), an error per crop the child did not report."""
    out = pathlib.Path(tempfile.mkdtemp(prefix="train-step-peer-"))
    argv = [sys.executable, os.path.abspath(__file__), "--peer-in-process", "--variants", "protenix",
            "--model", args.model, "--depth", str(args.depth), "--crop", *map(str, args.crop),
            "--diffusion-batch", str(args.diffusion_batch), "--atoms-per-token", str(args.atoms_per_token),
            "--msa-rows", str(args.msa_rows), "--templates", str(args.templates), "--peer-reps", str(args.peer_reps),
            "--block-lengths", "--no-checks", "--crop-budget-s", "0", "--budget-s", f"{seconds:.0f}",
            "--out", str(out), *(["--smoke"] if args.smoke else [])]
    try:
        status = subprocess.run(argv, timeout=seconds + 60, check=False).returncode
    except subprocess.TimeoutExpired:
        status = "killed at its time limit"
    try:
        child = json.loads((out / "train_step.json").read_text())
    except (OSError, ValueError):
        child = {}
    found = {key: value for key, value in child.items() if key == "peer" or key.endswith("/protenix")}
    for crop in args.crop:
        found.setdefault(f"step{crop}/protenix", {"error": f"its child process ended first (exit status {status})"})
    return found


def with_earlier_runs(results: dict, paths: list[pathlib.Path]) -> dict:
    """`results` with the cells it lacks (absent or skipped) taken from earlier runs' JSON files,
    the first file that measured a cell winning; "merged" lists each run and the cells taken."""
    view, merged = dict(results), []
    for path in paths:
        earlier = json.loads(path.read_text())
        taken = [key for key, value in earlier.items()
                 if ("/" in key or key in ("peer", "checks")) and isinstance(value, dict) and "skipped" not in value
                 and (not isinstance(view.get(key), dict) or "skipped" in view[key])]
        view.update({key: earlier[key] for key in taken})
        if taken:
            run = ", ".join(str(earlier.get(field)) for field in ("date", "device", "commit"))
            merged.append(f"{run}: {', '.join(taken)}")
    if merged:
        view["merged"] = merged
    return view


def main() -> None:
    parser = argument_parser(__doc__)
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path(os.environ.get("OUT", "bench-out")))
    parser.add_argument("--depth", type=int, default=8, help="Pairformer blocks of the af3 trunk (paper: 48)")
    parser.add_argument("--model", choices=("trunk", "af3"), default="trunk",
                        help="trunk + distogram, or the full AF3 model (diffusion batch, every loss)")
    parser.add_argument("--crop", type=int, nargs="+", default=[384], help="crop sizes of the iteration section")
    parser.add_argument("--diffusion-batch", type=int, default=48, help="--model af3: noised copies per step (AF3: 48)")
    parser.add_argument("--step-reps", type=int, default=5, help="timed iterations per variant and crop")
    parser.add_argument("--step-warmup", type=int, default=2,
                        help="untimed iterations before them (a CUDA graph warms up and captures in the first)")
    parser.add_argument("--atoms-per-token", type=int, default=8, help="--model af3: atoms per polymer token")
    parser.add_argument("--msa-rows", type=int, default=1024)
    parser.add_argument("--templates", type=int, default=4)
    parser.add_argument("--block-lengths", type=int, nargs="*", default=[384, 768])
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(COLUMNS),
                        help="order within the cheap (no compile) and costly (compile) groups; protenix "
                             "(--model af3) trains Protenix 2.0 at the same sizes: put it first, so no other "
                             "variant's model is in memory during its steps")
    parser.add_argument("--peer-reps", type=int, default=3, help="timed iterations of a peer (about 10 s each)")
    parser.add_argument("--crop-limit", type=int, default=3072, help="largest crop the search tries")
    parser.add_argument("--crop-start", nargs="*", default=[], metavar="[VARIANT=]CROP",
                        help="first crop the search tries, for every variant or one (default: the first --crop)")
    parser.add_argument("--crop-step", type=int, default=64, help="the search's crops are multiples of this")
    parser.add_argument("--crop-checkpoint-group", type=int, default=1,
                        help="the model's checkpoint_group (Pairformer blocks per activation checkpoint) in the "
                             "crop search only; the step and data-wait sections keep the preset's 1")
    parser.add_argument("--crop-budget-s", type=float, default=45.0,
                        help="time per variant for the crop search (0: no search)")
    parser.add_argument("--budget-s", type=float, default=360.0, help="whole-run time budget")
    parser.add_argument("--first-step-s", type=float, default=150.0,
                        help="time a variant's first crop needs left to start when it compiles: the first Triton "
                             "variant (cold cache on a fresh machine) and torch.compile variants; else 20 s")
    parser.add_argument("--peer-budget-s", type=float,
                        help="time for the protenix variant, run in a child process (its CUDA faults stay there); "
                             "default: the run's time left")
    parser.add_argument("--peer-in-process", action="store_true",
                        help="run the protenix variant in this process (what the child process does)")
    parser.add_argument("--merge", type=pathlib.Path, nargs="*", default=[],
                        help="train_step.json files of earlier runs (same device kind): their numbers fill the "
                             "table's cells this run does not measure, so the ratios span both runs")
    parser.add_argument("--cache", help="feature cache for the data-wait measurement")
    parser.add_argument("--online", help="raw mmCIF folder for the online data-wait measurement")
    parser.add_argument("--alignments")
    parser.add_argument("--template-dir")
    parser.add_argument("--data-steps", type=int, default=21)
    parser.add_argument("--data-kernels", choices=("auto", "triton", "torch"), default="auto",
                        help="kernels of the data-wait runs (auto: triton if it stepped in this run, else torch)")
    parser.add_argument("--data-graphs", action="store_true",
                        help="measure the data wait with the loop's --cuda-graphs (the fastest step, so the largest share)")
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--profile-block", action="store_true",
                        help="profile the Triton block at the first block length (top CUDA operators)")
    parser.add_argument("--no-checks", action="store_true", help="--model af3: leave out the on-device checks")
    parser.add_argument("--profile-step", action="store_true",
                        help="--model af3: profile one triton iteration at the first crop (forward time per part)")
    parser.add_argument("--blocks-only", action="store_true",
                        help="only the Pairformer block section (and the profile), for a short device call")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on any device: checks the script runs")
    parser.add_argument("--compile-backend", default="inductor",
                        help="torch.compile backend of the compiled variants (aot_eager: a quick CPU check)")
    args = parser.parse_args()
    if args.smoke and args.record:
        parser.error("--record with --smoke: a smoke run's numbers are not measurements")
    for item in args.crop_start:
        name, _, value = item.rpartition("=")
        if name not in ("", *VARIANTS) or not value.isdigit():
            parser.error(f"--crop-start {item}: expected CROP or VARIANT=CROP, VARIANT one of {', '.join(VARIANTS)}")
    if args.crop_checkpoint_group < 1 or args.crop_step < 1:
        parser.error("--crop-checkpoint-group and --crop-step must be at least 1")
    for path in args.merge:
        try:
            json.loads(path.read_text())
        except (OSError, ValueError) as error:
            parser.error(f"--merge {path}: not a readable train_step.json ({type(error).__name__})")

    COMPILE["backend"] = args.compile_backend
    budget = Budget(args.budget_s)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dims = dict(c_s=384, c_z=128, single_heads=16, single_head_dim=24, pair_heads=4, pair_head_dim=32)
    overrides = dict(num_pairformer_blocks=args.depth)
    warmup, reps = 3, 10
    if args.smoke:
        dims = dict(c_s=32, c_z=16, single_heads=2, single_head_dim=8, pair_heads=2, pair_head_dim=8)
        overrides = {k: v for k, v in dataclasses.asdict(preset("tiny")).items() if k != "kernels"}
        overrides["num_pairformer_blocks"] = args.depth
        warmup, reps = 1, 2
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = run_stamp()
    results: dict = {**dataclasses.asdict(stamp), "args": {k: str(v) for k, v in vars(args).items()}}
    print(stamp.header(), flush=True)

    # Cheapest and most important first: when the budget runs out, torch.compile (minutes of
    # compilation) is what is left out, and the table says so.
    fast = [v for v in args.variants if not is_compiled(v)]
    slow = [v for v in args.variants if is_compiled(v)]
    runners: dict = {}

    def make_runner(variant: str, config: dict = overrides) -> TrunkRunner | protenix_peer.ProtenixPeer:
        if variant == "protenix":
            peer = protenix_peer.ProtenixPeer(device, args.depth, args.diffusion_batch, args.atoms_per_token,
                                              small=args.smoke, first_length=args.crop[0])
            results["peer"] = {"parameters_millions": peer.parameters_millions(),
                               "kernel_options": peer.kernel_options, "settings": peer.settings()}
            return peer
        if args.model == "af3":
            return FullModelRunner(variant, config, device, args.diffusion_batch, args.atoms_per_token)
        return TrunkRunner(variant, config, device)

    def step_bench(variant: str, crop: int) -> dict:
        if variant not in runners:
            # one model at a time: another variant's weights and optimizer state would count in
            # this one's peak memory (the crop search builds its runner anew)
            for other in [v for v in runners if v != variant]:
                runners.pop(other)
            free_memory()
            runners[variant] = make_runner(variant)
        runner = runners[variant]
        batch = runner.batch(crop, args.msa_rows, args.templates)
        peer = variant in PEERS  # its first call at a size also autotunes its Triton kernel
        ms, peak = timed(lambda: runner.iteration(batch), device, 1 if args.smoke or peer else args.step_warmup,
                         2 if args.smoke else args.peer_reps if peer else args.step_reps, graphs=runner.graphs)
        return {"ms": ms, "peak_gb": peak}

    def crop_search(variant: str) -> dict:
        runner = runners.pop(variant, None) if args.crop_checkpoint_group == 1 else None
        runners.clear()  # no other model in memory while searching
        free_memory()
        runner = runner or make_runner(variant, {**overrides, "checkpoint_group": args.crop_checkpoint_group})
        share = min(args.crop_budget_s, max(0.0, budget.left() - 30))
        found = max_crop(runner, crop_start(args, variant), args.crop_limit, args.msa_rows, args.templates,
                         share, args.crop_step)
        return {**found, "checkpoint_group": runner.model.config.checkpoint_group}  # as the model was built

    trunk = preset("af3", **overrides)
    header = (f"{stamp.header()}; {'tiny (smoke)' if args.smoke else 'af3'} "
              f"{'full model (diffusion batch ' + str(args.diffusion_batch) + ')' if args.model == 'af3' else 'trunk'} with "
              f"{trunk.num_pairformer_blocks} Pairformer blocks, {trunk.num_msa_blocks} MSA blocks "
              f"({args.msa_rows} rows), {trunk.num_template_blocks} template blocks ({args.templates} templates)")

    def write_results() -> None:
        (args.out / "train_step.json").write_text(json.dumps(results, indent=1, default=str))
        (args.out / "train_step.md").write_text(header + "\n\n" + table(with_earlier_runs(results, args.merge), args)
                                                + "\n")

    def finish() -> None:
        """The table (with earlier runs' cells) written, printed last, and recorded with --record."""
        write_results()
        view = with_earlier_runs(results, args.merge)
        text = table(view, args)
        print()
        print(header)
        print(text, flush=True)
        if args.record:
            command = f"`python3 benchmarks/train_step.py {' '.join(sys.argv[1:])}`"
            # results.csv: this run's numbers only (an earlier run recorded its own)
            record(stamp, csv_rows(results, args), "train_step", f"### Run of {header}\n\n{command}\n\n{text}\n",
                   "Training step")

    def section(key: str, reserve_s: float, function, *section_args) -> None:
        run_section(results, key, budget, reserve_s, function, *section_args)
        write_results()  # after every section: a run cut short still returns what it measured

    def out_of_time() -> None:
        # SIGALRM cannot interrupt a main thread blocked in C (seen: torch.compile on the H200,
        # run 1): end the process here, with the table of what was measured.
        results["stopped"] = "watchdog: time budget exceeded"
        finish()
        os._exit(3)

    watchdog = threading.Timer(max(1.0, budget.left()) + 20.0, out_of_time)
    watchdog.daemon = True
    watchdog.start()

    # Blocks first, while no trunk (model, optimizer state, captured graphs) is alive: the
    # block's peak memory would otherwise include them (run 4 read 3.3 GB at L = 384 that way,
    # 1.8 GB alone).
    for length in args.block_lengths:
        for variant in [v for v in fast if v in VARIANTS]:
            section(f"block{length}/{variant}", 15, bench_block, variant, length, dims, device, warmup, reps)
    if "triton" in fast and args.profile_block:
        section(f"profile/block{args.block_lengths[0]}/triton", 15, profile_block, "triton", args.block_lengths[0],
                dims, device)
    if args.model == "af3" and not args.blocks_only and not args.no_checks:
        section("checks", 30, full_model_checks, overrides, device, min(args.crop[0], 128), 4, args.atoms_per_token)
    if args.model == "af3" and args.profile_step and device.type == "cuda":
        runners["triton"] = make_runner("triton")
        section("profile/step/triton", 30, profile_full_step, runners["triton"],
                runners["triton"].batch(args.crop[0], args.msa_rows, args.templates), device, args.out)
    def step_reserve(variant: str, crop: int) -> float:
        """Time left that a step section needs to start: a variant's first crop compiles when it is
        the first Triton variant to step (a cold cache on a fresh machine) or uses torch.compile."""
        if args.smoke or crop != args.crop[0] or variant not in VARIANTS:
            return 20
        triton_stepped = any("ms" in results.get(f"step{c}/{v}", {}) for v in VARIANTS for c in args.crop
                             if VARIANTS[v][0] == "triton")
        compiles = is_compiled(variant) or (VARIANTS[variant][0] == "triton" and not triton_stepped)
        return args.first_step_s if compiles else 20

    for variant in fast:
        reason = peer_unavailable(variant, args.model) if variant in PEERS else None
        if variant in PEERS and not reason and not args.peer_in_process and not args.blocks_only:
            runners.clear()  # the child needs the device's memory
            free_memory()
            seconds = min(args.peer_budget_s or math.inf, budget.left() - 10)
            if seconds < 60:
                reason = f"time budget ({budget.left():.0f} s left)"
            else:
                results.update(peer_in_child(args, seconds))
                write_results()
                continue
        for crop in [] if args.blocks_only else args.crop:
            if reason:
                results[f"step{crop}/{variant}"] = {"skipped": reason}
                print(f"[skip] step{crop}/{variant}: {reason}", flush=True)
            else:
                section(f"step{crop}/{variant}", step_reserve(variant, crop), step_bench, variant, crop)
        if variant in PEERS:  # not searched: free its model for the next variant
            runners.pop(variant, None)
            free_memory()
    # the fastest path that ran: the share of waiting depends on the step time
    ran = [v for v in ("triton", "eager") if "ms" in results.get(f"step{args.crop[0]}/{v}", {})]
    data_kernels = args.data_kernels if args.data_kernels != "auto" else VARIANTS[ran[0]][0] if ran else "torch"
    for source, option in (("cache", args.cache), ("online", args.online)):
        if option and not args.blocks_only:
            section(f"datawait/{source}", 20, data_wait_share, args, device, source, data_kernels)
    for variant in fast:
        stepped = "ms" in results.get(f"step{args.crop[0]}/{variant}", {})
        searched = args.crop_budget_s > 0 and variant in VARIANTS and not VARIANTS[variant][2]  # graphs: per size
        if stepped and searched:
            section(f"maxcrop/{variant}", 20, crop_search, variant)
        runners.pop(variant, None)
        free_memory()
    for variant in slow:
        for length in args.block_lengths:
            section(f"block{length}/{variant}", 15, bench_block, variant, length, dims, device, warmup, reps)
        for crop in [] if args.blocks_only else args.crop:
            section(f"step{crop}/{variant}", step_reserve(variant, crop), step_bench, variant, crop)
        if variant in runners and args.crop_budget_s > 0:
            section(f"maxcrop/{variant}", 20, crop_search, variant)
        runners.pop(variant, None)
        free_memory()

    watchdog.cancel()
    finish()  # also when no section ran (every variant skipped)


if __name__ == "__main__":
    main()
