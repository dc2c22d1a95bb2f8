"""The shared runtime helpers: what TRITON_INTERPRET means, and the kernel switch."""

import pytest
import torch
import triton.runtime.errors
from triton import knobs

from featurecache.kernels import runtime
from featurecache.kernels.evo_attention import config as evo_config
from featurecache.kernels.layernorm_linear import LayerNormLinear


@pytest.mark.parametrize("value", ["1", "true", "TRUE", "Yes", "on", "ON", "y"])
def test_interpreter_values_that_mean_on(monkeypatch, value):
    monkeypatch.setenv("TRITON_INTERPRET", value)
    assert runtime.interpreted()
    assert runtime.runs_triton(torch.device("cpu"))
    assert runtime.dot_precision(torch.bfloat16) == "interpret"
    assert runtime.gpu_name(torch.device("cuda", 0)) is None  # configs: the interpreter's entry


@pytest.mark.parametrize("value", ["0", "", "false", "off", "no", "2", " 1"])
def test_interpreter_values_that_mean_off(monkeypatch, value):
    monkeypatch.setenv("TRITON_INTERPRET", value)
    assert not runtime.interpreted()
    assert not runtime.runs_triton(torch.device("cpu"))
    assert runtime.dot_precision(torch.float32) == "ieee"
    assert runtime.dot_precision(torch.bfloat16) == "tf32"


@pytest.mark.parametrize("value", ["1", "true", "Yes", "on", "y", "0", "", "false", "no", "2", " 1"])
def test_interpreter_reading_agrees_with_triton(monkeypatch, value):
    # If the two disagreed, kernels would run interpreted while the launchers prepared GPU
    # arguments (or the other way round).
    monkeypatch.setenv("TRITON_INTERPRET", value)
    assert runtime.interpreted() == knobs.runtime.interpret


