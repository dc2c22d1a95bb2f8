"""Predict structures for targets of a cache with a trained model: the weights file its training
wrote (or a training checkpoint; weights and ModelConfig), AF3Model.sample on each target's record (whole, or its first
contiguous crop of `max_tokens`), one mmCIF per sample with its confidences, ranked, in
AlphaFold 3's output layout."""

from __future__ import annotations

import pathlib
import pickle
import shutil
import sys
import time
import zipfile
from dataclasses import dataclass

import torch

from featurecache.chem.ccd import load_ccd
from featurecache.config import SampleConfig
from featurecache.loader import CacheDataset, collate
from featurecache.model import AF3Model, ModelConfig
from featurecache.model.config import RUNTIME_SETTINGS, saved_model_settings
from featurecache.prediction.confidences import sample_confidence, structure_labels, write_json
from featurecache.prediction.mmcif import asym_ids, atom_names, residue_instances, write_mmcif
from featurecache.prediction.sampler_graph import GraphedDenoiser
from featurecache.store.files import atomic_path, write_text_atomic
from featurecache.training.config import TrainSetupError, resolve_kernels
from featurecache.training.distributed import resolve_device

# MSA rows a prediction reads (AF3 infers with up to 16,384; the cache stores fewer by default).
PREDICT_MSA_ROWS = 16384


# AF3Model.sample's outputs the mmCIFs and confidences are written from
PREDICTION_OUTPUTS = ("positions", "distogram_logits", "plddt_logits", "pae_logits", "pde_logits", "resolved_logits")


class PredictError(ValueError):
    """An input that stops a prediction (the command's exit 2), in one line naming it."""


@dataclass(frozen=True)
class PredictOptions:
    cache: str
    keys: tuple[str, ...]
    checkpoint: str
    out: str
    samples: int = 5
    steps: int | None = None  # sampler steps; None: the model config's (AF3: 200)
    cycles: int = 4  # recycling cycles (AF3 infers with 4)
    seed: int = 0
    max_tokens: int | None = None  # crop larger targets to this many tokens (contiguous, seeded)
    device: str = "auto"
    kernels: str = "auto"
    cuda_graphs: bool = False  # the sampler's denoiser replayed as a CUDA graph (sampler_graph.py)


def load_model(checkpoint: pathlib.Path, device: torch.device, kernels: str) -> AF3Model:
    """The AF3Model of a run's weights file (`weights.pt`) or training checkpoint (its EMA
    weights, when it has them), on `device`, in eval mode, with `kernels`."""
    state = read_weights(checkpoint)
    try:
        # by name, whichever layout it was saved in; a setting the checkpoint predates as it was
        # trained (its distogram edges, ...)
        settings = {
            name: value
            for name, value in saved_model_settings(state["model_config"]).items()
            if name not in RUNTIME_SETTINGS
        }
        settings.setdefault("confidence_head", False)  # a checkpoint from before the confidence head
        config = ModelConfig.from_settings({**settings, "kernels": kernels, "checkpoint_blocks": False})
        model = AF3Model(config)
        # the EMA of the weights where training kept one (AF3 predicts with it), else the weights;
        # a weights file holds the EMA as its "model"
        loaded = {**state["model"], **state.get("ema", {})}
        model.load_state_dict(loaded)
    except (TypeError, ValueError, RuntimeError) as error:
        reason = " ".join(str(error).split())[:300]
        raise PredictError(
            f"--checkpoint {checkpoint}: its model does not load as AF3Model (a trunk-only "
            f"checkpoint from before the diffusion module?): {reason}"
        ) from None
    broken = [name for name, value in loaded.items() if value.is_floating_point() and not value.isfinite().all()]
    if broken:
        raise PredictError(
            f"--checkpoint {checkpoint}: {len(broken)} weight tensor(s) hold NaN or infinity ({broken[0]} first): "
            "its training diverged; predict from an earlier checkpoint"
        )
    return model.to(device).eval()


