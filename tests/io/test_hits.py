import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from featurecache.io.common import ParseError
from featurecache.io.hits import parse_hhr, parse_m8, read_hits

HHR_FILES = ["openfold/pdb70_hits.hhr"] + [
    f"afdb/{c}/pdb70_hits.hhr" for c in ("1a00_A", "1a02_F", "1a0g_A", "1a2y_B", "1a3p_A")
]
M8_FILES = [
    f"pdb_templates_m8/{entry}_protein_pdball_230102_db.m8"
    for entry in ("209d-assembly1C", "721p-assembly1A", "721p-assembly1B")
    + tuple(f"7a4d-assembly1{chain}" for chain in "ABCDEF")
]


def _check_hit(hit):
    assert hit.query_indices.shape == hit.hit_indices.shape
    assert hit.query_indices.dtype == hit.hit_indices.dtype == np.int32
    assert hit.query_indices.size > 0
    # Strictly increasing on both sides: an alignment never goes backwards.
    assert (np.diff(hit.query_indices) > 0).all() and (np.diff(hit.hit_indices) > 0).all()
    assert hit.query_indices[0] >= hit.query_start - 1 and hit.query_indices[-1] <= hit.query_end - 1
    assert hit.hit_indices[0] >= hit.hit_start - 1 and hit.hit_indices[-1] <= hit.hit_end - 1


@pytest.mark.parametrize("relative", HHR_FILES + M8_FILES)
def test_every_hit_file_parses(shared_data, relative):
    hits = read_hits(shared_data / "alignments" / relative)
    for index, hit in enumerate(hits):
        assert hit.index == index
        assert "_" in hit.name and hit.pdb_id == hit.pdb_id.lower()
        _check_hit(hit)


def test_empty_m8_is_zero_hits(shared_data):
    assert (
        read_hits(shared_data / "alignments" / "pdb_templates_m8" / "209d-assembly1C_protein_pdball_230102_db.m8") == []
    )


def test_hhr_first_hit(shared_data):
    hits = read_hits(shared_data / "alignments" / "openfold" / "pdb70_hits.hhr")
    assert [hit.name for hit in hits][:3] == ["1hf9_B", "2crb_A", "4zey_A"]
    assert len(hits) == 10
    first = hits[0]
    assert (first.aligned_cols, first.sum_probs, first.e_value, first.identity) == (22, 13.1, 380.0, 0.23)
    assert (first.query_start, first.query_end, first.hit_start, first.hit_end, first.hit_length) == (7, 28, 10, 31, 41)
    np.testing.assert_array_equal(first.query_indices, np.arange(6, 28))
    np.testing.assert_array_equal(first.hit_indices, np.arange(9, 31))
    assert first.hit_sequence == "ISHHAKEIERLQKEIERHKQSI"
    assert first.description.startswith("ATPASE INHIBITOR")


def test_hhr_gapped_alignment_mapping(shared_data):
    hits = read_hits(shared_data / "alignments" / "afdb" / "1a2y_B" / "pdb70_hits.hhr")
    gapped = next(hit for hit in hits if len(hit.hit_sequence) != hit.query_end - hit.query_start + 1)
    _check_hit(gapped)
    # Every template residue of the range appears once in the ungapped hit sequence.
    assert len(gapped.hit_sequence) == gapped.hit_end - gapped.hit_start + 1


def test_m8_cigar_with_deletions(shared_data):
    hits = read_hits(shared_data / "alignments" / "pdb_templates_m8" / "721p-assembly1A_protein_pdball_230102_db.m8")
    assert len(hits) == 300
    hit = next(hit for hit in hits if hit.name == "6pq3_A")  # 54M10D112M, query 1-166, target 2-177
    assert hit.e_value == pytest.approx(4.835e-59) and hit.identity == pytest.approx(0.875)
    np.testing.assert_array_equal(hit.query_indices, np.arange(166))
    np.testing.assert_array_equal(hit.hit_indices[:54], np.arange(1, 55))
    np.testing.assert_array_equal(hit.hit_indices[54:], np.arange(65, 177))
    insertion = next(hit for hit in hits if hit.name == "2rhd_A")  # 38M1D62M1I16M1D45M
    assert insertion.query_indices.size == 38 + 62 + 16 + 45
    assert 3 + 38 + 62 not in insertion.query_indices  # the inserted query residue has no partner


