"""Small real search databases, built once per test session from ../shared/data.

The databases come from featurecache.testing.testdb (the same builder the examples use): a
protein FASTA of real UniProt/UniRef sequences and its MMseqs2 database, an HH-suite database
made with ffindex_build + cstranslate from the sample A3M files, a nucleotide FASTA, and a
template seqres FASTA (plus MMseqs2 and HH-suite versions) from the sample template mmCIFs.
"""

from __future__ import annotations

import gemmi
import pytest

from featurecache.precompute.pipeline_config import PipelineConfig, load_pipeline_config
from featurecache.testing.testdb import TestDatabases, build_test_databases, write_pipeline_config


@pytest.fixture(scope="session")
def test_databases(tmp_path_factory, shared_data) -> TestDatabases:
    return build_test_databases(tmp_path_factory.mktemp("search_databases"), shared_data)


@pytest.fixture(scope="session")
def pipeline_config(test_databases, tmp_path_factory) -> PipelineConfig:
    path = write_pipeline_config(test_databases, tmp_path_factory.mktemp("config") / "pipeline.toml", threads=2)
    return load_pipeline_config(path)


def _chain_sequence(path, asym_id: str) -> str:
    """One-letter sequence of a polymer chain from the file's _pdbx_poly_seq_scheme loop."""
    block = gemmi.cif.read(str(path)).sole_block()
    residues = [
        gemmi.cif.as_string(row[1])
        for row in block.find("_pdbx_poly_seq_scheme.", ["asym_id", "mon_id"])
        if gemmi.cif.as_string(row[0]) == asym_id
    ]
    if not residues:
        raise LookupError(f"chain {asym_id} not found in {path}")
    return gemmi.one_letter_code(residues)


@pytest.fixture(scope="session")
def ras_sequence(shared_data) -> str:
    """H-Ras, chain A of PDB 721P (../shared/data/structures)."""
    return _chain_sequence(shared_data / "structures" / "721p-assembly1.cif", "A")


@pytest.fixture(scope="session")
def template_query(shared_data) -> str:
    """OpenFold's 73-residue test query, whose PDB70 hits are the sample template mmCIFs."""
    lines = (shared_data / "alignments" / "openfold" / "short.fasta").read_text().split()
    return "".join(line for line in lines if not line.startswith(">"))


@pytest.fixture(scope="session")
def rna_sequence(shared_data) -> str:
    """The query of the sample RNA alignment (6PB6 chain B)."""
    text = (shared_data / "alignments" / "pdb" / "6pb6-assembly1B_dna.a2m").read_text()
    first = text.split(">")[1]
    return "".join(first.splitlines()[1:]).upper()
