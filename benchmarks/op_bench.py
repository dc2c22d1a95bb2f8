"""The run shared by the per-op benchmarks (layernorm_linear.py, transition.py, triangle_mult.py,
gated_attention.py, residual.py): each script names its cases and sweep candidates, this runs them.

One process, so every provider is measured on the same machine in the same run:
  1. correctness at the benchmark sizes: the Triton op in its benchmark dtype against a float64
     run of the same module (output and every gradient), next to PyTorch's own error on the same
     inputs; a case fails if any Triton error exceeds ERROR_MULTIPLE x eager's + ERROR_FLOOR;
  2. --sweep: forward+backward time for candidate block sizes of each kernel of the op, one
     kernel at a time (the others at their configured values); each winner stays in force for
     the next kernels and the timing, and all are written to OUT/<op>_sweep.json, which
     benchmarks/apply_sweep.py merges into featurecache/kernels/configs/fused_ops.json;
  3. timing: forward+backward median as called from Python, the same step replayed as a CUDA
     graph (GPU time alone), and extra peak memory (above inputs, weights and the upstream
     gradient), for PyTorch eager (kernels="torch"), torch.compile of that module, and Triton.
--smoke runs the same steps at tiny sizes on the CPU under TRITON_INTERPRET=1 (no torch.compile),
to check a script without a GPU; its times mean nothing.

Importing this module with --smoke on the command line sets TRITON_INTERPRET=1, which must
happen before the first kernel is compiled: the scripts import it before featurecache.kernels.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import pathlib
import sys
import traceback
from dataclasses import dataclass, field
from collections.abc import Callable

if "--smoke" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
from harness import Table, argument_parser, extra_peak_mib, graph_ms, poison_allocator, run_stamp, time_ms  # noqa: E402
from records import Row, record  # noqa: E402

from featurecache.kernels import runtime  # noqa: E402
from featurecache.testing.compare import rel_error  # noqa: E402

DTYPE = torch.bfloat16  # modules and inputs, unless a case's inputs say otherwise
ERROR_MULTIPLE, ERROR_FLOOR = 3.0, 1e-3
Inputs = tuple[list[torch.Tensor], list]  # (differentiable inputs, other arguments such as masks)


@dataclass
class Case:
    name: str  # row label, e.g. "Transition L=384 C=128 n=4"
    shape: str  # the shape part of the name, for results.csv
    build: Callable[[str], torch.nn.Module]  # kernels ("triton" | "torch") -> module on the CPU
    make_inputs: Callable[[torch.device], Inputs]  # fresh inputs in the benchmark dtypes
    target: str = ""  # the target for the Triton row, if any
    compile_peer: bool = True  # time torch.compile of the eager module too
    sweep: bool = True  # the case --sweep tunes on (an op's cases share its kernels)


@dataclass
class OpBenchmark:
    op: str  # the script's stem, and the op's key in configs/fused_ops.json
    title: str  # "Transition": RESULTS.md's section is headed "Transition (`benchmarks/transition.py`)"
    cases: Callable[[bool], list[Case]]  # smoke -> cases; the swept case first
    sweeps: dict[str, list[dict]] = field(default_factory=dict)  # kernel -> candidate configs


def _outputs(module: torch.nn.Module, inputs: list[torch.Tensor], others: list) -> tuple[torch.Tensor, ...]:
    out = module(*inputs, *others)
    return out if isinstance(out, tuple) else (out,)


def _step(module, inputs, others, grad_outs) -> tuple[torch.Tensor, ...]:
    """Forward + backward; returns the outputs (callers drop them)."""
    outs = _outputs(module, inputs, others)
    torch.autograd.backward(outs, [grad.to(out.dtype) for grad, out in zip(grad_outs, outs)])
    return outs


def _results(module, inputs, others, grad_outs) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(outputs, gradients of every input and parameter) of one fresh step."""
    for tensor in [*inputs, *module.parameters()]:
        tensor.grad = None
    outs = _step(module, inputs, others, grad_outs)
    return [out.detach() for out in outs], [t.grad for t in [*inputs, *module.parameters()]]


def check(case: Case, modules: dict[str, torch.nn.Module], device: torch.device) -> dict:
    """Relative errors against float64 of the outputs and the gradients, eager vs Triton."""
    inputs, others = case.make_inputs(device)
    truth_module = copy.deepcopy(modules["eager"]).double()
    inputs64 = [x.detach().double().requires_grad_() for x in inputs]
    others64 = [o.double() if torch.is_tensor(o) and o.is_floating_point() else o for o in others]
    with torch.no_grad():
        probe = _outputs(truth_module, inputs64, others64)
    grad_outs = [torch.randn(out.shape, device=device, dtype=torch.float64) for out in probe]
    del probe
    truth_outs, truth_grads = _results(truth_module, inputs64, others64, grad_outs)
    result = {}
    for provider in ("eager", "triton"):
        leaves = [x.detach().requires_grad_() for x in inputs]
        poison_allocator()
        outs, grads = _results(modules[provider], leaves, others, grad_outs)
        out_errors = [rel_error(mine, truth) for mine, truth in zip(outs, truth_outs)]
        grad_errors = [rel_error(mine, truth) for mine, truth in zip(grads, truth_grads)]
        result[provider] = {"out": max(out_errors), "grad": max(grad_errors), "all": out_errors + grad_errors}
    result["ok"] = all(
        mine <= ERROR_MULTIPLE * eager + ERROR_FLOOR
        for mine, eager in zip(result["triton"]["all"], result["eager"]["all"])
    )
    return result


