"""torch.compile with featurecache's kernels in the graph (custom ops), against the same modules
eager and compiled on the PyTorch path.

    PYTHONUNBUFFERED=1 python3 benchmarks/compiled_kernels.py [--out DIR] [--record]
    python3 benchmarks/compiled_kernels.py --smoke

Two blocks at crop 384 (10 % of the tokens padded), fp32 parameters and residual streams under
bf16 autocast, as training runs them: a Pairformer block (c_s 384, c_z 128, AF3's heads), and the
diffusion side's atom attention (ConditionedAttention over AtomWindows, 48 samples, 3,072 atoms).
Variants: "torch" (eager PyTorch path), "torch+compile" (torch.compile of it), "triton" (the
kernels, eager), "triton+compile" (torch.compile with the kernels as custom ops). Each is first
checked on fresh random inputs against a float64 run of the PyTorch path (outputs and the
gradients of every input and parameter); a compiled variant fails if its error exceeds 3x its
eager twin's + 1e-3. Then forward+backward median time and extra peak memory.
--smoke: tiny sizes on the CPU under TRITON_INTERPRET=1, compile backend aot_eager.
"""

from __future__ import annotations

import copy
import json
import os
import pathlib
import sys
import traceback

if "--smoke" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
from harness import Table, argument_parser, extra_peak_mib, run_stamp, time_ms  # noqa: E402
from records import Row, record  # noqa: E402

from featurecache.model.network.atom_attention import AtomWindows  # noqa: E402
from featurecache.model.network.pairformer import PairformerBlock  # noqa: E402
from featurecache.model.network.transformer import ConditionedAttention  # noqa: E402
from featurecache.testing.compare import rel_error  # noqa: E402

VARIANTS = ("torch", "torch+compile", "triton", "triton+compile")
ERROR_MULTIPLE, ERROR_FLOOR = 3.0, 1e-3


class AtomAttention(torch.nn.Module):
    """ConditionedAttention over atom windows, with the windows built from the padding mask."""

    def __init__(self, kernels: str, c_atom: int, c_pair: int, heads: int, queries: int, keys: int) -> None:
        super().__init__()
        self.attention = ConditionedAttention(c_atom, c_atom, c_pair, heads, kernels)
        self.queries, self.keys = queries, keys

    def forward(self, a, s, pair, atom_mask):
        return self.attention(a, s, pair, AtomWindows(atom_mask, self.queries, self.keys))


