"""The tool wrappers, run for real on the small databases of conftest.py."""

from __future__ import annotations

import os
import pickle
import random
import re
import signal
import stat
import subprocess
import sys
import time

import pytest

from featurecache.precompute.tools import (
    Hhblits,
    Hhsearch,
    Hmmsearch,
    Jackhmmer,
    Kalign,
    MmseqsSearch,
    Nhmmer,
    ToolError,
    ToolNotFoundError,
    ToolSettings,
    ToolTimeoutError,
)
from featurecache.precompute.tools.base import run_command

pytestmark = pytest.mark.tools

AMINO_ACIDS = "ACDEFGHIKLMNPQRSTVWY"
# mmseqs' ColabFold defaults (3 iterations at -s 8) take seconds per query; one fast pass is enough here.
FAST_MMSEQS = ToolSettings(threads=2, flags=("-s", "4", "-e", "0.1"))


def _stockholm_names(text: str) -> list[str]:
    names: list[str] = []
    for line in text.splitlines():
        if line.strip() and not line.startswith(("#", "//")):
            name = line.split()[0]
            if name not in names:
                names.append(name)
    return names


def _a3m_sequences(text: str) -> list[str]:
    return [chunk.split("\n", 1)[1].replace("\n", "") for chunk in text.split(">")[1:]]


def test_jackhmmer_finds_ras_homologs_and_caps_hits(test_databases, ras_sequence, tmp_path):
    tool = Jackhmmer(ToolSettings(threads=2), tmp_root=tmp_path)
    result = tool.search(ras_sequence, str(test_databases.protein_fasta))
    assert result.output_format == "sto" and result.text.startswith("# STOCKHOLM 1.0")
    names = _stockholm_names(result.text)
    assert names[0] == "query"  # HMMER writes the query row first; it is not counted as a hit
    assert result.num_hits == len(names) - 1 > 20
    assert re.fullmatch(r"HMMER 3\.\d+(\.\d+)?", result.version)
    # AlphaFold's jackhmmer flags, as run.
    assert "--F1 0.0005 --F2 0.00005 --F3 0.0000005" in " ".join(result.command)
    assert result.wall_seconds > 0

    capped = tool.search(ras_sequence, str(test_databases.protein_fasta), max_hits=7)
    assert capped.num_hits == 7
    assert _stockholm_names(capped.text) == names[:8]
    assert not os.listdir(tmp_path), "temporary folders must be removed"


def test_hhblits_searches_hhsuite_database(test_databases, ras_sequence):
    result = Hhblits(ToolSettings(threads=2)).search(ras_sequence, [str(test_databases.hhsuite_msa)], max_hits=10)
    assert result.output_format == "a3m"
    sequences = _a3m_sequences(result.text)
    assert sequences[0] == ras_sequence  # query first
    assert result.num_hits == len(sequences) - 1 == 10
    assert result.version.startswith("HHblits 3.")
    assert "-min_prefilter_hits 1000" in " ".join(result.command)


def test_hhsearch_and_hmmsearch_find_template_chains(test_databases, template_query):
    chains = {
        line[1:].split()[0] for line in test_databases.template_seqres.read_text().splitlines() if line.startswith(">")
    }
    query_msa = f">query\n{template_query}\n"

    hhr = Hhsearch(ToolSettings(threads=2)).search(query_msa, [str(test_databases.template_hhsuite)], max_hits=5)
    assert hhr.output_format == "hhr" and hhr.text.startswith("Query")
    hit_names = re.findall(r"^\s*\d+ (\S+)", hhr.text.split("No Hit", 1)[1], re.MULTILINE)
    assert 1 <= hhr.num_hits <= 5 and set(hit_names[: hhr.num_hits]) <= chains

    m8 = Hmmsearch(ToolSettings(threads=2)).search(query_msa, str(test_databases.template_seqres), max_hits=3)
    assert m8.output_format == "m8" and "--incdomE 100" in " ".join(m8.command)
    rows = [line.split("\t") for line in m8.text.splitlines()]
    assert 1 <= m8.num_hits == len(rows) <= 3 and {row[1] for row in rows} <= chains


def _seqres(test_databases) -> dict[str, str]:
    entries = test_databases.template_seqres.read_text().split(">")[1:]
    return {entry.split()[0]: "".join(entry.split("\n", 1)[1].split()) for entry in entries}


def _check_m8_against_sequences(row: list[str], query: str, target: str) -> None:
    """Walk the CIGAR: every column's residues must exist, and the identity column must agree."""
    query_position, target_position = int(row[6]) - 1, int(row[8]) - 1
    identical = columns = 0
    for count, op in re.findall(r"(\d+)([MID])", row[12]):
        for _ in range(int(count)):
            columns += 1
            if op == "M":
                identical += query[query_position] == target[target_position]
            query_position += op in "MI"
            target_position += op in "MD"
    assert (query_position, target_position) == (int(row[7]), int(row[9]))
    assert columns == int(row[3]) and abs(identical / columns - float(row[2])) < 1e-3


