"""kalign: multiple alignment of a handful of sequences."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from featurecache.io.convert import fasta_records
from featurecache.precompute.tools.base import (
    Tool,
    ToolResult,
    check_sequence,
    run_command,
    write_fasta,
)


class Kalign(Tool):
    """Multiple alignment of a handful of sequences (e.g. realigning a template to the query)."""

    name = "kalign"
    binary_name = "kalign"
    version_args = ("--version",)
    default_flags = ()

    def align(self, sequences: Sequence[tuple[str, str]], molecule_type: str = "protein") -> ToolResult:
        """Aligned FASTA of ``(name, sequence)`` pairs, in kalign's output order."""
        if len(sequences) < 2:
            raise ValueError(f"kalign needs at least 2 sequences, got {len(sequences)}")
        kinds = {"protein": "protein", "rna": "rna", "dna": "dna"}
        if molecule_type not in kinds:
            raise ValueError(f"kalign aligns protein, rna or dna, got {molecule_type!r}")
        for name, sequence in sequences:
            if not name or any(char.isspace() for char in name):
                raise ValueError(f"kalign sequence names must be non-empty without spaces, got {name!r}")
            check_sequence(self.name, sequence)
        with self._workdir() as tmp:
            work = Path(tmp)
            write_fasta(work / "input.fasta", sequences)
            output = work / "output.fasta"
            command = [
                self.binary,
                "-i",
                str(work / "input.fasta"),
                "-o",
                str(output),
                "--format",
                "fasta",
                "--type",
                kinds[molecule_type],
                "-n",
                str(self.threads),
                *self.flags,
            ]
            wall = run_command(self.name, command, work, self.timeout_s)
            text = output.read_text()
        records = fasta_records(text)
        return self._result("fasta", "".join(f">{n}\n{s}\n" for n, s in records), len(records), wall, command)
