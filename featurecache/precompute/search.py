"""Search one unique chain sequence against every configured database.

``search_sequence`` is the unit of work the pipeline runs as a Ray task (``num_cpus`` = the
tools' threads): pure Python around subprocesses, no Ray here. For a protein it runs each MSA
database's tool (jackhmmer, hhblits, mmseqs), then each template database's tool (hhsearch or
hmmbuild + hmmsearch, fed the MSA of ``templates.msa_database``; or mmseqs to m8 hits); for RNA
or DNA it runs nhmmer. The raw outputs come back with per-database fingerprints and timings;
parsing and featurization happen downstream.

Sequence keys and fingerprints are what the msa table is keyed on: a sequence that appears in
several targets (homomers, repeated entries) is searched once, and a change of tool version,
flags, hit cap or database makes the stored result stale. Each database's raw output is also
kept on its own (``database_search_key``), so that a change to one database re-runs that
database's search only: ``SearchPlan.search`` takes the stored outputs whose fingerprint is still
current and runs the rest (a template search fed an MSA is stale when that MSA is).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass

from featurecache.config import fingerprint, stable_hash
from featurecache.io.convert import stockholm_to_a3m
from featurecache.precompute.pipeline_config import (
    MOLECULE_TYPES,
    DatabaseConfig,
    PipelineConfig,
    search_fingerprint,
)
from featurecache.precompute.tools import Tool, ToolError, ToolResult

SEARCHED_MOLECULE_TYPES = MOLECULE_TYPES  # ligands have no sequence search


def normalize_sequence(sequence: str) -> str:
    """Upper case without whitespace: the form that is hashed and searched."""
    return "".join(sequence.split()).upper()


def database_search_key(sequence_key_: str, database_fingerprint: str) -> str:
    """msa-table key of one database's raw output for one sequence."""
    return f"{sequence_key_}-db-{database_fingerprint}"


SEQUENCE_KEY_CHARS = 32  # length of sequence_key; every msa key starts with one and "-"


def sequence_key(molecule_type: str, sequence: str) -> str:
    """Key of a unique chain sequence: SEQUENCE_KEY_CHARS hex characters of sha256 over (molecule type, sequence).

    The molecule type is part of the key because the same letters (e.g. "ACG") mean different
    things as protein and as nucleic acid.
    """
    if molecule_type not in SEARCHED_MOLECULE_TYPES:
        raise ValueError(f"molecule type must be one of {SEARCHED_MOLECULE_TYPES}, got {molecule_type!r}")
    return stable_hash({"molecule_type": molecule_type, "sequence": normalize_sequence(sequence)})[:SEQUENCE_KEY_CHARS]


@dataclass(frozen=True)
class DatabaseSearch:
    """One database's raw output for one sequence."""

    database: str  # DatabaseConfig.name
    tool: str
    role: str  # "msa" | "template"
    output_format: str  # "sto" | "a3m" | "hhr" | "m8"
    text: str  # raw tool output (capped at the database's max_hits)
    num_hits: int
    fingerprint: str  # search_fingerprint of this database (+ the template input MSA's)
    wall_seconds: float
    command: tuple[str, ...]
    tool_version: str
    reused: bool = False  # taken from an earlier run's stored output, not searched now


@dataclass(frozen=True)
class SearchResult:
    """All databases' outputs for one unique chain sequence."""

    sequence_key: str
    molecule_type: str
    sequence: str
    fingerprint: str  # SearchPlan.fingerprint(molecule_type) at search time
    msas: tuple[DatabaseSearch, ...]  # in config order
    templates: tuple[DatabaseSearch, ...]  # in config order

    @property
    def tool_seconds(self) -> float:
        return sum(item.wall_seconds for item in self.msas + self.templates)

    @property
    def timings(self) -> dict[str, float]:
        """Seconds spent in the tools, per database name."""
        return {item.database: item.wall_seconds for item in self.msas + self.templates}


