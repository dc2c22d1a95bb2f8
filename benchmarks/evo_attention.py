"""EvoAttention: correctness at real sizes, block-size tuning, and timing against peers.

    PYTHONUNBUFFERED=1 python3 benchmarks/evo_attention.py [--tune] [--out DIR] [--record]

Steps, in one process so every provider is measured on the same machine in the same run:
  1. --tune: time candidate block sizes for each kernel and case, keep the fastest, write them to
     featurecache/kernels/configs/evo_attention.json (and OUT/evo_attention.json).
  2. correctness, with the configurations chosen: the Triton kernels in bf16 against an fp32
     reference (out and all four gradients), next to PyTorch's own bf16 error; bitwise
     determinism of the bias gradient; torch.compile(fullgraph=True) over the custom op.
  3. timing: forward and forward+backward medians and extra peak memory for featurecache, PyTorch
     eager (the reference), SDPA with bias and mask folded into a float mask, FlexAttention
     (compiled, score_mod reading the bias) and trifast (triangle cases only).
Inputs are bf16 with 10 % key padding (the last tenth of the keys masked in every row).
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
import sys
import time
import traceback
from dataclasses import dataclass
from collections.abc import Callable

import torch
import triton
import triton.language as tl

from harness import MIB, Table, argument_parser, extra_peak_mib, poison_allocator, run_stamp, time_ms
from records import Row, record

from featurecache.kernels.evo_attention import (
    BlockConfig,
    EvoAttentionConfig,
    evo_attention,
    evo_attention_backward,
    evo_attention_forward,
    select_config,
)
from featurecache.kernels.evo_attention import config as evo_config
from featurecache.kernels.reference import evo_attention_reference
from featurecache.testing.compare import rel_error

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPE = torch.bfloat16


@dataclass(frozen=True)
class Case:
    name: str
    batch: int
    rows: int
    seq_len: int
    heads: int
    head_dim: int
    # Shape class this case tunes in the config file: (max padded head dim, max L).
    config_class: tuple[int, int]


CASES = [
    Case("triangle L=384", 1, 384, 384, 4, 32, (32, 512)),
    Case("triangle L=768", 1, 768, 768, 4, 32, (32, 1024)),
    Case("single pair bias L=1536", 1, 1, 1536, 16, 24, (32, 1_000_000)),
    Case("B=4 H=16 D=64 L=1024", 4, 1, 1024, 16, 64, (64, 1_000_000)),
    # The diffusion transformer: 48 samples as rows sharing one [L, L] bias per head (row groups
    # read each bias tile once for several samples), c_token 768 in 16 heads.
    Case("diffusion S=48 L=384 H=16 D=48", 1, 48, 384, 16, 48, (64, 512)),
    Case("diffusion S=48 L=768 H=16 D=48", 1, 48, 768, 16, 48, (64, 768)),
]
SMOKE_CASES = [
    Case("smoke triangle L=24", 1, 24, 24, 2, 16, (32, 512)),
    Case("smoke single L=40", 2, 1, 40, 2, 24, (32, 1_000_000)),
]

# Candidates per kernel: (block_m, block_n, num_warps, num_stages[, rows]). The top three of
# the first H200 sweep (NOTES-evo_attention.md, attempt 1) plus row groups (5th entry).
CANDIDATES = {
    "fwd": [
        (128, 32, 4, 3),
        (64, 64, 4, 3),
        (64, 32, 4, 2),
        (128, 64, 4, 3),
        (64, 32, 4, 2, 2),
        (64, 32, 4, 2, 4),
        (128, 32, 4, 3, 2),
        (64, 64, 4, 3, 2),
        (32, 32, 4, 2, 4),
    ],
    "bwd_kv": [
        (64, 64, 4, 2),
        (32, 64, 4, 2),
        (32, 128, 4, 2),
        (32, 64, 4, 2, 2),
        (16, 64, 4, 2, 2),
        (32, 32, 4, 2, 4),
    ],
    "bwd_q": [(64, 32, 4, 2), (64, 64, 4, 3), (64, 64, 4, 2), (64, 32, 4, 2, 2), (32, 32, 4, 2, 4), (32, 64, 4, 2, 2)],
    "bwd_bias": [(32, 64, 4, 2), (64, 64, 4, 2), (32, 32, 4, 2), (32, 64, 2, 2), (64, 32, 4, 2), (32, 128, 4, 3)],
}


@dataclass
class Inputs:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    bias: torch.Tensor
    mask: torch.Tensor
    grad_out: torch.Tensor

    def leaves(self) -> list[torch.Tensor]:
        return [self.q, self.k, self.v, self.bias]


def make_inputs(case: Case, dtype: torch.dtype = DTYPE) -> Inputs:
    shape = (case.batch, case.rows, case.seq_len, case.heads, case.head_dim)
    q, k, v = (torch.randn(shape, device=DEVICE, dtype=dtype) for _ in range(3))
    bias = torch.randn(case.batch, 1, case.heads, case.seq_len, case.seq_len, device=DEVICE, dtype=dtype)
    mask = torch.ones(case.batch, case.rows, case.seq_len, device=DEVICE, dtype=torch.bool)
    mask[..., case.seq_len - case.seq_len // 10 :] = False
    grad_out = torch.randn(shape, device=DEVICE, dtype=dtype)
    for tensor in (q, k, v, bias):
        tensor.requires_grad_()
    return Inputs(q, k, v, bias, mask, grad_out)


# ---------------------------------------------------------------------------------------------
# Providers: each takes Inputs and returns the [B, N, L, H, D] output.
# ---------------------------------------------------------------------------------------------


def run_featurecache(x: Inputs) -> torch.Tensor:
    return evo_attention(x.q, x.k, x.v, bias=x.bias, mask=x.mask)


def run_eager(x: Inputs) -> torch.Tensor:
    return evo_attention_reference(x.q, x.k, x.v, x.bias, x.mask)


def _heads_major(t: torch.Tensor) -> torch.Tensor:
    # [B, N, L, H, D] -> [B*N, H, L, D] as a view (B and N are adjacent, so flatten copies nothing).
    return t.permute(0, 1, 3, 2, 4).flatten(0, 1)


def _rows_major(t: torch.Tensor, batch: int) -> torch.Tensor:
    return t.unflatten(0, (batch, -1)).permute(0, 1, 3, 2, 4)


def run_sdpa(x: Inputs) -> torch.Tensor:
    batch, rows, seq_len, heads, _ = x.q.shape
    key_bias = torch.zeros(x.mask.shape, device=x.q.device, dtype=x.q.dtype).masked_fill(~x.mask, float("-inf"))
    # The float mask is [B, N, H, L, L]: bias broadcast over rows plus the key padding per row.
    float_mask = (x.bias + key_bias[:, :, None, None, :]).flatten(0, 1)
    out = torch.nn.functional.scaled_dot_product_attention(
        _heads_major(x.q), _heads_major(x.k), _heads_major(x.v), attn_mask=float_mask
    )
    return _rows_major(out, batch)


_compiled_flex = None


def run_flex(x: Inputs) -> torch.Tensor:
    global _compiled_flex
    from torch.nn.attention.flex_attention import flex_attention

    if _compiled_flex is None:
        _compiled_flex = torch.compile(flex_attention, dynamic=False)
    batch, rows = x.q.shape[:2]
    bias = x.bias[:, 0]  # [B, H, L, L]
    mask = x.mask.flatten(0, 1)  # [B*N, L]

    def score_mod(score, b, h, q_idx, kv_idx):
        biased = score + bias[b // rows, h, q_idx, kv_idx]
        return torch.where(mask[b, kv_idx], biased, -float("inf"))

    out = _compiled_flex(_heads_major(x.q), _heads_major(x.k), _heads_major(x.v), score_mod=score_mod)
    return _rows_major(out, batch)


def run_trifast(x: Inputs) -> torch.Tensor:
    from trifast import triangle_attention

    # trifast takes [B, H, N, L, D], bias [B, H, L, L] and a mask that is True where masked.
    out = triangle_attention(
        x.q.permute(0, 3, 1, 2, 4),
        x.k.permute(0, 3, 1, 2, 4),
        x.v.permute(0, 3, 1, 2, 4),
        x.bias[:, 0],
        ~x.mask,
    )
    return out.permute(0, 2, 3, 1, 4)


PROVIDERS: dict[str, Callable[[Inputs], torch.Tensor]] = {
    "featurecache": run_featurecache,
    "eager": run_eager,
    "sdpa (float mask)": run_sdpa,
    "trifast": run_trifast,
    "flex (compiled)": run_flex,
}


def provider_applies(name: str, case: Case) -> bool:
    return name != "trifast" or case.rows == case.seq_len


# ---------------------------------------------------------------------------------------------
# 1. Correctness
# ---------------------------------------------------------------------------------------------


def forward_backward(fn: Callable[[Inputs], torch.Tensor], x: Inputs) -> list[torch.Tensor]:
    for leaf in x.leaves():
        leaf.grad = None
    out = fn(x)
    out.backward(x.grad_out.to(out.dtype))
    return [out.detach()] + [leaf.grad for leaf in x.leaves()]


def upcast(x: Inputs) -> Inputs:
    """The same inputs in fp32, as fresh leaves: the reference run's ground truth."""
    q, k, v, bias = (t.detach().float().requires_grad_() for t in x.leaves())
    return Inputs(q, k, v, bias, x.mask, x.grad_out.float())


