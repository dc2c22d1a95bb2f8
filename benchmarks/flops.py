"""FLOPs of one full AF3 training step, per part: counted, not timed (the same on any device).

    python3 benchmarks/flops.py [--crop 384 768] [--record]
    python3 benchmarks/flops.py --check-only          # the tiny check alone: fake counting == real counting
    python3 benchmarks/flops.py --cache CACHE --crop 384 768 [--record]   # the af3 step on a cache's batches

The step is benchmarks/train_step.py's `--model af3` iteration (FullModelRunner): AF3Model's
forward at N_cycle = --cycles (1, as that benchmark and peers report a step), the diffusion batch
of --diffusion-batch noised copies, the confidence head on its mini-rollout, AF3Model.loss and
backward, with the preset's recomputation (activation checkpoints per block: their re-run
forwards count). torch.utils.flop_counter.FlopCounterMode counts it on the PyTorch (reference
kernel) path, every attention as evo_attention_reference with autograd's backward; the Triton
kernels compute the same products, except that EvoAttention and the window attention also re-run
their score products in backward (flash-style), not counted here.
Only matrix products and attention count (FlopCounterMode's registry: mm, bmm, addmm, baddbmm,
convolutions, SDPA): element-wise work, softmax, norms and the optimizer are left out, as in a
model-FLOP count.

Tensors are fake (torch._subclasses.FakeTensorMode: shapes and dtypes, no storage), so the af3
preset at crop 768 is counted on a small CPU. Before that, the script checks on the tiny preset
that counting with fake tensors gives the same total and the same parts as with real ones.

Parts, by where an operation runs: its module in forward; in backward the module that made the
autograd node now running (each torch call's node is tagged as it is made, and at each module's
exit every node it made that is not tagged yet: the activation checkpoints' nodes, which
autograd.Function.apply makes out of a TorchFunctionMode's sight), a checkpoint's re-run forward
as its checkpoint's node:
  trunk (Pairformer)   AF3Model.pairformer
  MSA module           AF3Model.msa_module
  templates            AF3Model.template_embedder
  diffusion transformer  AF3Model.diffusion_module.transformer (the training batch)
  atom attention       the atom encoders (input embedder's, diffusion module's) and decoder
  confidence head      AF3Model.confidence_head (its own Pairformer blocks included)
  diffusion conditioning  the rest of the diffusion module (the training batch): its conditioning
                       (relative positions, the pair and single transitions, the noise embedding)
                       and the token projections around the transformer
  mini-rollout         every operation of the sampler's rollout (AF3Model._sample_positions, no grad)
  losses               everything outside AF3Model's forward (AF3Model.loss and its backward)
  other                the rest of the model: input embedder's token part, relative positions,
                       recycling, distogram head
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys

import harness
import torch
from harness import Table, argument_parser
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import FlopCounterMode

from featurecache.kernels import reference as row_blocks  # evo_attention_rows and its block size
from featurecache.model import AF3Model, preset
from featurecache.model.objectives import losses
from featurecache.testing.synthetic import random_batch

# (module-name prefix, part): the longest prefix of an operation's module name names its part.
PART_OF_MODULE = (
    ("pairformer", "trunk (Pairformer)"),
    ("msa_module", "MSA module"),
    ("template_embedder", "templates"),
    ("diffusion_module.transformer", "diffusion transformer"),
    ("input_embedder.atom_encoder", "atom attention"),
    ("diffusion_module.atom_encoder", "atom attention"),
    ("diffusion_module.atom_decoder", "atom attention"),
    ("confidence_head", "confidence head"),
    ("diffusion_module", "diffusion conditioning"),
    ("", "other"),
)
ROLLOUT, LOSSES = "mini-rollout", "losses"
PARTS = tuple(dict.fromkeys([part for _, part in PART_OF_MODULE if part != "other"] + [ROLLOUT, LOSSES, "other"]))


def af3_part(name: str) -> str:
    """The part of AF3Model's module `name` (PART_OF_MODULE: the first prefix that matches)."""
    return next(
        part for prefix, part in PART_OF_MODULE if name == prefix or name.startswith(prefix + ".") or prefix == ""
    )