def cases(smoke: bool) -> list[tuple[str, callable, callable]]:
    """(name, build(kernels) -> module, make_inputs(device) -> (differentiable inputs, others))."""
    length = 7 if smoke else 384
    c_s, c_z, s_heads, s_dim, z_heads, z_dim = (16, 8, 2, 8, 2, 8) if smoke else (384, 128, 16, 24, 4, 32)

    def pairformer_inputs(device):
        token = torch.arange(length, device=device)[None] < -(-9 * length // 10)
        return (
            [torch.randn(1, length, c_s, device=device), torch.randn(1, length, length, c_z, device=device)],
            [token, token[:, :, None] & token[:, None, :]],
        )

    atoms, samples, c_atom, c_pair, heads = (45, 2, 16, 4, 2) if smoke else (3072, 48, 128, 16, 4)
    queries, keys = (8, 24) if smoke else (32, 128)
    windows = -(-atoms // queries)

    def atom_inputs(device):
        mask = torch.arange(atoms, device=device)[None] < -(-19 * atoms // 20)
        return (
            [
                torch.randn(1, samples, atoms, c_atom, device=device),
                torch.randn(1, 1, atoms, c_atom, device=device),
                torch.randn(1, windows, queries, keys, c_pair, device=device),
            ],
            [mask],
        )

    return [
        (
            f"Pairformer block L={length}",
            lambda kernels: PairformerBlock(c_s, c_z, s_heads, s_dim, z_heads, z_dim, 4, kernels=kernels),
            pairformer_inputs,
        ),
        (
            f"atom attention A={atoms} S={samples}",
            lambda kernels: AtomAttention(kernels, c_atom, c_pair, heads, queries, keys),
            atom_inputs,
        ),
    ]


def _step(module, inputs, others, autocast: bool):
    leaves = [x.detach().requires_grad_() for x in inputs]
    device_type = inputs[0].device.type
    with torch.autocast(device_type, dtype=torch.bfloat16, enabled=autocast):
        outs = module(*leaves, *others)
    outs = outs if isinstance(outs, tuple) else (outs,)
    # the gradient of sum(o^2 / 2 + 1e-3 o): every output element matters, none cancels
    torch.autograd.backward([o.float() for o in outs], [o.detach().float() + 1e-3 for o in outs])
    return outs, leaves


def _results(module, inputs, others, autocast):
    module.zero_grad(set_to_none=True)
    outs, leaves = _step(module, inputs, others, autocast)
    return (
        [o.detach().double() for o in outs]
        + [x.grad.double() for x in leaves]
        + [p.grad.double() for p in module.parameters() if p.grad is not None]
    )


def run_case(name, build, make_inputs, device, smoke) -> tuple[list[Row], list[str]]:
    torch.manual_seed(0)
    eager = build("torch").to(device)
    with torch.no_grad():
        for parameter in eager.parameters():  # gates and norms away from their constant init
            parameter.add_(torch.randn_like(parameter) * 0.1)
    modules = {"torch": eager, "triton": build("triton").to(device)}
    modules["triton"].load_state_dict(eager.state_dict())
    backend = "aot_eager" if smoke else "inductor"
    modules["torch+compile"] = torch.compile(copy.deepcopy(eager), backend=backend)
    modules["triton+compile"] = torch.compile(copy.deepcopy(modules["triton"]), backend=backend)
    compiled_of = {"torch+compile": "torch", "triton+compile": "triton"}

    inputs, others = make_inputs(device)
    truth_module = copy.deepcopy(eager).double()
    truth = _results(truth_module, [x.double() for x in inputs], others, autocast=False)
    rows, wrong, errors = [], [], {}
    for variant in VARIANTS:
        got = _results(modules[variant], inputs, others, autocast=True)
        errors[variant] = max(rel_error(a, b) for a, b in zip(got, truth))
    for variant, twin in compiled_of.items():
        if errors[variant] > ERROR_MULTIPLE * errors[twin] + ERROR_FLOOR:
            wrong.append(f"{name} {variant}")
    print(f"  worst relative error vs float64: {json.dumps({k: float(f'{v:.2e}') for k, v in errors.items()})}")
    for variant in VARIANTS:
        module = modules[variant]
        params = list(module.parameters())

        def step():
            return _step(module, inputs, others, autocast=True)

        step()
        ms = time_ms(step, grad_to_none=params)
        mib = extra_peak_mib(step)
        print(f"  {variant}: {ms:.3f} ms, {mib:.0f} MiB")
        for metric, value in (("fwd+bwd ms", ms), ("extra peak MiB", mib), ("err worst", errors[variant])):
            rows.append(Row("compiled_kernels", variant, name, metric, value))
    return rows, wrong


def main() -> None:
    parser = argument_parser(__doc__)
    parser.add_argument("--out", type=pathlib.Path, default=None, help="folder for compiled_kernels.json")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU, interpreter, aot_eager")
    args = parser.parse_args()
    if args.smoke and args.record:
        parser.error("--record with --smoke: a smoke run's numbers are not measurements")
    if not args.smoke and not torch.cuda.is_available():
        parser.error("benchmarks/compiled_kernels.py needs a CUDA GPU (or --smoke)")
    device = torch.device("cpu" if args.smoke else "cuda")
    stamp = run_stamp()
    print(stamp.header())
    rows, wrong, failed = [], [], []
    for name, build, make_inputs in cases(args.smoke):
        print(f"== {name}")
        try:
            case_rows, case_wrong = run_case(name, build, make_inputs, device, args.smoke)
            rows += case_rows
            wrong += case_wrong
        except Exception:  # one failing case must not lose the other's numbers
            traceback.print_exc()
            failed.append(name)
    values = {(r.shape, r.variant, r.metric): r.value for r in rows}
    table = Table(["case", "variant", "fwd+bwd ms", "vs torch", "vs torch+compile", "extra peak MiB", "err worst"])
    for name, _, _ in cases(args.smoke):
        for variant in VARIANTS:
            ms = values.get((name, variant, "fwd+bwd ms"))
            if ms is None:
                continue
            table.add(
                [
                    name,
                    variant,
                    ms,
                    values[(name, "torch", "fwd+bwd ms")] / ms,
                    values[(name, "torch+compile", "fwd+bwd ms")] / ms,
                    values[(name, variant, "extra peak MiB")],
                    values[(name, variant, "err worst")],
                ]
            )
    text = table.markdown()
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "compiled_kernels.json").write_text(
            json.dumps({"header": stamp.header(), "rows": [row.__dict__ for row in rows]}, indent=1)
        )
    print(stamp.header())
    print(text)
    if args.record:
        record(
            stamp,
            rows,
            "compiled_kernels",
            f"### Run of {stamp.header()}\n\n`python3 benchmarks/compiled_kernels.py --record`.\n\n{text}\n",
            "torch.compile with the kernels in the graph",
        )
    if failed or wrong:
        sys.exit(f"failed: {failed}; compiled errors past the bound: {wrong}")


if __name__ == "__main__":
    main()
