"""A leading underscore means "this module's own": no module of the package imports another
module's private name (`from .x import _y`, or `x._y` on an imported module). A helper two
modules share is made public where both can import it (for kernels: kernels/primitives.py).

The one exception is the kernel-op packages' own split (docs/ARCHITECTURE.md, "Where each feature
lives": kernels/<op>/kernels.py holds the private @triton.jit kernels, launch.py the launchers): a
launcher may import a `_..._kernel` from a sibling module of its package.
"""

from __future__ import annotations

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "featurecache"


def _module_name(path: pathlib.Path, package: pathlib.Path) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _source_module(here: str, path: pathlib.Path, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = here.split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    base = package[: len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _package(module: str) -> str:
    return module.rpartition(".")[0]


def private_imports(path: pathlib.Path, package: pathlib.Path = PACKAGE) -> list[str]:
    """'line: what' for each private name this file takes from another module of the package."""
    tree = ast.parse(path.read_text(), filename=str(path))
    here = _module_name(path, package)
    found, imported_modules = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            source = _source_module(here, path, node)
            if not source.startswith("featurecache"):
                continue
            for alias in node.names:
                imported_modules.add(alias.asname or alias.name)
                sanctioned = alias.name.endswith("_kernel") and _package(source) == _package(here)
                if _is_private(alias.name) and source != here and not sanctioned:
                    found.append(f"{node.lineno}: from {source} import {alias.name}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("featurecache"):
                    imported_modules.add(alias.asname or alias.name.split(".")[0])
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and _is_private(node.attr)
            and isinstance(node.value, ast.Name)
            and node.value.id in imported_modules
        ):
            found.append(f"{node.lineno}: {node.value.id}.{node.attr}")
    return found


def test_no_module_imports_another_modules_private_names():
    offenders = [
        f"{path.relative_to(PACKAGE.parent)}:{line}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for line in private_imports(path)
    ]
    assert not offenders, "private names imported across modules:\n" + "\n".join(offenders)


def test_the_check_sees_a_private_import(tmp_path):
    """The scan is not vacuous: a relative and an attribute import of a private name are found;
    a sibling's `_..._kernel` is not."""
    package = tmp_path / "featurecache"
    (package / "kernels").mkdir(parents=True)
    module = package / "kernels" / "conditioned.py"
    module.write_text(
        "from .transition import _chunk, _fwd_kernel\nfrom featurecache.kernels import runtime\nruntime._private()\n"
    )
    assert private_imports(module, package) == [
        "1: from featurecache.kernels.transition import _chunk",
        "3: runtime._private",
    ]
