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


# The triangle projection's output (516 columns in rows of 528) and its gradient, through the
# LayerNorm-linear forward and dx kernels compiled for sm_90: each must move whole 16-byte
# vectors. Masked by its width (516, not a multiple of 16), the forward stored 2 bytes at a time.
_WIDE_PROJECTION = """
import json, torch
from featurecache.kernels.layernorm_linear import layernorm_linear_bwd, layernorm_linear_fwd
from featurecache.testing.gpu_compile import compile_only, narrow_global_accesses
x, weight = torch.randn(2048, 128, dtype=torch.bfloat16), torch.randn(516, 128, dtype=torch.bfloat16)
norm_w, norm_b = torch.ones(128), torch.zeros(128)
with compile_only() as compiled:
    y, mean, rstd = layernorm_linear_fwd(x, norm_w, norm_b, weight, None, 1e-5, aligned_rows=True)
    layernorm_linear_bwd(y, x, norm_w, norm_b, weight, mean, rstd, False)
print(json.dumps({kernel.name: narrow_global_accesses(kernel.asm["ptx"]) for kernel in compiled}))
"""


@pytest.mark.slow
def test_wide_projection_kernels_move_16_byte_vectors():
    import json

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run(
        [sys.executable, "-c", _WIDE_PROJECTION], env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    narrow = json.loads(result.stdout.splitlines()[-1])
    assert set(narrow) >= {"_layernorm_linear_fwd_kernel", "_layernorm_linear_bwd_dx_kernel"}, narrow
    assert all(not counts for counts in narrow.values()), narrow


def test_narrow_accesses_are_counted_by_kind():
    from featurecache.testing.gpu_compile import narrow_global_accesses

    ptx = """
    @%p1 ld.global.b16 { %rs1 }, [ %rd1 + 0 ];
    ld.global.v4.b32 { %r1, %r2, %r3, %r4 }, [ %rd2 + 0 ];
    @%p2 st.global.b16 [ %rd3 + 0 ], { %rs2 };
    @%p2 st.global.b16 [ %rd3 + 2 ], { %rs3 };
    ld.global.nc.u8 %rs4, [ %rd4 ];
    st.global.v4.b32 [ %rd5 + 0 ], { %r5, %r6, %r7, %r8 };
    """
    assert narrow_global_accesses(ptx) == {"ld.b16": 1, "st.b16": 2, "ld.u8": 1}
