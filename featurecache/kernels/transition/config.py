"""The Transition's tile sizes: the tuned configurations (configs/fused_ops.json, through
runtime) held under register and shared-memory budgets per element size."""

from __future__ import annotations

from featurecache.kernels import runtime

OP = "transition"

# Shared memory grows with the row tile [BLOCK_M, BLOCK_C] and the three weight tiles
# [BLOCK_H, BLOCK_C], times the element size, and a Hopper SM has 227 KB of it: the configured
# tiles would overflow it in fp32 at dim 384. These element budgets keep every kernel under
# ~200 KB for dims up to 1024 (compiled sizes: benchmarks/NOTES-fused_ops.md).
_ROW_TILE_ELEMENTS = {2: 16384, 4: 4096}
_WEIGHT_TILE_ELEMENTS = {2: 16384, 4: 2048}


def tiles(kernel: str, n_ch: int, n_hidden: int, itemsize: int) -> tuple[dict[str, int], int, int, int]:
    block_c = runtime.block_for(n_ch)
    config, block_m = runtime.tile_config(OP, kernel, block_c, _ROW_TILE_ELEMENTS.get(itemsize, 4096))
    block_h = min(
        config["BLOCK_H"], runtime.block_for(n_hidden), max(16, _WEIGHT_TILE_ELEMENTS.get(itemsize, 2048) // block_c)
    )
    return config, block_m, block_h, block_c
