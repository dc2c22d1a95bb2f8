"""The conditioned transition's block sizes: the row, hidden and channel tiles from the tuned
configurations (configs/fused_ops.json, through runtime) under register and shared-memory
budgets, and FUSED_MAX_CHANNELS, past which rows take the one-pass AdaLN kernel."""

from __future__ import annotations

from featurecache.kernels import runtime

OP = "conditioned_transition"

# The fused kernel holds whole rows of a (and the output accumulator) in registers; compiled for
# sm_90 at C = 768 (1024-wide tiles) its stack runs to 7-11 KB, so wider rows take the one-pass
# AdaLN kernel and cuBLAS products instead (benchmarks/NOTES-fused_ops.md).
FUSED_MAX_CHANNELS = 256

# Register and shared-memory budgets as transition/config.py's (same tiles: a row tile, three weight tiles).
_ROW_TILE_ELEMENTS = {2: 16384, 4: 4096}
_WEIGHT_TILE_ELEMENTS = {2: 16384, 4: 2048}
_ADALN_TILE_ELEMENTS = 4096


def tiles(kernel: str, n_ch: int, n_hidden: int, itemsize: int) -> tuple[dict, int, int, int]:
    block_c = runtime.block_for(n_ch)
    config, block_m = runtime.tile_config(OP, kernel, block_c, _ROW_TILE_ELEMENTS.get(itemsize, 4096))
    block_h = min(
        config["BLOCK_H"], runtime.block_for(n_hidden), max(16, _WEIGHT_TILE_ELEMENTS.get(itemsize, 2048) // block_c)
    )
    return config, block_m, block_h, block_c


def adaln_tiles(n_ch: int) -> tuple[dict, int, int]:
    """No products here, so no 16-row minimum: [BLOCK_M, BLOCK_C] <= 4096 elements kept the
    sm_90 compile free of spills (4 x 1024 and 32 x 128 at 8 warps; 16 x 1024 spilled 600 B)."""
    block_c = runtime.block_for(n_ch)
    config = runtime.kernel_config(OP, "adaln")
    return config, max(1, min(config["BLOCK_M"], _ADALN_TILE_ELEMENTS // block_c)), block_c
