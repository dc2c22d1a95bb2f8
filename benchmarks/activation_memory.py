"""Where a full AF3 training step's memory goes, and the largest crop it allows.

    python3 benchmarks/activation_memory.py                       # CPU accounting, lengths 32 48 64
    python3 benchmarks/activation_memory.py --checkpoint-group 8  # the same with grouped checkpoints
    python3 benchmarks/activation_memory.py --lengths 128 192 256 --step-crops 2560 --checkpoint-group 8  # GPU

1. Accounting (any device). One forward and loss of the `af3` preset (48 Pairformer blocks,
   diffusion batch 48, --atoms-per-token, N_cycle 1, bf16 autocast) at each of three lengths,
   counting the bytes of every storage autograd saves for backward, by part of the model
   (featurecache.testing.memory_report), and the activations of one recomputed block of each
   checkpointed stack (what backward adds while it runs that block). Each part's bytes are
   fitted as a L^2 + b L + c through the lengths, and predicted at --predict lengths. The
   predicted peak is the fixed cost (20 bytes per parameter: fp32 weights, gradients, AdamW's
   two moments, the EMA copy) + everything saved + the largest recomputed block. On the CPU the
   pure-PyTorch path runs (its attention references hold [L, L] logits per row inside a
   recomputed block: that part is cubic, fitted as such); on a GPU the Triton kernels.
2. With --step-crops: one training iteration (forward, loss, backward, AdamW) of the same
   model at each crop, its peak memory and time; an out-of-memory is a row, not a crash.

The table prints last; with $OUT set it is also written to $OUT/activation_memory.md.
"""

from __future__ import annotations

import argparse
import gc
import os
import pathlib
import sys
import threading
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from featurecache.model import AF3Model, preset
from featurecache.testing.memory_report import (
    AF3_PARTS,
    SavedTensorCounter,
    growth_orders,
)
from featurecache.testing.synthetic import random_batch

GB = 1e9
# bytes per parameter that a step holds whatever the crop: fp32 weight, gradient, AdamW's exp_avg
# and exp_avg_sq, the EMA copy (featurecache.training.loop.WeightAverage)
FIXED_BYTES_PER_PARAMETER = 20
# The checkpointed stacks: (label, path to the ModuleList, whether its blocks run on the
# diffusion batch). One block of each is re-run with gradients to measure a recomputation.
STACKS = (
    ("Pairformer block", "pairformer.blocks"),
    ("MSA block", "msa_module.blocks"),
    ("template block", "template_embedder.blocks"),
    ("diffusion transformer block", "diffusion_module.transformer.blocks"),
    ("atom transformer block", "diffusion_module.atom_encoder.atom_transformer.transformer.blocks"),
    ("confidence Pairformer block", "confidence_head.pairformer.blocks"),
)


# the stacks whose blocks ModelConfig.runtime.checkpoint_group groups, and how many of a block's leading
# floating-point arguments are its state (held once per block of a re-run group; the rest, e.g.
# the diffusion transformer's s and pair, are shared by every block)
GROUPED = {"Pairformer block": 2, "MSA block": 2, "diffusion transformer block": 1}
# the parts whose saved tensors are still held when backward reaches the trunk (the diffusion
# module, the confidence head and the losses are done by then)
TRUNK_PARTS = ("input embedder", "templates", "MSA module", "Pairformer", "glue (AF3Model)")


def build(args, device: torch.device, checkpoint_group: int, rollout_steps: int | None = None) -> AF3Model:
    kernels = args.kernels or ("triton" if device.type == "cuda" else "torch")
    config = preset("af3", kernels=kernels, pairformer_blocks=args.depth, checkpoint_group=checkpoint_group)
    if rollout_steps is not None:  # the mini-rollout runs without gradient: it saves nothing
        config = config.replace(confidence_rollout_steps=rollout_steps)
    torch.manual_seed(0)
    with device:  # built in place: 368 M parameters initialised on the host take a while
        return AF3Model(config).train()


def make_batch(args, length: int, device: torch.device) -> dict:
    batch = random_batch(
        [length],
        [args.msa_rows],
        [args.templates],
        torch.Generator().manual_seed(length),
        num_atoms_per_token=args.atoms_per_token,
    )
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def autocast(device: torch.device):
    return torch.autocast(device.type, dtype=torch.bfloat16)


