"""Training loop for the AF3 structure model (trunk + diffusion): one process, or DDP under torchrun.

    featurecache train --cache DIR --preset tiny --steps 100 --out runs/tiny
    torchrun --nproc-per-node 8 -m featurecache.training --cache DIR --preset af3 --out runs/af3

A run checks everything it was given (device, kernels, cache, checkpoint) before it creates its
run directory, then steps until `steps`. Each step draws N_cycle (1..max_recycling_cycles, the
same on every rank) and, per micro-batch (`accumulate` of them per step and rank, gradients
summed and averaged over the ranks after the last: by DDP, or with --cuda-graphs by an all-reduce
between the step's graphs, training/cuda_graph.py), runs the trunk once and the diffusion module on
the diffusion batch (ModelConfig.diffusion.diffusion_batch) of noised copies of the truth; its
random draws come from generators seeded by (seed, step, micro-batch slot), so a resumed run draws
what the straight run drew, on any number of ranks (featurecache.sampler). Then clipping, the
AdamW update, the learning-rate schedule (training/schedule.py) and the EMA of the weights
(training/ema.py). Each step logs one JSON line to RUN_DIR/log.jsonl ("kind": "train": the loss
and its terms, N_cycle, step time, time spent waiting for data, peak memory) and a readable line
on stdout; every
`validate_every` steps a "kind": "validation" line (training/validation.py), and one at step 0
before a fresh run's first step: the untrained weights, where the learning curve starts. Checkpoints
(featurecache.training.checkpoint) continue a run exactly where it stopped.

Ctrl-C (SIGINT) or SIGTERM stops a run gracefully (training/interrupt.py): the step in flight
finishes, every rank stops after that same step (the request rides on the step's all-reduce of its
loss terms; one that came during a validation is agreed on right after it), a checkpoint and the
weights file are written there (once, if one was due anyway; a validation due at that step is
skipped) and train() raises TrainingInterrupted. A second signal stops at once, as before.
--max-minutes stops the same way after the step that spends it (every rank agreeing), but returns
as a finished run does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import pathlib
import random
import resource
import time
from dataclasses import dataclass
from collections.abc import Iterator

import numpy as np
import torch

from featurecache.kernels.weight_casts import StepCastPlan, step_weight_casts
from featurecache.model import AF3Model, ModelConfig, sample_num_cycles
from featurecache.model.af3 import LOSS_INPUTS, OPTIONAL_LOSS_INPUTS, REQUIRED_INPUTS
from featurecache.model.config import RUNTIME_SETTINGS, WEIGHT_MEANING_SETTINGS, saved_model_settings
from featurecache.model.network.msa import OPTIONAL_INPUTS as MSA_OPTIONAL_INPUTS
from featurecache.sampler import StepLayout
from featurecache.training.buckets import padding_buckets
from featurecache.training.checkpoint import (
    WEIGHTS_FILE,
    checkpoint_path,
    inference_weights,
    load_checkpoint,
    load_initial_weights,
    optimizer_state,
    rng_state,
    save_checkpoint,
    set_rng_state,
)
from featurecache.training.config import TrainConfig, TrainSetupError, resolve_kernels
from featurecache.training.cuda_graph import GraphedUpdate
from featurecache.training.data import build_datasets, make_batch_sampler, make_loader, to_device
from featurecache.training.determinism import deterministic_mode
from featurecache.training.distributed import (
    Dist,
    GradientBuckets,
    all_ranks,
    barrier,
    broadcast_from_rank_0,
    max_over_shards,
    mean_over_ranks,
    reduce_shard_gradients,
    setup_distributed,
    shard_model,
    shutdown,
)
from featurecache.training.ema import WeightAverage
from featurecache.training.interrupt import StopRequest, TrainingInterrupted
from featurecache.training.progress import TrainProgress, first_step_work
from featurecache.training.run_plot import LOG_FILE
from featurecache.training.schedule import GraphLearningRate, lr_factor
from featurecache.training.validation import validate

# Launched steps before a CUDA graph is captured: they compile the kernels and create the
# optimizer state, neither of which may happen during a capture.
GRAPH_WARMUP_STEPS = 3


@dataclass
class Position:
    """Where a run is: optimizer steps taken, the epoch, and the samples of it taken by all
    ranks together (the same place whatever the number of ranks)."""

    step: int = 0
    epoch: int = 0
    sample_in_epoch: int = 0


class Trainer:
    """The model and everything that updates it: optimizer, learning-rate schedule, EMA, bf16
    autocast on GPU, DDP across ranks and, with `cuda_graphs`, the step as CUDA graphs.

    Gradients reach the ranks in one of two ways: DDP (launched steps), or `manual_sync`
    (cuda_graphs' way, training/cuda_graph.py's GraphedUpdate): the plain module's gradients
    land in fixed buffers that are all-reduced after the step's last backward. manual_sync
    without cuda_graphs runs that same update launched (tests compare it with DDP on the CPU);
    it recycles max_recycling_cycles times at every step, as a graph does."""

    def __init__(
        self,
        config: TrainConfig,
        kernels: str,
        world: Dist,
        manual_sync: bool | None = None,
        initial: dict | None = None,
    ) -> None:
        """`initial`: the --init-from checkpoint (load_initial_weights): its model settings and
        weights instead of the preset's and fresh ones."""
        self.config = config
        self.world = world
        self.manual_sync = config.cuda_graphs if manual_sync is None else manual_sync
        model_config = (
            config.model_config(kernels)
            if initial is None
            else initial_model_config(initial, config.init_from, {**config.model_settings, "kernels": kernels})
        )
        model = AF3Model(model_config)
        if initial is not None:  # before sharding, which splits the Pairformer's modules
            load_initial(model, initial, config.init_from)
        self.model = shard_model(model.to(world.device), world)
        if config.compile:
            self.model.compile_blocks()
        # capturable: AdamW's step counter stays on the GPU, so the update can be replayed by a graph.
        # fused on a GPU: one kernel a group of tensors for the whole update, where the foreach
        # version launches one per operation (af3 step, H100: 809 -> 265 kernels, 16.3 -> 9.8 ms)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(),
            lr=config.lr,
            betas=(config.adam_beta1, config.adam_beta2),
            eps=config.adam_eps,
            weight_decay=config.weight_decay,
            capturable=config.cuda_graphs,
            fused=world.device.type == "cuda",
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_factor(config.warmup, config.lr_decay_factor, config.lr_decay_every)
        )
        self.average = WeightAverage(self.model, config.ema_decay)
        if initial is not None and "ema" in initial:  # the average the checkpoint kept, else its weights
            self.average.load_state_dict(initial["ema"])
        self.layout = StepLayout(config.batch_size, world.world_size, config.accumulate)
        self.steps_taken = 0  # by this process (a resumed run counts from its resume)
        self.trained: torch.nn.Module = self.model
        self.graph_lr: GraphLearningRate | None = None
        self.graphed: GraphedUpdate | None = None
        self.noise: torch.Generator | None = None  # the generator of the graphed update's micro-batch
        # the weights a micro-batch cast to bf16, cast together at the next one's start (weight_casts)
        self.step_casts = StepCastPlan()
        # A captured step must not use autocast's cache of cast weights (its tensors outlive the graph).
        self.autocast = (
            torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=not config.cuda_graphs)
            if world.device.type == "cuda"
            else contextlib.nullcontext()
        )

    def restore(self, state: dict) -> Position:
        """Load a checkpoint's model, optimizer, scheduler, EMA and (a rank the writing run had)
        this rank's RNG states; a checkpoint without EMA starts its average at its weights."""
        if settings_differ(state, self.model.config, WEIGHT_MEANING_SETTINGS):  # same weights, other function
            raise TrainSetupError(
                f"--resume {self.config.resume}: the checkpoint's weights compute another function "
                f"(docs/FIDELITY.md): {model_differences(state, self.model.config)}; `featurecache "
                "predict` still loads it as it was trained"
            )
        try:
            self.model.load_state_dict(state["model"])
        except RuntimeError:  # another preset or model option: name the settings, not 300 tensor names
            raise TrainSetupError(
                f"--resume {self.config.resume}: {model_differences(state, self.model.config)}"
            ) from None
        try:
            self.optimizer.load_state_dict(state["optimizer"])
            self.scheduler.load_state_dict(state["scheduler"])
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            reason = " ".join(str(error).split()) or type(error).__name__
            raise TrainSetupError(
                f"--resume {self.config.resume}: its optimizer state does not fit this run ({reason})"
            ) from None
        self._load_average(state)
        if self.world.rank < len(state["rng"]):
            set_rng_state(state["rng"][self.world.rank])
        return Position(state["step"], state["epoch"], state["sample_in_epoch"])

    def _load_average(self, state: dict) -> None:
        """The EMA of a checkpoint, or started at the weights where it keeps none."""
        if "ema" in state:
            self.average.load_state_dict(state["ema"])
        else:
            self.average = WeightAverage(self.model, self.config.ema_decay)

    def start(self) -> None:
        """Wrap for DDP or CUDA graphs, once the states are loaded."""
        # Every rank starts from rank 0's weights (DDP's constructor broadcasts the model; the
        # EMA, made from each rank's initial weights, follows)
        shared = [*self.model.parameters(), *self.model.buffers()] if self.manual_sync else []
        broadcast_from_rank_0(shared + self.average.averages, self.world)
        if self.manual_sync:
            if self.config.cuda_graphs:
                self.graph_lr = GraphLearningRate(self.optimizer, self.world.device)
            # One graph, so one N_cycle: a graph run always recycles max_recycling_cycles times.
            # Its noise comes from the device's default generator, which the graph replays from
            # the seed noise_generator gives it before each replay (self.noise is that generator).
            cycles = self.model.config.trunk.max_recycling_cycles
            self.graphed = GraphedUpdate(
                lambda inputs: self.backward(inputs, cycles, self.noise),
                self.apply,
                GradientBuckets(self.model, self.world),
                GRAPH_WARMUP_STEPS,
                capture=self.config.cuda_graphs,
            )
        elif self.world.enabled:
            # static_graph: reentrant checkpointing runs parts of backward inside autograd calls,
            # which a static graph handles (recorded in the first step). The graph is the same
            # whatever N_cycle: only the last cycle builds one.
            device_ids = [self.world.device.index] if self.world.device.type == "cuda" else None
            self.trained = torch.nn.parallel.DistributedDataParallel(
                self.model, device_ids=device_ids, static_graph=True, process_group=self.world.data_group
            )
        self.model.train()

    def backward(self, batch: dict, num_cycles: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
        """Forward (N_cycle trunk cycles, the diffusion batch), loss and backward of one
        micro-batch, its gradient scaled by 1 / accumulate (summed over the step's micro-batches,
        a mean); returns the loss terms (AF3Model.loss's metrics)."""
        # each weight cast to the compute dtype once for the forward, the checkpoints'
        # recomputation and the mini-rollout (kernels/weight_casts.py)
        with step_weight_casts(self.step_casts):
            with self.autocast:
                outputs = self.trained(batch, num_cycles=num_cycles, generator=generator)  # the model's diffusion batch
            loss, metrics = self.model.loss(batch, outputs)
            (loss / self.config.accumulate if self.config.accumulate > 1 else loss).backward()
        return metrics

    def apply(self) -> torch.Tensor:
        """Clipping, the AdamW update and the EMA step; returns the gradient norm (before clipping)."""
        reduce_shard_gradients(self.model)  # with --pair-shards: the shards' shares summed
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_clip)
        self.optimizer.step()
        self.average.update()
        return grad_norm

    def step(self, batches: list[dict], step: int) -> tuple[dict[str, torch.Tensor], int]:
        """Optimizer step number `step` (0-based) on this rank's micro-batches; the schedule
        advances. Returns the loss terms (mean over the micro-batches), the gradient norm and
        N_cycle. A captured step copies the pinned host batch straight into the graph's input
        buffers, an eager one takes them on the device (takes_host_batches)."""
        cycle_generator = cycle_generator_of(self.config.sample.seed, step)
        if self.graphed is not None:
            num_cycles = self.model.config.trunk.max_recycling_cycles
            result = self.graphed(
                [graph_inputs(batch) for batch in batches], lambda micro: self._seed_noise(step, micro)
            )
        else:
            num_cycles = sample_num_cycles(cycle_generator, self.model.config.trunk.max_recycling_cycles)
            result = self.accumulate(batches, step, num_cycles)
        self.scheduler.step()
        if self.graph_lr is not None:
            self.graph_lr.set(self.scheduler.get_last_lr()[0])
        return result, num_cycles

    def close(self) -> None:
        """Release the captured graphs and the DDP wrapper at the end of the run, not at
        interpreter shutdown: DDP holds the process groups and gloo's finished work (with its
        tensors), and freed by the interpreter's last collection, after destroy_process_group,
        a gloo rank can abort at exit (seen once in CI: SIGABRT after the run's last step)."""
        if self.graphed is not None:
            self.graphed.release()
            self.graphed = None
        self.trained = self.model

    @property
    def takes_host_batches(self) -> bool:
        """Whether step() takes its batches on the host (a graph copies them to its buffers)."""
        return self.graphed is not None and self.config.cuda_graphs

    def _seed_noise(self, step: int, micro: int) -> None:
        self.noise = noise_generator(
            self.config.sample.seed, step, self.layout.slot(self.world.rank, micro), self.world.device
        )

    def accumulate(self, batches: list[dict], step: int, num_cycles: int) -> dict[str, torch.Tensor]:
        """Backward of every micro-batch (DDP reduces gradients only after the last), then apply."""
        self.optimizer.zero_grad(set_to_none=True)
        terms: list[dict[str, torch.Tensor]] = []
        for micro, batch in enumerate(batches):
            generator = noise_generator(
                self.config.sample.seed, step, self.layout.slot(self.world.rank, micro), self.world.device
            )
            # DDP's static graph is recorded in its first backward, which must synchronize: the
            # run's first step reduces after every micro-batch (a mean all the same, more traffic)
            skip_sync = self.world.enabled and micro < len(batches) - 1 and self.steps_taken > 0
            sync = self.trained.no_sync() if skip_sync else contextlib.nullcontext()
            with sync:
                terms.append(self.backward(batch, num_cycles, generator))
        means = {name: torch.stack([values[name] for values in terms]).mean() for name in terms[0]}
        self.steps_taken += 1
        return {**means, "grad_norm": self.apply()}

    def checkpoint(self, position: Position, rng_states: list[dict]) -> dict:
        return {
            "model": self.model.state_dict(),
            "optimizer": optimizer_state(self.optimizer),
            "scheduler": self.scheduler.state_dict(),
            "ema": self.average.state_dict(),
            "step": position.step,
            "epoch": position.epoch,
            "sample_in_epoch": position.sample_in_epoch,
            "rng": rng_states,
            "world_size": self.world.world_size,
            "train_config": dataclasses.asdict(self.config),
            "model_config": dataclasses.asdict(self.model.config),
        }

    def inference_weights(self, step: int) -> dict:
        """What `featurecache predict` reads (training/checkpoint.py's weights file): the EMA weights."""
        return inference_weights(self.average.model_state(self.model), dataclasses.asdict(self.model.config), step)


