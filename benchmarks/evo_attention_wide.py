"""EvoAttention past 2^31 elements: triangle attention around the ending node at crops whose
transposed views need 64-bit tile offsets (WIDE_INDEX), checked against the starting node.

    PYTHONUNBUFFERED=1 python3 benchmarks/evo_attention_wide.py [--lengths 2048,2560] [--out DIR]
    python3 benchmarks/evo_attention_wide.py --smoke

The ending node on a packed projection P is the starting node on P transposed (pairs (i, j) and
(j, i) swapped), so gated_pair_attention(P, transpose=True) must equal
gated_pair_attention(P^T contiguous, transpose=False)^T, output and gradient. At L >= ~2017 the
first reads P through views whose tile offsets pass 2^31 elements (64-bit path); the second,
contiguous, stays on 32-bit offsets: a wrong offset shows up as a mismatch (or a fault), and the
timing shows what the 64-bit path costs. 4 heads of 32, bf16, 10 % of the tokens padded.
--smoke: L = 12 on the CPU under the interpreter with the limit forced to 1 element.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys

if "--smoke" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402
from harness import Table, argument_parser, run_stamp, time_ms  # noqa: E402

from featurecache.kernels.evo_attention import launch, wide_index  # noqa: E402
from featurecache.kernels.gated_attention import packed_views, gated_pair_attention  # noqa: E402
from featurecache.testing.compare import rel_error  # noqa: E402

HEADS, HEAD_DIM, ROW = 4, 32, 528  # AF3's triangle attention; rows 16-aligned as LayerNormLinear writes them


def run(length: int, device: torch.device) -> list:
    width = 4 * HEADS * HEAD_DIM + HEADS
    packed = torch.randn(1, length, length, ROW, device=device, dtype=torch.bfloat16)[..., :width]
    token = torch.arange(length, device=device)[None] < -(-9 * length // 10)
    mask = token[:, :, None] & token[:, None, :]
    transposed = packed.transpose(1, 2).contiguous()
    grad = torch.randn(1, length, length, HEADS * HEAD_DIM, device=device, dtype=torch.bfloat16)
    q_end = packed_views(packed, HEADS, HEAD_DIM, True)[0]
    wide = wide_index(q_end)

    def ending():
        leaf = packed.detach().requires_grad_()
        out = gated_pair_attention(leaf, mask, HEADS, HEAD_DIM, transpose=True)
        out.backward(grad)
        return out, leaf.grad

    def starting():
        leaf = transposed.detach().requires_grad_()
        out = gated_pair_attention(leaf, mask, HEADS, HEAD_DIM, transpose=False)
        out.backward(grad.transpose(1, 2))
        return out.transpose(1, 2), leaf.grad.transpose(1, 2)

    out_end, grad_end = ending()
    out_start, grad_start = starting()
    errors = (rel_error(out_end, out_start), rel_error(grad_end, grad_start))
    del out_end, grad_end, out_start, grad_start
    times = (time_ms(ending, warmup_ms=5, rep_ms=50), time_ms(starting, warmup_ms=5, rep_ms=50))
    print(
        f"L={length}: 64-bit path {wide}, rel. difference out {errors[0]:.2e} grad {errors[1]:.2e}, "
        f"ending {times[0]:.2f} ms, starting {times[1]:.2f} ms",
        flush=True,
    )
    return [length, wide, *errors, *times]


def main() -> None:
    parser = argument_parser(__doc__)
    parser.add_argument("--lengths", default="2048,2560", help="comma-separated crop sizes")
    parser.add_argument("--out", type=pathlib.Path, default=None, help="folder for evo_attention_wide.json")
    parser.add_argument("--smoke", action="store_true", help="L = 12 on the CPU, limit forced to 1 element")
    args = parser.parse_args()
    if args.record:
        parser.error("--record: this check's rows are not recorded in RESULTS.md; paste its table into the notes")
    if not args.smoke and not torch.cuda.is_available():
        parser.error("benchmarks/evo_attention_wide.py needs a CUDA GPU (or --smoke)")
    device = torch.device("cpu" if args.smoke else "cuda")
    lengths = [12] if args.smoke else [int(n) for n in args.lengths.split(",")]
    if args.smoke:
        launch.INDEX_LIMIT = 1
    torch.manual_seed(0)
    stamp = run_stamp()
    print(stamp.header())
    table = Table(["L", "64-bit offsets", "rel. diff out", "rel. diff grad", "ending ms", "starting ms"])
    bad = []
    for length in lengths:
        try:
            row = run(length, device)
        except torch.cuda.OutOfMemoryError as error:
            print(f"L={length}: out of memory ({str(error)[:120]})")
            continue
        table.add(row)
        if max(row[2:4]) > 2e-2:  # bf16 rounding of two summation orders stays ~1e-3
            bad.append(length)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    print(stamp.header())
    print(table.markdown())
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "evo_attention_wide.json").write_text(json.dumps({"header": stamp.header(), "rows": table.rows}))
    if bad:
        sys.exit(f"ending and starting node disagree at L = {bad}")


if __name__ == "__main__":
    main()
