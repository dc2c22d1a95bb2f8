"""The pipeline config (``featurecache precompute --config pipeline.toml``), its fingerprints and preflight.

The TOML file names the sequence databases (path, tool, role, hit cap, declared version), the
tools' binaries, threads, timeouts and flags, the template mmCIF folder, the feature and store
settings, and curation and clustering (AF3's PDB filters and sampling weights; both default to
AF3's, which runs without a config file use). ``examples/pipeline.toml`` documents every key.
Relative paths are resolved against the folder of the TOML file, so a config can travel with
its databases.

``preflight`` runs before any work starts and names every missing tool binary, database file or
folder at once; the CLI exits with status 2 when it reports anything.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import tomllib
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from featurecache.config import (
    FEATURE_RENAMES,
    ChemConfig,
    ClusteringConfig,
    CurationConfig,
    FeatureConfig,
    StoreConfig,
    fingerprint,
)
from featurecache.precompute.tools import (
    TOOLS,
    Hmmsearch,
    Tool,
    ToolError,
    ToolSettings,
    resolve_binary,
    tool_version,
)

ROLES = ("msa", "template")
MOLECULE_TYPES = ("protein", "rna", "dna")

# Which role each search tool can fill. MMseqs2 gives an A3M for "msa" and m8 hits for "template".
TOOL_ROLES: dict[str, tuple[str, ...]] = {
    "jackhmmer": ("msa",),
    "nhmmer": ("msa",),
    "hhblits": ("msa",),
    "mmseqs": ("msa", "template"),
    "hhsearch": ("template",),
    "hmmsearch": ("template",),
}

# Chains each tool searches unless the database says otherwise. AlphaFold3 searches RNA with
# nhmmer and gives DNA no MSA; list "dna" in molecule_types to search DNA too.
DEFAULT_MOLECULE_TYPES: dict[str, tuple[str, ...]] = {
    "jackhmmer": ("protein",),
    "hhblits": ("protein",),
    "mmseqs": ("protein",),
    "hhsearch": ("protein",),
    "hmmsearch": ("protein",),
    "nhmmer": ("rna",),
}

# Binaries with [tools.<name>] settings: the search tools plus hmmbuild (used by hmmsearch) and kalign.
TOOL_NAMES = tuple(sorted({*TOOLS, "hmmbuild"}))

HHSUITE_SUFFIXES = ("_a3m.ffdata", "_a3m.ffindex", "_cs219.ffdata", "_cs219.ffindex")
HHSUITE_OPTIONAL_SUFFIXES = ("_hhm.ffdata", "_hhm.ffindex")
MMSEQS_SUFFIXES = ("", ".dbtype", ".index", "_h", "_h.dbtype", "_h.index")


class PipelineConfigError(ValueError):
    """The pipeline TOML is malformed; the message names the file and the key."""


@dataclass(frozen=True)
class DatabaseConfig:
    """One searched database.

    ``paths`` has one entry, except for hhblits/hhsearch, which may search several HH-suite
    databases in one run (AlphaFold2 runs hhblits on BFD and Uniclust30 together). HH-suite and
    MMseqs2 paths are database prefixes, the others FASTA files.
    """

    name: str
    tool: str
    role: str
    paths: tuple[str, ...]
    max_hits: int | None = None
    version: str | None = None
    molecule_types: tuple[str, ...] = ()

    @property
    def path(self) -> str:
        return self.paths[0]


@dataclass(frozen=True)
class PipelineConfig:
    databases: tuple[DatabaseConfig, ...] = ()
    tools: Mapping[str, ToolSettings] = field(default_factory=dict)
    template_mmcif_dir: str | None = None
    template_msa_database: str | None = None  # whose MSA feeds hhsearch/hmmsearch; None: the first protein MSA database
    tmp_dir: str | None = None
    features: FeatureConfig = field(default_factory=FeatureConfig)
    chem: ChemConfig = field(default_factory=ChemConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    curation: CurationConfig = field(default_factory=CurationConfig)
    clustering: ClusteringConfig = field(default_factory=ClusteringConfig)
    source: str | None = None  # the TOML file this came from, for messages

    def tool_settings(self, name: str) -> ToolSettings:
        if name not in TOOL_NAMES:
            raise KeyError(f"unknown tool {name!r}; known tools: {', '.join(TOOL_NAMES)}")
        return self.tools.get(name, ToolSettings())

    def make_tool(self, name: str) -> Tool:
        """The wrapper for ``name`` with this config's binary, flags, threads and timeout."""
        if name == "hmmsearch":
            return Hmmsearch(self.tool_settings("hmmsearch"), self.tool_settings("hmmbuild"), self.tmp_dir)
        if name not in TOOLS:
            raise KeyError(f"no wrapper for tool {name!r}; known: {', '.join(sorted(TOOLS))}")
        return TOOLS[name](self.tool_settings(name), self.tmp_dir)

    def database(self, name: str) -> DatabaseConfig:
        for database in self.databases:
            if database.name == name:
                return database
        raise KeyError(f"no database named {name!r} in {self.source or 'the pipeline config'}")

    def databases_for(self, molecule_type: str, role: str) -> tuple[DatabaseConfig, ...]:
        return tuple(db for db in self.databases if db.role == role and molecule_type in db.molecule_types)

    def template_msa_source(self) -> DatabaseConfig | None:
        """The protein MSA database whose output is the template search's query MSA."""
        if self.template_msa_database is not None:
            return self.database(self.template_msa_database)
        protein = self.databases_for("protein", "msa")
        return protein[0] if protein else None