def forward_loss(model: AF3Model, batch: dict, args, device: torch.device) -> torch.Tensor:
    generator = torch.Generator(device).manual_seed(1)
    with autocast(device):
        outputs = model(batch, num_cycles=1, diffusion_batch=args.diffusion_batch, generator=generator)
        return model.loss(batch, outputs)[0]


def block_inputs(model: AF3Model) -> tuple[dict, list]:
    """Forward pre-hooks that keep the first call's inputs of block 0 of every stack."""
    captured, handles = {}, []
    for label, path in STACKS:
        blocks = model.get_submodule(path) if _has(model, path) else None
        if blocks is None or len(blocks) == 0:
            continue

        def keep(_module, args, label=label):
            captured.setdefault(label, tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in args))

        handles.append(blocks[0].register_forward_pre_hook(keep))
    return captured, handles


def _has(model: torch.nn.Module, path: str) -> bool:
    try:
        model.get_submodule(path)
        return True
    except AttributeError:
        return False


def recomputed_blocks(model: AF3Model, captured: dict, device: torch.device) -> dict[str, list]:
    """What one block of each stack saves when backward re-runs it with gradients."""
    result = {}
    for label, path in STACKS:
        if label not in captured:
            continue
        block = model.get_submodule(path)[0]
        inputs = tuple(
            a.requires_grad_() if isinstance(a, torch.Tensor) and a.is_floating_point() else a
            for a in (t.clone() if isinstance(t, torch.Tensor) else t for t in captured[label])
        )
        counter = SavedTensorCounter({"": label})
        with counter.watching(block), autocast(device):
            block(*inputs)
        result[label] = counter.saved
    return result


def account(args, length: int, device: torch.device, checkpoint_group: int) -> dict:
    """Every storage saved for backward, in order, by part; and each stack's recomputed block."""
    model = build(args, device, checkpoint_group, rollout_steps=1)
    batch = make_batch(args, length, device)
    captured, handles = block_inputs(model)
    counter = SavedTensorCounter(AF3_PARTS)
    with counter.watching(model):
        loss = forward_loss(model, batch, args, device)
    for handle in handles:
        handle.remove()
    del loss
    blocks = recomputed_blocks(model, captured, device)
    # each stack's block input (its state tensors): a re-run group keeps one per block
    inputs = {
        label: [
            (label, t.nbytes, tuple(t.shape), t.dtype)
            for t in args_
            if isinstance(t, torch.Tensor) and t.is_floating_point()
        ][: GROUPED.get(label, 0)]
        for label, args_ in captured.items()
    }
    sizes = {label: len(model.get_submodule(path)) for label, path in STACKS if label in captured}
    parameters = sum(p.numel() for p in model.parameters())
    del model, captured
    gc.collect()
    return {"saved": counter.saved, "blocks": blocks, "inputs": inputs, "sizes": sizes, "parameters": parameters}


def predicted_bytes(small: list, large: list, lengths: tuple[int, int], target: int) -> dict[str, list[float]]:
    """Per part: bytes at `target` that are [constant, linear, quadratic, cubic] in L, each storage
    scaled from the larger run by its own growth order."""
    orders = growth_orders(small, large, *lengths)
    by_part: dict[str, list[float]] = {}
    for (part, size, _shape, _dtype), order in zip(large, orders):
        by_part.setdefault(part, [0.0] * 4)[order] += size * (target / lengths[1]) ** order
    return by_part


