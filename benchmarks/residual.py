"""The pair's residual add under bf16 autocast (residual_add): fp32 z + bf16 update, returned in
fp32 and bf16 from one Triton kernel each way.

    PYTHONUNBUFFERED=1 python3 benchmarks/residual.py [--out DIR] [--record]
    python3 benchmarks/residual.py --smoke

The pair at crop 384 and 768 (C = 128), forward + backward with an upstream gradient on both
outputs (the next update reads the bf16 copy, the stream carries the fp32 one), against the
PyTorch composition (add, cast; in the backward add, cast) and torch.compile of it; what each
step does: benchmarks/op_bench.py. The kernel has one fixed block size: nothing to sweep.
"""

from __future__ import annotations

import torch
from op_bench import DTYPE, Case, OpBenchmark, main

from featurecache.kernels.residual import residual_add, residual_add_reference


class ResidualAdd(torch.nn.Module):
    """z + update with autocast on for an fp32 stream, as the Pairformer calls it (no parameters)."""

    def __init__(self, impl: str) -> None:
        super().__init__()
        self.function = residual_add if impl == "triton" else residual_add_reference

    def forward(self, z: torch.Tensor, update: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.autocast(z.device.type, dtype=DTYPE, enabled=z.dtype == torch.float32):
            return self.function(z, update)


def cases(smoke: bool) -> list[Case]:
    channels = 16 if smoke else 128

    def case(length: int) -> Case:
        def make_inputs(device):
            z = torch.randn(1, length, length, channels, device=device, dtype=torch.float32)
            update = torch.randn(1, length, length, channels, device=device, dtype=DTYPE)
            return [z, update], []

        shape = f"L={length} C={channels}"
        return Case(f"residual add {shape}", shape, ResidualAdd, make_inputs)

    return [case(length) for length in ((9,) if smoke else (384, 768))]


if __name__ == "__main__":
    main(OpBenchmark("residual", "Pair residual add", cases), __doc__)