def check_correctness(cases: list[Case], log: dict, check_peers: bool = True) -> bool:
    names = ["out", "dq", "dk", "dv", "dbias"]
    table = Table(["case", "provider", *[f"{n} rel err" for n in names], "ok"])
    all_ok = True
    for case in cases:
        x = make_inputs(case)
        truth = forward_backward(run_eager, upcast(x))
        poison_allocator()
        mine = [rel_error(g, t) for g, t in zip(forward_backward(run_featurecache, x), truth)]
        eager = [rel_error(g, t) for g, t in zip(forward_backward(run_eager, x), truth)]
        log.setdefault("correctness", []).append({"case": case.name, "featurecache": mine, "eager_bf16": eager})
        # bf16 results: the kernel may be a few times PyTorch's own bf16 error, and never NaN.
        ok = all(not math.isnan(m) and m <= 4 * e + 2e-3 for m, e in zip(mine, eager))
        all_ok &= ok
        table.add([case.name, "featurecache", *mine, "yes" if ok else "NO"])
        table.add([case.name, "eager bf16", *eager, ""])
        # Peers compute the same function: their forward error, for the record.
        for provider in ("sdpa (float mask)", "trifast", "flex (compiled)") if check_peers else ():
            if not provider_applies(provider, case):
                continue
            try:
                with torch.no_grad():
                    out = PROVIDERS[provider](x)
                table.add([case.name, provider, rel_error(out, truth[0]), None, None, None, None, ""])
            except Exception as err:  # a peer that fails is reported, not fatal
                table.add([case.name, provider, None, None, None, None, None, f"failed: {type(err).__name__}"])
        del truth, x
        if DEVICE == "cuda":
            torch.cuda.empty_cache()

    # Bitwise determinism of the bias gradient: required of the "split" backward (the sum over N
    # rows walks them in order); the fused mode (NOTES attempt 8) is reported, not required.
    case = cases[0]
    x = make_inputs(case)
    first = forward_backward(run_featurecache, x)[4].clone()
    second = forward_backward(run_featurecache, x)[4]
    deterministic = torch.equal(first, second)
    mode = select_config(case.head_dim, case.seq_len, x.q.device).backward_mode(x.bias.dtype)
    all_ok &= deterministic or mode != "split"
    log["dbias_deterministic"] = deterministic

    # torch.compile keeps the custom op in one graph (fullgraph raises on a graph break).
    try:
        small = make_inputs(Case("compile", 1, 8, 40, 2, 16, (0, 0)))

        def layer(q, k, v, bias):
            return evo_attention(q * 0.5, k, v, bias=bias, mask=small.mask).float().square().sum()

        backend = "inductor" if DEVICE == "cuda" else "aot_eager"
        compiled = torch.compile(layer, fullgraph=True, backend=backend)
        loss = compiled(small.q, small.k, small.v, small.bias)
        loss.backward()
        expected = layer(*(t.detach() for t in small.leaves()))
        compile_ok = rel_error(loss, expected) < 1e-3 and small.q.grad is not None
    except Exception:
        traceback.print_exc()
        compile_ok = False
    all_ok &= compile_ok
    log["compile_fullgraph"] = compile_ok

    print("\n## correctness (bf16 vs fp32 reference)\n")
    print(table.markdown())
    print(f"\ndbias bitwise deterministic across two runs: {deterministic} (backward mode {mode})")
    print(f"torch.compile(fullgraph=True) over the custom op: {'ok' if compile_ok else 'FAILED'}")
    return all_ok


