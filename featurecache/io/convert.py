"""Converters between the search tools' alignment formats, and caps on their outputs.

Pure text-to-text functions (``truncate_stockholm`` streams a file, so that a multi-gigabyte
tool output is never held whole in memory). They feed one tool's output into another tool's
input (a Stockholm MSA into hhsearch as A3M, an A3M into ``hmmbuild --hand`` as Stockholm), cap
an output at its first hits, and turn hmmsearch's alignment to a query profile into m8 hits with
CIGAR, the residue mapping every template hit needs. Malformed input raises ``ValueError``.
"""

from __future__ import annotations

import os

GAP_CHARACTERS = ".-~"  # gap symbols of Stockholm / A2M rows


# --- output caps -------------------------------------------------------------------------------


def truncate_stockholm(path: str | os.PathLike, max_sequences: int | None) -> tuple[str, int]:
    """Read a Stockholm file keeping only its first ``max_sequences`` sequences (all when None).

    Order is that of the sequence rows (jackhmmer writes the query row first, then the hits by
    E-value; the #=GS lines come in another order). Streams the file twice, so a multi-gigabyte
    output is never held whole in memory. Returns the kept text and its number of sequences.
    Per-sequence annotation (#=GS, #=GR) of dropped sequences is dropped too; file and column
    annotation is kept.
    """
    order: list[str] = []
    seen: set[str] = set()
    with open(path, errors="replace") as handle:
        for line in handle:
            if line.startswith("#") or not line.strip() or line.startswith("//"):
                continue
            name = line.split(maxsplit=1)[0]
            if name not in seen:
                seen.add(name)
                order.append(name)
                if max_sequences is not None and len(order) >= max_sequences:
                    break
    kept = set(order)
    lines: list[str] = []
    with open(path, errors="replace") as handle:
        for line in handle:
            stripped = line.strip()
            if stripped.startswith(("#=GS", "#=GR")):
                parts = stripped.split(maxsplit=2)
                if len(parts) > 1 and parts[1] in kept:
                    lines.append(line)
            elif not stripped or stripped.startswith("#") or stripped == "//":
                lines.append(line)
            elif stripped.split(maxsplit=1)[0] in kept:
                lines.append(line)
    return "".join(lines), len(order)


def truncate_a3m(text: str, max_sequences: int | None) -> tuple[str, int]:
    """Keep the first ``max_sequences`` records of an A3M/FASTA text; returns (text, count)."""
    records = fasta_records(text)
    if max_sequences is not None:
        records = records[:max_sequences]
    return "".join(f">{name}\n{sequence}\n" for name, sequence in records), len(records)


def fasta_records(text: str) -> list[tuple[str, str]]:
    """(name, sequence) of every record of an A3M/FASTA text, case and gaps kept as written.

    Lenient on purpose (tool outputs only): lines before the first header are skipped, and NUL
    bytes, which separate entries in MMseqs2 flat database files, are dropped.
    """
    records: list[tuple[str, list[str]]] = []
    for line in text.replace("\x00", "").splitlines():
        if line.startswith(">"):
            records.append((line[1:].rstrip(), []))
        elif line.strip() and records:
            records[-1][1].append(line.strip())
    return [(name, "".join(parts)) for name, parts in records]


# --- MSA conversions for tool inputs -----------------------------------------------------------


def _stockholm_rows(sto_text: str) -> tuple[dict[str, str], str]:
    """Aligned rows by name (blocks joined, file order) and the ``#=GC RF`` line of a Stockholm file."""
    rows: dict[str, list[str]] = {}
    reference: list[str] = []
    for line in sto_text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#=GC RF"):
            reference.append(stripped.split()[2])
        elif stripped and not stripped.startswith("#") and stripped != "//":
            parts = stripped.split()
            if len(parts) == 2:
                rows.setdefault(parts[0], []).append(parts[1])
    return {name: "".join(parts) for name, parts in rows.items()}, "".join(reference)


