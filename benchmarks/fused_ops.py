"""Fused small ops (LayerNorm+Linear, Transition, triangle multiplicative update) on the GPU.

    PYTHONUNBUFFERED=1 python3 benchmarks/fused_ops.py [--sweep [--variants N]] [--out DIR]
    python3 benchmarks/fused_ops.py --smoke

One process, so every provider is measured on the same machine in the same run:
  1. correctness at the benchmark sizes: the Triton kernels in bf16 against a float64 reference
     (output and every gradient), next to PyTorch's own bf16 error on the same inputs;
  2. --sweep: forward+backward time of the Triton op for candidate block sizes of each kernel,
     one kernel at a time (the others at their configured values); the fastest are printed and
     written to OUT/fused_ops_sweep.json for configs/fused_ops.json;
  3. timing: forward+backward median (CUDA events) and extra peak memory (above inputs, weights
     and the upstream gradient) for PyTorch eager, torch.compile of the same reference module,
     and the Triton kernels. All modules and inputs are bf16.
--smoke runs the same steps at tiny sizes on the CPU under TRITON_INTERPRET=1 (no torch.compile),
to check the script itself without a GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import pathlib
import sys
import traceback
from dataclasses import dataclass
from typing import Callable

import torch

if "--smoke" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # must precede the first triton.jit
_HERE = pathlib.Path(__file__).resolve().parent
sys.path[:0] = [str(_HERE), str(_HERE.parent)]
from common import (  # noqa: E402
    Table,
    extra_peak_mib,
    poison_allocator,
    relative_error,
    run_header,
    time_ms,
)

from featurecache.kernels import _common  # noqa: E402
from featurecache.kernels.layernorm_linear import LayerNormLinear  # noqa: E402
from featurecache.kernels.transition import Transition  # noqa: E402
from featurecache.kernels.triangle_mult import TriangleMultiplication  # noqa: E402

DTYPE = torch.bfloat16
DEVICE = "cuda"
# Benchmark sizes; --smoke shrinks them.
SIZES = {"rows": 147_456, "transition_length": 384, "triangle_length": 512, "channels": 128}
# Triton's error may be at most this multiple of eager bf16's error against float64 (+ floor).
ERROR_MULTIPLE, ERROR_FLOOR = 3.0, 1e-3


@dataclass
class Case:
    name: str
    op: str  # key in configs/fused_ops.json
    build: Callable[[str], torch.nn.Module]  # impl -> module
    make_inputs: Callable[[], tuple[list[torch.Tensor], torch.Tensor | None]]  # (diff, extra)
    target: str
    compile_peer: bool = True
    sweep: bool = True  # cases sharing an op's kernels sweep once


def _ln_linear_case(out_features: int) -> Case:
    rows, channels = SIZES["rows"], SIZES["channels"]

    def make():
        return [torch.randn(rows, channels, device=DEVICE, dtype=DTYPE) * 1.5 + 0.3], None

    return Case(f"LayerNorm+Linear {rows} x {channels} -> {out_features}", "layernorm_linear",
                lambda impl: LayerNormLinear(channels, out_features, impl=impl), make,
                ">= 1.3x torch.compile", sweep=out_features == 512)


def _transition_case() -> Case:
    length, channels = SIZES["transition_length"], SIZES["channels"]

    def make():
        shape = (1, length, length, channels)
        return [torch.randn(*shape, device=DEVICE, dtype=DTYPE) * 1.5 + 0.3], None

    return Case(f"Transition L={length} ({length * length} rows) C={channels} n=4", "transition",
                lambda impl: Transition(channels, expansion=4, impl=impl), make,
                "<= 1.0 ms, <= 577 MiB")


def _triangle_case(direction: str, compile_peer: bool) -> Case:
    length, channels = SIZES["triangle_length"], SIZES["channels"]

    def make():
        z = torch.randn(1, length, length, channels, device=DEVICE, dtype=DTYPE) * 1.5 + 0.3
        mask = torch.ones(1, length, length, device=DEVICE, dtype=torch.bool)
        mask[:, -length // 10:, :] = False  # 10 % padding, as a cropped batch has
        mask[:, :, -length // 10:] = False
        return [z], mask

    target = "<= 3.0 ms, <= 645 MiB" if direction == "outgoing" else "(no target)"
    return Case(f"TriangleMult {direction} L={length} C={channels}", "triangle_mult",
                lambda impl: TriangleMultiplication(channels, direction=direction, impl=impl),
                make, target, compile_peer, sweep=direction == "outgoing")


def _randomize(module: torch.nn.Module) -> None:
    # LayerNorm weights away from 1 and 0 so their gradients are exercised
    with torch.no_grad():
        for name, param in module.named_parameters():
            if "norm" in name:
                param.copy_(torch.randn_like(param) * 0.3 + (1.0 if name.endswith("weight") else 0))


def _step(module: torch.nn.Module, inputs: list[torch.Tensor], extra, grad_out: torch.Tensor):
    """Forward + backward; returns the output (callers drop it)."""
    out = module(*inputs) if extra is None else module(*inputs, extra)
    out.backward(grad_out)
    return out


def _grads(module, inputs, extra, grad_out) -> list[torch.Tensor]:
    for tensor in [*inputs, *module.parameters()]:
        tensor.grad = None
    out = _step(module, inputs, extra, grad_out)
    return [out.detach(), *(t.grad for t in inputs), *(p.grad for p in module.parameters())]


def check(case: Case, modules: dict[str, torch.nn.Module]) -> dict[str, float]:
    """Relative errors against float64 of the output and the worst gradient, eager vs Triton."""
    inputs, extra = case.make_inputs()
    grad_out = None
    truth_module = copy.deepcopy(modules["eager"]).double()
    inputs64 = [x.detach().double().requires_grad_() for x in inputs]
    with torch.no_grad():
        probe = truth_module(*inputs64) if extra is None else truth_module(*inputs64, extra)
    grad_out = torch.randn(probe.shape, device=DEVICE, dtype=torch.float64)
    del probe
    truth = _grads(truth_module, inputs64, extra, grad_out)
    result = {}
    for provider in ("eager", "triton"):
        leaves = [x.detach().to(DTYPE).requires_grad_() for x in inputs]
        poison_allocator()
        got = _grads(modules[provider], leaves, extra, grad_out.to(DTYPE))
        errors = [relative_error(g, t) for g, t in zip(got, truth)]
        result[f"{provider}_out"] = errors[0]
        result[f"{provider}_grad"] = max(errors[1:])
        result[f"{provider}_errors"] = errors
    ok = all(
        mine <= ERROR_MULTIPLE * ref + ERROR_FLOOR
        for mine, ref in zip(result["triton_errors"], result["eager_errors"])
    )
    result["ok"] = ok
    return result


def graph_ms(step: Callable[[], object], tensors: list[torch.Tensor]) -> float:
    """Median time of one CUDA-graph replay of step: GPU time without host launch overhead.

    NaN where step cannot be captured.
    """
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                for tensor in tensors:
                    tensor.grad = None
                step()
        torch.cuda.current_stream().wait_stream(side)
        for tensor in tensors:
            tensor.grad = None
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        return time_ms(graph.replay)
    except Exception as error:
        print(f"  graph capture failed: {type(error).__name__}: {str(error)[:160]}")
        return float("nan")


def measure(module, inputs, extra, grad_out) -> tuple[float, float, float]:
    """(fwd+bwd ms as called from Python, the same as a CUDA-graph replay, extra peak MiB)."""
    leaves = [x.detach().requires_grad_() for x in inputs]
    params = list(module.parameters())

    def step():
        return _step(module, leaves, extra, grad_out)

    step()  # compile / autotune outside the measurement
    for tensor in [*leaves, *params]:
        tensor.grad = None
    peak = extra_peak_mib(step)
    ms = time_ms(step, grad_to_none=[*leaves, *params])
    replay_ms = graph_ms(step, [*leaves, *params]) if DEVICE == "cuda" else float("nan")
    return ms, replay_ms, peak


# Candidates besides the configured default: neighbours of the configs/fused_ops.json entry
# (tuning history in benchmarks/NOTES-fused_ops.md); two each to fit the lease.
SWEEPS = {
    "layernorm_linear": {
        "fwd": [
            dict(BLOCK_M=128, BLOCK_N=128, num_warps=4, N_TILES=1),
            dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, N_TILES=1),
            # one program per row tile: x read and normalized once (N_TILES covers every tile)
            dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, N_TILES=64),
            dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, N_TILES=64),
            dict(BLOCK_M=128, BLOCK_N=128, num_warps=8, N_TILES=64),
            dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, N_TILES=3),
        ],
        "bwd_dx": [
            dict(BLOCK_M=128, BLOCK_N=32, num_warps=8),
            dict(BLOCK_M=32, BLOCK_N=32, num_warps=4),
            dict(BLOCK_M=128, BLOCK_N=64, num_warps=8),
            dict(BLOCK_M=64, BLOCK_N=64, num_warps=4),
        ],
        "bwd_dw": [
            dict(WEIGHT_GRADS="recompute", BLOCK_M=128, BLOCK_N=32, num_warps=4),
            dict(WEIGHT_GRADS="recompute", BLOCK_M=128, BLOCK_N=128, num_warps=8),
        ],
    },
    "transition": {
        "fwd": [
            dict(BLOCK_M=128, BLOCK_H=64, num_warps=8),
            dict(BLOCK_M=128, BLOCK_H=16, num_warps=8),
        ],
        "bwd_dx": [
            dict(BLOCK_M=128, BLOCK_H=64, num_warps=8),
            dict(BLOCK_M=128, BLOCK_H=16, num_warps=8),
        ],
        "bwd_dw": [dict(WEIGHT_GRADS="matmul"), dict(BLOCK_M=128, BLOCK_H=32, num_warps=8)],
    },
    "triangle_mult": {
        "proj": [
            dict(BLOCK_M=128, BLOCK_H=64, num_warps=8),
            dict(BLOCK_M=128, BLOCK_H=16, num_warps=4),
        ],
        "out": [dict(BLOCK_M=128, num_warps=8), dict(BLOCK_M=64, num_warps=4)],
        "bwd_out": [dict(BLOCK_M=64, num_warps=4), dict(BLOCK_M=128, num_warps=8)],
        "bwd_proj": [
            dict(BLOCK_M=128, BLOCK_H=32, num_warps=8),
            dict(BLOCK_M=64, BLOCK_H=16, num_warps=8),
        ],
        "bwd_dw_proj": [
            dict(BLOCK_M=128, BLOCK_H=64, num_warps=8),
            dict(BLOCK_M=128, BLOCK_H=16, num_warps=8),
        ],
        "bwd_dw_out": [
            dict(BLOCK_M=128, BLOCK_N=64, num_warps=8),
            dict(BLOCK_M=128, BLOCK_N=16, num_warps=8),
        ],
    },
}


def sweep(case: Case, module, inputs, extra, grad_out, winners: contextlib.ExitStack,
          variants_per_kernel: int) -> dict[str, dict[str, int]]:
    """Fastest block sizes for each kernel of case.op, one kernel varied at a time.

    Each winner stays in force (entered on `winners`) for the next kernels and the timing.
    """
    leaves = [x.detach().requires_grad_() for x in inputs]
    params = list(module.parameters())
    best = {}
    for kernel, variants in SWEEPS[case.op].items():
        timings = []
        for variant in [{}, *variants[:variants_per_kernel]]:
            with _common.override_config(case.op, kernel, **variant):
                try:
                    _step(module, leaves, extra, grad_out)
                    ms = time_ms(lambda: _step(module, leaves, extra, grad_out),
                                 warmup_ms=10, rep_ms=40, grad_to_none=[*leaves, *params])
                except Exception as error:  # a variant may exceed shared memory or registers
                    print(f"  {case.op}.{kernel} {variant}: failed ({type(error).__name__}: "
                          f"{str(error)[:120]})")
                    continue
            config = _common.kernel_config(case.op, kernel) if not variant else {
                **_common.kernel_config(case.op, kernel), **variant}
            timings.append((ms, config))
            print(f"  {case.op}.{kernel} {config}: {ms:.3f} ms")
        if timings:
            ms, config = min(timings, key=lambda item: item[0])
            best[kernel] = config
            print(f"  best {case.op}.{kernel}: {config} ({ms:.3f} ms)")
            winners.enter_context(_common.override_config(case.op, kernel, **config))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", action="store_true", help="time candidate block sizes first")
    parser.add_argument("--out", type=pathlib.Path, default=None, help="folder for JSON results")
    parser.add_argument("--variants", type=int, default=1,
                        help="candidates per kernel tried by --sweep, besides the default")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny sizes on the CPU under the Triton interpreter, no torch.compile")
    parser.add_argument("--ops", nargs="+", default=None,
                        choices=["transition", "triangle_mult", "layernorm_linear"],
                        help="only the cases of these ops (default: all)")
    args = parser.parse_args()
    global DEVICE
    if args.smoke:
        DEVICE = "cpu"
        SIZES.update(rows=200, transition_length=9, triangle_length=10, channels=32)
    elif not torch.cuda.is_available():
        sys.exit("benchmarks/fused_ops.py needs a CUDA GPU (or --smoke)")
    torch.manual_seed(0)
    print(run_header())

    # the swept case of an op comes first: its winners stay in force for the op's other cases
    cases = [_transition_case(), _triangle_case("outgoing", compile_peer=not args.smoke),
             _triangle_case("incoming", compile_peer=False),
             _ln_linear_case(512), _ln_linear_case(128)]
    cases = [case for case in cases if args.ops is None or case.op in args.ops]
    table = Table(["case", "provider", "fwd+bwd ms", "graph replay ms", "extra peak MiB",
                   "vs compile", "vs compile (graph)", "err out", "err worst grad", "target"])
    records, sweeps = [], {}
    winners = contextlib.ExitStack()
    for case in cases:
        print(f"== {case.name}")
        try:
            triton_module = case.build("triton").to(DEVICE)
            _randomize(triton_module)
            triton_module = triton_module.to(DTYPE)
            eager = case.build("torch").to(device=DEVICE, dtype=DTYPE)
            eager.load_state_dict(triton_module.state_dict())
            modules = {"eager": eager, "triton": triton_module}
            errors = check(case, modules)
            print(f"  errors vs float64 (out, then grads): eager "
                  f"{['%.2e' % e for e in errors['eager_errors']]}, triton "
                  f"{['%.2e' % e for e in errors['triton_errors']]} -> "
                  f"{'OK' if errors['ok'] else 'FAIL'}")
            inputs, extra = case.make_inputs()
            grad_out = torch.randn_like(inputs[0])
            if case.op == "layernorm_linear":
                grad_out = torch.randn(inputs[0].shape[0], triton_module.linear.out_features,
                                       device=DEVICE, dtype=DTYPE)
            if args.sweep and case.sweep:
                sweeps[case.op] = sweep(case, triton_module, inputs, extra, grad_out, winners,
                                          variants_per_kernel=args.variants)
            # ours first: a failed graph capture of a peer cannot spoil its numbers
            providers = {"triton": triton_module, "eager": eager}
            if case.compile_peer and not args.smoke:
                providers["compile"] = torch.compile(copy.deepcopy(eager), dynamic=False)
            results = {}
            for name, module in providers.items():
                results[name] = measure(module, inputs, extra, grad_out)
                print(f"  {name}: {results[name][0]:.3f} ms, graph {results[name][1]:.3f} ms, "
                      f"{results[name][2]:.0f} MiB")
            for name, (ms, replay_ms, mib) in results.items():
                speedup = results["compile"][0] / ms if "compile" in results else None
                graph_speedup = results["compile"][1] / replay_ms if "compile" in results else None
                err_out = errors[f"{name}_out"] if name in ("eager", "triton") else None
                err_grad = errors[f"{name}_grad"] if name in ("eager", "triton") else None
                table.add([case.name, name, ms, replay_ms, mib, speedup, graph_speedup, err_out,
                           err_grad, case.target if name == "triton" else ""])
                records.append({"case": case.name, "provider": name, "ms": ms,
                                "graph_ms": replay_ms, "peak_mib": mib,
                                "err_out": err_out, "err_grad": err_grad})
        except Exception:
            traceback.print_exc()
            table.add([case.name, "FAILED", *([None] * 7), case.target])
        if DEVICE == "cuda":
            torch.cuda.empty_cache()

    winners.close()
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "fused_ops.json").write_text(json.dumps(
            {"header": run_header(), "records": records}, indent=1))
        if sweeps:
            (args.out / "fused_ops_sweep.json").write_text(json.dumps(sweeps, indent=1))
    if sweeps:
        print("sweep winners:", json.dumps(sweeps))
    print(run_header())
    print(table.markdown())


if __name__ == "__main__":
    main()