def measure(module, inputs, others, grad_outs) -> tuple[float, float, float]:
    """(fwd+bwd ms as called from Python, the same as a CUDA-graph replay, extra peak MiB)."""
    leaves = [x.detach().requires_grad_() for x in inputs]
    cleared = [*leaves, *module.parameters()]

    def step():
        return _step(module, leaves, others, grad_outs)

    step()  # compile / autotune outside the measurement
    for tensor in cleared:
        tensor.grad = None
    peak = extra_peak_mib(step)
    return time_ms(step, grad_to_none=cleared), graph_ms(step, cleared), peak


def sweep(
    bench: OpBenchmark, module, inputs, others, grad_outs, winners: contextlib.ExitStack, variants_per_kernel: int
) -> dict[str, dict]:
    """Fastest block sizes for each kernel of the op, one kernel varied at a time.

    Each winner stays in force (entered on `winners`) for the next kernels and the timing.
    """
    leaves = [x.detach().requires_grad_() for x in inputs]
    cleared = [*leaves, *module.parameters()]
    best = {}
    for kernel, candidates in bench.sweeps.items():
        timings = []
        for variant in [{}, *candidates[:variants_per_kernel]]:
            with runtime.override_config(bench.op, kernel, **variant):
                try:
                    _step(module, leaves, others, grad_outs)
                    ms = time_ms(
                        lambda: _step(module, leaves, others, grad_outs), warmup_ms=10, rep_ms=40, grad_to_none=cleared
                    )
                except Exception as error:  # a variant may exceed shared memory or registers
                    print(f"  {bench.op}.{kernel} {variant}: failed ({type(error).__name__}: {str(error)[:120]})")
                    continue
                config = runtime.kernel_config(bench.op, kernel)
            timings.append((ms, config))
            print(f"  {bench.op}.{kernel} {config}: {ms:.3f} ms")
        if timings:
            ms, config = min(timings, key=lambda item: item[0])
            best[kernel] = config
            print(f"  best {bench.op}.{kernel}: {config} ({ms:.3f} ms)")
            winners.enter_context(runtime.override_config(bench.op, kernel, **config))
    return best


def _randomize(module: torch.nn.Module) -> None:
    # LayerNorm weights away from 1 and 0 so that their gradients are exercised
    with torch.no_grad():
        for name, param in module.named_parameters():
            if "norm" in name:
                param.copy_(torch.randn_like(param) * 0.3 + (1.0 if name.endswith("weight") else 0))


def _modules(case: Case, device: torch.device) -> dict[str, torch.nn.Module]:
    """Triton and eager modules with the same (randomized) parameters, in DTYPE."""
    triton_module = case.build("triton").to(device)
    _randomize(triton_module)
    triton_module = triton_module.to(DTYPE)
    eager = case.build("torch").to(device=device, dtype=DTYPE)
    eager.load_state_dict(triton_module.state_dict())
    return {"eager": eager, "triton": triton_module}


def run_case(
    bench: OpBenchmark,
    case: Case,
    device: torch.device,
    smoke: bool,
    sweep_variants: int | None,
    winners: contextlib.ExitStack,
    peers: bool = True,
) -> tuple[list[Row], dict | None, bool]:
    """Check, optionally sweep, then time one case: its rows for results.csv, its sweep winners,
    and whether the Triton op's errors were within bounds."""
    modules = _modules(case, device)
    errors = check(case, modules, device)
    print(
        f"  errors vs float64 (outputs, then gradients): eager {[f'{e:.2e}' for e in errors['eager']['all']]}, "
        f"triton {[f'{e:.2e}' for e in errors['triton']['all']]} -> {'OK' if errors['ok'] else 'FAIL'}"
    )
    inputs, others = case.make_inputs(device)
    with torch.no_grad():
        grad_outs = [torch.randn_like(out) for out in _outputs(modules["triton"], inputs, others)]
    winners_found = None
    if sweep_variants is not None and case.sweep and bench.sweeps:
        winners_found = sweep(bench, modules["triton"], inputs, others, grad_outs, winners, sweep_variants)
    # ours first: a failed graph capture of a peer cannot spoil its numbers
    providers = {"triton": modules["triton"]}
    if peers:
        providers["eager"] = modules["eager"]
    if peers and case.compile_peer and not smoke:
        providers["compile"] = torch.compile(copy.deepcopy(modules["eager"]), dynamic=False)
    rows = []
    for name, module in providers.items():
        ms, replay_ms, mib = measure(module, inputs, others, grad_outs)
        print(f"  {name}: {ms:.3f} ms, graph {replay_ms:.3f} ms, {mib:.0f} MiB")
        numbers = {"fwd+bwd ms": ms, "graph replay ms": replay_ms, "extra peak MiB": mib}
        if name in errors:
            numbers.update({"err out": errors[name]["out"], "err worst grad": errors[name]["grad"]})
        rows += [Row(bench.op, name, case.shape, metric, value) for metric, value in numbers.items()]
    return rows, winners_found, errors["ok"]


