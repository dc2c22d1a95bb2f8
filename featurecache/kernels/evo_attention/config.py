"""EvoAttention's block configurations: tuned per GPU name and shape class in
configs/evo_attention.json (written by benchmarks/evo_attention.py --tune), else a heuristic.
Nothing autotunes at run time."""

from __future__ import annotations

import functools
import json
import warnings
from dataclasses import dataclass

import torch

from featurecache.kernels import runtime

CONFIG_FILE = runtime.CONFIG_DIR / "evo_attention.json"
KERNEL_NAMES = ("fwd", "bwd_kv", "bwd_q", "bwd_bias")
# How the backward gets dQ and the gradient of a bias shared by all rows:
#   "split"  dQ kernel, dK/dV kernel, then a dBias kernel that walks the rows (deterministic);
#   "fused"  one kernel: dK/dV, adding dQ and dBias with fp32 atomics (no dQ or dBias pass).
# The atomic sums are not bitwise reproducible, so under torch.use_deterministic_algorithms
# (training's --deterministic) "fused" takes "split", and so does a per-row bias gradient.
BWD_MODES = ("split", "fused")
# Modes removed after the H200 run of 2026-12-04 (benchmarks/NOTES-evo_attention.md, attempt 8)
# that older config files may still name, and the kept mode that uses the same tiles.
REMOVED_BWD_MODES = {"atomic_dbias": "fused", "walk": "split"}


