"""Record codec: named numpy arrays + a small header, as one checksummed msgpack map.

A record is a msgpack map with these entries, always in this order::

    format       RECORD_FORMAT (featurecache.schema): version of this byte layout
    schema       schema version of the arrays (featurecache.schema.SCHEMA_VERSION)
    key          the record's key (target id, sequence hash, ...)
    fingerprint  fingerprint of everything that produced the record
    input_hash   hash of the input it was computed from
    meta         plain msgpack map (str keys; str, int, float, bool, None, list, map values)
    arrays       {name: {"dtype": "<f4", "shape": [...], "codec": "raw" | "zstd" | "zstd-rows", "data": bin}}
    checksum     CRC-32 of every byte before it, always encoded as msgpack uint32 (5 bytes)

The checksum is the last entry with a fixed-width encoding, so it covers every byte of the
blob before its own 5 bytes and a reader checks it before parsing anything. CRC-32 detects
every error burst up to 32 bits (so every single flipped byte) and runs at 2.3 GB/s here,
against 0.7 GB/s for blake2b (64 MiB buffer, 2026-12-02); it guards against storage and copy
errors, not against deliberate tampering.

Arrays named in schema.ROW_FRAMED (the MSA's stored rows) use codec "zstd-rows" when they are
big enough: "data" holds independent zstd frames of `rows_per_frame` rows each, back to back,
"frame_sizes" each frame's byte count (uint32, itself zstd-compressed), "dictionary" the zstd
dictionary trained on them (frames of a few hundred bytes compress poorly alone). decode_record(lazy_rows=True) returns
such an array as a RowFrames, which decodes only the frames holding the rows it is indexed
with; every other caller gets it whole.

Array bytes are stored little-endian and C-ordered; decoded arrays are read-only views over
the unpacked bytes (np.frombuffer, no further copy). Nothing here can execute code on load:
no pickle, msgpack ext types are refused, and dtypes are limited to plain numeric and string
kinds.
"""

from __future__ import annotations

import math
import threading
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np
import zstandard

from featurecache.schema import RECORD_FORMAT, ROW_FRAMED

CODEC_RAW = "raw"
CODEC_ZSTD = "zstd"
CODEC_ZSTD_ROWS = "zstd-rows"

# b: bool, i/u: integers, f: floats, c: complex, S/U: fixed-width bytes / unicode.
ALLOWED_DTYPE_KINDS = frozenset("biufcSU")

# Arrays smaller than this are stored raw: a zstd frame header alone is ~10 bytes and the
# decompressor call costs more than copying a few hundred bytes.
_MIN_COMPRESS_BYTES = 256
# Keep zstd output only if it saves at least this fraction; float coordinates barely
# compress, and decompressing them would cost time on every load for ~nothing.
_MIN_COMPRESS_SAVING = 0.1

# Row-framed arrays below this size are stored whole: decoding them whole costs microseconds.
_MIN_FRAMED_BYTES = 64 * 1024
# Frames are small, so they are compressed hard (level 19 writes ~8 % fewer bytes than 9 for
# the same decode speed; ~0.5 s a 15k-row MSA at precompute) against a trained dictionary.
_FRAME_LEVEL = 19
_FRAME_DICTIONARY_BYTES = 16 * 1024  # 8 to 110 KiB: within 3 % of the bytes for 15k rows
_DICTIONARY_SAMPLES = 1000

_CHECKSUM_KEY = msgpack.packb("checksum")
_UINT32_MARKER = 0xCE
_CHECKSUM_TAIL = 5  # msgpack uint32: marker byte + 4 bytes big-endian
_HEADER_FIELDS = ("format", "schema", "key", "fingerprint", "input_hash", "meta", "arrays")


class CorruptRecordError(Exception):
    """A stored record failed its checksum or does not have the record structure."""

    def __init__(self, key: str | None, where: str, reason: str = "checksum mismatch"):
        self.key = key
        self.where = where
        self.reason = reason
        name = "record" if key is None else f"record {key!r}"
        super().__init__(f"{where}: {name} is damaged ({reason})")

    def __reduce__(self):
        return (type(self), (self.key, self.where, self.reason))


class RecordFormatError(ValueError):
    """A record written by another codec version."""


@dataclass(frozen=True)
class RecordHeader:
    """A record without its arrays (read_header): enough to decide whether it is current."""

    key: str
    meta: dict[str, Any]
    fingerprint: str
    input_hash: str
    schema_version: int
    array_names: tuple[str, ...]
    format_version: int = RECORD_FORMAT