def test_hmmsearch_maps_hits_onto_the_query(test_databases, ras_sequence, template_query):
    seqres = _seqres(test_databases)
    tool = Hmmsearch(ToolSettings(threads=2))
    # H-Ras against the template set, which holds 721P (H-Ras) itself: an exact full-length hit.
    ras = [
        line.split("\t")
        for line in tool.search(f">q\n{ras_sequence}\n", str(test_databases.template_seqres)).text.splitlines()
    ]
    assert ras[0][1] in ("721p_A", "721p_B") and ras[0][2] == "1.000"
    assert ras[0][6:10] == ["1", str(len(ras_sequence)), "1", str(len(ras_sequence))]
    assert ras[0][12] == f"{len(ras_sequence)}M"
    # A remote query: gapped local hits whose CIGARs must agree with the sequences.
    rows = [
        line.split("\t")
        for line in tool.search(f">q\n{template_query}\n", str(test_databases.template_seqres)).text.splitlines()
    ]
    assert rows
    for row in rows:
        _check_m8_against_sequences(row, template_query, seqres[row[1]])
        assert float(row[10]) >= 0 and float(row[11]) != 0


@pytest.mark.slow  # MMseqs2 workflows write and reread several databases per query: ~5-20 s here
def test_mmseqs_gives_a3m_and_m8(test_databases):
    # 3ZEE and 4I6P are the same protein (chains 4i6p_A, 4i6p_B): each finds the other.
    query = _seqres(test_databases)["3zee_A"]
    tool = MmseqsSearch(FAST_MMSEQS)
    msa = tool.search(query, str(test_databases.template_mmseqs), max_hits=2)
    sequences = _a3m_sequences(msa.text)
    assert msa.output_format == "a3m" and sequences[0] == query
    assert msa.num_hits == len(sequences) - 1 == 2

    hits = tool.search(query, str(test_databases.template_mmseqs), output_format="m8")
    rows = [line.split("\t") for line in hits.text.splitlines()]
    assert hits.num_hits == len(rows) >= 3
    assert {"3zee_A", "4i6p_A", "4i6p_B"} <= {row[1] for row in rows}
    assert all(len(row) == 13 and re.fullmatch(r"(\d+[MID])+", row[12]) for row in rows)
    assert msa.version == hits.version and re.fullmatch(r"\d+-[0-9a-f]+\S*", msa.version)


def test_jackhmmer_without_hits_counts_none(tmp_path):
    rng = random.Random()
    database = tmp_path / "one.fasta"
    database.write_text(">1psm_A\nEAYKKAKQASQDAEQAAKDAENASKEAEEAAKEAVNLK\n")
    query = "".join(rng.choice(AMINO_ACIDS) for _ in range(60))
    result = Jackhmmer().search(query, str(database), max_hits=3)
    assert result.num_hits == 0 and "1psm_A" not in result.text


def test_nhmmer_finds_rna_homologs(test_databases, rna_sequence):
    result = Nhmmer(ToolSettings(threads=2)).search(rna_sequence, str(test_databases.nucleotide_fasta), "rna")
    assert result.output_format == "sto" and result.num_hits >= 1
    assert "--rna" in result.command and "--F3" in result.command
    with pytest.raises(ValueError, match="rna or dna"):
        Nhmmer().search(rna_sequence, str(test_databases.nucleotide_fasta), "protein")


def test_kalign_aligns_fresh_sequences():
    rng = random.Random()
    core = "".join(rng.choice(AMINO_ACIDS) for _ in range(rng.randint(40, 80)))
    sequences = [("a", core), ("b", core[5:] + "W" * 3), ("c", core[:20] + core[25:])]
    result = Kalign().align(sequences)
    aligned = dict(zip("abc", _a3m_sequences(result.text)))
    assert result.num_hits == 3 and len({len(row) for row in aligned.values()}) == 1
    assert {name: row.replace("-", "") for name, row in aligned.items()} == dict(sequences)
    assert result.version.startswith("kalign 3")


def test_timeout_kills_the_tool_and_cleans_up(test_databases, ras_sequence, tmp_path):
    # hhblits with three iterations takes seconds; a 0.2 s limit always trips.
    tool = Hhblits(ToolSettings(timeout_s=0.2), tmp_root=tmp_path)
    with pytest.raises(ToolTimeoutError, match="timed out after 0.2 s") as caught:
        tool.search(ras_sequence, [str(test_databases.hhsuite_msa)])
    assert caught.value.tool == "hhblits" and caught.value.command[0] == tool.binary
    assert not os.listdir(tmp_path)


