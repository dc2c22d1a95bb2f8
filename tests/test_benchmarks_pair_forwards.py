"""benchmarks/pair_forwards.py under the interpreter: every tile candidate of the LayerNorm-linear
and Transition forwards and of their dx kernels it times gives the fp32 reference's
output (and gradients) within bf16's tolerance, on a ragged row count (what its GPU table's error
column would flag as nan)."""

from __future__ import annotations

import math
import pathlib
import sys

import pytest
import torch

BENCHMARKS = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def pair_forwards():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import pair_forwards
    finally:
        sys.path.remove(str(BENCHMARKS))
    return pair_forwards


def test_every_candidate_matches_the_reference(pair_forwards, one_thread):
    from harness import Table

    torch.manual_seed(0)
    table = Table(["case", "provider or tiles", "error", "ms"])
    pair_forwards.run_layernorm_linear(37, torch.device("cpu"), table)
    pair_forwards.run_layernorm_linear_backward(37, torch.device("cpu"), table)
    pair_forwards.run_transition(37, torch.device("cpu"), table, msa_depth=2)
    pair_forwards.run_transition_backward(37, torch.device("cpu"), table)
    pair_forwards.run_column_sums(37, torch.device("cpu"), table)
    timed = [row for row in table.rows if not row[1].startswith("configured")]
    candidates = (
        len(pair_forwards.LAYERNORM_LINEAR_CANDIDATES) * 3
        + len(pair_forwards.LAYERNORM_LINEAR_DX_CANDIDATES)
        + len(pair_forwards.TRANSITION_CANDIDATES) * 3
        + len(pair_forwards.TRANSITION_DX_CANDIDATES)
    )
    column_sum_variants = 3 * len(pair_forwards.column_sum_cases(37))
    assert len(timed) == candidates + 8 + column_sum_variants  # and PyTorch eager once per case
    for case, provider, error, _ in timed:
        assert error not in ("nan", "–"), f"{case}, {provider}: error {error} over bf16's tolerance or failed"


def test_the_tolerance_flags_a_wrong_output(pair_forwards):
    reference = torch.randn(64, 16)
    assert pair_forwards._close(reference.bfloat16(), reference, 128) < 2**-7  # bf16 rounding passes
    assert math.isnan(pair_forwards._close(reference.bfloat16() * 1.05, reference, 147_456))  # at any length
    assert math.isnan(pair_forwards._close(reference.bfloat16() * 1.05, reference, 128))  # 5 % off does not
