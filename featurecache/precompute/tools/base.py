"""What every search tool wrapper shares: settings, results, errors, and running a tool safely.

``Tool`` resolves its binary from a configured path or ``PATH`` (``ToolNotFoundError``
otherwise), detects the tool's version once per process (it goes into the search fingerprint),
applies the default flags (overridable from the config), and gives each run a fresh temporary
folder that is removed afterwards, whatever happens. ``run_command`` enforces a timeout by killing
the tool's whole process group (the Debian HH-suite binaries are shell wrappers that start the
real SIMD build as a child, so killing the shell is not enough) and raises ``ToolError`` carrying
the tail of the tool's output when the tool fails.
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
    output_format: str  # one of OUTPUT_FORMATS
    text: str  # the raw output, capped to max_hits
    num_hits: int  # hits in ``text`` after the cap (sequences, or HHR/m8 hit lines)
    wall_seconds: float  # time spent in the tool's processes
    command: tuple[str, ...]  # the main command, as run (temporary paths included)
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
        raise ToolError(
            Path(binary).name, None, "", [binary, *args], f"cannot run {binary} to read its version: {error}"
        ) from error
    text = completed.stdout + "\n" + completed.stderr
    patterns = (
        r"#\s*(HMMER\s+\d+\.\d+[\w.]*)",  # jackhmmer -h: "# HMMER 3.3.2 (Nov 2020); ..."
        r"^(HH\w+\s+\d+\.\d+\.\d+)",  # hhblits -h: "HHblits 3.3.0:"
        r"^(kalign\s+\d+\.\d+[\w.]*)",  # kalign --version: "kalign 3.3.5"
        r"^(\d+[-.][0-9a-f]+\S*)\s*$",  # mmseqs version: "14-7e284+ds-1+b2"
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


def run_command(tool: str, command: Sequence[str], workdir: Path, timeout_s: float | None) -> float:
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
                tool,
                None,
                _output_tail(stdout_path, stderr_path),
                command,
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


def write_fasta(path: Path, records: Iterable[tuple[str, str]]) -> None:
    """A tool's FASTA input from (name, sequence) pairs."""
    with open(path, "w") as handle:
        for name, sequence in records:
            handle.write(f">{name}\n{sequence}\n")


def absolute_path(path: str) -> str:
    # Tools run inside their temporary folder, so relative database paths must be resolved first.
    return os.path.abspath(os.path.expanduser(path))


def check_sequence(tool: str, sequence: str) -> str:
    """The query upper case without whitespace; a ValueError naming the tool unless it is all letters."""
    sequence = "".join(sequence.split()).upper()
    if not sequence or not sequence.isalpha():
        raise ValueError(f"{tool}: query sequence must be non-empty letters, got {sequence[:40]!r}")
    return sequence


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

    def remaining_timeout(self, spent: float) -> float | None:
        """What is left of the timeout for the next command of a run that has taken ``spent`` s."""
        return None if self.timeout_s is None else max(self.timeout_s - spent, 1e-3)

    def _result(self, output_format: str, text: str, num_hits: int, wall: float, command: Sequence[str]) -> ToolResult:
        return ToolResult(self.name, output_format, text, num_hits, wall, tuple(command), self.version)
