"""Record codec: every dtype round-trips, every flipped byte is caught, nothing executes code."""

import pickle
import zlib

import msgpack
import numpy as np
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from featurecache.schema import RECORD_FORMAT
from featurecache.store.codec import (
    CorruptRecordError,
    RecordFormatError,
    RowFrames,
    decode_record,
    encode_record,
    pack_plain,
    read_header,
    unpack_plain,
)

DTYPES = [
    np.bool_,
    np.int8,
    np.int16,
    np.int32,
    np.int64,
    np.uint8,
    np.uint16,
    np.uint32,
    np.uint64,
    np.float16,
    np.float32,
    np.float64,
    np.complex64,
    np.complex128,
]


def _random_array(rng, dtype, shape):
    dtype = np.dtype(dtype)
    if dtype.kind == "b":
        return rng.random(shape) < 0.5
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
    values = rng.normal(size=shape) * 1e3
    if dtype.kind == "c":
        values = values + 1j * rng.normal(size=shape)
    return values.astype(dtype)


def _encode(arrays, zstd_level=3, key="7abc_1", meta=None):
    return encode_record(key, arrays, meta or {}, "fp0123", "sha-of-input", 1, zstd_level=zstd_level)


@pytest.mark.parametrize("zstd_level", [0, 3])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_every_dtype_round_trips(dtype, zstd_level):
    rng = np.random.default_rng()
    arrays = {
        "matrix": _random_array(rng, dtype, (37, 11)),
        "scalar": _random_array(rng, dtype, ()),
        "empty": _random_array(rng, dtype, (0, 3)),
        # low entropy so zstd is actually used for it
        "repetitive": np.repeat(_random_array(rng, dtype, (4,)), 500),
    }
    record = decode_record(_encode(arrays, zstd_level), key="7abc_1")
    assert list(record.arrays) == list(arrays)
    for name, value in arrays.items():
        decoded = record.arrays[name]
        assert decoded.dtype == value.dtype and decoded.shape == value.shape, name
        np.testing.assert_array_equal(decoded, value, err_msg=name)


def test_header_fields_and_meta_round_trip():
    meta = {
        "id": "7abc",
        "resolution": 2.1,
        "release_date": None,
        "chain_ids": ["A", "B"],
        "num_tokens": np.int64(12),
        "nested": {"warnings": []},
    }
    blob = encode_record("7abc", {}, meta, "fp", "ih", 3)
    record = decode_record(blob)
    assert (record.key, record.fingerprint, record.input_hash) == ("7abc", "fp", "ih")
    assert record.schema_version == 3 and record.format_version == RECORD_FORMAT
    assert record.meta == {**meta, "num_tokens": 12}
    header = read_header(blob, key="7abc")
    assert header.meta == record.meta and header.array_names == ()


def test_big_endian_and_non_contiguous_inputs_are_normalised():
    rng = np.random.default_rng()
    big = rng.normal(size=(5, 7)).astype(">f8")
    strided = rng.integers(0, 100, size=(9, 8), dtype=np.int32)[::2, ::-3]
    transposed = rng.normal(size=(6, 4)).astype(np.float32).T
    record = decode_record(_encode({"big": big, "strided": strided, "transposed": transposed}))
    assert record.arrays["big"].dtype == np.dtype("<f8")
    np.testing.assert_array_equal(record.arrays["big"], big)
    np.testing.assert_array_equal(record.arrays["strided"], strided)
    np.testing.assert_array_equal(record.arrays["transposed"], transposed)


def test_string_arrays_round_trip():
    arrays = {"names": np.array(["CA", "N", "OXT"]), "codes": np.array([b"HOH", b"MG"])}
    record = decode_record(_encode(arrays))
    np.testing.assert_array_equal(record.arrays["names"], arrays["names"])
    np.testing.assert_array_equal(record.arrays["codes"], arrays["codes"])


def test_decoded_arrays_are_read_only_views():
    record = decode_record(_encode({"x": np.arange(10, dtype=np.int64)}, zstd_level=0))
    assert not record.arrays["x"].flags.writeable
    with pytest.raises(ValueError):
        record.arrays["x"][0] = 1


def test_compression_applies_to_compressible_arrays_only():
    rng = np.random.default_rng()
    compressible = {"msa": np.zeros((512, 300), dtype=np.int8)}
    noise = {"pos": rng.normal(size=(2000, 3)).astype(np.float32)}
    assert len(_encode(compressible, 3)) < compressible["msa"].nbytes // 20
    assert len(_encode(noise, 3)) == len(_encode(noise, 0))


