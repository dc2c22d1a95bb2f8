"""Multiple sequence alignments: A3M / A2M and Stockholm, into one `Msa` type.

An `Msa` is aligned to its query: every row has exactly one character per query residue,
uppercase letters or '-', and `deletion_matrix[i, j]` counts the residues row i inserts before
query column j (lowercase letters in A3M / A2M, letters in the query's gap columns in Stockholm).

The A3M path works on the whole file's bytes with numpy (one pass of vector operations for all
rows), not character by character: a 16k-row A3M parses in tens of milliseconds.

Species, for pairing rows across chains, are read from the header / description by
`io.species` (one parser for the header layouts of UniProt, UniRef, Protenix, OpenFold / AF2,
AF3 and ColabFold): `Msa.species_tags` says what each header carries, `Msa.species` gives ids
consistent within this MSA; assembling a target resolves them across all its chains' MSAs.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from featurecache.io.common import ParseError, cut_short, decode_text, read_bytes
from featurecache.schema import CUT_SHORT
from featurecache.io.species import SpeciesResolver, SpeciesTag, species_tag

_GAP = ord("-")
_DOT = ord(".")
_STAR = ord("*")


@dataclass(frozen=True, eq=False)
class Msa:
    aligned: np.ndarray  # [rows, L] uint8 ASCII: uppercase letters and '-'
    deletion_matrix: np.ndarray  # [rows, L] int32
    descriptions: tuple[str, ...]  # header line without '>' (Stockholm: name and DE text)
    source: str

    @property
    def depth(self) -> int:
        return int(self.aligned.shape[0])

    @property
    def length(self) -> int:
        return int(self.aligned.shape[1])

    @property
    def query(self) -> str:
        return self.aligned[0].tobytes().decode("ascii")

    @cached_property
    def species_tags(self) -> tuple[SpeciesTag, ...]:
        """What each row's header says about its organism (nothing for the query), parsed on first use."""
        return (SpeciesTag(),) + tuple(species_tag(description) for description in self.descriptions[1:])

    @cached_property
    def species(self) -> tuple[str, ...]:
        """Species id per row ("" when unknown; always "" for the query), consistent within this MSA."""
        return tuple(SpeciesResolver([self.species_tags]).keys(self.species_tags))

    @cached_property
    def sequences(self) -> tuple[str, ...]:
        return tuple(row.tobytes().decode("ascii") for row in self.aligned)


def read_msa(path: str | os.PathLike, warnings: list[str] | None = None) -> Msa:
    """Parse an alignment file by its name: .sto / .stockholm, otherwise A3M / A2M (plain or .gz).
    `warnings`: see `parse_a3m` (a file cut short)."""
    name = os.path.basename(str(path)).lower()
    if name.endswith(".gz"):
        name = name[:-3]
    data = read_bytes(path)
    if name.endswith((".sto", ".stockholm")):
        return parse_stockholm(data, str(path))
    return parse_a3m(data, str(path), warnings)


# --- writing A3M ----------------------------------------------------------------------------

# An Msa keeps how many residues a row inserts before each column, not which ones: written back,
# they are lower-case "unknown residue" letters, so the deletion counts (what AF3-style models
# read from an A3M) survive a round trip.
INSERTED_RESIDUE = {"protein": "x", "rna": "n", "dna": "n"}


def format_a3m(msa: Msa, rows=None, molecule_type: str = "protein") -> str:
    """A3M text of `msa`'s rows (all when None; pass the query's row 0 first to keep it the
    query), one line per record; insertions are written as INSERTED_RESIDUE[molecule_type]."""
    rows = np.arange(msa.depth) if rows is None else np.asarray(rows, dtype=np.int64)
    aligned = msa.aligned[rows]
    repeats = msa.deletion_matrix[rows].astype(np.int64).ravel() + 1  # inserted residues, then the column
    text = np.full(int(repeats.sum()), ord(INSERTED_RESIDUE[molecule_type]), dtype=np.uint8)
    text[np.cumsum(repeats) - 1] = aligned.ravel()
    ends = np.cumsum(repeats.reshape(len(rows), -1).sum(axis=1)) if len(rows) else np.zeros(0, np.int64)
    sequences = np.split(text, ends[:-1]) if len(rows) else []
    lines = []
    for row, sequence in zip(rows.tolist(), sequences):
        header = msa.descriptions[row].replace("\r", " ").replace("\n", " ").strip() or f"row{row}"
        lines.append(f">{header}\n{sequence.tobytes().decode('ascii')}\n")
    return "".join(lines)