# ---------------------------------------------------------------------------------------------
# 2. Tuning
# ---------------------------------------------------------------------------------------------


def tune(cases: list[Case], budget_s: float, log: dict) -> dict[tuple[int, int], EvoAttentionConfig]:
    """Fastest candidate per kernel and case; kernels are timed one at a time, the rest fixed."""
    best: dict[tuple[int, int], EvoAttentionConfig] = {}
    started = time.perf_counter()
    for case in cases:
        x = make_inputs(case)
        q, k, v, bias = (t.detach() for t in x.leaves())
        mask = x.mask
        scale = case.head_dim**-0.5
        base = select_config(case.head_dim, case.seq_len, q.device)
        out, lse, key_end = evo_attention_forward(q, k, v, bias, mask, scale, base)
        chosen = {}
        for kernel, candidates in CANDIDATES.items():
            if kernel == "bwd_bias" and case.rows == 1:
                chosen[kernel] = base.bwd_bias  # N = 1: dbias is written by the dq kernel
                continue
            timings = []
            for cand in candidates:
                if time.perf_counter() - started > budget_s:
                    break
                if len(cand) > 4 and case.rows == 1:
                    continue  # row groups only apply to a bias shared by several rows
                config = dataclasses.replace(base, **{kernel: BlockConfig(*cand)})
                if kernel == "fwd":
                    fn = lambda: evo_attention_forward(q, k, v, bias, mask, scale, config)  # noqa: E731
                else:
                    fn = lambda: evo_attention_backward(  # noqa: E731
                        x.grad_out, q, k, v, bias, mask, out, lse, key_end, scale, True, config
                    )
                try:
                    timings.append((time_ms(fn, warmup_ms=5, rep_ms=40), cand))
                except Exception as err:  # e.g. out of shared memory for this tile: skip it
                    print(f"  {case.name} {kernel} {cand}: {type(err).__name__}: {str(err)[:120]}")
            timings.sort()
            log.setdefault("tuning", []).append(
                {"case": case.name, "kernel": kernel, "timings_ms": [[t, list(c)] for t, c in timings]}
            )
            if timings:
                print(
                    f"  {case.name:26s} {kernel:8s} best {timings[0][1]} {timings[0][0]:.3f} ms "
                    f"(worst {timings[-1][0]:.3f} ms of {len(timings)})"
                )
            chosen[kernel] = BlockConfig(*timings[0][1]) if timings else getattr(base, kernel)
        best[case.config_class] = EvoAttentionConfig(**chosen)
        del x, out, lse, key_end
    return best


