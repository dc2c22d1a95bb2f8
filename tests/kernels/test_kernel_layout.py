"""Every kernel op in one layout (docs/ARCHITECTURE.md, "Where each feature lives"): a package
kernels/<op>/ with a file per part, each part only in its file. Read from the source (ast), so
it runs without a GPU or the interpreter."""

from __future__ import annotations

import ast
import pathlib

import pytest

KERNELS = pathlib.Path(__file__).resolve().parents[2] / "featurecache" / "kernels"
SHARED = {"__init__.py", "runtime.py", "primitives.py", "reference.py", "weight_casts.py"}
PARTS = {"__init__.py", "kernels.py", "config.py", "launch.py", "autograd.py", "module.py"}
REQUIRED = {"__init__.py", "kernels.py", "launch.py", "autograd.py"}
OPS = sorted(path for path in KERNELS.iterdir() if path.is_dir() and (path / "__init__.py").is_file())


def _tree(path: pathlib.Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _is_jit(node: ast.AST) -> bool:
    return isinstance(node, ast.FunctionDef) and any("jit" in ast.unparse(d) for d in node.decorator_list)


def _bases(node: ast.ClassDef) -> set[str]:
    return {ast.unparse(base) for base in node.bases}


def test_the_ops_are_found():
    names = {op.name for op in OPS}
    assert {"evo_attention", "conditioned_transition", "transition", "smooth_lddt"} <= names, names


def test_no_op_is_a_single_file():
    flat = sorted(path.name for path in KERNELS.glob("*.py") if path.name not in SHARED)
    assert not flat, f"kernels/ keeps ops as single files: {flat}; give each a package kernels/<op>/"


@pytest.mark.parametrize("op", OPS, ids=lambda p: p.name)
def test_op_has_the_parts_and_only_them(op):
    files = {path.name for path in op.glob("*.py")}
    assert files <= PARTS, f"kernels/{op.name}/ has {sorted(files - PARTS)}, not one of {sorted(PARTS)}"
    assert REQUIRED <= files, f"kernels/{op.name}/ lacks {sorted(REQUIRED - files)}"


@pytest.mark.parametrize("op", OPS, ids=lambda p: p.name)
def test_each_part_holds_only_its_own_code(op):
    wrong = []
    for path in sorted(op.glob("*.py")):
        for node in ast.walk(_tree(path)):
            where = f"kernels/{op.name}/{path.name}:{getattr(node, 'lineno', '?')}"
            if _is_jit(node) and path.name != "kernels.py":
                wrong.append(f"{where}: @triton.jit {node.name} outside kernels.py")
            if isinstance(node, ast.ClassDef) and "nn.Module" in _bases(node) and path.name != "module.py":
                wrong.append(f"{where}: nn.Module {node.name} outside module.py")
            if (
                isinstance(node, ast.ClassDef)
                and "torch.autograd.Function" in _bases(node)
                and path.name != "autograd.py"
            ):
                wrong.append(f"{where}: autograd Function {node.name} outside autograd.py")
            if isinstance(node, ast.Attribute) and node.attr == "custom_op" and path.name != "autograd.py":
                wrong.append(f"{where}: custom op outside autograd.py")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("op", OPS, ids=lambda p: p.name)
def test_kernels_import_only_triton_and_the_primitives(op):
    """The kernels are device code: no torch, no launcher, nothing of the host side."""
    imported = set()
    for node in ast.walk(_tree(op / "kernels.py")):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
            imported.add(node.module)
    allowed = {"triton", "triton.language", "featurecache.kernels.primitives"}
    assert imported <= allowed, f"kernels/{op.name}/kernels.py imports {sorted(imported - allowed)}"


@pytest.mark.parametrize("op", OPS, ids=lambda p: p.name)
def test_package_init_only_reexports(op):
    body = _tree(op / "__init__.py").body
    code = [node for node in body if not isinstance(node, (ast.Import, ast.ImportFrom, ast.Expr, ast.Assign))]
    assigned = [
        target.id
        for node in body
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name)
    ]
    assert not code and set(assigned) <= {"__all__"}, (
        f"kernels/{op.name}/__init__.py defines code; it re-exports the parts' names only"
    )
