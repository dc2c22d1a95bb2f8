"""cached_weight_casts: a sampler's steps share one bf16 copy of each weight, without gradient
only, and a sampler under autocast draws the same structures with the copies as without."""

import contextlib

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from featurecache.kernels import weight_casts
from featurecache.kernels.weight_casts import cached_weight_casts, cast_packed, cast_weight


class _Copies(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func.overloadpacket.__name__ == "_to_copy"
        return func(*args, **(kwargs or {}))


def _weight() -> torch.nn.Parameter:
    return torch.nn.Parameter(torch.randn(8, 4, generator=torch.Generator().manual_seed(0)))


def test_one_copy_per_weight_within_the_scope_without_gradient():
    weight, copies = _weight(), _Copies()
    with torch.no_grad(), cached_weight_casts(), copies:
        first, second = cast_weight(weight, torch.bfloat16), cast_weight(weight, torch.bfloat16)
        with cached_weight_casts():  # a nested scope shares the outer one's copies
            third = cast_weight(weight, torch.bfloat16)
    assert first is second is third and copies.count == 1
    assert torch.equal(first, weight.detach().to(torch.bfloat16))
    assert cast_weight(weight, torch.float32) is weight  # no cast needed: the weight itself


def test_every_call_casts_outside_the_scope_or_with_gradient():
    weight, copies = _weight(), _Copies()
    with torch.no_grad(), copies:
        cast_weight(weight, torch.bfloat16), cast_weight(weight, torch.bfloat16)
    assert copies.count == 2
    with cached_weight_casts():
        first, second = cast_weight(weight, torch.bfloat16), cast_weight(weight, torch.bfloat16)
        (first.float().sum() + 2 * second.float().sum()).backward()
    assert first is not second  # each use its own differentiable cast
    torch.testing.assert_close(weight.grad, torch.full_like(weight, 3.0))


def test_an_updated_weight_is_cast_again_and_the_copies_go_with_the_scope():
    weight = _weight()
    with torch.no_grad(), cached_weight_casts():
        before = cast_weight(weight, torch.bfloat16)
        weight.add_(1.0)  # in place: a new version
        after = cast_weight(weight, torch.bfloat16)
        assert after is not before and torch.equal(after, weight.to(torch.bfloat16))
    assert weight_casts._scope.copies is None


def test_packed_weights_are_made_once_within_the_scope_and_again_when_one_changes():
    """cast_packed: two weights side by side in bf16, one copy for every call of a sampler's
    scope (until either weight changes in place), a new one per call elsewhere."""
    first, second = _weight(), torch.nn.Parameter(torch.randn(3, 4, generator=torch.Generator().manual_seed(1)))
    expected = torch.cat([first.detach(), second.detach()]).to(torch.bfloat16)
    with torch.no_grad(), cached_weight_casts():
        one, two = cast_packed((first, second), torch.bfloat16), cast_packed((first, second), torch.bfloat16)
        assert one is two and torch.equal(one, expected)
        assert cast_packed((second, first), torch.bfloat16) is not one  # another order, another packing
        second.add_(1.0)
        three = cast_packed((first, second), torch.bfloat16)
        assert three is not one and torch.equal(three[8:], second.to(torch.bfloat16))
    with torch.no_grad():
        assert cast_packed((first, second), torch.bfloat16) is not cast_packed((first, second), torch.bfloat16)


@pytest.mark.parametrize("step_scope", [False, True])
def test_packed_weights_pass_each_weight_its_gradient(step_scope):
    """With gradient (alone, or from the step scope's shared copies) each weight gets the
    gradient of its own rows of the packing (fp64: exact)."""
    generator = torch.Generator().manual_seed(2)
    first, second = (torch.nn.Parameter(torch.randn(rows, 4, generator=generator)) for rows in (8, 3))
    x = torch.randn(5, 4, dtype=torch.float64, generator=generator)
    scope = weight_casts.step_weight_casts() if step_scope else contextlib.nullcontext()
    with scope:
        (x @ cast_packed((first, second), torch.float64).t()).pow(2).sum().backward()
    product = x @ torch.cat([first, second]).double().t()
    torch.testing.assert_close(first.grad, (2 * product[:, :8].t() @ x).float(), rtol=0, atol=1e-6)
    torch.testing.assert_close(second.grad, (2 * product[:, 8:].t() @ x).float(), rtol=0, atol=1e-6)


@pytest.mark.parametrize("kernels", ["torch", "triton"])
def test_the_sampler_under_autocast_draws_the_same_structures_with_the_copies(kernels, monkeypatch):
    """The tiny model's sampler (2 steps) under CPU autocast, the triton path interpreted: the
    cached copies are the casts each call made before, so the structures are equal bit for bit."""
    from featurecache.model import AF3Model, preset
    from featurecache.model.network import diffusion_sampler
    from featurecache.testing.synthetic import random_batch

    torch.manual_seed(0)
    model = AF3Model(preset("tiny", kernels=kernels)).eval()
    batch = random_batch([9], [3], [1], torch.Generator().manual_seed(1), num_atoms_per_token=2)

    def sample() -> tuple[torch.Tensor, int]:
        copies = _Copies()
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16), copies:
            outputs = model.sample(
                batch, num_cycles=1, num_samples=2, num_steps=2, generator=torch.Generator().manual_seed(3)
            )
        return outputs["positions"], copies.count

    cached, cached_copies = sample()
    monkeypatch.setattr(diffusion_sampler, "cached_weight_casts", contextlib.nullcontext)
    uncached, uncached_copies = sample()
    assert torch.equal(cached, uncached)
    if kernels == "triton":  # the kernels cast their own weights (the torch path: autocast's cache)
        assert cached_copies < uncached_copies