def test_m8_without_cigar_only_for_ungapped_hits():
    ungapped = "q\t1abc_A\t0.9\t10\t1\t0\t1\t10\t5\t14\t1e-5\t50\n"
    (hit,) = parse_m8(ungapped, "twelve.m8")
    np.testing.assert_array_equal(hit.hit_indices, np.arange(4, 14))
    gapped = "q\t1abc_A\t0.9\t10\t1\t1\t1\t10\t5\t15\t1e-5\t50\n"
    with pytest.raises(ParseError, match="twelve.m8:1: gapped hit without a CIGAR"):
        parse_m8(gapped, "twelve.m8")


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("q\t1abc_A\t0.9\n", "expected 12 or 13 tab-separated columns, got 3"),
        ("q\t1abc_A\tx\t10\t1\t0\t1\t10\t5\t14\t1e-5\t50\t10M\n", "non-numeric"),
        ("q\t1abc_A\t0.9\t10\t1\t0\t1\t10\t5\t14\t1e-5\t50\t9M\n", "CIGAR 9M spans query 1-9"),
        ("q\t1abc_A\t0.9\t10\t1\t0\t1\t10\t5\t14\t1e-5\t50\t10Q\n", "malformed CIGAR"),
        ("q\t1abc_A\t0.9\t10\t1\t0\t1\t10\t5\t14\t1e-5\t50\t10I10D\n", "no aligned"),
        ("q\t1abc_A\t0.9\t10\t1\t0\t10\t1\t5\t14\t1e-5\t50\t10M\n", "bad coordinates"),
    ],
)
def test_malformed_m8(line, message):
    with pytest.raises(ParseError, match=message):
        parse_m8("# comment\n" + line, "bad.m8")


def test_truncated_hhr_is_a_parse_error(shared_data):
    text = (shared_data / "alignments" / "openfold" / "pdb70_hits.hhr").read_text()
    cut = text.index("Q query             7 AEH") + 25
    with pytest.raises(
        ParseError, match=r"cut\.hhr:\d+: malformed alignment line .* \(the last hit, No 1\) \(file cut short\?\)"
    ):
        parse_hhr(text[:cut], "cut.hhr")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (">1abc_A\nACDE\n", "must start with a 'Query' line"),
        ("Query q\nNo 1\nProbab=1.0\n", "no '>' name line"),
        ("Query q\nNo 1\n>1abc_A x\nProbab=1.0\n", "no query/template alignment rows"),
        ("Query q\nNo 1\n>1abc_A x\nQ q 1 ACD 3 (3)\nT 1abc_A 1 AC 2 (5)\n", "differ in length"),
    ],
)
def test_malformed_hhr(text, message):
    with pytest.raises(ParseError, match=message):
        parse_hhr(text, "bad.hhr")


def test_hhr_without_hits_and_empty_file():
    assert parse_hhr("", "empty.hhr") == []
    assert parse_hhr("Query q\nMatch_columns 3\n\n No Hit  Prob\n", "none.hhr") == []


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet=st.sampled_from("Query No1 >_ABQTP=0.5%\n-ACD()"), max_size=200))
def test_hhr_garbage_only_raises_parse_error(text):
    try:
        parse_hhr(text, "fuzz.hhr")
    except ParseError:
        pass


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(alphabet=st.sampled_from("0123456789.eEMID-_abc"), max_size=6), max_size=14).map("\t".join))
def test_m8_garbage_only_raises_parse_error(line):
    try:
        parse_m8(line + "\n", "fuzz.m8")
    except ParseError:
        pass


# --- HHR files cut at a line boundary ---------------------------------------------------------


def _hhr_lines(shared_data, chain: str) -> list[str]:
    return (shared_data / "alignments" / "afdb" / chain / "pdb70_hits.hhr").read_text().splitlines(keepends=True)


def test_every_sample_hhr_block_covers_its_hit_table_ranges(shared_data):
    for path in sorted((shared_data / "alignments").rglob("*.hhr")):
        warnings: list[str] = []
        hits = parse_hhr(path.read_bytes(), str(path), warnings)
        assert hits and warnings == [], path


