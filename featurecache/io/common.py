"""Shared pieces of the parsers: the error type and reading plain or gzipped files."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

from featurecache.schema import CUT_SHORT

GZIP_MAGIC = b"\x1f\x8b"


class ParseError(ValueError):
    """A file could not be parsed; the message names the file, the line and what was wrong."""

    def __init__(self, source: str, message: str, line: int | None = None):
        self.source = str(source)
        self.line = line
        self.detail = message
        where = f"{self.source}:{line}" if line is not None else self.source
        super().__init__(f"{where}: {message}")


def cut_short(source: str, detail: str, line: int | None, warnings: list[str] | None, dropped: str) -> None:
    """A file that ends mid-record (cut at a line boundary: a copy or download stopped early).

    With a `warnings` list the caller keeps the whole records: `dropped` (what the caller leaves
    out) goes into one warning naming the file. Without one nobody would hear of it, so it is a
    ParseError.
    """
    if warnings is None:
        raise ParseError(source, f"{detail} ({CUT_SHORT}?)", line)
    where = f"{source}:{line}" if line is not None else source
    warnings.append(f"{where}: {CUT_SHORT}: {detail}; {dropped}")


def read_bytes(path: str | os.PathLike) -> bytes:
    """Bytes of a file, decompressed when it is gzipped (detected by magic number, not name)."""
    data = Path(path).read_bytes()
    if data[:2] == GZIP_MAGIC:
        try:
            return gzip.decompress(data)
        except (OSError, EOFError) as error:
            raise ParseError(str(path), f"corrupt gzip data: {error}") from error
    return data


def decode_text(data: bytes | str, source: str) -> str:
    """Text of a file's bytes (a leading byte-order mark dropped); binary content (NUL bytes,
    invalid UTF-8) is a ParseError."""
    if isinstance(data, str):
        text = data
    else:
        nul = data.find(b"\0")
        if nul >= 0:
            raise ParseError(source, "binary content (NUL byte)", data.count(b"\n", 0, nul) + 1)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as error:
            line = data[: error.start].count(b"\n") + 1
            raise ParseError(source, f"not UTF-8 text (byte {error.start})", line) from error
    nul = text.find("\0")
    if nul >= 0:
        raise ParseError(source, "binary content (NUL byte)", text.count("\n", 0, nul) + 1)
    return text.removeprefix("\ufeff")  # a byte-order mark, as editors on Windows write it


def read_text(path: str | os.PathLike) -> str:
    return decode_text(read_bytes(path), str(path))