def test_unset_means_off(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert not runtime.interpreted()


def test_kernels_keyword_selects_the_path_and_is_the_only_spelling():
    assert LayerNormLinear(8, 4, kernels="torch").kernels == "torch"
    with pytest.raises(TypeError, match="impl"):  # the old spelling is gone from the Python API
        LayerNormLinear(8, 4, impl="torch")
    with pytest.raises(ValueError, match=r"kernels must be one of \('triton', 'torch'\), got 'cuda'"):
        LayerNormLinear(8, 4, kernels="cuda")


class _KernelNeedingSmallTiles:
    """A launchable whose compiled form fits shared memory only at num_stages 1 and BLOCK_H <= 32,
    as Triton's JIT functions raise OutOfResources before launching."""

    def __init__(self):
        self.launches = []

    def __getitem__(self, grid):
        def launch(*args, **options):
            if options["num_stages"] > 1 or options["BLOCK_H"] > 32:
                raise triton.runtime.errors.OutOfResources(270336, 232448, "shared memory")
            self.launches.append((grid, args, options))

        return launch


def test_launch_fitting_shrinks_until_the_kernel_fits_and_remembers_it():
    kernel = _KernelNeedingSmallTiles()
    options = {"BLOCK_M": 64, "BLOCK_H": 128, "num_warps": 8, "num_stages": 2}
    x = torch.zeros(5, 7)
    runtime.launch_fitting(kernel, (3,), (x, 5), options, shrinkable=("BLOCK_H",))
    assert kernel.launches == [((3,), (x, 5), {"BLOCK_M": 64, "BLOCK_H": 32, "num_warps": 8, "num_stages": 1})]
    assert options["BLOCK_H"] == 128  # the caller's options are not changed
    runtime.launch_fitting(kernel, (3,), (x, 5), options, shrinkable=("BLOCK_H",))
    assert len(kernel.launches) == 2 and kernel.launches[1][2]["BLOCK_H"] == 32


def test_launch_fitting_gives_up_when_nothing_is_left_to_shrink():
    kernel = _KernelNeedingSmallTiles()
    with pytest.raises(triton.runtime.errors.OutOfResources):
        runtime.launch_fitting(kernel, (1,), (), {"BLOCK_H": 64, "num_warps": 4, "num_stages": 2})
    assert kernel.launches == []


def _pretend_gpu(monkeypatch, name: str, architecture: str) -> None:
    """The config lookups see a CUDA device of this name and SM architecture."""
    monkeypatch.setattr(runtime, "_cuda_index", lambda device=None: 0)
    monkeypatch.setattr(runtime, "_cuda_device_name", lambda index: name)
    monkeypatch.setattr(runtime, "_cuda_architecture", lambda index: architecture)


def test_a_gpu_without_its_own_entry_runs_the_tiles_tuned_for_its_architecture(monkeypatch):
    table = runtime._fused_config_table()
    tuned = runtime.TUNED_FOR_ARCHITECTURE["sm_90"]
    _pretend_gpu(monkeypatch, "NVIDIA GH200 480GB", "sm_90")
    assert runtime.tuned_gpu(table) == tuned
    for op, kernels in table[tuned].items():
        for kernel, entry in kernels.items():
            assert runtime.kernel_config(op, kernel).items() >= entry.items(), (op, kernel)
    assert runtime.kernel_config("transition", "bwd_dw")["WEIGHT_GRADS"] == "matmul"

    evo_tuned = evo_config.load_tuned_configs()[tuned]
    chosen = evo_config.select_config(32, 384, torch.device("cuda", 0))
    assert chosen == next(config for dim, length, config in evo_tuned if dim >= 32 and length >= 384)


def test_a_gpu_of_another_architecture_keeps_the_defaults(monkeypatch):
    _pretend_gpu(monkeypatch, "NVIDIA A100-SXM4-80GB", "sm_80")
    assert runtime.tuned_gpu(runtime._fused_config_table()) == "NVIDIA A100-SXM4-80GB"
    assert (
        runtime.kernel_config("transition", "bwd_dw")
        == runtime._fused_config_table()["default"]["transition"]["bwd_dw"]
    )
    heuristic = evo_config.heuristic_config(32, 384, interpreted=False)
    assert evo_config.select_config(32, 384, torch.device("cuda", 0)) == heuristic


def test_a_gpu_with_its_own_entry_runs_it(monkeypatch):
    tuned = runtime.TUNED_FOR_ARCHITECTURE["sm_90"]
    _pretend_gpu(monkeypatch, tuned, "sm_90")
    assert runtime.tuned_gpu(runtime._fused_config_table()) == tuned
    # an entry of its own wins over the architecture's: a table holding this name returns it
    _pretend_gpu(monkeypatch, "NVIDIA H100 80GB HBM3", "sm_90")
    assert runtime.tuned_gpu({"NVIDIA H100 80GB HBM3", tuned}) == "NVIDIA H100 80GB HBM3"


def test_a_gpu_entry_of_its_own_fills_only_what_it_names(monkeypatch):
    # layers: default < the architecture's GPU < this GPU's own entry < override_config
    table = runtime._fused_config_table()
    tuned = runtime.TUNED_FOR_ARCHITECTURE["sm_90"]
    own = {"layernorm_linear": {"fwd": {"BLOCK_N": 32}}}
    monkeypatch.setattr(runtime, "_fused_config_table", lambda: {**table, "NVIDIA H100 80GB HBM3": own})
    _pretend_gpu(monkeypatch, "NVIDIA H100 80GB HBM3", "sm_90")
    assert runtime.tuned_gpus(runtime._fused_config_table()) == ("NVIDIA H100 80GB HBM3", tuned)
    fwd = runtime.kernel_config("layernorm_linear", "fwd")
    assert fwd["BLOCK_N"] == 32 and fwd["BLOCK_M"] == table[tuned]["layernorm_linear"]["fwd"]["BLOCK_M"]
    assert fwd["num_stages"] == table["default"]["layernorm_linear"]["fwd"]["num_stages"]
    assert runtime.kernel_config("transition", "bwd_dw") == {
        **table["default"]["transition"]["bwd_dw"],
        **table[tuned]["transition"]["bwd_dw"],
    }
    with runtime.override_config("layernorm_linear", "fwd", BLOCK_N=16):
        assert runtime.kernel_config("layernorm_linear", "fwd")["BLOCK_N"] == 16


def test_readable_row_width_reaches_the_stride_only_inside_the_storage():
    wide = torch.zeros(5, 32)
    assert runtime.readable_row_width(wide) == 32
    assert runtime.readable_row_width(wide[:, :21]) == 32  # a view of aligned rows: padding readable
    assert runtime.readable_row_width(wide[:, 11:]) == 21  # the last row's padding is past the storage
    assert runtime.readable_row_width(wide[:0, :21]) == 21
    assert runtime.readable_row_width(torch.zeros(4, 7)) == 7
