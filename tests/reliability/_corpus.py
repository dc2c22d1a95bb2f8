"""A corpus of bad precompute inputs, generated from the real sample data in ../shared/data.

Each `BadInput` is one input file (and, for alignment cases, one alignment file) and what the
pipeline must say about it. All of them go into one precompute batch together with two good
targets, so one bad file can never hide behind another: each has its own target id and, for
alignment cases, its own query sequence (alignments are matched to chains by sequence).
"""

from __future__ import annotations

import gzip
import random
import re
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import copy_sample_structures

GOOD_TARGETS = ("209d-assembly1.cif", "2q2k.cif")  # copied unchanged; must always be cached

_STANDARD = re.compile(r"^[ACDEFGHIKLMNPQRSTVWY]+$")


@dataclass(frozen=True)
class BadInput:
    key: str  # target id the pipeline derives from the input file name
    what: str  # one line for the report
    outcome: str  # "error": an errors record; "cached": the target is cached anyway
    expect: tuple[str, ...]  # substrings of the error message (or of the record's warnings)
    stage: str = "parse"


def homolog_sequences(shared_data: Path, count: int, min_length: int = 40) -> list[str]:
    """Distinct real sequences: the aligned residues of rows of the sample A3M files."""
    found: list[str] = []
    seen: set[str] = set()
    for path in sorted((shared_data / "alignments" / "afdb").rglob("*.a3m")):
        for block in path.read_text().split(">")[1:]:
            row = "".join(block.splitlines()[1:])
            sequence = "".join(char for char in row if char.isupper())
            if len(sequence) >= min_length and _STANDARD.match(sequence) and sequence not in seen:
                seen.add(sequence)
                found.append(sequence)
                if len(found) == count:
                    return found
    raise AssertionError(f"only {len(found)} distinct homolog sequences in {shared_data}")


def _a3m(query: str, others: list[str], rows: int, rng: random.Random | None = None) -> str:
    """A valid A3M: the query, then `rows` rows cut or gap-padded to the query length.

    With `rng`, every row gets three random point mutations, so rows stay distinct (MSA
    assembly removes duplicate rows).
    """
    lines = [">query", query]
    for row in range(rows):
        other = others[row % len(others)][: len(query)]
        if rng is not None:
            letters = list(other)
            for position in rng.sample(range(len(letters)), 3):
                letters[position] = rng.choice("ACDEFGHIKLMNPQRSTVWY")
            other = "".join(letters)
        lines += [f">UniRef100_S{row:06d} n=1 Tax=Homo sapiens TaxID=9606", other + "-" * (len(query) - len(other))]
    return "\n".join(lines) + "\n"