def _differing_settings(state: dict, config) -> dict[str, tuple] | None:
    """{name: (checkpoint's value, config's)} for the model settings (not the runtime ones) in
    which a checkpoint differs from `config`, by name, whichever layout the checkpoint wrote them
    in (saved_model_settings), a setting it predates taken as it was trained
    (model.config.LEGACY_SETTINGS); None when it records no settings."""
    saved = state.get("model_config")
    if not isinstance(saved, dict):
        return None
    saved = saved_model_settings(saved)
    here = config.settings()

    def comparable(value):  # a tuple setting may have become a list on its way
        return tuple(value) if isinstance(value, list) else value

    return {
        name: (saved[name], here[name])
        for name in here
        if name in saved and name not in RUNTIME_SETTINGS and comparable(saved[name]) != comparable(here[name])
    }


def initial_model_config(initial: dict, path: str, overrides: dict) -> ModelConfig:
    """The model settings of an --init-from checkpoint (as it was trained, LEGACY_SETTINGS for
    those it predates), with this run's settings of how it trains (`overrides`, by name:
    TrainConfig's INIT_FROM_SETTINGS and the kernels)."""
    settings = {
        name: value
        for name, value in saved_model_settings(initial["model_config"]).items()
        if name not in RUNTIME_SETTINGS
    }
    try:
        return ModelConfig.from_settings({**settings, **overrides})
    except (TypeError, ValueError) as error:
        raise TrainSetupError(f"--init-from {path}: its model settings do not build a model ({error})") from None