def accounting_table(args, device: torch.device, group: int) -> tuple[list[str], dict]:
    small_length, large_length = args.lengths
    small, large = (account(args, length, device, group) for length in args.lengths)
    targets = args.predict
    by_target = {t: predicted_bytes(small["saved"], large["saved"], args.lengths, t) for t in targets}
    first = by_target[targets[0]]
    parts = sorted(first, key=lambda part: -sum(by_target[targets[-1]][part]))
    rows = [
        f"| checkpoint_group {group}: saved for backward | L={small_length} MB | L={large_length} MB | at L={targets[0]}: "
        "const / L / L^2 GB | " + " | ".join(f"L={t} GB" for t in targets) + " |",
        "| --- |" + " --- |" * (4 + len(targets)),
    ]
    totals = {t: 0.0 for t in targets}

    def measured(run_saved, part):
        return sum(size for name, size, _, _ in run_saved if name == part) / 1e6

    for part in parts:
        split = " / ".join(f"{first[part][order] / GB:.2f}" for order in range(3))
        rows.append(
            f"| {part} | {measured(small['saved'], part):.1f} | {measured(large['saved'], part):.1f} | {split} | "
            + " | ".join(f"{sum(by_target[t][part]) / GB:.2f}" for t in targets)
            + " |"
        )
        for t in targets:
            totals[t] += sum(by_target[t][part])
    rows.append("| **all saved** | | | | " + " | ".join(f"**{totals[t] / GB:.2f}**" for t in targets) + " |")
    block_peak = {t: 0.0 for t in targets}
    trunk_block = {t: 0.0 for t in targets}  # the largest re-run block (+ its group) of the trunk's stacks
    diffusion_block = {t: 0.0 for t in targets}
    group_inputs = {t: 0.0 for t in targets}  # a re-run group's other block inputs, the largest stack's
    for label, _ in STACKS:
        if label not in large["blocks"]:
            continue
        predicted = {
            t: sum(
                sum(v)
                for v in predicted_bytes(small["blocks"][label], large["blocks"][label], args.lengths, t).values()
            )
            for t in targets
        }
        title = f"one recomputed {label}"
        others = min(group, large["sizes"][label]) - 1
        if others > 0 and label in GROUPED:
            # backward re-runs a group: the inputs of its other blocks are held while one block runs
            title += f" + the inputs of {others} more (a re-run group)"
            for t in targets:
                held = predicted_bytes(small["inputs"][label], large["inputs"][label], args.lengths, t)
                predicted[t] += others * sum(sum(v) for v in held.values())
                group_inputs[t] = max(group_inputs[t], others * sum(sum(v) for v in held.values()))
        rows.append(
            f"| {title} (transient) | {sum(x[1] for x in small['blocks'][label]) / 1e6:.1f} | "
            f"{sum(x[1] for x in large['blocks'][label]) / 1e6:.1f} | | "
            + " | ".join(f"{predicted[t] / GB:.2f}" for t in targets)
            + " |"
        )
        block_peak = {t: max(block_peak[t], predicted[t]) for t in targets}
        if label in ("Pairformer block", "MSA block", "template block"):
            trunk_block = {t: max(trunk_block[t], predicted[t]) for t in targets}
        elif label == "diffusion transformer block":
            diffusion_block = predicted
    fixed = large["parameters"] * FIXED_BYTES_PER_PARAMETER
    trunk_saved = {t: sum(sum(by_target[t].get(part, [0.0])) for part in TRUNK_PARTS) for t in targets}
    rows.append(
        f"| **predicted peak**: {fixed / GB:.2f} GB fixed ({large['parameters'] / 1e6:.0f} M parameters x "
        f"{FIXED_BYTES_PER_PARAMETER} B) + all saved + largest block | | | | "
        + " | ".join(f"**{(fixed + totals[t] + block_peak[t]) / GB:.1f}**" for t in targets)
        + " |"
    )
    # where the peak can be: early in backward (everything saved, a diffusion transformer group
    # re-run) or in the trunk's backward (only the trunk's saved tensors, a Pairformer group re-run)
    rows.append(
        "| phase peak, diffusion backward: fixed + all saved + a re-run diffusion transformer group | | | | "
        + " | ".join(f"{(fixed + totals[t] + diffusion_block[t]) / GB:.1f}" for t in targets)
        + " |"
    )
    rows.append(
        f"| phase peak, trunk backward: fixed + saved by {', '.join(TRUNK_PARTS)} + the largest re-run "
        "trunk block and group | | | | "
        + " | ".join(f"{(fixed + trunk_saved[t] + trunk_block[t]) / GB:.1f}" for t in targets)
        + " |"
    )
    rows.append(
        "| fixed + all saved + a re-run group's block inputs (the block's own activations aside: they "
        "depend on the kernel path) | | | | "
        + " | ".join(f"{(fixed + totals[t] + group_inputs[t]) / GB:.1f}" for t in targets)
        + " |"
    )
    orders = growth_orders(small["saved"], large["saved"], *args.lengths)
    quadratic = sorted(
        ((size, part, shape, dtype) for (part, size, shape, dtype), order in zip(large["saved"], orders) if order >= 2),
        key=lambda item: item[0],
        reverse=True,
    )
    notes = [
        f"  {part}: {size / 1e6:.2f} MB {list(shape)} {str(dtype)[6:]}"
        for size, part, shape, dtype in quadratic[: args.show]
    ]
    return rows, {"notes": notes}


