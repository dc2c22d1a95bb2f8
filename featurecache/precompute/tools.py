"""Subprocess wrappers for the MSA and template search tools.

One class per tool (HMMER's jackhmmer, nhmmer, hmmbuild + hmmsearch; HH-suite's hhblits and
hhsearch; MMseqs2; kalign). Each wrapper

- resolves its binary from a configured path or ``PATH`` (``ToolNotFoundError`` otherwise),
- detects the tool's version once per process (it goes into the search fingerprint),
- runs with the AlphaFold2/3 and OpenFold flags by default, overridable from the config,
- runs in a fresh temporary folder that is removed afterwards, whatever happens,
- enforces a timeout by killing the tool's whole process group (the Debian HH-suite binaries are
  shell wrappers that start the real SIMD build as a child, so killing the shell is not enough),
- caps the hits it returns per database,
- raises ``ToolError`` carrying the tail of the tool's stderr when the tool fails.

Outputs are returned as raw text (Stockholm, A3M, HHR or m8); parsing belongs to
``featurecache.io``. The few format conversions here feed one tool's output into another tool's
input (an MSA into hmmbuild or hhsearch), and turn hmmsearch's alignment to the query profile
into m8 hits with CIGAR, the residue mapping every template hit needs.
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

STDERR_TAIL_BYTES = 4096
VERSION_TIMEOUT_S = 60.0

OUTPUT_FORMATS = ("sto", "a3m", "hhr", "m8", "fasta")


class ToolError(RuntimeError):
    """A search tool failed: which tool, its exit status, the end of its output, the command.

    ``stderr_tail`` holds the last few KB of stderr, followed by stdout's under a ``[stdout]``
    line when the tool wrote any there (HMMER prints command-line errors on stdout).
    """

    def __init__(
        self,
        tool: str,
        returncode: int | None,
        stderr_tail: str,
        command: Sequence[str],
        message: str | None = None,
    ) -> None:
        self.tool = tool
        self.returncode = returncode
        self.stderr_tail = stderr_tail
        self.command = tuple(command)
        self.message = message or f"{tool} exited with status {returncode}"
        super().__init__(self.message)

    def __str__(self) -> str:
        text = f"{self.message}\n  command: {shlex.join(self.command)}" if self.command else self.message
        if self.stderr_tail:
            text += f"\n  stderr (tail):\n{self.stderr_tail}"
        return text

    def __reduce__(self):
        # Exceptions cross process boundaries (Ray tasks); rebuild from all fields, not just args.
        return (type(self), (self.tool, self.returncode, self.stderr_tail, self.command, self.message))


class ToolNotFoundError(ToolError):
    """The tool's binary is neither at its configured path nor on PATH."""

    def __init__(self, tool: str, returncode=None, stderr_tail: str = "", command=(), message=None) -> None:
        super().__init__(tool, returncode, stderr_tail, command, message or f"tool binary {tool!r} not found")


class ToolTimeoutError(ToolError):
    """The tool ran past its timeout and was killed."""


@dataclass(frozen=True)
class ToolSettings:
    """Per-tool settings from the pipeline config.

    ``flags`` replaces the tool's default search flags; ``extra_flags`` is appended to whichever
    flags are in effect. Threads and timeout do not change results, so they are not part of the
    fingerprint.
    """

    binary: str | None = None
    threads: int = 1
    timeout_s: float | None = None
    flags: tuple[str, ...] | None = None
    extra_flags: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")
        if self.timeout_s is not None and self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")


@dataclass(frozen=True)
class ToolResult:
    """One tool run: its raw output and how it was produced."""

    tool: str
    output_format: str           # one of OUTPUT_FORMATS
    text: str                    # the raw output, capped to max_hits
    num_hits: int                # hits in ``text`` after the cap (sequences, or HHR/m8 hit lines)
    wall_seconds: float          # time spent in the tool's processes
    command: tuple[str, ...]     # the main command, as run (temporary paths included)
    version: str


