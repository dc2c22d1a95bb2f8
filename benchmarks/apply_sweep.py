"""Merge per-op sweep winners into featurecache/kernels/configs/fused_ops.json for one GPU.

    python3 benchmarks/apply_sweep.py OUT/transition_sweep.json [OUT/triangle_mult_sweep.json ...]
        [--kernels fwd bwd_dx | transition.fwd ...] [--device "NVIDIA H200"]

A sweep file is what `layernorm_linear.py`, `transition.py` or `triangle_mult.py --sweep --out
OUT` writes: {op: {kernel: config}}. The winners go under the device's name (by default the
running GPU's, torch.cuda.get_device_name()), kernel by kernel; other entries are kept. Run it on
the machine that ran the sweep, before the benchmarks that should use the new block sizes. A
sweep runs at one shape: check a winner at the model's other shapes before committing the file.
"""

from __future__ import annotations

import argparse
import json
import pathlib

from harness import REPO

CONFIG = REPO / "featurecache" / "kernels" / "configs" / "fused_ops.json"


def merge(table: dict, device: str, winners: dict, only: set[str]) -> list[str]:
    """Put `winners` ({op: {kernel: config}}) into `table` under `device`; returns what changed."""
    changed = []
    for op, kernels in winners.items():
        if op not in table["default"]:
            raise ValueError(f"op {op!r} is not in {CONFIG.name}; known: {sorted(table['default'])}")
        for kernel, config in kernels.items():
            if only and kernel not in only and f"{op}.{kernel}" not in only:
                continue
            table.setdefault(device, {}).setdefault(op, {})[kernel] = config
            changed.append(f"{op}.{kernel}: {config}")
    return changed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sweeps", nargs="+", type=pathlib.Path, help="sweep files ({op: {kernel: config}})")
    parser.add_argument(
        "--kernels",
        nargs="+",
        default=[],
        help="only these kernels, as `kernel` (any op) or `op.kernel` (default: all)",
    )
    parser.add_argument("--device", default=None, help="the config entry to write (default: this GPU's name)")
    args = parser.parse_args()
    device = args.device
    if device is None:
        import torch

        if not torch.cuda.is_available():
            parser.error("no GPU here: name the entry with --device")
        device = torch.cuda.get_device_name()
    table = json.loads(CONFIG.read_text())
    changed_any = False
    for path in args.sweeps:
        try:
            winners = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as error:
            parser.error(f"{path}: {error}")
        try:
            changed = merge(table, device, winners, set(args.kernels))
        except ValueError as error:
            parser.error(f"{path}: {error}")
        changed_any |= bool(changed)
        for line in changed:
            print(f"{device}: {line}")
    if not changed_any:
        parser.error(f"nothing to apply (kernels named: {args.kernels or 'all'})")
    CONFIG.write_text(layout(table))


def layout(table: dict) -> str:
    """The file's own layout: one line per kernel's config, so a change reads as one line in a diff."""

    def block(mapping: dict, indent: int, depth: int) -> str:
        pad = " " * indent
        lines = []
        for key, value in mapping.items():
            text = block(value, indent + 2, depth + 1) if isinstance(value, dict) and depth < 2 else json.dumps(value)
            lines.append(f"{pad}  {json.dumps(key)}: {text}")
        return "{\n" + ",\n".join(lines) + f"\n{pad}}}"

    return block(table, 0, 0) + "\n"


if __name__ == "__main__":
    main()
