"""Pipeline TOML loading, fingerprints and the preflight check."""

from __future__ import annotations

import os
import pathlib
import shutil

import pytest

from featurecache.config import ChemConfig, ClusteringConfig, CurationConfig, FeatureConfig, StoreConfig
from featurecache.precompute.pipeline_config import (
    PipelineConfigError,
    database_files,
    database_fingerprint,
    load_pipeline_config,
    parse_pipeline_config,
    preflight,
    search_fingerprint,
)
from featurecache.precompute.tools import Hmmsearch, Jackhmmer, ToolSettings

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "pipeline.toml"


def _write(tmp_path, text: str) -> pathlib.Path:
    path = tmp_path / "pipeline.toml"
    path.write_text(text)
    return path


def test_example_config_loads_and_preflight_names_every_missing_database():
    config = load_pipeline_config(EXAMPLE)
    assert [db.name for db in config.databases] == ["uniref90", "mgnify", "bfd_uniclust30", "rfam", "pdb_seqres"]
    assert config.database("bfd_uniclust30").paths[1].endswith("UniRef30_2021_03")
    assert config.database("rfam").molecule_types == ("rna",)
    assert config.tool_settings("jackhmmer").threads == 8
    assert config.tool_settings("kalign").threads == 8  # inherits search.threads
    assert config.tool_settings("jackhmmer").timeout_s == 7200
    assert config.features == FeatureConfig() and config.store == StoreConfig()
    assert config.template_msa_source().name == "uniref90"
    # relative paths are resolved against the TOML file's folder
    assert config.database("uniref90").path == str(EXAMPLE.parent / "databases/uniref90/uniref90.fasta")

    problems = preflight(config)
    for database in config.databases:
        for path in database_files(database)[0]:
            assert any(str(path) in problem and database.name in problem for problem in problems), path
    assert any("templates.mmcif_dir" in problem for problem in problems)


def test_preflight_passes_on_built_databases(pipeline_config):
    assert preflight(pipeline_config) == []


def test_preflight_names_missing_binaries_files_and_folders(test_databases, tmp_path):
    hhsuite = tmp_path / "hh"
    hhsuite.mkdir()
    for path in test_databases.hhsuite_msa.parent.iterdir():
        shutil.copy(path, hhsuite / path.name)
    (hhsuite / "db_cs219.ffindex").unlink()
    config = load_pipeline_config(
        _write(
            tmp_path,
            f"""
[tools.jackhmmer]
binary = "featurecache-missing-jackhmmer"
[tools.hmmbuild]
binary = "{tmp_path / "bin" / "hmmbuild"}"
[[databases]]
name = "seqs"
tool = "jackhmmer"
path = "{test_databases.protein_fasta}"
[[databases]]
name = "hh"
tool = "hhblits"
path = "{hhsuite / "db"}"
[[databases]]
name = "gone"
tool = "mmseqs"
path = "nowhere/db"
[[databases]]
name = "templates"
tool = "hmmsearch"
role = "template"
path = "{test_databases.template_seqres}"
[templates]
mmcif_dir = "no_such_folder"
""",
        )
    )
    problems = preflight(config)
    text = "\n".join(problems)
    assert "tool jackhmmer (needed by database seqs)" in text and "featurecache-missing-jackhmmer" in text
    assert "tool hmmbuild (needed by database templates)" in text
    assert f"database hh (hhblits): missing HH-suite database file {hhsuite / 'db_cs219.ffindex'}" in problems
    for suffix in ("", ".dbtype", ".index", "_h"):
        assert (
            f"database gone (mmseqs): missing MMseqs2 database file {tmp_path / 'nowhere' / 'db'}{suffix}" in problems
        )
    assert any(str(tmp_path / "no_such_folder") in problem for problem in problems)
    assert "database seqs (jackhmmer): missing" not in text  # its FASTA file is there