def resolve_binary(name: str, override: str | None = None) -> str:
    """Absolute path of a tool binary: ``override`` (a path or a name on PATH), else ``name`` on PATH."""
    wanted = override or name
    if os.sep in wanted:
        path = Path(wanted).expanduser()
        if path.is_file() and os.access(path, os.X_OK):
            return str(path.resolve())
        raise ToolNotFoundError(name, message=f"{name}: configured binary {wanted} does not exist or is not executable")
    found = shutil.which(wanted)
    if found is None:
        raise ToolNotFoundError(name, message=f"{name}: binary {wanted!r} not found on PATH")
    return found


@functools.lru_cache(maxsize=64)
def _version_of(binary: str, args: tuple[str, ...], mtime_ns: int) -> str:
    # mtime_ns is part of the cache key so a binary upgraded in place is detected again.
    try:
        completed = subprocess.run(
            [binary, *args], capture_output=True, text=True, timeout=VERSION_TIMEOUT_S, errors="replace"
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise ToolError(Path(binary).name, None, "", [binary, *args], f"cannot run {binary} to read its version: {error}")
    text = completed.stdout + "\n" + completed.stderr
    patterns = (
        r"#\s*(HMMER\s+\d+\.\d+[\w.]*)",         # jackhmmer -h: "# HMMER 3.3.2 (Nov 2020); ..."
        r"^(HH\w+\s+\d+\.\d+\.\d+)",             # hhblits -h: "HHblits 3.3.0:"
        r"^(kalign\s+\d+\.\d+[\w.]*)",          # kalign --version: "kalign 3.3.5"
        r"^(\d+[-.][0-9a-f]+\S*)\s*$",           # mmseqs version: "14-7e284+ds-1+b2"
    )
    for pattern in patterns:
        match = re.search(pattern, text, re.MULTILINE)
        if match:
            return match.group(1)
    raise ToolError(
        Path(binary).name,
        completed.returncode,
        _tail(text),
        [binary, *args],
        f"cannot find a version in the output of {shlex.join([binary, *args])}",
    )


def tool_version(binary: str, args: Sequence[str]) -> str:
    """The version string a binary prints for ``args`` (cached per process and binary mtime)."""
    return _version_of(binary, tuple(args), os.stat(binary).st_mtime_ns)


def _tail(text: str, limit: int = STDERR_TAIL_BYTES) -> str:
    return text if len(text) <= limit else "..." + text[-limit:]


def _read_tail(path: Path, limit: int = STDERR_TAIL_BYTES) -> str:
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - limit))
            data = handle.read()
    except FileNotFoundError:
        return ""
    text = data.decode("utf-8", errors="replace")
    return ("..." if size > limit else "") + text


@functools.lru_cache(maxsize=1)
def _die_with_parent_prefix() -> tuple[str, ...]:
    """A prefix that makes a tool die with the process that started it (Linux, util-linux).

    A worker killed with SIGKILL (a Ray node lost, the OOM killer) runs no cleanup, and its tool,
    in a session of its own, would otherwise search on for hours with nobody to read the result.
    setpriv sets the parent-death signal and execs the tool, so the tool keeps its pid.
    """
    setpriv = shutil.which("setpriv") if sys.platform.startswith("linux") else None
    return (setpriv, "--pdeathsig", "KILL", "--") if setpriv else ()