# --- A3M / A2M ------------------------------------------------------------------------------


_SEPARATOR = ord(">")  # stands for a header line in the byte stream of all records
_HEADER_LINE = re.compile(rb"^>", re.MULTILINE)


class _CutLastRecord(ParseError):
    """The file's last record is shorter than the query (none or part of its sequence): the file
    was cut at a line boundary inside it."""

    def __init__(self, source: str, message: str, line: int, header: str):
        super().__init__(source, message, line)
        self.header = header


def parse_a3m(data: str | bytes, source: str, warnings: list[str] | None = None) -> Msa:
    """Parse A3M or A2M (FASTA-like, multi-line records allowed); the first record is the query.

    A file cut inside its last record (a header with no sequence, or part of a wrapped A2M
    sequence) is detected: with a `warnings` list that record is dropped and a warning naming the
    file is added, without one it is a ParseError. A record with no sequence inside the file is
    always a ParseError (the file is damaged, not cut).
    """
    try:
        return _parse_a3m(data, source)
    except _CutLastRecord as cut:
        raw = data if isinstance(data, bytes) else data.encode("utf-8")
        raw = raw.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        cut_short(source, cut.detail, cut.line, warnings, f"record {cut.header!r} dropped")
        last_header = raw.rfind(b"\n>")
        return _parse_a3m(raw[: last_header + 1], source)


def _parse_a3m(data: str | bytes, source: str) -> Msa:
    """parse_a3m without the cut-file handling.

    No Python loop runs per character. Header lines become a one-byte separator ('>') in list
    operations over lines; the separator is then treated as an extra kept column in front of
    every row, so that one binary search assigns every lowercase letter (a deletion) to the next
    kept column, and letters trailing a row's last column land on the next row's separator
    column, which is dropped. Byte classes come from wrapping uint8 comparisons, several times
    faster than a lookup table indexed by every byte.
    """
    text = decode_text(data, source)  # validates: no NUL bytes, UTF-8
    raw = data if isinstance(data, bytes) else text.encode("utf-8")
    if b"\r" in raw:
        raw = raw.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    first = 0 if raw.startswith(b">") else raw.find(b"\n>") + 1
    if first == 0 and not raw.startswith(b">"):
        if not _only_comments(raw):
            raise ParseError(source, "sequence before the first '>' header (not A3M/A2M?)", _first_content_line(raw))
        raise ParseError(source, "no records (empty file or not A3M/A2M)")
    if not _only_comments(raw[:first]):  # hhblits may write '#' comment lines first
        raise ParseError(
            source, "sequence before the first '>' header (not A3M/A2M?)", _first_content_line(raw[:first])
        )
    header_lines, stream = _split_records(raw[first:])
    headers = list(map(str.strip, b"\n".join(header_lines).decode("utf-8").split("\n")))
    rows = len(headers)
    if stream.count(b">") != rows:
        _raise_inner_header_mark(raw, first, source)
    chars = np.frombuffer(stream, dtype=np.uint8)
    # Byte masks by wrapping uint8 arithmetic: (c - 'A') < 26 is true exactly for 'A'..'Z'.
    upper = (chars - np.uint8(ord("A"))) < 26
    lower = (chars - np.uint8(ord("a"))) < 26
    kept = upper | (chars == _GAP) | (chars == _SEPARATOR)
    if not (kept | lower | (chars == _DOT) | (chars == _STAR)).all():
        offset = int(np.argmin(kept | lower | (chars == _DOT) | (chars == _STAR)))
        row = stream.count(b">", 0, offset) - 1
        bad = stream[offset : offset + 1].decode("latin-1")
        raise ParseError(
            source, f"invalid character {bad!r} in record {headers[row]!r}", _header_line(raw, first, row) + 1
        )

    kept_positions = np.flatnonzero(kept)
    query = slice(1, stream.find(b">", 1) if rows > 1 else len(stream))
    width = int(np.count_nonzero(kept[query]))
    if not upper[query].any():
        raise ParseError(source, "query has no aligned residues", _header_line(raw, first, 0))
    if kept_positions.size != rows * (width + 1) or (chars[kept_positions[:: width + 1]] != _SEPARATOR).any():
        _raise_row_width_error(chars, kept, headers, width, raw, first, source)
    # Kept column k (separators included) is row k // (width + 1), column k % (width + 1) - 1.
    target = np.searchsorted(kept_positions, np.flatnonzero(lower))
    row, column = np.divmod(target, width + 1)
    counted = (column > 0) & (row < rows)
    flat = row[counted] * width + column[counted] - 1  # sorted: inserts and columns both ascend
    deletions = np.zeros(rows * width, dtype=np.int32)
    if flat.size:
        run_starts = np.concatenate([[0], np.flatnonzero(np.diff(flat)) + 1])
        deletions[flat[run_starts]] = np.diff(np.concatenate([run_starts, [flat.size]]))
    aligned = chars[kept_positions].reshape(rows, width + 1)[:, 1:].copy()
    return Msa(aligned, deletions.reshape(rows, width), tuple(headers), source)


