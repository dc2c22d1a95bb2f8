"""FASTA: multi-record, ``>id description`` headers, sequences possibly wrapped over lines.

This reads the file's syntax; which letters a sequence may hold depends on its molecule type
and is checked where the record becomes a chain (`io.inputs`, `io.residues`). Rejected here,
naming the file, the record and the line: a record without a sequence, a sequence that is
only gaps, a '*' anywhere but at the very end (one terminal stop is accepted and dropped),
and characters that are neither letters nor '*' / '-'.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from featurecache.io.common import ParseError, decode_text, read_bytes

# Letters plus '*' (stop / terminator) and '-' (some tools emit gapped FASTA).
_SEQUENCE_LINE = re.compile(r"^[A-Za-z*\-]+$")


@dataclass(frozen=True)
class FastaRecord:
    id: str
    description: str
    sequence: str  # upper case, no trailing '*'
    line: int = 0  # line number of the header (for messages about the record)


def read_fasta(path: str | os.PathLike) -> list[FastaRecord]:
    return parse_fasta(read_bytes(path), str(path))


def parse_fasta(data: str | bytes, source: str) -> list[FastaRecord]:
    """Parse FASTA text; an empty file, an empty or all-gap record, an inner '*' or a stray line
    is a ParseError."""
    text = decode_text(data, source)
    records: list[FastaRecord] = []
    header: tuple[str, str, int] | None = None
    chunks: list[str] = []

    def finish() -> None:
        record_id, description, line_number = header
        sequence = "".join(chunks).upper()
        if sequence.endswith("*"):
            sequence = sequence[:-1]
        if not sequence:
            raise ParseError(source, f"record {record_id!r} has no sequence", line_number)
        if not sequence.strip("-"):
            raise ParseError(source, f"record {record_id!r} is all gaps ({len(sequence)} '-')", line_number)
        stop = sequence.find("*")
        if stop >= 0:
            raise ParseError(
                source, f"record {record_id!r} has a stop '*' inside its sequence (position {stop + 1})", line_number
            )
        records.append(FastaRecord(record_id, description, sequence, line_number))

    for line_number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith(";"):
            continue
        if line.startswith(">"):
            if header is not None:
                finish()
            record_id, _, description = line[1:].strip().partition(" ")
            if not record_id:
                raise ParseError(source, "header without an id", line_number)
            header, chunks = (record_id, description.strip(), line_number), []
        elif header is None:
            raise ParseError(source, "sequence before the first '>' header (not FASTA?)", line_number)
        elif not _SEQUENCE_LINE.match(line):
            column = next(i for i, c in enumerate(line) if not (c.isascii() and c.isalpha()) and c not in "*-")
            position = sum(map(len, chunks)) + column + 1
            raise ParseError(
                source,
                f"invalid character {line[column]!r} at position {position} of record {header[0]!r}",
                line_number,
            )
        else:
            chunks.append(line)
    if header is None:
        raise ParseError(source, "no FASTA records (empty file?)")
    finish()
    return records