def _run(tool: str, command: Sequence[str], workdir: Path, timeout_s: float | None) -> float:
    """Run one command in ``workdir``; return its wall time.

    stdout and stderr go to files in ``workdir`` (never pipes a chatty tool could fill); on
    failure the error carries both tails, since HMMER reports command-line errors on stdout.
    """
    stdout_path, stderr_path = workdir / f"{tool}.stdout", workdir / f"{tool}.stderr"
    start = time.perf_counter()
    resolvable = os.path.isabs(command[0]) or os.sep not in command[0]  # else relative to workdir
    if resolvable and shutil.which(command[0]) is None:  # behind setpriv: setpriv's exit 127
        raise ToolError(tool, None, "", command, f"{tool}: cannot start {command[0]}: not found or not executable")
    with open(stdout_path, "wb") as stdout, open(stderr_path, "wb") as stderr:
        try:
            process = subprocess.Popen(
                [*_die_with_parent_prefix(), *command],
                cwd=workdir,
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
                start_new_session=True,  # own process group, so a timeout kills the wrapper's children too
            )
        except OSError as error:
            raise ToolError(tool, None, "", command, f"{tool}: cannot start {command[0]}: {error}") from error
        try:
            returncode = process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(process)
            raise ToolTimeoutError(
                tool, None, _output_tail(stdout_path, stderr_path), command,
                f"{tool} timed out after {timeout_s:g} s and was killed",
            ) from None
        except BaseException:
            _kill_group(process)
            raise
    if returncode != 0:
        raise ToolError(tool, returncode, _output_tail(stdout_path, stderr_path), command)
    return time.perf_counter() - start


def _output_tail(stdout_path: Path, stderr_path: Path) -> str:
    stderr = _read_tail(stderr_path).strip("\n")
    stdout = _read_tail(stdout_path).strip("\n")
    if not stdout:
        return stderr
    return f"{stderr}\n[stdout]\n{stdout}" if stderr else f"[stdout]\n{stdout}"


def _kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def _write_fasta(path: Path, records: Iterable[tuple[str, str]]) -> None:
    with open(path, "w") as handle:
        for name, sequence in records:
            handle.write(f">{name}\n{sequence}\n")


def _absolute(path: str) -> str:
    # Tools run inside their temporary folder, so relative database paths must be resolved first.
    return os.path.abspath(os.path.expanduser(path))


def _check_sequence(tool: str, sequence: str) -> str:
    sequence = "".join(sequence.split()).upper()
    if not sequence or not sequence.isalpha():
        raise ValueError(f"{tool}: query sequence must be non-empty letters, got {sequence[:40]!r}")
    return sequence


# --- output caps -------------------------------------------------------------------------------


def truncate_stockholm(path: str | os.PathLike, max_sequences: int | None) -> tuple[str, int]:
    """Read a Stockholm file keeping only its first ``max_sequences`` sequences (all when None).

    Order is that of the sequence rows (jackhmmer writes the query row first, then the hits by
    E-value; the #=GS lines come in another order). Streams the file twice, so a multi-gigabyte
    output is never held whole in memory. Returns the kept text and its number of sequences.
    Per-sequence annotation (#=GS, #=GR) of dropped sequences is dropped too; file and column
    annotation is kept.
    """
    order: list[str] = []
    seen: set[str] = set()
    with open(path, errors="replace") as handle:
        for line in handle:
            if line.startswith("#") or not line.strip() or line.startswith("//"):
                continue
            name = line.split(maxsplit=1)[0]
            if name not in seen:
                seen.add(name)
                order.append(name)
                if max_sequences is not None and len(order) >= max_sequences:
                    break
    kept = set(order)
    lines: list[str] = []
    with open(path, errors="replace") as handle:
        for line in handle:
            stripped = line.strip()
            if stripped.startswith(("#=GS", "#=GR")):
                parts = stripped.split(maxsplit=2)
                if len(parts) > 1 and parts[1] in kept:
                    lines.append(line)
            elif not stripped or stripped.startswith("#") or stripped == "//":
                lines.append(line)
            elif stripped.split(maxsplit=1)[0] in kept:
                lines.append(line)
    return "".join(lines), len(order)


def truncate_a3m(text: str, max_sequences: int | None) -> tuple[str, int]:
    """Keep the first ``max_sequences`` records of an A3M/FASTA text; returns (text, count)."""
    records = _fasta_records(text)
    if max_sequences is not None:
        records = records[:max_sequences]
    return "".join(f">{name}\n{sequence}\n" for name, sequence in records), len(records)


