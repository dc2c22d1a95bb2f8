"""Template hits: HHR (hhsearch / hhblits) and MMseqs2 / BLAST tabular (m8, with CIGAR).

Every hit carries the residue-level alignment as two index arrays: `query_indices[k]` (0-based
position in the query) is aligned to `hit_indices[k]` (0-based position in the hit's full
sequence, the numbering of the search database, which is the template's SEQRES / entity
sequence). Only columns with a residue on both sides are listed.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import numpy as np

from featurecache.io.common import ParseError, cut_short, decode_text, read_bytes

_HHR_ALIGNMENT_LINE = re.compile(r"^([QT]) (\S+)\s+(\d+) (\S+)\s+(\d+) \((\d+)\)\s*$")
_HHR_ANNOTATION_ROWS = {"Consensus", "ss_pred", "ss_conf", "ss_dssp"}
# A line of the hit table: rank, name and scores, then the Query HMM and Template HMM ranges
# and the template length ("  1 1HF9_B ATPASE ...  7.5 3.8E+02 ...   22    7-28     10-31  (41)").
_HHR_TABLE_LINE = re.compile(r"^\s*(\d+)\s.*\s(\d+)-(\d+)\s+(\d+)-(\d+)\s*\(\s*\d+\s*\)\s*$")
_CIGAR = re.compile(r"(\d+)([MIDX=])")


@dataclass(frozen=True, eq=False)
class TemplateHit:
    name: str  # "<pdb id lower case>_<chain>", e.g. "1hf9_B"
    index: int  # rank in the file, 0-based
    aligned_cols: int
    sum_probs: float | None  # HHR only
    e_value: float | None
    identity: float | None  # fraction 0..1
    query_start: int  # 1-based, inclusive
    query_end: int
    hit_start: int
    hit_end: int
    query_indices: np.ndarray  # [n] int32, 0-based
    hit_indices: np.ndarray  # [n] int32, 0-based
    hit_sequence: str  # aligned hit residues, ungapped ("" when the format has none: m8)
    hit_length: int | None  # full length of the hit sequence when the format gives it
    description: str
    source: str

    @property
    def pdb_id(self) -> str:
        return self.name.split("_", 1)[0]

    @property
    def chain_id(self) -> str:
        return self.name.split("_", 1)[1] if "_" in self.name else ""


def normalize_hit_name(name: str) -> str:
    """'1HF9_B' -> '1hf9_B' (PDB ids are case-insensitive, chain ids are not)."""
    pdb_id, separator, chain = name.partition("_")
    return f"{pdb_id.lower()}{separator}{chain}"


def read_hits(path: str | os.PathLike, warnings: list[str] | None = None) -> list[TemplateHit]:
    """Parse a template hit file by its name: .hhr, otherwise tabular m8. `warnings`: see
    `parse_hhr` (a file cut short)."""
    name = os.path.basename(str(path)).lower().removesuffix(".gz")
    data = read_bytes(path)
    if name.endswith(".hhr"):
        return parse_hhr(data, str(path), warnings)
    return parse_m8(data, str(path), warnings)


# --- HHR --------------------------------------------------------------------------------------


def parse_hhr(data: str | bytes, source: str, warnings: list[str] | None = None) -> list[TemplateHit]:
    """Parse an HHR file's alignment blocks ('No N' sections); a file with no hits gives [].

    Each block must cover the Query HMM and Template HMM ranges its line in the hit table gives.
    A last block that does not (or cannot be read) is where the file was cut: with a `warnings`
    list that hit is dropped and a warning naming the file is added, without one it is a
    ParseError. Any earlier block that disagrees with the table is a ParseError (damage, not a cut).
    """
    text = decode_text(data, source)
    lines = text.splitlines()
    if not text.strip():
        return []
    if not lines[0].startswith("Query"):
        raise ParseError(source, "HHR must start with a 'Query' line (not an HHR file?)", 1)
    block_starts = [
        number for number, line in enumerate(lines) if line.startswith("No ") and line[3:].strip().isdigit()
    ]
    table = _hhr_table(lines, block_starts[0] if block_starts else len(lines))
    hits = []
    for position, start in enumerate(block_starts):
        last = position + 1 == len(block_starts)
        end = len(lines) if last else block_starts[position + 1]
        rank = int(lines[start][3:])
        try:
            hit = _parse_hhr_block(lines, start, end, position, source)
        except ParseError as error:
            if not last:
                raise
            cut_short(
                source, f"{error.detail} (the last hit, No {rank})", error.line, warnings, f"hit No {rank} dropped"
            )
            break
        expected = table.get(rank)
        covered = (hit.query_start, hit.query_end, hit.hit_start, hit.hit_end)
        if expected is not None and covered != expected:
            detail = (
                f"hit No {rank} {hit.name} aligns query {covered[0]}-{covered[1]} and template "
                f"{covered[2]}-{covered[3]}, the hit table says {expected[0]}-{expected[1]} and "
                f"{expected[2]}-{expected[3]}"
            )
            if not last:
                raise ParseError(source, detail, start + 1)
            cut_short(source, detail, start + 1, warnings, f"hit No {rank} dropped")
            break
        hits.append(hit)
    return hits


def _hhr_table(lines: list[str], end: int) -> dict[int, tuple[int, int, int, int]]:
    """Rank -> (query start, end, template start, end) from the hit table before the first block."""
    table = {}
    for line in lines[:end]:
        match = _HHR_TABLE_LINE.match(line)
        if match:
            table[int(match.group(1))] = tuple(int(value) for value in match.groups()[1:])
    return table


def _parse_hhr_block(lines: list[str], start: int, end: int, index: int, source: str) -> TemplateHit:
    name = ""
    description = ""
    scores: dict[str, str] = {}
    query_parts: list[str] = []
    hit_parts: list[str] = []
    query_start = hit_start = None
    query_end = hit_end = 0
    hit_length = None
    for number in range(start + 1, end):
        line = lines[number]
        if line.startswith(">"):
            name, _, description = line[1:].strip().partition(" ")
        elif line.startswith("Probab="):
            for item in line.split():
                key, _, value = item.partition("=")
                scores[key] = value
        elif line.startswith(("Q ", "T ")):
            fields = line.split(None, 2)
            if len(fields) > 1 and fields[1] in _HHR_ANNOTATION_ROWS:
                continue
            match = _HHR_ALIGNMENT_LINE.match(line)
            if match is None:
                raise ParseError(source, f"malformed alignment line {line.strip()!r}", number + 1)
            row, _, first, segment, last, length = match.groups()
            if row == "Q":
                query_start = int(first) if query_start is None else query_start
                query_end = int(last)
                query_parts.append(segment)
            else:
                hit_start = int(first) if hit_start is None else hit_start
                hit_end = int(last)
                hit_length = int(length)
                hit_parts.append(segment)
    line_number = start + 1
    if not name:
        raise ParseError(source, f"hit {index + 1} has no '>' name line", line_number)
    if query_start is None or hit_start is None:
        raise ParseError(source, f"hit {name} has no query/template alignment rows", line_number)
    query_aligned = "".join(query_parts)
    hit_aligned = "".join(hit_parts)
    if len(query_aligned) != len(hit_aligned):
        raise ParseError(
            source,
            f"hit {name}: query and template rows differ in length ({len(query_aligned)} vs {len(hit_aligned)})",
            line_number,
        )
    query_indices, hit_indices, hit_sequence = _walk_alignment(query_aligned, hit_aligned, query_start, hit_start)
    if query_start + len(query_aligned) - query_aligned.count("-") - 1 != query_end:
        raise ParseError(source, f"hit {name}: query row residues do not span {query_start}-{query_end}", line_number)
    try:
        aligned_cols = int(scores.get("Aligned_cols", len(query_indices)))
        identity = float(scores["Identities"].rstrip("%")) / 100 if "Identities" in scores else None
        sum_probs = float(scores["Sum_probs"]) if "Sum_probs" in scores else None
        e_value = float(scores["E-value"]) if "E-value" in scores else None
    except ValueError as error:
        raise ParseError(source, f"hit {name}: unreadable score ({error})", line_number) from error
    return TemplateHit(
        name=normalize_hit_name(name),
        index=index,
        aligned_cols=aligned_cols,
        sum_probs=sum_probs,
        e_value=e_value,
        identity=identity,
        query_start=query_start,
        query_end=query_end,
        hit_start=hit_start,
        hit_end=hit_end,
        query_indices=query_indices,
        hit_indices=hit_indices,
        hit_sequence=hit_sequence,
        hit_length=hit_length,
        description=description,
        source=source,
    )


def _walk_alignment(query: str, hit: str, query_start: int, hit_start: int):
    query_chars = np.frombuffer(query.encode("ascii", "replace"), dtype=np.uint8)
    hit_chars = np.frombuffer(hit.encode("ascii", "replace"), dtype=np.uint8)
    query_residue = query_chars != ord("-")
    hit_residue = hit_chars != ord("-")
    query_positions = np.cumsum(query_residue) - 1 + (query_start - 1)
    hit_positions = np.cumsum(hit_residue) - 1 + (hit_start - 1)
    both = query_residue & hit_residue
    hit_sequence = hit.replace("-", "").upper()
    return query_positions[both].astype(np.int32), hit_positions[both].astype(np.int32), hit_sequence


# --- m8 ---------------------------------------------------------------------------------------


def parse_m8(data: str | bytes, source: str, warnings: list[str] | None = None) -> list[TemplateHit]:
    """Parse MMseqs2 / BLAST tabular output.

    13 columns: query, target, fident, alnlen, mismatch, gapopen, qstart, qend, tstart, tend,
    evalue, bits, cigar (MMseqs2 ``--format-output ...,cigar``; M = both, I = query only,
    D = target only). 12 columns (no CIGAR) are accepted only for ungapped hits. An empty file
    is zero hits. A last line without its newline that does not parse is a file cut short: with
    `warnings`, that hit is dropped and named there (as `parse_hhr` does); else a ParseError.
    """
    text = decode_text(data, source)
    lines = text.splitlines()
    cut_at = len(lines) if text and not text.endswith(("\n", "\r")) else None
    hits = []
    for number, line in enumerate(lines, start=1):
        if not line.strip() or line.startswith("#"):
            continue
        try:
            hits.append(_m8_hit(line, source, number, len(hits)))
        except ParseError as error:
            if number != cut_at:
                raise
            cut_short(
                source, f"{error.detail} (the last line, without its newline)", number, warnings, "its hit dropped"
            )
    return hits


def _m8_hit(line: str, source: str, number: int, index: int) -> TemplateHit:
    """The hit on one m8 line (line `number`), the `index`-th of its file."""
    fields = line.rstrip("\n").split("\t")
    if len(fields) not in (12, 13):
        raise ParseError(source, f"expected 12 or 13 tab-separated columns, got {len(fields)}", number)
    try:
        identity = float(fields[2])
        aligned_length = int(fields[3])
        query_start, query_end, hit_start, hit_end = (int(value) for value in fields[6:10])
        e_value = float(fields[10])
    except ValueError as error:
        raise ParseError(source, f"non-numeric column: {error}", number) from error
    if identity > 1.0:  # BLAST writes percent identity
        identity /= 100.0
    if min(query_start, hit_start) < 1 or query_end < query_start or hit_end < hit_start:
        raise ParseError(
            source, f"bad coordinates query {query_start}-{query_end} target {hit_start}-{hit_end}", number
        )
    cigar = fields[12].strip() if len(fields) == 13 else ""
    if cigar:
        query_indices, hit_indices = _cigar_pairs(cigar, query_start, hit_start, query_end, hit_end, source, number)
    elif query_end - query_start == hit_end - hit_start:
        query_indices = np.arange(query_start - 1, query_end, dtype=np.int32)
        hit_indices = np.arange(hit_start - 1, hit_end, dtype=np.int32)
    else:
        raise ParseError(source, "gapped hit without a CIGAR column: residue mapping unknown", number)
    return TemplateHit(
        name=normalize_hit_name(fields[1]),
        index=index,
        aligned_cols=aligned_length,
        sum_probs=None,
        e_value=e_value,
        identity=identity,
        query_start=query_start,
        query_end=query_end,
        hit_start=hit_start,
        hit_end=hit_end,
        query_indices=query_indices,
        hit_indices=hit_indices,
        hit_sequence="",
        hit_length=None,
        description="",
        source=source,
    )


def _cigar_pairs(cigar, query_start, hit_start, query_end, hit_end, source, number):
    operations = _CIGAR.findall(cigar)
    if not operations or "".join(count + op for count, op in operations) != cigar:
        raise ParseError(source, f"malformed CIGAR {cigar!r}", number)
    query_pieces, hit_pieces = [], []
    query_position, hit_position = query_start - 1, hit_start - 1
    for count_text, operation in operations:
        count = int(count_text)
        if operation in "M=X":
            query_pieces.append(np.arange(query_position, query_position + count, dtype=np.int32))
            hit_pieces.append(np.arange(hit_position, hit_position + count, dtype=np.int32))
            query_position += count
            hit_position += count
        elif operation == "I":
            query_position += count
        else:  # D
            hit_position += count
    if not query_pieces:
        raise ParseError(source, f"CIGAR {cigar} has no aligned (M) columns", number)
    if query_position != query_end or hit_position != hit_end:
        raise ParseError(
            source,
            f"CIGAR {cigar} spans query {query_start}-{query_position} and target {hit_start}-{hit_position}, "
            f"columns say {query_start}-{query_end} and {hit_start}-{hit_end}",
            number,
        )
    return np.concatenate(query_pieces), np.concatenate(hit_pieces)