@pytest.mark.parametrize(
    ("text", "key", "problem"),
    [
        ("[search]\nthreads = 0\n", "search.threads", "integer >= 1"),
        ("[serch]\n", ": serch", "unknown key"),
        ("[tools.jackhmer]\n", "tools.jackhmer", "unknown tool"),
        ("[tools.hhblits]\nflags = '-n 3'\n", "tools.hhblits.flags", "list of strings"),
        ("[[databases]]\nname = 'a'\ntool = 'blast'\npath = 'x'\n", "databases[0].tool", "unknown search tool"),
        ("[[databases]]\nname = 'a'\ntool = 'jackhmmer'\n", "databases[0].path", "missing"),
        (
            "[[databases]]\nname = 'a'\ntool = 'hhsearch'\nrole = 'msa'\npath = 'x'\n",
            "databases[0].role",
            "cannot serve",
        ),
        ("[[databases]]\nname = 'a'\ntool = 'jackhmmer'\npath = ['x', 'y']\n", "databases[0].path", "only hhblits"),
        ("[[databases]]\nname = 'a'\ntool = 'jackhmmer'\npath = 'x'\nmax_hits = -5\n", "databases[0].max_hits", ">= 1"),
        (
            "[[databases]]\nname = 'a'\ntool = 'jackhmmer'\npath = 'x'\n[[databases]]\nname = 'a'\ntool = 'nhmmer'\npath = 'y'\n",
            "databases[1].name",
            "used twice",
        ),
        (
            "[[databases]]\nname = 'a'\ntool = 'jackhmmer'\npath = 'x'\nmolecule_types = ['rna']\n",
            "databases[0].molecule_types",
            "cannot search rna",
        ),
        ("[templates]\nmsa_database = 'uniref'\n", "templates.msa_database", "no database named"),
        ("[features]\nmax_templates_stored = 'four'\n", "features.max_templates_stored", "expected int"),
        ("[features]\nmax_msa_row = 5\n", "features.max_msa_row", "unknown key"),
        ("[features]\nmax_templates_stored = -1\n", "features", "max_templates_stored must be >= 0"),
        (
            "[features]\nmax_msa_rows = 5\nmsa_rows_stored = 6\n",
            "features.max_msa_rows",
            "keep only features.msa_rows_stored",
        ),
        ("[store]\nnum_shards = true\n", "store.num_shards", "expected int"),
        ("[curation]\nmax_release_date = 20210930\n", "curation.max_release_date", "expected a date"),
        ("[curation]\nmax_release_date = '2021-02-30'\n", "curation", "max_release_date must be an ISO date"),
        ("[curation]\nclash_fraction = 1.5\n", "curation", "clash_fraction must be in [0, 1]"),
        ("[curation]\ncrystallization_aids = 'SO4'\n", "curation.crystallization_aids", "list of strings"),
        ("[curation]\nmax_chain = 5\n", "curation.max_chain", "unknown key"),
        ("[clustering]\nprotein_min_seq_id = 40\n", "clustering", "protein_min_seq_id must be in [0, 1]"),
        ("[clustering]\nenabled = 'yes'\n", "clustering.enabled", "expected bool"),
        ("[chem]\nconformer_max_bond_deviation = 0\n", "chem", "conformer_max_bond_deviation must be a number > 0"),
        ("[chem]\nconformer_max_bond_deviation = nan\n", "chem", "conformer_max_bond_deviation must be a number > 0"),
        ("[chem]\nconformer_max_bond_deviation = '0.2'\n", "chem.conformer_max_bond_deviation", "expected float"),
        ("[search\n", "not valid TOML", ""),
    ],
)
def test_errors_name_file_and_key(tmp_path, text, key, problem):
    path = _write(tmp_path, text)
    with pytest.raises(PipelineConfigError) as caught:
        load_pipeline_config(path)
    message = str(caught.value)
    assert message.startswith(str(path)) and key in message and problem in message


def test_old_msa_rows_key_still_works_with_a_warning(tmp_path):
    path = _write(tmp_path, "[features]\nmax_msa_rows = 12\n")
    with pytest.warns(FutureWarning, match="features.max_msa_rows is deprecated: use features.msa_rows_stored"):
        config = load_pipeline_config(path)
    assert config.features == FeatureConfig(msa_rows_stored=12)


def test_missing_config_file_is_named(tmp_path):
    with pytest.raises(PipelineConfigError, match="pipeline config file not found"):
        load_pipeline_config(tmp_path / "absent.toml")


def test_settings_are_parsed(tmp_path):
    config = parse_pipeline_config(
        {
            "search": {"threads": 3, "timeout_s": 60},
            "tools": {"hhblits": {"threads": 6, "flags": ["-n", "1"], "extra_flags": ["-v", "0"]}},
            "features": {"max_templates_stored": 2, "min_template_align_ratio": 1},
            "store": {"num_shards": 9},
        },
        base_dir=tmp_path,
    )
    assert config.tool_settings("hhblits") == ToolSettings(None, 6, 60.0, ("-n", "1"), ("-v", "0"))
    assert config.tool_settings("nhmmer") == ToolSettings(None, 3, 60.0, None, ())
    assert config.features.max_templates_stored == 2 and config.features.min_template_align_ratio == 1.0
    assert config.store.num_shards == 9
    assert config.make_tool("hhblits").flags == ("-n", "1", "-v", "0")


def test_curation_and_clustering_settings_default_to_af3s(tmp_path):
    example = load_pipeline_config(EXAMPLE)  # the example spells every default out
    assert example.curation == CurationConfig() and example.clustering == ClusteringConfig()
    config = load_pipeline_config(
        _write(
            tmp_path,
            (
                "[curation]\nmax_release_date = 2021-09-30\nmin_release_date = '1990-01-01'\nmax_resolution = inf\n"
                "crystallization_aids = ['SO4']\nmax_chains = 8\n"
                "[clustering]\nprotein_min_seq_id = 0.3\nalpha_ligand = 2\nenabled = false\n"
            ),
        )
    )
    assert config.curation == CurationConfig(
        max_release_date="2021-09-30",
        min_release_date="1990-01-01",
        max_resolution=float("inf"),
        crystallization_aids=("SO4",),
        max_chains=8,
    )
    assert config.clustering == ClusteringConfig(protein_min_seq_id=0.3, alpha_ligand=2.0, enabled=False)
    assert load_pipeline_config(_write(tmp_path, "")).curation == CurationConfig()