def _fasta_records(text: str) -> list[tuple[str, str]]:
    # NUL bytes separate entries in MMseqs2 flat database files.
    records: list[tuple[str, list[str]]] = []
    for line in text.replace("\x00", "").splitlines():
        if line.startswith(">"):
            records.append((line[1:].rstrip(), []))
        elif line.strip() and records:
            records[-1][1].append(line.strip())
    return [(name, "".join(parts)) for name, parts in records]


# --- MSA conversions for tool inputs -----------------------------------------------------------


def _stockholm_rows(sto_text: str) -> tuple[dict[str, str], str]:
    """Aligned rows by name (blocks joined, file order) and the ``#=GC RF`` line of a Stockholm file."""
    rows: dict[str, list[str]] = {}
    reference: list[str] = []
    for line in sto_text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#=GC RF"):
            reference.append(stripped.split()[2])
        elif stripped and not stripped.startswith("#") and stripped != "//":
            parts = stripped.split()
            if len(parts) == 2:
                rows.setdefault(parts[0], []).append(parts[1])
    return {name: "".join(parts) for name, parts in rows.items()}, "".join(reference)


def stockholm_to_a3m(sto_text: str, query_sequence: str) -> str:
    """A3M with the query first, from a HMMER Stockholm alignment built on that query.

    Match columns are taken from ``#=GC RF`` (HMMER writes it for -A output); residues there
    become upper case or '-', insert columns become lower-case letters with their gaps removed.
    Rows are added in file order. The query is prepended unless the first row already is the
    query (jackhmmer's output starts with it; hmmsearch's does not).
    """
    sequences, reference = _stockholm_rows(sto_text)
    query = "".join(query_sequence.split()).upper()
    if not sequences:
        return f">query\n{query}\n"
    if not reference:
        raise ValueError("Stockholm alignment has no '#=GC RF' line: cannot tell match from insert columns")
    match_columns = [char not in ".-~" for char in reference]
    if sum(match_columns) != len(query):
        raise ValueError(
            f"Stockholm alignment has {sum(match_columns)} match columns but the query has {len(query)} "
            "residues: it was not built on this query (jackhmmer -N 1 keeps one column per residue)"
        )
    rows: list[str] = []
    for name, aligned in sequences.items():
        if len(aligned) != len(match_columns):
            raise ValueError(
                f"Stockholm row {name} has {len(aligned)} columns, the #=GC RF line has {len(match_columns)}"
            )
        row = []
        for char, is_match in zip(aligned, match_columns):
            if is_match:
                row.append("-" if char in ".-~" else char.upper())
            elif char not in ".-~":
                row.append(char.lower())
        rows.append(f">{name}\n{''.join(row)}\n")
    if rows[0].split("\n")[1] != query:
        rows.insert(0, f">query\n{query}\n")
    return "".join(rows)


