"""`featurecache predict`: the click command over prediction.run.predict.

A key the cache lacks, a file that is not a weights file or training checkpoint, or a device that is not
there is one line and exit 2, through featurecache.errors.
"""

from __future__ import annotations

import click

from featurecache.errors import SEED, BoundaryCommand, UserError
from featurecache.prediction.run import PredictError, PredictOptions, predict
from featurecache.store.layout import refuse_output_in_cache
from featurecache.training.config import KERNEL_OPTIONS

POSITIVE = click.IntRange(min=1)


@click.command("predict", cls=BoundaryCommand)
@click.option(
    "--cache",
    required=True,
    type=click.Path(file_okay=False),
    help="Feature cache (or published generation) holding the targets.",
)
@click.argument("keys", nargs=-1, required=True)
@click.option(
    "--checkpoint",
    required=True,
    type=click.Path(dir_okay=False),
    help="RUN_DIR/weights.pt, the EMA weights and model settings `featurecache train` writes with each "
    "checkpoint, one of its checkpoint files (read memory-mapped: the optimizer state is not "
    "loaded), or a checkpoint `featurecache convert` wrote.",
)
@click.option(
    "--out",
    required=True,
    type=click.Path(file_okay=False),
    help="Folder for the predictions, in AlphaFold 3's layout: <key>/seed-<seed>_sample-<i>/ with the "
    "mmCIF (pLDDT as B-factors) and confidence JSON files, the best-ranked sample at <key>/.",
)
@click.option(
    "--samples",
    default=PredictOptions.samples,
    show_default=True,
    type=POSITIVE,
    help="Structures per target (AF3: 5 per seed).",
)
@click.option("--steps", type=POSITIVE, help="Sampler steps (default: the model's, 200 in AF3; tiny: 20).")
@click.option(
    "--cycles", default=PredictOptions.cycles, show_default=True, type=POSITIVE, help="Recycling cycles of the trunk."
)
@click.option(
    "--max-tokens",
    type=POSITIVE,
    help="Crop a larger target to this many tokens (contiguous pieces of its chains, by --seed).",
)
@click.option(
    "--seed",
    default=PredictOptions.seed,
    show_default=True,
    type=SEED,
    help="Seed for the sampler's noise (and the crop and MSA rows).",
)
@click.option(
    "--kernels",
    default=PredictOptions.kernels,
    show_default=True,
    type=click.Choice(KERNEL_OPTIONS),
    help="triton (CUDA), torch, or auto: triton on a CUDA device, torch on the CPU.",
)
@click.option(
    "--device",
    default=PredictOptions.device,
    show_default=True,
    help="auto (CUDA if there is one), cpu, cuda or cuda:N.",
)
@click.option(
    "--cuda-graphs",
    is_flag=True,
    help="Replay the sampler's diffusion module from a CUDA graph, captured once per target after "
    "two eager steps: the host then launches each sampler step with one call. CUDA only.",
)
def predict_command(
    cache, keys, checkpoint, out, samples, steps, cycles, max_tokens, seed, kernels, device, cuda_graphs
) -> None:
    """Predict structures of cached targets KEY... with a trained checkpoint: one mmCIF and its
    confidences per sample, ranked as AlphaFold 3 ranks them. Prints the mmCIFs written (on a GPU
    the model runs under bf16 autocast, as in training); the time of each target's model run and
    of the whole command go to stderr."""
    refuse_output_in_cache("--out", out, cache)
    options = PredictOptions(
        cache=cache,
        keys=tuple(dict.fromkeys(keys)),
        checkpoint=checkpoint,
        out=out,
        samples=samples,
        steps=steps,
        cycles=cycles,
        seed=seed,
        max_tokens=max_tokens,
        device=device,
        kernels=kernels,
        cuda_graphs=cuda_graphs,
    )
    try:
        written = predict(options)
    except PredictError as error:
        raise UserError(str(error)) from error
    for path in written:
        click.echo(str(path))
