"""Cached data never goes through pickle: not when written, read, verified, published or loaded.

Three checks: (1) the whole cache life cycle runs with every unpickling entry point patched to
fail and a `sys.audit` hook watching for any class an unpickler resolves; (2) a record that
smuggles a pickle in as an object array is refused without running it; (3) the store, loader
and CLI sources contain no pickle, marshal, np.load or torch.load call.
"""

from __future__ import annotations

import ast
import contextlib
import io
import pickle
import re
import sys
import zlib
from pathlib import Path

import msgpack
import numpy as np
import pytest
import torch

import featurecache
from featurecache import CacheDataset, collate
from featurecache.store.codec import CorruptRecordError, decode_record
from featurecache.store.publish import publish
from featurecache.store.reader import StoreReader
from featurecache.store.verify import verify_cache
from featurecache.precompute.pipeline import PrecomputeOptions, precompute
from tests.conftest import copy_sample_structures

PACKAGE = Path(featurecache.__file__).resolve().parent
# The cache's whole data path: codec, shards, manifest, verify, publish, the loader, stats and CLI.
DATA_PATH_SOURCES = sorted((PACKAGE / "store").glob("*.py")) + [
    PACKAGE / "loader.py",
    PACKAGE / "store" / "inspect.py",
    PACKAGE / "cli.py",
]
FORBIDDEN = re.compile(
    r"\bimport\s+(c?pickle|dill|marshal|shelve|joblib)\b|\bfrom\s+(c?pickle|dill|marshal)\b|"
    r"\b(c?pickle|dill|marshal)\.|allow_pickle\s*=\s*True|\bnp\.load\(|\bnumpy\.load\(|"
    r"\btorch\.load\("
)

_watching = {"on": False, "classes": []}


def _audit(event: str, args: tuple) -> None:
    if _watching["on"] and event == "pickle.find_class":
        _watching["classes"].append(args)


sys.addaudithook(_audit)  # audit hooks cannot be removed; this one only records while watching


class _Refused(AssertionError):
    pass


def _refuse(*args, **kwargs):
    raise _Refused("pickle was used on the cache data path")


class _RefusingUnpickler(pickle.Unpickler):
    def __init__(self, *args, **kwargs):
        _refuse()


@contextlib.contextmanager
def _no_unpickling(monkeypatch):
    for module in (pickle, sys.modules.get("_pickle")):
        monkeypatch.setattr(module, "loads", _refuse)
        monkeypatch.setattr(module, "load", _refuse)
    monkeypatch.setattr(pickle, "Unpickler", _RefusingUnpickler)
    monkeypatch.setattr(np, "load", _refuse)
    monkeypatch.setattr(torch, "load", _refuse)
    _watching.update(on=True, classes=[])
    try:
        yield
    finally:
        _watching["on"] = False
    assert _watching["classes"] == [], f"an unpickler resolved {_watching['classes']}"


def test_cache_life_cycle_without_unpickling(tmp_path, shared_data, monkeypatch, reliability_report):
    inputs = copy_sample_structures(("209d-assembly1.cif", "2q2k.cif"), tmp_path / "inputs")
    (inputs / "broken.cif").write_text("not an mmCIF file\n")  # an errors record too
    cache, dest = tmp_path / "cache", tmp_path / "shared"
    with _no_unpickling(monkeypatch):
        summary = precompute(
            PrecomputeOptions(
                inputs=[inputs],
                cache_dir=cache,
                alignments_dir=shared_data / "alignments",
                executor="inline",
                progress=False,
            )
        )
        assert summary.failed == 1 and summary.stages["featurize"].done == 2
        generation = publish(cache, dest)
        assert verify_cache(generation).ok and verify_cache(cache).ok
        with StoreReader(generation) as reader:
            decoded = {
                table: sum(1 for key, blob in reader.items(table) if decode_record(blob, key=key))
                for table in ("features", "msa", "errors")
            }
        dataset = CacheDataset(dest, crop_size=32, msa_rows_per_sample=8)
        batch = collate([dataset[index] for index in range(len(dataset))])
        assert batch["restype"].shape[0] == 2
        dataset.reader.close()
    assert decoded["features"] == 2 and decoded["errors"] == 1 and decoded["msa"] > 0
    reliability_report["no_pickle"] = {
        "summary": (
            f"precompute (2 targets + 1 failing input), publish, verify of the cache and the generation, decoding of "
            f"all {sum(decoded.values())} records and a CacheDataset epoch + collate ran with pickle.load(s), "
            f"pickle.Unpickler, numpy.load and torch.load patched to fail and an audit hook on "
            f"`pickle.find_class`: 0 calls. A record smuggling a pickle as an object array is refused without "
            f"running it, and the store, loader, stats and CLI sources contain no pickle, marshal, np.load or "
            f"torch.load call (the Ray transport between workers and the driver carries records as opaque, "
            f"checksummed bytes)."
        )
    }


_ran = []


class _Payload:
    """Unpickling this object would call _ran.append: the test checks it never happens."""

    def __reduce__(self):
        return (_ran.append, ("unpickled",))


def _blob_with(arrays: dict, key: str = "evil") -> bytes:
    """A record with a valid checksum, built by hand, so nothing in the encoder can refuse it."""
    packer = msgpack.Packer(use_bin_type=True)
    fields = {"format": 1, "schema": 1, "key": key, "fingerprint": "", "input_hash": "", "meta": {}, "arrays": arrays}
    body = (
        packer.pack_map_header(len(fields) + 1)
        + b"".join(packer.pack(name) + packer.pack(value) for name, value in fields.items())
        + packer.pack("checksum")
    )
    return body + b"\xce" + zlib.crc32(body).to_bytes(4, "big")


@pytest.mark.parametrize("dtype", ["|O", "O", "<V8"])
def test_a_record_smuggling_a_pickle_is_refused_unrun(dtype):
    payload = pickle.dumps(np.array([_Payload()], dtype=object))
    blob = _blob_with({"x": {"dtype": dtype, "shape": [1], "codec": "raw", "data": payload}})
    with pytest.raises(CorruptRecordError, match="'evil' is damaged"):
        decode_record(blob, key="evil")
    assert _ran == []
    ext = _blob_with({"x": msgpack.ExtType(42, payload)})
    with pytest.raises(CorruptRecordError, match="ext type 42 is not allowed"):
        decode_record(ext, key="evil")
    assert _ran == []


def test_data_path_sources_never_unpickle():
    offenders = []
    for path in DATA_PATH_SOURCES:
        for number, line in enumerate(io.StringIO(path.read_text()), start=1):
            code = line.split("#", 1)[0]
            if FORBIDDEN.search(code) and not _in_docstring(path, number):
                offenders.append(f"{path.relative_to(PACKAGE.parent)}:{number}: {line.strip()}")
    assert offenders == []


def _in_docstring(path: Path, line_number: int) -> bool:
    """True if the line is inside a docstring (prose may mention pickle)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            if node.lineno <= line_number <= node.end_lineno:
                return True
    return False
