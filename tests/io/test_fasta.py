import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from featurecache.io.common import ParseError
from featurecache.io.fasta import parse_fasta, read_fasta


def test_sample_fasta(shared_data):
    (record,) = read_fasta(shared_data / "alignments" / "openfold" / "short.fasta")
    assert record.id == "query" and len(record.sequence) == 73


def test_one_terminal_stop_is_dropped(shared_data):
    (record,) = read_fasta(shared_data / "alignments" / "openfold" / "short.fasta")
    text = f">query with stop\n{record.sequence[:40]}\n{record.sequence[40:].lower()}*\n"
    (stopped,) = parse_fasta(text, "stop.fasta")
    assert stopped.sequence == record.sequence and stopped.line == 1


def test_windows_file_with_byte_order_mark(shared_data):
    (record,) = read_fasta(shared_data / "alignments" / "openfold" / "short.fasta")
    data = ("\ufeff>query\r\n" + record.sequence[:30] + "\r\n" + record.sequence[30:] + "\r\n").encode("utf-8")
    (parsed,) = parse_fasta(data, "windows.fasta")
    assert (parsed.id, parsed.sequence) == ("query", record.sequence)


def test_multi_record_wrapped_lines_and_descriptions():
    text = ">sp|P1|A_HUMAN first protein\nMKT\nlla*\n\n; comment\n>second\nACGU\n"
    first, second = parse_fasta(text, "two.fasta")
    assert (first.id, first.description, first.sequence) == ("sp|P1|A_HUMAN", "first protein", "MKTLLA")
    assert (second.id, second.description, second.sequence) == ("second", "", "ACGU")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "no FASTA records"),
        ("MKT\n", "two.fasta:1: sequence before the first"),
        (">a\n>b\nMK\n", "two.fasta:1: record 'a' has no sequence"),
        (">a\n*\n", "two.fasta:1: record 'a' has no sequence"),
        (">a\nMK1T\n", "two.fasta:2: invalid character '1' at position 3 of record 'a'"),
        (">a\nMKT\nLL V\n", "two.fasta:3: invalid character ' ' at position 6 of record 'a'"),
        (">a\nMKTé\n", "two.fasta:2: invalid character 'é' at position 4"),
        ("> \nMK\n", "header without an id"),
        (">ok\nMK\n>gaps only\n----\n--\n", "two.fasta:3: record 'gaps' is all gaps \\(6 '-'\\)"),
        (">a\nMKT*LLV\n", r"two.fasta:1: record 'a' has a stop '\*' inside its sequence \(position 4\)"),
        (">a\nMKT**\n", r"two.fasta:1: record 'a' has a stop '\*' inside its sequence \(position 4\)"),
    ],
)
def test_malformed_fasta(text, message):
    with pytest.raises(ParseError, match=message):
        parse_fasta(text, "two.fasta")


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=120))
def test_garbage_only_raises_parse_error(text):
    try:
        records = parse_fasta(text, "fuzz.fasta")
    except ParseError:
        return
    assert all(record.sequence for record in records)
