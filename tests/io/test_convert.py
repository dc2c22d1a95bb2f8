"""The format converters between search tools (featurecache.io.convert), on random alignments."""

from __future__ import annotations

import random

import pytest

from featurecache.io.convert import (
    a3m_to_stockholm,
    fasta_records,
    hmmsearch_to_m8,
    stockholm_to_a3m,
    truncate_a3m,
    truncate_stockholm,
)

AMINO_ACIDS = "ACDEFGHIKLMNPQRSTVWY"


def _stockholm_names(text: str) -> list[str]:
    """Row names in first-appearance order."""
    return list(
        dict.fromkeys(
            line.split()[0] for line in text.splitlines() if line.strip() and not line.startswith(("#", "//"))
        )
    )


def _sequences(a3m: str) -> list[str]:
    return [sequence for _, sequence in fasta_records(a3m)]


def test_truncate_stockholm_keeps_annotation_of_kept_rows(tmp_path):
    rng = random.Random()
    names = [f"seq{index}_{rng.randrange(10**6)}/1-{rng.randint(10, 99)}" for index in range(rng.randint(5, 12))]
    annotated = names[::-1]  # #=GS order differs from row order, as in jackhmmer output
    rows = {name: "".join(rng.choice(AMINO_ACIDS + "-") for _ in range(30)) for name in names}
    lines = ["# STOCKHOLM 1.0", "#=GF ID test"]
    lines += [f"#=GS {name} DE description {index}" for index, name in enumerate(annotated)]
    for block in range(2):  # interleaved blocks repeat every name
        lines.append("")
        lines += [f"{name} {rows[name][block * 15 : (block + 1) * 15]}" for name in names]
        lines += [f"#=GR {names[0]} PP {'9' * 15}", f"#=GR {names[-1]} PP {'8' * 15}", f"#=GC RF {'x' * 15}"]
    lines.append("//")
    path = tmp_path / "input.sto"
    path.write_text("\n".join(lines) + "\n")
    keep = rng.randint(1, len(names) - 1)
    text, count = truncate_stockholm(path, keep)
    assert count == keep and _stockholm_names(text) == names[:keep]
    assert text.count("#=GC RF") == 2 and text.count("#=GS") == keep and text.rstrip().endswith("//")
    assert text.count("#=GR") == 2 and f"#=GR {names[-1]}" not in text
    assert truncate_stockholm(path, None)[1] == len(names)


def _random_a3m(rng: random.Random) -> tuple[str, list[str]]:
    length = rng.randint(5, 30)
    query = "".join(rng.choice(AMINO_ACIDS) for _ in range(length))
    rows = [query]
    for _ in range(rng.randint(1, 8)):
        row = []
        for _ in range(length):
            row.append(rng.choice(AMINO_ACIDS + "--"))
            if rng.random() < 0.2:
                row.append("".join(rng.choice(AMINO_ACIDS.lower()) for _ in range(rng.randint(1, 4))))
        rows.append("".join(row))
    return "".join(f">s{index}\n{row}\n" for index, row in enumerate(rows)), rows


def test_a3m_stockholm_round_trip():
    rng = random.Random()
    for _ in range(20):
        a3m, rows = _random_a3m(rng)
        sto = a3m_to_stockholm(a3m)
        widths = {len(line.split()[-1]) for line in sto.splitlines() if line and not line.startswith(("# ", "//"))}
        assert len(widths) == 1, "every Stockholm row and the RF line have one width"
        back = _sequences(stockholm_to_a3m(sto, rows[0]))
        assert back == rows  # the first row is the query already: it is not repeated
        other_query = rows[0][1:] + rows[0][0]
        assert _sequences(stockholm_to_a3m(sto, other_query)) == [other_query] + rows


def test_stockholm_to_a3m_rejects_foreign_alignment():
    sto = "# STOCKHOLM 1.0\nx ACDE\n#=GC RF xxxx\n//\n"
    with pytest.raises(ValueError, match="4 match columns but the query has 6"):
        stockholm_to_a3m(sto, "ACDEFG")
    assert stockholm_to_a3m("# STOCKHOLM 1.0\n//\n", "ACDEFG") == ">query\nACDEFG\n"


def test_truncate_a3m_counts_records():
    text = ">q\nACD\n>a\nAC-\n>b\nA-D\n"
    assert truncate_a3m(text, 2) == (">q\nACD\n>a\nAC-\n", 2)
    assert truncate_a3m(text + "\x00", None)[1] == 3


def test_fasta_records_skip_junk_and_nul_separators():
    text = "junk before\n>q desc\nAC\nd-\n\x00>h\nA\n"
    assert fasta_records(text) == [("q desc", "ACd-"), ("h", "A")]


def test_hmmsearch_to_m8_worked_example():
    # Columns: match, match, insert, match x3, insert. The hit row holds residues 3-7 of hitA:
    # the leading gap is an I that the trim drops, the insert column's 'c' is a D.
    sto = "# STOCKHOLM 1.0\nhitA/3-7 -AcDEF-\n#=GC RF  xx.xxx.\n//\n"
    domains = (
        "# comment\n"
        + " ".join(
            [
                "hitA",
                "-",
                "10",
                "query",
                "-",
                "5",
                "1e-5",
                "50.0",
                "0.1",
                "1",
                "1",
                "1e-6",
                "2e-6",
                "42.5",
                "0.0",
                "2",
                "5",
                "3",
                "7",
                "3",
                "7",
                "0.9",
                "a description",
            ]
        )
        + "\n"
    )
    # Query positions 2-5 pair with A, D, E, F: three identical (A, E, F), one mismatch (Q/D).
    assert hmmsearch_to_m8(sto, domains, "CAQEF") == "query\thitA\t0.600\t5\t1\t1\t2\t5\t3\t7\t2e-6\t42.5\t1M1D3M\n"
    with pytest.raises(ValueError, match="has no line in the domain table"):
        hmmsearch_to_m8(sto.replace("hitA/3-7", "hitB/3-7"), domains, "CAQEF")
    with pytest.raises(ValueError, match="4 residues, its name says 5"):
        hmmsearch_to_m8(sto.replace("-AcDEF-", "-A-DEF-"), domains, "CAQEF")
    with pytest.raises(ValueError, match="5 match states, the query 4 residues"):
        hmmsearch_to_m8(sto, domains, "CAQE")
