"""EvoAttention at triangle L = 768: both backward modes and tile variants, checked and timed in one run.

    PYTHONUNBUFFERED=1 python3 benchmarks/evo768_sweep.py [--variants a,b] [--bias bf16,fp32] [--budget-s 200]
        [--length 384]   (the same sweep at another N = L; results in OUT/evo<L>_sweep.*)

The case of issue 24's last two targets: B = 1, N = L = 768 rows, H = 4, D = 32, bf16 q/k/v,
a bias [1, 1, H, L, L] shared by all rows (bf16, then fp32 read as is) with its gradient, the
last tenth of the keys masked in every row. For each variant (an EvoAttentionConfig: backward
mode, tiles; NOTES-evo_attention.md, attempt 8):
  1. correctness: out and all four gradients against an fp32 reference at L = 768 (same inputs
     for every variant), and on fresh odd-sized inputs (N = 37, L = 77, H = 3, one fully masked
     row) against float64, held to 4 x eager bf16's error + 2e-3 as benchmarks/evo_attention.py;
  2. timing through the real entry point (evo_attention and autograd, the config patched in):
     forward, backward alone (launchers), forward+backward, extra peak memory.
Peers in the same run: compiled FlexAttention (benchmarks/evo_attention.py's provider) for each
bias dtype. The table prints last; OUT/evo768_sweep.json holds it when $OUT is set.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib
import sys
import time
import traceback
from collections.abc import Callable

import torch

from harness import Table, argument_parser, extra_peak_mib, run_stamp, time_ms

import evo_attention as bench
from featurecache.kernels.evo_attention import (
    BlockConfig,
    EvoAttentionConfig,
    evo_attention,
    evo_attention_backward,
    evo_attention_forward,
    select_config,
)
from featurecache.kernels.evo_attention import launch as evo_launch
from featurecache.testing.compare import rel_error

DEVICE = bench.DEVICE
DTYPE = torch.bfloat16
NAMES = ["out", "dq", "dk", "dv", "dbias"]
# [B, N, L, H, D] of the timed case and of the odd-size check; --smoke shrinks both (the
# interpreter takes ~1 s per pass at N = 4, L = 24) and times one variant of each kind.
SIZE, ODD_SIZE = (1, 768, 768, 4, 32), (1, 37, 80, 3, 32)
SMOKE_SIZE, SMOKE_ODD_SIZE = (1, 4, 24, 2, 32), (1, 3, 21, 2, 32)
SMOKE_VARIANTS = ["default", "split", "dq 128x32", "fused 64x64 w4"]


def split_of(config: EvoAttentionConfig) -> EvoAttentionConfig:
    return dataclasses.replace(config, bwd_mode="split", fp32_bias_bwd_mode="split")


def variants(default: EvoAttentionConfig) -> dict[str, EvoAttentionConfig]:
    """name -> config, in the order they are timed: the default (whatever the config file says),
    the split backward with the file's tiles, then variants of that split config."""
    base = split_of(default)

    def make(
        mode: str = "split",
        fwd: BlockConfig | None = None,
        kv: BlockConfig | None = None,
        q: BlockConfig | None = None,
        bias: BlockConfig | None = None,
    ) -> EvoAttentionConfig:
        return dataclasses.replace(
            base,
            bwd_mode=mode,
            fp32_bias_bwd_mode=mode,
            fwd=fwd or base.fwd,
            bwd_kv=kv or base.bwd_kv,
            bwd_q=q or base.bwd_q,
            bwd_bias=bias or base.bwd_bias,
        )

    # Run 1 (2026-12-04 03:40, NOTES attempt 8): 8 warps made every atomic kernel 2x slower,
    # and the passes look bound by L2 traffic (~4-5 TB/s): the larger tiles below cut the k/v
    # or q/dO bytes per score element.
    w4 = lambda m, n, stages=2: BlockConfig(m, n, 4, stages)  # noqa: E731
    w8 = lambda m, n, stages=2: BlockConfig(m, n, 8, stages)  # noqa: E731
    split = {
        "fwd 128x32 s3": make(fwd=w4(128, 32, 3)),
        "fwd 128x64 s3": make(fwd=w4(128, 64, 3)),
        "fwd 128x64 w8 s3": make(fwd=w8(128, 64, 3)),
        "fwd 64x64 s3": make(fwd=w4(64, 64, 3)),
        "fwd 128x32 s2": make(fwd=w4(128, 32)),
        "fwd 128x128 w8": make(fwd=w8(128, 128)),
        "dq 128x32": make(q=w4(128, 32)),
        "dq 128x64": make(q=w4(128, 64)),
        "dq 128x64 w8": make(q=w8(128, 64)),
        "dq 64x64 s3": make(q=w4(64, 64, 3)),
        "kv 64x128": make(kv=w4(64, 128)),
        "kv 32x128": make(kv=w4(32, 128)),
        "kv 128x128 w8": make(kv=w8(128, 128)),
        "dbias 128x64": make(bias=w4(128, 64)),
        "dbias 64x128": make(bias=w4(64, 128)),
        "dbias 128x128 w8": make(bias=w8(128, 128)),
    }
    fused = {
        "fused 64x64 w4": make("fused", kv=w4(64, 64)),
        "fused 64x64 w4 s1": make("fused", kv=w4(64, 64, 1)),
        "fused 64x64 w4 s3": make("fused", kv=w4(64, 64, 3)),
        "fused 32x128 w4": make("fused", kv=w4(32, 128)),
        "fused 64x128 w4": make("fused", kv=w4(64, 128)),
        "fused 128x64 w4": make("fused", kv=w4(128, 64)),
    }
    return {"default": default, "split": base, **split, **fused}