# --- loading -----------------------------------------------------------------------------------

_TOP_KEYS = {"search", "tools", "databases", "templates", "features", "chem", "store", "curation", "clustering"}
_SEARCH_KEYS = {"threads", "timeout_s", "tmp_dir"}
_TOOL_KEYS = {"binary", "threads", "timeout_s", "flags", "extra_flags"}
_DATABASE_KEYS = {"name", "tool", "role", "path", "max_hits", "version", "molecule_types"}
_TEMPLATE_KEYS = {"mmcif_dir", "msa_database"}


def load_pipeline_config(path: str | os.PathLike) -> PipelineConfig:
    """Read and validate a pipeline TOML file; errors name the file and the offending key."""
    path = Path(path)
    try:
        with open(path, "rb") as handle:
            document = tomllib.load(handle)
    except FileNotFoundError:
        raise PipelineConfigError(f"{path}: pipeline config file not found") from None
    except tomllib.TOMLDecodeError as error:
        raise PipelineConfigError(f"{path}: not valid TOML: {error}") from None
    return parse_pipeline_config(document, base_dir=path.parent, source=str(path))


def parse_pipeline_config(
    document: Mapping, base_dir: str | os.PathLike = ".", source: str = "<config>"
) -> PipelineConfig:
    """Build a PipelineConfig from an already-parsed TOML mapping (``load_pipeline_config`` reads the file)."""
    reader = _TomlReader(source, Path(base_dir))
    reader.check_keys(document, _TOP_KEYS, "")
    search = reader.table(document.get("search", {}), "search")
    reader.check_keys(search, _SEARCH_KEYS, "search")
    default_threads = reader.positive_int(search.get("threads", 1), "search.threads")
    default_timeout = reader.positive_number(search["timeout_s"], "search.timeout_s") if "timeout_s" in search else None
    tmp_dir = reader.resolve(search["tmp_dir"], "search.tmp_dir") if "tmp_dir" in search else None
    tools = _tool_settings(reader, reader.table(document.get("tools", {}), "tools"), default_threads, default_timeout)
    databases = _databases(reader, document.get("databases", []))
    templates = reader.table(document.get("templates", {}), "templates")
    reader.check_keys(templates, _TEMPLATE_KEYS, "templates")
    mmcif_dir = reader.resolve(templates["mmcif_dir"], "templates.mmcif_dir") if "mmcif_dir" in templates else None
    msa_database = templates.get("msa_database")
    if msa_database is not None:
        source_db = next((db for db in databases if db.name == msa_database), None)
        if source_db is None:
            raise reader.fail("templates.msa_database", f"no database named {msa_database!r}")
        if source_db.role != "msa" or "protein" not in source_db.molecule_types:
            raise reader.fail("templates.msa_database", f"{msa_database!r} is not a protein MSA database")
    features_table = _renamed_keys(
        reader, reader.table(document.get("features", {}), "features"), FEATURE_RENAMES, "features"
    )
    return PipelineConfig(
        databases=databases,
        tools=tools,
        template_mmcif_dir=mmcif_dir,
        template_msa_database=msa_database,
        tmp_dir=tmp_dir,
        features=_dataclass_from_table(reader, FeatureConfig, features_table, "features"),
        chem=_chem_config(reader, reader.table(document.get("chem", {}), "chem")),
        store=_dataclass_from_table(reader, StoreConfig, reader.table(document.get("store", {}), "store"), "store"),
        curation=_curation_config(reader, reader.table(document.get("curation", {}), "curation")),
        clustering=_dataclass_from_table(
            reader, ClusteringConfig, reader.table(document.get("clustering", {}), "clustering"), "clustering"
        ),
        source=source,
    )


