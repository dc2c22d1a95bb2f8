"""Publish finished caches as immutable generations; resolve and garbage-collect them.

A publish root on shared storage looks like::

    DEST/LATEST                                          one line: the current generation's name
    DEST/generations/20261202T110512.123456Z-9b1f03aa/    shard-00000.lmdb ... manifest.json

A generation is built in a hidden temporary folder (compacted shard copies, their checksums,
then its manifest), renamed into place in one step, made read-only, and only then named in
LATEST (replaced atomically). Trainers that opened an older generation keep reading it: nothing
in it is ever changed, and gc never removes the generation LATEST names.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import os
import re
import shutil
import stat
import tempfile
import time
from pathlib import Path

from featurecache.store.files import fsync_dir, fsync_file, write_text_atomic
from featurecache.store.layout import has_shard_files
from featurecache.store.locks import ShardLock
from featurecache.store.manifest import (
    MANIFEST_NAME,
    CacheNotFinishedError,
    check_shard_file,
    read_manifest,
    save_manifest,
    shard_info,
    utc_now,
)
from featurecache.store.reader import readonly_environment
from featurecache.store.update_marker import read_update_marker

LATEST_NAME = "LATEST"
GENERATIONS_DIR = "generations"
GENERATION_NAME = re.compile(r"^\d{8}T\d{6}\.\d{6}Z-[0-9a-f]{8}$")
_TEMP_PREFIX = ".tmp-"
_TRASH_PREFIX = ".trash-"
_READ_ONLY_FILE = 0o444
_READ_ONLY_DIR = 0o555


def publish(cache_dir: str | os.PathLike, dest: str | os.PathLike) -> Path:
    """Seal the finished cache `cache_dir` into a new generation under `dest`; returns its path.

    The cache's shard locks are held while copying, so no writer can change it meanwhile, and
    every shard is checked against the manifest before it is copied. A cache whose update is in
    progress or was interrupted is refused: its records are no longer the last finished state.
    """
    cache_dir, dest = Path(cache_dir), Path(dest)
    manifest = read_manifest(cache_dir)
    _refuse_updating(cache_dir)  # before the locks: a running writer gets this message, not a lock error
    generations = dest / GENERATIONS_DIR
    generations.mkdir(parents=True, exist_ok=True)
    locks = []
    temp_dir = Path(tempfile.mkdtemp(prefix=_TEMP_PREFIX, dir=generations))
    try:
        for shard in manifest.shards:
            locks.append(ShardLock(cache_dir / shard.file))
        _refuse_updating(cache_dir)  # again under the locks: an update may have begun and stopped meanwhile
        shards = []
        for shard in manifest.shards:
            source = cache_dir / shard.file
            problem = check_shard_file(source, shard)
            if problem is not None:
                raise ValueError(f"cannot publish {cache_dir}: shard {source} {problem}; run verify")
            copy = temp_dir / shard.file
            with readonly_environment(source) as env:
                env.copy(str(copy), compact=True)  # drops free pages left by overwrites
            fsync_file(copy)
            os.chmod(copy, _READ_ONLY_FILE)
            shards.append(shard_info(copy, shard.counts))
        content = json.dumps([[shard.sha256 for shard in shards], manifest.fingerprints], sort_keys=True)
        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S.%fZ")
        name = f"{stamp}-{hashlib.sha256(content.encode()).hexdigest()[:8]}"
        sealed = dataclasses.replace(
            manifest,
            shards=tuple(shards),
            generation=name,
            updated=utc_now(),
        )
        save_manifest(sealed, temp_dir)  # last: a generation with a manifest is complete
        os.chmod(temp_dir / MANIFEST_NAME, _READ_ONLY_FILE)
        fsync_dir(temp_dir)
        generation = generations / name
        os.rename(temp_dir, generation)
        os.chmod(generation, _READ_ONLY_DIR)
        fsync_dir(generations)
    except BaseException:
        _remove_tree(temp_dir)
        raise
    finally:
        for lock in locks:
            lock.release()
    write_text_atomic(dest / LATEST_NAME, name + "\n")
    return generation


def _refuse_updating(cache_dir: Path) -> None:
    update = read_update_marker(cache_dir)
    if update is not None:
        raise ValueError(f"cannot publish {cache_dir}: {update.describe()}, then publish")


def latest_generation(dest: str | os.PathLike) -> Path:
    """The generation DEST/LATEST names; raises ValueError if LATEST is missing or dangling."""
    dest = Path(dest)
    latest = dest / LATEST_NAME
    if not latest.is_file():
        raise ValueError(f"{dest} is not a publish root: it has no {LATEST_NAME} file")
    name = latest.read_text(encoding="utf-8").strip()
    if not GENERATION_NAME.match(name):
        raise ValueError(f"{latest} names {name!r}, which is not a generation name")
    generation = dest / GENERATIONS_DIR / name
    if not (generation / MANIFEST_NAME).is_file():
        raise ValueError(f"{latest} names generation {name}, but {generation} has no {MANIFEST_NAME}")
    return generation


def resolve_generation(path: str | os.PathLike) -> Path:
    """The folder to read records from: a finished cache, a generation, or LATEST of a publish root."""
    path = Path(path)
    if (path / MANIFEST_NAME).is_file():
        return path
    if (path / LATEST_NAME).is_file():
        return latest_generation(path)
    if not path.is_dir():
        raise FileNotFoundError(f"cache folder {path} does not exist")
    if has_shard_files(path):
        raise CacheNotFinishedError.for_folder(path)
    raise ValueError(f"{path} is not a cache, a generation or a publish root (no {MANIFEST_NAME} and no {LATEST_NAME})")


def _remove_tree(path: Path) -> None:
    """rmtree that first restores write permission on the read-only generation folders."""
    if not path.exists():
        return
    for directory, _, _ in os.walk(path):
        os.chmod(directory, stat.S_IRWXU)
    shutil.rmtree(path)


def gc(dest: str | os.PathLike, keep: int = 2, stale_temp_seconds: float = 86400.0) -> list[Path]:
    """Remove all but the newest `keep` generations, never the one LATEST names.

    Also removes temporary folders of publishes that died more than `stale_temp_seconds` ago.
    Returns the removed generation folders. Readers that still have a removed generation open
    keep their memory maps; new readers follow LATEST.
    """
    if keep < 1:
        raise ValueError(f"gc keep must be >= 1, got {keep}")
    dest = Path(dest)
    root = dest / GENERATIONS_DIR
    if not root.is_dir():
        raise ValueError(f"{dest} is not a publish root: it has no {GENERATIONS_DIR} folder")
    current = latest_generation(dest).name if (dest / LATEST_NAME).exists() else None
    names = sorted(entry.name for entry in root.iterdir() if GENERATION_NAME.match(entry.name))
    kept = set(names[-keep:]) | {current}
    removed = []
    for name in names:
        if name in kept:
            continue
        # Rename first, so a half-removed folder never looks like a generation.
        trash = root / f"{_TRASH_PREFIX}{name}"
        os.rename(root / name, trash)
        _remove_tree(trash)
        removed.append(root / name)
    now = time.time()
    for entry in root.iterdir():
        leftover = entry.name.startswith(_TRASH_PREFIX) or (
            entry.name.startswith(_TEMP_PREFIX) and now - entry.stat().st_mtime > stale_temp_seconds
        )
        if leftover:
            _remove_tree(entry)
    if removed:
        fsync_dir(root)
    return removed