# Variants timed with the fp32 bias too, when no --variants are named (each variant compiles
# its kernels again for an fp32 bias).
FP32_VARIANTS = [
    "default",
    "split",
    "fwd 128x32 s3",
    "fwd 128x64 s3",
    "fwd 64x64 s3",
    "dq 128x32",
    "dq 128x64",
    "kv 64x128",
    "kv 32x128",
    "dbias 128x64",
    "dbias 64x128",
    "fused 64x64 w4",
    "fused 64x128 w4",
]


def best_combination(
    base: EvoAttentionConfig, measured: dict[str, tuple[EvoAttentionConfig, dict]]
) -> tuple[str, EvoAttentionConfig]:
    """The fastest forward, and per split kernel the fastest tiles (or the fastest fused backward
    if it beats the split one): what one config can combine from this run."""

    def fastest(names, key):
        timed = [(measured[n][1][key], n) for n in names if n in measured and measured[n][1].get(key)]
        return min(timed)[1] if timed else None

    base = split_of(base)
    fwd = fastest(list(measured), "fwd ms")
    parts, config = [f"fwd of '{fwd}'"], dataclasses.replace(base, fwd=measured[fwd][0].fwd)
    split_names = [n for n, (c, _) in measured.items() if c.bwd_mode == "split" and n != "default"]
    fused_names = [n for n, (c, _) in measured.items() if c.bwd_mode == "fused" and n != "default"]
    # Each split variant changes one kernel from the default: its bwd time against the default's
    # is that kernel's gain; combine every kernel's best change.
    default_bwd = measured["split"][1]["bwd ms"] if "split" in measured else None
    split_bwd = default_bwd
    for kernel in ("bwd_q", "bwd_kv", "bwd_bias"):
        changed = [n for n in split_names if getattr(measured[n][0], kernel) != getattr(base, kernel)]
        best = fastest(changed, "bwd ms")
        if best and default_bwd and measured[best][1]["bwd ms"] < default_bwd:
            config = dataclasses.replace(config, **{kernel: getattr(measured[best][0], kernel)})
            split_bwd -= default_bwd - measured[best][1]["bwd ms"]
            parts.append(f"{kernel} of '{best}'")
    best_fused = fastest(fused_names, "bwd ms")
    if best_fused and split_bwd and measured[best_fused][1]["bwd ms"] < split_bwd:
        config = dataclasses.replace(measured[best_fused][0], fwd=config.fwd)
        parts = parts[:1] + [f"backward of '{best_fused}'"]
    return "best: " + ", ".join(parts), config


