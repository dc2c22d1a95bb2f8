"""A checkpoint's re-run takes the CPU path's row-block attention outputs from its first run
(kernels.reference.kept_for_recompute): each attention's forward is computed once per step,
with checkpoints per block and in groups, and the loss and every gradient stay those of the
model run without checkpoints."""

import pytest
import torch

from featurecache.kernels import reference
from featurecache.model import preset
from featurecache.model.af3 import AF3Model
from featurecache.testing.compare import rel_error, summation_tolerance
from featurecache.testing.synthetic import random_batch
from tests.model._training_step import LONGEST_SUM, loss_and_gradients


def _step(monkeypatch, state: dict | None, **settings) -> tuple[torch.Tensor, dict, dict, int]:
    """Loss, gradients, weights, and how many row-block forwards one training step computed."""
    # every attention of these small shapes through the row-block path, a few rows a block
    monkeypatch.setattr(reference, "ROW_BLOCK_ELEMENTS", 64)
    computed = []
    forward = reference._row_block_forward

    def counted(*args):
        computed.append(1)
        return forward(*args)

    monkeypatch.setattr(reference, "_row_block_forward", counted)
    loss, gradients, weights = loss_and_gradients(state, 1, pairformer_blocks=3, **settings)
    return loss, gradients, weights, len(computed)


@pytest.mark.parametrize("group", [1, 2])
def test_checkpoint_reruns_reuse_the_attention_outputs_and_change_no_gradient(monkeypatch, group):
    loss, gradients, state, plain_forwards = _step(monkeypatch, None, checkpoint_blocks=False)
    kept_loss, kept_gradients, _, forwards = _step(monkeypatch, state, checkpoint_blocks=True, checkpoint_group=group)
    # triangle attention in 3 Pairformer blocks, the MSA and confidence stacks; the diffusion transformer
    assert plain_forwards >= 2 * 3 + 2 + 2
    assert forwards == plain_forwards  # without the kept outputs, every checkpointed attention twice
    tolerance = summation_tolerance(torch.float32, LONGEST_SUM, worst_case=True)
    assert rel_error(kept_loss, loss) <= tolerance
    assert kept_gradients.keys() == gradients.keys()
    for name, gradient in gradients.items():
        assert rel_error(kept_gradients[name], gradient) <= tolerance, name


def test_a_rerun_with_more_attention_calls_than_its_first_run_is_an_error():
    q = torch.randn(1, 4, 6, 2, 4)
    kept: list = []
    with torch.no_grad(), reference.kept_for_recompute(kept, replay=False):
        reference.evo_attention_rows(q, q, q, block_elements=8)
    assert len(kept) == 1
    with reference.kept_for_recompute(kept, replay=True):
        reference.evo_attention_rows(q, q, q, block_elements=8)
        with pytest.raises(RuntimeError, match="more attention calls"):
            reference.evo_attention_rows(q, q, q, block_elements=8)


def test_the_recomputed_confidence_head_runs_its_pairformer_once_a_pass():
    """With grouped checkpoints the head runs under one checkpoint: its first forward and its
    re-run each run the head's Pairformer once (it once ran it per output, four times)."""
    torch.manual_seed(0)
    model = AF3Model(preset("tiny", kernels="torch", checkpoint_group=2)).train()
    calls = []
    model.confidence_head.pairformer.register_forward_hook(lambda *args: calls.append(torch.is_grad_enabled()))
    batch = random_batch([9], [3], [0], torch.Generator().manual_seed(1), num_atoms_per_token=2)
    outputs = model(batch, num_cycles=1, diffusion_batch=2, generator=torch.Generator().manual_seed(2))
    assert calls == [False]
    model.loss(batch, outputs)[0].backward()
    assert calls == [False, True]