def a3m_to_stockholm(a3m_text: str) -> str:
    """Stockholm with a ``#=GC RF`` line from an A3M (query first), for ``hmmbuild --hand``.

    A3M stores insertions as lower-case letters of any length between match columns; Stockholm
    needs every row the same width, so each insertion slot is padded to the longest insertion
    any row has there. The RF line marks the query's match columns 'x', insert columns '.'.
    """
    records = _fasta_records(a3m_text)
    if not records:
        raise ValueError("A3M text has no sequences")
    parsed: list[tuple[list[str], list[str]]] = []  # per row: match characters, insertion after each slot
    for index, (name, sequence) in enumerate(records):
        matches: list[str] = []
        inserts: list[str] = [""]
        for char in sequence:
            if char.isupper() or char == "-":
                matches.append(char)
                inserts.append("")
            elif char.islower():
                inserts[-1] += char
            elif char != ".":
                raise ValueError(f"A3M row {index} ({name}) has an unexpected character {char!r}")
        parsed.append((matches, inserts))
    width = len(parsed[0][0])
    for index, (matches, _) in enumerate(parsed):
        if len(matches) != width:
            raise ValueError(f"A3M row {index} ({records[index][0]}) has {len(matches)} match columns, the query {width}")
    slot_widths = [max(len(inserts[slot]) for _, inserts in parsed) for slot in range(width + 1)]
    reference = "".join("." * slot_widths[0] + "".join("x" + "." * w for w in slot_widths[1:]))
    lines = ["# STOCKHOLM 1.0", ""]
    names = [f"row{index}" for index in range(len(records))]
    name_width = max(len("#=GC RF"), *(len(name) for name in names)) + 1
    for name, (matches, inserts) in zip(names, parsed):
        row = [inserts[0].ljust(slot_widths[0], ".")]
        for slot, char in enumerate(matches, start=1):
            row.append(char + inserts[slot].ljust(slot_widths[slot], "."))
        lines.append(name.ljust(name_width) + "".join(row))
    lines.append("#=GC RF".ljust(name_width) + reference)
    lines.append("//")
    return "\n".join(lines) + "\n"


# --- the tools ---------------------------------------------------------------------------------


class Tool:
    """Common part of the wrappers: binary, version, flags, threads, timeout, temporary folders."""

    name: ClassVar[str]
    binary_name: ClassVar[str]
    version_args: ClassVar[tuple[str, ...]] = ("-h",)
    default_flags: ClassVar[tuple[str, ...]] = ()

    def __init__(self, settings: ToolSettings | None = None, tmp_root: str | os.PathLike | None = None) -> None:
        settings = settings or ToolSettings()
        self.binary = resolve_binary(self.binary_name, settings.binary)
        base = self.default_flags if settings.flags is None else settings.flags
        self.flags: tuple[str, ...] = tuple(base) + tuple(settings.extra_flags)
        self.threads = settings.threads
        self.timeout_s = settings.timeout_s
        self.tmp_root = None if tmp_root is None else str(tmp_root)

    @property
    def version(self) -> str:
        return tool_version(self.binary, self.version_args)

    def identity(self) -> dict:
        """What about this tool changes its results: name, version and flags (for fingerprints)."""
        return {"tool": self.name, "version": self.version, "flags": list(self.flags)}

    def _workdir(self) -> tempfile.TemporaryDirectory:
        if self.tmp_root is not None:
            os.makedirs(self.tmp_root, exist_ok=True)
        return tempfile.TemporaryDirectory(prefix=f"featurecache-{self.name}-", dir=self.tmp_root)

    def _result(self, output_format: str, text: str, num_hits: int, wall: float, command: Sequence[str]) -> ToolResult:
        return ToolResult(self.name, output_format, text, num_hits, wall, tuple(command), self.version)


class Jackhmmer(Tool):
    """Protein query against a FASTA database; Stockholm output (AlphaFold2: uniref90, mgnify)."""

    name = "jackhmmer"
    binary_name = "jackhmmer"
    default_flags = ("-N", "1", "-E", "0.0001", "--incE", "0.0001", "--F1", "0.0005", "--F2", "0.00005", "--F3", "0.0000005")

    def search(self, sequence: str, database: str, max_hits: int | None = None) -> ToolResult:
        sequence = _check_sequence(self.name, sequence)
        with self._workdir() as tmp:
            work = Path(tmp)
            _write_fasta(work / "query.fasta", [("query", sequence)])
            output = work / "output.sto"
            command = [self.binary, "-o", os.devnull, "-A", str(output), "--noali", "--cpu", str(self.threads),
                       *self.flags, str(work / "query.fasta"), _absolute(database)]
            wall = _run(self.name, command, work, self.timeout_s)
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
    has_query = any(line.split(maxsplit=1)[0] == "query" for line in first.splitlines()
                    if line.strip() and not line.startswith(("#", "//")))
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
        sequence = _check_sequence(self.name, sequence)
        flags = list(self.flags)
        if "--F3" not in flags:
            f3 = self.f3_short_query if len(sequence) < self.short_query_length else self.f3_default
            flags += ["--F3", f3]
        with self._workdir() as tmp:
            work = Path(tmp)
            _write_fasta(work / "query.fasta", [("query", sequence)])
            output = work / "output.sto"
            command = [self.binary, "-o", os.devnull, "-A", str(output), "--noali", "--cpu", str(self.threads),
                       f"--{molecule_type}", *flags, str(work / "query.fasta"), _absolute(database)]
            wall = _run(self.name, command, work, self.timeout_s)
            text, count = _capped_hmmer_alignment(output, max_hits)
        return self._result("sto", text, count, wall, command)