def _split_records(body: bytes) -> tuple[list[bytes], bytes]:
    """Header lines (without '>') and the sequence stream with a '>' before every record."""
    lines = body.split(b"\n")
    while lines and not lines[-1].strip():
        lines.pop()
    headers, sequences = lines[0::2], lines[1::2]
    # Common case, one line per record: every even line is a header and no odd line is, which
    # joined-bytes searches (in C) can check without a loop over lines.
    joined_sequences = b"\n".join(sequences)
    if (
        len(lines) % 2 == 0
        and body.count(b"\n>") + 1 == len(headers)
        and not joined_sequences.startswith(b">")
        and b"\n>" not in joined_sequences
    ):
        stream = b">" + b">".join(sequences)
        header_lines = [header[1:] for header in headers]
    else:  # records over several lines (A2M, wrapped FASTA)
        is_header = [line[:1] == b">" for line in lines]
        header_lines = [line[1:] for line, header in zip(lines, is_header) if header]
        stream = b"".join([b">" if header else line for line, header in zip(lines, is_header)])
    return header_lines, stream.replace(b" ", b"")


def _raise_row_width_error(chars, kept, headers, width, raw, first, source) -> None:
    """Name the first record whose aligned length differs from the query's (or that is empty)."""
    separators = np.flatnonzero(chars == _SEPARATOR)
    bounds = np.concatenate([separators, [chars.size]])
    kept_before = np.concatenate([[0], np.cumsum(kept)])
    per_row = kept_before[bounds[1:]] - kept_before[bounds[:-1] + 1]
    for row, count in enumerate(per_row.tolist()):
        if row > 0 and row == len(headers) - 1 and count < width:  # the file ends inside this record
            what = "has no sequence" if count == 0 else f"has {count} aligned columns, the query has {width}"
            raise _CutLastRecord(
                source, f"last record {headers[row]!r} {what}", _header_line(raw, first, row), headers[row]
            )
        if bounds[row + 1] - bounds[row] == 1:
            raise ParseError(source, f"record {headers[row]!r} has no sequence", _header_line(raw, first, row))
        if count != width:
            raise ParseError(
                source,
                f"record {headers[row]!r} has {count} aligned columns, the query has {width}",
                _header_line(raw, first, row),
            )
    raise AssertionError("row width check failed without a faulty row")


def _only_comments(raw: bytes) -> bool:
    return all(not line.strip() or line.startswith(b"#") for line in raw.split(b"\n"))


def _first_content_line(raw: bytes) -> int:
    for number, line in enumerate(raw.split(b"\n"), start=1):
        if line.strip() and not line.startswith(b"#"):
            return number
    return 1


def _raise_inner_header_mark(raw: bytes, first: int, source: str) -> None:
    """A '>' inside a sequence line would split its record in two: name the line."""
    start = raw.count(b"\n", 0, first) + 1
    for number, line in enumerate(raw[first:].split(b"\n"), start=start):
        if not line.startswith(b">") and b">" in line:
            raise ParseError(source, "'>' inside a sequence line (a header must start its line)", number)
    raise ParseError(source, "records and headers do not match")


def _header_line(raw: bytes, first: int, row: int) -> int:
    """Line number of record `row`'s header (computed only for error messages)."""
    for index, match in enumerate(_HEADER_LINE.finditer(raw, first)):
        if index == row:
            return raw.count(b"\n", 0, match.start()) + 1
    return 1


# --- Stockholm ------------------------------------------------------------------------------


