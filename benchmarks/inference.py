"""Inference: featurecache's AF3Model.sample against Protenix 2.0's own inference (issue 34), at
the same tokens, samples, sampler steps, recycling cycles, MSA rows and templates, random weights.

    python3 benchmarks/inference.py [--tokens 384 768 1024] [--samples 5] [--steps 200] [--cycles 4] [--record]
    python3 benchmarks/inference.py --smoke    # the CPU check: one block per stack, 24 tokens, 2 steps

Variants, each in a child process of this script (a CUDA fault spoils only its own context, and
its peak memory is its own):
- featurecache: the `af3` preset (Triton kernels on CUDA) in eval mode under bf16 autocast, as
  `featurecache predict` runs it: the trunk's cycles, the sampler, the confidence head;
- featurecache+graphs: the same with the sampler's denoiser replayed from a CUDA graph
  (`predict --cuda-graphs`; CUDA only);
- protenix: Protenix 2.0's model (protenix_base_default_v1.0.0) called in mode "inference" under
  bf16 autocast, as its runner/inference.py calls it, with its defaults otherwise (its chunk
  sizes by token count, its kernels where this machine runs them: protenix_peer.py), on the
  features its featurizer would give (protenix_peer.synthetic_example). Its inference also
  computes its summary confidences (pTM, ipTM, ...) inside the call; featurecache computes those
  when writing files, outside the timed call.

Per size: one untimed call (kernel compilation, autotuning, the graph's capture), then --reps
timed calls, each on the host clock around a synchronised call; the median, and the peak of
allocated device memory over a timed call. The weights are random: speed does not depend on them.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

import harness
import torch
from harness import Table, argument_parser
from records import Row, record
from step_timing import autocast, peak_gb, sync

VARIANTS = ("protenix", "featurecache", "featurecache+graphs")
# --smoke: every stack cut to one block (Protenix's SMALL_BLOCKS and its Pairformer depth 1)
SMOKE_SETTINGS = {
    "pairformer_blocks": 1,
    "msa_blocks": 1,
    "template_blocks": 1,
    "diffusion_blocks": 1,
    "atom_blocks": 1,
    "confidence_blocks": 1,
}


class FeaturecacheInference:
    """AF3Model.sample as `featurecache predict` calls it (prediction/run.py's sample_target)."""

    def __init__(self, device: torch.device, args, graphs: bool) -> None:
        from featurecache.model import AF3Model, preset
        from featurecache.prediction.run import PredictOptions

        self.device, self.args, self.graphs = device, args, graphs
        kernels = "triton" if device.type == "cuda" else "torch"
        settings = SMOKE_SETTINGS if args.smoke else {}
        self.model = AF3Model(preset("af3", kernels=kernels, checkpoint_blocks=False, **settings)).to(device).eval()
        # the sampling settings of `featurecache predict` (no cache or files: only the model runs)
        self.options = PredictOptions(
            cache="",
            keys=(),
            checkpoint="",
            out="",
            samples=args.samples,
            steps=args.steps,
            cycles=args.cycles,
            cuda_graphs=graphs,
        )

    def batch(self, length: int) -> dict:
        from featurecache.testing.synthetic import random_batch

        generator = torch.Generator().manual_seed(length)
        batch = random_batch(
            [length], [self.args.msa_rows], [self.args.templates], generator, self.args.atoms_per_token
        )
        return {k: v.to(self.device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}

    def atoms(self, batch: dict) -> int:
        return int(batch["atom_pad_mask"].sum())

    def __call__(self, batch: dict) -> None:
        from featurecache.prediction.run import sample_target

        sample_target(self.model, batch, self.options, self.device)


class ProtenixInference:
    """Protenix's model in mode "inference", as its runner/inference.py's predict calls it."""

    def __init__(self, device: torch.device, args) -> None:
        import contextlib
        import io

        import protenix_peer

        self.device, self.args = device, args
        self.protenix = protenix_peer.import_protenix(device, args.tokens[0])
        config = protenix_peer.build_config(self.protenix, 1 if args.smoke else 48, 1, small=args.smoke)
        config.model.N_cycle = args.cycles
        config.sample_diffusion.N_sample = args.samples
        config.sample_diffusion.N_step = args.steps
        self.kernel_options = self.protenix["options"]
        with contextlib.redirect_stdout(io.StringIO()):  # its factories print their settings
            self.model = self.protenix["Protenix"](config).to(device).eval()
        self.config = config

    def batch(self, length: int) -> dict:
        import protenix_peer

        generator = torch.Generator().manual_seed(length)
        features, _, _ = protenix_peer.synthetic_example(
            length, self.args.msa_rows, self.args.templates, self.args.atoms_per_token, generator
        )
        return {k: v.to(self.device) if isinstance(v, torch.Tensor) else v for k, v in features.items()}

    def atoms(self, batch: dict) -> int:
        return int(batch["atom_to_token_idx"].shape[0])

    def __call__(self, batch: dict) -> None:
        with torch.no_grad(), autocast(self.device):
            self.model(
                input_feature_dict=dict(batch),  # its forward adds derived features to the dict
                label_full_dict=None,
                label_dict=None,
                mode="inference",
                mc_dropout_apply_rate=self.config.mc_dropout_apply_rate,
            )


def run_variant(variant: str, args) -> dict:
    """This process's runs of one variant at every size: {"sizes": [...], "settings": str}, written
    to --result-json after each size (a budget that stops the process keeps the sizes done)."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cpu":  # the smoke check's small matrices: OpenMP threads only wait on each other
        torch.set_num_threads(1)
    if variant == "protenix":
        runner = ProtenixInference(device, args)
        settings = f"protenix_base_default_v1.0.0; kernels {runner.kernel_options}"
    else:
        runner = FeaturecacheInference(device, args, graphs=variant.endswith("+graphs"))
        settings = f"af3 preset, {'triton' if device.type == 'cuda' else 'torch'} kernels"
    sizes = []
    for length in args.tokens:
        batch = runner.batch(length)
        runner(batch)  # untimed: compilation, autotuning, capture
        sync(device)
        times = []
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        for _ in range(args.reps):
            started = time.perf_counter()
            runner(batch)
            sync(device)
            times.append(time.perf_counter() - started)
        sizes.append(
            {"tokens": length, "atoms": runner.atoms(batch), "s": statistics.median(times), "peak GB": peak_gb(device)}
        )
        print(f"[{variant}] {length} tokens: {sizes[-1]['s']:.2f} s, peak {sizes[-1]['peak GB']:.1f} GB", flush=True)
        del batch
        result = {"sizes": sizes, "settings": settings, "device": str(device)}
        args.result_json.write_text(json.dumps(result))
    return result


def unavailable(variant: str) -> str | None:
    """Why a variant cannot run on this machine, or None."""
    if variant.endswith("+graphs") and not torch.cuda.is_available():
        return "CUDA graphs need a CUDA device"
    if variant == "protenix":
        import protenix_peer

        return protenix_peer.unavailable_reason()
    return None


def in_child(variant: str, argv: list[str], budget_s: float | None) -> dict:
    """run_variant in a child process of this script, stopped after budget_s seconds: its figures
    (those of the sizes it finished, with "stopped" when the budget ran out), or {"error": why}."""
    with tempfile.NamedTemporaryFile(suffix=".json") as result:
        command = [sys.executable, __file__, *argv, "--variant", variant, "--result-json", result.name]
        child = subprocess.Popen(command)
        try:
            failed, stopped = child.wait(timeout=budget_s) != 0, False
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
            failed, stopped = False, True
        text = pathlib.Path(result.name).read_text()
        if failed or not text:
            reason = f"stopped by its {budget_s:g} s budget before any size" if stopped else "its run failed"
            return {"error": f"{reason} (its output is above)"}
        return {**json.loads(text), "stopped": stopped}


def shape_name(args, length: int) -> str:
    return (
        f"{length} tokens, {args.samples} samples x {args.steps} steps, {args.cycles} cycles, "
        f"{args.msa_rows} MSA rows, {args.templates} templates"
    )


def main() -> None:
    parser = argument_parser(__doc__)
    parser.add_argument("--tokens", type=int, nargs="+", default=[384, 768, 1024])
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument("--steps", type=int, default=200, help="sampler steps (AF3: 200)")
    parser.add_argument("--cycles", type=int, default=4, help="recycling cycles (AF3 infers with 4; its docs time 10)")
    parser.add_argument("--msa-rows", type=int, default=1024)
    parser.add_argument("--templates", type=int, default=4)
    parser.add_argument("--atoms-per-token", type=int, default=8)
    parser.add_argument("--reps", type=int, default=2, help="timed calls per size after one untimed")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument(
        "--variant-budget-s", type=float, help="stop a variant's process after this long (the sizes done are kept)"
    )
    parser.add_argument(
        "--peer-budget-s",
        type=float,
        help="Protenix's budget instead of --variant-budget-s (its first run builds its LayerNorm extension: "
        "on 2026-12-05 that outlasted 175 s)",
    )
    parser.add_argument("--smoke", action="store_true", help="CPU check: one block per stack, 24 tokens, 2 steps")
    parser.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--result-json", type=pathlib.Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.smoke:
        args.tokens, args.samples, args.steps, args.cycles = [24], 2, 2, 1
        args.msa_rows, args.templates, args.atoms_per_token, args.reps = 8, 1, 4, 1
    if args.variant:  # a child: one variant, its figures to --result-json
        args.result_json.write_text(json.dumps(run_variant(args.variant, args)))
        return
    stamp = harness.run_stamp()
    child_argv = [word for word in sys.argv[1:] if word != "--record"]  # (a child ignores the budget)
    runs = {}
    for variant in args.variants:
        reason = unavailable(variant)
        budget = args.peer_budget_s if variant == "protenix" and args.peer_budget_s else args.variant_budget_s
        runs[variant] = {"error": reason} if reason else in_child(variant, child_argv, budget)
    table = Table(["tokens", "variant", "atoms", "model s (median)", "peak GB", "protenix s / this"])
    rows = []
    peer = {size["tokens"]: size["s"] for size in runs.get("protenix", {}).get("sizes", [])}
    for variant, run in runs.items():
        if "error" in run:
            table.add(["all", variant, "–", f"not run: {run['error']}", "–", "–"])
            continue
        for size in run["sizes"]:
            ratio = peer[size["tokens"]] / size["s"] if size["tokens"] in peer else "–"  # no peer figure
            table.add([size["tokens"], variant, size["atoms"], size["s"], size["peak GB"], ratio])
            shape = shape_name(args, size["tokens"])
            rows += [
                Row("inference", variant, shape, "model s", size["s"]),
                Row("inference", variant, shape, "peak GB", size["peak GB"]),
            ]
        if run["stopped"] and len(run["sizes"]) < len(args.tokens):  # (not when only its exit was cut)
            table.add(["larger", variant, "–", "not run: stopped by --variant-budget-s", "–", "–"])
    settings = "; ".join(f"{variant}: {run['settings']}" for variant, run in runs.items() if "settings" in run)
    print(f"\n{stamp.header()}\n\n{settings}\n\n{table.markdown()}")
    if args.record and not args.smoke:
        section = (
            f"### {stamp.date}, {stamp.device}, commit {stamp.commit}\n\n"
            f"`python3 benchmarks/inference.py {' '.join(child_argv)}`: {args.samples} samples x {args.steps} "
            f"sampler steps, {args.cycles} cycles, {args.msa_rows} MSA rows, {args.templates} templates, random "
            f"weights, bf16 autocast; median of {args.reps} calls after one.\n\n{settings}\n\n{table.markdown()}"
        )
        record(stamp, rows, "inference", section, title="Inference against Protenix 2.0 (issue 34)")


if __name__ == "__main__":
    main()