def stockholm_to_a3m(sto_text: str, query_sequence: str) -> str:
    """A3M with the query first, from a HMMER Stockholm alignment built on that query.

    Match columns are taken from ``#=GC RF`` (HMMER writes it for -A output); residues there
    become upper case or '-', insert columns become lower-case letters with their gaps removed.
    Rows are added in file order. The query is prepended unless the first row already is the
    query (jackhmmer's output starts with it; hmmsearch's does not).
    """
    sequences, reference = _stockholm_rows(sto_text)
    query = "".join(query_sequence.split()).upper()
    if not sequences:
        return f">query\n{query}\n"
    if not reference:
        raise ValueError("Stockholm alignment has no '#=GC RF' line: cannot tell match from insert columns")
    match_columns = [char not in GAP_CHARACTERS for char in reference]
    if sum(match_columns) != len(query):
        raise ValueError(
            f"Stockholm alignment has {sum(match_columns)} match columns but the query has {len(query)} "
            "residues: it was not built on this query (jackhmmer -N 1 keeps one column per residue)"
        )
    rows: list[str] = []
    for name, aligned in sequences.items():
        if len(aligned) != len(match_columns):
            raise ValueError(
                f"Stockholm row {name} has {len(aligned)} columns, the #=GC RF line has {len(match_columns)}"
            )
        row = []
        for char, is_match in zip(aligned, match_columns):
            if is_match:
                row.append("-" if char in GAP_CHARACTERS else char.upper())
            elif char not in GAP_CHARACTERS:
                row.append(char.lower())
        rows.append(f">{name}\n{''.join(row)}\n")
    if rows[0].split("\n")[1] != query:
        rows.insert(0, f">query\n{query}\n")
    return "".join(rows)


def a3m_to_stockholm(a3m_text: str) -> str:
    """Stockholm with a ``#=GC RF`` line from an A3M (query first), for ``hmmbuild --hand``.

    A3M stores insertions as lower-case letters of any length between match columns; Stockholm
    needs every row the same width, so each insertion slot is padded to the longest insertion
    any row has there. The RF line marks the query's match columns 'x', insert columns '.'.
    """
    records = fasta_records(a3m_text)
    if not records:
        raise ValueError("A3M text has no sequences")
    parsed: list[tuple[list[str], list[str]]] = []  # per row: match characters, insertion after each slot
    for index, (name, sequence) in enumerate(records):
        matches: list[str] = []
        inserts: list[str] = [""]
        for char in sequence:
            if char.isupper() or char == "-":
                matches.append(char)
                inserts.append("")
            elif char.islower():
                inserts[-1] += char
            elif char != ".":
                raise ValueError(f"A3M row {index} ({name}) has an unexpected character {char!r}")
        parsed.append((matches, inserts))
    width = len(parsed[0][0])
    for index, (matches, _) in enumerate(parsed):
        if len(matches) != width:
            raise ValueError(
                f"A3M row {index} ({records[index][0]}) has {len(matches)} match columns, the query {width}"
            )
    slot_widths = [max(len(inserts[slot]) for _, inserts in parsed) for slot in range(width + 1)]
    reference = "".join("." * slot_widths[0] + "".join("x" + "." * w for w in slot_widths[1:]))
    lines = ["# STOCKHOLM 1.0", ""]
    names = [f"row{index}" for index in range(len(records))]
    name_width = max(len("#=GC RF"), *(len(name) for name in names)) + 1
    for name, (matches, inserts) in zip(names, parsed):
        row = [inserts[0].ljust(slot_widths[0], ".")]
        for slot, char in enumerate(matches, start=1):
            row.append(char + inserts[slot].ljust(slot_widths[slot], "."))
        lines.append(name.ljust(name_width) + "".join(row))
    lines.append("#=GC RF".ljust(name_width) + reference)
    lines.append("//")
    return "\n".join(lines) + "\n"


# --- hmmsearch hits as m8 ------------------------------------------------------------------------


