"""Digests of one training step of the tiny model on the Triton kernels: a pure move of code must
leave every number bitwise the same.

One forward and backward of `preset("tiny", kernels="triton")` (seed 0, a synthetic batch of 20
tokens, an MSA, a template, 2 diffusion samples, one cycle), then the sha256 of the loss,
of every output and of every parameter's gradient. Run it at two commits on one device and compare:

    python3 benchmarks/kernel_digests.py --out before.json          # at the old commit
    python3 benchmarks/kernel_digests.py --compare before.json      # at the new one: exit 1 if any differs

On a machine without CUDA the kernels run under TRITON_INTERPRET=1 (set here before triton is
imported; a few minutes on 2 cores) in fp32; on a GPU in bf16 autocast, as training runs them.
Every Triton kernel the model launches is on this path (EvoAttention, the triangle multiplication,
the windowed atom attention, the transitions, the fused LayerNorm-linears, residual adds, smooth LDDT).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys


def _digest(tensor) -> str:
    import torch

    data = tensor.detach().contiguous().cpu()
    if data.dtype == torch.bfloat16:
        data = data.view(torch.int16)
    return hashlib.sha256(data.numpy().tobytes()).hexdigest()[:20] + f" {tuple(data.shape)}"


def step_digests(device: str) -> dict[str, str]:
    import torch

    from featurecache.model import AF3Model, preset
    from featurecache.testing.synthetic import random_batch

    torch.manual_seed(0)
    model = AF3Model(preset("tiny", kernels="triton")).to(device).train()
    batch = random_batch([20], [6], [1], torch.Generator().manual_seed(0), num_atoms_per_token=4)
    batch = {name: value.to(device) if torch.is_tensor(value) else value for name, value in batch.items()}
    torch.manual_seed(1)  # the step's own draws (noise levels, dropout masks)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=device == "cuda"):
        outputs = model(batch, num_cycles=1, diffusion_batch=2)
        loss, terms = model.loss(batch, outputs)
    loss.backward()
    digests = {"loss": _digest(loss)}
    digests.update({f"term/{name}": _digest(value) for name, value in sorted(terms.items()) if torch.is_tensor(value)})
    digests.update(
        {f"output/{name}": _digest(value) for name, value in sorted(outputs.items()) if torch.is_tensor(value)}
    )
    digests.update(
        {
            f"grad/{name}": _digest(param.grad)
            for name, param in sorted(model.named_parameters())
            if param.grad is not None
        }
    )
    return digests


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="write the digests to this JSON file")
    parser.add_argument("--compare", help="digests written by an earlier run (same device): exit 1 if any differs")
    args = parser.parse_args(argv)
    import torch  # after the arguments: a typo costs no import

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
        if "triton" in sys.modules:
            raise SystemExit("triton was imported before TRITON_INTERPRET could be set")
    digests = {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu (TRITON_INTERPRET=1)",
        **step_digests(device),
    }
    print(f"{len(digests) - 1} digests on {digests['device']}")
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(digests, handle, indent=1, sort_keys=True)
    if args.compare:
        with open(args.compare) as handle:
            before = json.load(handle)
        names = sorted(set(before) | set(digests))
        differ = [name for name in names if before.get(name) != digests.get(name)]
        print(
            f"| compared | equal | differ |\n| --- | --- | --- |\n| {len(names)} | {len(names) - len(differ)} | {len(differ)} |"
        )
        for name in differ[:40]:
            print(f"  {name}: {before.get(name)} -> {digests.get(name)}")
        return 1 if differ else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
