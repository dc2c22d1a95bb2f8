"""Every public `forward` of the model and the kernels says the shapes it takes and returns, in
its docstring ("z: [B, N_token, N_token, c_z]"), so a reader need not trace a call to know them."""

from __future__ import annotations

import ast
import pathlib
import re

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "featurecache"
SHAPE = re.compile(r"\[[^\[\]]*,[^\[\]]*\]|\[\.\.\., [^\]]+\]")  # a bracketed list of axes


def public_forwards():
    for path in sorted([*(PACKAGE / "model").rglob("*.py"), *(PACKAGE / "kernels").rglob("*.py")]):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for cls in (node for node in tree.body if isinstance(node, ast.ClassDef) and not node.name.startswith("_")):
            for method in cls.body:
                if isinstance(method, ast.FunctionDef) and method.name == "forward":
                    yield (
                        f"{path.relative_to(PACKAGE.parent)}:{method.lineno} {cls.name}.forward",
                        ast.get_docstring(method) or "",
                    )


def test_the_scan_finds_the_modules():
    names = {where.rsplit(" ", 1)[1] for where, _ in public_forwards()}
    assert {"PairformerBlock.forward", "AF3Model.forward", "LayerNormLinear.forward"} <= names


def test_every_public_forward_documents_its_shapes():
    missing = [where for where, doc in public_forwards() if not SHAPE.search(doc)]
    assert not missing, "forward without the shapes it takes and returns:\n" + "\n".join(missing)


def test_a_docstring_without_shapes_is_caught():
    assert not SHAPE.search("`generator`: the step's, for the dropout seed.")
    assert SHAPE.search("z: [B, N_token, N_token, c_z]") and SHAPE.search("x: [..., dim]")