def gpu_step(args, crop: int, device: torch.device, group: int) -> str:
    """One training iteration at `crop`: peak memory (on a GPU) and seconds, or what stopped it."""
    cuda = device.type == "cuda"
    release(cuda)
    model = optimizer = None
    try:
        model = build(args, device, group)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        batch = make_batch(args, crop, device)
        if cuda:
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
        start = time.perf_counter()
        loss = forward_loss(model, batch, args, device)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize(device)
        seconds = time.perf_counter() - start  # the first step: includes Triton compilation
        return f"peak {peak_gb(device)}, {seconds:.1f} s (first step), loss {float(loss):.3f}"
    except torch.cuda.OutOfMemoryError:
        return f"OOM ({peak_gb(device)} allocated at the failure)"
    except Exception as error:  # noqa: BLE001 - one failed crop must not lose the others
        return f"{type(error).__name__}: {str(error).splitlines()[0][:160]}"
    finally:
        del model, optimizer
        release(cuda)


def peak_gb(device: torch.device) -> str:
    return f"{torch.cuda.max_memory_allocated(device) / GB:.1f} GB" if device.type == "cuda" else "n/a (no GPU)"


def release(cuda: bool) -> None:
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs=2, default=[32, 48], help="the two accounting lengths")
    parser.add_argument("--show", type=int, default=12, help="list this many of the largest L^2 storages")
    parser.add_argument("--predict", type=int, nargs="+", default=[384, 768, 2560], help="lengths to predict")
    parser.add_argument(
        "--checkpoint-group",
        type=int,
        nargs="+",
        default=[1],
        help="ModelConfig.runtime.checkpoint_group values to account (1: a checkpoint per block)",
    )
    parser.add_argument("--depth", type=int, default=48, help="Pairformer blocks")
    parser.add_argument("--diffusion-batch", type=int, default=48)
    parser.add_argument("--atoms-per-token", type=int, default=8)
    parser.add_argument("--msa-rows", type=int, default=1024)
    parser.add_argument("--templates", type=int, default=4)
    parser.add_argument(
        "--step-crops",
        type=int,
        nargs="*",
        default=[],
        help="GPU: one training iteration at each crop, with each --checkpoint-group",
    )
    parser.add_argument("--no-accounting", action="store_true", help="only the --step-crops iterations")
    parser.add_argument(
        "--kernels",
        choices=("triton", "torch"),
        help="triton (default on a GPU) or torch, the PyTorch references: eager (default on the CPU)",
    )
    parser.add_argument(
        "--budget-s",
        type=float,
        help="stop after this many seconds and print what was measured (a long crop's step takes minutes on a GPU)",
    )
    args = parser.parse_args()
    if args.lengths[0] >= args.lengths[1]:
        parser.error("--lengths: the second length must be the larger")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    watchdog = threading.Timer(args.budget_s or 1e9, lambda: finish(lines + ["| stopped by --budget-s |"], 3))
    watchdog.daemon = True
    watchdog.start()
    lines = [
        (
            f"# activation memory, af3 preset ({args.depth} Pairformer blocks, diffusion batch {args.diffusion_batch}, "
            f"{args.atoms_per_token} atoms per token, {args.msa_rows} MSA rows, {args.templates} templates), "
            f"{torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}, "
            f"{args.kernels or ('triton' if device.type == 'cuda' else 'torch')} kernels"
        )
    ]
    for group in args.checkpoint_group:
        if not args.no_accounting:
            rows, summary = accounting_table(args, device, group)
            lines += ["", *rows, "", f"largest L^2 storages saved at L={args.lengths[1]}:", *summary["notes"]]
            print("\n".join(lines[-len(rows) - len(summary["notes"]) - 3 :]), flush=True)
        for crop in args.step_crops:
            result = gpu_step(args, crop, device, group)
            lines.append(
                f"| training iteration, crop {crop}, checkpoint_group {group}, "
                f"{args.kernels or ('triton' if device.type == 'cuda' else 'torch')} kernels | {result} |"
            )
            print(lines[-1], flush=True)
    watchdog.cancel()
    finish(lines, 0)


def finish(lines: list[str], code: int) -> None:
    """Print the table (and write it under $OUT); end the process if `code` (the watchdog)."""
    text = "\n".join(lines)
    print("\n" + text, flush=True)
    if os.environ.get("OUT"):
        pathlib.Path(os.environ["OUT"]).mkdir(parents=True, exist_ok=True)
        (pathlib.Path(os.environ["OUT"]) / "activation_memory.md").write_text(text + "\n")
    if code:
        os._exit(code)


if __name__ == "__main__":
    main()