def load_initial(model: AF3Model, initial: dict, path: str) -> None:
    """--init-from: the checkpoint's weights into the model its settings built."""
    try:
        model.load_state_dict(initial["model"])
    except RuntimeError as error:
        reason = " ".join(str(error).split())[:300]
        raise TrainSetupError(f"--init-from {path}: its weights do not fit its own model settings: {reason}") from None


def settings_differ(state: dict, config, names: tuple[str, ...] | None = None) -> bool:
    """Whether a checkpoint's model settings differ from `config`'s (only among `names` if given)."""
    differ = _differing_settings(state, config) or {}
    return any(name in differ for name in names) if names is not None else bool(differ)


def model_differences(state: dict, config) -> str:
    """Why a checkpoint's weights do not fit this run's model, as the settings that differ."""
    differ = _differing_settings(state, config)
    if differ is None:
        return "its weights do not fit this run's model (it records no model settings)"
    differ = [f"{name} {there!r} there, {here!r} here" for name, (there, here) in differ.items()]
    return (
        f"the checkpoint holds another model ({'; '.join(differ[:6]) or 'other weights'}): resume with "
        "the --preset and model options it was trained with"
    )


def default_generator(device: torch.device) -> torch.Generator:
    """The default generator of a CUDA device (the one CUDA graphs replay with its current seed)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    return torch.cuda.default_generators[index]


def _seed_of(*words: int) -> int:
    return int(np.random.SeedSequence(list(words)).generate_state(1, dtype=np.uint64)[0])


def cycle_generator_of(seed: int, step: int) -> torch.Generator:
    """N_cycle's draw of optimizer step `step`: seeded by (seed, step), the same on every rank
    and micro-batch (ranks stay in step), and on resume."""
    return torch.Generator().manual_seed(_seed_of(seed, step))


def noise_generator(seed: int, step: int, slot: int, device: torch.device) -> torch.Generator:
    """The diffusion batch's rotations and noise of micro-batch `slot` of step `step`
    (StepLayout.slot: the same on 2 ranks as on 1 rank accumulating 2), seeded by (seed, step,
    slot), on the device (on CUDA its default generator, reseeded here)."""
    if device.type == "cuda":
        return default_generator(device).manual_seed(_seed_of(seed, step, slot))
    return torch.Generator().manual_seed(_seed_of(seed, step, slot))


def graph_inputs(batch: dict) -> dict[str, torch.Tensor]:
    """The tensors a captured step reads: the model's and its loss's inputs, and the optional
    ones the batch has (without msa_cycle_rows a replay would read the whole MSA pool each cycle)."""
    optional = tuple(name for name in MSA_OPTIONAL_INPUTS + OPTIONAL_LOSS_INPUTS if name in batch)
    return {name: batch[name] for name in dict.fromkeys(REQUIRED_INPUTS + LOSS_INPUTS + optional)}


def peak_memory_gb(device: torch.device) -> float:
    """Peak accelerator memory of this step, or the process's peak resident set on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 1e9
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kib / 1e6


