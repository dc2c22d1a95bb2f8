"""What ModelConfig.runtime.checkpoint_group > 1 adds inside the stacks, counted: the diffusion
transformer keeps one block input per group, and a re-run pair block keeps only the inputs of
its two triangle attentions; both give the same outputs and gradients as before."""

import math

import pytest
import torch

from featurecache.model.memory_report import SavedTensorCounter
from featurecache.model.pairformer import PairformerBlock
from featurecache.model.transformer import ConditionedTransformer, TokenLayout
from featurecache.testing.compare import rel_error, summation_tolerance

BATCH, SAMPLES, LENGTH, C_A, C_S, C_Z = 1, 3, 7, 16, 8, 4
# The longest sums behind a gradient: the pair bias's weights add up every pair entry of every sample.
LONGEST_SUM = BATCH * SAMPLES * LENGTH * LENGTH


def _transformer_run(group: int, blocks: int, count: bool = False):
    torch.manual_seed(0)
    model = ConditionedTransformer(C_A, C_S, C_Z, blocks, 2, "torch", checkpoint_group=group).train()
    for parameter in model.parameters():  # the output gates start at zero weights: wake them up
        parameter.data.normal_(0, 0.3)
    generator = torch.Generator().manual_seed(1)
    a = torch.randn(BATCH, SAMPLES, LENGTH, C_A, generator=generator, requires_grad=True)
    s = torch.randn(BATCH, SAMPLES, LENGTH, C_S, generator=generator, requires_grad=True)
    pair = torch.randn(BATCH, LENGTH, LENGTH, C_Z, generator=generator, requires_grad=True)
    token_mask = torch.ones(BATCH, LENGTH, dtype=torch.bool)
    token_mask[:, -2:] = False
    counter = SavedTensorCounter({"": "transformer"})
    with counter.watching(model):
        out = model(a, s, pair, TokenLayout(token_mask))
    if count:
        return counter.total_bytes(), a.nbytes, s.nbytes + pair.nbytes
    (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
    gradients = {name: p.grad for name, p in model.named_parameters() if p.requires_grad}
    return out.detach(), {**gradients, "a": a.grad, "s": s.grad, "pair": pair.grad}


@pytest.mark.parametrize("blocks, group", [(24, 7), (5, 2), (4, 4)])
def test_diffusion_transformer_keeps_one_input_per_group(blocks, group):
    saved, a_bytes, shared = _transformer_run(1, blocks, count=True)
    assert saved == blocks * a_bytes + shared  # s and the pair are one storage each for every block
    grouped, _, _ = _transformer_run(group, blocks, count=True)
    assert grouped == math.ceil(blocks / group) * a_bytes + shared


@pytest.mark.parametrize("group", [2, 3])
def test_grouped_diffusion_transformer_gives_the_same_outputs_and_gradients(group):
    # 5 blocks: groups of 2 (2, 2, 1: a last group of one block) and of 3 (3, 2)
    out, gradients = _transformer_run(1, 5)
    grouped_out, grouped_gradients = _transformer_run(group, 5)
    torch.testing.assert_close(grouped_out, out, rtol=0, atol=0)
    assert gradients["s"].abs().sum() > 0 and gradients["pair"].abs().sum() > 0
    for name, gradient in gradients.items():  # backward adds a few gradients in another order
        assert rel_error(grouped_gradients[name], gradient) <= summation_tolerance(torch.float32, LONGEST_SUM), name


def _pair_block_run(recompute: bool, count: bool = False):
    torch.manual_seed(0)
    block = PairformerBlock(C_S, C_A, 2, 4, 2, 4, 2, kernels="torch", dropout=0.25, recompute_attention=recompute)
    block.train()
    generator = torch.Generator().manual_seed(2)
    s = torch.randn(BATCH, LENGTH, C_S, generator=generator, requires_grad=True)
    z = torch.randn(BATCH, LENGTH, LENGTH, C_A, generator=generator, requires_grad=True)
    token_mask = torch.ones(BATCH, LENGTH, dtype=torch.bool)
    token_mask[:, -1] = False
    pair_mask = token_mask[:, :, None] & token_mask[:, None, :]
    seed = torch.tensor(123457, dtype=torch.int64)  # this block's dropout seed (layers.derived_seeds)
    parts = {"": "block", "pair.tri_att_start": "attention", "pair.tri_att_end": "attention"}
    counter = SavedTensorCounter(parts)
    with counter.watching(block):
        s_out, z_out = block(s, z, token_mask, pair_mask, seed)
    if count:
        return counter.bytes_by_part(), z.nbytes
    (s_out.sum() + (z_out * torch.linspace(-1, 1, z_out.numel()).view_as(z_out)).sum()).backward()
    gradients = {name: p.grad for name, p in block.named_parameters() if p.requires_grad}
    return z_out.detach(), {**gradients, "s": s.grad, "z": z.grad}


def test_a_re_run_pair_block_keeps_only_its_attentions_inputs():
    per_part, z_bytes = _pair_block_run(False, count=True)
    recomputed, _ = _pair_block_run(True, count=True)
    assert per_part["attention"] > 0 and "attention" not in recomputed
    # the attentions' own inputs (z in autocast's dtype, here fp32: one pair each) and the bool
    # pair mask were among what they saved; their checkpoints keep exactly those
    assert recomputed["block"] == per_part["block"] + 2 * z_bytes + LENGTH * LENGTH
    assert sum(recomputed.values()) == sum(per_part.values()) - per_part["attention"] + 2 * z_bytes + LENGTH * LENGTH


def test_recomputed_attention_gives_the_same_outputs_and_gradients():
    out, gradients = _pair_block_run(False)
    recomputed_out, recomputed_gradients = _pair_block_run(True)
    torch.testing.assert_close(recomputed_out, out, rtol=0, atol=0)
    for name, gradient in gradients.items():
        assert rel_error(recomputed_gradients[name], gradient) <= summation_tolerance(torch.float32, LONGEST_SUM), name