class Hhblits(Tool):
    """Protein query against HH-suite databases; A3M output (AlphaFold2: BFD + Uniclust30)."""

    name = "hhblits"
    binary_name = "hhblits"
    default_flags = ("-n", "3", "-e", "0.001", "-maxseq", "1000000", "-realign_max", "100000",
                     "-maxfilt", "100000", "-min_prefilter_hits", "1000")

    def search(self, sequence: str, databases: Sequence[str], max_hits: int | None = None) -> ToolResult:
        sequence = _check_sequence(self.name, sequence)
        if not databases:
            raise ValueError("hhblits needs at least one database prefix")
        with self._workdir() as tmp:
            work = Path(tmp)
            _write_fasta(work / "query.fasta", [("query", sequence)])
            output = work / "output.a3m"
            command = [self.binary, "-i", str(work / "query.fasta"), "-cpu", str(self.threads),
                       "-oa3m", str(output), "-o", os.devnull, *self.flags]
            for database in databases:
                command += ["-d", _absolute(database)]
            wall = _run(self.name, command, work, self.timeout_s)
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
            command = [self.binary, "-i", str(work / "query.a3m"), "-o", str(output), "-cpu", str(self.threads),
                       *self.flags]
            if max_hits is not None:
                # The hit list and the alignment list hold between -z/-b (default 10) and -Z/-B
                # (default 500) entries; cap both maxima and keep the minima within them.
                floor = str(min(10, max_hits))
                command += ["-Z", str(max_hits), "-B", str(max_hits), "-z", floor, "-b", floor]
            for database in databases:
                command += ["-d", _absolute(database)]
            wall = _run(self.name, command, work, self.timeout_s)
            text = output.read_text(errors="replace")
        return self._result("hhr", text, _count_hhr_hits(text), wall, command)


def _count_hhr_hits(text: str) -> int:
    return sum(1 for line in text.splitlines() if line.startswith("No ") and line[3:].strip().isdigit())


