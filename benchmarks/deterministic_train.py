"""What --deterministic costs and whether it holds on a GPU (issue 21).

    python benchmarks/deterministic_train.py [--preset af3 --crop 384 --depth 8 --steps 8]

Builds a cache of the sample structures (FC_SHARED_DATA), then trains the same run three times
from one seed: launched, --deterministic, --deterministic again. Prints one markdown table:
the median step time after the first two steps (kernel compilation), and whether the two
deterministic runs (and the plain one against them) give bitwise identical losses, gradient
norms and final weights. Writes the table and the per-step losses to $OUT/deterministic.json
when OUT is set. A run that stops (an op without a deterministic CUDA kernel raises under
torch.use_deterministic_algorithms) prints the error line in the table.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from featurecache.config import SampleConfig  # noqa: E402
from featurecache.training import TrainConfig, train  # noqa: E402

DATA = pathlib.Path(os.environ.get("FC_SHARED_DATA", REPO.parent / "shared" / "data"))


def build_cache(work: pathlib.Path) -> pathlib.Path:
    from featurecache.precompute.pipeline import PrecomputeOptions, precompute

    cache = work / "cache"
    precompute(
        PrecomputeOptions(
            inputs=[DATA / "structures"],
            cache_dir=cache,
            alignments_dir=DATA / "alignments",
            executor="inline",
            progress=False,
        )
    )
    return cache


def run(args, cache: pathlib.Path, out: pathlib.Path, deterministic: bool) -> dict:
    config = TrainConfig(
        cache=str(cache),
        out=str(out),
        preset=args.preset,
        model_settings={"pairformer_blocks": args.depth},
        steps=args.steps,
        num_workers=2,
        checkpoint_every=args.steps,
        warmup=10,
        lr=1e-4,
        sample=SampleConfig(crop_size=args.crop, msa_rows_per_sample=args.msa_rows, seed=1),
        static_shapes=True,
        deterministic=deterministic,
    )
    try:
        records = train(config)
    except Exception as error:  # noqa: BLE001 - the table says what stopped the run
        return {"error": f"{type(error).__name__}: {' '.join(str(error).split())[:200]}"}
    state = torch.load(out / f"checkpoint-{args.steps:08d}.pt", map_location="cpu", weights_only=False)
    return {
        "losses": [r["loss"] for r in records],
        "grad_norms": [r["grad_norm"] for r in records],
        "step_ms": statistics.median(1e3 * r["step_time_s"] for r in records[2:]),
        "peak_gb": max(r["peak_memory_gb"] for r in records),
        "weights": state["model"],
    }


def same(first: dict, second: dict) -> str:
    if "error" in first or "error" in second:
        return "-"
    equal = (
        first["losses"] == second["losses"]
        and first["grad_norms"] == second["grad_norms"]
        and all(torch.equal(value, second["weights"][name]) for name, value in first["weights"].items())
    )
    return "bitwise" if equal else "differ"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="af3")
    parser.add_argument("--depth", type=int, default=8, help="Pairformer blocks (af3: 48)")
    parser.add_argument("--crop", type=int, default=384)
    parser.add_argument("--msa-rows", type=int, default=512)
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    work = pathlib.Path(tempfile.mkdtemp(prefix="fc-deterministic-"))
    cache = build_cache(work)
    runs = {
        name: run(args, cache, work / name, deterministic)
        for name, deterministic in (("launched", False), ("deterministic", True), ("deterministic again", True))
    }
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    lines = [
        f"{device}, torch {torch.__version__}, preset {args.preset} depth {args.depth}, crop {args.crop}, "
        f"{args.steps} steps",
        "",
        "| run | median step (ms) | peak (GB) | vs deterministic run |",
        "| --- | --- | --- | --- |",
    ]
    for name, result in runs.items():
        if "error" in result:
            lines.append(f"| {name} | stopped: {result['error']} | | |")
            continue
        other = runs["deterministic again" if name != "deterministic again" else "deterministic"]
        lines.append(f"| {name} | {result['step_ms']:.1f} | {result['peak_gb']:.2f} | {same(result, other)} |")
    table = "\n".join(lines)
    print(table)
    if os.environ.get("OUT"):
        summary = {
            name: {key: value for key, value in result.items() if key != "weights"} for name, result in runs.items()
        }
        pathlib.Path(os.environ["OUT"], "deterministic.json").write_text(
            json.dumps({"table": table, "runs": summary}, indent=1)
        )


if __name__ == "__main__":
    main()