class _TomlReader:
    """Checked reads of TOML values; every error names the file and the key."""

    def __init__(self, source: str, base_dir: Path) -> None:
        self.source = source
        self.base_dir = base_dir

    def fail(self, key: str, problem: str) -> PipelineConfigError:
        return PipelineConfigError(f"{self.source}: {key}: {problem}")

    def table(self, value, key: str) -> Mapping:
        if not isinstance(value, Mapping):
            raise self.fail(key, f"expected a table, got {type(value).__name__}")
        return value

    def check_keys(self, mapping: Mapping, allowed: set[str], key: str) -> None:
        unknown = sorted(set(mapping) - allowed)
        if unknown:
            where = f"{key}." if key else ""
            raise self.fail(where + unknown[0], f"unknown key (expected one of: {', '.join(sorted(allowed))})")

    def resolve(self, value, key: str) -> str:
        """A path from the file, relative ones against the file's folder."""
        if not isinstance(value, str) or not value:
            raise self.fail(key, f"expected a non-empty path string, got {value!r}")
        return str((self.base_dir / Path(value).expanduser()).resolve()) if not os.path.isabs(value) else value

    def positive_int(self, value, key: str, allow_none: bool = False) -> int | None:
        if value is None and allow_none:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise self.fail(key, f"expected an integer >= 1, got {value!r}")
        return value

    def positive_number(self, value, key: str) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise self.fail(key, f"expected a number > 0, got {value!r}")
        return float(value)

    def string_list(self, value, key: str) -> tuple[str, ...]:
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise self.fail(key, f"expected a list of strings, got {value!r}")
        return tuple(value)


def _tool_settings(
    reader: _TomlReader, tools_table: Mapping, default_threads: int, default_timeout: float | None
) -> dict[str, ToolSettings]:
    """[tools.<name>] tables: every known tool's settings, [search] defaults where unset."""
    for name in tools_table:
        if name not in TOOL_NAMES:
            raise reader.fail(f"tools.{name}", f"unknown tool (expected one of: {', '.join(TOOL_NAMES)})")
    tools: dict[str, ToolSettings] = {}
    for name in TOOL_NAMES:
        key = f"tools.{name}"
        entry = reader.table(tools_table.get(name, {}), key)
        reader.check_keys(entry, _TOOL_KEYS, key)
        binary = entry.get("binary")
        if binary is not None:
            if not isinstance(binary, str) or not binary:
                raise reader.fail(f"{key}.binary", f"expected a path or a name on PATH, got {binary!r}")
            if os.sep in binary:
                binary = reader.resolve(binary, f"{key}.binary")
        tools[name] = ToolSettings(
            binary=binary,
            threads=reader.positive_int(entry.get("threads", default_threads), f"{key}.threads"),
            timeout_s=(
                reader.positive_number(entry["timeout_s"], f"{key}.timeout_s")
                if "timeout_s" in entry
                else default_timeout
            ),
            flags=reader.string_list(entry["flags"], f"{key}.flags") if "flags" in entry else None,
            extra_flags=reader.string_list(entry.get("extra_flags", []), f"{key}.extra_flags"),
        )
    return tools


def _databases(reader: _TomlReader, raw_databases) -> tuple[DatabaseConfig, ...]:
    """The [[databases]] tables, in order; names must be unique."""
    if not isinstance(raw_databases, list):
        raise reader.fail("databases", "expected an array of tables ([[databases]])")
    databases: list[DatabaseConfig] = []
    for index, raw in enumerate(raw_databases):
        key = f"databases[{index}]"
        databases.append(_database(reader, reader.table(raw, key), key, {db.name for db in databases}))
    return tuple(databases)


