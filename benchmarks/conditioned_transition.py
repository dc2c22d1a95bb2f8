"""AF3's conditioned transition (Algorithm 25 with AdaLN, Algorithm 26), fused in Triton.

    PYTHONUNBUFFERED=1 python3 benchmarks/conditioned_transition.py [--sweep [--variants N]] [--out DIR] [--record]
    python3 benchmarks/conditioned_transition.py --smoke

The two places AF3 runs it, bf16, forward + backward, against PyTorch eager and torch.compile of
the same module (featurecache.model.network.transformer.ConditionedTransition); what each step does:
benchmarks/op_bench.py. The atom transformers: 48 samples x 3,072 atoms, c_atom 128, s shared by
the samples ([1, 1, A, 128]). The diffusion token transformer (24 blocks a call): 48 samples x 384
tokens, c_token 768, s per sample ([1, 48, 384, 384]: it carries the noise level); at that width
rows take the one-pass AdaLN kernel and cuBLAS products, a path also timed at the atoms' size
(the "AdaLN kernel + cuBLAS" row) against the fused kernel. Traffic
prediction and tuning history: benchmarks/NOTES-fused_ops.md.
"""

from __future__ import annotations

import torch
from op_bench import DTYPE, Case, OpBenchmark, main

from featurecache.kernels.conditioned_transition import config as fused_config
from featurecache.model.network.transformer import ConditionedTransition

SAMPLES = 48


class WideRowPath(ConditionedTransition):
    """The module with the path rows wider than FUSED_MAX_CHANNELS take (one-pass AdaLN kernel,
    cuBLAS products), to time it against the fused kernel at c_atom 128."""

    def forward(self, a, s):
        fused_max = fused_config.FUSED_MAX_CHANNELS
        fused_config.FUSED_MAX_CHANNELS = 0
        try:
            return super().forward(a, s)
        finally:
            fused_config.FUSED_MAX_CHANNELS = fused_max


def _case(
    name: str, samples: int, rows: int, c_a: int, c_s: int, s_shared: bool, sweep: bool, module=ConditionedTransition
) -> Case:
    def make_inputs(device):
        a = torch.randn(1, samples, rows, c_a, device=device, dtype=DTYPE) * 1.5 + 0.3
        s = torch.randn(1, 1 if s_shared else samples, rows, c_s, device=device, dtype=DTYPE)
        return [a, s], []

    shape = f"{samples} x {rows} x {c_a}, s {'shared' if s_shared else 'per sample'} x {c_s}"
    if module is WideRowPath:
        shape += ", AdaLN kernel + cuBLAS"  # the table and results.csv tell the rows apart by shape
    return Case(
        f"ConditionedTransition {name} {shape}",
        shape,
        lambda kernels: module(c_a, c_s, kernels=kernels),
        make_inputs,
        target="faster than torch.compile",
        sweep=sweep,
        compile_peer=module is ConditionedTransition,
    )


def cases(smoke: bool) -> list[Case]:
    samples = 3 if smoke else SAMPLES
    atoms, tokens = (11, 9) if smoke else (3072, 384)
    # smoke: c_token over FUSED_MAX_CHANNELS, so the token case takes the wide-row path as at 768
    c_token, c_s, c_atom = (264, 24, 16) if smoke else (768, 384, 128)
    # the swept case first: its block sizes hold for the other (at c_token 768 the register
    # budget fixes them anyway: 16-row tiles, 16-wide hidden chunks)
    return [
        _case("atoms", samples, atoms, c_atom, c_atom, s_shared=True, sweep=True),
        _case("atoms", samples, atoms, c_atom, c_atom, s_shared=True, sweep=False, module=WideRowPath),
        _case("tokens", samples, tokens, c_token, c_s, s_shared=False, sweep=False),
    ]


# Candidates besides the configured one (configs/fused_ops.json).
SWEEPS = {
    "fwd": [dict(BLOCK_M=64, BLOCK_H=64, num_warps=4), dict(BLOCK_M=128, BLOCK_H=32, num_warps=8)],
    "bwd": [dict(BLOCK_M=64, BLOCK_H=64, num_warps=4), dict(BLOCK_M=128, BLOCK_H=32, num_warps=8)],
}

if __name__ == "__main__":
    main(OpBenchmark("conditioned_transition", "Conditioned transition", cases, SWEEPS), __doc__)
