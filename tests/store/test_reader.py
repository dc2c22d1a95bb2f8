"""StoreReader: fork and spawn workers, shared environments, pickling, errors naming the folder."""

import multiprocessing
import os
import pickle

import numpy as np
import pytest
import torch
import torch.utils.data

from featurecache.config import StoreConfig
from featurecache.store.layout import shard_name
from featurecache.store.reader import StoreReader
from featurecache.store.writer import StoreWriter
from tests.store._cache import (
    assert_record_matches,
    build_cache,
    init_reader_worker,
    random_seed,
    read_in_worker,
    sample_arrays,
)


class _FeatureDataset(torch.utils.data.Dataset):
    def __init__(self, reader: StoreReader, keys: list[str], seed: int):
        self.reader, self.keys, self.seed = reader, keys, seed

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, index: int):
        key = self.keys[index]
        record = self.reader.get_record("features", key)
        assert_record_matches(record, key, self.seed)
        return index, os.getpid(), int(record.arrays["msa"].astype(np.int64).sum())


def test_dataloader_fork_workers_reopen_the_parents_reader(tmp_path):
    seed = random_seed()
    keys = [f"t{i}" for i in range(24)]
    build_cache(tmp_path, keys, seed)
    reader = StoreReader(tmp_path)
    assert_record_matches(reader.get_record("features", keys[0]), keys[0], seed)  # parent opened it
    loader = torch.utils.data.DataLoader(_FeatureDataset(reader, keys, seed), batch_size=None,
                                         num_workers=2, multiprocessing_context="fork")
    seen = {}
    for index, pid, msa_sum in loader:
        seen[int(index)] = int(msa_sum)
        assert int(pid) != os.getpid()
    assert seen == {i: int(sample_arrays(key, seed)["msa"].astype(np.int64).sum()) for i, key in enumerate(keys)}
    # the parent's own handles still work after its children used theirs
    assert_record_matches(reader.get_record("features", keys[-1]), keys[-1], seed)


def test_spawned_workers_read_through_a_pickled_reader(tmp_path):
    # What a spawn DataLoader does with the dataset's reader, without importing torch in the
    # workers (that alone takes seconds per worker on a busy CI machine).
    seed = random_seed()
    keys = [f"t{i}" for i in range(24)]
    build_cache(tmp_path, keys, seed)
    reader = StoreReader(tmp_path)
    reader.get_record("features", keys[0])
    context = multiprocessing.get_context("spawn")
    with context.Pool(2, initializer=init_reader_worker, initargs=(reader,)) as pool:
        results = pool.map(read_in_worker, [(key, seed) for key in keys])
    assert all(pid != os.getpid() for pid, _ in results)
    assert [msa_sum for _, msa_sum in results] == [
        int(sample_arrays(key, seed)["msa"].astype(np.int64).sum()) for key in keys]


def test_readers_in_one_process_share_environments(tmp_path):
    seed = random_seed()
    build_cache(tmp_path, ["a", "b"], seed)
    first, second = StoreReader(tmp_path), StoreReader(tmp_path)
    assert_record_matches(first.get_record("features", "a"), "a", seed)
    assert_record_matches(second.get_record("features", "a"), "a", seed)
    first.close()  # the second reader keeps its environments
    assert_record_matches(second.get_record("features", "b"), "b", seed)
    with pytest.raises(RuntimeError, match="open for reading in this process"):
        StoreWriter(tmp_path, StoreConfig(num_shards=3))
    second.close()
    with StoreWriter(tmp_path, StoreConfig(num_shards=3)) as writer:
        with pytest.raises(RuntimeError, match="open for writing in this process"):
            StoreReader(tmp_path).get("features", "a")
        assert writer.get("features", "a") is not None


def test_reader_pickles_without_handles_and_reopens_after_fork(tmp_path):
    seed = random_seed()
    build_cache(tmp_path, ["a", "b", "c"], seed)
    reader = StoreReader(tmp_path)
    reader.get_record("features", "a")
    clone = pickle.loads(pickle.dumps(reader))
    assert clone._envs == {} and clone.num_shards == reader.num_shards
    assert_record_matches(clone.get_record("features", "b"), "b", seed)
    pid = os.fork()
    if pid == 0:  # child: must not use the parent's handles, and must read correctly
        try:
            record = reader.get_record("features", "c")
            os._exit(0 if record.key == "c" and reader._pid == os.getpid() else 1)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert reader._pid == os.getpid()


def test_reader_errors_name_the_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        StoreReader(tmp_path / "missing")
    with pytest.raises(ValueError, match="has no shard-\\*.lmdb files"):
        StoreReader(tmp_path)
    build_cache(tmp_path / "c", ["a"], random_seed(), num_shards=2)
    (tmp_path / "c" / shard_name(0)).rename(tmp_path / "c" / shard_name(5))
    with pytest.raises(ValueError, match="not numbered 0..1"):
        StoreReader(tmp_path / "c")