def write_config(best: dict[tuple[int, int], EvoAttentionConfig], out_dir: pathlib.Path) -> None:
    """Merge tuned entries into the config file: other GPUs and untuned shape classes are kept."""
    path = evo_config.CONFIG_FILE
    data = json.loads(path.read_text()) if path.is_file() else {"gpus": {}}
    gpu = torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu (smoke test)"
    by_class = {(e["head_dim_max"], e["seq_len_max"]): e for e in data.get("gpus", {}).get(gpu, [])}
    for (dim, length), config in best.items():
        by_class[(dim, length)] = {
            "head_dim_max": dim,
            "seq_len_max": length,
            "bwd_mode": config.bwd_mode,
            "fp32_bias_bwd_mode": config.fp32_bias_bwd_mode,
            **{name: dataclasses.asdict(getattr(config, name)) for name in evo_config.KERNEL_NAMES},
        }
    if max(dim for dim, _ in by_class) < 128:
        # Head dims above the largest tuned class fall back to the heuristic's tiles for 128.
        fallback = evo_config.heuristic_config(128, 1_000_000, interpreted=False)
        by_class[(128, 1_000_000)] = {
            "head_dim_max": 128,
            "seq_len_max": 1_000_000,
            **{name: dataclasses.asdict(getattr(fallback, name)) for name in evo_config.KERNEL_NAMES},
        }
    entries = [by_class[key] for key in sorted(by_class)]
    data.setdefault("gpus", {})[gpu] = entries
    text = json.dumps(data, indent=1) + "\n"
    (out_dir / "evo_attention.json").write_text(text)
    if DEVICE == "cuda":
        # The timing step then runs with the configs just chosen, as a training run would.
        path.write_text(text)
        evo_config.load_tuned_configs.cache_clear()
        evo_config.select_config_cached.cache_clear()


# ---------------------------------------------------------------------------------------------
# 3. Timing
# ---------------------------------------------------------------------------------------------


