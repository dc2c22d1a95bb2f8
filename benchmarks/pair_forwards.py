"""The pair stack's fused forwards (and the Transition's backward) at the af3 preset's shapes, tile
by tile, beside PyTorch's own.

    python3 benchmarks/pair_forwards.py [--rows 147456]      # a GPU: every candidate, then the table
    python3 benchmarks/pair_forwards.py --smoke              # the CPU (interpreter): tiny rows, checks only
    python3 benchmarks/pair_forwards.py --only transition_backward   # one part

At crop 384 the pair has 147,456 rows of c_z = 128, and the af3 step's kernel profile (NOTES.md
section 11) puts LayerNorm-linear's forward first (616 calls, 184 us on average) and the
Transition's next. Each case times the forward alone (CUDA-event median, triton.testing.do_bench)
for the configured tiles, a few candidates around them (runtime.override_config), and PyTorch
eager (layer_norm and cuBLAS products in bf16), after checking every candidate's output against an
fp32 reference with a tolerance from bf16's rounding of the output. The Transition runs at the
pair's, the single's and the MSA module's shapes (one tile entry serves all three). The
backwards of the Transition (its dx kernel spills at the tuned tiles: NOTES.md section 14) and of
the wide LayerNorm-linear are timed the same way, dx kernel candidates against PyTorch eager's
autograd, each checked on dx and the weight gradients. Last, a Linear's bias gradient, the column
sums of its output gradient (345 reductions of a graphed af3 step at 60 us each, NOTES.md section
18), by PyTorch's reduction and by a cuBLAS product with a ones row, at the pair's and the
diffusion transformer's shapes. And the triangle multiplication's backward, candidates for each
of its kernels (the configured tiles spill), checked against the configured tiles' gradients. What a candidate wins here must still be
checked in the step (tiny_step.py --preset af3): the shapes are the model's, the neighbours in
the cache are not.
"""

from __future__ import annotations

import functools
import math
import os
import sys

if "--smoke" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
from harness import Table, argument_parser, run_stamp, time_ms  # noqa: E402

from featurecache.kernels import runtime  # noqa: E402
from featurecache.kernels.layernorm_linear.launch import layernorm_linear_bwd, layernorm_linear_fwd  # noqa: E402
from featurecache.kernels.reference import layernorm_linear_reference, transition_reference  # noqa: E402
from featurecache.kernels.transition.launch import transition_bwd, transition_fwd  # noqa: E402
from featurecache.kernels.triangle_mult.launch import triangle_mult_bwd, triangle_mult_fwd  # noqa: E402

