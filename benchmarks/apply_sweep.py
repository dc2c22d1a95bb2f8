"""Merge a fused_ops.py sweep result into configs/fused_ops.json for this GPU.

    python3 benchmarks/apply_sweep.py OUT/fused_ops_sweep.json [KERNEL ...]

The winners go under the running GPU's name (torch.cuda.get_device_name()), kernel by kernel
(only the KERNELs named, e.g. `fwd`, if any); other entries are kept. Run it on the machine that
ran the sweep, before the benchmarks that should use the new block sizes. A sweep runs at one
shape: check a winner at the model's other shapes before committing the file.
"""

from __future__ import annotations

import json
import pathlib
import sys

import torch

CONFIG = pathlib.Path(__file__).resolve().parents[1] / "featurecache" / "kernels" / "configs" / "fused_ops.json"


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    only = set(sys.argv[2:])
    winners = json.loads(pathlib.Path(sys.argv[1]).read_text())
    table = json.loads(CONFIG.read_text())
    entry = table.setdefault(torch.cuda.get_device_name(), {})
    for op, kernels in winners.items():
        for kernel, config in kernels.items():
            if only and kernel not in only:
                continue
            entry.setdefault(op, {})[kernel] = config
            print(f"{op}.{kernel}: {config}")
    CONFIG.write_text(json.dumps(table, indent=2) + "\n")


if __name__ == "__main__":
    main()