class Hmmsearch(Tool):
    """Profile HMM from the query MSA (hmmbuild) searched against a template seqres FASTA (hmmsearch).

    AlphaFold2-multimer's and AlphaFold3's template search. hmmbuild ``--hand`` keeps one match
    state per query residue, so hmmsearch's alignment maps every hit residue onto the query; the
    result is that mapping as 13-column m8 (one line per hit domain, CIGAR included, E-value and
    bit score from ``--domtblout``), the format MMseqs2 template hits come in too.
    """

    name = "hmmsearch"
    binary_name = "hmmsearch"
    default_flags = ("--F1", "0.1", "--F2", "0.1", "--F3", "0.1", "-E", "100", "--incE", "100",
                     "--domE", "100", "--incdomE", "100")
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
        identity["hmmbuild"] = {"version": tool_version(self.hmmbuild_binary, self.version_args),
                                "flags": list(self.hmmbuild_flags)}
        identity["output"] = "m8 from -A and --domtblout"
        return identity

    def search(self, msa_a3m: str, database: str, max_hits: int | None = None) -> ToolResult:
        """Hits of the profile built from ``msa_a3m`` (A3M, query first), at most ``max_hits`` domains."""
        query_msa = a3m_to_stockholm(msa_a3m)
        query = "".join(char for char in _fasta_records(msa_a3m)[0][1] if char.isupper())
        with self._workdir() as tmp:
            work = Path(tmp)
            (work / "query.sto").write_text(query_msa)
            profile = work / "query.hmm"
            build = [self.hmmbuild_binary, *self.hmmbuild_flags, "--cpu", str(self.threads), str(profile),
                     str(work / "query.sto")]
            wall = _run("hmmbuild", build, work, self.timeout_s)
            output, domains = work / "output.sto", work / "domains.tbl"
            command = [self.binary, "--noali", "-o", os.devnull, "-A", str(output), "--domtblout", str(domains),
                       "--cpu", str(self.threads), *self.flags, str(profile), _absolute(database)]
            remaining = None if self.timeout_s is None else max(self.timeout_s - wall, 1e-3)
            wall += _run(self.name, command, work, remaining)
            if not output.exists():  # hmmsearch writes no alignment when nothing passes the thresholds
                return self._result("m8", "", 0, wall, command)
            sto_text, _ = truncate_stockholm(output, max_hits)
            try:
                text = hmmsearch_to_m8(sto_text, domains.read_text(), query)
            except ValueError as error:
                raise ToolError(self.name, 0, "", command, f"hmmsearch output cannot be mapped to the query: {error}") from None
        return self._result("m8", text, text.count("\n"), wall, command)


