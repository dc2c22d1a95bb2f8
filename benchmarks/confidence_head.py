"""What the confidence head costs a training step of the full AF3 model (issue 21): the `af3`
preset (or --preset) with and without the head (its 20-step mini-rollout without gradient, 4 Pairformer
blocks, the four losses), one training iteration (forward, loss, backward, AdamW) on a random
batch, bf16 autocast on a GPU, N_cycle 1.

    python3 benchmarks/confidence_head.py --crop 384 --out $OUT            # on the H200
    python3 benchmarks/confidence_head.py --preset tiny --crop 32 --diffusion-batch 2 --out /tmp/ch  # CPU check

Prints a markdown table (step ms, peak MiB, the head's share) and writes it with every number to
OUT/confidence_head.json and OUT/confidence_head.md.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import pathlib

import torch
from harness import Table, extra_peak_mib, run_stamp, time_ms

from featurecache.model import AF3Model, preset
from featurecache.testing.synthetic import random_batch


def step_function(with_head: bool, args, device: torch.device):
    overrides = {"confidence_head": with_head, "kernels": "triton" if device.type == "cuda" else "torch"}
    if args.depth is not None:
        overrides["pairformer_blocks"] = args.depth
    model = AF3Model(preset(args.preset, **overrides)).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    generator = torch.Generator().manual_seed(0)
    batch = random_batch([args.crop], [64], [2], generator, num_atoms_per_token=args.atoms_per_token)
    batch = {name: value.to(device) if isinstance(value, torch.Tensor) else value for name, value in batch.items()}
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else contextlib.nullcontext()

    def step():
        with autocast:
            outputs = model(batch, num_cycles=1, diffusion_batch=args.diffusion_batch)
        loss, _ = model.loss(batch, outputs)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss.detach()

    step()  # the optimizer state exists before memory is measured
    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="af3", help="model preset (tiny: a quick check on the CPU)")
    parser.add_argument("--crop", type=int, default=384)
    parser.add_argument("--depth", type=int, help="Pairformer blocks of the trunk (default: the preset's 48)")
    parser.add_argument("--diffusion-batch", type=int, default=48)
    parser.add_argument("--atoms-per-token", type=int, default=8)
    parser.add_argument("--out", default="results")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    stamp = run_stamp()
    results = {"stamp": dataclasses.asdict(stamp), "args": vars(args), "rows": []}
    table = Table(["variant", "crop", "step ms", "peak MiB"])
    for with_head in (False, True):
        step = step_function(with_head, args, device)
        milliseconds = time_ms(step, warmup_ms=1, rep_ms=1)
        peak = extra_peak_mib(step)
        name = "with confidence head" if with_head else "without"
        results["rows"].append({"variant": name, "crop": args.crop, "step_ms": milliseconds, "peak_mib": peak})
        table.add([name, args.crop, milliseconds, peak])
        del step
        if device.type == "cuda":
            torch.cuda.empty_cache()
    without, with_head = results["rows"]
    results["head_share_of_step"] = with_head["step_ms"] / without["step_ms"] - 1.0
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    text = (
        stamp.header()
        + "\n\n"
        + table.markdown()
        + f"\n\nthe head adds {100 * results['head_share_of_step']:.1f} % to the step\n"
    )
    (out / "confidence_head.md").write_text(text)
    (out / "confidence_head.json").write_text(json.dumps(results, indent=1, default=str))
    print(text)


if __name__ == "__main__":
    main()