class RunLog:
    """log.jsonl, written by the main rank only, and what a person watches (training/progress.py)."""

    def __init__(self, run_dir: pathlib.Path, world: Dist, progress: TrainProgress) -> None:
        self.file = open(run_dir / LOG_FILE, "a") if world.is_main else None
        self.progress = progress

    def write(self, record: dict) -> None:
        if self.file is None:
            return
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()
        self.progress.update(record)

    def close(self) -> None:
        self.progress.close()
        if self.file is not None:
            self.file.close()


def train(config: TrainConfig) -> list[dict]:
    """Run the loop; returns this rank's per-step log records. Anything wrong with what the run
    was given is a TrainSetupError (a ValueError) raised before the run directory is made. A
    SIGINT or SIGTERM while it steps stops it after a checkpoint: TrainingInterrupted (a
    KeyboardInterrupt) names the step and the checkpoint; the signal handlers it set are then
    the previous ones again."""
    with deterministic_mode(config.deterministic):
        world = setup_distributed(config.device, config.pair_shards)
        try:
            kernels = _check_setup(config, world)
            dataset, held_out = build_datasets(config)
            pad_to = padding_buckets(config, dataset)
            _check_steps_per_epoch(len(dataset), config, world)
            resumed = load_checkpoint(pathlib.Path(config.resume)) if config.resume else None
            initial = load_initial_weights(pathlib.Path(config.init_from)) if config.init_from else None
            progress = TrainProgress(config, enabled=world.is_main)  # checks --tensorboard

            run_dir = pathlib.Path(config.out)
            if world.is_main:
                run_dir.mkdir(parents=True, exist_ok=True)
            _seed(config.sample.seed, world.rank)
            source = f"the model of {config.init_from}" if initial is not None else f"the {config.preset} model"
            progress.note(f"building {source} on {world.device}")
            trainer = Trainer(config, kernels, world, initial=initial)
            position = trainer.restore(resumed) if resumed is not None else Position()
            trainer.start()
            progress.begin(position.step, first_step_work(config, kernels))
            run_log = RunLog(run_dir, world, progress)
            try:
                with StopRequest(max_minutes=config.max_minutes) as stop:
                    return _run(config, world, trainer, (dataset, held_out), pad_to, position, run_log, run_dir, stop)
            finally:
                trainer.close()
                run_log.close()
        finally:
            shutdown(world)