@dataclass(frozen=True, eq=False)
class Record:
    """A decoded record. `arrays` are read-only numpy views: copy one before writing into it."""

    key: str
    arrays: dict[str, np.ndarray]
    meta: dict[str, Any]
    fingerprint: str
    input_hash: str
    schema_version: int
    format_version: int = RECORD_FORMAT


class RowFrames:
    """A row-framed array (codec "zstd-rows") read lazily: indexing it with row numbers decodes
    only the frames that hold them; np.asarray decodes it all."""

    def __init__(
        self,
        name: str,
        dtype: np.dtype,
        shape: tuple,
        rows_per_frame: int,
        data: bytes,
        frame_ends: np.ndarray,
        dictionary: bytes,
        key: str,
        where: str,
    ):
        self.name, self.dtype, self.shape, self.ndim = name, dtype, shape, len(shape)
        self.rows_per_frame = rows_per_frame
        self._data, self._frame_ends, self._dictionary = data, frame_ends, dictionary
        self._key, self._where = key, where
        self._row_bytes = dtype.itemsize * math.prod(shape[1:])

    def __len__(self) -> int:
        return self.shape[0]

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def __getitem__(self, rows) -> np.ndarray:
        """The rows `rows` (an integer array, any order, repeats allowed), decoded."""
        rows = np.asarray(rows, dtype=np.int64)
        if rows.ndim != 1:
            raise IndexError(f"{self.name}: index with a 1-d array of row numbers, got shape {rows.shape}")
        if rows.size and (rows.min() < 0 or rows.max() >= self.shape[0]):
            raise IndexError(f"{self.name}: rows out of range 0..{self.shape[0] - 1}")
        frames = np.unique(rows // self.rows_per_frame)
        decoded = self._decode_frames(frames)  # [frames * rows_per_frame (last frame: fewer), ...]
        first_row_of = np.zeros(frames.size, dtype=np.int64)  # position of each frame's first row
        frame_rows = np.minimum(self.rows_per_frame, self.shape[0] - frames * self.rows_per_frame)
        first_row_of[1:] = np.cumsum(frame_rows)[:-1]
        slot = np.searchsorted(frames, rows // self.rows_per_frame)
        return decoded[first_row_of[slot] + rows % self.rows_per_frame]

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        whole = self._decode_frames(np.arange(self._frame_ends.size))
        return whole if dtype is None else whole.astype(dtype)

    def _decode_frames(self, frames: np.ndarray) -> np.ndarray:
        starts = np.concatenate([[0], self._frame_ends[:-1]]).astype(np.uint64)[frames]
        lengths = self._frame_ends[frames] - starts
        rows = np.minimum(self.rows_per_frame, self.shape[0] - frames * self.rows_per_frame)
        try:
            decompressor = _dictionary_decompressor(self._dictionary)
            segments = zstandard.BufferWithSegments(self._data, np.stack([starts, lengths], axis=1).tobytes())
            out = decompressor.multi_decompress_to_buffer(
                segments, decompressed_sizes=(rows * self._row_bytes).astype(np.uint64).tobytes()
            )
            data = b"".join([out[index] for index in range(len(out))])  # segments are buffers: one copy
        except (zstandard.ZstdError, ValueError) as error:
            raise CorruptRecordError(self._key, self._where, f"array {self.name!r}: {error}") from None
        if len(data) != int(rows.sum()) * self._row_bytes:
            raise CorruptRecordError(self._key, self._where, f"array {self.name!r}: frames hold {len(data)} bytes")
        return np.frombuffer(data, dtype=self.dtype).reshape(-1, *self.shape[1:])


_local = threading.local()  # zstd contexts are not safe to share between threads


def _compressor(level: int) -> zstandard.ZstdCompressor:
    cache = _local.__dict__.setdefault("compressors", {})
    if level not in cache:
        cache[level] = zstandard.ZstdCompressor(level=level)
    return cache[level]


def _decompressor() -> zstandard.ZstdDecompressor:
    try:
        return _local.decompressor
    except AttributeError:
        _local.decompressor = zstandard.ZstdDecompressor()
        return _local.decompressor


def _dictionary_decompressor(dictionary: bytes) -> zstandard.ZstdDecompressor:
    """A decompressor for one record's dictionary, kept while the thread reads that record."""
    cached = getattr(_local, "dictionary", None)
    if cached is None or cached[0] is not dictionary:
        _local.dictionary = (
            dictionary,
            zstandard.ZstdDecompressor(
                dict_data=zstandard.ZstdCompressionDict(dictionary, dict_type=zstandard.DICT_TYPE_FULLDICT)
            ),
        )
    return _local.dictionary[1]


_dtype_cache: dict[str, np.dtype] = {}  # np.dtype(str) costs ~2 us; a record has ~30 arrays


def _dtype(name: str) -> np.dtype:
    dtype = _dtype_cache.get(name)
    if dtype is None:
        dtype = np.dtype(name)
        if dtype.kind in ALLOWED_DTYPE_KINDS:  # only valid names are remembered
            _dtype_cache[name] = dtype
    return dtype


def _plain_default(value):
    # numpy scalars show up in meta dicts easily (e.g. int(array.max()) forgotten).
    if isinstance(value, np.generic) and value.dtype.kind in "biuf":
        return value.item()
    raise TypeError(f"{type(value).__name__} is not a plain msgpack value")


def _refuse_ext(code: int, data: bytes):
    raise ValueError(f"msgpack ext type {code} is not allowed in the cache")


def pack_plain(value: Any, where: str = "value") -> bytes:
    """msgpack-encode a plain value (dict/list/str/int/float/bool/None/bytes)."""
    try:
        return msgpack.packb(value, use_bin_type=True, default=_plain_default, strict_types=False)
    except (TypeError, ValueError, OverflowError) as error:
        raise ValueError(f"{where}: cannot store {value!r:.200}: {error}") from None


def unpack_plain(blob, where: str = "value") -> Any:
    """Decode what pack_plain wrote; refuses ext types and non-string map keys."""
    try:
        return msgpack.unpackb(blob, raw=False, strict_map_key=True, ext_hook=_refuse_ext)
    except (ValueError, msgpack.UnpackException, TypeError) as error:
        raise ValueError(f"{where}: not a plain msgpack value: {error}") from None


def _encode_row_frames(array: np.ndarray, rows_per_frame: int) -> dict | None:
    """Codec "zstd-rows" entries for a C-ordered little-endian array, or None when the zstd
    library cannot train a dictionary on it (too few or too uniform rows)."""
    frames = [array[start : start + rows_per_frame].tobytes() for start in range(0, array.shape[0], rows_per_frame)]
    # Trained on at most ~1,000 evenly spaced frames at zstd's default level: 0.1 s for 15k rows,
    # as good as level 19 on all of them (2.8 s) within 2 % of the bytes.
    samples = frames[:: max(1, len(frames) // _DICTIONARY_SAMPLES)]
    try:
        dictionary = zstandard.train_dictionary(_FRAME_DICTIONARY_BYTES, samples)
    except zstandard.ZstdError:
        return None
    compressor = zstandard.ZstdCompressor(
        level=_FRAME_LEVEL, dict_data=dictionary, write_checksum=False, write_content_size=True, write_dict_id=False
    )
    compressed = [compressor.compress(frame) for frame in frames]
    sizes = np.array([len(frame) for frame in compressed], dtype="<u4")
    return {
        "dtype": array.dtype.str,
        "shape": list(array.shape),
        "codec": CODEC_ZSTD_ROWS,
        "rows_per_frame": rows_per_frame,
        "dictionary": dictionary.as_bytes(),
        "frame_sizes": _compressor(3).compress(sizes.tobytes()),
        "data": b"".join(compressed),
    }


def _encode_array(name: str, value, zstd_level: int, key: str) -> dict:
    array = np.asarray(value)
    if array.dtype.kind not in ALLOWED_DTYPE_KINDS:
        raise ValueError(
            f"record {key!r}: array {name!r} has dtype {array.dtype}, expected one of the kinds "
            f"{''.join(sorted(ALLOWED_DTYPE_KINDS))} (bool, int, uint, float, complex, bytes, str)"
        )
    little = array.dtype.newbyteorder("<")
    if array.dtype != little:  # big-endian input
        array = array.astype(little)
    # reshape(-1) turns 0-d arrays into 1-d so the byte view works; it copies only
    # non-contiguous input.
    if name in ROW_FRAMED and zstd_level > 0 and array.ndim >= 1 and array.nbytes >= _MIN_FRAMED_BYTES:
        framed = _encode_row_frames(np.ascontiguousarray(array), ROW_FRAMED[name])
        if framed is not None:
            return framed
    raw = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
    codec, data = CODEC_RAW, memoryview(raw)
    if zstd_level > 0 and raw.nbytes >= _MIN_COMPRESS_BYTES:
        compressed = _compressor(zstd_level).compress(data)
        if len(compressed) <= raw.nbytes * (1.0 - _MIN_COMPRESS_SAVING):
            codec, data = CODEC_ZSTD, compressed
    return {"dtype": array.dtype.str, "shape": list(array.shape), "codec": codec, "data": data}


def encode_record(
    key: str,
    arrays: Mapping[str, Any],
    meta: Mapping[str, Any],
    fingerprint: str,
    input_hash: str,
    schema_version: int,
    zstd_level: int = 3,
) -> bytes:
    """Encode one record; arrays keep their dtype (big-endian input is stored little-endian)."""
    if not isinstance(key, str) or not key:
        raise ValueError(f"record key must be a non-empty str, got {key!r}")
    for name in arrays:
        if not isinstance(name, str):
            raise ValueError(f"record {key!r}: array names must be str, got {name!r}")
    encoded_arrays = {name: _encode_array(name, value, zstd_level, key) for name, value in arrays.items()}
    header = {
        "format": RECORD_FORMAT,
        "schema": int(schema_version),
        "key": key,
        "fingerprint": str(fingerprint),
        "input_hash": str(input_hash),
        "meta": dict(meta),
        "arrays": encoded_arrays,
    }
    packer = msgpack.Packer(use_bin_type=True, default=_plain_default)
    parts = [packer.pack_map_header(len(header) + 1)]
    try:
        for field, value in header.items():
            parts.append(packer.pack(field))
            parts.append(packer.pack(value))
    except (TypeError, ValueError, OverflowError) as error:
        raise ValueError(f"record {key!r}: {field} cannot be stored: {error}") from None
    parts.append(_CHECKSUM_KEY)
    body = b"".join(parts)
    checksum = zlib.crc32(body)
    return body + bytes([_UINT32_MARKER]) + checksum.to_bytes(4, "big")


def verify_checksum(blob, key: str | None = None, where: str = "record") -> None:
    """Raise CorruptRecordError unless the blob's trailing CRC-32 matches its bytes."""
    view = memoryview(blob)
    if view.nbytes <= _CHECKSUM_TAIL or view[-_CHECKSUM_TAIL] != _UINT32_MARKER:
        raise CorruptRecordError(key, where, "no checksum at the end")
    stored = int.from_bytes(view[-4:], "big")
    if zlib.crc32(view[:-_CHECKSUM_TAIL]) != stored:
        raise CorruptRecordError(key, where)


def _decode_array(name: str, spec, key: str, where: str, lazy_rows: bool = False) -> np.ndarray | RowFrames:
    try:
        dtype = _dtype(spec["dtype"])
        shape = tuple(spec["shape"])
        codec = spec["codec"]
        data = spec["data"]
    except (KeyError, TypeError, ValueError) as error:
        raise CorruptRecordError(key, where, f"array {name!r} has a bad header: {error}") from None
    if dtype.kind not in ALLOWED_DTYPE_KINDS or not isinstance(data, bytes):
        raise CorruptRecordError(key, where, f"array {name!r} has dtype {spec['dtype']!r}")
    if not all(isinstance(size, int) and size >= 0 for size in shape):
        raise CorruptRecordError(key, where, f"array {name!r} has shape {list(shape)}")
    expected = dtype.itemsize * math.prod(shape)
    if codec == CODEC_ZSTD_ROWS:
        frames = _row_frames(name, spec, dtype, shape, key, where)
        return frames if lazy_rows else np.asarray(frames)
    if codec == CODEC_ZSTD:
        try:
            data = _decompressor().decompress(data, max_output_size=expected)
        except zstandard.ZstdError as error:
            raise CorruptRecordError(key, where, f"array {name!r}: {error}") from None
    elif codec != CODEC_RAW:
        raise CorruptRecordError(key, where, f"array {name!r} has unknown codec {codec!r}")
    if len(data) != expected:
        raise CorruptRecordError(
            key, where, f"array {name!r} has {len(data)} bytes, shape {shape} {dtype} needs {expected}"
        )
    return np.frombuffer(data, dtype=dtype).reshape(shape)


def _row_frames(name: str, spec: dict, dtype: np.dtype, shape: tuple, key: str, where: str) -> RowFrames:
    """A "zstd-rows" array's frames, their layout checked (their bytes are checked on decode)."""
    rows_per_frame, frame_sizes, dictionary = (
        spec.get("rows_per_frame"),
        spec.get("frame_sizes"),
        spec.get("dictionary"),
    )
    if not (
        isinstance(rows_per_frame, int)
        and rows_per_frame > 0
        and len(shape) >= 1
        and isinstance(frame_sizes, bytes)
        and isinstance(dictionary, bytes)
    ):
        raise CorruptRecordError(key, where, f"array {name!r} has a bad row-frame header")
    frames = -(-shape[0] // rows_per_frame)
    try:
        sizes = _decompressor().decompress(frame_sizes, max_output_size=4 * frames)
    except zstandard.ZstdError as error:
        raise CorruptRecordError(key, where, f"array {name!r}: frame sizes: {error}") from None
    ends = np.cumsum(np.frombuffer(sizes, dtype="<u4"), dtype=np.uint64) if len(sizes) == 4 * frames else None
    if ends is None or (ends.size and ends[-1] != len(spec["data"])):
        raise CorruptRecordError(key, where, f"array {name!r}: frame sizes do not match its {shape[0]} rows")
    return RowFrames(name, dtype, shape, rows_per_frame, spec["data"], ends, dictionary, key, where)


def _unpack_fields(blob, where: str, key: str | None) -> dict:
    verify_checksum(blob, key, where)
    try:
        fields = msgpack.unpackb(blob, raw=False, strict_map_key=True, ext_hook=_refuse_ext)
    except (ValueError, msgpack.UnpackException, TypeError) as error:
        raise CorruptRecordError(key, where, f"not msgpack: {error}") from None
    if not isinstance(fields, dict) or any(field not in fields for field in _HEADER_FIELDS):
        raise CorruptRecordError(key, where, "missing record header fields")
    if fields["format"] != RECORD_FORMAT:
        raise RecordFormatError(
            f"{where}: record {fields.get('key', key)!r} has format {fields['format']}, expected {RECORD_FORMAT}"
        )
    record_key = fields["key"]
    if key is not None and record_key != key:
        raise CorruptRecordError(key, where, f"stored under {key!r} but names {record_key!r}")
    if not isinstance(fields["arrays"], dict) or not isinstance(fields["meta"], dict):
        raise CorruptRecordError(record_key, where, "arrays or meta is not a map")
    return fields


def decode_record(blob, where: str = "record", key: str | None = None, lazy_rows: bool = False) -> Record:
    """Check the checksum and decode a record.

    `blob` may be bytes or any buffer (an LMDB memoryview is read without a copy). `key`, when
    given, is the key the record was stored under; a record naming another key is damaged.
    With `lazy_rows`, row-framed arrays come as RowFrames (decoded when indexed; a damaged frame
    raises CorruptRecordError then), else every array is decoded here.
    Raises CorruptRecordError on damage and RecordFormatError for another codec version.
    """
    fields = _unpack_fields(blob, where, key)
    record_key = fields["key"]
    arrays = {name: _decode_array(name, spec, record_key, where, lazy_rows) for name, spec in fields["arrays"].items()}
    return Record(
        key=record_key,
        arrays=arrays,
        meta=fields["meta"],
        fingerprint=fields["fingerprint"],
        input_hash=fields["input_hash"],
        schema_version=fields["schema"],
        format_version=fields["format"],
    )


def encode_header(header: RecordHeader) -> bytes:
    """A record's header (without its arrays) encoded as a small record of its own: what the
    store keeps beside a record so that its header is read without reading the record. Read it
    back with read_header (its array_names are then empty)."""
    return encode_record(
        header.key, {}, header.meta, header.fingerprint, header.input_hash, header.schema_version, zstd_level=0
    )


def header_entry(blob) -> bytes | None:
    """encode_header of the record `blob`; None for a blob that is not an intact record."""
    try:
        return encode_header(read_header(blob))
    except (CorruptRecordError, RecordFormatError):
        return None


def read_header(blob, where: str = "record", key: str | None = None) -> RecordHeader:
    """Check the checksum and read a record's header without decoding its arrays."""
    fields = _unpack_fields(blob, where, key)
    return RecordHeader(
        key=fields["key"],
        meta=fields["meta"],
        fingerprint=fields["fingerprint"],
        input_hash=fields["input_hash"],
        schema_version=fields["schema"],
        array_names=tuple(fields["arrays"]),
        format_version=fields["format"],
    )