def _database(reader: _TomlReader, raw: Mapping, key: str, names_taken: set[str]) -> DatabaseConfig:
    reader.check_keys(raw, _DATABASE_KEYS, key)
    for required in ("name", "tool", "path"):
        if required not in raw:
            raise reader.fail(f"{key}.{required}", "missing")
    name = raw["name"]
    if not isinstance(name, str) or not name or any(char.isspace() for char in name):
        raise reader.fail(f"{key}.name", f"expected a name without spaces, got {name!r}")
    if name in names_taken:
        raise reader.fail(f"{key}.name", f"database name {name!r} is used twice")
    tool = raw["tool"]
    if tool not in TOOL_ROLES:
        raise reader.fail(f"{key}.tool", f"unknown search tool {tool!r} (expected one of: {', '.join(TOOL_ROLES)})")
    role = raw.get("role", TOOL_ROLES[tool][0])
    if role not in ROLES:
        raise reader.fail(f"{key}.role", f"expected 'msa' or 'template', got {role!r}")
    if role not in TOOL_ROLES[tool]:
        raise reader.fail(
            f"{key}.role", f"{tool} cannot serve role {role!r} (it serves: {', '.join(TOOL_ROLES[tool])})"
        )
    raw_paths = raw["path"] if isinstance(raw["path"], list) else [raw["path"]]
    if not raw_paths:
        raise reader.fail(f"{key}.path", "empty list")
    if len(raw_paths) > 1 and tool not in ("hhblits", "hhsearch"):
        raise reader.fail(f"{key}.path", f"only hhblits and hhsearch search several databases in one run, not {tool}")
    version = raw.get("version")
    if version is not None and (not isinstance(version, str) or not version):
        raise reader.fail(f"{key}.version", f"expected a non-empty string, got {version!r}")
    molecule_types = (
        reader.string_list(raw["molecule_types"], f"{key}.molecule_types")
        if "molecule_types" in raw
        else DEFAULT_MOLECULE_TYPES[tool]
    )
    for molecule_type in molecule_types:
        if molecule_type not in MOLECULE_TYPES:
            raise reader.fail(
                f"{key}.molecule_types",
                f"unknown molecule type {molecule_type!r} (expected: {', '.join(MOLECULE_TYPES)})",
            )
        if (tool == "nhmmer") != (molecule_type in ("rna", "dna")):
            raise reader.fail(f"{key}.molecule_types", f"{tool} cannot search {molecule_type} chains")
    if role == "template" and molecule_types != ("protein",):
        raise reader.fail(f"{key}.molecule_types", "template search is for protein chains only")
    return DatabaseConfig(
        name=name,
        tool=tool,
        role=role,
        paths=tuple(reader.resolve(item, f"{key}.path") for item in raw_paths),
        max_hits=reader.positive_int(raw.get("max_hits"), f"{key}.max_hits", allow_none=True),
        version=version,
        molecule_types=tuple(molecule_types),
    )


def _renamed_keys(reader: _TomlReader, values: Mapping, renames: Mapping[str, str], key: str) -> dict:
    """`values` with each old setting name replaced by its new one, warning about every old name used."""
    values = dict(values)
    for old, new in renames.items():
        if old in values:
            if new in values:
                raise reader.fail(
                    f"{key}.{old}", f"old name of {key}.{new}, which is also given; keep only {key}.{new}"
                )
            # stacklevel 4: the line that called load_pipeline_config
            warnings.warn(f"{reader.source}: {key}.{old} is deprecated: use {key}.{new}", FutureWarning, stacklevel=4)
            values[new] = values.pop(old)
    return values


def _dataclass_from_table(reader: _TomlReader, cls, values: Mapping, key: str):
    fields = {item.name: item for item in dataclasses.fields(cls)}
    defaults = cls()
    for name, value in values.items():
        if name not in fields:
            raise reader.fail(f"{key}.{name}", f"unknown key (expected one of: {', '.join(fields)})")
        expected = type(getattr(defaults, name))
        # TOML integers are fine where a float is expected, booleans are never numbers.
        matches = isinstance(value, expected) and not (expected is not bool and isinstance(value, bool))
        if expected is float and isinstance(value, int) and not isinstance(value, bool):
            matches = True
        if not matches:
            raise reader.fail(f"{key}.{name}", f"expected {expected.__name__}, got {value!r}")
    try:
        return cls(**{name: (float(v) if type(getattr(defaults, name)) is float else v) for name, v in values.items()})
    except ValueError as error:  # a value out of its range (the dataclass's own check names the setting)
        raise reader.fail(key, str(error)) from None


def _chem_config(reader: _TomlReader, values: Mapping) -> ChemConfig:
    """[chem]: ccd_path is a path (relative to the TOML file's folder), the rest plain settings."""
    values = dict(values)
    ccd_path = reader.resolve(values.pop("ccd_path"), "chem.ccd_path") if "ccd_path" in values else None
    settings = _dataclass_from_table(reader, ChemConfig, values, "chem")
    return dataclasses.replace(settings, ccd_path=ccd_path)