def _check_setup(config: TrainConfig, world: Dist) -> str:
    """The kernels this run uses; device settings that cannot work are a TrainSetupError."""
    if config.cuda_graphs and world.device.type != "cuda":
        raise TrainSetupError(f"--cuda-graphs needs a CUDA device, this run is on {world.device.type}")
    kernels = resolve_kernels(config.kernels, world.device)
    if config.kernels == "auto" and world.is_main:
        path = "featurecache's Triton kernels" if kernels == "triton" else "the PyTorch path (no CUDA device)"
        print(f"featurecache train: {world.device.type}, --kernels auto: {kernels}, {path}", flush=True)
    return kernels


def _check_steps_per_epoch(num_samples: int, config: TrainConfig, world: Dist) -> None:
    layout = StepLayout(config.batch_size, world.world_size, config.accumulate)
    if layout.steps_per_epoch(num_samples) == 0:
        raise TrainSetupError(
            f"{num_samples} training samples give no full step of {layout.global_batch} "
            f"(--batch-size {config.batch_size} x --accumulate {config.accumulate} x "
            f"{world.world_size} ranks)"
        )


def _seed(seed: int, rank: int) -> None:
    random.seed(seed + rank)
    np.random.seed(seed + rank)
    torch.manual_seed(seed)  # same initial weights on every rank


