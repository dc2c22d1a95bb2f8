"""Updating a finished cache: the last manifest stays readable until the new one replaces it.

tests/reliability/test_interrupted_update.py kills real precompute updates while readers read;
these pin each step of the lifecycle on small caches.
"""

import json
import os
import signal
import subprocess
import sys

import pytest

from featurecache.config import StoreConfig
from featurecache.store.codec import encode_record
from featurecache.store.inspect import cache_stats, format_stats
from featurecache.store.manifest import CacheNotFinishedError, read_manifest
from featurecache.store.publish import publish
from featurecache.store.update_marker import MARKER_NAME, read_update_marker
from featurecache.store.verify import verify_cache
from featurecache.store.writer import StoreWriter
from tests.store._cache import build_cache, child_env, random_seed, sample_blob

NUM_SHARDS = 3
CONFIG = StoreConfig(num_shards=NUM_SHARDS, batch_records=4)


def _state_in_child(cache_dir) -> dict:
    """cache_state (tests/store/_cache.py) read by another process, as a trainer would."""
    code = "import json, sys\nfrom tests.store._cache import cache_state\nprint(json.dumps(cache_state(sys.argv[1])))"
    result = subprocess.run(
        [sys.executable, "-c", code, str(cache_dir)], capture_output=True, text=True, env=child_env(), timeout=120
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def _verify_in_child(cache_dir) -> dict:
    code = (
        "import json, sys\nfrom featurecache.store.verify import verify_cache\n"
        "print(json.dumps(verify_cache(sys.argv[1]).to_dict()))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(cache_dir)], capture_output=True, text=True, env=child_env(), timeout=120
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def _error_blob(key: str) -> bytes:
    return encode_record(key, {}, {"stage": "parse", "key": key, "message": "bad input", "attempts": 1}, "", "", 1, 0)


def test_readers_keep_the_last_finished_state_until_finish_replaces_it(tmp_path):
    old_seed, new_seed = random_seed(), random_seed() + (1 << 30)
    keys = [f"t{i}" for i in range(10)]
    first = build_cache(tmp_path, keys, old_seed, num_shards=NUM_SHARDS)
    with StoreWriter(tmp_path, CONFIG) as writer:
        marker = read_update_marker(tmp_path)
        assert marker.pid == os.getpid() and marker.state == "in progress" and not marker.interrupted
        for key in [*keys[:5], "t10"]:  # five records replaced, one added
            blob, index = sample_blob(key, new_seed)
            writer.put("features", key, blob, index=index)
        writer.flush()
        seen = _state_in_child(tmp_path)
        assert seen["fingerprints"] == {"seed": str(old_seed)} and sorted(seen["seeds"]) == sorted(keys)
        assert seen["seeds"] == {key: new_seed if key in keys[:5] else old_seed for key in keys}
        report = _verify_in_child(tmp_path)
        assert report["ok"] and report["records_checked"]["features"] == 11, report
        assert report["update"].startswith("update in progress (pid"), report
        second = writer.finish(fingerprints={"seed": str(new_seed)})
    assert not (tmp_path / MARKER_NAME).exists() and read_update_marker(tmp_path) is None
    assert read_manifest(tmp_path) == second and second.created == first.created
    assert sorted(second.targets) == sorted([*keys, "t10"])
    report = verify_cache(tmp_path)
    assert report.ok and report.update is None and "note" not in report.format(), report.format()


def test_an_interrupted_update_keeps_the_last_manifest_and_says_so(tmp_path):
    old_seed, new_seed = random_seed(), random_seed() + (1 << 30)
    keys = [f"t{i}" for i in range(8)]
    first = build_cache(tmp_path, keys, old_seed, num_shards=NUM_SHARDS)
    with pytest.raises(KeyboardInterrupt):
        with StoreWriter(tmp_path, CONFIG) as writer:
            for key in keys[:6]:
                writer.put("features", key, *sample_blob(key, new_seed))
            raise KeyboardInterrupt  # Ctrl-C: the queued records commit, the manifest stays
    assert read_manifest(tmp_path) == first
    marker = read_update_marker(tmp_path)
    assert marker.interrupted and marker.state == "interrupted"
    report = verify_cache(tmp_path)
    assert report.ok and report.shard_problems == [], report.format()
    assert report.records_checked["features"] == len(keys)
    assert "note: update interrupted (pid" in report.format() and report.format().endswith("OK")
    stats = cache_stats(tmp_path)
    assert stats["update"].startswith("update interrupted") and stats["counts"]["features"] == len(keys)
    assert "note         update interrupted" in format_stats(stats)
    with pytest.raises(ValueError, match="cannot publish .*update interrupted.*rerun precompute"):
        publish(tmp_path, tmp_path / "shared")
    assert _state_in_child(tmp_path)["seeds"] == {key: new_seed if key in keys[:6] else old_seed for key in keys}

    with StoreWriter(tmp_path, CONFIG) as writer:  # the rerun takes the marker over and finishes
        assert read_update_marker(tmp_path).state == "in progress"
        second = writer.finish(fingerprints={"seed": str(new_seed)})
    assert read_update_marker(tmp_path) is None and read_manifest(tmp_path) == second
    assert verify_cache(tmp_path).update is None and publish(tmp_path, tmp_path / "shared").is_dir()


def test_a_record_the_last_manifest_lists_is_noted_before_its_deletion_commits(tmp_path):
    seed = random_seed()
    with StoreWriter(tmp_path, CONFIG) as writer:
        for key in ("a", "b"):
            writer.put("features", key, *sample_blob(key, seed))
        for key in ("parse/x", "parse/y"):
            writer.put("errors", key, _error_blob(key), index={"stage": "parse", "attempts": 1})
        writer.finish()
    with StoreWriter(tmp_path, CONFIG) as writer:
        writer.put("errors", "parse/new", _error_blob("parse/new"))
        writer.delete("errors", "parse/new")  # not in the last manifest: nothing to note
        writer.delete("errors", "parse/x")
        # noted at once, while the deletion is still queued
        assert read_update_marker(tmp_path).deleted == {"errors": ["parse/x"]}
    report = verify_cache(tmp_path)
    assert report.ok and report.records_checked["errors"] == 1 and report.update is not None, report.format()
    with StoreWriter(tmp_path, CONFIG) as writer:  # a second interrupted run: the note carries over
        writer.delete("errors", "parse/y")
    assert read_update_marker(tmp_path).deleted == {"errors": ["parse/x", "parse/y"]}
    assert verify_cache(tmp_path).ok
    (tmp_path / MARKER_NAME).unlink()  # without the note, the same state is damage
    assert {record.key for record in verify_cache(tmp_path).damaged} == {"parse/x", "parse/y"}


def test_a_marker_left_by_a_finish_killed_after_its_manifest_is_ignored(tmp_path):
    seed = random_seed()
    build_cache(tmp_path, ["a", "b", "c"], seed, num_shards=NUM_SHARDS)
    with StoreWriter(tmp_path, CONFIG) as writer:
        writer.put("features", "d", *sample_blob("d", seed))
        left = (tmp_path / MARKER_NAME).read_text()
        writer.finish()
    (tmp_path / MARKER_NAME).write_text(left)  # as if killed between the manifest and the marker removal
    assert read_update_marker(tmp_path) is None
    report = verify_cache(tmp_path)
    assert report.ok and report.update is None, report.format()
    with StoreWriter(tmp_path, CONFIG):
        assert (
            json.loads((tmp_path / MARKER_NAME).read_text())["manifest_sha256"] != json.loads(left)["manifest_sha256"]
        )


def test_a_new_cache_gets_no_marker_and_stays_unfinished(tmp_path):
    with StoreWriter(tmp_path, CONFIG) as writer:
        writer.put("features", "a", sample_blob("a", random_seed())[0])
    assert not (tmp_path / MARKER_NAME).exists()
    with pytest.raises(CacheNotFinishedError, match="not finished"):
        read_manifest(tmp_path)


_UPDATE_THEN_WAIT = r"""
import sys, time
from featurecache.config import StoreConfig
from featurecache.store.writer import StoreWriter
from tests.store._cache import sample_blob

writer = StoreWriter(sys.argv[1], StoreConfig(num_shards=3, batch_records=1))
writer.put("features", "a", *sample_blob("a", int(sys.argv[2])))
print("written", flush=True)
time.sleep(600)
"""


def test_a_killed_update_is_reported_as_interrupted(tmp_path):
    old_seed, new_seed = random_seed(), random_seed() + (1 << 30)
    first = build_cache(tmp_path, ["a", "b", "c"], old_seed, num_shards=NUM_SHARDS)
    child = subprocess.Popen(
        [sys.executable, "-c", _UPDATE_THEN_WAIT, str(tmp_path), str(new_seed)],
        stdout=subprocess.PIPE,
        text=True,
        env=child_env(),
    )
    try:
        assert child.stdout.readline().strip() == "written"
        assert read_update_marker(tmp_path).state == "in progress"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
        child.stdout.close()
    marker = read_update_marker(tmp_path)
    assert marker.pid == child.pid and not marker.interrupted and marker.state == "interrupted"
    assert read_manifest(tmp_path) == first
    report = verify_cache(tmp_path)
    assert report.ok and report.update.startswith(f"update interrupted (pid {child.pid}"), report.format()
    assert _state_in_child(tmp_path)["seeds"] == {"a": new_seed, "b": old_seed, "c": old_seed}


def test_a_damaged_marker_is_named(tmp_path):
    build_cache(tmp_path, ["a"], random_seed(), num_shards=1)
    (tmp_path / MARKER_NAME).write_text('{"format": 1, "pid": ')
    with pytest.raises(ValueError, match=f"{MARKER_NAME} is damaged; remove it if no update"):
        verify_cache(tmp_path)
    (tmp_path / MARKER_NAME).write_text('{"format": 1, "pid": 12, "deleted": {}}')
    with pytest.raises(ValueError, match=f"{MARKER_NAME} is damaged.*no field 'host'"):
        StoreWriter(tmp_path, StoreConfig(num_shards=1))
