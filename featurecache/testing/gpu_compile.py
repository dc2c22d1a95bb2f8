"""Compile every Triton kernel the AF3 model launches for a GPU this machine does not have.

CI has no GPU, and the interpreter runs the kernels' Python, not Triton's compiler: a kernel that
passes every interpreter test can still fail to compile (an unsupported layout, too much shared
memory for the tuned tiles) on the device. Here a stand-in driver tells Triton the current device
is an sm_90 GPU (the H200 the tuned configurations were measured on), every launch compiles the
kernel through Triton's own pipeline down to a cubin (LLVM and the ptxas shipped in the triton
wheel) and returns without launching, and the package's config lookups see the GPU's name. The
model then runs one training step on CPU tensors at the af3 preset's widths: each launch compiles
with the tiles the H200 would use. Outputs are meaningless (nothing is launched); only the
compilation is checked.

    python3 -m featurecache.testing.gpu_compile            # prints one line per compiled kernel
    python3 -m featurecache.testing.gpu_compile --registers --narrow-accesses   # and ptxas -v, scalar accesses

Must run in a process without TRITON_INTERPRET (Triton reads it when a kernel is defined).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import sys
from collections.abc import Iterator

import torch

H200 = "NVIDIA H200"
# Shared memory one block may use, per compute capability (what a launch past it reports on an
# H200: "232,448 available"); the compiler does not check it, the launch does.
SHARED_MEMORY_LIMIT = {80: 166_912, 86: 101_376, 89: 101_376, 90: 232_448, 100: 232_448}


@dataclasses.dataclass
class CompiledKernel:
    name: str
    num_warps: int
    num_stages: int
    shared_bytes: int
    constants: str
    asm: dict = dataclasses.field(repr=False, default_factory=dict)


class _CompileOnlyDriver:
    """The part of a Triton driver that compilation asks for: device 0, a target, a stream."""

    def __init__(self, capability: int) -> None:
        from triton.backends.compiler import GPUTarget

        self.target = GPUTarget("cuda", capability, 32)

    def get_current_device(self) -> int:
        return 0

    def set_current_device(self, device: int) -> None:
        pass

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_current_target(self):
        return self.target

    def get_device_interface(self):
        return torch.cuda

    def get_active_torch_device(self) -> torch.device:
        return torch.device("cpu")

    def is_active(self) -> bool:
        return True

    def map_python_to_cpp_type(self, ty: str) -> str:
        return ty


def _constexpr_summary(kernel) -> str:
    constants = getattr(kernel, "constants", None) or getattr(kernel.src, "constants", {}) or {}
    named = [
        f"{key[-1] if isinstance(key, tuple) else key}={value}"
        for key, value in constants.items()
        if isinstance(value, (int, bool, str))
    ]
    return " ".join(sorted(str(item) for item in named))[:160]


@contextlib.contextmanager
def compile_only(gpu: str = H200, capability: int = 90) -> Iterator[list[CompiledKernel]]:
    """While inside: Triton launches compile for sm_`capability` and return without running, and
    featurecache's kernels pick the tuned configurations of `gpu`. Yields the compiled kernels."""
    if os.environ.get("TRITON_INTERPRET", "").lower() in ("1", "true", "yes", "on", "y"):
        raise RuntimeError("gpu_compile: unset TRITON_INTERPRET (the kernels would be interpreted, not compiled)")
    import triton.runtime.jit as jit
    from triton.runtime import driver

    from featurecache.kernels import runtime
    from featurecache.kernels.window_attention import config as window_config

    compiled: list[CompiledKernel] = []
    launch = jit.JITFunction.run

    def compile_without_launch(self, *args, grid, warmup, **kwargs):
        kernel = launch(self, *args, grid=grid, warmup=True, **kwargs)
        if kernel is not None and "cubin" not in kernel.asm:
            raise RuntimeError(f"{self.__name__}: Triton produced no cubin")
        if kernel is not None and kernel.metadata.shared > SHARED_MEMORY_LIMIT.get(capability, 1 << 30):
            raise RuntimeError(
                f"{self.__name__}: {kernel.metadata.shared} B of shared memory, more than the "
                f"{SHARED_MEMORY_LIMIT[capability]} B sm_{capability} allows (num_warps "
                f"{kernel.metadata.num_warps}, num_stages {kernel.metadata.num_stages}, "
                f"{_constexpr_summary(kernel)})"
            )
        if kernel is not None:
            compiled.append(
                CompiledKernel(
                    self.__name__,
                    kernel.metadata.num_warps,
                    kernel.metadata.num_stages,
                    kernel.metadata.shared,
                    _constexpr_summary(kernel),
                    {"ptx": kernel.asm.get("ptx", "")},
                )
            )
        return kernel

    patches = [
        (runtime, "gpu_name", lambda device=None: gpu),
        (runtime, "gpu_architecture", lambda device=None: f"sm_{capability}"),
        (runtime, "runs_triton", lambda device: True),
        (window_config, "_multiprocessors", lambda index: 132),
        (torch.cuda, "current_device", lambda: 0),
    ]
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    active = driver._active  # (reset_active would look for a real driver, which may not exist)
    driver.set_active(_CompileOnlyDriver(capability))
    jit.JITFunction.run = compile_without_launch
    for owner, name, value in patches:
        setattr(owner, name, value)
    try:
        yield compiled
    finally:
        jit.JITFunction.run = launch
        for owner, name, value in saved:
            setattr(owner, name, value)
        driver._active = active