class _WeightCasts(TorchDispatchMode):
    """Counts the casts of one weight (by shape) to bf16."""

    def __init__(self, shape) -> None:
        super().__init__()
        self.shape, self.count = tuple(shape), 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.count += (
            func.overloadpacket.__name__ == "_to_copy"
            and tuple(args[0].shape) == self.shape
            and kwargs.get("dtype") == torch.bfloat16
        )
        return func(*args, **kwargs)


def test_linears_cast_their_weight_once_within_the_scope_when_the_graphed_step_turned_the_cache_off():
    # a CUDA-graph training step runs autocast with its cache off; the sampler's scope turns it on
    linear, x = torch.nn.Linear(4, 8), torch.randn(3, 4)
    results = {}
    for scoped in (False, True):
        casts = _WeightCasts(linear.weight.shape)
        with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False), torch.no_grad(), casts:
            with cached_weight_casts() if scoped else contextlib.nullcontext():
                results[scoped] = (linear(x), linear(x))
            assert not torch.is_autocast_cache_enabled()  # the step's setting, restored
        assert casts.count == (1 if scoped else 2)
    assert all(torch.equal(a, b) for a, b in zip(results[False], results[True]))


def test_no_weight_cast_without_gradient_outlives_the_scope():
    linear, x = torch.nn.Linear(4, 8), torch.randn(3, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
        with torch.no_grad(), cached_weight_casts():
            linear(x)
        casts = _WeightCasts(linear.weight.shape)
        with casts:
            linear(x).float().sum().backward()
    assert casts.count == 1  # cast again, with gradient
    assert linear.weight.grad is not None and linear.weight.grad.abs().sum() > 0


def test_with_gradient_the_scope_leaves_autocast_cache_alone():
    with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False), cached_weight_casts():
        assert not torch.is_autocast_cache_enabled()


def test_the_step_scope_casts_once_for_a_checkpoints_forward_and_recomputation():
    """A weight used in a checkpointed block (first forward without gradient, recomputation in
    backward), outside it, and in a no-gradient sampler scope between: one cast, and every
    differentiated use's gradient reaches the weight (fp32 weights: the gradient is exact)."""
    from featurecache.model.network.checkpointing import checkpointed

    weight, x = _weight(), torch.randn(3, 8, dtype=torch.float64, requires_grad=True)

    def block(inputs):
        return inputs @ cast_weight(weight, torch.float64)

    def loss_of():
        inside = checkpointed(block, x)
        with torch.no_grad(), cached_weight_casts():
            rollout = cast_weight(weight, torch.float64)
        outside = x @ cast_weight(weight, torch.float64)
        return (inside.sum() + 2 * outside.sum()) * rollout.sum().detach()

    loss_of().backward()
    expected = weight.grad.clone()
    weight.grad, x.grad = None, None
    casts = _Copies()
    with casts, weight_casts.step_weight_casts():
        loss = loss_of()
        loss.backward()
    assert casts.count == 1 + 2  # the one cast; its gradient cast back in each backward pass through it (2)
    torch.testing.assert_close(weight.grad, expected, rtol=0, atol=0)
    assert weight_casts._scope.step_copies is None


