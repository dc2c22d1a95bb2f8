"""MMseqs2: an A3M MSA (``result2msa``) or m8 template hits with CIGAR (``convertalis``)."""

from __future__ import annotations

from pathlib import Path

from featurecache.io.convert import truncate_a3m
from featurecache.precompute.tools.base import (
    Tool,
    ToolResult,
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

    def search(self, sequence: str, database: str, max_hits: int | None = None, output_format: str = "a3m") -> ToolResult:
        if output_format not in ("a3m", "m8"):
            raise ValueError(f"mmseqs output_format must be 'a3m' or 'm8', got {output_format!r}")
        sequence = check_sequence(self.name, sequence)
        database = absolute_path(database)
        with self._workdir() as tmp:
            work = Path(tmp)
            write_fasta(work / "query.fasta", [("query", sequence)])
            common = ["--threads", str(self.threads), "-v", "1"]
            wall = run_command(self.name, [self.binary, "createdb", str(work / "query.fasta"), str(work / "qdb"), "-v", "1"],
                        work, self.timeout_s)
            command = [self.binary, "search", str(work / "qdb"), database, str(work / "result"), str(work / "tmp"),
                       *common, *self.flags]
            if output_format == "m8" and "-a" not in self.flags:
                command.append("-a")  # the CIGAR column needs the alignment backtrace
            wall += run_command(self.name, command, work, self.remaining_timeout(wall))
            if output_format == "a3m":
                convert = [self.binary, "result2msa", str(work / "qdb"), database, str(work / "result"),
                           str(work / "msa"), "--msa-format-mode", "6", *common]
                wall += run_command(self.name, convert, work, self.remaining_timeout(wall))
                text, count = truncate_a3m(_read_mmseqs_db(work / "msa"), None if max_hits is None else max_hits + 1)
                count = max(count - 1, 0)
            else:
                convert = [self.binary, "convertalis", str(work / "qdb"), database, str(work / "result"),
                           str(work / "hits.m8"), "--format-output", self.m8_columns, *common]
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