def af3_training_step(tokens: int, diffusion_batch: int) -> None:
    """One forward and backward of the af3 preset (its widths, one block per stack) in bf16."""
    from featurecache.model import AF3Model, preset
    from featurecache.testing.synthetic import random_batch

    config = preset("af3", kernels="triton", pairformer_blocks=1, msa_blocks=1, template_blocks=1)
    model = AF3Model(config).train()
    batch = random_batch([tokens], [16], [1], torch.Generator().manual_seed(0), num_atoms_per_token=8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        outputs = model(batch, num_cycles=1, diffusion_batch=diffusion_batch)
    loss = model.loss(batch, outputs)[0]
    loss.backward()


def evo_attention_variants(lengths: tuple[int, ...]) -> None:
    """EvoAttention forward and backward with what the model's small step does not launch: an
    fp32 bias, the deterministic (split) backward beside the default, each length's tile class,
    and the 64-bit offsets of crops past ~2,000 tokens."""
    from featurecache.kernels.evo_attention import evo_attention, launch

    cases = [
        (length, bias_dtype, deterministic, False)
        for length in lengths
        for bias_dtype in (torch.bfloat16, torch.float32)
        for deterministic in (False, True)
    ]
    cases.append((lengths[0], torch.bfloat16, False, True))
    for length, bias_dtype, deterministic, wide in cases:
        q, k, v = (torch.randn(1, 2, length, 4, 32, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        bias = torch.randn(1, 1, 4, length, length, dtype=bias_dtype, requires_grad=True)
        mask = torch.ones(1, 2, length, dtype=torch.bool)
        previous = torch.are_deterministic_algorithms_enabled(), launch.INDEX_LIMIT
        torch.use_deterministic_algorithms(deterministic)
        launch.INDEX_LIMIT = 64 if wide else previous[1]
        try:
            evo_attention(q, k, v, bias, mask).float().sum().backward()
        finally:
            torch.use_deterministic_algorithms(previous[0])
            launch.INDEX_LIMIT = previous[1]


def ptxas_usage(kernel_asm: dict, capability: int) -> str:
    """Registers and spill bytes per thread from the ptxas shipped with triton (`ptxas -v`)."""
    import re
    import subprocess
    import tempfile

    from triton.backends.nvidia import compiler

    try:  # the ptxas that compiled the kernel (triton >= 3.7 picks one per architecture)
        ptxas = compiler.get_ptxas(capability).path
    except TypeError:
        ptxas = compiler.get_ptxas().path
    suffix = "a" if capability >= 90 else ""
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as source:
        source.write(kernel_asm["ptx"])
        source.flush()
        result = subprocess.run(
            [ptxas, f"-arch=sm_{capability}{suffix}", "-v", source.name, "-o", os.devnull],
            capture_output=True,
            text=True,
            check=False,
        )
    registers = re.search(r"Used (\d+) registers", result.stderr)
    spills = re.search(r"(\d+) bytes spill stores", result.stderr)
    return f"{registers.group(1) if registers else '?':>3s} registers, {spills.group(1) if spills else '?'} B spilled"


def narrow_global_accesses(ptx: str) -> dict[str, int]:
    """A kernel's global loads and stores of one 1- or 2-byte element (`ld.global.b16`,
    `st.global.b8`, ...) by kind, counted in its PTX. Triton emits them where it cannot prove a run
    of elements contiguous and equally masked (a mask or stride not a multiple of 16): bf16 data
    moved that way takes 8 instructions per 16 bytes."""
    import re

    counts: dict[str, int] = {}
    for access in re.finditer(r"\b(ld|st)\.global(?:\.[a-z_]+)*\.([bsu](?:8|16))\b", ptx):
        kind = f"{access.group(1)}.{access.group(2)}"
        counts[kind] = counts.get(kind, 0) + 1
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpu", default=H200, help="GPU name whose tuned configurations the kernels take")
    parser.add_argument("--capability", type=int, default=90, help="compute capability to compile for (90: sm_90)")
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--diffusion-batch", type=int, default=2)
    parser.add_argument("--registers", action="store_true", help="also run ptxas -v: registers and spills per kernel")
    parser.add_argument(
        "--narrow-accesses",
        action="store_true",
        help="also count each kernel's 1- and 2-byte global loads and stores (unvectorized accesses)",
    )
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    with compile_only(args.gpu, args.capability) as compiled:
        af3_training_step(args.tokens, args.diffusion_batch)
        evo_attention_variants((args.tokens, 768))
    distinct: dict = {}
    for kernel in compiled:  # a launch that hit Triton's cache is listed once
        distinct.setdefault((kernel.name, kernel.num_warps, kernel.num_stages, kernel.constants), kernel)
    for kernel in sorted(distinct.values(), key=lambda k: k.name):
        usage = f"  {ptxas_usage(kernel.asm, args.capability)}" if args.registers else ""
        if args.narrow_accesses:
            narrow = narrow_global_accesses(kernel.asm["ptx"])
            usage += "  narrow " + (" ".join(f"{kind} x{n}" for kind, n in sorted(narrow.items())) or "none")
            usage += f"  ({kernel.constants})"
        print(
            f"{kernel.name:36s} warps {kernel.num_warps} stages {kernel.num_stages} "
            f"shared {kernel.shared_bytes:6d} B{usage}"
        )
    print(
        f"{len(distinct)} distinct kernels compiled for sm_{args.capability} with {args.gpu}'s configurations "
        f"({len(compiled)} launches)"
    )
    return 0 if compiled else 1


if __name__ == "__main__":
    sys.exit(main())