@dataclass(frozen=True)
class BlockConfig:
    """Tile sizes and launch options of one kernel."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    # Rows of N per program when the bias is shared by all rows (1 = the plain kernels); the
    # dBias and fused kernels ignore it (the dBias kernel walks all rows already).
    rows: int = 1


@dataclass(frozen=True)
class EvoAttentionConfig:
    """Block configurations of the four main kernels for one shape class."""

    fwd: BlockConfig
    bwd_kv: BlockConfig
    bwd_q: BlockConfig
    bwd_bias: BlockConfig
    bwd_mode: str = "split"
    # The mode for an fp32 bias, measured on its own (its bias reads cost twice the bytes).
    fp32_bias_bwd_mode: str = "split"

    def __post_init__(self) -> None:
        for name in ("bwd_mode", "fp32_bias_bwd_mode"):
            if getattr(self, name) not in BWD_MODES:
                raise ValueError(f"EvoAttentionConfig: {name} {getattr(self, name)!r} is not one of {BWD_MODES}")

    def backward_mode(self, bias_dtype) -> str:
        """The backward mode for a bias of this dtype (None: no bias)."""
        return self.fp32_bias_bwd_mode if bias_dtype == torch.float32 else self.bwd_mode


def padded_head_dim(head_dim: int) -> int:
    """BLOCK_D: tl.dot needs an inner dimension of at least 16 and tiles are powers of two."""
    return runtime.block_for(head_dim)


def _parse_block(raw, where: str) -> BlockConfig:
    # An older file's "paired" (row pairs, removed 2026-12-04) is ignored: the plain kernels run.
    try:
        return BlockConfig(
            block_m=int(raw["block_m"]),
            block_n=int(raw["block_n"]),
            num_warps=int(raw["num_warps"]),
            num_stages=int(raw["num_stages"]),
            rows=int(raw.get("rows", 1)),
        )
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise ValueError(f"{CONFIG_FILE}: bad block config at {where}: {raw!r} ({err!r})") from None


def _parse_mode(entry: dict, name: str, where: str) -> str:
    """entry[name] as a kept backward mode: a removed one maps to its successor, anything else
    is refused by name with the modes there are."""
    mode = entry.get(name, "split")
    if isinstance(mode, str) and mode in REMOVED_BWD_MODES:
        warnings.warn(
            f"{CONFIG_FILE}: {where}.{name} {mode!r} was removed; running {REMOVED_BWD_MODES[mode]!r} instead",
            stacklevel=2,
        )
        return REMOVED_BWD_MODES[mode]
    if mode not in BWD_MODES:
        removed = ", ".join(f"{old} -> {new}" for old, new in REMOVED_BWD_MODES.items())
        raise ValueError(
            f"{CONFIG_FILE}: {where}.{name} is {mode!r}; expected one of {BWD_MODES} "
            f"(removed modes still read as: {removed})"
        )
    return mode


def _parse_entry(entry, where: str) -> tuple[int, int, EvoAttentionConfig]:
    if not isinstance(entry, dict):
        raise ValueError(f"{CONFIG_FILE}: {where} is {type(entry).__name__}, expected an object")
    missing = [name for name in ("head_dim_max", "seq_len_max", *KERNEL_NAMES) if name not in entry]
    if missing:
        raise ValueError(f"{CONFIG_FILE}: {where} lacks {missing}")
    blocks = {name: _parse_block(entry[name], f"{where}.{name}") for name in KERNEL_NAMES}
    config = EvoAttentionConfig(
        **blocks,
        bwd_mode=_parse_mode(entry, "bwd_mode", where),
        fp32_bias_bwd_mode=_parse_mode(entry, "fp32_bias_bwd_mode", where),
    )
    try:
        return int(entry["head_dim_max"]), int(entry["seq_len_max"]), config
    except (TypeError, ValueError) as err:
        raise ValueError(f"{CONFIG_FILE}: {where}: bad head_dim_max / seq_len_max ({err})") from None


@functools.cache
def load_tuned_configs() -> dict[str, list[tuple[int, int, EvoAttentionConfig]]]:
    """GPU name -> [(max padded head dim, max sequence length, config)], most specific first.

    A malformed file raises one ValueError naming the file, the entry and the field."""
    if not CONFIG_FILE.is_file():
        return {}
    try:
        raw = json.loads(CONFIG_FILE.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{CONFIG_FILE}: not valid JSON ({err})") from None
    gpus = raw.get("gpus", {}) if isinstance(raw, dict) else None
    if not isinstance(gpus, dict) or not all(isinstance(entries, list) for entries in gpus.values()):
        raise ValueError(f'{CONFIG_FILE}: expected {{"gpus": {{GPU name: [entries]}}}}')
    tuned: dict[str, list[tuple[int, int, EvoAttentionConfig]]] = {}
    for gpu, entries in gpus.items():
        parsed = [_parse_entry(entry, f"gpus[{gpu!r}][{index}]") for index, entry in enumerate(entries)]
        tuned[gpu] = sorted(parsed, key=lambda item: (item[0], item[1]))
    return tuned


def heuristic_config(padded_dim: int, seq_len: int, interpreted: bool) -> EvoAttentionConfig:
    if interpreted:
        # Small tiles make the interpreter cover several blocks and ragged edges at test sizes;
        # two rows per program exercise the row-group kernels whenever the bias is shared.
        small = BlockConfig(16, 16, 1, 1)
        grouped = BlockConfig(16, 16, 1, 1, rows=2)
        return EvoAttentionConfig(grouped, grouped, grouped, small)
    wide = 64 if padded_dim <= 64 else 32
    short = 32 if seq_len <= 64 else 64
    block = min(wide, short)
    return EvoAttentionConfig(
        fwd=BlockConfig(min(64, short), block, 4, 3 if padded_dim <= 64 else 2),
        bwd_kv=BlockConfig(min(32, block), block, 4, 2),
        bwd_q=BlockConfig(block, min(32, block), 4, 2),
        bwd_bias=BlockConfig(min(64, short), min(64, short), 4, 2),
    )


def select_config(head_dim: int, seq_len: int, device: torch.device) -> EvoAttentionConfig:
    """Tuned block sizes for this GPU (or the GPU tuned for its architecture) and shape class,
    else a heuristic."""
    gpu = runtime.tuned_gpu(load_tuned_configs(), device)
    return select_config_cached(padded_head_dim(head_dim), seq_len, gpu)


@functools.lru_cache(maxsize=1024)
def select_config_cached(padded_dim: int, seq_len: int, gpu: str | None) -> EvoAttentionConfig:
    """select_config by GPU name (None: the interpreter's small tiles)."""
    if gpu is not None:
        for dim_max, len_max, config in load_tuned_configs().get(gpu, []):
            if padded_dim <= dim_max and seq_len <= len_max:
                return config
    return heuristic_config(padded_dim, seq_len, interpreted=gpu is None)
