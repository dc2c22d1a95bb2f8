"""Transition (AF3 Algorithm 11: LayerNorm, SwiGLU of 4C, projection back), fused in Triton.

    PYTHONUNBUFFERED=1 python3 benchmarks/transition.py [--sweep [--variants N]] [--out DIR] [--record]
    python3 benchmarks/transition.py --smoke

The pair track's Transition at crop 384 (147,456 rows, C = 128), bf16, forward + backward, against
PyTorch eager and torch.compile; what each step does: benchmarks/op_bench.py. Floors and tuning
history: benchmarks/NOTES-fused_ops.md.
"""

from __future__ import annotations

import torch
from op_bench import DTYPE, Case, OpBenchmark, main

from featurecache.kernels import Transition


def cases(smoke: bool) -> list[Case]:
    length, channels = (9, 32) if smoke else (384, 128)

    def make_inputs(device):
        return [torch.randn(1, length, length, channels, device=device, dtype=DTYPE) * 1.5 + 0.3], []

    shape = f"L={length} ({length * length} rows) C={channels} n=4"
    return [
        Case(
            f"Transition {shape}",
            shape,
            lambda kernels: Transition(channels, expansion=4, kernels=kernels),
            make_inputs,
            target="<= 1.0 ms, <= 577 MiB",
        )
    ]


# Candidates besides the configured one: neighbours of the configs/fused_ops.json entry, then
# the smaller tiles an H100 may prefer (its forward did: NOTES.md section 20).
SWEEPS = {
    "fwd": [
        dict(BLOCK_M=128, BLOCK_H=64, num_warps=8),
        dict(BLOCK_M=128, BLOCK_H=16, num_warps=8),
        dict(BLOCK_M=64, BLOCK_H=64, num_warps=4),
    ],
    "bwd_dx": [
        dict(BLOCK_M=128, BLOCK_H=64, num_warps=8),
        dict(BLOCK_M=128, BLOCK_H=16, num_warps=8),
        dict(BLOCK_M=64, BLOCK_H=64, num_warps=4),
        dict(BLOCK_M=64, BLOCK_H=32, num_warps=4),
        dict(BLOCK_M=128, BLOCK_H=32, num_warps=8),
    ],
    "bwd_dw": [dict(WEIGHT_GRADS="matmul"), dict(BLOCK_M=128, BLOCK_H=32, num_warps=8)],
}

if __name__ == "__main__":
    main(OpBenchmark("transition", "Transition", cases, SWEEPS), __doc__)
