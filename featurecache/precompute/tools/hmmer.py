"""HMMER: jackhmmer (protein MSAs), nhmmer (RNA/DNA MSAs), hmmbuild + hmmsearch (templates).

Outputs are Stockholm (jackhmmer, nhmmer) capped at the database's hit count, and, for
hmmsearch, m8 hits with CIGAR mapped onto the query (``featurecache.io.convert``).
"""

from __future__ import annotations

import os
from pathlib import Path

from featurecache.io.convert import (
    a3m_to_stockholm,
    fasta_records,
    hmmsearch_to_m8,
    truncate_stockholm,
)
from featurecache.precompute.tools.base import (
    Tool,
    ToolError,
    ToolResult,
    ToolSettings,
    absolute_path,
    check_sequence,
    resolve_binary,
    run_command,
    tool_version,
    write_fasta,
)


class Jackhmmer(Tool):
    """Protein query against a FASTA database; Stockholm output (AlphaFold2: uniref90, mgnify)."""

    name = "jackhmmer"
    binary_name = "jackhmmer"
    default_flags = (
        "-N",
        "1",
        "-E",
        "0.0001",
        "--incE",
        "0.0001",
        "--F1",
        "0.0005",
        "--F2",
        "0.00005",
        "--F3",
        "0.0000005",
    )

    def search(self, sequence: str, database: str, max_hits: int | None = None) -> ToolResult:
        sequence = check_sequence(self.name, sequence)
        with self._workdir() as tmp:
            work = Path(tmp)
            write_fasta(work / "query.fasta", [("query", sequence)])
            output = work / "output.sto"
            command = [
                self.binary,
                "-o",
                os.devnull,
                "-A",
                str(output),
                "--noali",
                "--cpu",
                str(self.threads),
                *self.flags,
                str(work / "query.fasta"),
                absolute_path(database),
            ]
            wall = run_command(self.name, command, work, self.timeout_s)
            text, count = _capped_hmmer_alignment(output, max_hits)
        return self._result("sto", text, count, wall, command)


def _capped_hmmer_alignment(path: Path, max_hits: int | None) -> tuple[str, int]:
    """jackhmmer/nhmmer ``-A`` output capped at ``max_hits`` hits, and its hit count.

    HMMER writes the query itself as the first row (named "query" here) even with no hits; it is
    kept on top of the cap and not counted, as the query row of A3M outputs is not.
    """
    if not path.exists():  # nothing passed the inclusion thresholds
        return "", 0
    first, _ = truncate_stockholm(path, 1)
    has_query = any(
        line.split(maxsplit=1)[0] == "query"
        for line in first.splitlines()
        if line.strip() and not line.startswith(("#", "//"))
    )
    cap = None if max_hits is None else max_hits + has_query
    text, count = truncate_stockholm(path, cap)
    return text, count - has_query


class Nhmmer(Tool):
    """RNA/DNA query against a nucleotide FASTA database; Stockholm output (AlphaFold3: Rfam, RNAcentral, NT)."""

    name = "nhmmer"
    binary_name = "nhmmer"
    default_flags = ("-E", "0.001", "--incE", "0.001", "--watson")
    # AlphaFold3 loosens the third filter for short queries, which otherwise find nothing.
    f3_default = "0.00005"
    f3_short_query = "0.02"
    short_query_length = 50

    def identity(self) -> dict:
        identity = super().identity()
        identity["f3"] = [self.f3_default, self.f3_short_query, self.short_query_length]
        return identity

    def search(self, sequence: str, database: str, molecule_type: str, max_hits: int | None = None) -> ToolResult:
        if molecule_type not in ("rna", "dna"):
            raise ValueError(f"nhmmer searches rna or dna chains, got molecule type {molecule_type!r}")
        sequence = check_sequence(self.name, sequence)
        flags = list(self.flags)
        if "--F3" not in flags:
            f3 = self.f3_short_query if len(sequence) < self.short_query_length else self.f3_default
            flags += ["--F3", f3]
        with self._workdir() as tmp:
            work = Path(tmp)
            write_fasta(work / "query.fasta", [("query", sequence)])
            output = work / "output.sto"
            command = [
                self.binary,
                "-o",
                os.devnull,
                "-A",
                str(output),
                "--noali",
                "--cpu",
                str(self.threads),
                f"--{molecule_type}",
                *flags,
                str(work / "query.fasta"),
                absolute_path(database),
            ]
            wall = run_command(self.name, command, work, self.timeout_s)
            text, count = _capped_hmmer_alignment(output, max_hits)
        return self._result("sto", text, count, wall, command)


