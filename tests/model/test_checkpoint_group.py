"""ModelConfig.runtime.checkpoint_group: grouped activation checkpoints of the Pairformer keep fewer
inputs for backward and change nothing else (same loss, same gradients, dropout included)."""

import math

import pytest
import torch

from featurecache.model import preset
from featurecache.model.af3 import AF3Model
from featurecache.testing.memory_report import (
    AF3_PARTS,
    SavedTensorCounter,
    growth_orders,
)
from featurecache.model.network.pairformer import Pairformer
from featurecache.testing.compare import rel_error, summation_tolerance
from featurecache.testing.synthetic import random_batch
from tests.model._training_step import LONGEST_SUM, loss_and_gradients


@pytest.mark.parametrize("group", [2, 3])
def test_grouped_checkpoints_give_the_same_loss_and_gradients(group):
    # 5 blocks: groups of 2 (2, 2, 1) and of 3 (3, 2), an uneven last group; dropout is on (tiny: 0.25)
    loss, gradients, state = loss_and_gradients(None, 2, pairformer_blocks=5, checkpoint_group=1)
    grouped_loss, grouped_gradients, _ = loss_and_gradients(state, 2, pairformer_blocks=5, checkpoint_group=group)
    assert preset("tiny").trunk.pair_dropout > 0
    tolerance = summation_tolerance(torch.float32, LONGEST_SUM, worst_case=True)
    assert rel_error(grouped_loss, loss) <= tolerance
    assert grouped_gradients.keys() == gradients.keys()
    pairformer = [name for name in gradients if name.startswith("pairformer.")]
    assert pairformer and all(gradients[name].abs().sum() > 0 for name in pairformer)
    # the same operations; only the order in which backward sums a few gradients differs (the
    # re-run confidence head's pLDDT and PDE branches): fp32 rounding of those sums
    for name, gradient in gradients.items():
        assert rel_error(grouped_gradients[name], gradient) <= tolerance, name


def _pairformer_saved_bytes(group: int, blocks: int, length: int = 12) -> tuple[int, int, int]:
    """Bytes a Pairformer stack saves in forward; the bytes of one (s, z) state and of the masks."""
    torch.manual_seed(0)
    stack = Pairformer(
        blocks, 16, 8, 2, 4, 2, 4, 2, checkpoint_blocks=True, kernels="torch", checkpoint_group=group
    ).train()
    s = torch.randn(1, length, 16, requires_grad=True)
    z = torch.randn(1, length, length, 8, requires_grad=True)
    token_mask = torch.ones(1, length, dtype=torch.bool)
    pair_mask = token_mask[:, :, None] & token_mask[:, None, :]
    counter = SavedTensorCounter({"": "stack"})
    with counter.watching(stack):
        stack(s, z, token_mask, pair_mask)
    state_bytes = s.nbytes + z.nbytes
    return counter.total_bytes(), state_bytes, token_mask.nbytes + pair_mask.nbytes


@pytest.mark.parametrize("blocks, group", [(12, 4), (48, 7), (48, 8), (5, 2)])
def test_grouped_checkpoints_keep_one_input_per_group(blocks, group):
    """Per block: every block's (s, z) input and the masks; grouped: one input per group (the
    groups read the masks as they are, held by the caller anyway)."""
    saved, state_bytes, mask_bytes = _pairformer_saved_bytes(1, blocks, length=8)
    assert saved == blocks * state_bytes + mask_bytes
    grouped, _, _ = _pairformer_saved_bytes(group, blocks, length=8)
    # a last group of one block is that block's own checkpoint, which also saves the masks
    assert grouped == math.ceil(blocks / group) * state_bytes + (mask_bytes if blocks % group == 1 else 0)