def test_failing_tool_raises_with_stderr_tail(tmp_path, ras_sequence):
    corrupt = tmp_path / "corrupt.fasta"
    corrupt.write_bytes(b"this is not a FASTA file\n\x00\x01\x02")
    work = tmp_path / "work"
    with pytest.raises(ToolError) as caught:
        Jackhmmer(tmp_root=work).search(ras_sequence, str(corrupt))
    error = caught.value
    assert error.tool == "jackhmmer" and error.returncode not in (0, None)
    assert "corrupt.fasta" in error.stderr_tail or "format" in error.stderr_tail.lower()
    assert str(corrupt) in error.command
    assert "stderr" in str(error)
    copy = pickle.loads(pickle.dumps(error))  # crosses Ray's process boundary intact
    assert (copy.tool, copy.returncode, copy.stderr_tail, copy.command) == (
        error.tool,
        error.returncode,
        error.stderr_tail,
        error.command,
    )
    assert not os.listdir(work)


def test_bad_flag_error_names_the_flag(test_databases, ras_sequence):
    # HMMER reports command-line errors on stdout, not stderr.
    with pytest.raises(ToolError) as caught:
        Jackhmmer(ToolSettings(extra_flags=("--no-such-option",))).search(
            ras_sequence, str(test_databases.protein_fasta)
        )
    assert "No such option" in caught.value.stderr_tail and "No such option" in str(caught.value)


def test_corrupt_hhsuite_database_raises(tmp_path, test_databases, ras_sequence):
    prefix = tmp_path / "broken"
    for suffix in ("_a3m.ffdata", "_a3m.ffindex", "_cs219.ffdata", "_cs219.ffindex"):
        (tmp_path / f"broken{suffix}").write_text("garbage\tnot\tan\tindex\n")
    with pytest.raises(ToolError) as caught:
        Hhblits().search(ras_sequence, [str(prefix)])
    assert caught.value.returncode != 0 and caught.value.stderr_tail


def test_missing_binary_is_named(tmp_path):
    with pytest.raises(ToolNotFoundError, match="does not exist"):
        Jackhmmer(ToolSettings(binary=str(tmp_path / "jackhmmer")))
    with pytest.raises(ToolNotFoundError, match="not found on PATH"):
        Hhblits(ToolSettings(binary="featurecache-no-such-hhblits"))
    script = tmp_path / "not-executable"
    script.write_text("#!/bin/sh\n")
    script.chmod(stat.S_IRUSR)
    with pytest.raises(ToolNotFoundError):
        Kalign(ToolSettings(binary=str(script)))


def test_flags_override_and_extend_defaults():
    default = Jackhmmer()
    replaced = Jackhmmer(ToolSettings(flags=("-N", "3"), extra_flags=("--seed", "7")))
    assert default.flags == Jackhmmer.default_flags
    assert replaced.flags == ("-N", "3", "--seed", "7")
    assert default.identity() != replaced.identity()
    assert default.identity()["version"] == replaced.identity()["version"]
    # threads do not change results, so they stay out of the identity
    assert Jackhmmer(ToolSettings(threads=8)).identity() == default.identity()


def _pids_running(argv: list[str]) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as handle:
                    cmdline = handle.read().split(b"\0")[:-1]
                with open(f"/proc/{entry}/stat") as handle:
                    state = handle.read().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if [part.decode() for part in cmdline] == argv and state != "Z":
                found.append(int(entry))
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal is Linux's")
def test_tool_dies_with_a_worker_killed_by_sigkill(tmp_path):
    # A worker killed with SIGKILL runs no cleanup: the tool must not search on for nobody.
    marker = ["sleep", f"{random.randint(100_000, 999_999)}.5"]
    worker = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import pathlib, sys; from featurecache.precompute.tools.base import run_command; "
                f"run_command('sleep', {marker!r}, pathlib.Path({str(tmp_path)!r}), None)"
            ),
        ]
    )
    try:
        deadline = time.monotonic() + 30
        while not _pids_running(marker):
            assert worker.poll() is None, "the worker exited before starting its tool"
            assert time.monotonic() < deadline, "the tool never started"
            time.sleep(0.05)
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait()
        deadline = time.monotonic() + 10
        while _pids_running(marker):
            assert time.monotonic() < deadline, "the tool outlived its killed worker"
            time.sleep(0.05)
    finally:
        worker.kill()
        for pid in _pids_running(marker):
            os.kill(pid, signal.SIGKILL)


def test_command_not_on_path_is_named(tmp_path):
    with pytest.raises(ToolError, match="cannot start no-such-tool-xyz"):
        run_command("x", ["no-such-tool-xyz", "--help"], tmp_path, None)