def _curation_config(reader: _TomlReader, values: Mapping) -> CurationConfig:
    """[curation]: dates as TOML dates or "YYYY-MM-DD" strings, crystallization_aids a list of
    CCD codes, the rest plain settings (max_resolution = inf keeps every resolution)."""
    values = dict(values)
    special = {}
    for name in ("min_release_date", "max_release_date"):
        if name in values:
            value = values.pop(name)
            if isinstance(value, datetime.date) and not isinstance(value, datetime.datetime):
                value = value.isoformat()
            if not isinstance(value, str):
                raise reader.fail(f"curation.{name}", f"expected a date (YYYY-MM-DD), got {value!r}")
            special[name] = value
    if "crystallization_aids" in values:
        special["crystallization_aids"] = reader.string_list(
            values.pop("crystallization_aids"), "curation.crystallization_aids"
        )
    settings = _dataclass_from_table(reader, CurationConfig, values, "curation")
    try:
        return dataclasses.replace(settings, **special)
    except ValueError as error:
        raise reader.fail("curation", str(error)) from None


# --- database files and fingerprints -----------------------------------------------------------


def database_files(database: DatabaseConfig) -> tuple[list[Path], list[Path]]:
    """(required, optional) files that make up a database on disk."""
    required: list[Path] = []
    optional: list[Path] = []
    for path in database.paths:
        if database.tool in ("hhblits", "hhsearch"):
            required += [Path(path + suffix) for suffix in HHSUITE_SUFFIXES]
            optional += [Path(path + suffix) for suffix in HHSUITE_OPTIONAL_SUFFIXES]
        elif database.tool == "mmseqs":
            required += [Path(path + suffix) for suffix in MMSEQS_SUFFIXES]
        else:
            required.append(Path(path))
    return required, optional


def database_fingerprint(database: DatabaseConfig) -> str:
    """Identity of a database: its declared version, or else every file's path, size and mtime."""
    if database.version is not None:
        return fingerprint("database", database.name, database.tool, {"version": database.version})
    required, optional = database_files(database)
    files = []
    for path in required + [path for path in optional if path.exists()]:
        try:
            stat = path.stat()
        except FileNotFoundError:
            raise FileNotFoundError(f"database {database.name}: missing file {path}") from None
        files.append([str(path), stat.st_size, stat.st_mtime_ns])
    return fingerprint("database", database.name, database.tool, files)


def search_fingerprint(database: DatabaseConfig, tool: Tool) -> str:
    """Everything that changes one database's search output: tool version and flags, database, cap, role."""
    if tool.name != database.tool:
        raise ValueError(f"database {database.name} is searched with {database.tool}, not {tool.name}")
    return fingerprint("search", tool.identity(), database_fingerprint(database), database.max_hits, database.role)


# --- preflight ---------------------------------------------------------------------------------


def preflight(config: PipelineConfig) -> list[str]:
    """Every problem that would stop the searches, as readable lines; empty when all is in place.

    Checks each used tool's binary (resolvable and answering its version query), each database's
    files, the template mmCIF folder and the temporary folder. Nothing is searched.
    """
    problems: list[str] = []
    where = config.source or "pipeline config"
    users: dict[str, list[str]] = {}
    for database in config.databases:
        users.setdefault(database.tool, []).append(database.name)
        if database.tool == "hmmsearch":
            users.setdefault("hmmbuild", []).append(database.name)
    for tool_name, database_names in users.items():
        settings = config.tool_settings(tool_name)
        version_args = Tool.version_args if tool_name == "hmmbuild" else TOOLS[tool_name].version_args
        try:
            binary = resolve_binary(tool_name, settings.binary)
            tool_version(binary, version_args)
        except ToolError as error:
            problems.append(f"tool {tool_name} (needed by database {', '.join(database_names)}): {error.message}")

    for database in config.databases:
        required, _ = database_files(database)
        missing = [path for path in required if not path.is_file()]
        for path in missing:
            kind = {
                "hhblits": "HH-suite database file",
                "hhsearch": "HH-suite database file",
                "mmseqs": "MMseqs2 database file",
            }.get(database.tool, "FASTA file")
            problems.append(f"database {database.name} ({database.tool}): missing {kind} {path}")

    has_templates = any(db.role == "template" for db in config.databases)
    if has_templates:
        if config.template_mmcif_dir is None:
            problems.append(f"{where}: templates.mmcif_dir is not set but template databases are configured")
        elif not os.path.isdir(config.template_mmcif_dir):
            problems.append(f"templates.mmcif_dir: template mmCIF folder {config.template_mmcif_dir} does not exist")
    if config.tmp_dir is not None and os.path.exists(config.tmp_dir) and not os.path.isdir(config.tmp_dir):
        problems.append(f"search.tmp_dir: {config.tmp_dir} exists and is not a folder")
    return problems