def make_inputs(batch, rows, seq_len, heads, head_dim, bias_dtype, seed, padding=0.1, random_mask=False):
    generator = torch.Generator(device=DEVICE).manual_seed(seed)
    shape = (batch, rows, seq_len, heads, head_dim)

    def randn(*size, dtype=DTYPE):
        return torch.randn(*size, device=DEVICE, dtype=torch.float32, generator=generator).to(dtype)

    q, k, v, grad_out = (randn(*shape) for _ in range(4))
    bias = randn(batch, 1, heads, seq_len, seq_len, dtype=bias_dtype)
    if random_mask:
        mask = torch.rand(batch, rows, seq_len, device=DEVICE, generator=generator) > 0.2
        mask[0, rows - 1] = False  # one fully masked row
    else:
        mask = torch.ones(batch, rows, seq_len, device=DEVICE, dtype=torch.bool)
        mask[..., seq_len - int(seq_len * padding) :] = False
    for tensor in (q, k, v, bias):
        tensor.requires_grad_()
    return bench.Inputs(q, k, v, bias, mask, grad_out)


class patched_config:
    """Make evo_attention (and its launchers) use `config` for every call inside the block."""

    def __init__(self, config: EvoAttentionConfig):
        self.config = config

    def __enter__(self):
        self.saved = evo_launch.select_config
        evo_launch.select_config = lambda *args: self.config

    def __exit__(self, *exc):
        evo_launch.select_config = self.saved


def run_ours(x: bench.Inputs) -> torch.Tensor:
    return evo_attention(x.q, x.k, x.v, bias=x.bias, mask=x.mask)


def errors(fn: Callable[[bench.Inputs], torch.Tensor], x: bench.Inputs, truth: list[torch.Tensor]) -> list[float]:
    return [rel_error(got, want) for got, want in zip(bench.forward_backward(fn, x), truth)]


def with_bf16_bias(x: bench.Inputs) -> bench.Inputs:
    """x with its bias rounded to bf16: the error scale is eager PyTorch with every input in bf16
    (with an fp32 bias the eager reference computes dBias in fp32, error 0)."""
    bias = x.bias.detach().to(DTYPE).requires_grad_()
    return bench.Inputs(x.q, x.k, x.v, bias, x.mask, x.grad_out)


def truth_of(x: bench.Inputs, dtype: torch.dtype) -> list[torch.Tensor]:
    leaves = [t.detach().to(dtype).requires_grad_() for t in x.leaves()]
    wide = bench.Inputs(*leaves, x.mask, x.grad_out.to(dtype))
    return bench.forward_backward(bench.run_eager, wide)


def odd_size_check(
    config: EvoAttentionConfig, bias_dtype: torch.dtype, seed: int, size: tuple = ODD_SIZE
) -> tuple[bool, float]:
    """Fresh inputs of other sizes against float64: (within 4 x eager bf16's error + 2e-3, worst
    ratio). N = 37 rows (odd), L = 80 a ragged last block of 16 for 64-wide tiles; L stays a
    multiple of 16 so the check reuses the kernels compiled for L = 768 (an L such as 77
    compiles every kernel again; the interpreter tests cover those)."""
    x = make_inputs(*size, bias_dtype, seed, random_mask=True)
    truth = truth_of(x, torch.float64)
    eager = errors(bench.run_eager, with_bf16_bias(x), truth)
    with patched_config(config):
        mine = errors(run_ours, x, truth)
    ratio = max(m / (4 * e + 2e-3) for m, e in zip(mine, eager))
    return all(math.isfinite(m) for m in mine) and ratio <= 1.0, ratio