def test_chem_settings_default_to_the_examples(tmp_path):
    assert load_pipeline_config(EXAMPLE).chem == ChemConfig()  # the example spells every default out
    config = load_pipeline_config(_write(tmp_path, "[chem]\nconformer_max_bond_deviation = inf\nconformer_seed = 3\n"))
    assert config.chem == ChemConfig(conformer_max_bond_deviation=float("inf"), conformer_seed=3)
    assert (
        load_pipeline_config(
            _write(tmp_path, "[chem]\nconformer_max_bond_deviation = 1\n")
        ).chem.conformer_max_bond_deviation
        == 1.0
    )


def _fake_hmmer(tmp_path, version: str) -> str:
    """A jackhmmer that reports another HMMER version and otherwise runs the real one."""
    real = shutil.which("jackhmmer")
    script = tmp_path / f"jackhmmer-{version}"
    script.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = "-h" ]; then echo "# jackhmmer :: fake"; echo "# HMMER {version} (Jan 2030)"; exit 0; fi\n'
        f'exec {real} "$@"\n'
    )
    script.chmod(0o755)
    return str(script)


def test_search_fingerprint_follows_version_flags_cap_and_database(test_databases, tmp_path):
    fasta = tmp_path / "seqs.fasta"
    shutil.copy(test_databases.protein_fasta, fasta)
    config = parse_pipeline_config(
        {
            "databases": [
                {"name": "seqs", "tool": "jackhmmer", "path": str(fasta), "max_hits": 100},
                {"name": "seqs_capped", "tool": "jackhmmer", "path": str(fasta), "max_hits": 50},
                {"name": "seqs_versioned", "tool": "jackhmmer", "path": str(fasta), "version": "2024_01"},
            ]
        }
    )
    seqs, capped, versioned = config.databases
    tool = Jackhmmer()
    base = search_fingerprint(seqs, tool)
    assert search_fingerprint(seqs, Jackhmmer()) == base  # stable
    assert search_fingerprint(seqs, Jackhmmer(ToolSettings(threads=4))) == base
    assert search_fingerprint(seqs, Jackhmmer(ToolSettings(extra_flags=("--seed", "1")))) != base
    other_version = Jackhmmer(ToolSettings(binary=_fake_hmmer(tmp_path, "3.9.1")))
    assert other_version.version == "HMMER 3.9.1"
    assert search_fingerprint(seqs, other_version) != base
    assert search_fingerprint(capped, tool) != base

    # The database's identity: size and mtime, unless a version is declared.
    versioned_before = database_fingerprint(versioned)
    before = database_fingerprint(seqs)
    stat = fasta.stat()
    os.utime(fasta, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert database_fingerprint(seqs) != before
    assert database_fingerprint(versioned) == versioned_before
    with pytest.raises(ValueError, match="searched with jackhmmer"):
        search_fingerprint(seqs, Hmmsearch())


def test_hhsuite_fingerprint_covers_every_file(test_databases, tmp_path):
    for path in test_databases.hhsuite_msa.parent.iterdir():
        shutil.copy(path, tmp_path / path.name)
    config = parse_pipeline_config({"databases": [{"name": "hh", "tool": "hhblits", "path": str(tmp_path / "db")}]})
    before = database_fingerprint(config.databases[0])
    with open(tmp_path / "db_cs219.ffindex", "a") as handle:
        handle.write("\n")
    assert database_fingerprint(config.databases[0]) != before
    (tmp_path / "db_a3m.ffdata").unlink()
    with pytest.raises(FileNotFoundError, match="database hh: missing file"):
        database_fingerprint(config.databases[0])


def test_precompute_reports_every_missing_tool_and_database_before_any_work(shared_data, tmp_path):
    from click.testing import CliRunner

    from featurecache.cli import cli

    config = _write(
        tmp_path,
        """
[tools.hhblits]
binary = "featurecache-no-such-hhblits"
[[databases]]
name = "uniref90"
tool = "jackhmmer"
path = "missing/uniref90.fasta"
[[databases]]
name = "bfd"
tool = "hhblits"
path = "missing/bfd"
""",
    )
    cache = tmp_path / "cache"
    result = CliRunner().invoke(
        cli,
        [
            "precompute",
            str(shared_data / "structures"),
            "--cache",
            str(cache),
            "--config",
            str(config),
            "--no-progress",
        ],
    )
    assert result.exit_code == 2, result.output
    assert "featurecache-no-such-hhblits" in result.output
    assert str(tmp_path / "missing" / "uniref90.fasta") in result.output
    assert str(tmp_path / "missing" / "bfd_a3m.ffdata") in result.output
    assert not cache.exists(), "nothing may be written before the preflight passes"
