"""The attention modules' output gate sigmoid(g) * o and the unfused SwiGLU product silu(a) * b
(featurecache.kernels.gated_attention: sigmoid_gate, swiglu), one kernel each way.

    PYTHONUNBUFFERED=1 python3 benchmarks/output_gates.py [--out DIR] [--record]
    python3 benchmarks/output_gates.py --smoke

Shapes as the af3 step at crop 384 calls them: the diffusion transformer's gate, a strided slice
of its packed [48, 384, 4 x 768] projection; the mini-rollout's, one sample; the MSA's pair-weighted
averaging over 1,024 rows of 32 channels; the token transformer's SwiGLU [48, 384, 1,536].
Forward + backward against the PyTorch composition and torch.compile of it (benchmarks/op_bench.py).
The kernels have one fixed tile rule: nothing to sweep.
"""

from __future__ import annotations

import torch
from op_bench import DTYPE, Case, OpBenchmark, main

from featurecache.kernels.gated_attention import sigmoid_gate, swiglu
from featurecache.kernels.reference import sigmoid_gate_reference, swiglu_reference


class OutputGate(torch.nn.Module):
    """gate(packed[..., -C:], out): the gate read from the last quarter of a packed projection
    (the conditioned attention's layout; `packed_width` 1 reads a contiguous gate)."""

    def __init__(self, impl: str, swish: bool, packed_width: int) -> None:
        super().__init__()
        if swish:
            self.function = swiglu if impl == "triton" else swiglu_reference
        else:
            self.function = sigmoid_gate if impl == "triton" else sigmoid_gate_reference
        self.packed_width = packed_width

    def forward(self, packed: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        channels = packed.shape[-1] // self.packed_width
        return self.function(packed[..., (self.packed_width - 1) * channels :], out)


def cases(smoke: bool) -> list[Case]:
    def case(label: str, shape: tuple[int, int, int, int], swish: bool, packed_width: int) -> Case:
        batch, rows, length, channels = shape

        def make_inputs(device):
            packed = torch.randn(batch, rows, length, packed_width * channels, device=device, dtype=DTYPE)
            out = torch.randn(batch, rows, length, channels, device=device, dtype=DTYPE)
            return [packed, out], []

        text = "x".join(str(n) for n in shape)
        return Case(
            f"{label} {text}",
            f"{label} {text}",  # the same shape serves two gates: the label keeps their rows apart
            lambda impl: OutputGate(impl, swish, packed_width),
            make_inputs,
            sweep=False,
        )

    if smoke:
        return [case("sigmoid gate", (1, 2, 9, 24), False, 4), case("swiglu", (1, 2, 9, 24), True, 1)]
    return [
        case("sigmoid gate, diffusion", (1, 48, 384, 768), False, 4),
        case("sigmoid gate, mini-rollout", (1, 1, 384, 768), False, 4),
        case("sigmoid gate, MSA", (1, 1024, 384, 32), False, 2),
        case("swiglu, diffusion", (1, 48, 384, 1536), True, 1),
    ]


if __name__ == "__main__":
    main(OpBenchmark("output_gates", "Output gates", cases), __doc__)
