"""One training step of a small tiny-preset model on a fixed synthetic batch (loss, backward): the
comparisons of recomputation settings (test_checkpoint_group.py, test_recompute_kept.py) run it
with each setting and compare the loss and every gradient."""

import torch

from featurecache.model import preset
from featurecache.model.af3 import AF3Model
from featurecache.testing.synthetic import random_batch

TOKENS, DIFFUSION_SAMPLES = [11, 8], 3
# The longest sums behind a gradient: a pair channel's weight gradient adds up every pair entry,
# at most batch x diffusion samples x N x N of them; the whole model's backward chains such sums
# (worst_case in the tests' tolerance).
LONGEST_SUM = len(TOKENS) * DIFFUSION_SAMPLES * max(TOKENS) ** 2


def loss_and_gradients(state: dict | None, num_cycles: int, **settings) -> tuple[torch.Tensor, dict, dict]:
    """The loss, the gradients by parameter name and the weights of one step of
    preset("tiny", kernels="torch", **settings), with `state`'s weights when given."""
    torch.manual_seed(0)
    model = AF3Model(preset("tiny", kernels="torch", **settings))
    if state is not None:
        model.load_state_dict(state)
    model.train()
    batch = random_batch(TOKENS, [5, 3], [2, 1], torch.Generator().manual_seed(3), num_atoms_per_token=3)
    outputs = model(
        batch, num_cycles=num_cycles, diffusion_batch=DIFFUSION_SAMPLES, generator=torch.Generator().manual_seed(4)
    )
    loss, _ = model.loss(batch, outputs)
    loss.backward()
    gradients = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), gradients, model.state_dict()
