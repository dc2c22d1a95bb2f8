"""HH-suite: hhblits (protein MSAs, A3M) and hhsearch (template hits, HHR)."""

from __future__ import annotations

import os
from collections.abc import Sequence
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


class Hhblits(Tool):
    """Protein query against HH-suite databases; A3M output (AlphaFold2: BFD + Uniclust30)."""

    name = "hhblits"
    binary_name = "hhblits"
    default_flags = (
        "-n",
        "3",
        "-e",
        "0.001",
        "-maxseq",
        "1000000",
        "-realign_max",
        "100000",
        "-maxfilt",
        "100000",
        "-min_prefilter_hits",
        "1000",
    )

    def search(self, sequence: str, databases: Sequence[str], max_hits: int | None = None) -> ToolResult:
        sequence = check_sequence(self.name, sequence)
        if not databases:
            raise ValueError("hhblits needs at least one database prefix")
        with self._workdir() as tmp:
            work = Path(tmp)
            write_fasta(work / "query.fasta", [("query", sequence)])
            output = work / "output.a3m"
            command = [
                self.binary,
                "-i",
                str(work / "query.fasta"),
                "-cpu",
                str(self.threads),
                "-oa3m",
                str(output),
                "-o",
                os.devnull,
                *self.flags,
            ]
            for database in databases:
                command += ["-d", absolute_path(database)]
            wall = run_command(self.name, command, work, self.timeout_s)
            # max_hits counts hits, the query row comes on top.
            text, count = truncate_a3m(output.read_text(errors="replace"), None if max_hits is None else max_hits + 1)
        return self._result("a3m", text, max(count - 1, 0), wall, command)


class Hhsearch(Tool):
    """Query MSA (A3M, query first) against HH-suite template databases; HHR output (AlphaFold2: PDB70)."""

    name = "hhsearch"
    binary_name = "hhsearch"
    default_flags = ("-maxseq", "1000000")

    def search(self, msa_a3m: str, databases: Sequence[str], max_hits: int | None = None) -> ToolResult:
        if not databases:
            raise ValueError("hhsearch needs at least one database prefix")
        if not msa_a3m.lstrip().startswith(">"):
            raise ValueError("hhsearch input must be an A3M alignment with the query first")
        with self._workdir() as tmp:
            work = Path(tmp)
            (work / "query.a3m").write_text(msa_a3m)
            output = work / "output.hhr"
            command = [
                self.binary,
                "-i",
                str(work / "query.a3m"),
                "-o",
                str(output),
                "-cpu",
                str(self.threads),
                *self.flags,
            ]
            if max_hits is not None:
                # The hit list and the alignment list hold between -z/-b (default 10) and -Z/-B
                # (default 500) entries; cap both maxima and keep the minima within them.
                floor = str(min(10, max_hits))
                command += ["-Z", str(max_hits), "-B", str(max_hits), "-z", floor, "-b", floor]
            for database in databases:
                command += ["-d", absolute_path(database)]
            wall = run_command(self.name, command, work, self.timeout_s)
            text = output.read_text(errors="replace")
        return self._result("hhr", text, _count_hhr_hits(text), wall, command)


def _count_hhr_hits(text: str) -> int:
    return sum(1 for line in text.splitlines() if line.startswith("No ") and line[3:].strip().isdigit())
