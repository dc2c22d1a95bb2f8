"""The host memory allocator of the commands that run the model (`train`, `predict`).

A step on the CPU allocates and frees thousands of pair-sized tensors (9 MB each at crop 384 for
the tiny preset). glibc's malloc serves most of them from its heap and returns freed ones to the
system by trimming and unmapping, so the next step faults the same pages in again; its free
holes also raise the peak. TCMalloc keeps freed spans for reuse: on 2 cores the tiny preset's
step at crop 384 took 7.2 s with a 2.00 GB peak against 8.8 s and 2.53 GB with glibc (2026-12-05,
benchmarks/tiny_step.py, benchmarks/NOTES.md section 8).

A process cannot change its allocator once running, so the command re-executes itself once with
TCMalloc preloaded (LD_PRELOAD), when the library is installed (setup.sh installs Debian's
libtcmalloc-minimal4) and nothing else is preloaded already. FEATURECACHE_ALLOCATOR=system keeps
the system's malloc; =tcmalloc insists on TCMalloc (an error where it is not installed); unset,
TCMalloc where installed and nothing changes without it. Any other value is an error (exit 2).
"""

from __future__ import annotations

import ctypes.util
import os
import sys

from featurecache.errors import EXIT_SETUP

# The switch: "system" keeps the system allocator, "tcmalloc" requires TCMalloc, unset or empty
# preloads TCMalloc where it is installed.
ALLOCATOR_VARIABLE = "FEATURECACHE_ALLOCATOR"
ALLOCATOR_CHOICES = ("tcmalloc", "system")
# TCMalloc prints a line for every allocation above this many bytes (1 GB by default: loading a
# checkpoint would print some); the command's output stays the command's.
LARGE_ALLOC_REPORT_VARIABLE = "TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD"
NO_LARGE_ALLOC_REPORT = str(1 << 62)


def tcmalloc_library() -> str | None:
    """The name LD_PRELOAD takes for TCMalloc (the minimal build), or None where it is not installed."""
    return ctypes.util.find_library("tcmalloc_minimal")


class AllocatorChoiceError(ValueError):
    """FEATURECACHE_ALLOCATOR names no allocator we know, or TCMalloc that is not installed."""


def preload_environment(environ: dict[str, str], library: str | None) -> dict[str, str] | None:
    """The environment to re-execute with, or None to run as we are: already preloaded (by us or
    by the user, whatever allocator), switched off, or no library (AllocatorChoiceError where the
    variable asks for TCMalloc and it is missing, or for something else)."""
    choice = environ.get(ALLOCATOR_VARIABLE, "").strip().lower()
    if choice and choice not in ALLOCATOR_CHOICES:
        raise AllocatorChoiceError(
            f"{ALLOCATOR_VARIABLE}={environ[ALLOCATOR_VARIABLE]!r}: expected one of {', '.join(ALLOCATOR_CHOICES)} "
            "(or unset: TCMalloc where installed)"
        )
    if choice == "system":
        return None
    if library is None:
        if choice == "tcmalloc":
            raise AllocatorChoiceError(
                f"{ALLOCATOR_VARIABLE}=tcmalloc: libtcmalloc_minimal is not installed "
                "(Debian: apt-get install libtcmalloc-minimal4)"
            )
        return None
    if environ.get("LD_PRELOAD", "").strip():
        return None  # the user's preload (TCMalloc, jemalloc or other) is theirs to choose
    return {
        **environ,
        "LD_PRELOAD": library,
        LARGE_ALLOC_REPORT_VARIABLE: environ.get(LARGE_ALLOC_REPORT_VARIABLE, NO_LARGE_ALLOC_REPORT),
    }


def reexecute_with_tcmalloc() -> None:
    """Replace this process by the same command line with TCMalloc preloaded (same PID, same
    streams), where preload_environment says so; otherwise return. A bad FEATURECACHE_ALLOCATOR
    ends the command here with one line (exit 2), before anything runs."""
    if not sys.platform.startswith("linux"):
        return
    try:
        environ = preload_environment(dict(os.environ), tcmalloc_library())
    except AllocatorChoiceError as error:
        print(f"Error: {error}", file=sys.stderr)
        sys.exit(EXIT_SETUP)
    if environ is None:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], environ)


def runs_the_model(argv: list[str]) -> bool:
    """Whether a `featurecache` command line runs train or predict (not their --help)."""
    if any(word in ("--help", "-h") for word in argv):
        return False
    command = next((word for word in argv if not word.startswith("-")), None)
    return command in ("train", "predict")