def read_weights(checkpoint: pathlib.Path) -> dict:
    """The parts of a weights file or training checkpoint that inference reads: "model",
    "model_config" and, from a checkpoint, "ema".

    Memory-mapped (torch.load(mmap=True)): only the tensors the model copies are read from disk,
    never a checkpoint's optimizer state (two tensors per weight with AdamW) or the live weights
    its EMA replaces. A weights file loads with weights_only=True; a training checkpoint holds
    RNG states (NumPy arrays, Python tuples) and is read with weights_only=False: only
    checkpoints you wrote.
    """
    if not checkpoint.is_file():
        raise PredictError(f"--checkpoint {checkpoint}: no such file")
    if not zipfile.is_zipfile(checkpoint):  # torch.save's archive; mmap reads nothing else
        raise PredictError(f"--checkpoint {checkpoint}: not a readable checkpoint (not a torch.save archive)")
    try:
        try:
            state = torch.load(checkpoint, map_location="cpu", weights_only=True, mmap=True)
        except pickle.UnpicklingError:  # a training checkpoint's RNG states: not plain tensors
            state = torch.load(checkpoint, map_location="cpu", weights_only=False, mmap=True)
    except (OSError, RuntimeError, EOFError, pickle.UnpicklingError, ValueError) as error:
        reason = " ".join(str(error).split()) or type(error).__name__
        raise PredictError(f"--checkpoint {checkpoint}: not a readable checkpoint ({reason})") from None
    if (
        not isinstance(state, dict)
        or not isinstance(state.get("model"), dict)
        or not isinstance(state.get("model_config"), dict)
    ):
        raise PredictError(f"--checkpoint {checkpoint}: not a featurecache training checkpoint or weights file")
    return {name: state[name] for name in ("model", "model_config", "ema") if name in state}


def _dataset(options: PredictOptions) -> CacheDataset:
    sample = SampleConfig(
        crop_size=options.max_tokens,
        msa_rows_per_sample=PREDICT_MSA_ROWS,
        crop_mode_probs=(1.0, 0.0, 0.0),
        max_templates=4,
        random_templates=False,
        seed=options.seed,
    )
    try:
        return CacheDataset(pathlib.Path(options.cache), sample, ids=list(options.keys))
    except KeyError as error:
        raise PredictError(f"--cache {options.cache}: {error.args[0]}") from None
    except (OSError, ValueError) as error:
        text = " ".join(str(error).split())
        raise PredictError(text if options.cache in text else f"--cache {options.cache}: {text}") from None


def predict(options: PredictOptions) -> list[pathlib.Path]:
    """Predict every key; returns the per-sample mmCIFs written (see `_predict_target` for the layout)."""
    started = time.perf_counter()
    try:
        device = resolve_device(options.device)
        kernels = resolve_kernels(options.kernels, device)
    except (TrainSetupError, ValueError, RuntimeError) as error:
        raise PredictError(str(error)) from None
    if options.cuda_graphs and device.type != "cuda":
        raise PredictError(f"--cuda-graphs needs a CUDA device, this prediction is on {device.type}")
    out = _check_output_folder(pathlib.Path(options.out))
    model = load_model(pathlib.Path(options.checkpoint), device, kernels)
    _report(f"model loaded in {time.perf_counter() - started:.1f} s ({kernels} kernels on {device})")
    dataset = _dataset(options)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise PredictError(f"--out {out}: cannot create the folder ({error.strerror or error})") from None
    ccd = load_ccd()
    written = []
    for key in options.keys:
        written += _predict_target(model, dataset, key, options, ccd, out / key, device)
    _report(f"{len(options.keys)} target(s) in {time.perf_counter() - started:.1f} s, the whole command")
    return written


def _report(message: str) -> None:
    """A progress line on stderr (stdout lists the files written, one per line, for scripts)."""
    print(f"featurecache predict: {message}", file=sys.stderr, flush=True)


def sample_target(model: AF3Model, batch: dict, options: PredictOptions, device: torch.device) -> tuple[dict, float]:
    """AF3Model.sample as training runs the model (bf16 autocast on a GPU, fp32 on the CPU), with
    --cuda-graphs the sampler's denoiser as a CUDA graph; and the seconds it took (the device's
    work included)."""
    generator = torch.Generator().manual_seed(options.seed)
    cuda = device.type == "cuda"
    # a captured graph must not use autocast's cache of cast weights (its tensors outlive the graph)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda, cache_enabled=not options.cuda_graphs)
    wrap = GraphedDenoiser if options.cuda_graphs else None
    if cuda:
        torch.cuda.synchronize(device)
    started = time.perf_counter()
    with torch.no_grad(), autocast:
        outputs = model.sample(
            batch,
            num_cycles=options.cycles,
            num_samples=options.samples,
            num_steps=options.steps,
            generator=generator,
            wrap_denoiser=wrap,
        )
    if cuda:
        torch.cuda.synchronize(device)
    return outputs, time.perf_counter() - started


def _check_output_folder(out: pathlib.Path) -> pathlib.Path:
    """--out checked before the model loads, without creating it: not a file, not below one."""
    existing = next(folder for folder in (out, *out.absolute().parents) if folder.exists())
    if not existing.is_dir():
        problem = "is a file, expected a folder" if existing == out else f"{existing} is a file"
        raise PredictError(f"--out {out}: {problem}")
    return out