LAYERNORM_LINEAR_CANDIDATES = [
    dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=2, N_TILES=1),
    dict(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=2, N_TILES=1),
    dict(BLOCK_M=64, BLOCK_N=128, num_warps=4, num_stages=2, N_TILES=1),
    dict(BLOCK_M=128, BLOCK_N=64, num_warps=4, num_stages=3, N_TILES=1),
    dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=2, N_TILES=64),
    dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=2, N_TILES=1),
]
TRANSITION_DX_CANDIDATES = [
    dict(BLOCK_M=128, BLOCK_H=64, num_warps=8, num_stages=2),
    dict(BLOCK_M=64, BLOCK_H=64, num_warps=8, num_stages=2),
    dict(BLOCK_M=64, BLOCK_H=64, num_warps=4, num_stages=2),
    dict(BLOCK_M=64, BLOCK_H=32, num_warps=4, num_stages=2),
    dict(BLOCK_M=32, BLOCK_H=64, num_warps=4, num_stages=2),
    dict(BLOCK_M=128, BLOCK_H=32, num_warps=8, num_stages=2),
]
LAYERNORM_LINEAR_DX_CANDIDATES = [
    dict(BLOCK_M=128, BLOCK_N=32, num_warps=8, num_stages=2),
    dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=2),
    dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=2),
    dict(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=3),
    dict(BLOCK_M=128, BLOCK_N=128, num_warps=8, num_stages=2),
    dict(BLOCK_M=64, BLOCK_N=128, num_warps=4, num_stages=2),
]
# The triangle multiplication's backward kernels spill at the H200's tiles on sm_90 (ptxas -v,
# gpu_compile: bwd_proj 128 x 32 / 8 warps 628 B a thread, bwd_dw_proj 128 x 64 / 8 warps 932 B);
# these candidates spill 144 B. Each is timed as the whole backward with that one kernel's tiles.
TRIANGLE_BACKWARD_CANDIDATES = {
    "bwd_proj": [
        dict(BLOCK_M=64, BLOCK_H=32, num_warps=8, num_stages=2),
        dict(BLOCK_M=32, BLOCK_H=32, num_warps=4, num_stages=2),
        dict(BLOCK_M=64, BLOCK_H=64, num_warps=8, num_stages=2),
    ],
    "bwd_dw_proj": [
        dict(BLOCK_M=128, BLOCK_H=32, num_warps=8, num_stages=2),
        dict(BLOCK_M=64, BLOCK_H=32, num_warps=4, num_stages=2),
    ],
    "bwd_dw_out": [dict(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=2)],
    "bwd_out": [dict(BLOCK_M=32, num_warps=4, num_stages=2), dict(BLOCK_M=64, num_warps=8, num_stages=2)],
}
TRANSITION_CANDIDATES = [
    dict(BLOCK_M=128, BLOCK_H=64, num_warps=8, num_stages=2),
    dict(BLOCK_M=64, BLOCK_H=64, num_warps=4, num_stages=2),
    dict(BLOCK_M=128, BLOCK_H=32, num_warps=8, num_stages=2),
    dict(BLOCK_M=64, BLOCK_H=128, num_warps=8, num_stages=2),
    dict(BLOCK_M=128, BLOCK_H=128, num_warps=8, num_stages=2),
]


