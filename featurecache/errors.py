"""The command line's one error boundary: every failure becomes one line and an exit code.

Exit codes (the same for `featurecache ...` and `python -m featurecache.training`):
    0    all done
    1    some inputs failed (the rest are cached), or a verify found damage
    2    usage or setup error: bad option value, unreadable file, foreign or unfinished cache,
         missing tool or database, Ray refusing to start — reported in one line naming the thing
    130  interrupted (Ctrl-C), as shells report SIGINT
    143  `featurecache train` stopped by SIGTERM (a batch scheduler's stop), as shells report it;
         train, on either signal, first finishes its step and writes a checkpoint there

A Python traceback is shown only with `--debug` (anywhere on the command line) or
FEATURECACHE_DEBUG=1; without it an unexpected exception is still one line, naming its type.
"""

from __future__ import annotations

import math
import os
import re
import sys
import warnings
import click

EXIT_OK = 0
EXIT_PARTIAL = 1
EXIT_SETUP = 2
EXIT_INTERRUPTED = 130

DEBUG_FLAG = "--debug"
# What NumPy's and torch's generators accept as a seed: 0 .. 2**32 - 1.
SEED = click.IntRange(0, 2**32 - 1)


class UserError(click.ClickException):
    """A problem with what the user gave us (a file, an option, a cache): exit 2, one line."""

    exit_code = EXIT_SETUP


def _one_line(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    if isinstance(error, UnicodeDecodeError):
        text = f"not UTF-8 text ({error.reason} at byte {error.start})"
    if isinstance(error, OSError) and error.filename and str(error.filename) not in text:
        text = f"{error.filename}: {error.strerror or text}"
    return " ".join(text.split())


# What bad input raises (a file, an option, a cache): reported as its message alone.
USER_ERRORS = (OSError, ValueError, LookupError, UnicodeError)

# How torch's DataLoader re-raises an exception of a worker process: its type's name, then the
# worker's whole traceback as text, whose last line is "package.module.Type: message".
_WORKER_ERROR = re.compile(r"Caught (\w+) in DataLoader worker process \d+\.\s+Original Traceback")


def _worker_error(error: BaseException) -> tuple[type, str] | None:
    """(the original type, its message) of an exception a DataLoader worker raised; None for others.

    A type this process has not imported is unknown: it counts as a bug, so it keeps the --debug hint."""
    found = _WORKER_ERROR.match(str(error))
    if found is None:
        return None
    last = str(error).strip().splitlines()[-1]
    qualified, _, message = last.partition(": ")
    module, _, name = qualified.rpartition(".")
    # the worker's modules are this process's too (forked or spawned from it): look the type up
    # among those already imported; nothing is imported to report an error
    kind = getattr(sys.modules.get(module or "builtins"), name, None)
    if not (isinstance(kind, type) and issubclass(kind, BaseException)):
        kind = type(found.group(1), (Exception,), {})
    return kind, " ".join(message.split()) or kind.__name__


# How torch's DataLoader reports a worker process that died without an exception: a signal (a crash
# in native code, the kernel's out-of-memory killer, shared memory running out) or a bare exit.
_WORKER_DEATH = re.compile(
    r"DataLoader worker \(pids?(?:\(s\))? ([\d, ]+)\) (?:is killed by signal: ([^.]+)|exited unexpectedly)"
)
_DEATH_HINTS = {
    "Bus error": "its shared memory (/dev/shm) ran out: raise that limit (docker run --shm-size) or lower "
    "--num-workers or --prefetch-factor",
    "Killed": "most likely the system's out-of-memory killer: lower --num-workers or --prefetch-factor",
}
_OTHER_DEATH_HINT = "--num-workers 0 loads in the main process, which shows whether loading alone fails"


def worker_death(error: BaseException) -> str | None:
    """The one line for a DataLoader worker that died of a signal or exited unexpectedly; None for
    other errors. Its traceback is the main process's and says nothing of the cause."""
    found = _WORKER_DEATH.search(str(error))
    if found is None:
        return None
    pids, signal_name = found.group(1).strip(), found.group(2)
    how = f"killed by signal: {signal_name}" if signal_name else "exited unexpectedly"
    return f"a data-loading worker process (pid {pids}) died, {how}; {_DEATH_HINTS.get(signal_name, _OTHER_DEATH_HINT)}"


def missing_ccd(error: BaseException) -> str | None:
    """The one line for biotite installed without its Chemical Component Dictionary (a stripped or
    repacked wheel: PyPI's ships biotite/structure/info/components.bcif); None for other errors.
    Writing mmCIF files and building components need it."""
    if "Internal CCD not found" not in str(error):
        return None
    return (
        "biotite's Chemical Component Dictionary (biotite/structure/info/components.bcif) is not "
        "installed: reinstall biotite from PyPI, whose wheel ships it, or run `python -m biotite.setup_ccd`"
    )


def _debug_requested(args: list[str]) -> bool:
    return DEBUG_FLAG in args or os.environ.get("FEATURECACHE_DEBUG", "").lower() in ("1", "true", "yes", "on")


class ErrorBoundary:
    """Mixin for click commands and groups: `main` runs the command inside the boundary.

    Used as `class Group(ErrorBoundary, click.Group)`, so `featurecache ...`, `python -m
    featurecache.training` and click's CliRunner in the tests all get the same behaviour.
    """

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        args = list(sys.argv[1:] if args is None else args)
        debug = _debug_requested(args)
        args = [arg for arg in args if arg != DEBUG_FLAG]
        try:
            result = super().main(args, prog_name, complete_var, False, **extra)
        except click.exceptions.Exit as done:
            sys.exit(done.exit_code)
        except (KeyboardInterrupt, click.exceptions.Abort):
            click.echo("featurecache: interrupted", err=True)
            sys.exit(EXIT_INTERRUPTED)
        except click.ClickException as error:
            if debug:
                raise
            error.show()
            # click's generic ClickException exits 1, which here means "some inputs failed"
            sys.exit(EXIT_SETUP if error.exit_code == 1 else error.exit_code)
        except Exception as error:
            if debug:
                raise
            setup_problem = worker_death(error) or missing_ccd(error)
            kind, text = _worker_error(error) or (type(error), _one_line(error))
            if setup_problem is not None:
                click.echo(f"Error: {setup_problem}", err=True)
            elif issubclass(kind, USER_ERRORS):
                click.echo(f"Error: {text}", err=True)
            else:  # a bug: still one line, the traceback behind --debug
                click.echo(
                    f"Error: unexpected {kind.__name__}: {text} (run again with {DEBUG_FLAG} for the traceback)",
                    err=True,
                )
            sys.exit(EXIT_SETUP)
        sys.exit(result if isinstance(result, int) else EXIT_OK)


class BoundaryGroup(ErrorBoundary, click.Group):
    """A click group whose commands run inside the error boundary."""


class BoundaryCommand(ErrorBoundary, click.Command):
    """A stand-alone click command (e.g. `python -m featurecache.training`) inside the boundary."""


def renamed_option(old: str, new: str):
    """A click callback for an option's old spelling: it still works and names the new one."""

    def callback(ctx: click.Context, param: click.Parameter, value):
        if value is not None:
            message = f"{old} is deprecated: use {new}"
            warnings.warn(message, DeprecationWarning, stacklevel=2)
            click.echo(f"featurecache: {message}", err=True)
        return value

    return callback


class FiniteFloatRange(click.FloatRange):
    """click's FloatRange that also refuses nan and inf: both pass its bounds checks (a comparison
    with nan is false), and a step with a nan learning rate or an inf weight decay trains garbage."""

    name = "finite float range"

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number