def _write(path: Path, data: bytes | str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    path.write_bytes(data)


def build_corpus(shared_data: Path, inputs: Path, alignments: Path, rng: random.Random) -> list[BadInput]:
    """Write every bad input (and the good targets) under `inputs` / `alignments`."""
    structures = shared_data / "structures"
    copy_sample_structures(GOOD_TARGETS, inputs)
    cif_text = (structures / "2q2k.cif").read_text()
    small_cif = (structures / "209d-assembly1.cif").read_text()
    sequences = homolog_sequences(shared_data, 16)
    cases: list[BadInput] = []

    def add(name: str, data: bytes | str, case: BadInput) -> None:
        _write(inputs / name, data)
        cases.append(case)

    # --- files that are not what their name says ----------------------------------------------
    # Cut inside an _atom_site row, before its last value: a cut at a line end would leave a
    # shorter but valid file.
    row_starts = [match.start() for match in re.finditer(r"^(ATOM|HETATM) ", cif_text, re.MULTILINE)]
    row_start = rng.choice(row_starts[len(row_starts) // 4 : len(row_starts) // 2])
    row = cif_text[row_start : cif_text.index("\n", row_start)]
    cut = row_start + rng.randrange(len("ATOM "), row.rstrip().rindex(" "))
    add(
        "truncated.cif",
        cif_text[:cut],
        BadInput("truncated", "mmCIF cut in the middle of a table", "error", ("truncated.cif", "invalid mmCIF")),
    )
    packed = gzip.compress(small_cif.encode())
    add(
        "truncated_gzip.cif.gz",
        packed[: len(packed) // 2],
        BadInput("truncated_gzip", "gzipped mmCIF cut in half", "error", ("truncated_gzip.cif.gz", "gzip")),
    )
    add(
        "binary.cif",
        bytes(rng.randrange(256) for _ in range(4096)),
        BadInput("binary", "4 kB of random bytes named .cif", "error", ("binary.cif", "binary content")),
    )
    add(
        "binary_fa.fasta",
        bytes(rng.randrange(256) for _ in range(4096)),
        BadInput("binary_fa", "4 kB of random bytes named .fasta", "error", ("binary_fa.fasta", "binary content")),
    )
    add("empty.cif", b"", BadInput("empty", "empty .cif file", "error", ("empty.cif", "empty file")))
    add("empty_fa.fa", b"", BadInput("empty_fa", "empty .fa file", "error", ("empty_fa.fa", "empty")))
    add(
        "plain.cif.gz",
        small_cif[:3000],
        BadInput("plain", "plain text named .cif.gz, cut short", "error", ("plain.cif.gz", "invalid mmCIF")),
    )
    add(
        "fasta_inside.cif",
        f">a mol:protein\n{sequences[0]}\n",
        BadInput("fasta_inside", "FASTA text named .cif", "error", ("fasta_inside.cif", "invalid mmCIF")),
    )
    pdb_lines = "".join(
        f"ATOM  {i + 1:5d}  CA  ALA A{i + 1:4d}    {i * 3.8:8.3f}{0.0:8.3f}{0.0:8.3f}  1.00  0.00           C\n"
        for i in range(20)
    )
    add(
        "pdb_format.cif",
        "HEADER    TEST\n" + pdb_lines + "END\n",
        BadInput("pdb_format", "PDB-format ATOM records named .cif (read as PDB by content)", "cached", ()),
    )
    add(
        "header_only.cif",
        "data_1abc\n_entry.id 1ABC\n",
        BadInput("header_only", "mmCIF with a header and no atoms", "error", ("header_only.cif", "_atom_site")),
    )
    no_x = re.sub(r"_atom_site\.Cartn_x", "_atom_site.Cartn_q", small_cif, count=1)
    add(
        "no_coordinates.cif",
        no_x,
        BadInput("no_coordinates", "mmCIF whose _atom_site lacks Cartn_x", "error", ("no_coordinates.cif", "Cartn_x")),
    )
    add(
        "two_blocks.cif",
        small_cif + "\n" + small_cif.replace("data_", "data_copy_", 1),
        BadInput("two_blocks", "mmCIF with two data blocks (the first is read)", "cached", ()),
    )
    waters = "\n".join(f"HETATM {i + 1} O O . HOH A {i + 1} {i}.0 1.0 2.0 1.0 10.0 ? A {i + 1} HOH 1" for i in range(5))
    add(
        "only_water.cif",
        "data_w\nloop_\n_atom_site.group_PDB\n_atom_site.id\n_atom_site.type_symbol\n"
        "_atom_site.label_atom_id\n_atom_site.label_alt_id\n_atom_site.label_comp_id\n_atom_site.label_asym_id\n"
        "_atom_site.label_seq_id\n_atom_site.Cartn_x\n_atom_site.Cartn_y\n_atom_site.Cartn_z\n"
        "_atom_site.occupancy\n_atom_site.B_iso_or_equiv\n_atom_site.pdbx_PDB_ins_code\n"
        "_atom_site.auth_asym_id\n_atom_site.auth_seq_id\n_atom_site.auth_comp_id\n"
        "_atom_site.pdbx_PDB_model_num\n" + waters + "\n",
        BadInput("only_water", "mmCIF with nothing but waters", "error", ("only_water.cif", "no chains")),
    )
    # Replace the x coordinate of one atom line with a non-number.
    lines = small_cif.splitlines(keepends=True)
    atom_rows = [i for i, line in enumerate(lines) if line.startswith(("ATOM", "HETATM"))]
    row = rng.choice(atom_rows)
    fields = lines[row].split()
    x_column = _atom_site_columns(small_cif).index("Cartn_x")
    fields[x_column] = "12.3.4"
    lines[row] = " ".join(fields) + "\n"
    add(
        "bad_number.cif",
        "".join(lines),
        BadInput("bad_number", "mmCIF with a non-numeric coordinate", "error", ("bad_number.cif", "non-numeric")),
    )

    # --- FASTA inputs ---------------------------------------------------------------------------
    add(
        "utf16.fasta",
        f">a\n{sequences[1]}\n".encode("utf-16"),
        BadInput("utf16", "UTF-16 encoded FASTA", "error", ("utf16.fasta", "binary content")),
    )
    add(
        "latin1.fasta",
        b">a caf\xe9 protein\n" + sequences[1].encode() + b"\n",
        BadInput("latin1", "FASTA header in Latin-1 (not UTF-8)", "error", ("latin1.fasta", "UTF-8")),
    )
    add(
        "no_sequence.fasta",
        ">a mol:protein\n>b mol:protein\nMKV\n",
        BadInput("no_sequence", "FASTA record without a sequence", "error", ("no_sequence.fasta", "no sequence")),
    )
    add(
        "no_header.fasta",
        f"{sequences[2]}\n>b\n{sequences[2]}\n",
        BadInput("no_header", "sequence before the first header", "error", ("no_header.fasta", "header")),
    )
    add(
        "digits.fasta",
        f">a mol:protein\n{sequences[3][:20]}12345\n",
        BadInput("digits", "digits inside a protein sequence", "error", ("digits.fasta", "invalid character '1'")),
    )
    add(
        "empty_gzip.fasta.gz",
        gzip.compress(b""),
        BadInput("empty_gzip", "gzip of an empty file", "error", ("empty_gzip.fasta.gz", "no FASTA records")),
    )
    # Unknown residues are data, not errors: they become UNK / N tokens.
    add(
        "unknown_residues.fasta",
        f">a mol:protein\nXX{sequences[4][:30]}BZJOUX\n",
        BadInput("unknown_residues", "protein with X, B, Z, J, O, U letters", "cached", ()),
    )
    add(
        "unknown_nucleotides.fasta",
        ">a mol:rna\nACGUNNACGURY\n",
        BadInput("unknown_nucleotides", "RNA with N, R, Y letters", "cached", ()),
    )
    add(
        "long.fasta",
        ">a mol:protein\n" + "".join(rng.choice("ACDEFGHIKLMNPQRSTVWY") for _ in range(3000)) + "\n",
        BadInput("long", "one 3,000-residue chain (query-only MSA)", "cached", ()),
    )

    # Unknown ligand and unknown polymer residue: renamed chemical components.
    unknown_ligand = re.sub(r"\bGNP\b", "ZZQ", (structures / "721p-assembly1.cif").read_text())
    add(
        "unknown_ligand.cif",
        unknown_ligand,
        BadInput("unknown_ligand", "ligand renamed to a code absent from the CCD (GNP -> ZZQ)", "cached", ()),
    )
    unknown_residue = re.sub(r"\bPXA\b", "QQ7", small_cif)
    add(
        "unknown_residue.cif",
        unknown_residue,
        BadInput("unknown_residue", "non-standard residue renamed to an unknown code (PXA -> QQ7)", "cached", ()),
    )

    # --- alignments: each case has its own query, so only its own target is affected ------------
    def alignment_case(
        key: str,
        sequence: str,
        file_name: str,
        data: bytes | str,
        what: str,
        outcome: str,
        expect: tuple[str, ...],
        stage: str,
    ) -> None:
        add(f"{key}.fasta", f">{key} mol:protein\n{sequence}\n", BadInput(key, what, outcome, expect, stage))
        _write(alignments / "bad" / key / file_name, data)

    good = sequences[5:]
    ragged = _a3m(good[0], good[1:], 5).splitlines()
    ragged[3] = ragged[3][:-7]  # a row shorter than the query
    alignment_case(
        "ragged_a3m",
        good[0],
        "uniref90_hits.a3m",
        "\n".join(ragged) + "\n",
        "A3M row shorter than the query",
        "error",
        ("uniref90_hits.a3m", "the query has"),
        "alignments",
    )
    bad_char = _a3m(good[1], good[2:], 5).splitlines()
    bad_char[5] = bad_char[5][:10] + "*#" + bad_char[5][12:]
    alignment_case(
        "bad_char_a3m",
        good[1],
        "mgnify_hits.a3m",
        "\n".join(bad_char) + "\n",
        "A3M row with '*' and '#'",
        "error",
        ("mgnify_hits.a3m", "invalid character"),
        "alignments",
    )
    alignment_case(
        "huge_a3m",
        good[2],
        "bfd_uniclust_hits.a3m",
        _a3m(good[2], good[3:], 20000, rng),
        "A3M with 20,000 rows (capped by msa_rows_stored)",
        "cached",
        (),
        "alignments",
    )
    hhr_folder_msa = _a3m(good[3], good[4:], 3)
    alignment_case(
        "garbage_hhr",
        good[3],
        "uniref90_hits.a3m",
        hhr_folder_msa,
        "HHR template hits file that is binary garbage",
        "error",
        ("pdb70_hits.hhr", "not UTF-8"),
        "alignments",
    )
    _write(alignments / "bad" / "garbage_hhr" / "pdb70_hits.hhr", bytes(rng.randrange(1, 256) for _ in range(2048)))
    alignment_case(
        "bad_m8",
        good[4],
        "badm8_protein.a3m",
        _a3m(good[4], good[5:], 3),
        "MMseqs2 m8 hits with missing columns",
        "error",
        ("badm8_protein_pdb.m8", "columns"),
        "alignments",
    )
    _write(alignments / "bad" / "bad_m8" / "badm8_protein_pdb.m8", "query\t1abc_A\t0.5\n")
    sto = f"# STOCKHOLM 1.0\nquery {good[5]}\nhit1 {good[6][: len(good[5])]}\n"
    # Unreadable alignment files cannot be matched to any chain: the index reports them and
    # the target falls back to a query-only MSA.
    alignment_case(
        "truncated_sto",
        good[5],
        "uniref90_hits.sto",
        sto[: len(sto) * 2 // 3],
        "Stockholm file cut mid-row",
        "cached",
        ("uniref90_hits.sto", "columns, the query has"),
        "alignments",
    )
    alignment_case(
        "empty_a3m", good[6], "uniref90_hits.a3m", b"", "empty A3M file", "cached", ("uniref90_hits.a3m",), "alignments"
    )
    binary = b"\x00" + bytes(rng.randrange(256) for _ in range(1000))
    alignment_case(
        "binary_a3m",
        good[7],
        "mgnify_hits.a3m",
        binary,
        "binary A3M file",
        "cached",
        ("mgnify_hits.a3m",),
        "alignments",
    )
    alignment_case(
        "corrupt_gzip_a3m",
        good[8],
        "bfd_hits.a3m.gz",
        gzip.compress(b">q\nMKV\n")[:-9],
        "gzipped A3M with its end cut off",
        "cached",
        ("bfd_hits.a3m.gz",),
        "alignments",
    )
    # A file named for chain A of target 'q9zz' whose query is another protein.
    add(
        "q9zz.fasta",
        f">q9zz mol:protein\n{good[9]}\n",
        BadInput(
            "q9zz",
            "alignment named for the chain but with another query",
            "cached",
            ("q9zz-assembly1A_protein.a3m", "does not match"),
            "alignments",
        ),
    )
    _write(alignments / "bad" / "q9zz-assembly1A_protein.a3m", _a3m(good[10], good[:3], 3))
    return cases


def _atom_site_columns(cif_text: str) -> list[str]:
    columns = []
    for line in cif_text.splitlines():
        if line.startswith("_atom_site."):
            columns.append(line.split(".", 1)[1].strip())
        elif columns and not line.startswith("_"):
            break
    return columns
