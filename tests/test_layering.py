"""The package's layers only point down (docs/ARCHITECTURE.md, "Layers").

Every `import featurecache...` in every module — at the top or inside a function, since a lazy
import is still a dependency — is checked against the layer table below, and the module import
graph must have no cycles. A new module that fits no layer fails here until it is given one.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "featurecache"

# layer -> module name prefixes (longest match wins)
LAYERS = {
    "base": ("featurecache.schema", "featurecache.config", "featurecache.errors"),
    "io": ("featurecache.io",),
    "chem": ("featurecache.chem",),
    "features": ("featurecache.features",),
    "store": ("featurecache.store",),
    "precompute": ("featurecache.precompute",),
    "loader": ("featurecache.loader", "featurecache.online", "featurecache.sampler", "featurecache.export"),
    "kernels": ("featurecache.kernels",),
    "model": ("featurecache.model",),
    "training": ("featurecache.training",),
    "prediction": ("featurecache.prediction",),
    "integrations": ("featurecache.integrations",),
    "testing": ("featurecache.testing",),
    "top": ("featurecache.cli", "featurecache.train", "featurecache.__main__", "featurecache"),
}

# layer -> layers it may import (itself always allowed)
ALLOWED = {
    "base": set(),
    "io": {"base", "chem"},
    "chem": {"base"},
    "features": {"base", "io", "chem"},
    "store": {"base"},
    "precompute": {"base", "io", "chem", "features", "store"},
    "loader": {"base", "io", "chem", "features", "store"},
    "kernels": set(),
    "model": {"base", "kernels"},
    "training": {"base", "io", "store", "loader", "kernels", "model"},
    "prediction": {"base", "io", "chem", "store", "loader", "kernels", "model", "training"},
    "integrations": {"base", "io", "chem", "features", "store", "loader", "kernels", "model", "training", "prediction"},
    "testing": {
        "base",
        "io",
        "chem",
        "features",
        "store",
        "precompute",
        "loader",
        "kernels",
        "model",
        "training",
        "prediction",
        "integrations",
    },
    "top": {
        "base",
        "io",
        "chem",
        "features",
        "store",
        "precompute",
        "loader",
        "kernels",
        "model",
        "training",
        "prediction",
        "integrations",
    },
}


# The model layer's rooms (docs/ARCHITECTURE.md, "The model's rooms"): room -> module name
# prefixes, and room -> rooms it may import. The network never imports its objectives (losses
# read the network's outputs, not the other way round); AF3Model (af3.py) assembles both.
MODEL_ROOMS = {
    "config": ("featurecache.model.config",),
    "network": ("featurecache.model.network",),
    "objectives": ("featurecache.model.objectives",),
    "parallel": ("featurecache.model.parallel",),
    "assembly": ("featurecache.model.af3", "featurecache.model"),
}
MODEL_ROOMS_ALLOWED = {
    "config": set(),
    "network": {"config"},
    "objectives": {"config", "network"},
    "parallel": {"config", "network"},
    "assembly": {"config", "network", "objectives"},
}


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def room_of(module: str, rooms: dict[str, tuple[str, ...]]) -> str | None:
    """The room whose longest prefix names the module, None for none."""
    best, best_len = None, -1
    for room, prefixes in rooms.items():
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best_len:
                best, best_len = room, len(prefix)
    return best


def layer_of(module: str) -> str:
    layer = room_of(module, LAYERS)
    assert layer is not None, f"{module} belongs to no layer: add it to LAYERS in tests/test_layering.py"
    return layer


def imported_modules(path: pathlib.Path) -> set[str]:
    """featurecache modules imported anywhere in the file (relative imports resolved)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    here = module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            # `from featurecache.x import y` imports the submodule y when there is one, else x
            submodules = {f"{origin}.{alias.name}" for alias in node.names}
            submodules = {m for m in submodules if m.startswith("featurecache.") and _exists(m)}
            found.update(submodules if len(submodules) == len(node.names) else submodules | {origin})
    modules = {m for m in found if m == "featurecache" or m.startswith("featurecache.")}
    return {m for m in modules if _exists(m)} | ({"featurecache"} & modules)


def _exists(module: str) -> bool:
    relative = pathlib.Path(*module.split(".")[1:])
    return (PACKAGE / relative).with_suffix(".py").is_file() or (PACKAGE / relative / "__init__.py").is_file()


SOURCES = sorted(PACKAGE.rglob("*.py"))


def test_every_module_has_a_layer():
    for path in SOURCES:
        layer_of(module_name(path))


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE.parent)))
def test_imports_point_down(path):
    here = module_name(path)
    layer = layer_of(here)
    wrong = []
    for module in sorted(imported_modules(path)):
        if module == "featurecache":
            if layer != "top":
                wrong.append(f"{module} (the package root re-exports the loader)")
            continue
        target = layer_of(module)
        if target != layer and target not in ALLOWED[layer]:
            wrong.append(f"{module} ({target})")
    assert not wrong, f"{here} ({layer}) imports a layer it must not: {', '.join(wrong)}"


MODEL_SOURCES = [path for path in SOURCES if layer_of(module_name(path)) == "model"]


@pytest.mark.parametrize("path", MODEL_SOURCES, ids=lambda p: str(p.relative_to(PACKAGE.parent)))
def test_model_rooms_point_down(path):
    here = module_name(path)
    room = room_of(here, MODEL_ROOMS)
    assert room is not None, f"{here} belongs to no room of the model: add it to MODEL_ROOMS"
    wrong = []
    for module in sorted(imported_modules(path)):
        target = room_of(module, MODEL_ROOMS) if layer_of(module) == "model" else None
        if target is not None and target != room and target not in MODEL_ROOMS_ALLOWED[room]:
            wrong.append(f"{module} ({target})")
    assert not wrong, f"{here} (model/{room}) imports a room of the model it must not: {', '.join(wrong)}"


def test_no_import_by_string():
    """Every import is a statement this test (and any static tool) can follow: no
    importlib.import_module or __import__ with a computed name."""
    found = []
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.Call):
                called = ast.unparse(node.func)
                if called.endswith("import_module") or called == "__import__":
                    found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {called}")
            elif isinstance(node, (ast.Import, ast.ImportFrom)) and any(
                alias.name == "import_module" or (alias.name == "importlib" and isinstance(node, ast.Import))
                for alias in node.names
            ):
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: imports importlib")
    assert not found, "imports by string:\n" + "\n".join(found)


def test_nothing_at_run_time_imports_the_test_builders():
    for path in SOURCES:
        here = module_name(path)
        if layer_of(here) == "testing":
            continue
        testing = [m for m in imported_modules(path) if layer_of(m) == "testing"]
        assert not testing, f"{here} imports {testing}: featurecache.testing is for tests and benchmarks only"


def test_no_import_cycles():
    graph = {module_name(path): imported_modules(path) - {module_name(path)} for path in SOURCES}
    # a package's __init__ re-exporting its own submodules is not a dependency of those submodules
    for module, targets in graph.items():
        graph[module] = {t for t in targets if not (module.startswith(t + ".") and t in graph)}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                cycle = stack[stack.index(target) :] + [target]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if target not in state:
                visit(target)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