def _predict_target(
    model: AF3Model,
    dataset: CacheDataset,
    key: str,
    options: PredictOptions,
    ccd,
    folder: pathlib.Path,
    device: torch.device,
) -> list[pathlib.Path]:
    """AlphaFold 3's output layout in OUT/<key>/: per sample seed-<seed>_sample-<i>/ with
    <key>_seed-<seed>_sample-<i>_model.cif (pLDDT in the B-factors), _confidences.json and
    _summary_confidences.json; the best sample by ranking_score again as <key>_model.cif,
    <key>_confidences.json and <key>_summary_confidences.json; <key>_ranking_scores.csv.
    A model without the confidence head writes the mmCIFs only (B-factors 0)."""
    index = dataset.ids.index(key)
    sample = dataset[(0, index)]
    _, meta = dataset.load_arrays(key)
    batch = {
        name: value.to(device) if isinstance(value, torch.Tensor) else value
        for name, value in collate([sample]).items()
    }
    outputs, model_seconds = sample_target(model, batch, options, device)
    written_from = time.perf_counter()
    # what the files are made of, in fp32 on the host (not the trunk's pair and single)
    outputs = {name: outputs[name].float().cpu() for name in PREDICTION_OUTPUTS if name in outputs}
    finite = outputs["positions"][0].isfinite().flatten(1).all(dim=1)  # per sample
    if not finite.all():
        bad = ", ".join(str(number) for number in (~finite).nonzero().flatten().tolist())
        raise PredictError(
            f"{key}: sample(s) {bad} of {options.samples} came out with NaN or infinite coordinates "
            f"(--checkpoint {options.checkpoint}); nothing was written for {key}"
        )
    arrays = {name: value.numpy() for name, value in sample.items() if isinstance(value, torch.Tensor)}
    instances = residue_instances(arrays, meta, ccd)
    labels = asym_ids(list(meta["chain_ids"]))[0]
    structure = structure_labels(arrays, instances, list(meta["chain_ids"]), atom_names(arrays["ref_atom_name_chars"]))
    distogram_range = (model.config.trunk.distogram_min, model.config.trunk.distogram_max)
    written, scores = [], []
    for number, positions in enumerate(outputs["positions"][0].float().numpy()):
        name = f"{key}_seed-{options.seed}_sample-{number}"
        sample_folder = folder / f"seed-{options.seed}_sample-{number}"
        sample_folder.mkdir(parents=True, exist_ok=True)
        confidence = None
        if "pae_logits" in outputs:
            confidence = sample_confidence(outputs, number, positions, arrays, structure, labels, distogram_range)
            write_json(sample_folder / f"{name}_summary_confidences.json", confidence.summary, indent=1)
            write_json(sample_folder / f"{name}_confidences.json", confidence.full)
            scores.append(confidence.ranking_score)
        path = sample_folder / f"{name}_model.cif"
        write_mmcif(
            path, key, arrays, meta, positions, instances, None if confidence is None else confidence.atom_plddt
        )
        written.append(path)
    if scores:
        _write_ranking(folder, key, options.seed, written, scores)
    steps = model.config.sampler.sampler_steps if options.steps is None else options.steps
    _report(
        f"{key}: {int(batch['token_pad_mask'].sum())} tokens, {int(batch['atom_pad_mask'].sum())} atoms; "
        f"model {model_seconds:.2f} s ({options.cycles} cycles, {options.samples} samples x {steps} steps"
        f"{', bf16' if device.type == 'cuda' else ', fp32'}{', CUDA graphs' if options.cuda_graphs else ''}), "
        f"files written in {time.perf_counter() - written_from:.2f} s"
    )
    return written


def _write_ranking(folder: pathlib.Path, key: str, seed: int, models: list[pathlib.Path], scores: list[float]) -> None:
    """<key>_ranking_scores.csv (seed, sample, ranking_score) and copies of the best sample's
    files at the top of the folder, as AlphaFold 3 does."""
    lines = ["seed,sample,ranking_score"] + [f"{seed},{number},{score}" for number, score in enumerate(scores)]
    write_text_atomic(folder / f"{key}_ranking_scores.csv", "\n".join(lines) + "\n")
    best = max(range(len(scores)), key=lambda number: scores[number])  # the first of equals
    prefix = models[best].name.removesuffix("model.cif")
    for suffix in ("model.cif", "confidences.json", "summary_confidences.json"):
        with atomic_path(folder / f"{key}_{suffix}") as partial:  # a stopped run leaves no half copy
            shutil.copyfile(models[best].parent / f"{prefix}{suffix}", partial)