def _run(
    config: TrainConfig,
    world: Dist,
    trainer: Trainer,
    datasets: tuple,
    pad_to: list[dict[str, int]] | None,
    position: Position,
    run_log: RunLog,
    run_dir: pathlib.Path,
    stop: StopRequest,
) -> list[dict]:
    """Step until `config.steps`, epoch after epoch, logging, validating and checkpointing as
    configured. `datasets`: the training dataset and the held-out one (or None). When any rank
    has a `stop` request, every rank stops after the same step, with a checkpoint there
    (TrainingInterrupted).

    One loader (and one set of workers) serves the whole run, unless the dataset must switch to
    a newly published generation at each epoch: then set_epoch runs here and the loader is
    rebuilt per epoch, since workers hold a copy of the dataset.
    """
    dataset, held_out = datasets
    loader_per_epoch = getattr(dataset, "follow_latest", False)
    records: list[dict] = []
    batches: Iterator[dict] | None = None
    if held_out is not None and config.validate_every and position.step == 0:
        _validate(config, world, trainer, held_out, position, run_log)  # the untrained baseline of the curve
    while position.step < config.steps:
        if batches is None:
            if loader_per_epoch:
                dataset.set_epoch(position.epoch)  # before the iterator exists: workers copy the dataset
            sampler = make_batch_sampler(
                dataset,
                config,
                world,
                start_epoch=position.epoch,
                start_sample=position.sample_in_epoch,
                epochs=1 if loader_per_epoch else None,
            )
            batches = iter(make_loader(dataset, sampler, config, world.device, pad_to))
        while position.step < config.steps and _steps_left(trainer, dataset, position):
            record, (signalled, out_of_time) = _step(world, trainer, batches, position, stop)
            records.append(record)
            run_log.write(record)
            last = position.step == config.steps
            stopping = (signalled or out_of_time) and not last  # a run at its last step has finished
            if not stopping and held_out is not None and config.validate_every:
                if position.step % config.validate_every == 0:
                    _validate(config, world, trainer, held_out, position, run_log)
                    signalled, out_of_time = _stop_agreed(world, stop)  # a request during the validation
                    stopping = (signalled or out_of_time) and not last
            if stopping:
                checkpoint = _save(world, trainer, position, len(dataset), run_dir)
                batches = None  # the loader's workers shut down now, not when the exception is dropped
                if signalled:
                    raise TrainingInterrupted(stop.received, position.step, str(checkpoint), records, world.is_main)
                run_log.progress.note(
                    f"--max-minutes {config.max_minutes:g} spent at step {position.step}; checkpoint written to "
                    f"{checkpoint}; continue with --resume {checkpoint}"
                )
                return records
            if position.step % config.checkpoint_every == 0 or last:
                _save(world, trainer, position, len(dataset), run_dir)
        if not _steps_left(trainer, dataset, position):
            position.epoch += 1
            position.sample_in_epoch = 0
            if loader_per_epoch:
                batches = None
    return records


