"""LayerNorm followed by a Linear layer, fused in Triton (every projection of the trunk).

    PYTHONUNBUFFERED=1 python3 benchmarks/layernorm_linear.py [--sweep [--variants N]] [--out DIR] [--record]
    python3 benchmarks/layernorm_linear.py --smoke

The pair's rows at crop 384 (147,456 x 128), bf16, projected to 512 (triangle attention's packed
projection is about that wide) and to 128, forward + backward, against PyTorch eager and
torch.compile; what each step does: benchmarks/op_bench.py. Floors and tuning history:
benchmarks/NOTES-fused_ops.md.
"""

from __future__ import annotations

import torch
from op_bench import DTYPE, Case, OpBenchmark, main

from featurecache.kernels import LayerNormLinear


def cases(smoke: bool) -> list[Case]:
    rows, channels = (200, 32) if smoke else (147_456, 128)

    def make_inputs(device):
        return [torch.randn(rows, channels, device=device, dtype=DTYPE) * 1.5 + 0.3], []

    def case(out_features: int) -> Case:
        shape = f"{rows} x {channels} -> {out_features}"
        return Case(
            f"LayerNorm+Linear {shape}",
            shape,
            lambda kernels: LayerNormLinear(channels, out_features, kernels=kernels),
            make_inputs,
            target=">= 1.3x torch.compile",
            sweep=out_features == 512,
        )

    return [case(512), case(128)]  # the swept case first: its winners hold for the other


# Candidates besides the configured one: neighbours of the configs/fused_ops.json entry.
SWEEPS = {
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
}

if __name__ == "__main__":
    main(OpBenchmark("layernorm_linear", "LayerNorm+Linear", cases, SWEEPS), __doc__)
