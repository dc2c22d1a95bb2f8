"""CapturedStep: a training step replayed as a CUDA graph gives the eager step's results; the code
it captures builds no tensor from Python data."""

import traceback

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from featurecache.training.cuda_graph import CapturedStep

cuda_only = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")


def test_refuses_without_cuda_or_without_a_warm_up():
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA device"):
            CapturedStep(lambda inputs: inputs)
    else:
        with pytest.raises(ValueError, match="warmup_steps"):
            CapturedStep(lambda inputs: inputs, warmup_steps=0)


def _model_and_step(seed: int):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(24, 40), torch.nn.GELU(), torch.nn.Linear(40, 3)).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, capturable=True)

    def step(inputs: dict) -> dict:
        loss = torch.nn.functional.mse_loss(model(inputs["x"]), inputs["y"])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return {"loss": loss.detach()}

    return model, step


@cuda_only
def test_replays_match_eager_steps_on_new_inputs():
    generator = torch.Generator(device="cuda").manual_seed(3)
    batches = [
        {
            "x": torch.randn(17, 24, device="cuda", generator=generator),
            "y": torch.randn(17, 3, device="cuda", generator=generator),
        }
        for _ in range(7)
    ]
    eager_model, eager_step = _model_and_step(0)
    graph_model, graph_step = _model_and_step(0)
    captured = CapturedStep(graph_step, warmup_steps=2)
    for index, batch in enumerate(batches):
        expected = eager_step(batch)["loss"].item()
        got = captured(batch)["loss"].item()
        assert captured.is_captured == (index >= 2)
        assert got == pytest.approx(expected, rel=1e-5, abs=1e-6), index
    for mine, ref in zip(graph_model.parameters(), eager_model.parameters()):
        torch.testing.assert_close(mine, ref, rtol=1e-5, atol=1e-6)


@cuda_only
def test_graphs_of_two_shapes_in_one_pool_replay_as_eager_steps():
    """One CapturedStep per batch shape, as GraphedUpdate keeps per atom bucket, sharing one memory
    pool: interleaved replays of the two give the eager steps' losses and weights."""
    generator = torch.Generator(device="cuda").manual_seed(5)
    rows = [17, 33, 33, 17, 17, 33, 17, 33, 33, 17]
    batches = [
        {
            "x": torch.randn(count, 24, device="cuda", generator=generator),
            "y": torch.randn(count, 3, device="cuda", generator=generator),
        }
        for count in rows
    ]
    eager_model, eager_step = _model_and_step(0)
    graph_model, graph_step = _model_and_step(0)
    pool = torch.cuda.graph_pool_handle()
    captured = {count: CapturedStep(graph_step, warmup_steps=2, pool=pool) for count in set(rows)}
    for index, batch in enumerate(batches):
        expected = eager_step(batch)["loss"].item()
        got = captured[batch["x"].shape[0]](batch)["loss"].item()
        assert got == pytest.approx(expected, rel=1e-5, abs=1e-6), index
    assert all(step.is_captured for step in captured.values())
    for mine, ref in zip(graph_model.parameters(), eager_model.parameters()):
        torch.testing.assert_close(mine, ref, rtol=1e-5, atol=1e-6)


@cuda_only
def test_a_released_step_frees_its_graph_and_captures_anew():
    """release() (train's end) drops the graph and its buffers; the step then warms up and captures
    again, and its replays still match the eager steps."""
    generator = torch.Generator(device="cuda").manual_seed(11)
    batches = [
        {
            "x": torch.randn(9, 24, device="cuda", generator=generator),
            "y": torch.randn(9, 3, device="cuda", generator=generator),
        }
        for _ in range(6)
    ]
    eager_model, eager_step = _model_and_step(0)
    graph_model, graph_step = _model_and_step(0)
    captured = CapturedStep(graph_step, warmup_steps=1)
    for index, batch in enumerate(batches):
        if index == 3:
            captured.release()
            assert not captured.is_captured and not captured.static_inputs
        expected = eager_step(batch)["loss"].item()
        assert captured(batch)["loss"].item() == pytest.approx(expected, rel=1e-5, abs=1e-6), index
    assert captured.is_captured
    for mine, ref in zip(graph_model.parameters(), eager_model.parameters()):
        torch.testing.assert_close(mine, ref, rtol=1e-5, atol=1e-6)