def test_the_step_scope_gives_the_training_steps_gradients(monkeypatch):
    """The tiny model's training step (Pairformer blocks checkpointed, the mini-rollout) under
    CPU autocast with the step's casts shared and without: the same loss, and the same
    gradients up to the bf16 sums of a weight's uses within one backward pass (autocast's own
    cache sums them so too)."""
    from featurecache.model import AF3Model, preset
    from featurecache.testing.synthetic import random_batch

    torch.manual_seed(0)
    model = AF3Model(preset("tiny", kernels="torch")).train()
    batch = random_batch([9], [3], [1], torch.Generator().manual_seed(1), num_atoms_per_token=2)

    def step(scope) -> tuple[torch.Tensor, dict]:
        model.zero_grad(set_to_none=True)
        with scope:
            with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
                outputs = model(batch, num_cycles=1, diffusion_batch=2, generator=torch.Generator().manual_seed(2))
                loss = model.loss(batch, outputs)[0]
            loss.backward()
        return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}

    plain_loss, plain = step(contextlib.nullcontext())
    shared_loss, shared = step(weight_casts.step_weight_casts())
    assert torch.equal(plain_loss, shared_loss)
    assert plain.keys() == shared.keys()
    for name, grad in plain.items():
        scale = grad.abs().max().item() + shared[name].abs().max().item()
        torch.testing.assert_close(
            shared[name], grad, rtol=0, atol=4 * torch.finfo(torch.bfloat16).eps * scale, msg=name
        )


class _Casts(TorchDispatchMode):
    """Counts single casts of tensors shaped as `shape` (weights, their gradients) and
    multi-tensor copies."""

    def __init__(self, shape) -> None:
        super().__init__()
        self.shape, self.single, self.bulk = shape, 0, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        self.single += name == "_to_copy" and tuple(args[0].shape) == self.shape
        self.bulk += name.startswith("_foreach_copy")
        return func(*args, **(kwargs or {}))


def test_a_plan_casts_the_last_steps_weights_at_once_with_the_same_gradients():
    """A step records the weights it cast; the next step with the plan casts them all in one
    multi-tensor copy on entry (none one by one) and gets the same loss and the same gradients,
    bit for bit: each weight's gradients through a checkpoint's recomputation and outside it
    are summed in bf16 and cast back, as through its own cast."""
    from featurecache.model.network.checkpointing import checkpointed

    generator = torch.Generator().manual_seed(3)
    weights = [torch.nn.Parameter(torch.randn(8, 8, generator=generator)) for _ in range(3)]
    x = torch.randn(5, 8, generator=generator)
    plan = weight_casts.StepCastPlan()

    def step():
        for weight in weights:
            weight.grad = None
        casts = _Casts((8, 8))
        with casts, weight_casts.step_weight_casts(plan):
            inside = checkpointed(lambda t: t @ cast_weight(weights[0], torch.bfloat16), x.bfloat16())
            outside = (inside @ cast_weight(weights[1], torch.bfloat16)) @ cast_weight(weights[0], torch.bfloat16)
            loss = outside.float().square().sum()
            loss.backward()
        return loss.detach(), [weight.grad for weight in weights], casts

    first_loss, first_grads, first = step()
    assert first.single >= 4 and first.bulk == 0  # two weights cast, their gradients cast back
    assert [w is v for w, v in zip(plan.weights[torch.bfloat16], weights[:2])] == [True, True]
    second_loss, second_grads, second = step()
    assert second.single == 0 and second.bulk >= 2  # the casts, then the gradients cast back
    assert torch.equal(first_loss, second_loss)
    assert second_grads[2] is None
    for a, b in zip(first_grads[:2], second_grads[:2]):
        assert a.dtype == b.dtype == torch.float32 and torch.equal(a, b)