@dataclasses.dataclass(frozen=True)
class StepShape:
    """What one counted step processes (the train_step benchmark's --model af3 options)."""

    crop: int
    diffusion_batch: int = 48
    msa_rows: int = 1024
    templates: int = 4
    atoms_per_token: int = 8
    cycles: int = 1

    def label(self, depth: int) -> str:
        # the train_step benchmark's shape for the same step (step_report.model_label), so the
        # headline table pairs the count with that step's time
        return f"full AF3 depth {depth}, diffusion batch {self.diffusion_batch}, crop {self.crop}"


class PartTracker:
    """Which part the operation running now belongs to.

    Forward: the innermost module being called (global module hooks), or the rollout while
    AF3Model._sample_positions runs. Backward: the part recorded for the autograd node now
    running (each node created in forward is tagged by a pre-hook that sets the part before
    the node computes; a checkpoint's re-run forward runs through the module hooks again).
    """

    def __init__(self, model: torch.nn.Module, part_of=None) -> None:
        """`part_of`: a module's qualified name -> its part (default: PART_OF_MODULE's parts)."""
        self.names = {module: name for name, module in model.named_modules()}
        self.part_of = part_of or af3_part
        self.stack: list[str] = []  # qualified names of the modules being called
        self.in_rollout = 0
        self.in_backward = False
        self.backward_part = LOSSES  # until a tagged node runs
        self.tagged: set = set()
        self.handles: list = []

    def part(self) -> str:
        if self.in_rollout:
            return ROLLOUT
        if self.stack:
            return self.part_of(self.stack[-1])
        return self.backward_part if self.in_backward else LOSSES

    def backward(self, loss: torch.Tensor) -> None:
        self.in_backward = True
        try:
            loss.backward()
        finally:
            self.in_backward = False

    @contextlib.contextmanager
    def active(self, model: AF3Model):
        def enter(module, args):
            if module in self.names:
                self.stack.append(self.names[module])

        def leave(module, args, output):
            if module in self.names:
                # nodes made by calls a TorchFunctionMode does not see (autograd.Function.apply:
                # the activation checkpoints) belong to the module they were made in
                self.tag_graph(output, self.part())
                self.stack.pop()

        self.handles = [
            torch.nn.modules.module.register_module_forward_pre_hook(enter),
            torch.nn.modules.module.register_module_forward_hook(leave),
        ]
        sample_positions = model._sample_positions

        def rollout(*args, **kwargs):
            self.in_rollout += 1
            try:
                return sample_positions(*args, **kwargs)
            finally:
                self.in_rollout -= 1

        model._sample_positions = rollout  # an instance attribute: the class is unchanged
        try:
            with _NodeTagger(self):
                yield self
        finally:
            del model._sample_positions
            for handle in self.handles:
                handle.remove()

    def tag(self, output) -> None:
        """Record the current part on the autograd nodes that made `output` (once per node)."""
        part = self.part()
        for tensor in tree_leaves(output):
            node = getattr(tensor, "grad_fn", None) if isinstance(tensor, torch.Tensor) else None
            if node is None or node in self.tagged:
                continue
            self.tagged.add(node)
            node.register_prehook(lambda grads, part=part: self._set_backward_part(part))

    def tag_graph(self, output, part: str) -> None:
        """Tag every untagged node reachable from `output`'s nodes with `part`, stopping at tagged
        ones (made earlier, outside this module, or by a module inside it)."""
        pending = [
            getattr(tensor, "grad_fn", None) for tensor in tree_leaves(output) if isinstance(tensor, torch.Tensor)
        ]
        while pending:
            node = pending.pop()
            if node is None or node in self.tagged:
                continue
            self.tagged.add(node)
            node.register_prehook(lambda grads, part=part: self._set_backward_part(part))
            pending.extend(next_node for next_node, _ in node.next_functions)

    def _set_backward_part(self, part: str) -> None:
        self.backward_part = part


class _NodeTagger(TorchFunctionMode):
    """Tags the autograd node of every torch call's output with the part that called it."""

    def __init__(self, tracker: PartTracker) -> None:
        super().__init__()
        self.tracker = tracker

    def __torch_function__(self, func, types, args=(), kwargs=None):
        output = func(*args, **(kwargs or {}))
        self.tracker.tag(output)
        return output


class PartFlopCounter(FlopCounterMode):
    """FlopCounterMode that also adds every counted operation to its part (PartTracker.part)."""

    def __init__(self, tracker: PartTracker) -> None:
        super().__init__(display=False)
        self.tracker = tracker
        self.by_part: dict[str, int] = {part: 0 for part in PARTS}

    def _count_flops(self, func_packet, out, args, kwargs):
        if func_packet in self.flop_registry:
            flops = self.flop_registry[func_packet](*args, **kwargs, out_val=out)
            self.by_part[self.tracker.part()] += flops
        return super()._count_flops(func_packet, out, args, kwargs)


