"""Triangle attention's core on the packed projection (gated_pair_attention), in Triton.

    PYTHONUNBUFFERED=1 python3 benchmarks/gated_attention.py [--out DIR] [--record]
    python3 benchmarks/gated_attention.py --smoke

The pair at crop 384, 4 heads of 32 (c_z = 128), bf16, 10 % of the tokens padded; the packed
input [q | k | v | gate | bias] is read as LayerNorm+Linear writes it (rows padded to 16
elements). Both directions (around the starting node, and the ending node's transpose), forward +
backward, against the PyTorch composition (gated_pair_attention_reference over
evo_attention_reference) and torch.compile of it; what each step does: benchmarks/op_bench.py.
The attention's block sizes are EvoAttention's (benchmarks/evo_attention.py --tune): nothing to
sweep here.
"""

from __future__ import annotations

import math

import torch
from op_bench import DTYPE, Case, OpBenchmark, main

from featurecache.kernels import gated_pair_attention, gated_pair_attention_reference

ROW_ALIGNMENT = 16  # elements: the packed projection's row stride


class GatedPairAttention(torch.nn.Module):
    """The op as a module, so that it runs through op_bench like the others (no parameters)."""

    def __init__(self, impl: str, heads: int, head_dim: int, transpose: bool) -> None:
        super().__init__()
        self.function = gated_pair_attention if impl == "triton" else gated_pair_attention_reference
        self.heads, self.head_dim, self.transpose = heads, head_dim, transpose

    def forward(self, packed: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.function(packed, mask, self.heads, self.head_dim, transpose=self.transpose)


def cases(smoke: bool) -> list[Case]:
    length, heads, head_dim = (10, 2, 16) if smoke else (384, 4, 32)
    width = 4 * heads * head_dim + heads
    row = -(-width // ROW_ALIGNMENT) * ROW_ALIGNMENT

    def make_inputs(device):
        packed = torch.randn(1, length, length, row, device=device, dtype=DTYPE)[..., :width]
        token = torch.arange(length, device=device)[None] < math.ceil(0.9 * length)  # 10 % padding
        return [packed], [token[:, :, None] & token[:, None, :]]

    def case(transpose: bool) -> Case:
        shape = f"{'ending' if transpose else 'starting'} node L={length} H={heads} D={head_dim}"
        return Case(
            f"gated pair attention, {shape}",
            shape,
            lambda impl: GatedPairAttention(impl, heads, head_dim, transpose),
            make_inputs,
            compile_peer=not transpose,
        )

    return [case(False), case(True)]


if __name__ == "__main__":
    main(OpBenchmark("gated_attention", "Gated pair attention", cases), __doc__)
