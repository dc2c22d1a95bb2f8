"""Per-sequence search over every configured database, with the real tools."""

from __future__ import annotations

import os
import re

import pytest

from featurecache.precompute.pipeline_config import parse_pipeline_config
from featurecache.precompute.search import SearchPlan, search_sequence, sequence_key
from featurecache.precompute.tools import ToolError

pytestmark = pytest.mark.tools


def _template_chains(test_databases) -> set[str]:
    return {
        line[1:].split()[0] for line in test_databases.template_seqres.read_text().splitlines() if line.startswith(">")
    }


def test_protein_chain_from_structures_gets_msas_and_templates(pipeline_config, ras_sequence, tmp_path):
    result = search_sequence(ras_sequence.lower(), "protein", pipeline_config, workdir=tmp_path)
    assert result.sequence == ras_sequence
    assert result.sequence_key == sequence_key("protein", ras_sequence)
    plan = SearchPlan(pipeline_config)
    assert result.fingerprint == plan.fingerprint("protein")

    assert [(item.database, item.tool, item.output_format) for item in result.msas] == [
        ("uniprot_sample", "jackhmmer", "sto"),
        ("sample_a3m", "hhblits", "a3m"),
    ]
    jackhmmer, hhblits = result.msas
    # Real homologs: the 721P MSA rows are in the protein FASTA, its first row (H-Ras itself,
    # query "101") is found full length.
    assert jackhmmer.num_hits > 20 and hhblits.num_hits >= 1
    assert f"721p-assembly1A_protein|0|101/1-{len(ras_sequence)}" in jackhmmer.text
    assert [(item.database, item.role, item.output_format) for item in result.templates] == [
        ("pdb_seqres_sample", "template", "hhr")
    ]
    # 721P is among the test templates (its structure is in ../shared/data/structures).
    assert re.search(r"^\s*1 721p_[AB] ", result.templates[0].text, re.MULTILINE)
    fingerprints = plan.database_fingerprints("protein")
    assert {item.database: item.fingerprint for item in result.msas + result.templates} == fingerprints
    assert len(set(fingerprints.values())) == 3
    assert set(result.timings) == set(fingerprints) and result.tool_seconds > 0
    assert jackhmmer.tool_version.startswith("HMMER") and hhblits.tool_version.startswith("HHblits")
    assert not os.listdir(tmp_path)


@pytest.mark.parametrize(("template_tool", "output_format"), [("hmmsearch", "m8"), ("hhsearch", "hhr")])
def test_template_search_finds_the_sample_templates(test_databases, template_query, template_tool, output_format):
    path = test_databases.template_seqres if template_tool == "hmmsearch" else test_databases.template_hhsuite
    config = parse_pipeline_config(
        {
            "search": {"threads": 2},
            "databases": [
                {"name": "uniprot", "tool": "jackhmmer", "path": str(test_databases.protein_fasta)},
                {"name": "pdb", "tool": template_tool, "role": "template", "path": str(path), "max_hits": 5},
            ],
            "templates": {"mmcif_dir": str(test_databases.template_mmcif_dir)},
        }
    )
    result = SearchPlan(config).search(template_query, "protein")
    (templates,) = result.templates
    assert templates.output_format == output_format and 1 <= templates.num_hits <= 5
    found = set(re.findall(r"\b(\d[a-z0-9]{3}_[A-Z])\b", templates.text))
    assert found and found <= _template_chains(test_databases)


def test_rna_chain_is_searched_with_nhmmer_only(pipeline_config, rna_sequence):
    result = search_sequence(rna_sequence, "rna", pipeline_config)
    assert [item.database for item in result.msas] == ["nucleotide_sample"]
    assert result.msas[0].num_hits >= 1 and "--rna" in result.msas[0].command
    assert result.templates == ()
    assert result.fingerprint != SearchPlan(pipeline_config).fingerprint("protein")


def test_molecule_type_without_databases_gives_empty_result(test_databases):
    config = parse_pipeline_config(
        {"databases": [{"name": "uniprot", "tool": "jackhmmer", "path": str(test_databases.protein_fasta)}]}
    )
    result = search_sequence("GAAGCTTC", "dna", config)
    assert result.msas == () and result.templates == () and result.tool_seconds == 0


def test_sequence_key_is_stable_and_typed():
    assert sequence_key("protein", "ACD EF\n") == sequence_key("protein", "acdef")
    assert re.fullmatch(r"[0-9a-f]{32}", sequence_key("protein", "ACDEF"))
    assert sequence_key("protein", "ACG") != sequence_key("rna", "ACG") != sequence_key("dna", "ACG")
    with pytest.raises(ValueError, match="molecule type"):
        sequence_key("ligand", "CCO")


def test_failing_database_is_named_and_does_not_poison_the_plan(test_databases, tmp_path, template_query):
    broken = tmp_path / "broken.fasta"
    broken.write_bytes(b"\x00\x01 not a sequence database")
    config = parse_pipeline_config(
        {
            "databases": [
                {"name": "broken", "tool": "jackhmmer", "path": str(broken), "molecule_types": ["protein"]},
            ]
        }
    )
    plan = SearchPlan(config, tmp_root=tmp_path / "work")
    with pytest.raises(ToolError) as caught:
        plan.search(template_query, "protein")
    assert caught.value.message.startswith("database broken: jackhmmer exited with status")
    assert caught.value.stderr_tail
    assert not os.listdir(tmp_path / "work")

    good = parse_pipeline_config(
        {"databases": [{"name": "uniprot", "tool": "jackhmmer", "path": str(test_databases.protein_fasta)}]}
    )
    assert search_sequence(template_query, "protein", good).msas[0].num_hits >= 1


def test_template_fingerprint_follows_its_query_msa(test_databases):
    def plan(msa_cap: int) -> SearchPlan:
        return SearchPlan(
            parse_pipeline_config(
                {
                    "databases": [
                        {
                            "name": "uniprot",
                            "tool": "jackhmmer",
                            "path": str(test_databases.protein_fasta),
                            "max_hits": msa_cap,
                        },
                        {
                            "name": "pdb",
                            "tool": "hmmsearch",
                            "role": "template",
                            "path": str(test_databases.template_seqres),
                        },
                    ]
                }
            )
        )

    small, large = plan(100).database_fingerprints("protein"), plan(200).database_fingerprints("protein")
    assert small["uniprot"] != large["uniprot"]
    assert small["pdb"] != large["pdb"], "hmmsearch's result depends on the MSA it is built from"