def _validate(
    config: TrainConfig, world: Dist, trainer: Trainer, held_out, position: Position, run_log: RunLog
) -> None:
    validation = validate(trainer.model, trainer.average, held_out, config, world, position.step, trainer.autocast)
    if validation is not None:
        run_log.write(validation)


def _steps_left(trainer: Trainer, dataset, position: Position) -> bool:
    return trainer.layout.steps_per_epoch(len(dataset), position.sample_in_epoch) > 0


def _step(
    world: Dist, trainer: Trainer, batches: Iterator[dict], position: Position, stop: StopRequest
) -> tuple[dict, bool]:
    """Fetch this rank's micro-batches, take one step, and return its log record (losses
    averaged over ranks and micro-batches) and whether any rank has a `stop` request: the
    request is one more element of the losses' all-reduce, so every rank gets the same answer."""
    start = time.perf_counter()
    if world.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(world.device)
    micro_batches = [next(batches) for _ in range(trainer.config.accumulate)]
    if not trainer.takes_host_batches:
        micro_batches = [to_device(batch, world.device) for batch in micro_batches]
    data_wait = time.perf_counter() - start
    result, num_cycles = trainer.step(micro_batches, position.step)
    position.step += 1
    position.sample_in_epoch += trainer.layout.global_batch
    terms = [name for name in result if name != "grad_norm"]  # loss, distogram, diffusion, mse, ...
    values = torch.stack([result[name].float() for name in terms])
    requested = max_over_shards(world, values.new_tensor(stop.flags()))
    *means, signalled, out_of_time = mean_over_ranks(world, torch.cat([values, requested])).tolist()
    record = {
        "kind": "train",
        "step": position.step,
        "epoch": position.epoch,
        **dict(zip(terms, means)),
        "num_cycles": num_cycles,
        "grad_norm": result["grad_norm"].item(),
        "lr": float(trainer.scheduler.get_last_lr()[0]),
        "step_time_s": time.perf_counter() - start,
        "data_wait_s": data_wait,
        "peak_memory_gb": peak_memory_gb(world.device),
        "tokens": sum(int(batch["token_pad_mask"].sum()) for batch in micro_batches),
        # the atom axes as padded (--static-shapes: the buckets taken), beside the atoms they hold
        "atoms": sum(int(batch["atom_pad_mask"].sum()) for batch in micro_batches),
        "padded_atoms": sum(batch["atom_pad_mask"].numel() for batch in micro_batches),
        # per rank, that rank's samples in micro-step order
        "ids": all_ranks(world, [key for batch in micro_batches for key in batch["id"]]),
        "world_size": world.world_size,
    }
    return record, (signalled > 0, out_of_time > 0)


def _stop_agreed(world: Dist, stop: StopRequest) -> tuple[bool, bool]:
    """Whether any rank has a `stop` request (a signal) and whether any has spent --max-minutes:
    one all-reduce (after a validation, not every step)."""
    requested = max_over_shards(world, torch.tensor(stop.flags(), device=world.device))
    signalled, out_of_time = mean_over_ranks(world, requested).tolist()
    return signalled > 0, out_of_time > 0


def _save(
    world: Dist, trainer: Trainer, position: Position, samples_per_epoch: int, run_dir: pathlib.Path
) -> pathlib.Path:
    """A checkpoint at `position` and the run's weights file (its EMA weights, for predict); a
    checkpoint that ends an epoch resumes at the next epoch's start. Returns the checkpoint's path."""
    end_of_epoch = trainer.layout.steps_per_epoch(samples_per_epoch, position.sample_in_epoch) == 0
    saved = Position(position.step, position.epoch + 1, 0) if end_of_epoch else position
    rng_states = all_ranks(world, rng_state())
    path = checkpoint_path(run_dir, position.step)
    if world.is_main:
        save_checkpoint(path, trainer.checkpoint(saved, rng_states))
        save_checkpoint(run_dir / WEIGHTS_FILE, trainer.inference_weights(position.step))
    barrier(world)
    return path
