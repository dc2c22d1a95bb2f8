"""EvoAttention's backward modes at the triangle attention's shapes, and what the shared bias's
gradient costs each.

    PYTHONUNBUFFERED=1 python3 benchmarks/evo_bwd_parts.py [--lengths 384,768]

B = 1, N = L rows, H = 4, D = 32, bf16 q/k/v, a bf16 bias [1, 1, H, L, L] shared by all rows, the
last tenth of the keys masked (as evo768_sweep.py). Each backward mode of config.BWD_MODES (the
configured tiles, the mode patched in) is checked against the split mode's gradients and timed
through its launcher (evo_attention_backward) with the bias's gradient and without it: the
difference is what the shared bias's gradient costs that mode (without it, every mode runs the
split kernels since 2026-12-07: measured faster there). The forward beside them.
CUDA-event medians; prints a table.
"""

from __future__ import annotations

import dataclasses

import torch

from harness import Table, argument_parser, run_stamp, time_ms
from featurecache.kernels.evo_attention import evo_attention_backward, evo_attention_forward, select_config
from featurecache.kernels.evo_attention.config import BWD_MODES

HEADS, HEAD_DIM = 4, 32


def inputs(length: int, device: str, generator: torch.Generator):
    def randn(*shape):
        return torch.randn(*shape, generator=generator, device=device).to(torch.bfloat16)

    q, k, v = (randn(1, length, length, HEADS, HEAD_DIM) for _ in range(3))
    bias = randn(1, 1, HEADS, length, length)
    mask = torch.ones(1, length, length, dtype=torch.bool, device=device)
    mask[..., length - length // 10 :] = False
    return q, k, v, bias, mask


def measure(length: int, device: str, generator: torch.Generator, table: Table) -> None:
    q, k, v, bias, mask = inputs(length, device, generator)
    scale = HEAD_DIM**-0.5
    configured = select_config(HEAD_DIM, length, q.device)
    out, lse, key_end = evo_attention_forward(q, k, v, bias, mask, scale)
    grad_out = torch.randn(out.shape, generator=generator, device=device).to(out.dtype)
    forward_ms = time_ms(lambda: evo_attention_forward(q, k, v, bias, mask, scale))

    def backward(mode: str, bias_grad: bool):
        config = dataclasses.replace(configured, bwd_mode=mode)
        return lambda: evo_attention_backward(
            grad_out, q, k, v, bias, mask, out, lse, key_end, scale, bias_grad, config
        )

    reference = [g.float() for g in backward("split", True)()]
    for mode in BWD_MODES:
        grads = [g.float() for g in backward(mode, True)()]
        errors = [((g - r).norm() / r.norm()).item() for g, r in zip(grads, reference)]
        with_dbias, without = time_ms(backward(mode, True)), time_ms(backward(mode, False))
        table.add(
            [
                length,
                mode + (" (configured)" if mode == configured.bwd_mode else ""),
                f"{forward_ms:.3f}",
                f"{with_dbias:.3f}",
                f"{without:.3f}",
                f"{1 - without / with_dbias:.0%}",
                f"{max(errors):.1e}",
            ]
        )


def main() -> None:
    parser = argument_parser(__doc__)
    parser.add_argument("--lengths", default="384,768")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    generator = torch.Generator(device=device).manual_seed(0)
    table = Table(
        [
            "L",
            "backward mode",
            "forward ms",
            "backward ms (with dbias)",
            "backward ms (no dbias)",
            "dbias share",
            "largest gradient difference to split",
        ]
    )
    for length in (int(value) for value in args.lengths.split(",")):
        measure(length, device, generator, table)
    print(run_stamp())
    print(table.markdown())


if __name__ == "__main__":
    main()