def test_the_tiny_training_step_with_a_plan_is_the_step_without():
    """The tiny model's training step under CPU autocast: its second step with the first step's
    plan (every weight cast at once) gives the loss and gradients of the step scope without a
    plan, bit for bit."""
    from featurecache.model import AF3Model, preset
    from featurecache.testing.synthetic import random_batch

    torch.manual_seed(0)
    model = AF3Model(preset("tiny", kernels="torch")).train()
    batch = random_batch([9], [3], [1], torch.Generator().manual_seed(1), num_atoms_per_token=2)
    plan = weight_casts.StepCastPlan()

    def step(plan) -> tuple[torch.Tensor, dict]:
        model.zero_grad(set_to_none=True)
        with weight_casts.step_weight_casts(plan):
            with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
                outputs = model(batch, num_cycles=1, diffusion_batch=2, generator=torch.Generator().manual_seed(2))
                loss = model.loss(batch, outputs)[0]
            loss.backward()
        return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}

    plain_loss, plain = step(None)
    step(plan)  # records the plan
    assert len(plan.weights[torch.bfloat16]) > 50
    planned_loss, planned = step(plan)
    assert torch.equal(plain_loss, planned_loss)
    assert plain.keys() == planned.keys()
    for name, grad in plain.items():
        assert torch.equal(planned[name], grad), name


def test_a_paused_step_scope_casts_at_each_use_and_keeps_nothing():
    """Within step_casts_paused a weight is cast at each differentiated use, as without the step
    scope, and is neither kept for the step nor recorded in its plan; the weights used outside
    the pause keep their one copy. Gradients are the same (fp64 weights and inputs: exact)."""
    from featurecache.model.network.checkpointing import checkpointed

    generator = torch.Generator().manual_seed(4)
    paused, kept = (torch.nn.Parameter(torch.randn(8, 8, generator=generator)) for _ in range(2))
    x = torch.randn(5, 8, dtype=torch.float64, generator=generator, requires_grad=True)

    def block(t):  # as ConditionedTransformerBlock pauses: inside the checkpointed function
        with weight_casts.step_casts_paused():
            return t @ cast_weight(paused, torch.float64)

    def loss_of():
        inside = checkpointed(block, x)
        return (inside @ cast_weight(kept, torch.float64)).square().sum()

    loss_of().backward()
    expected = [paused.grad.clone(), kept.grad.clone()]
    paused.grad = kept.grad = None
    plan = weight_casts.StepCastPlan()
    casts = _Casts((8, 8))
    with casts, weight_casts.step_weight_casts(plan):
        loss_of().backward()
        assert [entry[0] for entry in weight_casts._scope.step_copies.values()] == [kept]
    # paused: the first forward and the recomputation (2) and its gradient back; kept: once, and back
    assert casts.single == 3 + 2
    assert plan.weights[torch.float64] == [kept]
    for got, want in zip([paused.grad, kept.grad], expected):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_the_token_transformers_weights_stay_out_of_the_step_plan():
    """The diffusion module's token transformer pauses the step casts (its weights' copies would
    be held through the step's peak): after a tiny training step the plan holds none of its
    weights and the rest of the model's."""
    from featurecache.model import AF3Model, preset
    from featurecache.testing.synthetic import random_batch

    torch.manual_seed(0)
    model = AF3Model(preset("tiny", kernels="torch")).train()
    batch = random_batch([9], [3], [1], torch.Generator().manual_seed(1), num_atoms_per_token=2)
    plan = weight_casts.StepCastPlan()
    with weight_casts.step_weight_casts(plan):
        with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
            outputs = model(batch, num_cycles=1, diffusion_batch=2, generator=torch.Generator().manual_seed(2))
            loss = model.loss(batch, outputs)[0]
        loss.backward()
    planned = {id(weight) for weight in plan.weights[torch.bfloat16]}
    names = {id(p): name for name, p in model.named_parameters()}
    in_plan = {names[i] for i in planned}
    token = {name for name in names.values() if name.startswith("diffusion_module.transformer.")}
    assert token and not token & in_plan
    assert any(name.startswith("pairformer.") for name in in_plan)