def table(cases: list[Case], rows: list[Row], failed: set[str]) -> Table:
    """Markdown table of every case and provider, with speed-ups against torch.compile."""
    out = Table(
        [
            "case",
            "provider",
            "fwd+bwd ms",
            "graph replay ms",
            "extra peak MiB",
            "vs compile",
            "vs compile (graph)",
            "err out",
            "err worst grad",
            "target",
        ]
    )
    values = {(r.shape, r.variant, r.metric): r.value for r in rows}
    for case in cases:
        if case.name in failed:
            out.add([case.name, "FAILED", *([None] * 7), case.target])
            continue
        for provider in ("triton", "eager", "compile"):
            if (case.shape, provider, "fwd+bwd ms") not in values:
                continue

            def get(metric, variant=provider):
                return values.get((case.shape, variant, metric))

            def speedup(metric):
                peer = get(metric, "compile")
                return None if peer is None else peer / get(metric)

            out.add(
                [
                    case.name,
                    provider,
                    get("fwd+bwd ms"),
                    get("graph replay ms"),
                    get("extra peak MiB"),
                    speedup("fwd+bwd ms"),
                    speedup("graph replay ms"),
                    get("err out"),
                    get("err worst grad"),
                    case.target if provider == "triton" else "",
                ]
            )
    return out


def main(bench: OpBenchmark, doc: str) -> None:
    parser = argument_parser(doc)
    parser.add_argument("--sweep", action="store_true", help="time candidate block sizes first (see above)")
    parser.add_argument(
        "--variants", type=int, default=1, help="candidates per kernel tried by --sweep, besides the configured one"
    )
    parser.add_argument(
        "--out",
        type=pathlib.Path,
        default=None,
        help=f"folder for {bench.op}.json (every number) and {bench.op}_sweep.json",
    )
    parser.add_argument(
        "--smoke", action="store_true", help="tiny sizes on the CPU under the Triton interpreter, no torch.compile"
    )
    parser.add_argument(
        "--no-peers",
        action="store_true",
        help="time the Triton op alone (no eager or torch.compile rows): a sweep's call without the peers' compile time",
    )
    args = parser.parse_args()
    if args.smoke and args.record:
        parser.error("--record with --smoke: a smoke run's numbers are not measurements")
    if args.sweep and not bench.sweeps:
        parser.error(f"{bench.op} has no tunable block sizes to sweep")
    if not args.smoke and not torch.cuda.is_available():
        parser.error(f"benchmarks/{bench.op}.py needs a CUDA GPU (or --smoke)")
    device = torch.device("cpu" if args.smoke else "cuda")
    torch.manual_seed(0)
    stamp = run_stamp()
    print(stamp.header())

    cases = bench.cases(args.smoke)
    rows, failed, wrong, sweeps = [], set(), [], {}
    winners = contextlib.ExitStack()
    for case in cases:
        print(f"== {case.name}")
        try:
            case_rows, found, ok = run_case(
                bench, case, device, args.smoke, args.variants if args.sweep else None, winners, not args.no_peers
            )
            rows += case_rows
            if not ok:
                wrong.append(case.name)
            if found:
                sweeps[bench.op] = found
        except Exception:  # one failing case must not lose the others' numbers
            traceback.print_exc()
            failed.add(case.name)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    winners.close()

    text = table(cases, rows, failed).markdown()
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"{bench.op}.json").write_text(
            json.dumps({"header": stamp.header(), "rows": [row.__dict__ for row in rows]}, indent=1)
        )
        if sweeps:
            (args.out / f"{bench.op}_sweep.json").write_text(json.dumps(sweeps, indent=1))
    if sweeps:
        print("sweep winners:", json.dumps(sweeps))
    print(stamp.header())
    print(text)
    if args.record:
        sweep_note = (
            f" `--sweep --variants {args.variants}`: the winners were in force for the timings." if args.sweep else ""
        )
        record(
            stamp,
            rows,
            bench.op,
            f"### Run of {stamp.header()}\n\n`python3 benchmarks/{bench.op}.py --record`.{sweep_note}\n\n{text}\n",
            bench.title,
        )
    if failed or wrong:
        sys.exit(f"failed: {sorted(failed)}; errors past the bound: {wrong}")