def test_releasing_an_uncaptured_step_is_harmless():
    captured = CapturedStep(lambda inputs: {"y": inputs["x"] * 2}, capture=False)
    captured({"x": torch.ones(2)})
    captured.release()
    assert captured({"x": torch.ones(2)})["y"].tolist() == [2.0, 2.0]


@cuda_only
def test_a_replay_with_another_shape_names_the_input():
    _, step = _model_and_step(0)
    captured = CapturedStep(step, warmup_steps=1)
    batch = {"x": torch.randn(8, 24, device="cuda"), "y": torch.randn(8, 3, device="cuda")}
    captured(batch)
    captured(batch)
    with pytest.raises(ValueError, match="'x'.*pad batches"):
        captured({"x": torch.randn(9, 24, device="cuda"), "y": torch.randn(8, 3, device="cuda")})


def test_a_captured_step_copies_the_per_cycle_msa_rows_in():
    """graph_inputs decides what a replay sees: the loader's msa_cycle_rows must be among them, or a
    graphed step would read the whole MSA pool in every cycle (and its eager run would not)."""
    from featurecache.model.af3 import LOSS_INPUTS, REQUIRED_INPUTS
    from featurecache.training.loop import graph_inputs

    batch = {name: torch.zeros(1) for name in REQUIRED_INPUTS + LOSS_INPUTS}
    batch["id"] = ["target"]
    assert set(graph_inputs(batch)) == set(REQUIRED_INPUTS + LOSS_INPUTS)
    batch["msa_cycle_rows"] = torch.zeros(1, 4, 8, dtype=torch.int32)
    assert graph_inputs(batch)["msa_cycle_rows"] is batch["msa_cycle_rows"]


class _PythonData(TorchDispatchMode):
    """Counts tensors built from Python data (aten.lift_fresh: torch.tensor(...), indexing with a
    list), with the line of featurecache that built them."""

    def __init__(self) -> None:
        super().__init__()
        self.made_at: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.lift_fresh.default:
            frames = [f for f in traceback.extract_stack() if "featurecache/" in f.filename]
            self.made_at.append(f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "?")
        return func(*args, **(kwargs or {}))


def test_the_captured_code_builds_no_tensor_from_python_data():
    """What a CUDA graph captures (a training step with its mini-rollout, a sampler call) builds
    no tensor from Python data: on a GPU such a tensor is a copy from host memory, which a capture
    refuses ("Cannot copy between CPU and CUDA tensors during CUDA graph capture"). Checked on the
    CPU by the operator every such tensor passes through, on the model code both kernel paths
    share (the PyTorch path: the Triton path under the interpreter takes minutes here); indexing
    the atom attention's weight blocks with a list did it (found on the H100, 2026-12-07)."""
    from featurecache.model import AF3Model, preset
    from featurecache.testing.synthetic import random_batch

    torch.manual_seed(0)
    model = AF3Model(preset("tiny", kernels="torch", confidence_rollout_steps=2)).train()
    batch = random_batch([7], [3], [1], torch.Generator().manual_seed(1), num_atoms_per_token=2)

    def captured_code():
        outputs = model(batch, num_cycles=1, diffusion_batch=2, generator=torch.Generator().manual_seed(2))
        model.loss(batch, outputs)[0].backward()
        with torch.no_grad():
            model.sample(batch, num_cycles=1, num_samples=1, num_steps=2, generator=torch.Generator().manual_seed(3))

    captured_code()  # the warm-up a capture follows (the process's caches filled, as CapturedStep's)
    mode = _PythonData()
    with mode:
        captured_code()
    assert sorted(set(mode.made_at)) == []