def time_variant(config: EvoAttentionConfig | None, fn, x: bench.Inputs) -> dict:
    """fwd, bwd (launchers alone; ours only), fwd+bwd and extra peak memory of one provider."""

    def forward_only():
        with torch.no_grad():
            return fn(x)

    def train_step():
        out = fn(x)
        out.backward(x.grad_out)
        return out

    result = {"fwd ms": time_ms(forward_only), "fwd+bwd ms": time_ms(train_step, grad_to_none=x.leaves())}
    for leaf in x.leaves():
        leaf.grad = None
    result["peak MiB"] = extra_peak_mib(train_step)
    if config is not None:
        q, k, v, bias = (t.detach() for t in x.leaves())
        scale = q.shape[-1] ** -0.5
        out, lse, key_end = evo_attention_forward(q, k, v, bias, x.mask, scale, config)
        result["bwd ms"] = time_ms(
            lambda: evo_attention_backward(x.grad_out, q, k, v, bias, x.mask, out, lse, key_end, scale, True, config)
        )
    else:
        result["bwd ms"] = result["fwd+bwd ms"] - result["fwd ms"]  # a peer: the difference
    return result


def measure_variant(bias_name, name, config, x, truth, eager, seed, add, odd_size=ODD_SIZE) -> dict | None:
    """Check and time one variant, add its row; its timings, or None when it failed."""
    try:
        with patched_config(config):
            errs = errors(run_ours, x, truth)
            timing = time_variant(config, run_ours, x)
        odd_ok, ratio = odd_size_check(config, x.bias.dtype, seed=seed, size=odd_size)
        ok = odd_ok and all(e <= 4 * g + 2e-3 for e, g in zip(errs, eager))
        add(
            [
                bias_name,
                name,
                timing["fwd ms"],
                timing["bwd ms"],
                timing["fwd+bwd ms"],
                timing["peak MiB"],
                *errs,
                f"{'ok' if odd_ok else 'FAIL'} ({ratio:.2f})",
                "" if ok else "ERROR TOO LARGE",
            ]
        )
        return timing if ok else None
    except Exception as err:
        traceback.print_exc()
        add(
            [
                bias_name,
                name,
                None,
                None,
                None,
                None,
                None,
                None,
                None,
                None,
                None,
                "",
                f"failed: {type(err).__name__}: {str(err)[:80]}",
            ]
        )
        return None
    finally:
        if DEVICE == "cuda":
            torch.cuda.empty_cache()