def test_the_full_model_keeps_fewer_pair_sized_tensors():
    """AF3Model's Pairformer keeps ceil(N / K) pair-sized inputs instead of N; the template
    embedder and the diffusion pair conditioning, re-run in backward, keep only their inputs
    (each template's from the stack's input, the conditioning's from the trunk's pair, which
    are held anyway); every other part keeps what it kept."""
    blocks, group, length = 6, 3, 10
    parts = {}
    for value in (1, group):
        torch.manual_seed(0)
        model = AF3Model(preset("tiny", kernels="torch", pairformer_blocks=blocks, checkpoint_group=value)).train()
        batch = random_batch([length], [4], [2], torch.Generator().manual_seed(1), num_atoms_per_token=2)
        counter = SavedTensorCounter(AF3_PARTS)
        with counter.watching(model):
            outputs = model(batch, num_cycles=1, diffusion_batch=2, generator=torch.Generator().manual_seed(2))
            model.loss(batch, outputs)
        pair = length * length * preset("tiny").trunk.c_z * 4  # fp32 without autocast
        parts[value] = {
            "Pairformer pairs": sum(1 for part, size, _, _ in counter.saved if part == "Pairformer" and size >= pair)
        }
        for part, size, _, _ in counter.saved:
            parts[value][part] = parts[value].get(part, 0) + size
    per_block, grouped = parts[1], parts[group]
    assert (per_block["Pairformer pairs"], grouped["Pairformer pairs"]) == (blocks, math.ceil(blocks / group))
    # what is left: the few non-pair tensors (the trunk pair itself is saved by the Pairformer's
    # first group, the template stack's input z_in by its first template)
    recomputed = ("templates", "diffusion: conditioning", "confidence head", "losses")
    assert grouped.get("templates", 0) < per_block["templates"] / 4
    assert grouped.get("diffusion: conditioning", 0) < per_block["diffusion: conditioning"] / 2
    assert grouped.get("confidence head", 0) < per_block["confidence head"] / 100
    assert grouped["losses"] < per_block["losses"]
    # the conditioning's checkpoint keeps the trunk's pair (outputs["pair"], held anyway), saved
    # while AF3Model.forward runs
    glue = "glue (AF3Model)"
    assert grouped[glue] == per_block[glue] + pair
    # the templates keep their input z, the projected z_in and the relu of the mean [N, N, c_t]
    # (and the template count): the projection's norm and each template's stack are re-run
    c_t = length * length * preset("tiny").templates.c_template * 4
    assert grouped["templates"] == pair + 2 * c_t + 4
    # the distogram head is re-run from the trunk's pair: its z + z^T is not kept
    assert per_block["distogram head"] == pair and "distogram head" not in grouped
    # z_init is re-run in backward: the relative positions' classes (three long [B, N, N] and the
    # bool same-entity [B, N, N, 1], what their weight columns' gradient reads) and the bonds
    # [B, N, N, 1] are not kept; its checkpoint keeps the bool bond matrix ([N + 1, N + 1] storage)
    config = preset("tiny")
    classes = length * length * (3 * 8 + 1)
    embedder = "input embedder"
    assert grouped[embedder] == per_block[embedder] - classes - length * length * 4 + (length + 1) ** 2
    # the diffusion transformer keeps one block input a [B, S, N, c_token] per group
    diffusion_blocks, a_bytes = config.diffusion.diffusion_blocks, 2 * length * config.diffusion.c_token_diffusion * 4
    kept = math.ceil(diffusion_blocks / group)
    transformer = "diffusion: transformer"
    assert grouped[transformer] == per_block[transformer] - (diffusion_blocks - kept) * a_bytes
    for part in per_block.keys() - {
        "Pairformer",
        "Pairformer pairs",
        glue,
        embedder,
        transformer,
        "distogram head",
        *recomputed,
    }:
        # the bool pair mask is counted where it is first saved: no longer in the templates
        assert abs(grouped.get(part) - per_block[part]) <= length * length, part


def test_growth_orders_match_tensors_of_two_runs():
    small = [
        ("a", 10 * 10 * 4, (10, 10), torch.float32),
        ("b", 16, (4,), torch.float32),
        ("c", 40, (10,), torch.float32),
    ]
    large = [
        ("a", 20 * 20 * 4, (20, 20), torch.float32),
        ("b", 16, (4,), torch.float32),
        ("c", 80, (20,), torch.float32),
    ]
    assert growth_orders(small, large, 10, 20) == [2, 0, 1]
    with pytest.raises(ValueError, match="different sequences"):
        growth_orders(small, large[:2], 10, 20)


def test_checkpoint_group_must_be_positive():
    with pytest.raises(ValueError, match="checkpoint_group"):
        preset("tiny", checkpoint_group=0)


def test_train_setting_and_flag():
    from click.testing import CliRunner

    from featurecache.training.command import train_command
    from featurecache.training.config import TrainConfig, TrainSetupError

    config = TrainConfig(cache="cache", model_settings={"checkpoint_group": 7})
    assert config.model_config("torch").runtime.checkpoint_group == 7
    with pytest.raises(TrainSetupError, match="checkpoint_group"):
        TrainConfig(cache="cache", model_settings={"checkpoint_group": 0})
    result = CliRunner().invoke(train_command, ["--cache", "cache", "--checkpoint-group", "0"])
    assert result.exit_code == 2 and "--checkpoint-group" in result.output
