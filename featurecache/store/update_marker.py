"""update-in-progress.json: marks a finished cache that a writer is changing (or was, until killed).

An update keeps the last finished manifest.json in place until its new manifest replaces it
atomically, so readers keep reading the cache throughout: the manifest lists the targets, and
each record they read is the old version or the new one, whole (records are replaced one
transaction at a time, and every record carries a CRC). What the old manifest no longer
describes are the shard files (size, sha256, counts) and the records the update deleted; the
marker says so, for `verify`, `stats` and `publish`:

    {"format": 1, "pid": 4242, "host": "node7", "started": "2026-12-02T11:00:00+00:00",
     "interrupted": false, "manifest_sha256": "9b1f...", "deleted": {"errors": ["parse/x"]}}

`deleted` lists the keys of the old manifest's index that the update deleted; it is written
before the deletion commits. `manifest_sha256` is the hash of the manifest the marker was
written over: a finish killed after writing its new manifest but before removing the marker
leaves a marker that no longer applies, and readers ignore it. StoreWriter writes the marker
when it opens a finished cache (holding every shard lock), marks it interrupted when it closes
without finishing, and removes it after the new manifest is in place. A new cache (no manifest
yet) gets no marker: it stays unreadable until its first finish.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path

from featurecache.config import file_sha256
from featurecache.store.files import fsync_dir, write_text_atomic
from featurecache.store.manifest import MANIFEST_NAME, utc_now

MARKER_NAME = "update-in-progress.json"
MARKER_FORMAT = 1


@dataclass(frozen=True)
class UpdateMarker:
    path: Path
    pid: int
    host: str
    started: str
    manifest_sha256: str  # of the last finished manifest, which the update will replace
    interrupted: bool = False  # the writer closed without finishing (Ctrl-C, an error)
    deleted: dict[str, list[str]] = field(default_factory=dict)  # table -> keys deleted

    @property
    def state(self) -> str:
        """'interrupted', 'in progress', or (a writer on another host) 'in progress or interrupted'."""
        if self.interrupted:
            return "interrupted"
        if self.host != socket.gethostname():
            return "in progress or interrupted"
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return "interrupted"  # killed (kill -9, a crash, a lost machine)
        except PermissionError:
            pass  # alive, another user's
        return "in progress"

    def describe(self) -> str:
        """One line: what is going on and what the last finished manifest still means."""
        return (
            f"update {self.state} (pid {self.pid} on {self.host}, started {self.started}): "
            f"the last finished manifest still lists the records, but its shard sizes, checksums and "
            f"counts no longer apply; rerun precompute to finish the update"
        )

    def was_deleted(self, table: str, key: str) -> bool:
        return key in self.deleted.get(table, ())

    def to_json(self) -> dict:
        data = dataclasses.asdict(self)
        del data["path"]
        return {"format": MARKER_FORMAT, **data}


def _save(marker: UpdateMarker) -> UpdateMarker:
    write_text_atomic(marker.path, json.dumps(marker.to_json(), indent=1, sort_keys=True) + "\n")
    return marker


def _parse(path: Path) -> UpdateMarker:
    problem = f"{path} is damaged; remove it if no update of this cache is running"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{problem} ({error})") from None
    if not isinstance(data, dict) or data.get("format") != MARKER_FORMAT:
        raise ValueError(f"{problem} (not a format {MARKER_FORMAT} update marker)")
    try:
        deleted = {str(table): [str(key) for key in keys] for table, keys in data["deleted"].items()}
        return UpdateMarker(
            path=path,
            pid=int(data["pid"]),
            host=str(data["host"]),
            started=str(data["started"]),
            manifest_sha256=str(data["manifest_sha256"]),
            interrupted=bool(data["interrupted"]),
            deleted=deleted,
        )
    except KeyError as error:
        raise ValueError(f"{problem} (no field {error})") from None
    except (TypeError, ValueError, AttributeError) as error:
        raise ValueError(f"{problem} ({error})") from None


def _manifest_sha256(cache_dir: Path) -> str | None:
    try:
        return file_sha256(cache_dir / MANIFEST_NAME)
    except FileNotFoundError:
        return None


def read_update_marker(cache_dir: str | os.PathLike) -> UpdateMarker | None:
    """The marker of an update in progress or interrupted; None if there is none (or it is stale).

    ValueError names a damaged marker file.
    """
    path = Path(cache_dir) / MARKER_NAME
    if not path.is_file():
        return None
    marker = _parse(path)
    if marker.manifest_sha256 != _manifest_sha256(Path(cache_dir)):
        return None  # left by a finish killed after its new manifest was written
    return marker


def begin_update(cache_dir: str | os.PathLike) -> UpdateMarker | None:
    """Mark a finished cache as being updated by this process; None for a cache never finished.

    Call holding every shard lock. An interrupted update's marker is taken over: the records it
    deleted are still gone, so its `deleted` list carries over.
    """
    cache_dir = Path(cache_dir)
    manifest_sha256 = _manifest_sha256(cache_dir)
    previous = read_update_marker(cache_dir)
    if manifest_sha256 is None:
        end_update(cache_dir)  # a marker without a manifest means nothing
        return None
    return _save(
        UpdateMarker(
            path=cache_dir / MARKER_NAME,
            pid=os.getpid(),
            host=socket.gethostname(),
            started=utc_now(),
            manifest_sha256=manifest_sha256,
            deleted=previous.deleted if previous is not None else {},
        )
    )


def record_deleted(marker: UpdateMarker, table: str, key: str) -> UpdateMarker:
    """The marker with (table, key) added to its deleted records, durably (before the delete commits)."""
    if marker.was_deleted(table, key):
        return marker
    deleted = {**marker.deleted, table: [*marker.deleted.get(table, ()), key]}
    return _save(dataclasses.replace(marker, deleted=deleted))


def mark_interrupted(marker: UpdateMarker) -> UpdateMarker:
    return _save(dataclasses.replace(marker, interrupted=True))


def end_update(cache_dir: str | os.PathLike) -> None:
    """Remove the marker (after the new manifest is in place)."""
    path = Path(cache_dir) / MARKER_NAME
    if path.exists():
        path.unlink()
        fsync_dir(path.parent)
