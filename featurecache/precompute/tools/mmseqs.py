"""MMseqs2: an A3M MSA (``result2msa``) or m8 template hits with CIGAR (``convertalis``), and
the clustering of chain sequences (``easy-cluster``) behind AF3's sampling weights."""

from __future__ import annotations

from pathlib import Path

from featurecache.io.convert import truncate_a3m
from featurecache.precompute.tools.base import (
    Tool,
    ToolError,
    ToolResult,
    ToolSettings,
    absolute_path,
    check_sequence,
    run_command,
    write_fasta,
)


class MmseqsSearch(Tool):
    """Query against an MMseqs2 database (made with ``mmseqs createdb``).

    ``output_format="a3m"`` gives an MSA (``result2msa``, query first, ColabFold style);
    ``"m8"`` gives tabular hits with a CIGAR column (``convertalis``), for template search
    against a PDB seqres database.
    """

    name = "mmseqs"
    binary_name = "mmseqs"
    version_args = ("version",)
    default_flags = ("--num-iterations", "3", "-s", "8", "-e", "0.1", "--max-seqs", "10000", "-a")
    m8_columns = "query,target,fident,alnlen,mismatch,gapopen,qstart,qend,tstart,tend,evalue,bits,cigar"

    def identity(self) -> dict:
        identity = super().identity()
        identity["m8_columns"] = self.m8_columns
        return identity

    def search(
        self, sequence: str, database: str, max_hits: int | None = None, output_format: str = "a3m"
    ) -> ToolResult:
        if output_format not in ("a3m", "m8"):
            raise ValueError(f"mmseqs output_format must be 'a3m' or 'm8', got {output_format!r}")
        sequence = check_sequence(self.name, sequence)
        database = absolute_path(database)
        with self._workdir() as tmp:
            work = Path(tmp)
            write_fasta(work / "query.fasta", [("query", sequence)])
            common = ["--threads", str(self.threads), "-v", "1"]
            wall = run_command(
                self.name,
                [self.binary, "createdb", str(work / "query.fasta"), str(work / "qdb"), "-v", "1"],
                work,
                self.timeout_s,
            )
            command = [
                self.binary,
                "search",
                str(work / "qdb"),
                database,
                str(work / "result"),
                str(work / "tmp"),
                *common,
                *self.flags,
            ]
            if output_format == "m8" and "-a" not in self.flags:
                command.append("-a")  # the CIGAR column needs the alignment backtrace
            wall += run_command(self.name, command, work, self.remaining_timeout(wall))
            if output_format == "a3m":
                convert = [
                    self.binary,
                    "result2msa",
                    str(work / "qdb"),
                    database,
                    str(work / "result"),
                    str(work / "msa"),
                    "--msa-format-mode",
                    "6",
                    *common,
                ]
                wall += run_command(self.name, convert, work, self.remaining_timeout(wall))
                text, count = truncate_a3m(_read_mmseqs_db(work / "msa"), None if max_hits is None else max_hits + 1)
                count = max(count - 1, 0)
            else:
                convert = [
                    self.binary,
                    "convertalis",
                    str(work / "qdb"),
                    database,
                    str(work / "result"),
                    str(work / "hits.m8"),
                    "--format-output",
                    self.m8_columns,
                    *common,
                ]
                wall += run_command(self.name, convert, work, self.remaining_timeout(wall))
                lines = [line for line in (work / "hits.m8").read_text().splitlines() if line.strip()]
                if max_hits is not None:
                    lines = lines[:max_hits]
                text, count = "".join(line + "\n" for line in lines), len(lines)
        return self._result(output_format, text, count, wall, command)


def _read_mmseqs_db(prefix: Path) -> str:
    # One query, so the database's data file holds one NUL-terminated entry (or several split files).
    parts = sorted(prefix.parent.glob(prefix.name + ".[0-9]*")) if not prefix.exists() else [prefix]
    return "".join(part.read_text(errors="replace") for part in parts)


class MmseqsCluster(Tool):
    """``mmseqs easy-cluster`` over a set of sequences of one kind (protein or nucleotide).

    Only the binary, threads and timeout of the [tools.mmseqs] settings apply: the search
    flags there are for ``mmseqs search``.
    """

    name = "mmseqs"
    binary_name = "mmseqs"
    version_args = ("version",)
    # The nucleotide k-mer index at MMseqs2's default k (15) takes 8 GB even for ten sequences;
    # k = 11 is ample for the identities nucleic acids are clustered at (100 %).
    nucleotide_kmer = 11

    def __init__(self, settings: ToolSettings | None = None, tmp_root=None) -> None:
        settings = settings or ToolSettings()
        super().__init__(
            ToolSettings(binary=settings.binary, threads=settings.threads, timeout_s=settings.timeout_s), tmp_root
        )

    def cluster(
        self, sequences: dict[str, str], min_seq_id: float, coverage: float, nucleotide: bool
    ) -> dict[str, str]:
        """Each sequence name -> the name of its cluster's representative."""
        if len(sequences) < 2:
            return {name: name for name in sequences}
        with self._workdir() as tmp:
            work = Path(tmp)
            write_fasta(work / "input.fasta", sequences.items())
            command = [
                self.binary,
                "easy-cluster",
                str(work / "input.fasta"),
                str(work / "out"),
                str(work / "tmp"),
                "--min-seq-id",
                f"{min_seq_id:g}",
                "-c",
                f"{coverage:g}",
                "--cov-mode",
                "0",
                "--dbtype",
                "2" if nucleotide else "1",
                "--threads",
                str(self.threads),
                "-v",
                "1",
            ]
            if nucleotide:
                command += ["-k", str(self.nucleotide_kmer)]
            run_command(self.name, command, work, self.timeout_s)
            representative = {}
            for line in (work / "out_cluster.tsv").read_text().splitlines():
                if line.strip():
                    rep, member = line.split("\t")
                    representative[member] = rep
        missing = sorted(set(sequences) - set(representative))
        if missing:
            raise ToolError(self.name, 0, "", command, f"mmseqs easy-cluster left out sequences {missing[:5]}")
        return representative
