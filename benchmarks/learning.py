"""Does it learn? Overfit one real target through the commands a user runs, and score the result.

    python3 benchmarks/learning.py --cache CACHE --key 721p-assembly1 \
        --truth ../shared/data/structures/721p-assembly1.cif --preset small --minutes 12 --record

1. `featurecache train` on the cache (which holds the target; every step trains on it), with a
   checkpoint every --checkpoint-every steps, until --minutes have passed (train's --max-minutes)
   or --steps are done;
2. `featurecache predict` (--samples structures, --sampler-steps steps) from every --eval-every-th
   checkpoint and the last one;
3. `featurecache evaluate` of each prediction against --truth: CA-RMSD, all-atom and CA lDDT, the
   ligand RMSD after superposing the polymer. The table gives the top-ranked sample (AF3's
   ranking) and the best of the samples per checkpoint: the learning curve.

The curve, the run's settings and its stamp go to OUT/learning.json; with --record (or later,
where OUT came back to: --record-only OUT), to RESULTS.md and results.csv (benchmark "learning").
A run longer than one device call: start this script under setsid in one call and collect OUT in
the next (benchmarks/device_plan.sh learn-start / learn-collect). `featurecache plot OUT/run` draws the training losses;
`python3 benchmarks/learning.py --plot OUT` draws the curve next to them (OUT/learning.png).
On the CPU, --smoke runs the same path at the tiny preset for a few steps (a check, not a figure).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

CLI = [sys.executable, "-m", "featurecache.cli"]
TARGETS = {"ca_rmsd": 1.0, "lddt": 0.90, "ligand_rmsd": 2.0}  # issue 33's overfit targets


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache", type=pathlib.Path)
    parser.add_argument("--key", default="721p-assembly1")
    parser.add_argument("--truth", type=pathlib.Path)
    parser.add_argument("--preset", default="small")
    parser.add_argument("--minutes", type=float, default=12.0, help="wall-clock budget of the training")
    parser.add_argument("--steps", type=int, default=100_000, help="training steps at most")
    parser.add_argument("--checkpoint-every", type=int, default=250)
    parser.add_argument("--eval-every", type=int, default=1000, help="steps between scored checkpoints")
    parser.add_argument("--crop-size", type=int, default=416)
    parser.add_argument("--diffusion-batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--ema-decay", type=float, default=0.99)
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument("--sampler-steps", type=int, default=200)
    parser.add_argument("--cycles", type=int, default=4)
    parser.add_argument("--train-args", default="", help="more `featurecache train` options, one string")
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("runs/learning"))
    parser.add_argument("--record", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="tiny preset, a few steps, on the CPU")
    parser.add_argument("--plot", type=pathlib.Path, metavar="OUT", help="only draw OUT/learning.json")
    parser.add_argument(
        "--record-only",
        type=pathlib.Path,
        metavar="OUT",
        help="only record OUT/learning.json (a run made elsewhere, e.g. on the GPU machine)",
    )
    args = parser.parse_args(argv)
    if args.plot is None and args.record_only is None and (args.cache is None or args.truth is None):
        parser.error("--cache and --truth are required (or --plot OUT, or --record-only OUT)")
    if args.smoke:
        args.preset, args.steps, args.checkpoint_every, args.eval_every = "tiny", 4, 2, 2
        args.samples, args.sampler_steps, args.cycles, args.diffusion_batch, args.crop_size = 1, 2, 1, 2, 64
    return args


def train(args, run_dir: pathlib.Path, cuda: bool) -> tuple[float, bool]:
    """Run `featurecache train` until its steps are done or the budget is spent; returns the
    wall time and whether it was stopped by the budget."""
    command = [
        *CLI,
        "train",
        "--cache",
        str(args.cache),
        "--out",
        str(run_dir),
        "--preset",
        args.preset,
        "--steps",
        str(args.steps),
        "--checkpoint-every",
        str(args.checkpoint_every),
        "--crop-size",
        str(args.crop_size),
        "--diffusion-batch",
        str(args.diffusion_batch),
        "--lr",
        str(args.lr),
        "--warmup",
        str(args.warmup),
        "--ema-decay",
        str(args.ema_decay),
        "--num-workers",
        "2" if cuda else "0",
        *args.train_args.split(),
    ]
    if cuda:
        command.append("--cuda-graphs")
    print("$", " ".join(command), flush=True)
    from harness import run_budgeted_train

    return run_budgeted_train(command, args.minutes)


def checkpoints_to_score(run_dir: pathlib.Path, eval_every: int) -> list[tuple[int, pathlib.Path]]:
    found = sorted((int(path.stem.split("-")[1]), path) for path in run_dir.glob("checkpoint-*.pt"))
    if not found:
        raise SystemExit(f"{run_dir}: no checkpoint was written (the budget ended before the first)")
    chosen = [(step, path) for step, path in found if step % eval_every == 0]
    if found[-1] not in chosen:
        chosen.append(found[-1])
    return chosen


def score(args, step: int, checkpoint: pathlib.Path, out: pathlib.Path) -> dict:
    """Predict from one checkpoint and evaluate every sample; the top-ranked one and the best."""
    predictions = out / f"predictions-{step:08d}"
    listing = subprocess.run(
        [
            *CLI,
            "predict",
            "--cache",
            str(args.cache),
            args.key,
            "--checkpoint",
            str(checkpoint),
            "--out",
            str(predictions),
            "--samples",
            str(args.samples),
            "--steps",
            str(args.sampler_steps),
            "--cycles",
            str(args.cycles),
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    top = predictions / args.key / f"{args.key}_model.cif"
    evaluated = subprocess.run(
        [*CLI, "evaluate", str(top), *listing, "--truth", str(args.truth), "--json"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.splitlines()
    scores = [json.loads(line) for line in evaluated]
    best = min(scores[1:], key=lambda entry: entry["ca_rmsd"])
    return {"step": step, "top_ranked": scores[0], "best_of_samples": best}


def curve_table(curve: list[dict]) -> str:
    lines = [
        "| step | CA-RMSD top (best) A | lDDT top (best) | CA-lDDT top | ligand RMSD top A | per-chain CA-RMSD top A |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for point in curve:
        top, best = point["top_ranked"], point["best_of_samples"]
        ligand = "-" if top["ligand_rmsd"] is None else f"{top['ligand_rmsd']:.2f}"
        chains = ", ".join(f"{chain} {value:.2f}" for chain, value in top["chain_ca_rmsd"].items())
        lines.append(
            f"| {point['step']} | {top['ca_rmsd']:.2f} ({best['ca_rmsd']:.2f}) | {top['lddt']:.3f} "
            f"({best['lddt']:.3f}) | {top['ca_lddt']:.3f} | {ligand} | {chains} |"
        )
    return "\n".join(lines)


def record(args, result: dict) -> None:
    from harness import RunStamp
    from records import Row, record as record_rows

    stamp = RunStamp(**result["stamp"])
    shape = f"{args.key}, crop {args.crop_size}, {args.preset} preset, {result['steps_done']} steps"
    rows = [
        Row("learning", f"featurecache ({point_name})", f"{shape}; checkpoint {point['step']}", metric, value)
        for point in result["curve"]
        for point_name in ("top_ranked", "best_of_samples")
        for metric, value in (
            ("CA-RMSD A", point[point_name]["ca_rmsd"]),
            ("lDDT", point[point_name]["lddt"]),
            ("ligand RMSD A", point[point_name]["ligand_rmsd"]),
        )
        if value is not None
    ]
    rows.append(Row("learning", "featurecache", shape, "train wall s", result["train_s"]))
    final = result["curve"][-1]["top_ranked"]
    verdict = ", ".join(
        f"{name} {final[name]:.3f} (target {'<=' if name != 'lddt' else '>='} {bound})"
        for name, bound in TARGETS.items()
        if final.get(name) is not None
    )
    section = "\n".join(
        [
            f"### Overfit {args.key} ({stamp.header()})",
            "",
            f"`{result['command']}`",
            "",
            f"{result['steps_done']} steps in {result['train_s']:.0f} s of training "
            f"({'stopped by the budget' if result['stopped'] else 'all steps done'}); {args.samples} samples of "
            f"{args.sampler_steps} sampler steps and {args.cycles} cycles per scored checkpoint.",
            "",
            curve_table(result["curve"]),
            "",
            f"Last checkpoint scored, top-ranked sample: {verdict}.",
            *([""] + [result["note"]] if result.get("note") else []),
        ]
    )
    record_rows(stamp, rows, "learning", section, title="Learning: overfit one real target (issue 33)")


def plot(out: pathlib.Path) -> pathlib.Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    result = json.loads((out / "learning.json").read_text())
    log = [json.loads(line) for line in (out / "run" / "log.jsonl").read_text().splitlines() if line.strip()]
    train = [entry for entry in log if entry.get("kind", "train") == "train" and "loss" in entry]
    figure, (loss_axis, rmsd_axis, lddt_axis) = plt.subplots(1, 3, figsize=(14, 4))
    loss_axis.plot([entry["step"] for entry in train], [entry["loss"] for entry in train], linewidth=0.6)
    loss_axis.set(title="training loss", xlabel="step", yscale="log")
    steps = [point["step"] for point in result["curve"]]
    for name, style in (("top_ranked", "o-"), ("best_of_samples", "s--")):
        rmsd_axis.plot(steps, [point[name]["ca_rmsd"] for point in result["curve"]], style, label=name)
        lddt_axis.plot(steps, [point[name]["lddt"] for point in result["curve"]], style, label=name)
    rmsd_axis.axhline(TARGETS["ca_rmsd"], color="grey", linestyle=":")
    lddt_axis.axhline(TARGETS["lddt"], color="grey", linestyle=":")
    rmsd_axis.set(title="CA-RMSD to the truth (A)", xlabel="step", yscale="log")
    lddt_axis.set(title="all-atom lDDT", xlabel="step", ylim=(0, 1))
    rmsd_axis.legend(fontsize=8)
    figure.tight_layout()
    path = out / "learning.png"
    figure.savefig(path, dpi=120)
    return path


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.plot is not None:
        print(plot(args.plot))
        return
    if args.record_only is not None:
        record_only(args.record_only)
        return
    import torch
    from harness import run_stamp

    cuda = torch.cuda.is_available() and not args.smoke
    args.out.mkdir(parents=True, exist_ok=True)
    run_dir = args.out / "run"
    train_s, stopped = train(args, run_dir, cuda)
    log = [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines() if line.strip()]
    steps_done = max(entry.get("step", 0) for entry in log)
    curve = []
    for step, checkpoint in checkpoints_to_score(run_dir, args.eval_every):
        curve.append(score(args, step, checkpoint, args.out))
        print(curve_table(curve[-1:]).splitlines()[-1], flush=True)
    result = {
        "command": " ".join(sys.argv),
        "args": {name: str(value) if isinstance(value, pathlib.Path) else value for name, value in vars(args).items()},
        "stamp": dataclasses.asdict(run_stamp()),
        "train_s": train_s,
        "stopped": stopped,
        "steps_done": steps_done,
        "curve": curve,
        "targets": TARGETS,
    }
    (args.out / "learning.json").write_text(json.dumps(result, indent=1))
    print(curve_table(curve))
    if args.record:
        record(args, result)


def record_only(out: pathlib.Path) -> None:
    """Record a run whose OUT came back from another machine (its stamp is the run's own)."""
    result = json.loads((out / "learning.json").read_text())
    args = argparse.Namespace(**result["args"])
    record(args, result)
    print(curve_table(result["curve"]))


if __name__ == "__main__":
    main()