@contextlib.contextmanager
def model_arithmetic():
    """The CPU path's memory savers off: every attention as evo_attention_reference with
    autograd's backward (the row blocks of kernels/reference.py evo_attention_rows recompute their
    logits in backward, work that is not the model's arithmetic; EvoAttention's Triton backward
    recomputes them too), and the smooth LDDT over dense pairs (listing the included pairs reads
    values, which fake tensors do not have; no matrix product either way)."""
    saved = row_blocks.ROW_BLOCK_ELEMENTS, losses.LISTED_PAIR_DEVICES
    row_blocks.ROW_BLOCK_ELEMENTS, losses.LISTED_PAIR_DEVICES = sys.maxsize, ()
    try:
        yield
    finally:
        row_blocks.ROW_BLOCK_ELEMENTS, losses.LISTED_PAIR_DEVICES = saved


def step_batch(shape: StepShape) -> dict:
    generator = torch.Generator().manual_seed(shape.crop)
    return random_batch(
        [shape.crop], [shape.msa_rows], [shape.templates], generator, num_atoms_per_token=shape.atoms_per_token
    )


def count_step(config, shape: StepShape, fake: bool) -> dict[str, int]:
    """FLOPs of one training step per part (and "total": FlopCounterMode's own total), with fake
    tensors or real ones."""
    return count_batch(config, step_batch(shape), shape.cycles, shape.diffusion_batch, fake)


def count_batch(config, batch: dict, cycles: int, diffusion_batch: int, fake: bool) -> dict[str, int]:
    """count_step's count for a given batch (a synthetic one, or one from a cache's loader)."""
    mode = torch._subclasses.fake_tensor.FakeTensorMode() if fake else contextlib.nullcontext()
    with mode, model_arithmetic():
        if fake:
            batch = {
                name: mode.from_tensor(value) if isinstance(value, torch.Tensor) else value
                for name, value in batch.items()
            }
        torch.manual_seed(0)
        model = AF3Model(config).train()
        tracker = PartTracker(model)
        counter = PartFlopCounter(tracker)
        with tracker.active(model), counter:
            outputs = model(batch, num_cycles=cycles, diffusion_batch=diffusion_batch)
            loss, _ = model.loss(batch, outputs)
            tracker.backward(loss)
    return {**counter.by_part, "total": counter.get_total_flops()}


def count_cycle(config, shape: StepShape) -> int:
    """FLOPs of each recycling cycle past the first: one more trunk forward without gradient
    (recycling, templates, MSA module, Pairformer), as the trunk at 2 cycles minus 1, fake tensors."""

    def trunk_flops(cycles: int) -> int:
        batch = step_batch(shape)  # real tensors, made fake below (the batch's layout reads values)
        mode = torch._subclasses.fake_tensor.FakeTensorMode()
        with mode, model_arithmetic():
            batch = {
                name: mode.from_tensor(value) if isinstance(value, torch.Tensor) else value
                for name, value in batch.items()
            }
            model = AF3Model(config).train()
            counter = FlopCounterMode(display=False)
            with counter, torch.no_grad():
                model.trunk(batch, cycles)
        return counter.get_total_flops()

    return trunk_flops(2) - trunk_flops(1)


def real_data_label(preset_name: str, crop: int, diffusion_batch: int, cycles: int) -> str:
    """The shape of benchmarks/tiny_step.py's rows of this preset and crop (less their ", CUDA
    graphs" or ", eager"): records.py pairs the count with those step times."""
    return f"{preset_name}, crop {crop}, diffusion batch {diffusion_batch}, N_cycle {cycles}"