@pytest.mark.parametrize(
    "bad", [np.array([object()]), np.zeros(2, dtype="V8"), np.array(["2020-01-01"], dtype="datetime64[D]")]
)
def test_unsupported_dtypes_are_refused_by_name(bad):
    with pytest.raises(ValueError, match="array 'bad' has dtype"):
        _encode({"bad": bad})


def test_meta_must_be_plain():
    with pytest.raises(ValueError, match="meta cannot be stored"):
        encode_record("k", {}, {"when": object()}, "fp", "ih", 1)


def test_every_single_byte_flip_is_detected():
    rng = np.random.default_rng()
    arrays = {
        "msa": rng.integers(0, 32, size=(8, 20), dtype=np.int8),
        "pos": rng.normal(size=(20, 3)).astype(np.float32),
    }
    blob = _encode(arrays, zstd_level=0, meta={"id": "7abc_1"})
    for position in range(len(blob)):
        damaged = bytearray(blob)
        damaged[position] ^= int(rng.integers(1, 256))
        with pytest.raises(CorruptRecordError) as caught:
            decode_record(bytes(damaged), where="shard-00002.lmdb/features", key="7abc_1")
        assert caught.value.key == "7abc_1" and caught.value.where == "shard-00002.lmdb/features"
        assert "shard-00002.lmdb/features: record '7abc_1' is damaged" in str(caught.value)


def test_truncated_and_empty_blobs_are_corrupt():
    blob = _encode({"x": np.arange(100)})
    for damaged in (b"", blob[:3], blob[:-1], blob[1:]):
        with pytest.raises(CorruptRecordError):
            decode_record(damaged)


def _blob_from_fields(fields: dict) -> bytes:
    """A blob with a valid checksum around arbitrary fields, laid out as encode_record does."""
    packer = msgpack.Packer(use_bin_type=True)
    body = packer.pack_map_header(len(fields) + 1)
    body += b"".join(packer.pack(name) + packer.pack(value) for name, value in fields.items())
    body += packer.pack("checksum")
    return body + b"\xce" + zlib.crc32(body).to_bytes(4, "big")


def _fields(blob: bytes) -> dict:
    fields = msgpack.unpackb(blob, raw=False)
    del fields["checksum"]
    return fields


def test_valid_checksum_but_wrong_structure_is_reported():
    fields = _fields(_encode({"x": np.arange(6, dtype=np.int16)}, zstd_level=0))
    assert decode_record(_blob_from_fields(fields)).arrays["x"].tolist() == list(range(6))
    broken = [
        ({k: v for k, v in fields.items() if k != "fingerprint"}, "missing record header fields"),
        ({**fields, "arrays": {"x": {**fields["arrays"]["x"], "shape": [7]}}}, "has 12 bytes"),
        ({**fields, "arrays": {"x": {**fields["arrays"]["x"], "dtype": "|O"}}}, "has dtype '|O'"),
        ({**fields, "arrays": {"x": {**fields["arrays"]["x"], "codec": "lz4"}}}, "unknown codec 'lz4'"),
        ({**fields, "arrays": {"x": {**fields["arrays"]["x"], "codec": "zstd"}}}, "array 'x'"),
        ({**fields, "meta": [1, 2]}, "arrays or meta is not a map"),
    ]
    for damaged, reason in broken:
        with pytest.raises(CorruptRecordError, match=reason):
            decode_record(_blob_from_fields(damaged), where="cache/shard-00001.lmdb")


def test_key_mismatch_and_other_format_are_reported():
    blob = _encode({}, key="a")
    with pytest.raises(CorruptRecordError, match="stored under 'b' but names 'a'"):
        decode_record(blob, key="b")
    newer = _blob_from_fields({**_fields(blob), "format": RECORD_FORMAT + 1})
    with pytest.raises(RecordFormatError, match=f"has format {RECORD_FORMAT + 1}, expected {RECORD_FORMAT}"):
        decode_record(newer, where="cache/shard-00000.lmdb")