def main() -> int:
    parser = argument_parser(__doc__)
    parser.add_argument("--variants", default="", help="comma-separated variant names (default: all)")
    parser.add_argument("--bias", default="bf16,fp32", help="bias dtypes to run: bf16, fp32 or both")
    parser.add_argument(
        "--budget-s", type=float, default=170.0, help="start no new variant after this (bf16 gets the first two thirds)"
    )
    parser.add_argument("--no-peers", action="store_true", help="skip compiled FlexAttention")
    parser.add_argument("--fp32-peers", action="store_true", help="also time FlexAttention with the fp32 bias")
    parser.add_argument(
        "--length",
        type=int,
        default=SIZE[2],
        help="N = L of the timed case (768: issue 24's targets; 384: the other H200 config class)",
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help=f"tiny sizes and variants {SMOKE_VARIANTS} (unless --variants), for a CPU check",
    )
    args = parser.parse_args()
    started = time.perf_counter()
    stamp = run_stamp()
    print(stamp.header())
    size, odd_size = (SMOKE_SIZE, SMOKE_ODD_SIZE) if args.smoke else (SIZE, ODD_SIZE)
    if not args.smoke:
        size = (size[0], args.length, args.length, *size[3:])
    base = select_config(size[4], size[2], torch.device(DEVICE))
    all_variants = variants(base)
    wanted = [name.strip() for name in args.variants.split(",") if name.strip()] or (
        SMOKE_VARIANTS if args.smoke else list(all_variants)
    )
    unknown = [name for name in wanted if name not in all_variants]
    if unknown:
        parser.error(f"unknown variants {unknown}; choose from {list(all_variants)}")
    dtypes = {"bf16": torch.bfloat16, "fp32": torch.float32}
    bias_names = [name.strip() for name in args.bias.split(",") if name.strip()]
    if any(name not in dtypes for name in bias_names):
        parser.error(f"--bias takes bf16 and/or fp32, got {args.bias!r}")

    table = Table(
        [
            "bias",
            "variant",
            "fwd ms",
            "bwd ms",
            "fwd+bwd ms",
            "peak MiB",
            *[f"{n} err" for n in NAMES],
            "odd sizes",
            "note",
        ]
    )
    log = {"header": stamp.header(), "base": dataclasses.asdict(base), "rows": []}

    def add(row: list) -> None:
        table.add(row)
        log["rows"].append(row)
        print("  " + " | ".join(f"{c:.4g}" if isinstance(c, float) else str(c) for c in row), flush=True)

    for position, bias_name in enumerate(bias_names):
        # The first dtype (bf16: the target with a peer) gets two thirds of the budget.
        deadline = started + args.budget_s * (1.0 if position else (0.65 if len(bias_names) > 1 else 1.0))
        bias_dtype = dtypes[bias_name]
        names = [n for n in wanted if bias_name == "bf16" or n in FP32_VARIANTS or args.variants]
        x = make_inputs(*size, bias_dtype, seed=0)
        truth = truth_of(x, torch.float32)
        eager = errors(bench.run_eager, with_bf16_bias(x), truth)
        add([bias_name, "eager bf16 (error scale)", None, None, None, None, *eager, "", ""])
        measured: dict[str, tuple[EvoAttentionConfig, dict]] = {}
        for index, name in enumerate(names):
            if time.perf_counter() > deadline:
                add([bias_name, name, None, None, None, None, None, None, None, None, None, "", "skipped: budget"])
                continue
            timing = measure_variant(bias_name, name, all_variants[name], x, truth, eager, 100 + index, add, odd_size)
            if timing:
                measured[name] = (all_variants[name], timing)
        if len(measured) > 1:
            name, config = best_combination(base, measured)
            all_variants[name] = config
            log.setdefault("best", {})[bias_name] = {"name": name, "config": dataclasses.asdict(config)}
            measure_variant(bias_name, name, config, x, truth, eager, 99, add, odd_size)
        if not args.no_peers and not args.smoke and (bias_name == "bf16" or args.fp32_peers):
            try:
                errs = errors(bench.run_flex, x, truth)
                timing = time_variant(None, bench.run_flex, x)
                add(
                    [
                        bias_name,
                        "peer: flex (compiled)",
                        timing["fwd ms"],
                        timing["bwd ms"],
                        timing["fwd+bwd ms"],
                        timing["peak MiB"],
                        *errs,
                        "",
                        "",
                    ]
                )
            except Exception as err:
                traceback.print_exc()
                add(
                    [
                        bias_name,
                        "peer: flex (compiled)",
                        None,
                        None,
                        None,
                        None,
                        None,
                        None,
                        None,
                        None,
                        None,
                        "",
                        f"failed: {type(err).__name__}: {str(err)[:80]}",
                    ]
                )
        del x, truth
        if DEVICE == "cuda":
            torch.cuda.empty_cache()

    result = (
        f"### EvoAttention L={size[2]} sweep, {stamp.header()}\n\nB={size[0]}, N={size[1]}, L={size[2]}, H={size[3]}, D={size[4]}, "
        f"bf16 q/k/v, shared bias with gradient, 10 % key padding; errors: relative L2 against fp32 "
        f"eager; odd sizes: worst error / (4 x eager bf16 + 2e-3), ok when <= 1. "
        f"Total {time.perf_counter() - started:.0f} s.\n\n{table.markdown()}\n"
    )
    if os.environ.get("OUT"):
        out_dir = pathlib.Path(os.environ["OUT"])
        out_dir.mkdir(parents=True, exist_ok=True)
        name = f"evo{size[2]}_sweep"
        (out_dir / f"{name}.json").write_text(json.dumps(log, indent=1, default=str))
        (out_dir / f"{name}.md").write_text(result)
    print("\n" + result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