def count_cache_steps(
    cache: str, crop: int, cycles: int, batches: int, preset_name: str = "af3"
) -> tuple[dict[str, float], str]:
    """FLOPs per part of a preset's step on a cache's batches, as `featurecache train --cuda-graphs`
    pads them (tiny_step.py --preset af3 times that step): each padded shape among the loader's
    first `batches` counted once on fake tensors, the parts averaged over the `batches` (a shape
    weighing as often as it came). Returns the averages and a line naming the shapes."""
    import tempfile

    from featurecache.config import SampleConfig
    from featurecache.training import TrainConfig
    from featurecache.training.distributed import setup_distributed

    with tempfile.TemporaryDirectory() as out:
        train = TrainConfig(
            cache=cache,
            out=out,
            preset=preset_name,
            kernels="torch",
            steps=batches,
            num_workers=0,
            device="cpu",
            static_shapes=True,
            sample=SampleConfig(crop_size=crop),
            model_settings={"max_recycling_cycles": cycles},
        )
        loader = iter(harness.training_loader(train, setup_distributed("cpu")))
        drawn = [next(loader) for _ in range(batches)]
    config = train.model_config("torch")

    # a batch's padded shape: its tensors' names and shapes (fake-tensor counts depend on nothing else)
    shapes = [tuple((k, tuple(v.shape)) for k, v in batch.items() if isinstance(v, torch.Tensor)) for batch in drawn]
    counted: dict[tuple, dict[str, int]] = {}
    for shape, batch in zip(shapes, drawn):
        if shape not in counted:
            counted[shape] = count_batch(config, batch, cycles, config.diffusion.diffusion_batch, fake=True)
    means = {part: sum(counted[shape][part] for shape in shapes) / len(drawn) for part in (*PARTS, "total")}
    atoms = sorted({batch["atom_pad_mask"].shape[1] for batch in drawn})
    return means, f"{len(counted)} padded shapes ({', '.join(map(str, atoms))} atoms) in {len(drawn)} batches"


def check_fake_counting() -> Table:
    """The tiny preset counted with real and with fake tensors: every part must agree exactly."""
    config = preset("tiny", kernels="torch", confidence_rollout_steps=2)
    shape = StepShape(crop=24, diffusion_batch=2, msa_rows=8, templates=1, atoms_per_token=4)
    real, fake = count_step(config, shape, fake=False), count_step(config, shape, fake=True)
    table = Table(["part", "real tensors (MFLOP)", "fake tensors (MFLOP)"])
    for part in (*PARTS, "total"):
        table.add([part, real[part] / 1e6, fake[part] / 1e6])
    if real != fake or sum(real[part] for part in PARTS) != real["total"]:
        print(table.markdown())
        raise SystemExit("flops.py: fake-tensor counting differs from real counting on the tiny preset (table above)")
    return table


def count_cache(args, stamp, check: Table) -> None:
    """--cache: the real-data step per part at each crop; with --record, its rows (labelled as
    tiny_step.py's af3 rows, so the headline shows their TFLOP/s) and a section."""
    counts, shapes = {}, {}
    for crop in args.crop:
        counts[crop], shapes[crop] = count_cache_steps(args.cache, crop, args.cycles, args.batches)
        print(f"crop {crop}: {counts[crop]['total'] / 1e12:.1f} TFLOP ({shapes[crop]})", flush=True)
    table = Table(["part", *(f"crop {crop} (TFLOP)" for crop in args.crop)])
    for part in (*PARTS, "total"):
        table.add([part, *(counts[crop][part] / 1e12 for crop in args.crop)])
    what = (
        f"af3 preset on the batches of {args.cache} as `featurecache train --cuda-graphs` pads them, N_cycle "
        f"{args.cycles}, recomputation as the preset; "
        + "; ".join(f"crop {crop}: {shapes[crop]}" for crop in args.crop)
    )
    print(f"\n{stamp.header()}\n{what}\n\n{table.markdown()}")
    if not args.record:
        return
    from records import Row

    diffusion_batch = preset("af3").diffusion.diffusion_batch
    rows = [
        Row(
            "flops",
            "reference path",
            real_data_label("af3", crop, diffusion_batch, args.cycles),
            "TFLOP total",
            counts[crop]["total"] / 1e12,
        )
        for crop in args.crop
    ]
    record_count(stamp, rows, "FLOPs of the af3 step on real data", "`benchmarks/flops.py --cache`", what, check, table)


def record_count(stamp, rows, heading: str, script: str, what: str, check: Table, table: Table) -> None:
    """Rows and a RESULTS.md section of a count: what was counted, the fake-tensor check, the parts."""
    from records import record

    section = (
        f"### {heading}, {stamp.date}, commit {stamp.commit} ({script})\n\n{what}; counted with "
        f"FlopCounterMode on fake tensors (device: count, device-independent). Check first, the tiny "
        f"preset counted with real and with fake tensors (MFLOP):\n\n{check.markdown()}\n\nThe step "
        f"(TFLOP per training step):\n\n{table.markdown()}"
    )
    record(
        dataclasses.replace(stamp, device="count, device-independent"),
        rows,
        "flops",
        section,
        title="FLOPs of a training step",
    )