class SearchPlan:
    """The configured tools and databases, ready to search; build one per worker process.

    Tool binaries are resolved when first used and their versions cached, and database
    fingerprints (a stat of each database file) are computed once per plan.
    """

    def __init__(self, config: PipelineConfig, tmp_root: str | os.PathLike | None = None) -> None:
        self.config = config
        self.tmp_root = None if tmp_root is None else str(tmp_root)
        self._tools: dict[str, Tool] = {}
        self._fingerprints: dict[str, str] = {}

    def tool(self, name: str) -> Tool:
        if name not in self._tools:
            tool = self.config.make_tool(name)
            if self.tmp_root is not None:
                tool.tmp_root = self.tmp_root
            self._tools[name] = tool
        return self._tools[name]

    def databases(self, molecule_type: str) -> tuple[tuple[DatabaseConfig, ...], tuple[DatabaseConfig, ...]]:
        """(msa databases, template databases) searched for chains of ``molecule_type``."""
        if molecule_type not in SEARCHED_MOLECULE_TYPES:
            raise ValueError(f"molecule type must be one of {SEARCHED_MOLECULE_TYPES}, got {molecule_type!r}")
        return self.config.databases_for(molecule_type, "msa"), self.config.databases_for(molecule_type, "template")

    def database_fingerprint(self, database: DatabaseConfig) -> str:
        """search_fingerprint of one database; for hhsearch/hmmsearch also that of the MSA they are fed."""
        if database.name not in self._fingerprints:
            value = search_fingerprint(database, self.tool(database.tool))
            source = self._template_msa_source(database)
            if source is not None:
                value = fingerprint(value, "template-msa", self.database_fingerprint(source))
            self._fingerprints[database.name] = value
        return self._fingerprints[database.name]

    def database_fingerprints(self, molecule_type: str) -> dict[str, str]:
        msa_databases, template_databases = self.databases(molecule_type)
        return {db.name: self.database_fingerprint(db) for db in msa_databases + template_databases}

    def fingerprint(self, molecule_type: str) -> str:
        """Everything that changes the search result of a ``molecule_type`` chain (16 hex characters)."""
        return fingerprint("sequence-search", molecule_type, self.database_fingerprints(molecule_type))

    def msa_key(self, molecule_type: str, sequence: str) -> str:
        """msa-table key of a chain's searched MSA record: its sequence key and the search's fingerprint."""
        return f"{sequence_key(molecule_type, sequence)}-{self.fingerprint(molecule_type)}"

    def search(
        self, sequence: str, molecule_type: str, stored: Mapping[str, DatabaseSearch] | None = None
    ) -> SearchResult:
        """Run every database for one sequence; a failing tool raises ToolError naming the database.

        `stored` maps database names to earlier outputs for this sequence: one whose fingerprint
        matches the database's current one is used as is (marked `reused`) instead of searching.
        """
        sequence = normalize_sequence(sequence)
        stored = stored or {}
        msa_databases, template_databases = self.databases(molecule_type)

        def current(database: DatabaseConfig) -> DatabaseSearch | None:
            item = stored.get(database.name)
            if item is None or item.fingerprint != self.database_fingerprint(database):
                return None
            return dataclasses.replace(item, reused=True)

        msas = tuple(current(db) or self._run_msa(db, sequence, molecule_type) for db in msa_databases)
        outputs = {item.database: item for item in msas}
        templates = tuple(current(db) or self._run_template(db, sequence, outputs) for db in template_databases)
        return SearchResult(
            sequence_key=sequence_key(molecule_type, sequence),
            molecule_type=molecule_type,
            sequence=sequence,
            fingerprint=self.fingerprint(molecule_type),
            msas=msas,
            templates=templates,
        )

    def _template_msa_source(self, database: DatabaseConfig) -> DatabaseConfig | None:
        if database.role != "template" or database.tool not in ("hhsearch", "hmmsearch"):
            return None
        return self.config.template_msa_source()

    def _run_msa(self, database: DatabaseConfig, sequence: str, molecule_type: str) -> DatabaseSearch:
        tool = self.tool(database.tool)
        with _naming(database):
            if database.tool == "jackhmmer":
                result = tool.search(sequence, database.path, database.max_hits)
            elif database.tool == "nhmmer":
                result = tool.search(sequence, database.path, molecule_type, database.max_hits)
            elif database.tool == "hhblits":
                result = tool.search(sequence, database.paths, database.max_hits)
            elif database.tool == "mmseqs":
                result = tool.search(sequence, database.path, database.max_hits, output_format="a3m")
            else:
                raise ValueError(f"database {database.name}: {database.tool} is not an MSA search tool")
        return self._wrap(database, result)

    def _run_template(self, database: DatabaseConfig, sequence: str, msas: dict[str, DatabaseSearch]) -> DatabaseSearch:
        tool = self.tool(database.tool)
        with _naming(database):
            if database.tool == "mmseqs":
                result = tool.search(sequence, database.path, database.max_hits, output_format="m8")
            else:
                query_msa = self._template_query_msa(database, sequence, msas)
                if database.tool == "hhsearch":
                    result = tool.search(query_msa, database.paths, database.max_hits)
                elif database.tool == "hmmsearch":
                    result = tool.search(query_msa, database.path, database.max_hits)
                else:
                    raise ValueError(f"database {database.name}: {database.tool} is not a template search tool")
        return self._wrap(database, result)

    def _template_query_msa(self, database: DatabaseConfig, sequence: str, msas: dict[str, DatabaseSearch]) -> str:
        """A3M (query first) that hhsearch/hmmbuild start from: the source MSA, or the query alone."""
        source = self._template_msa_source(database)
        if source is None:
            return f">query\n{sequence}\n"
        if source.name not in msas:
            raise ValueError(
                f"database {database.name}: templates.msa_database {source.name!r} was not searched for this chain"
            )
        item = msas[source.name]
        if item.output_format == "sto":
            try:
                return stockholm_to_a3m(item.text, sequence)
            except ValueError as error:
                raise ToolError(
                    item.tool,
                    None,
                    "",
                    item.command,
                    f"database {database.name}: cannot use the {source.name} MSA as template query: {error}",
                ) from error
        return item.text

    def _wrap(self, database: DatabaseConfig, result: ToolResult) -> DatabaseSearch:
        return DatabaseSearch(
            database=database.name,
            tool=result.tool,
            role=database.role,
            output_format=result.output_format,
            text=result.text,
            num_hits=result.num_hits,
            fingerprint=self.database_fingerprint(database),
            wall_seconds=result.wall_seconds,
            command=result.command,
            tool_version=result.version,
        )


class _naming:
    """Context manager that prefixes a ToolError's message with the database it came from."""

    def __init__(self, database: DatabaseConfig) -> None:
        self.database = database

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, error, traceback) -> bool:
        if isinstance(error, ToolError) and not error.message.startswith("database "):
            error.message = f"database {self.database.name}: {error.message}"
            error.args = (error.message,)
        return False


def search_sequence(
    sequence: str,
    molecule_type: str,
    config: PipelineConfig,
    workdir: str | os.PathLike | None = None,
) -> SearchResult:
    """Search one chain sequence against every database configured for its molecule type.

    ``workdir`` is where the tools' temporary folders go (default: the config's
    ``search.tmp_dir``, else the system's). Workers that search many sequences should keep one
    ``SearchPlan`` instead, which resolves binaries and fingerprints once.
    """
    return SearchPlan(config, tmp_root=workdir).search(sequence, molecule_type)
