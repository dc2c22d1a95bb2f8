"""The share of step time spent waiting for data (benchmarks/train_step.py --cache / --online),
measured through the real training loop (featurecache.training) with DataLoader workers."""

from __future__ import annotations

import itertools
import tempfile

import harness  # noqa: F401  (puts the repository root on sys.path, for featurecache)
import torch


def data_wait_share(args, device: torch.device, source: str, kernels: str) -> dict:
    from featurecache.config import SampleConfig
    from featurecache.training import TrainConfig, train

    # the run's final checkpoint is large: keep it out of OUT
    run_dir = tempfile.mkdtemp(prefix=f"train-step-{source}-")
    common = {
        "out": run_dir,
        "preset": "af3",
        "model_settings": {"pairformer_blocks": args.depth},
        "kernels": kernels,
        "steps": args.data_steps,
        "sample": SampleConfig(crop_size=args.crop[0], msa_rows_per_sample=args.msa_rows),
        "num_workers": args.num_workers,
        "checkpoint_every": 10**9,
        "warmup": 10,
        "lr": 1e-4,
        "device": device.type,
        "cuda_graphs": args.data_graphs,
    }
    if args.smoke:
        common.update(preset="tiny", model_settings={"pairformer_blocks": 1})
    if source == "cache":
        config = TrainConfig(cache=args.cache, **common)
    else:
        config = TrainConfig(online=args.online, alignments=args.alignments, template_dir=args.template_dir, **common)
    records = train(config)
    # The first epoch (three targets, three steps) starts the workers and compiles the kernels
    # for each new length: left out, as a long run pays it once. With CUDA graphs, so is the
    # step that captures the graph (the fourth).
    captured_at = 4 if args.data_graphs else 0
    steady = [r for r in records if r["epoch"] > 0 and r["step"] > captured_at]
    wait = sum(r["data_wait_s"] for r in steady)
    total = sum(r["step_time_s"] for r in steady)
    # Steps that are not the first of their epoch (where a per-epoch loader would restart workers).
    inside = [
        r
        for previous, r in itertools.pairwise(records)
        if r["epoch"] == previous["epoch"] and r["epoch"] > 0 and r["step"] > captured_at
    ]
    inside_wait = sum(r["data_wait_s"] for r in inside)
    inside_total = sum(r["step_time_s"] for r in inside)
    return {
        "share": wait / total,
        "wait_ms": 1e3 * wait / len(steady),
        "step_ms": 1e3 * total / len(steady),
        "steps": len(steady),
        "share_within_epoch": inside_wait / inside_total if inside else None,
        "steps_within_epoch": len(inside),
        "kernels": kernels,
        "cuda_graphs": args.data_graphs,
    }