def main() -> None:
    parser = argument_parser(__doc__)
    parser.add_argument("--crop", type=int, nargs="+", default=[384, 768])
    parser.add_argument("--depth", type=int, default=48, help="Pairformer blocks (af3: 48)")
    parser.add_argument("--diffusion-batch", type=int, default=48)
    parser.add_argument("--msa-rows", type=int, default=1024)
    parser.add_argument("--templates", type=int, default=4)
    parser.add_argument("--atoms-per-token", type=int, default=8)
    parser.add_argument("--cycles", type=int, default=1, help="N_cycle of the counted step")
    parser.add_argument(
        "--checkpoint-group",
        type=int,
        default=1,
        help="ModelConfig.checkpoint_group (1: a checkpoint per block, the preset's; K > 1: groups of K re-run)",
    )
    parser.add_argument("--check-only", action="store_true", help="only the tiny fake-vs-real check")
    parser.add_argument(
        "--cache",
        help="count the af3 step on this cache's batches as `featurecache train --cuda-graphs` pads them "
        "(the step tiny_step.py --preset af3 times), at each --crop, instead of the synthetic batch",
    )
    parser.add_argument("--batches", type=int, default=8, help="with --cache: loader batches averaged over")
    args = parser.parse_args()
    stamp = harness.run_stamp()
    check = check_fake_counting()
    print(f"fake counting equals real counting on the tiny preset:\n\n{check.markdown()}\n", flush=True)
    if args.check_only:
        return
    if args.cache:
        count_cache(args, stamp, check)
        return
    config = preset("af3", kernels="torch", pairformer_blocks=args.depth, checkpoint_group=args.checkpoint_group)
    shapes = [
        StepShape(crop, args.diffusion_batch, args.msa_rows, args.templates, args.atoms_per_token, args.cycles)
        for crop in args.crop
    ]
    counts, cycles = {}, {}
    for shape in shapes:
        counts[shape] = count_step(config, shape, fake=True)
        cycles[shape] = count_cycle(config, shape)
        print(f"crop {shape.crop}: {counts[shape]['total'] / 1e12:.1f} TFLOP", flush=True)
    table = Table(
        ["part", *(f"crop {shape.crop} (TFLOP)" for shape in shapes), *(f"crop {shape.crop} share" for shape in shapes)]
    )
    for part in (*PARTS, "total"):
        table.add(
            [
                part,
                *(counts[s][part] / 1e12 for s in shapes),
                *(f"{100 * counts[s][part] / counts[s]['total']:.1f} %" for s in shapes),
            ]
        )
    table.add(
        [
            "each further recycling cycle (trunk forward)",
            *(cycles[s] / 1e12 for s in shapes),
            *(f"{100 * cycles[s] / counts[s]['total']:.1f} %" for s in shapes),
        ]
    )
    what = (
        f"af3 preset, depth {args.depth}, diffusion batch {args.diffusion_batch}, {args.msa_rows} MSA rows, "
        f"{args.templates} templates, {args.atoms_per_token} atoms per polymer token, N_cycle {args.cycles}, "
        + (
            "recomputation as the preset (a checkpoint per block)"
            if args.checkpoint_group == 1
            else f"grouped recomputation (checkpoint_group {args.checkpoint_group})"
        )
    )
    print(f"\n{stamp.header()}\n{what}\n\n{table.markdown()}")

    def label(shape: StepShape) -> str:
        grouped = f", checkpoint group {args.checkpoint_group}" if args.checkpoint_group > 1 else ""
        return shape.label(args.depth) + grouped

    if args.record:
        from records import Row

        rows = [
            Row("flops", "reference path", label(shape), f"TFLOP {part}", counts[shape][part] / 1e12)
            for shape in shapes
            for part in (*PARTS, "total")
        ]
        rows += [
            Row("flops", "reference path", label(shape), "TFLOP each further cycle", cycles[shape] / 1e12)
            for shape in shapes
        ]
        record_count(stamp, rows, "FLOPs of a training step", "`benchmarks/flops.py`", what, check, table)


if __name__ == "__main__":
    main()
