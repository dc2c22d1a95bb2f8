"""AF3's dropout (Algorithms 8 and 17): masks shared along the right axis, 1 / (1 - p) scaling, off
in eval mode, and masks that are functions of a seed tensor, so activation checkpointing changes
nothing and padding tokens leave the real tokens' masks alone."""

import pytest
import torch

from featurecache.model import preset
from featurecache.model.af3 import AF3Model
from featurecache.model.network.layers import derived_seeds, dropout_seed, shared_dropout
from featurecache.model.network.pairformer import COLUMNWISE, ROWWISE, Pairformer
from featurecache.testing.compare import rel_error, summation_tolerance
from featurecache.testing.synthetic import random_batch


def _generator(seed: int | None = None) -> torch.Generator:
    return torch.Generator().manual_seed(int(torch.randint(0, 2**31 - 1, ())) if seed is None else seed)


def _seed(generator: torch.Generator) -> torch.Tensor:
    return derived_seeds(dropout_seed(generator, torch.device("cpu")), 1)[0]


def test_rowwise_masks_are_shared_by_every_row_and_columnwise_by_every_column():
    seed = _seed(_generator())
    ones = torch.ones(2, 7, 9, 16)
    rowwise = shared_dropout(ones, 0.25, seed, 0, ROWWISE)  # z[b, i, j, c]: one mask for every i
    assert torch.equal(rowwise, rowwise[:, :1].expand_as(rowwise))
    assert not torch.equal(rowwise[:, :, :1].expand_as(rowwise), rowwise)  # it varies along j
    assert not torch.equal(rowwise[0], rowwise[1])  # and between samples
    columnwise = shared_dropout(ones, 0.25, seed, 3, COLUMNWISE)  # one mask for every j
    assert torch.equal(columnwise, columnwise[:, :, :1].expand_as(columnwise))
    assert not torch.equal(columnwise[:, :1].expand_as(columnwise), columnwise)
    # another site of the same block, or another seed, draws another mask
    assert not torch.equal(shared_dropout(ones, 0.25, seed, 1, ROWWISE), rowwise)
    assert not torch.equal(shared_dropout(ones, 0.25, _seed(_generator()), 0, ROWWISE), rowwise)


@pytest.mark.parametrize("rate", [0.15, 0.25, 0.5])
def test_kept_values_are_scaled_by_one_over_one_minus_the_rate(rate):
    seed = _seed(_generator())
    update = torch.randn(1, 1, 300, 128)
    dropped = shared_dropout(update, rate, seed, 2, ROWWISE)
    kept = dropped != 0
    torch.testing.assert_close(dropped[kept], update[kept] / (1 - rate))
    # 38,400 independent draws: the kept fraction is within 5 standard deviations of 1 - rate
    fraction = kept.float().mean().item()
    assert abs(fraction - (1 - rate)) < 5 * (rate * (1 - rate) / kept.numel()) ** 0.5
    # so the expected update is the update itself
    ones = shared_dropout(torch.ones(1, 1, 300, 128), rate, seed, 2, ROWWISE)
    assert ones.mean().item() == pytest.approx(1.0, abs=5 * (rate / (1 - rate) / ones.numel()) ** 0.5)


def test_padding_tokens_leave_the_masks_of_the_real_tokens_unchanged():
    seed = _seed(_generator())
    real = shared_dropout(torch.ones(1, 11, 11, 8), 0.25, seed, 0, ROWWISE)
    padded = shared_dropout(torch.ones(1, 16, 16, 8), 0.25, seed, 0, ROWWISE)
    assert torch.equal(padded[:, :11, :11], real)
    real = shared_dropout(torch.ones(1, 11, 11, 8), 0.25, seed, 3, COLUMNWISE)
    padded = shared_dropout(torch.ones(1, 16, 16, 8), 0.25, seed, 3, COLUMNWISE)
    assert torch.equal(padded[:, :11, :11], real)


def test_rate_zero_or_no_seed_leaves_the_update_alone():
    update = torch.randn(1, 4, 4, 8)
    assert shared_dropout(update, 0.0, _seed(_generator()), 0, ROWWISE) is update
    assert shared_dropout(update, 0.25, None, 0, ROWWISE) is update


def _pairformer(dropout: float) -> Pairformer:
    torch.manual_seed(0)
    return Pairformer(2, 16, 8, 2, 8, 2, 4, 2, checkpoint_blocks=False, kernels="torch", dropout=dropout)


def test_the_pairformer_drops_only_while_training():
    generator = _generator()
    s, z = torch.randn(1, 6, 16, generator=generator), torch.randn(1, 6, 6, 8, generator=generator)
    token_mask = torch.ones(1, 6, dtype=torch.bool)
    pair_mask = token_mask[:, :, None] & token_mask[:, None, :]
    plain, dropping = _pairformer(0.0), _pairformer(0.25)
    for model in (plain, dropping):
        model.eval()
    reference = plain(s, z, token_mask, pair_mask)
    evaluated = dropping(s, z, token_mask, pair_mask, generator)
    for mine, ref in zip(evaluated, reference):
        assert torch.equal(mine, ref)
    trained = dropping.train()(s, z, token_mask, pair_mask, generator)
    assert not torch.equal(trained[1], reference[1])
    # the same generator state draws the same masks
    state = generator.get_state()
    first = dropping(s, z, token_mask, pair_mask, generator)
    generator.set_state(state)
    second = dropping(s, z, token_mask, pair_mask, generator)
    assert all(torch.equal(a, b) for a, b in zip(first, second))


TOKENS, TEMPLATES, CYCLES, SAMPLES = 10, 2, 2, 2


def _loss_and_gradients(checkpoint_blocks: bool, seed: int) -> tuple[torch.Tensor, dict]:
    torch.manual_seed(0)
    config = preset("tiny", kernels="torch", checkpoint_blocks=checkpoint_blocks, confidence_head=False, msa_blocks=2)
    model = AF3Model(config).train()
    batch = random_batch([TOKENS], [5], [TEMPLATES], _generator(1), num_atoms_per_token=2)
    generator = _generator(seed)
    loss, _ = model.loss(batch, model(batch, num_cycles=CYCLES, diffusion_batch=SAMPLES, generator=generator))
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def test_checkpointed_blocks_give_the_same_loss_and_gradients_with_dropout():
    seed = int(torch.randint(0, 2**31 - 1, ()))
    loss, grads = _loss_and_gradients(True, seed)
    plain_loss, plain_grads = _loss_and_gradients(False, seed)
    assert torch.equal(loss, plain_loss)  # the recomputed blocks drew the forward's masks
    assert grads.keys() == plain_grads.keys()
    # Gradients agree to float rounding: the recomputation accumulates the weight gradients in
    # another order (the same as without dropout), where one mask drawn afresh would change every
    # gradient of the trunk by its whole size. The longest sums run over every pair entry of every
    # cycle, template and sample, chained through the whole model's backward (worst_case).
    tolerance = summation_tolerance(torch.float32, CYCLES * TEMPLATES * SAMPLES * TOKENS * TOKENS, worst_case=True)
    for name, grad in grads.items():
        assert rel_error(grad, plain_grads[name]) <= tolerance, name
    # and the dropout is on: another step's seed gives another loss
    assert not torch.equal(_loss_and_gradients(True, seed + 1)[0], loss)
