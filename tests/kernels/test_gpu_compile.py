"""Every Triton kernel the AF3 model launches compiles for the H200 (sm_90) with its tuned tiles.

CI has no GPU and the interpreter never runs Triton's compiler, so a kernel that passes every
interpreter test could still fail on the device (an unsupported construct, tiles past the shared
memory a block may use). featurecache.testing.gpu_compile compiles each launch of one af3
training step (and EvoAttention's fp32-bias, deterministic and 64-bit variants) down to a cubin
with the ptxas in the triton wheel, in a process without TRITON_INTERPRET.
"""

import os
import subprocess
import sys

import pytest

pytest.importorskip("triton.backends.nvidia.compiler", reason="this triton has no NVIDIA backend")

# Kernels the step must reach: one per op family, and both EvoAttention backward modes.
EXPECTED = (
    "_evo_attention_fwd_kernel",
    "_evo_attention_bwd_fused_kernel",
    "_evo_attention_bwd_q_kernel",
    "_evo_attention_bwd_kv_kernel",
    "_evo_attention_bwd_bias_kernel",
    "_triangle_proj_kernel",
    "_triangle_bwd_proj_kernel",
    "_transition_fwd_kernel",
    "_transition_bwd_dx_kernel",
    "_layernorm_linear_fwd_kernel",
    "_window_fwd_kernel",
    "_window_bwd_split_kernel",
    "_conditioned_transition_fwd_kernel",
    "_adaln_fwd_kernel",
    "_gate_fwd_kernel",
    "_smooth_lddt_kernel",
)


@pytest.mark.slow
def test_every_model_kernel_compiles_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run(
        [sys.executable, "-m", "featurecache.testing.gpu_compile"],
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    compiled = {line.split()[0] for line in result.stdout.splitlines() if line.startswith("_")}
    missing = [name for name in EXPECTED if name not in compiled]
    assert not missing, f"not compiled: {missing}\n{result.stdout[-2000:]}"


def test_compile_only_refuses_the_interpreter(monkeypatch):
    from featurecache.testing import gpu_compile

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        with gpu_compile.compile_only():
            pass