def hmmsearch_to_m8(sto_text: str, domain_table: str, query: str) -> str:
    """hmmsearch's ``-A`` alignment of a query-length profile as m8 lines with CIGAR.

    Columns: query, target, fident, alnlen, mismatch, gapopen, qstart, qend, tstart, tend, evalue
    (the domain's independent E-value), bits, cigar (M: both, I: query residue only, D: target
    residue only), in the alignment's row order. Rows are named ``target/start-end`` by HMMER.
    """
    scores = _domain_scores(domain_table)
    rows, reference = _stockholm_rows(sto_text)
    if not rows:
        return ""
    match_columns = [char not in GAP_CHARACTERS for char in reference]
    if sum(match_columns) != len(query):
        raise ValueError(f"the profile has {sum(match_columns)} match states, the query {len(query)} residues")
    lines = []
    for name, aligned_row in rows.items():
        target, _, span = name.rpartition("/")
        try:
            start, end = (int(value) for value in span.split("-"))
        except ValueError:
            raise ValueError(f"row {name!r} is not named target/start-end") from None
        if (target, start, end) not in scores:
            raise ValueError(f"row {name!r} has no line in the domain table")
        ops = _alignment_ops(name, aligned_row, match_columns, start, end)
        if ops:
            evalue, bits = scores[(target, start, end)]
            lines.append(_m8_line(target, ops, query, evalue, bits))
    return "".join(line + "\n" for line in lines)


def _domain_scores(domain_table: str) -> dict[tuple[str, int, int], tuple[str, str]]:
    """(target, envelope start, envelope end) -> (independent E-value, bit score) from --domtblout."""
    scores: dict[tuple[str, int, int], tuple[str, str]] = {}
    for line in domain_table.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        fields = line.split()
        if len(fields) < 22:
            raise ValueError(f"--domtblout line has {len(fields)} fields, expected at least 22: {line[:80]!r}")
        scores[(fields[0], int(fields[17]), int(fields[18]))] = (fields[12], fields[13])
    return scores


def _alignment_ops(
    name: str, aligned_row: str, match_columns: list[bool], start: int, end: int
) -> list[tuple[str, int, int, str]]:
    """(op, query position, target position, target residue) per column, from the first to the
    last aligned pair (empty when no residue pairs with the query)."""
    ops: list[tuple[str, int, int, str]] = []
    query_position, target_position = 0, start - 1
    for char, is_match in zip(aligned_row, match_columns):
        residue = char not in GAP_CHARACTERS
        if is_match:
            query_position += 1
        if residue:
            target_position += 1
        if is_match and residue:
            ops.append(("M", query_position, target_position, char.upper()))
        elif is_match:
            ops.append(("I", query_position, target_position, ""))
        elif residue:
            ops.append(("D", query_position, target_position, char.upper()))
    if target_position != end:
        raise ValueError(f"row {name!r} holds {target_position - start + 1} residues, its name says {end - start + 1}")
    aligned = [index for index, op in enumerate(ops) if op[0] == "M"]
    return ops[aligned[0] : aligned[-1] + 1] if aligned else []


def _m8_line(target: str, ops: list[tuple[str, int, int, str]], query: str, evalue: str, bits: str) -> str:
    matches = [op for op in ops if op[0] == "M"]
    identical = sum(1 for _, q, _, residue in matches if query[q - 1] == residue)
    cigar, gap_opens = [], 0
    for op in ops:
        if cigar and cigar[-1][0] == op[0]:
            cigar[-1][1] += 1
        else:
            cigar.append([op[0], 1])
            gap_opens += op[0] != "M"
    return "\t".join(
        str(value)
        for value in (
            "query",
            target,
            f"{identical / len(ops):.3f}",
            len(ops),
            len(matches) - identical,
            gap_opens,
            ops[0][1],
            ops[-1][1],
            ops[0][2],
            ops[-1][2],
            evalue,
            bits,
            "".join(f"{count}{op}" for op, count in cigar),
        )
    )