class Hmmsearch(Tool):
    """Profile HMM from the query MSA (hmmbuild) searched against a template seqres FASTA (hmmsearch).

    AlphaFold2-multimer's and AlphaFold3's template search. hmmbuild ``--hand`` keeps one match
    state per query residue, so hmmsearch's alignment maps every hit residue onto the query; the
    result is that mapping as 13-column m8 (one line per hit domain, CIGAR included, E-value and
    bit score from ``--domtblout``), the format MMseqs2 template hits come in too.
    """

    name = "hmmsearch"
    binary_name = "hmmsearch"
    default_flags = (
        "--F1",
        "0.1",
        "--F2",
        "0.1",
        "--F3",
        "0.1",
        "-E",
        "100",
        "--incE",
        "100",
        "--domE",
        "100",
        "--incdomE",
        "100",
    )
    hmmbuild_default_flags = ("--hand", "--amino")

    def __init__(
        self,
        settings: ToolSettings | None = None,
        hmmbuild_settings: ToolSettings | None = None,
        tmp_root: str | os.PathLike | None = None,
    ) -> None:
        super().__init__(settings, tmp_root)
        hmmbuild_settings = hmmbuild_settings or ToolSettings()
        self.hmmbuild_binary = resolve_binary("hmmbuild", hmmbuild_settings.binary)
        base = self.hmmbuild_default_flags if hmmbuild_settings.flags is None else hmmbuild_settings.flags
        self.hmmbuild_flags: tuple[str, ...] = tuple(base) + tuple(hmmbuild_settings.extra_flags)

    def identity(self) -> dict:
        identity = super().identity()
        identity["hmmbuild"] = {
            "version": tool_version(self.hmmbuild_binary, self.version_args),
            "flags": list(self.hmmbuild_flags),
        }
        identity["output"] = "m8 from -A and --domtblout"
        return identity

    def search(self, msa_a3m: str, database: str, max_hits: int | None = None) -> ToolResult:
        """Hits of the profile built from ``msa_a3m`` (A3M, query first), at most ``max_hits`` domains."""
        query_msa = a3m_to_stockholm(msa_a3m)
        query = "".join(char for char in fasta_records(msa_a3m)[0][1] if char.isupper())
        with self._workdir() as tmp:
            work = Path(tmp)
            (work / "query.sto").write_text(query_msa)
            profile = work / "query.hmm"
            build = [
                self.hmmbuild_binary,
                *self.hmmbuild_flags,
                "--cpu",
                str(self.threads),
                str(profile),
                str(work / "query.sto"),
            ]
            wall = run_command("hmmbuild", build, work, self.timeout_s)
            output, domains = work / "output.sto", work / "domains.tbl"
            command = [
                self.binary,
                "--noali",
                "-o",
                os.devnull,
                "-A",
                str(output),
                "--domtblout",
                str(domains),
                "--cpu",
                str(self.threads),
                *self.flags,
                str(profile),
                absolute_path(database),
            ]
            wall += run_command(self.name, command, work, self.remaining_timeout(wall))
            if not output.exists():  # hmmsearch writes no alignment when nothing passes the thresholds
                return self._result("m8", "", 0, wall, command)
            sto_text, _ = truncate_stockholm(output, max_hits)
            try:
                text = hmmsearch_to_m8(sto_text, domains.read_text(), query)
            except ValueError as error:
                raise ToolError(
                    self.name, 0, "", command, f"hmmsearch output cannot be mapped to the query: {error}"
                ) from None
        return self._result("m8", text, text.count("\n"), wall, command)
