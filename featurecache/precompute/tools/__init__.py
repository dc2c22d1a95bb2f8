"""Subprocess wrappers for the MSA and template search tools, one module per tool family.

- ``base``: ``Tool`` (binary, version, flags, threads, timeout, temporary folders), settings,
  results, errors, and ``run_command`` (process-group timeouts, output tails).
- ``hmmer``: ``Jackhmmer``, ``Nhmmer``, ``Hmmsearch`` (hmmbuild + hmmsearch).
- ``hhsuite``: ``Hhblits``, ``Hhsearch``.
- ``mmseqs``: ``MmseqsSearch``, and ``MmseqsCluster`` (chain clustering, not a search tool).
- ``kalign``: ``Kalign``.

Outputs are returned as raw text (Stockholm, A3M, HHR or m8), capped at the hits asked for;
parsing and the format conversions between tools belong to ``featurecache.io``.
"""

from featurecache.precompute.tools.base import (
    OUTPUT_FORMATS,
    Tool,
    ToolError,
    ToolNotFoundError,
    ToolResult,
    ToolSettings,
    ToolTimeoutError,
    resolve_binary,
    tool_version,
)
from featurecache.precompute.tools.hhsuite import Hhblits, Hhsearch
from featurecache.precompute.tools.hmmer import Hmmsearch, Jackhmmer, Nhmmer
from featurecache.precompute.tools.kalign import Kalign
from featurecache.precompute.tools.mmseqs import MmseqsCluster, MmseqsSearch

# Every wrapper by its tool name (the names used in the pipeline config).
TOOLS: dict[str, type[Tool]] = {
    tool.name: tool for tool in (Jackhmmer, Nhmmer, Hhblits, Hhsearch, Hmmsearch, MmseqsSearch, Kalign)
}

__all__ = [
    "OUTPUT_FORMATS",
    "TOOLS",
    "Hhblits",
    "Hhsearch",
    "Hmmsearch",
    "Jackhmmer",
    "Kalign",
    "MmseqsCluster",
    "MmseqsSearch",
    "Nhmmer",
    "Tool",
    "ToolError",
    "ToolNotFoundError",
    "ToolResult",
    "ToolSettings",
    "ToolTimeoutError",
    "resolve_binary",
    "tool_version",
]
