"""Triangle multiplicative update (AF3 Algorithms 12 and 13), outgoing and incoming, in Triton.

    PYTHONUNBUFFERED=1 python3 benchmarks/triangle_mult.py [--sweep [--variants N]] [--out DIR] [--record]
    python3 benchmarks/triangle_mult.py --smoke

L = 512, C = 128, bf16, the last 10 % of rows and columns masked (as a cropped batch has),
forward + backward, against PyTorch eager and torch.compile (outgoing only: incoming compiles to
the same kernels); what each step does: benchmarks/op_bench.py. Floors and tuning history:
benchmarks/NOTES-fused_ops.md.
"""

from __future__ import annotations

import torch
from op_bench import DTYPE, Case, OpBenchmark, main

from featurecache.kernels import TriangleMultiplication


def cases(smoke: bool) -> list[Case]:
    length, channels = (10, 32) if smoke else (512, 128)

    def make_inputs(device):
        z = torch.randn(1, length, length, channels, device=device, dtype=DTYPE) * 1.5 + 0.3
        mask = torch.ones(1, length, length, device=device, dtype=torch.bool)
        mask[:, -length // 10 :, :] = False  # 10 % padding
        mask[:, :, -length // 10 :] = False
        return [z], [mask]

    def case(direction: str) -> Case:
        shape = f"{direction} L={length} C={channels}"
        outgoing = direction == "outgoing"
        return Case(
            f"TriangleMult {shape}",
            shape,
            lambda kernels: TriangleMultiplication(channels, direction=direction, kernels=kernels),
            make_inputs,
            target="<= 3.0 ms, <= 645 MiB" if outgoing else "",
            compile_peer=outgoing,
            sweep=outgoing,
        )

    return [case("outgoing"), case("incoming")]  # the swept case first: its winners hold for the other


# Candidates besides the configured one: neighbours of the configs/fused_ops.json entry (the
# H200's, which the H100 runs without its own), then the smaller tiles an H100 may prefer (its
# Transition forward did: NOTES.md section 20).
SWEEPS = {
    "proj": [
        dict(BLOCK_M=128, BLOCK_H=64, num_warps=8),
        dict(BLOCK_M=128, BLOCK_H=16, num_warps=4),
        dict(BLOCK_M=64, BLOCK_H=32, num_warps=4),
        dict(BLOCK_M=64, BLOCK_H=64, num_warps=4),
    ],
    "out": [dict(BLOCK_M=128, num_warps=8), dict(BLOCK_M=64, num_warps=4), dict(BLOCK_M=32, num_warps=4)],
    "bwd_out": [dict(BLOCK_M=64, num_warps=4), dict(BLOCK_M=128, num_warps=8), dict(BLOCK_M=32, num_warps=4)],
    "bwd_proj": [
        dict(BLOCK_M=128, BLOCK_H=32, num_warps=8),
        dict(BLOCK_M=64, BLOCK_H=16, num_warps=8),
        dict(BLOCK_M=64, BLOCK_H=32, num_warps=4),
        dict(BLOCK_M=64, BLOCK_H=32, num_warps=8),
        dict(BLOCK_M=128, BLOCK_H=16, num_warps=8),
    ],
    "bwd_dw_proj": [
        dict(BLOCK_M=128, BLOCK_H=64, num_warps=8),
        dict(BLOCK_M=128, BLOCK_H=16, num_warps=8),
        dict(BLOCK_M=64, BLOCK_H=64, num_warps=4),
        dict(BLOCK_M=128, BLOCK_H=32, num_warps=8),
    ],
    "bwd_dw_out": [
        dict(BLOCK_M=128, BLOCK_N=64, num_warps=8),
        dict(BLOCK_M=128, BLOCK_N=16, num_warps=8),
        dict(BLOCK_M=64, BLOCK_N=32, num_warps=4),
        dict(BLOCK_M=64, BLOCK_N=64, num_warps=8),
    ],
}

if __name__ == "__main__":
    main(OpBenchmark("triangle_mult", "Triangle multiplicative update", cases, SWEEPS), __doc__)