def hmmsearch_to_m8(sto_text: str, domain_table: str, query: str) -> str:
    """hmmsearch's ``-A`` alignment of a query-length profile as m8 lines with CIGAR.

    Columns: query, target, fident, alnlen, mismatch, gapopen, qstart, qend, tstart, tend, evalue
    (the domain's independent E-value), bits, cigar (M: both, I: query residue only, D: target
    residue only), in the alignment's row order. Rows are named ``target/start-end`` by HMMER.
    """
    scores: dict[tuple[str, int, int], tuple[str, str]] = {}
    for line in domain_table.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        fields = line.split()
        if len(fields) < 22:
            raise ValueError(f"--domtblout line has {len(fields)} fields, expected at least 22: {line[:80]!r}")
        scores[(fields[0], int(fields[17]), int(fields[18]))] = (fields[12], fields[13])

    rows, reference = _stockholm_rows(sto_text)
    if not rows:
        return ""
    match_columns = [char not in ".-~" for char in reference]
    if sum(match_columns) != len(query):
        raise ValueError(f"the profile has {sum(match_columns)} match states, the query {len(query)} residues")

    lines = []
    for name, aligned_row in rows.items():
        target, _, span = name.rpartition("/")
        try:
            start, end = (int(value) for value in span.split("-"))
        except ValueError:
            raise ValueError(f"row {name!r} is not named target/start-end") from None
        if (target, start, end) not in scores:
            raise ValueError(f"row {name!r} has no line in the domain table")
        evalue, bits = scores[(target, start, end)]
        ops: list[tuple[str, int, int, str]] = []  # (op, query position, target position, target residue)
        query_position, target_position = 0, start - 1
        for char, is_match in zip(aligned_row, match_columns):
            residue = char not in ".-~"
            if is_match:
                query_position += 1
            if residue:
                target_position += 1
            if is_match and residue:
                ops.append(("M", query_position, target_position, char.upper()))
            elif is_match:
                ops.append(("I", query_position, target_position, ""))
            elif residue:
                ops.append(("D", query_position, target_position, char.upper()))
        if target_position != end:
            raise ValueError(f"row {name!r} holds {target_position - start + 1} residues, its name says {end - start + 1}")
        aligned = [index for index, op in enumerate(ops) if op[0] == "M"]
        if not aligned:
            continue
        ops = ops[aligned[0]: aligned[-1] + 1]
        matches = [op for op in ops if op[0] == "M"]
        identical = sum(1 for _, q, _, residue in matches if query[q - 1] == residue)
        cigar, gap_opens = [], 0
        for op in ops:
            if cigar and cigar[-1][0] == op[0]:
                cigar[-1][1] += 1
            else:
                cigar.append([op[0], 1])
                gap_opens += op[0] != "M"
        lines.append("\t".join(str(value) for value in (
            "query", target, f"{identical / len(ops):.3f}", len(ops), len(matches) - identical, gap_opens,
            ops[0][1], ops[-1][1], ops[0][2], ops[-1][2], evalue, bits,
            "".join(f"{count}{op}" for op, count in cigar),
        )))
    return "".join(line + "\n" for line in lines)


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
        sequence = _check_sequence(self.name, sequence)
        database = _absolute(database)
        with self._workdir() as tmp:
            work = Path(tmp)
            _write_fasta(work / "query.fasta", [("query", sequence)])
            common = ["--threads", str(self.threads), "-v", "1"]
            wall = _run(self.name, [self.binary, "createdb", str(work / "query.fasta"), str(work / "qdb"), "-v", "1"],
                        work, self.timeout_s)
            command = [self.binary, "search", str(work / "qdb"), database, str(work / "result"), str(work / "tmp"),
                       *common, *self.flags]
            if output_format == "m8" and "-a" not in self.flags:
                command.append("-a")  # the CIGAR column needs the alignment backtrace
            wall += _run(self.name, command, work, self._remaining(wall))
            if output_format == "a3m":
                convert = [self.binary, "result2msa", str(work / "qdb"), database, str(work / "result"),
                           str(work / "msa"), "--msa-format-mode", "6", *common]
                wall += _run(self.name, convert, work, self._remaining(wall))
                text, count = truncate_a3m(_read_mmseqs_db(work / "msa"), None if max_hits is None else max_hits + 1)
                count = max(count - 1, 0)
            else:
                convert = [self.binary, "convertalis", str(work / "qdb"), database, str(work / "result"),
                           str(work / "hits.m8"), "--format-output", self.m8_columns, *common]
                wall += _run(self.name, convert, work, self._remaining(wall))
                lines = [line for line in (work / "hits.m8").read_text().splitlines() if line.strip()]
                if max_hits is not None:
                    lines = lines[:max_hits]
                text, count = "".join(line + "\n" for line in lines), len(lines)
        return self._result(output_format, text, count, wall, command)

    def _remaining(self, spent: float) -> float | None:
        return None if self.timeout_s is None else max(self.timeout_s - spent, 1e-3)


def _read_mmseqs_db(prefix: Path) -> str:
    # One query, so the database's data file holds one NUL-terminated entry (or several split files).
    parts = sorted(prefix.parent.glob(prefix.name + ".[0-9]*")) if not prefix.exists() else [prefix]
    return "".join(part.read_text(errors="replace") for part in parts)


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
            _check_sequence(self.name, sequence)
        with self._workdir() as tmp:
            work = Path(tmp)
            _write_fasta(work / "input.fasta", sequences)
            output = work / "output.fasta"
            command = [self.binary, "-i", str(work / "input.fasta"), "-o", str(output), "--format", "fasta",
                       "--type", kinds[molecule_type], "-n", str(self.threads), *self.flags]
            wall = _run(self.name, command, work, self.timeout_s)
            text = output.read_text()
        records = _fasta_records(text)
        return self._result("fasta", "".join(f">{n}\n{s}\n" for n, s in records), len(records), wall, command)


TOOLS: dict[str, type[Tool]] = {
    tool.name: tool for tool in (Jackhmmer, Nhmmer, Hhblits, Hhsearch, Hmmsearch, MmseqsSearch, Kalign)
}
