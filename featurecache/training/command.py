"""`featurecache train` (and `python -m featurecache.training`): the click command over train().

Option values are checked by click's types and ranges before anything starts; a setting or
input that cannot work (no CUDA for --device cuda, a folder that is not a cache, ...) is one
line and exit 2, through featurecache.errors. Ctrl-C (SIGINT) or SIGTERM stops the run after the
step in flight and a checkpoint there (training/interrupt.py): one line naming the checkpoint to
--resume from, and exit 130 (SIGINT) or 143 (SIGTERM), as shells report those signals.
"""

from __future__ import annotations

import click
from click.core import ParameterSource

from featurecache.config import SampleConfig, crop_mode_probs_from_spatial
from featurecache.errors import SEED, BoundaryCommand, FiniteFloatRange, UserError, renamed_option
from featurecache.model.config import PRESETS
from featurecache.store.layout import refuse_output_in_cache
from featurecache.training.config import KERNEL_OPTIONS, TrainConfig, TrainSetupError
from featurecache.training.interrupt import TrainingInterrupted
from featurecache.training.loop import train

POSITIVE = click.IntRange(min=1)
NON_NEGATIVE = click.IntRange(min=0)
UNIT = FiniteFloatRange(0.0, 1.0, max_open=True)


def _preset_values(setting: str) -> str:
    """Each preset's value of a model setting, for an option's help: "af3 48, small 16, tiny 4"."""
    return ", ".join(f"{name} {config.settings()[setting]}" for name, config in sorted(PRESETS.items()))