def test_nothing_executes_code_on_load():
    # A pickle payload stored as array bytes stays bytes: decoding never unpickles.
    payload = pickle.dumps(print)
    record = decode_record(_encode({"x": np.frombuffer(payload, dtype=np.uint8)}))
    assert record.arrays["x"].tobytes() == payload
    ext = msgpack.packb(msgpack.ExtType(5, b"boom"))
    with pytest.raises(ValueError, match="ext type 5"):
        unpack_plain(ext)
    assert unpack_plain(pack_plain({"a": [1, None, "x"]})) == {"a": [1, None, "x"]}


@settings(max_examples=60, deadline=None)
@given(
    value=hnp.arrays(
        dtype=st.one_of(
            hnp.integer_dtypes(endianness="="),
            hnp.unsigned_integer_dtypes(endianness="="),
            hnp.floating_dtypes(endianness="="),
            hnp.boolean_dtypes(),
            hnp.integer_dtypes(endianness=">"),
            hnp.floating_dtypes(endianness=">"),
        ),
        shape=hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=9),
    ),
    zstd_level=st.sampled_from([0, 1, 3]),
)
def test_hypothesis_round_trip(value, zstd_level):
    decoded = decode_record(_encode({"value": value}, zstd_level)).arrays["value"]
    assert decoded.shape == value.shape
    assert decoded.dtype == value.dtype.newbyteorder("<")
    assert decoded.tobytes() == value.astype(decoded.dtype).tobytes()  # bitwise, NaN included


def _msa_like_block(rows: int, width: int, seed: int) -> np.ndarray:
    """Rows that share most columns with a query, as an MSA's rows do (random rows would not
    train a zstd dictionary)."""
    generator = np.random.default_rng(seed)
    query = generator.integers(0, 20, size=width)
    changed = generator.random((rows, width)) < 0.3
    return np.where(changed, generator.integers(0, 32, size=(rows, width)), query).astype(np.int8)


def test_row_framed_arrays_decode_only_the_rows_asked_for():
    block = _msa_like_block(3001, 97, seed=1)  # 3001: the last 4-row frame holds one row
    blob = _encode({"msa_block": block, "other": np.arange(10)})
    assert _fields(blob)["arrays"]["msa_block"]["codec"] == "zstd-rows"
    lazy = decode_record(blob, lazy_rows=True).arrays["msa_block"]
    assert isinstance(lazy, RowFrames) and lazy.shape == block.shape and lazy.dtype == block.dtype
    rows = np.array([3000, 0, 5, 5, 1234, 2999])  # any order, repeats, the short last frame
    np.testing.assert_array_equal(lazy[rows], block[rows])
    np.testing.assert_array_equal(np.asarray(lazy), block)
    np.testing.assert_array_equal(decode_record(blob).arrays["msa_block"], block)  # eager by default
    with pytest.raises(IndexError, match="out of range"):
        lazy[np.array([3001])]
    small = _msa_like_block(5, 7, seed=2)  # too small to frame: stored whole
    assert _fields(_encode({"msa_block": small}))["arrays"]["msa_block"]["codec"] != "zstd-rows"


def test_damaged_row_frames_are_reported():
    block = _msa_like_block(2000, 64, seed=3)
    fields = _fields(_encode({"msa_block": block}))
    spec = fields["arrays"]["msa_block"]
    ends = np.cumsum(np.frombuffer(zstandard.ZstdDecompressor().decompress(spec["frame_sizes"]), dtype="<u4"))
    data = bytearray(spec["data"])
    data[int(ends[10]) + 3] ^= 0xFF  # inside frame 11 (rows 44..47); the record's CRC recomputed
    damaged = _blob_from_fields({**fields, "arrays": {"msa_block": {**spec, "data": bytes(data)}}})
    lazy = decode_record(damaged, lazy_rows=True).arrays["msa_block"]
    np.testing.assert_array_equal(lazy[np.arange(40)], block[:40])  # other frames still read
    with pytest.raises(CorruptRecordError, match="msa_block"):
        lazy[np.array([45])]
    with pytest.raises(CorruptRecordError, match="msa_block"):
        decode_record(damaged)  # verify's full decode finds it
    for bad_sizes in (ends[:-1], ends[:-1] + 1):  # a frame missing; a frame size off by one
        sizes = np.diff(bad_sizes, prepend=0).astype("<u4").tobytes()
        bad = {**spec, "frame_sizes": zstandard.ZstdCompressor().compress(sizes)}
        with pytest.raises(CorruptRecordError, match="frame sizes"):
            decode_record(_blob_from_fields({**fields, "arrays": {"msa_block": bad}}))