def _layernorm(channels: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    return 1 + 0.1 * torch.randn(channels, device=device), 0.1 * torch.randn(channels, device=device)


def _close(out: torch.Tensor, reference: torch.Tensor, sum_length: int) -> float:
    """The largest error over the reference's scale; nan past the tolerance: a few bf16 roundings
    of the operands and the output (2^-8 each, relative to the scale: on random data their errors
    grow with the sum no faster than the sum itself) plus fp32 accumulation's worst case over the
    sum's length (its length x 2^-24)."""
    scale = reference.abs().max().item() or 1.0
    error = (out.float() - reference).abs().max().item() / scale
    allowed = 4 * 2**-8 + sum_length * 2**-24
    return error if error <= allowed else float("nan")


def _gradient_error(grads, reference, sum_lengths) -> float:
    """The largest of _close over several gradients, nan if any is over its tolerance."""
    errors = [_close(grad, ref, length) for grad, ref, length in zip(grads, reference, sum_lengths)]
    return float("nan") if any(math.isnan(error) for error in errors) else max(errors)


def time_candidates(table: Table, name: str, op: str, kernel: str, candidates: list[dict], call, error_of) -> None:
    """One row per candidate tile set of `op`'s `kernel`: error_of(call()) and call's time with
    those tiles in force, or why the candidate failed (a tile that does not fit); then the
    configured tiles."""
    for candidate in candidates:
        with runtime.override_config(op, kernel, **candidate):
            try:
                table.add([name, str(candidate), error_of(call()), time_ms(call)])
            except Exception as failure:
                table.add([name, str(candidate), "–", f"failed: {type(failure).__name__}"])
    table.add([name, "configured: " + str(runtime.kernel_config(op, kernel)), "", ""])


def _transition_weights(device, channels: int = 128) -> list[torch.Tensor]:
    """weight_a, weight_b [4c, c] and weight_out [c, 4c], bf16, unit-variance outputs."""
    hidden = 4 * channels
    weights = [(torch.randn(hidden, channels, device=device) / channels**0.5).to(torch.bfloat16) for _ in range(2)]
    return [*weights, (torch.randn(channels, hidden, device=device) / hidden**0.5).to(torch.bfloat16)]


def _eager_transition(x, norm_w, norm_b, weight_a, weight_b, weight_out) -> torch.Tensor:
    """PyTorch's own transition: layer_norm, then cuBLAS products and SwiGLU in x's dtype."""
    xn = torch.nn.functional.layer_norm(x, (x.shape[-1],), norm_w.to(x.dtype), norm_b.to(x.dtype))
    hidden = torch.nn.functional.silu(torch.nn.functional.linear(xn, weight_a)) * torch.nn.functional.linear(
        xn, weight_b
    )
    return torch.nn.functional.linear(hidden, weight_out)


def transition_cases(rows: int, msa_depth: int) -> list[tuple[str, int, int]]:
    # (name, rows, channels): the pair's transition at `rows` pair rows, the single's at the crop's
    # tokens, the MSA module's at msa_depth rows of them (the tiles are one entry for all three)
    tokens = max(1, math.isqrt(rows))
    return [
        (f"Transition {rows} x 128, n = 4 (pair)", rows, 128),
        (f"Transition {tokens} x 384, n = 4 (single)", tokens, 384),
        (f"Transition {msa_depth * tokens} x 64, n = 4 (MSA)", msa_depth * tokens, 64),
    ]


def layernorm_linear_cases(rows: int) -> list[tuple[str, int, int, bool]]:
    # (name, in features, out features, aligned rows): triangle attention's packed projection,
    # a pair bias, the diffusion conditioning's pair input
    return [
        (f"LN-linear {rows} x 128 -> 516 (triangle attention)", 128, 516, True),
        (f"LN-linear {rows} x 128 -> 16 (pair bias)", 128, 16, False),
        (f"LN-linear {rows} x 256 -> 128 (diffusion pair input)", 256, 128, False),
    ]


def run_layernorm_linear(rows: int, device, table: Table) -> None:
    for name, n_in, n_out, aligned in layernorm_linear_cases(rows):
        x = torch.randn(rows, n_in, device=device, dtype=torch.bfloat16)
        norm_w, norm_b = _layernorm(n_in, device)
        weight = (torch.randn(n_out, n_in, device=device) / n_in**0.5).to(torch.bfloat16)
        reference = layernorm_linear_reference(x.float(), norm_w, norm_b, weight.float())
        eager = lambda: torch.nn.functional.linear(  # noqa: E731
            torch.nn.functional.layer_norm(x, (n_in,), norm_w.to(x.dtype), norm_b.to(x.dtype)), weight
        )
        table.add([name, "PyTorch eager (layer_norm + cuBLAS)", _close(eager(), reference, n_in), time_ms(eager)])
        time_candidates(
            table,
            name,
            "layernorm_linear",
            "fwd",
            LAYERNORM_LINEAR_CANDIDATES,
            lambda: layernorm_linear_fwd(x, norm_w, norm_b, weight, None, 1e-5, aligned),
            lambda outputs: _close(outputs[0], reference, n_in),
        )


def run_layernorm_linear_backward(rows: int, device, table: Table) -> None:
    """The wide projection's backward (dx kernel, LN(x) for cuBLAS, cuBLAS dW) with its gradient
    read in place from aligned rows of 528, as gated_pair_attention hands it over."""
    name = f"LN-linear backward {rows} x 128 -> 516 (triangle attention)"
    n_in, n_out = 128, 516
    x = torch.randn(rows, n_in, device=device, dtype=torch.bfloat16)
    norm_w, norm_b = _layernorm(n_in, device)
    weight = (torch.randn(n_out, n_in, device=device) / n_in**0.5).to(torch.bfloat16)
    dy = torch.randn(rows, 528, device=device, dtype=torch.bfloat16)[:, :n_out]
    _, mean, rstd = layernorm_linear_fwd(x, norm_w, norm_b, weight, None, 1e-5, True)
    leaves = [t.float().requires_grad_() for t in (x, weight)]
    out = layernorm_linear_reference(leaves[0], norm_w, norm_b, leaves[1])
    reference = torch.autograd.grad(out, leaves, dy.float())

    def check(grads) -> float:
        return _gradient_error(grads, reference, (n_out, rows))

    eager_leaves = [t.clone().requires_grad_() for t in (x, weight)]

    def eager():
        xn = torch.nn.functional.layer_norm(eager_leaves[0], (n_in,), norm_w.to(x.dtype), norm_b.to(x.dtype))
        return torch.autograd.grad(torch.nn.functional.linear(xn, eager_leaves[1]), eager_leaves, dy)

    table.add([name, "PyTorch eager (forward and autograd)", check(eager()), time_ms(eager)])
    time_candidates(
        table,
        name,
        "layernorm_linear",
        "bwd_dx",
        LAYERNORM_LINEAR_DX_CANDIDATES,
        lambda: layernorm_linear_bwd(dy, x, norm_w, norm_b, weight, mean, rstd, False),
        lambda grads: check((grads[0], grads[3])),
    )


def run_transition(rows: int, device, table: Table, msa_depth: int = 1024) -> None:
    for name, case_rows, channels in transition_cases(rows, msa_depth):
        x = torch.randn(case_rows, channels, device=device, dtype=torch.bfloat16)
        norm_w, norm_b = _layernorm(channels, device)
        weights = _transition_weights(device, channels)
        reference = transition_reference(x.float(), norm_w, norm_b, *(w.float() for w in weights))
        hidden = 4 * channels
        eager = lambda: _eager_transition(x, norm_w, norm_b, *weights)  # noqa: E731
        table.add([name, "PyTorch eager (layer_norm + cuBLAS)", _close(eager(), reference, hidden), time_ms(eager)])
        time_candidates(
            table,
            name,
            "transition",
            "fwd",
            TRANSITION_CANDIDATES,
            lambda: transition_fwd(x, norm_w, norm_b, *weights, 1e-5),
            lambda outputs: _close(outputs[0], reference, hidden),
        )


def run_transition_backward(rows: int, device, table: Table) -> None:
    name = f"Transition backward {rows} x 128, n = 4"
    x = torch.randn(rows, 128, device=device, dtype=torch.bfloat16)
    norm_w, norm_b = _layernorm(128, device)
    weights = _transition_weights(device)
    dy = torch.randn(rows, 128, device=device, dtype=torch.bfloat16)
    _, mean, rstd = transition_fwd(x, norm_w, norm_b, *weights, 1e-5)
    # fp32 reference gradients: dx and the three weights' (the tolerance's sum length: the hidden
    # width for dx, the rows for the weights)
    leaves = [t.float().requires_grad_() for t in (x, *weights)]
    out = transition_reference(leaves[0], norm_w, norm_b, *leaves[1:])
    reference = torch.autograd.grad(out, leaves, dy.float())

    def check(grads) -> float:
        return _gradient_error(grads, reference, (512, rows, rows, rows))

    eager_leaves = [t.clone().requires_grad_() for t in (x, *weights)]

    def eager():
        return torch.autograd.grad(
            _eager_transition(eager_leaves[0], norm_w, norm_b, *eager_leaves[1:]), eager_leaves, dy
        )

    table.add([name, "PyTorch eager (forward and autograd)", check(eager()), time_ms(eager)])
    time_candidates(
        table,
        name,
        "transition",
        "bwd_dx",
        TRANSITION_DX_CANDIDATES,
        lambda: transition_bwd(dy, x, norm_w, norm_b, *weights, mean, rstd),
        lambda grads: check((grads[0], *grads[3:])),
    )


def run_triangle_backward(rows: int, device, table: Table) -> None:
    """The outgoing triangle multiplication's backward at the pair's shape (10 % of rows and
    columns masked), every candidate checked on dz and the projection weights' gradients."""
    length, channels = max(2, math.isqrt(rows)), 128
    name = f"Triangle mult backward L={length} x {channels}"
    z = torch.randn(1, length, length, channels, device=device, dtype=torch.bfloat16)
    mask = torch.ones(1, length, length, device=device, dtype=torch.bool)
    mask[:, -length // 10 :, :] = False
    mask[:, :, -length // 10 :] = False
    norms = [tensor for _ in range(2) for tensor in _layernorm(channels, device)]
    weights = [(torch.randn(channels, channels, device=device) / channels**0.5).to(torch.bfloat16) for _ in range(6)]
    params = (*norms[:2], *weights[:5], *norms[2:], weights[5])
    dout = torch.randn_like(z)
    _, saved = triangle_mult_fwd(z, mask, params, "outgoing", 1e-5)
    reference = triangle_mult_bwd(dout, *saved, params, "outgoing", 1e-5)

    def check(grads) -> float:
        dz, dparams = grads
        return _gradient_error((dz, dparams[2]), (reference[0].float(), reference[1][2].float()), (channels, rows))

    call = lambda: triangle_mult_bwd(dout, *saved, params, "outgoing", 1e-5)  # noqa: E731
    table.add([name, "configured tiles", check(call()), time_ms(call)])
    for kernel, candidates in TRIANGLE_BACKWARD_CANDIDATES.items():
        time_candidates(table, f"{name}, {kernel}", "triangle_mult", kernel, candidates, call, check)


def column_sum_cases(rows: int) -> list[tuple[str, int, int]]:
    # (name, rows, channels): a pair Linear's output gradient (triangle attention's linear_out),
    # and the diffusion transformer's AdaLN scale and gate at 48 samples of the crop's tokens
    tokens = max(1, math.isqrt(rows))
    return [
        (f"bias gradient {rows} x 128 (pair linear_out)", rows, 128),
        (f"bias gradient {48 * tokens} x 768 (diffusion transformer)", 48 * tokens, 768),
    ]


def run_column_sums(rows: int, device, table: Table) -> None:
    for name, case_rows, channels in column_sum_cases(rows):
        grad = torch.randn(case_rows, channels, device=device, dtype=torch.bfloat16)
        reference = grad.double().sum(0)
        ones = torch.ones(1, case_rows, device=device, dtype=grad.dtype)
        variants = {
            "PyTorch sum(0) (autograd's)": lambda: grad.sum(0),
            "cuBLAS: ones row @ grad": lambda: (ones @ grad).squeeze(0),
            "two stages: [64, rows/64] sums in fp32, then 64": lambda: (
                grad.view(64, -1, channels).sum(1, dtype=torch.float32).sum(0).to(grad.dtype)
                if case_rows % 64 == 0
                else grad.sum(0)
            ),
        }
        for label, call in variants.items():
            table.add([name, label, _close(call(), reference, case_rows), time_ms(call)])


PARTS = {
    "layernorm_linear": run_layernorm_linear,
    "layernorm_linear_backward": run_layernorm_linear_backward,
    "transition": run_transition,
    "transition_backward": run_transition_backward,
    "column_sums": run_column_sums,
    "triangle_backward": run_triangle_backward,
}


def main() -> None:
    parser = argument_parser(__doc__)
    parser.add_argument("--rows", type=int, default=147_456, help="pair rows (crop 384: 147,456)")
    parser.add_argument("--smoke", action="store_true", help="the CPU check: 97 rows under the interpreter")
    parser.add_argument(
        "--only",
        nargs="+",
        choices=sorted(PARTS),
        help="time these parts only (default: all), e.g. one kernel's change beside its parent's package",
    )
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    rows = 97 if args.smoke else args.rows  # odd: the last row tile is ragged
    torch.manual_seed(0)
    table = Table(["case", "provider or tiles", "max error / scale (nan: over tolerance)", "ms"])
    parts = {**PARTS, "transition": functools.partial(run_transition, msa_depth=2 if args.smoke else 1024)}
    for part in args.only or parts:
        parts[part](rows, device, table)
    print(f"\n{run_stamp().header()}\n\n{table.markdown()}")


if __name__ == "__main__":
    main()