@click.command("train", cls=BoundaryCommand)
@click.option(
    "--cache", type=click.Path(file_okay=False), help="Feature cache (or published generation) to train from."
)
@click.option(
    "--online",
    type=click.Path(file_okay=False),
    help="Featurize raw files from this folder at load time instead of reading a cache "
    "(to measure what caching saves).",
)
@click.option(
    "--alignments",
    type=click.Path(file_okay=False),
    help="With --online: folder of alignment files, as for precompute --alignments.",
)
@click.option("--template-dir", type=click.Path(file_okay=False), help="With --online: template mmCIF folder.")
@click.option(
    "--out",
    default=TrainConfig.out,
    show_default=True,
    type=click.Path(file_okay=False),
    help="Run directory: log.jsonl and checkpoints.",
)
@click.option(
    "--tensorboard",
    type=click.Path(file_okay=False),
    help="Also log every step to TensorBoard event files in this folder (needs: pip install tensorboard).",
)
@click.option(
    "--preset", default=TrainConfig.preset, show_default=True, type=click.Choice(sorted(PRESETS)), help="Model size."
)
@click.option(
    "--pairformer-blocks",
    type=NON_NEGATIVE,
    help=f"Override the preset's number of Pairformer blocks ({_preset_values('pairformer_blocks')}).",
)
@click.option(
    "--checkpoint-group",
    type=POSITIVE,
    help="Pairformer (and diffusion transformer) blocks per activation checkpoint: 1 keeps every "
    "block's input for backward; K > 1 keeps one per K blocks, re-runs each group in backward "
    "(a re-run block's triangle attentions once more) and recomputes the other pair-sized paths "
    "(about one more forward of the trunk, same results): 7 for crops past ~2,000 tokens "
    "(benchmarks/activation_memory.py predicts the peak). Near the GPU's memory, also start the "
    "process with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True in the environment (read once, "
    "when CUDA initializes; setting it later does nothing): it avoids fragmentation at 1-2 GB "
    "tensors (not yet measured with --cuda-graphs). Default: the preset's, 1.",
)
@click.option(
    "--kernels",
    default=TrainConfig.kernels,
    show_default=True,
    type=click.Choice(KERNEL_OPTIONS),
    help="triton: featurecache's kernels (CUDA); torch: the pure-PyTorch references; "
    "auto: triton on a CUDA device, torch on the CPU.",
)
@click.option(
    "--steps",
    default=TrainConfig.steps,
    show_default=True,
    type=POSITIVE,
    help="Optimizer steps to run in total (a resumed run continues to this step).",
)
@click.option(
    "--max-recycling-cycles",
    type=POSITIVE,
    help="N_cycle is drawn per step uniformly from 1 to this (AF3: 4, the presets' default); "
    "--cuda-graphs always runs this many.",
)
@click.option(
    "--diffusion-batch",
    type=POSITIVE,
    help=f"The diffusion batch: noised copies of each structure per trunk pass (AF3: 48; default the "
    f"preset's: {_preset_values('diffusion_batch')}).",
)
@click.option(
    "--crop-size", default=SampleConfig.crop_size, show_default=True, type=POSITIVE, help="Tokens per cropped sample."
)
@click.option(
    "--msa-rows-per-sample",
    default=SampleConfig.msa_rows_per_sample,
    show_default=True,
    type=POSITIVE,
    help="MSA rows each recycling cycle sees, drawn from the rows the cache stores (AF3: 1024).",
)
@click.option(
    "--msa-cycle-draws",
    default=SampleConfig.msa_cycle_draws,
    show_default=True,
    type=POSITIVE,
    help="Independent MSA row draws per sample; recycling cycle i uses draw i mod this (AF3 draws anew "
    "each cycle, of up to 4 in training: 4; 1: one draw for every cycle).",
)
@click.option(
    "--max-msa-rows",
    "old_msa_rows",
    type=POSITIVE,
    hidden=True,
    callback=renamed_option("--max-msa-rows", "--msa-rows-per-sample (MSA rows kept per sample)"),
    help="Deprecated spelling of --msa-rows-per-sample.",
)
@click.option(
    "--crop-mode-probs",
    nargs=3,
    type=FiniteFloatRange(0.0, 1.0),
    default=SampleConfig.crop_mode_probs,
    show_default=True,
    help="Chances of a contiguous, a spatial and a spatial-interface crop (AF3's; they add up to 1).",
)
@click.option(
    "--spatial-crop-prob",
    type=FiniteFloatRange(0.0, 1.0),
    hidden=True,
    help="Deprecated: P sets --crop-mode-probs to 1-P P/2 P/2.",
)
@click.option(
    "--max-templates",
    default=SampleConfig.max_templates,
    show_default=True,
    type=NON_NEGATIVE,
    help="Templates per chain and sample, drawn at random (AF3) from those the cache stores.",
)
@click.option(
    "--batch-size", default=TrainConfig.batch_size, show_default=True, type=POSITIVE, help="Samples per step and rank."
)
@click.option(
    "--accumulate",
    default=TrainConfig.accumulate,
    show_default=True,
    type=POSITIVE,
    help="Micro-batches per optimizer step and rank (gradient accumulation): a step trains on "
    "--batch-size x --accumulate x ranks samples.",
)
@click.option(
    "--pair-shards",
    default=TrainConfig.pair_shards,
    show_default=True,
    type=POSITIVE,
    help="Ranks that share one sample, its Pairformer split by rows (docs/SHARDING.md); the ranks "
    "are data-parallel replicas x this.",
)
@click.option(
    "--lr",
    default=TrainConfig.lr,
    show_default=True,
    type=FiniteFloatRange(min=0.0, min_open=True),
    help="Peak learning rate (AdamW; AF3: 1.8e-3).",
)
@click.option(
    "--adam-beta1", default=TrainConfig.adam_beta1, show_default=True, type=UNIT, help="AdamW beta1 (AF3: 0.9)."
)
@click.option(
    "--adam-beta2", default=TrainConfig.adam_beta2, show_default=True, type=UNIT, help="AdamW beta2 (AF3: 0.95)."
)
@click.option(
    "--adam-eps",
    default=TrainConfig.adam_eps,
    show_default=True,
    type=FiniteFloatRange(min=0.0, min_open=True),
    help="AdamW epsilon (AF3: 1e-8).",
)
@click.option(
    "--weight-decay",
    default=TrainConfig.weight_decay,
    show_default=True,
    type=FiniteFloatRange(min=0.0),
    help="AdamW weight decay (AF3: none).",
)
@click.option(
    "--warmup",
    default=TrainConfig.warmup,
    show_default=True,
    type=NON_NEGATIVE,
    help="Steps over which the learning rate rises linearly to --lr (AF3: 1000).",
)
@click.option(
    "--lr-decay-factor",
    default=TrainConfig.lr_decay_factor,
    show_default=True,
    type=FiniteFloatRange(0.0, 1.0, min_open=True),
    help="After the warm-up the learning rate is multiplied by this every --lr-decay-every steps (AF3: 0.95).",
)
@click.option(
    "--lr-decay-every",
    default=TrainConfig.lr_decay_every,
    show_default=True,
    type=POSITIVE,
    help="Steps between learning-rate decays (AF3: 50000).",
)
@click.option(
    "--grad-clip",
    default=TrainConfig.grad_clip,
    show_default=True,
    type=FiniteFloatRange(min=0.0, min_open=True),
    help="Clip the global gradient norm at this (AF3: 10).",
)
@click.option(
    "--ema-decay",
    default=TrainConfig.ema_decay,
    show_default=True,
    type=UNIT,
    help="Decay of the weights' moving average, updated every step, checkpointed and used by predict (AF3: 0.999).",
)
@click.option(
    "--validate-every",
    default=TrainConfig.validate_every,
    show_default=True,
    type=NON_NEGATIVE,
    help="Steps between validation passes on the held-out targets (0: none).",
)
@click.option(
    "--validation-keys",
    multiple=True,
    metavar="KEY[,KEY...]",
    help="Targets held out of training for validation (repeat the option or separate keys by commas).",
)
@click.option(
    "--validation-fraction",
    default=TrainConfig.validation_fraction,
    show_default=True,
    type=FiniteFloatRange(0.0, 1.0, max_open=True),
    help="Hold out this fraction of the cache's targets for validation instead (a seeded choice).",
)
@click.option(
    "--validation-sampler-steps",
    default=TrainConfig.validation_sampler_steps,
    show_default=True,
    type=POSITIVE,
    help="Diffusion sampler steps of each validation prediction.",
)
@click.option(
    "--deterministic",
    is_flag=True,
    help="Bitwise reproducible steps from one seed: deterministic algorithms and a fixed cuBLAS workspace.",
)
@click.option(
    "--num-workers",
    default=TrainConfig.num_workers,
    show_default=True,
    type=NON_NEGATIVE,
    help="DataLoader worker processes per rank.",
)
@click.option(
    "--max-minutes",
    type=FiniteFloatRange(0.0, min_open=True),
    help="Time budget: stop after the step that spends this many minutes (counted from the training loop's "
    "start: the first step's compilation and validation included), with a checkpoint there to --resume from; exit 0. For a batch job's "
    "time slot, or a benchmark of what a run learns in a fixed time.",
)
@click.option(
    "--checkpoint-every",
    default=TrainConfig.checkpoint_every,
    show_default=True,
    type=POSITIVE,
    help="Steps between checkpoints (and one at the end).",
)
@click.option(
    "--resume",
    type=click.Path(exists=True),
    help="Checkpoint file, or a run directory to resume from its newest checkpoint.",
)
@click.option(
    "--init-from",
    type=click.Path(),
    help="Fine-tune: start from this checkpoint's weights and model settings (a Protenix model converted "
    "by `featurecache convert`, or another run's checkpoint) instead of --preset's fresh ones; the "
    "optimizer, schedule and data start afresh. To --resume such a run, give the same --init-from.",
)
@click.option("--compile", "compile_model", is_flag=True, help="torch.compile every block of the trunk.")
@click.option(
    "--static-shapes",
    is_flag=True,
    help="Pad every batch to --crop-size tokens, --msa-cycle-draws x --msa-rows-per-sample rows, --max-templates "
    "templates and one of --atom-buckets atom sizes: a few shapes for all steps, so --compile compiles each once.",
)
@click.option(
    "--cuda-graphs",
    is_flag=True,
    help="Replay each step from CUDA graphs (implies --static-shapes; one GPU or several ranks under "
    "torchrun, with --accumulate; not with --pair-shards or --compile): removes the host's "
    "kernel-launch overhead.",
)
@click.option(
    "--atom-buckets",
    default=TrainConfig.atom_buckets,
    show_default=True,
    type=click.IntRange(min=1),
    help="With --static-shapes or --cuda-graphs: pad each batch's atoms (and token bonds) to the smallest of at "
    "most this many sizes chosen from the cache's atom counts (one CUDA graph each); 1: one size, what the "
    "largest crop can hold.",
)
@click.option(
    "--seed",
    default=SampleConfig.seed,
    show_default=True,
    type=SEED,
    help="Seed for weights, shuffling, crops and MSA subsampling.",
)
@click.option(
    "--device",
    default=TrainConfig.device,
    show_default=True,
    help="auto (CUDA if there is one), cpu, cuda or cuda:N (torchrun: cuda:LOCAL_RANK).",
)
@click.pass_context
def train_command(
    ctx: click.Context,
    cache,
    online,
    alignments,
    template_dir,
    out,
    preset,
    pairformer_blocks,
    checkpoint_group,
    kernels,
    steps,
    max_recycling_cycles,
    diffusion_batch,
    crop_size,
    msa_rows_per_sample,
    msa_cycle_draws,
    old_msa_rows,
    crop_mode_probs,
    spatial_crop_prob,
    max_templates,
    batch_size,
    num_workers,
    checkpoint_every,
    resume,
    init_from,
    compile_model,
    static_shapes,
    cuda_graphs,
    atom_buckets,
    seed,
    device,
    validation_keys,
    **recipe,
) -> None:
    """Train the AF3 structure model (trunk and diffusion module) from a feature cache.

    Ctrl-C or SIGTERM stops after the step in flight, with a checkpoint at that step to --resume
    from (exit 130 for SIGINT, 143 for SIGTERM); a second one stops at once."""
    refuse_output_in_cache("--out", out, cache)
    rows = msa_rows_per_sample
    if old_msa_rows is not None:
        if ctx.get_parameter_source("msa_rows_per_sample") != ParameterSource.DEFAULT:
            raise click.UsageError("give --msa-rows-per-sample only (--max-msa-rows is its old name)")
        rows = old_msa_rows
    if spatial_crop_prob is not None:
        if ctx.get_parameter_source("crop_mode_probs") != ParameterSource.DEFAULT:
            raise click.UsageError("give --crop-mode-probs only (--spatial-crop-prob is its deprecated form)")
        click.echo("featurecache: --spatial-crop-prob is deprecated: use --crop-mode-probs", err=True)
        crop_mode_probs = crop_mode_probs_from_spatial(spatial_crop_prob)
    if abs(sum(crop_mode_probs) - 1.0) > 1e-6:
        raise click.BadParameter(
            f"{' '.join(map(str, crop_mode_probs))} do not add up to 1", param_hint="--crop-mode-probs"
        )
    # the options that change the preset's model settings, by their ModelConfig names
    given = (
        ("pairformer_blocks", pairformer_blocks),
        ("checkpoint_group", checkpoint_group),
        ("max_recycling_cycles", max_recycling_cycles),
        ("diffusion_batch", diffusion_batch),
    )
    model_settings = {name: value for name, value in given if value is not None}
    try:
        sample = SampleConfig(
            crop_size=crop_size,
            msa_rows_per_sample=rows,
            msa_cycle_draws=msa_cycle_draws,
            crop_mode_probs=tuple(crop_mode_probs),
            max_templates=max_templates,
            seed=seed,
        )
        config = TrainConfig(
            cache=cache,
            online=online,
            alignments=alignments,
            template_dir=template_dir,
            out=out,
            preset=preset,
            model_settings=model_settings,
            kernels=kernels,
            steps=steps,
            sample=sample,
            batch_size=batch_size,
            num_workers=num_workers,
            checkpoint_every=checkpoint_every,
            resume=resume,
            init_from=init_from,
            compile=compile_model,
            static_shapes=static_shapes,
            cuda_graphs=cuda_graphs,
            atom_buckets=atom_buckets,
            device=device,
            validation_keys=tuple(key for value in validation_keys for key in value.split(",") if key),
            **recipe,  # the optimizer, schedule, EMA, accumulation, validation and determinism options
        )
        train(config)
    except TrainSetupError as error:
        raise UserError(str(error)) from error
    except TrainingInterrupted as stopped:
        if stopped.report:  # the main rank's line; every rank exits with the code
            click.echo(f"featurecache train: {stopped}", err=True)
        ctx.exit(stopped.exit_code)
