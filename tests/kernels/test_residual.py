"""residual_add: the fused fp32 + bf16 residual add against its PyTorch composition."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from featurecache.kernels.reference import DropoutSite
from featurecache.kernels.residual import residual_add, residual_add_reference

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("use", ["both", "fp32 only", "bf16 only"])
def test_matches_the_composition_in_value_and_gradient(use):
    shape = (2, 7, 7, 24)  # 2352 elements: more than one program of 2048, the last one ragged
    z = torch.randn(shape, device=DEVICE)
    update = torch.randn(shape, device=DEVICE).to(torch.bfloat16)
    d_new = torch.randn(shape, device=DEVICE)
    d_low = torch.randn(shape, device=DEVICE).to(torch.bfloat16)
    results = []
    for function in (residual_add, residual_add_reference):
        z_leaf, update_leaf = z.clone().requires_grad_(True), update.clone().requires_grad_(True)
        with torch.autocast(DEVICE, dtype=torch.bfloat16):
            new, low = function(z_leaf, update_leaf)
        assert new.dtype == torch.float32 and low.dtype == torch.bfloat16
        loss = 0
        if use != "bf16 only":
            loss = loss + (new * d_new).sum()
        if use != "fp32 only":
            loss = loss + (low.float() * d_low.float()).sum()
        loss.backward()
        results.append((new.detach(), low.detach(), z_leaf.grad, update_leaf.grad))
    for mine, ref in zip(*results):
        assert mine.dtype == ref.dtype
        torch.testing.assert_close(mine, ref, rtol=0, atol=0)  # same operations, same rounding


def test_without_autocast_both_results_are_the_sum():
    z, update = torch.randn(3, 5, device=DEVICE), torch.randn(3, 5, device=DEVICE)
    new, low = residual_add(z, update)
    assert new is low
    torch.testing.assert_close(new, z + update, rtol=0, atol=0)


@pytest.mark.parametrize("shared_dim", [1, 2])
@pytest.mark.parametrize("shape", [(1, 5, 7, 24), (2, 9, 6, 40)])  # ragged last programs, B > 1
def test_the_dropout_drawn_in_the_kernel_is_the_reference_mask_bit_for_bit(shared_dim, shape):
    """The update's shared dropout folded into the residual add: the same kept elements, the same
    scaled values and gradients as shared_dropout_reference followed by the plain add."""
    generator = torch.Generator().manual_seed(sum(shape) + shared_dim)
    z = torch.randn(shape, generator=generator).to(DEVICE)
    update = torch.randn(shape, generator=generator).to(DEVICE, torch.bfloat16)
    d_new = torch.randn(shape, generator=generator).to(DEVICE)
    d_low = torch.randn(shape, generator=generator).to(DEVICE, torch.bfloat16)
    # a seed at the top of the 32-bit range and a site whose mix needs 32 bits: the hash's
    # arithmetic must wrap as the reference's masked int64 products do
    seed = torch.tensor(0xFFFFFFF0, dtype=torch.int64, device=DEVICE)
    dropout = DropoutSite(0.25, seed, 3, shared_dim)
    results = []
    for function in (residual_add, residual_add_reference):
        z_leaf, update_leaf = z.clone().requires_grad_(True), update.clone().requires_grad_(True)
        with torch.autocast(DEVICE, dtype=torch.bfloat16):
            new, low = function(z_leaf, update_leaf, dropout)
        ((new * d_new).sum() + (low.float() * d_low.float()).sum()).backward()
        results.append((new.detach(), low.detach(), z_leaf.grad, update_leaf.grad))
    for mine, ref in zip(*results):
        assert mine.dtype == ref.dtype
        torch.testing.assert_close(mine, ref, rtol=0, atol=0)
    dropped = results[0][3] == 0  # where the mask dropped the update, its gradient is zero
    assert 0.1 < dropped.float().mean().item() < 0.4  # about the rate
    other = 2 if shared_dim == 1 else 1
    assert torch.equal(dropped, dropped.select(shared_dim, 0).unsqueeze(shared_dim).expand_as(dropped))
    assert not torch.equal(dropped, dropped.select(other, 0).unsqueeze(other).expand_as(dropped))


@pytest.mark.parametrize("wide", [False, True], ids=["32-bit indices", "64-bit indices"])
@pytest.mark.parametrize("shared_dim", [1, 2])
def test_tiles_split_over_rows_and_channels_draw_the_same_mask(monkeypatch, shared_dim, wide):
    # 2 rows of 16 channels a program: 40 channels take 3 column tiles (the last ragged), the
    # rows 54 programs; the mask's per-row hash and the channel's must still meet per element
    from featurecache.kernels.residual import launch

    monkeypatch.setattr(launch, "BLOCK", 32)
    monkeypatch.setattr(launch, "MAX_BLOCK_COLS", 16)
    if wide:
        monkeypatch.setattr(launch, "INT32_ELEMENTS", 0)
    test_the_dropout_drawn_in_the_kernel_is_the_reference_mask_bit_for_bit(shared_dim, (2, 9, 6, 40))


def test_empty_tensors_add_without_a_launch():
    z, update = torch.randn(1, 0, 3, 8, device=DEVICE), torch.randn(1, 0, 3, 8, device=DEVICE, dtype=torch.bfloat16)
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        new, low = residual_add(z, update)
    assert new.shape == low.shape == z.shape


def test_dropout_of_rate_zero_or_without_a_seed_leaves_the_update_alone():
    z, update = torch.randn(1, 3, 3, 8, device=DEVICE), torch.randn(1, 3, 3, 8, device=DEVICE)
    seed = torch.tensor(7, device=DEVICE)
    for function in (residual_add, residual_add_reference):
        new, _ = function(z, update, DropoutSite(0.0, seed, 0, 1))
        torch.testing.assert_close(new, z + update, rtol=0, atol=0)


@pytest.mark.parametrize("use", ["both", "sum only", "view only"])
@pytest.mark.parametrize(
    ("stream", "autocast"),
    [(torch.bfloat16, True), (torch.bfloat16, False), (torch.float32, False)],
    ids=["bf16 stream under autocast", "bf16 stream", "fp32 stream without autocast"],
)
def test_a_stream_in_the_updates_dtype_takes_the_dropout_in_one_kernel_bit_for_bit(stream, autocast, use):
    """The trunk's pair is bf16 under autocast (its first value comes out of bf16 products): the
    dropped update and the add in one kernel each way, equal to the reference composition (the
    mask's multiply in the update's dtype, then one rounding of the sum) in values and both
    gradients. The sum comes back twice, as the reference's one tensor does, but as two outputs
    (the sum and a view of it) whose gradients backward adds in its kernel: no add of autograd's."""
    shape = (2, 9, 6, 40)
    generator = torch.Generator().manual_seed(11)
    z = torch.randn(shape, generator=generator).to(DEVICE, stream)
    update = torch.randn(shape, generator=generator).to(DEVICE, stream)
    d_new = torch.randn(shape, generator=generator).to(DEVICE, stream)
    d_low = torch.randn(shape, generator=generator).to(DEVICE, stream)
    dropout = DropoutSite(0.25, torch.tensor(0xFFFFFFF0, dtype=torch.int64, device=DEVICE), 5, 2)
    results, launches, adds = [], [], []
    for function in (residual_add, residual_add_reference):
        z_leaf, update_leaf = z.clone().requires_grad_(True), update.clone().requires_grad_(True)
        with torch.autocast(DEVICE, dtype=torch.bfloat16, enabled=autocast), _Ops() as ops:
            new, low = function(z_leaf, update_leaf, dropout)
        launches.append(ops.count)
        assert low.data_ptr() == new.data_ptr() and new.dtype == low.dtype == stream
        terms = {"sum only": [(new, d_new)], "view only": [(low, d_low)]}.get(use, [(new, d_new), (low, d_low)])
        loss = sum((result.float() * gradient.float()).sum() for result, gradient in terms)
        with _Ops() as ops:
            loss.backward()
        adds.append(ops.adds)
        results.append((new.detach(), z_leaf.grad, update_leaf.grad))
    for mine, ref in zip(*results):
        assert mine.dtype == ref.dtype
        torch.testing.assert_close(mine, ref, rtol=0, atol=0)
    assert launches[0] == 0 < launches[1]  # the reference hashes the mask with PyTorch operators
    assert adds[0] == 0  # both gradients summed in the residual's backward kernel
    if use == "both":
        assert adds[1] > 0  # the reference's one tensor: autograd adds its two gradients
    dropped = results[0][2] == 0
    assert 0.1 < dropped.float().mean().item() < 0.4


class _Ops(TorchDispatchMode):
    """The hash's operators a call dispatches (bitwise_xor: ~5 per dropout mask's hash round), and
    its adds of stream-shaped tensors (autograd summing two gradients of one tensor)."""

    def __enter__(self):
        self.count = self.adds = 0
        return super().__enter__()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func.overloadpacket.__name__ == "bitwise_xor"
        self.adds += func.overloadpacket.__name__ == "add" and args[0].dim() == 4
        return func(*args, **(kwargs or {}))