def test_hhr_cut_inside_its_last_hit_never_keeps_the_partial_hit(shared_data):
    """A real HHR (1a0g_A, 112 hits) cut at every line of a hit whose alignment spans several
    blocks: the hit is kept only when all of it was read; otherwise it is dropped with one
    warning naming the file (or, without a warnings list, the file is refused)."""
    lines = _hhr_lines(shared_data, "1a0g_A")
    whole = parse_hhr("".join(lines), "whole.hhr")
    starts = [number for number, line in enumerate(lines) if line.startswith("No ") and line[3:].strip().isdigit()]
    # the first hit whose alignment needs more than one block of Q/T lines
    position = next(
        k
        for k, start in enumerate(starts[:-1])
        if sum(line.startswith("Q Consensus") for line in lines[start : starts[k + 1]]) > 1
    )
    rank, start, end = position + 1, starts[position], starts[position + 1]
    dropped = 0
    for keep in range(start + 1, end + 1):
        cut = "".join(lines[:keep])
        warnings: list[str] = []
        hits = parse_hhr(cut, "cut.hhr", warnings)
        assert [hit.name for hit in hits[:position]] == [hit.name for hit in whole[:position]]
        if len(hits) == rank:  # kept: then it is the whole hit
            assert warnings == []
            assert np.array_equal(hits[-1].query_indices, whole[position].query_indices)
            assert np.array_equal(hits[-1].hit_indices, whole[position].hit_indices)
        else:
            dropped += 1
            assert len(hits) == position
            assert len(warnings) == 1 and warnings[0].startswith("cut.hhr:")
            assert f"(the last hit, No {rank})" in warnings[0] or f"hit No {rank} {whole[position].name}" in warnings[0]
            assert warnings[0].endswith(f"hit No {rank} dropped")
            with pytest.raises(ParseError, match=r"^cut\.hhr:\d+: .*\(file cut short\?\)$"):
                parse_hhr(cut, "cut.hhr")
    assert dropped > 3  # cuts before its name, inside its Q/T rows and between its blocks


def test_hhr_block_disagreeing_with_the_table_inside_the_file_is_refused(shared_data):
    lines = (shared_data / "alignments" / "openfold" / "pdb70_hits.hhr").read_text().splitlines(keepends=True)
    table_row = next(number for number, line in enumerate(lines) if line.startswith("  1 1HF9_B"))
    lines[table_row] = lines[table_row].replace("7-28", "7-29")
    with pytest.raises(ParseError, match=r"damaged\.hhr:\d+: hit No 1 1hf9_B aligns query 7-28 .* says 7-29"):
        parse_hhr("".join(lines), "damaged.hhr", [])


def test_m8_cut_inside_its_last_line_never_keeps_a_wrong_hit(shared_data):
    """A real m8 (721p chain A, 300 hits) cut at every character of its last line: the hits before
    it are kept; the last is dropped with one warning naming the file and line (without a warnings
    list, a ParseError), unless only its newline was cut: then it is kept whole. A cut at a line
    boundary looks like a whole file and is one."""
    text = (shared_data / "alignments" / "pdb_templates_m8" / "721p-assembly1A_protein_pdball_230102_db.m8").read_text()
    full = parse_m8(text, "cut.m8")
    last_start = text.rstrip("\n").rindex("\n") + 1
    dropped = kept = 0
    for cut in range(last_start + 1, len(text)):
        warnings: list[str] = []
        hits = parse_m8(text[:cut], "cut.m8", warnings)
        assert [hit.name for hit in hits[:299]] == [hit.name for hit in full[:299]]
        if len(hits) == 300:
            kept += 1
            assert warnings == []
            np.testing.assert_array_equal(hits[-1].query_indices, full[-1].query_indices)
            np.testing.assert_array_equal(hits[-1].hit_indices, full[-1].hit_indices)
        else:
            dropped += 1
            assert len(hits) == 299 and len(warnings) == 1
            assert warnings[0].startswith("cut.m8:300: file cut short: ") and warnings[0].endswith("its hit dropped")
            with pytest.raises(ParseError, match=r"^cut\.m8:300: .*\(file cut short\?\)$"):
                parse_m8(text[:cut], "cut.m8")
    assert (dropped, kept) == (len(text) - last_start - 2, 1)
    assert len(parse_m8(text[:last_start], "cut.m8", warnings := [])) == 299 and warnings == []
