"""What one af3 training step launches, counted on the CPU: every operator that is not a view, with
the source line that made it, grouped into the classes a GPU profile shows as small kernels.

    env -u TRITON_INTERPRET python3 benchmarks/step_operators.py [--tokens 32] [--top 30] [--no-plan]

The step runs as the graphed Trainer runs it (the af3 preset at full depth, bf16 autocast without
its cache, the diffusion batch of 48, inside step_weight_casts with the StepCastPlan of a first
step) under featurecache.testing.gpu_compile.compile_only: the Triton kernels compile for sm_90
and are not launched, so every other operator runs on CPU tensors with the shapes of `--tokens`
tokens. Counts barely depend on the size; which operators would be
large at crop 384 shows in their element count. Classes:
  strided     a pointwise operator whose operands are not all contiguous with the output's shape
              (a GPU runs these as the non-vectorized elementwise_kernel<128, 4>)
  bf16 copy   an fp32 -> bf16 conversion (bfloat16_copy_kernel)
  fp32 small  a pointwise operator on fp32 tensors of fewer than 65,536 elements (launch-bound)
  other       the rest
and the step's Triton launches by kernel. Last, the non-GEMM operators that make the most output
elements a step, whatever their class: the memory traffic a GPU spends on them (the table that
showed the token transformer's AdaLN running as PyTorch ops). Backward operators are attributed
to the forward line that made their autograd node (anomaly mode keeps that trace). Method and
counts: benchmarks/NOTES.md sections 21 to 24.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import traceback

import torch
from torch.utils._python_dispatch import TorchDispatchMode

SMALL = 1 << 16
# matrix products and the views of their results: their outputs are not passes over memory
PRODUCTS = ("mm", "addmm", "bmm", "baddbmm", "_unsafe_view")
VIEW_TAGS = (torch.Tag.view_copy,)


def _source(frames) -> str:
    """The innermost featurecache frame of a stack, as path:line function."""
    for frame in reversed(frames):
        filename = frame.filename if hasattr(frame, "filename") else frame[0]
        if "featurecache/" in filename and "testing/gpu_compile" not in filename and "weight_casts" not in filename:
            short = filename.split("featurecache/", 1)[1]
            return f"{short}:{frame.lineno} {frame.name}"
    return "?"


def _backward_source() -> str:
    node = torch._C._current_autograd_node()
    if node is None:
        return "?"
    lines = node.metadata.get("traceback_")
    if not lines:
        return f"({node.name()})"
    text = "".join(lines) if isinstance(lines, list) else str(lines)
    frames = [line.strip() for line in text.splitlines() if line.strip().startswith("File ")]
    for line in reversed(frames):
        if "featurecache/" in line and "weight_casts" not in line:
            path = line.split('"')[1].split("featurecache/", 1)[1]
            number = line.split("line ")[1].split(",")[0]
            function = line.rsplit("in ", 1)[-1]
            return f"{path}:{number} {function} <- {node.name()}"
    return f"({node.name()})"


def _tensors(args, kwargs):
    out = []
    for value in [*args, *kwargs.values()]:
        if isinstance(value, torch.Tensor):
            out.append(value)
        elif isinstance(value, (list, tuple)):
            out.extend(v for v in value if isinstance(v, torch.Tensor))
    return out


def _class(func, inputs, outputs) -> str:
    output = outputs[0] if outputs else None
    name = func.__name__
    if output is not None and output.dtype == torch.bfloat16 and name.startswith(("_to_copy", "copy_")):
        if any(t.dtype == torch.float32 for t in inputs):
            return "bf16 copy"
    if torch.Tag.pointwise in func.tags and output is not None:
        if output.dtype == torch.float32 and output.numel() < SMALL:
            return "fp32 small"
        operands = [t for t in inputs if t.dim() > 0] + [output]
        if any((not t.is_contiguous()) or t.shape != output.shape for t in operands):
            return "strided"
    return "other"


class OperatorCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.counts: collections.Counter = collections.Counter()
        self.elements: collections.Counter = collections.Counter()
        self.backward = False
        self.triton: collections.Counter = collections.Counter()  # Triton launches by kernel name

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        if (
            func.is_view
            or any(tag in func.tags for tag in VIEW_TAGS)
            or func.__name__.startswith(("empty", "new_empty"))
        ):
            return result
        outputs = [
            r for r in (result if isinstance(result, (list, tuple)) else [result]) if isinstance(r, torch.Tensor)
        ]
        kind = _class(func, _tensors(args, kwargs), outputs)
        where = _backward_source() if self.backward else _source(traceback.extract_stack())
        key = (
            kind,
            "bwd" if self.backward else "fwd",
            func.__name__,
            str(outputs[0].dtype)[6:] if outputs else "",
            where,
        )
        self.counts[key] += 1
        self.elements[key] += outputs[0].numel() if outputs else 0
        return result


def count_step(tokens: int, plan: bool = True) -> OperatorCounter:
    """The operators of one step; with `plan`, the second of two steps sharing a StepCastPlan
    (as the Trainer's steps after the first do)."""
    from featurecache.kernels.weight_casts import StepCastPlan, step_weight_casts
    from featurecache.model import AF3Model, preset
    from featurecache.testing.gpu_compile import compile_only
    from featurecache.testing.synthetic import random_batch

    counter = OperatorCounter()
    casts = StepCastPlan() if plan else None
    with compile_only() as launched:
        model = AF3Model(preset("af3", kernels="triton")).train()
        batch = random_batch([tokens], [16], [1], torch.Generator().manual_seed(0), num_atoms_per_token=8)
        for counted in [False, True] if plan else [True]:
            model.zero_grad(set_to_none=True)
            counter.backward = False
            mode = contextlib.ExitStack()
            if counted:  # the counter around the scope: a plan's casts are made on entering it
                mode.enter_context(counter)
                launches_before = len(launched)
            with mode, step_weight_casts(casts), torch.autograd.set_detect_anomaly(True, check_nan=False):
                # autocast's own cache off, as the CUDA-graph Trainer runs it (training/loop.py)
                with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
                    outputs = model(batch, num_cycles=1, diffusion_batch=48)
                loss = model.loss(batch, outputs)[0]
                counter.backward = True
                loss.backward()
        counter.triton = collections.Counter(kernel.name for kernel in launched[launches_before:])
    return counter


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--top", type=int, default=30, help="rows of each class's table")
    parser.add_argument(
        "--no-plan", action="store_true", help="one step without a StepCastPlan (each weight cast at its first use)"
    )
    args = parser.parse_args()
    if os.environ.get("TRITON_INTERPRET"):
        parser.error("unset TRITON_INTERPRET: the kernels must compile, not be interpreted")
    torch.manual_seed(0)
    counter = count_step(args.tokens, plan=not args.no_plan)
    by_class = collections.Counter()
    for key, count in counter.counts.items():
        by_class[key[0]] += count
    print(f"{sum(counter.counts.values())} operators a step at {args.tokens} tokens: {dict(by_class)}")
    print(f"{sum(counter.triton.values())} Triton launches: {dict(counter.triton.most_common(args.top))}")
    for kind in ("strided", "bf16 copy", "fp32 small"):
        print(f"\n{kind}: {by_class[kind]}")
        print("| calls | elements a call | pass | operator | dtype | made at |\n|---|---|---|---|---|---|")
        rows = sorted(((c, k) for k, c in counter.counts.items() if k[0] == kind), reverse=True)[: args.top]
        for count, key in rows:
            _, phase, name, dtype, where = key
            print(f"| {count} | {counter.elements[key] // count:,} | {phase} | {name} | {dtype} | {where} |")
    pointwise = {key: made for key, made in counter.elements.items() if not key[2].startswith(PRODUCTS)}
    print(f"\nmost output elements (non-GEMM operators, {sum(pointwise.values()) / 1e6:,.0f} M a step):")
    print("| M elements | calls | elements a call | pass | operator | dtype | made at |\n|---|---|---|---|---|---|---|")
    for key, made in sorted(pointwise.items(), key=lambda item: -item[1])[: args.top]:
        _, phase, name, dtype, where = key
        count = counter.counts[key]
        print(f"| {made / 1e6:,.1f} | {count} | {made // count:,} | {phase} | {name} | {dtype} | {where} |")


if __name__ == "__main__":
    main()