def measure(cases: list[Case], providers: list[str], deadline: float, log: dict) -> tuple[Table, list[Row]]:
    """The timing table, and its numbers as rows for results.csv."""
    rows = []
    table = Table(
        ["case", "provider", "fwd ms", "fwd+bwd ms", "extra peak MiB (fwd+bwd)", "of which workspace MiB", "note"]
    )
    # Provider-major: a slow peer (FlexAttention compiles per shape) cannot starve the others.
    for provider in providers:
        for case in cases:
            if not provider_applies(provider, case):
                continue
            if time.perf_counter() > deadline:
                table.add([case.name, provider, None, None, None, None, "skipped: time budget"])
                continue
            fn = PROVIDERS[provider]
            x = make_inputs(case)
            row: list[object] = [case.name, provider]
            try:

                def forward_only():
                    with torch.no_grad():
                        return fn(x)

                def train_step():
                    out = fn(x)
                    out.backward(x.grad_out)
                    return out

                fwd = time_ms(forward_only)
                both = time_ms(train_step, grad_to_none=x.leaves())
                for leaf in x.leaves():
                    leaf.grad = None
                peak = extra_peak_mib(train_step)
                # Output and the four gradients are results, not workspace.
                results = sum(t.numel() * t.element_size() for t in [x.q] + x.leaves()) / MIB
                row += [fwd, both, peak, peak - results, ""]
                for metric, value in (
                    ("fwd ms", fwd),
                    ("fwd+bwd ms", both),
                    ("extra peak MiB", peak),
                    ("workspace MiB", peak - results),
                ):
                    rows.append(Row("evo_attention", provider, case.name, metric, value))
            except Exception as err:
                traceback.print_exc()
                row += [None, None, None, None, f"failed: {type(err).__name__}: {str(err)[:80]}"]
            table.add(row)
            log.setdefault("timing", []).append(row)
            print("  " + " | ".join(str(c) for c in table.rows[-1]))
            del x
            if DEVICE == "cuda":
                torch.cuda.empty_cache()
    return table, rows


def error_rows(log: dict) -> list[Row]:
    """The correctness check's errors (featurecache and eager bf16 against fp32) as rows."""
    rows = []
    for entry in log.get("correctness", []):
        for variant, errors in (("featurecache", entry["featurecache"]), ("eager", entry["eager_bf16"])):
            rows.append(Row("evo_attention", variant, entry["case"], "err out", errors[0]))
            rows.append(Row("evo_attention", variant, entry["case"], "err worst grad", max(errors[1:])))
    return rows


def kernel_breakdown(cases: list[Case], log: dict) -> None:
    """Device time per Triton kernel of one fwd+bwd step (mean of 5), to see where time goes."""
    if DEVICE != "cuda":
        return
    from torch.profiler import ProfilerActivity, profile

    print("\n## featurecache kernel breakdown (ms per fwd+bwd step)")
    for case in cases:
        x = make_inputs(case)
        forward_backward(run_featurecache, x)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                forward_backward(run_featurecache, x)
            torch.cuda.synchronize()
        parts = {}
        for event in prof.key_averages():
            if event.key.startswith("_evo_attention"):
                parts[event.key.replace("_evo_attention_", "").replace("_kernel", "")] = (
                    event.device_time_total / 5 / 1e3
                )
        log.setdefault("breakdown", []).append({"case": case.name, "ms": parts})
        print(f"  {case.name:26s} " + ", ".join(f"{name} {ms:.3f}" for name, ms in sorted(parts.items())))
        del x


@triton.jit
def _one_store_kernel(X, VALUE):
    tl.store(X, VALUE)


def _host_us_per_call(fn: Callable[[], object], calls: int) -> float:
    """Host wall time per call of a loop of calls (equals device time when the GPU is the bottleneck)."""
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(calls):
        fn()
    host = (time.perf_counter() - started) / calls * 1e6
    torch.cuda.synchronize()
    return host