def parse_stockholm(data: str | bytes, source: str) -> Msa:
    """Parse Stockholm (jackhmmer / hmmsearch -A output), multi-block; the first row is the query.

    Columns where the query has a gap are insertions: they are dropped and their residues counted
    as deletions before the next query column. Several alignments in one file ('//' separated)
    are concatenated when they share the query. A file without the final '//' was cut short and is
    a ParseError: which rows and columns it lost cannot be told.
    """
    text = decode_text(data, source)
    lines = text.splitlines()
    if not lines or not lines[0].startswith("# STOCKHOLM"):
        raise ParseError(source, "missing '# STOCKHOLM 1.0' header (not Stockholm?)", 1)
    sections: list[tuple[dict[str, list[str]], dict[str, str], dict[str, int]]] = []
    rows: dict[str, list[str]] = {}
    descriptions: dict[str, str] = {}
    first_line: dict[str, int] = {}
    for line_number, line in enumerate(lines, start=1):
        stripped = line.strip()
        if not stripped:
            continue
        if stripped == "//":
            if rows:
                sections.append((rows, descriptions, first_line))
            rows, descriptions, first_line = {}, {}, {}
            continue
        if stripped.startswith("#=GS"):
            parts = stripped.split(None, 3)
            if len(parts) >= 3 and parts[2] == "DE":
                descriptions[parts[1]] = parts[3] if len(parts) > 3 else ""
            continue
        if stripped.startswith("#"):
            continue
        parts = stripped.split()
        if len(parts) != 2:
            raise ParseError(source, f"expected '<name> <aligned sequence>', got {len(parts)} fields", line_number)
        name, segment = parts
        rows.setdefault(name, []).append(segment)
        first_line.setdefault(name, line_number)
    if rows:
        sections.append((rows, descriptions, first_line))
    if not sections:
        raise ParseError(source, "no aligned sequences")
    # Every Stockholm alignment ends with '//'. Without it the file was cut, and a cut between
    # interleaved blocks leaves rows that look whole but lack the later columns: refuse the file.
    last_line = next((number for number in range(len(lines), 0, -1) if lines[number - 1].strip()), 1)
    terminated = lines[last_line - 1].strip() == "//"
    try:
        msas = [_stockholm_section(*section, source) for section in sections]
    except ParseError as error:
        if terminated:
            raise
        raise ParseError(source, f"{error.detail} (no '//' at the end: {CUT_SHORT}?)", error.line) from None
    if not terminated:
        raise ParseError(source, f"no '//' after the last alignment block ({CUT_SHORT}?)", last_line)
    if len(msas) == 1:
        return msas[0]
    query = msas[0].query
    for msa in msas[1:]:
        if msa.query != query:
            raise ParseError(source, "alignments in one file have different queries")
    return Msa(
        np.concatenate([m.aligned for m in msas]),
        np.concatenate([m.deletion_matrix for m in msas]),
        sum((m.descriptions for m in msas), ()),
        source,
    )


def _stockholm_section(rows, descriptions, first_line, source) -> Msa:
    names = list(rows)
    sequences = ["".join(rows[name]) for name in names]
    width = len(sequences[0])
    for name, sequence in zip(names, sequences):
        if len(sequence) != width:
            raise ParseError(
                source, f"row {name!r} has {len(sequence)} columns, the query has {width}", first_line[name]
            )
    try:
        chars = np.frombuffer("".join(sequences).encode("ascii"), dtype=np.uint8).reshape(len(names), width)
    except UnicodeEncodeError as error:
        raise ParseError(source, "non-ASCII character in the alignment") from error
    is_letter = ((chars >= 65) & (chars <= 90)) | ((chars >= 97) & (chars <= 122))
    is_gap = (chars == _GAP) | (chars == _DOT)
    bad = ~(is_letter | is_gap)
    if bad.any():
        row, column = (int(v) for v in np.argwhere(bad)[0])
        raise ParseError(
            source, f"invalid character {chr(chars[row, column])!r} in row {names[row]!r}", first_line[names[row]]
        )
    query_columns = ~is_gap[0]
    if not query_columns.any():
        raise ParseError(source, "query row is all gaps", first_line[names[0]])
    # Residues in insert columns, counted per row, attributed to the next query column.
    inserted = is_letter & ~query_columns[None, :]
    running = np.cumsum(inserted, axis=1, dtype=np.int64)
    at_kept = running[:, query_columns]
    deletions = np.diff(at_kept, axis=1, prepend=0).astype(np.int32)
    aligned = chars[:, query_columns].copy()
    aligned[aligned == _DOT] = _GAP
    lower = (aligned >= 97) & (aligned <= 122)
    aligned[lower] -= 32
    row_descriptions = tuple(f"{name} {descriptions.get(name, '')}".strip() for name in names)
    return Msa(aligned, deletions, row_descriptions, source)
