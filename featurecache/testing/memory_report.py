"""Counting what autograd keeps for backward, by part of the model.

A training step's peak memory is the weights and optimizer state, plus every tensor the forward
saves for backward and holds until backward reaches it, plus what one recomputed block needs
at a time. `SavedTensorCounter` measures the middle term exactly, on any device: inside its
context every tensor autograd saves is counted once per storage (a view and its base, or the
same tensor saved by two ops, are one allocation), attributed to the innermost watched module
that was running when it was saved. Parameters are left out: they are there anyway.

    counter = SavedTensorCounter({"pairformer": "Pairformer", ...})
    with counter.watching(model):
        outputs = model(batch, ...)
        loss = model.loss(batch, outputs)
    counter.bytes_by_part()   # {"Pairformer": ..., "losses and glue": ...}

Checkpointed blocks (torch.utils.checkpoint, reentrant) save only their inputs in forward; the
recomputation inside backward runs outside the context and is not counted.
"""

from __future__ import annotations

import contextlib
import math
from collections import defaultdict

import torch
from torch import nn

OUTSIDE = "losses"  # saved while no watched module was running (AF3Model.loss)


class SavedTensorCounter:
    """Bytes of the distinct storages autograd saves, per part. `parts` maps a module's
    qualified name in the watched model ("diffusion_module.transformer") to a part label; the
    longest matching prefix wins."""

    def __init__(self, parts: dict[str, str]) -> None:
        self.parts = parts
        self._stack: list[str] = []
        self._seen: dict[int, str] = {}
        self._bytes: dict[str, int] = defaultdict(int)
        self.saved: list[tuple[str, int, tuple, torch.dtype]] = []  # (part, bytes, shape, dtype), in order
        self._parameters: set[int] = set()

    def _pack(self, tensor: torch.Tensor):
        if tensor.layout == torch.strided and tensor.device.type != "meta":
            storage = tensor.untyped_storage()
            key = storage.data_ptr()
            if key not in self._seen and key not in self._parameters and storage.nbytes() > 0:
                part = self._stack[-1] if self._stack else OUTSIDE
                self._seen[key] = part
                self._bytes[part] += storage.nbytes()
                self.saved.append((part, storage.nbytes(), tuple(tensor.shape), tensor.dtype))
        return tensor

    @contextlib.contextmanager
    def watching(self, model: nn.Module):
        """Count what `model`'s forward (and anything else run inside) saves for backward."""
        self._parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
        handles = []
        for name, module in model.named_modules():
            # every module, labelled by its longest watched prefix: a part's helper methods
            # (DiffusionModule.prepare, ...) are not forward calls, but their submodules' are
            part = self.part_of(name)
            if part is not None:
                handles.append(module.register_forward_pre_hook(self._enter(part)))
                handles.append(module.register_forward_hook(self._leave, always_call=True))
        try:
            with torch.autograd.graph.saved_tensors_hooks(self._pack, lambda tensor: tensor):
                yield self
        finally:
            for handle in handles:
                handle.remove()
            self._stack.clear()

    def part_of(self, name: str) -> str | None:
        matches = [prefix for prefix in self.parts if prefix == "" or name == prefix or name.startswith(prefix + ".")]
        return self.parts[max(matches, key=len)] if matches else None

    def _enter(self, part: str):
        def hook(_module, _args):
            self._stack.append(part)

        return hook

    def _leave(self, _module, _args, _output):
        self._stack.pop()

    def bytes_by_part(self) -> dict[str, int]:
        return dict(self._bytes)

    def total_bytes(self) -> int:
        return sum(self._bytes.values())


def growth_orders(small: list[tuple], large: list[tuple], small_length: int, large_length: int) -> list[int]:
    """The power of L (0 to 3) by which each saved storage grows: the same forward at two
    lengths saves the same sequence of tensors, so the i-th of each run is the same tensor."""
    if [item[0] for item in small] != [item[0] for item in large]:
        raise ValueError("the two runs saved different sequences of tensors: their growth cannot be matched")
    ratio = math.log(large_length / small_length)
    return [min(3, max(0, round(math.log(b[1] / a[1]) / ratio))) for a, b in zip(small, large)]


# The parts of AF3Model (featurecache.model.af3) the accounting reports.
AF3_PARTS = {
    "": "glue (AF3Model)",
    "input_embedder": "input embedder",
    "recycle_single": "input embedder",
    "recycle_pair": "input embedder",
    "template_embedder": "templates",
    "msa_module": "MSA module",
    "pairformer": "Pairformer",
    "distogram_head": "distogram head",
    "diffusion_module": "diffusion: other",
    "diffusion_module.conditioning": "diffusion: conditioning",
    "diffusion_module.atom_encoder": "diffusion: atom encoder",
    "diffusion_module.transformer": "diffusion: transformer",
    "diffusion_module.atom_decoder": "diffusion: atom decoder",
    "confidence_head": "confidence head",
}