def host_overhead(cases: list[Case], log: dict) -> None:
    """Where host time goes: launch costs on this machine, then a profile of one fwd+bwd step.

    At N = 1 the kernels take a fraction of a millisecond, so a step is only as fast as the host
    can launch it; this section says how fast that is, and which calls spend the time.
    """
    if DEVICE != "cuda":
        return
    import cProfile
    import io
    import pstats

    scratch = torch.zeros(16, device=DEVICE)
    launch = {
        "torch op (x.add_(1))": _host_us_per_call(lambda: scratch.add_(1), 2000),
        "Triton kernel, 2 args": _host_us_per_call(lambda: _one_store_kernel[(1,)](scratch, 1.0), 2000),
    }
    print("\n## host time (us per call; a loop of calls, synchronized at the end)")
    for name, us in launch.items():
        print(f"  {name:40s} {us:8.1f}")
    per_case = {}
    for case in cases:
        x = make_inputs(case)
        per_case[case.name] = _host_us_per_call(lambda: forward_backward(run_featurecache, x), 50)
        print(f"  featurecache fwd+bwd, {case.name:26s} {per_case[case.name]:8.1f}")
        if case.rows == 1 and "profile" not in log.get("host", {}):
            profiler = cProfile.Profile()
            profiler.enable()
            for _ in range(50):
                forward_backward(run_featurecache, x)
            torch.cuda.synchronize()
            profiler.disable()
            text = io.StringIO()
            pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(14)
            profile = text.getvalue()
            print(f"  cProfile of 50 steps, {case.name}, by own time:")
            print("\n".join("    " + line for line in profile.splitlines() if line.strip()))
            log.setdefault("host", {})["profile"] = profile
        del x
    log.setdefault("host", {}).update({"launch_us": launch, "fwd_bwd_us": per_case})


def main() -> int:
    parser = argument_parser(__doc__)
    parser.add_argument("--tune", action="store_true", help="time candidate block sizes and write the config file")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, for a CPU check of this script")
    parser.add_argument("--providers", default=",".join(PROVIDERS), help="comma-separated providers to time")
    parser.add_argument("--budget-s", type=float, default=480.0, help="stop starting new measurements after this")
    parser.add_argument("--tune-budget-s", type=float, default=200.0, help="stop trying tuning candidates after this")
    parser.add_argument("--tune-cases", default="", help="comma-separated case names to tune (default: all)")
    parser.add_argument("--skip-peer-check", action="store_true", help="check only featurecache's correctness")
    parser.add_argument("--out", default=".", help="folder for results.md, log.json and the tuned config")
    args = parser.parse_args()
    if args.smoke and args.record:
        parser.error("--record with --smoke: a smoke run's numbers are not measurements")
    started = time.perf_counter()
    out_dir = pathlib.Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    cases = SMOKE_CASES if args.smoke else CASES
    providers = [p.strip() for p in args.providers.split(",") if p.strip()]
    unknown = [p for p in providers if p not in PROVIDERS]
    if unknown:
        parser.error(f"unknown providers {unknown}; choose from {list(PROVIDERS)}")
    stamp = run_stamp()
    log: dict = {"header": stamp.header()}
    print(log["header"])

    if args.tune:
        print("\n## tuning")
        wanted = {name.strip() for name in args.tune_cases.split(",") if name.strip()}
        unknown_cases = wanted - {case.name for case in cases}
        if unknown_cases:
            parser.error(f"unknown cases {sorted(unknown_cases)}; choose from {[c.name for c in cases]}")
        to_tune = [case for case in cases if not wanted or case.name in wanted]
        write_config(tune(to_tune, budget_s=args.tune_budget_s, log=log), out_dir)
    # After tuning, so that the configurations timed below are the ones checked.
    correct = check_correctness(cases, log, check_peers=not args.skip_peer_check)
    kernel_breakdown(cases, log)
    host_overhead(cases, log)
    print("\n## timing")
    table, rows = measure(cases, providers, started + args.budget_s, log)

    result = (
        f"### EvoAttention, {log['header']}\n\nbf16, 10 % key padding, bias [B, 1, H, L, L] bf16 "
        f"with gradient, mask [B, N, L]. Times are medians (ms); extra peak memory is above the "
        f"inputs; workspace is that minus the output and the four gradients.\n\n{table.markdown()}\n"
    )
    (out_dir / "results.md").write_text(result)
    (out_dir / "log.json").write_text(json.dumps(log, indent=1, default=str))
    print("\n" + result)
    print(f"correctness: {'PASS' if correct else 'FAIL'}; total {time.perf_counter() - started:.0f} s")
    if args.record:
        record(
            stamp,
            error_rows(log) + rows,
            "evo_attention",
            result.replace("### EvoAttention, ", "### Run of "),
            "EvoAttention",
        )
    return 0 if correct else 1


if __name__ == "__main__":
    sys.exit(main())
