"""Sequence-local atom attention (window_attention), in Triton.

    PYTHONUNBUFFERED=1 python3 benchmarks/window_attention.py [--out DIR] [--record]
    python3 benchmarks/window_attention.py --smoke

AF3's atom windows (32 queries x 128 keys) over A = 3,072 atoms (crop 384 at ~8 atoms a token),
4 heads of 32 (c_atom = 128), bf16, the last 5 % of the atoms padding: the diffusion module's
atom transformers (48 samples sharing one bias) and the input embedder's (1 sample). Forward +
backward of q, k, v and the bias, against window_attention_reference (PyTorch) and torch.compile
of it; what each step does: benchmarks/op_bench.py. A third case times the path the model took
before this kernel, each window's queries padded to 128 rows for EvoAttention, on the same inputs,
and another the one-pass backward (WindowConfig.key_block = 0) against the shipped two-pass one.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from op_bench import DTYPE, Case, OpBenchmark, main

from featurecache.kernels.evo_attention import evo_attention
from featurecache.kernels.reference import window_attention_reference
from featurecache.kernels.window_attention import WindowAttention
from featurecache.kernels.window_attention.config import override_config


class PaddedEvoAttention(torch.nn.Module):
    """The previous atom path: queries padded to `keys` rows, windows in EvoAttention's batch,
    samples in its rows, one [keys, keys] bias per window."""

    def __init__(self, kernels: str) -> None:
        super().__init__()
        self.kernels = kernels

    def forward(self, q, k, v, bias, mask):
        if self.kernels == "torch":
            return window_attention_reference(q, k, v, bias, mask)
        batch, samples, windows, queries = q.shape[:4]
        keys = k.shape[3]

        def rows(t):  # [B, S, W, L, H, D] -> [B * W, S, L, H, D]
            return t.transpose(1, 2).flatten(0, 1)

        q_rows = rows(F.pad(q, (0, 0, 0, 0, 0, keys - queries)))
        bias_rows = F.pad(bias, (0, 0, 0, keys - queries)).flatten(0, 1).unsqueeze(1).contiguous()
        mask_rows = mask.flatten(0, 1)[:, None, :].expand(-1, samples, -1).contiguous()
        out = evo_attention(q_rows, rows(k), rows(v), bias=bias_rows, mask=mask_rows)
        return out.unflatten(0, (batch, windows))[:, :, :, :queries].transpose(1, 2)


class OnePassWindowAttention(WindowAttention):
    """window_attention with the one-pass backward (key_block 0), which ptxas compiles with
    spills, against the shipped two-pass backward."""

    def forward(self, *args, **kwargs):
        with override_config(key_block=0):  # the forward's config also serves its backward
            return super().forward(*args, **kwargs)


def cases(smoke: bool) -> list[Case]:
    atoms, queries, keys, heads, head_dim = (45, 8, 24, 2, 8) if smoke else (3072, 32, 128, 4, 32)
    windows = math.ceil(atoms / queries)
    real_atoms = math.ceil(0.95 * atoms)

    def make_inputs(samples):
        def make(device):
            q = torch.randn(1, samples, windows, queries, heads, head_dim, device=device, dtype=DTYPE)
            k, v = (
                torch.randn(1, samples, windows, keys, heads, head_dim, device=device, dtype=DTYPE) for _ in range(2)
            )
            bias = torch.randn(1, windows, heads, queries, keys, device=device, dtype=DTYPE)
            # AtomWindows' key mask: keys centred on each window, outside the real atoms masked
            key_index = (
                torch.arange(windows, device=device)[:, None] * queries
                + (queries - keys) // 2
                + torch.arange(keys, device=device)
            )
            mask = ((key_index >= 0) & (key_index < real_atoms))[None]
            return [q, k, v, bias], [mask]

        return make

    def case(samples: int, variant: str = "") -> Case:
        shape = f"A={atoms} S={samples} H={heads} D={head_dim}{' ' + variant if variant else ''}"
        label, build = {
            "": ("window attention", WindowAttention),
            "one-pass bwd": ("window attention, one-pass backward", OnePassWindowAttention),
            "padded evo": ("EvoAttention, queries padded to 128 (previous path)", PaddedEvoAttention),
        }[variant]
        return Case(f"{label}, {shape}", shape, build, make_inputs(samples), compile_peer=not variant)

    samples = 3 if smoke else 48
    return [case(samples), case(1), case(samples, "one-pass bwd"), case(samples, "padded evo")]


if __name__ == "__main__":
    main(OpBenchmark("window_attention", "Windowed atom attention", cases), __doc__)
