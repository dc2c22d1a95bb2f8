"""`featurecache search` on the small real databases: A3M files, AlphaFold 3 input JSON checked
against AF3's documented input format (docs/input.md), and a precompute afterwards that reuses
every search."""

from __future__ import annotations

import csv
import json
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from featurecache.cli import cli
from featurecache.io.af3_json import read_af3_json
from featurecache.io.msa import parse_a3m
from featurecache.io.residues import read_sequence
from featurecache.io.species import species_tag
from featurecache.precompute.msa_records import decode_msa_record
from featurecache.precompute.search import sequence_key
from featurecache.store.manifest import read_manifest
from featurecache.store.reader import StoreReader
from featurecache.store.verify import verify_cache
from featurecache.testing.boltz_inputs import parse_boltz_input, parse_boltz_msa
from featurecache.testing.protenix_inputs import protenix_features, residue_names
from featurecache.testing.testdb import write_pipeline_config
from tests.conftest import copy_sample_structures
from tests.io.test_af3_json_writer import af3_template_release_date
from tests.peer_pairing import af3_paired_rows, protenix_paired_rows
from tests.precompute.test_search_outputs import featurecache_paired_rows

# --- AlphaFold 3's input format, as its docs/input.md gives it ---------------------------------

TOP_LEVEL = {
    "name": str,
    "modelSeeds": list,
    "sequences": list,
    "bondedAtomPairs": list,
    "userCCD": str,
    "userCCDPath": str,
    "dialect": str,
    "version": int,
}
REQUIRED_TOP_LEVEL = {"name", "modelSeeds", "sequences", "dialect", "version"}
ENTITY_FIELDS = {
    "protein": {
        "id",
        "sequence",
        "modifications",
        "description",
        "unpairedMsa",
        "unpairedMsaPath",
        "pairedMsa",
        "pairedMsaPath",
        "templates",
    },
    "rna": {"id", "sequence", "modifications", "description", "unpairedMsa", "unpairedMsaPath"},
    "dna": {"id", "sequence", "modifications", "description"},
    "ligand": {"id", "ccdCodes", "smiles", "description"},
}
MODIFICATION_FIELDS = {
    "protein": ("ptmType", "ptmPosition"),
    "rna": ("modificationType", "basePosition"),
    "dna": ("modificationType", "basePosition"),
}
SEQUENCE_LETTERS = {"rna": set("ACGU"), "dna": set("ACGT")}
TEMPLATE_FIELDS = {"mmcif": str, "mmcifPath": str, "queryIndices": list, "templateIndices": list}


def check_a3m(text: str, query: str, where: str) -> None:
    """docs/input.md: A3M, the first sequence exactly the query, and with lower-case insertions
    removed every sequence as long as the query."""
    records = re.findall(r">[^\n]*\n([^>]*)", text)
    assert records, f"{where}: no A3M records"
    assert records[0].replace("\n", "") == query, f"{where}: first sequence is not the query"
    for sequence in records:
        kept = re.sub(r"[a-z\n]", "", sequence)
        assert len(kept) == len(query) and re.fullmatch(r"[A-Z-]+", kept), f"{where}: row not rectangular"


def check_af3_input(document: dict) -> None:
    """Field names, types and rules of an AlphaFold 3 input JSON (dialect alphafold3)."""
    assert set(document) <= set(TOP_LEVEL) and REQUIRED_TOP_LEVEL <= set(document), sorted(document)
    for key, kind in TOP_LEVEL.items():
        if key in document:
            assert isinstance(document[key], kind) and not isinstance(document[key], bool), key
    assert document["dialect"] == "alphafold3" and document["version"] in (1, 2, 3, 4)
    assert document["modelSeeds"] and all(type(seed) is int for seed in document["modelSeeds"])
    ids = []
    for entry in document["sequences"]:
        assert isinstance(entry, dict) and len(entry) == 1
        kind, body = next(iter(entry.items()))
        assert kind in ENTITY_FIELDS and set(body) <= ENTITY_FIELDS[kind], (kind, sorted(body))
        chain_ids = body["id"] if isinstance(body["id"], list) else [body["id"]]
        # "IDs must be upper case letters" (AF3 refuses anything else)
        assert chain_ids and all(isinstance(c, str) and c.isalpha() and c.isupper() for c in chain_ids), chain_ids
        ids += chain_ids
        if "description" in body:
            assert isinstance(body["description"], str) and document["version"] >= 4
        if kind == "ligand":
            assert ("ccdCodes" in body) != ("smiles" in body)
            if "ccdCodes" in body:
                assert body["ccdCodes"] and all(isinstance(code, str) for code in body["ccdCodes"])
            else:
                assert isinstance(body["smiles"], str)
            continue
        sequence = body["sequence"]
        assert isinstance(sequence, str) and sequence.isalpha() and sequence.isupper()
        if kind in SEQUENCE_LETTERS:
            assert set(sequence) <= SEQUENCE_LETTERS[kind]
        type_key, position_key = MODIFICATION_FIELDS[kind]
        for modification in body.get("modifications", []):
            assert set(modification) == {type_key, position_key}
            assert isinstance(modification[type_key], str)
            assert type(modification[position_key]) is int and 1 <= modification[position_key] <= len(sequence)
        if kind == "protein":  # unpairedMsa and pairedMsa: both set or both unset
            assert ("unpairedMsa" in body) == ("pairedMsa" in body)
        for key in ("unpairedMsa", "pairedMsa"):
            if body.get(key):
                check_a3m(body[key], sequence, f"{body['id']} {key}")
            elif key in body:
                assert body[key] == ""
        for template in body.get("templates", []):
            assert set(template) <= set(TEMPLATE_FIELDS) and ("mmcif" in template) != ("mmcifPath" in template)
            for key, kind_ in TEMPLATE_FIELDS.items():
                assert key not in template or isinstance(template[key], kind_), key
            query, hit = template["queryIndices"], template["templateIndices"]
            assert len(query) == len(hit) and all(type(i) is int and i >= 0 for i in query + hit)
            assert max(query, default=0) < len(sequence)
    assert len(ids) == len(set(ids)), "every entity needs unique ids"
    for pair in document.get("bondedAtomPairs", []):
        assert len(pair) == 2
        for chain_id, residue, atom in pair:
            assert chain_id in ids and type(residue) is int and residue >= 1 and isinstance(atom, str)


# --- the command ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def searched(tmp_path_factory, test_databases, ras_sequence, template_query):
    """One `search` run: 721p (H-Ras homodimer with ligands), a two-protein FASTA whose chains
    are the OpenFold test query (templates among the sample mmCIFs) and H-Ras again, and an AF3
    JSON of that query with ATP."""
    root = tmp_path_factory.mktemp("search")
    config = write_pipeline_config(test_databases, root / "pipeline.toml", threads=1, template_tool="hhsearch")
    inputs = copy_sample_structures("721p-assembly1.cif", root / "inputs")
    (inputs / "pair.fasta").write_text(f">query mol:protein\n{template_query}\n>ras mol:protein\n{ras_sequence}\n")
    given = {
        "name": "given job",
        "modelSeeds": [7, 11],
        "dialect": "alphafold3",
        "version": 1,
        "sequences": [
            {"protein": {"id": "A", "sequence": template_query}},
            {"ligand": {"id": "B", "ccdCodes": ["ATP"]}},
        ],
    }
    (inputs / "given.json").write_text(json.dumps(given))
    out = root / "out"
    result = CliRunner().invoke(
        cli,
        [
            "search",
            str(inputs),
            "--config",
            str(config),
            "--out",
            str(out),
            "--executor",
            "inline",
            "--no-progress",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    return {"root": root, "config": config, "inputs": inputs, "out": out, "summary": json.loads(result.output)}


def test_a3m_files_hold_every_searched_row_query_first(searched, ras_sequence, template_query):
    out = searched["out"]
    index = json.loads((out / "index.json").read_text())
    assert set(index) == {"721p-assembly1", "pair", "given"}
    assert index["721p-assembly1"]["A"] == index["721p-assembly1"]["B"] == index["pair"]["B"]  # one search of Ras
    assert searched["summary"]["sequences"] == {"done": 2, "skipped": 0, "failed": 0}
    with StoreReader(out / "cache") as reader:
        stored = {
            key.split("-")[0]: decode_msa_record(reader.get("msa", key), where=key)
            for key in reader.keys("msa")
            if "-db-" not in key
        }
    for query in (ras_sequence, template_query):
        folder = out / "msas" / sequence_key("protein", query)
        assert f"msas/{folder.name}" in {path for chains in index.values() for path in chains.values()}
        text = (folder / "non_pairing.a3m").read_text()
        check_a3m(text, query, folder.name)
        msa = parse_a3m(text, folder.name)
        stored_msa, hits = stored[folder.name]
        assert msa.depth == stored_msa.depth > 10 and msa.length == len(query)
        np.testing.assert_array_equal(msa.aligned, stored_msa.aligned)
        np.testing.assert_array_equal(msa.deletion_matrix, stored_msa.deletion_matrix)
        assert msa.descriptions == stored_msa.descriptions
        with open(folder / "boltz_msa.csv", newline="") as handle:  # Boltz: key (int32) and A3M row
            boltz = list(csv.DictReader(handle))
        assert [row["sequence"] for row in boltz] == re.findall(r">[^\n]*\n([^\n]*)", text)
        keys = [int(row["key"]) for row in boltz]
        assert keys[0] == -1 and all(-1 <= key < 2**31 for key in keys)
        for key, name in zip(keys[1:], msa.species[1:]):
            assert (key == -1) == (name == "") and (not name.startswith("tax:") or key == int(name[4:]))
        written_hits = json.loads((folder / "template_hits.json").read_text())
        assert [hit["name"] for hit in written_hits] == [hit.name for hit in hits]
        assert written_hits[0]["query_indices"] == hits[0].query_indices.tolist()
    paired = parse_a3m((out / "msas" / sequence_key("protein", template_query) / "pairing.a3m").read_text(), "p")
    assert paired.query == template_query and paired.depth > 1
    assert all(species_tag(description) for description in paired.descriptions[1:])  # every row names a species


def test_af3_json_follows_the_documented_input_format(searched, ras_sequence, template_query):
    out = searched["out"]
    documents = {path.stem: json.loads(path.read_text()) for path in (out / "af3").glob("*.json")}
    assert set(documents) == {"721p-assembly1", "pair", "given"}
    for document in documents.values():
        check_af3_input(document)
    entities = [next(iter(entry.items())) for entry in documents["721p-assembly1"]["sequences"]]
    protein = [body for kind, body in entities if kind == "protein"]
    assert len(protein) == 1 and protein[0]["id"] == ["A", "B"] and protein[0]["sequence"] == ras_sequence
    assert protein[0]["pairedMsa"] == ""  # a homodimer: AF3 pairs nothing
    assert protein[0]["templates"] == []  # its one hit is 721p itself, dropped as a near copy
    assert sorted(body["ccdCodes"][0] for kind, body in entities if kind == "ligand") == ["GNP", "MG"]
    given = documents["given"]  # an AF3 JSON input keeps its name and seeds
    assert given["name"] == "given job" and given["modelSeeds"] == [7, 11]
    assert given["sequences"][1] == {"ligand": {"id": "B", "ccdCodes": ["ATP"]}}
    assert given["sequences"][0]["protein"]["pairedMsa"] == ""  # one protein: nothing to pair
    pair = [entry["protein"] for entry in documents["pair"]["sequences"]]
    assert [body["sequence"] for body in pair] == [template_query, ras_sequence]
    query_body = pair[0]  # its pairedMsa: the rows precompute pairs (none here: Ras names no species)
    assert query_body["templates"], "the OpenFold query has hits among the sample template mmCIFs"
    # featurecache's own AF3 reader takes it back: one protein chain per template, indices in range.
    parsed = read_af3_json(out / "af3" / "pair.json", "pair")
    paired_rows = max(query_body["pairedMsa"].count(">") - 1, 0)  # without its query
    assert parsed.msas["A"].msa.depth == query_body["unpairedMsa"].count(">") + paired_rows
    for template, given in zip(query_body["templates"], parsed.templates["A"]):
        residues = given.chain.residues
        matched = sum(
            template_query[q] == given.chain.sequence[t]
            for q, t in zip(template["queryIndices"], template["templateIndices"])
        )
        assert len(residues) > max(template["templateIndices"])
        assert matched / len(template["queryIndices"]) >= 0.2  # aligned residues, not an offset mapping


def test_precompute_after_search_reuses_every_search(searched):
    cache = searched["out"] / "cache"
    # The rerun on Ray (as by default), one worker: every search is found stored.
    rerun = CliRunner().invoke(
        cli,
        [
            "search",
            str(searched["inputs"]),
            "--config",
            str(searched["config"]),
            "--out",
            str(searched["out"]),
            "--workers",
            "1",
            "--no-progress",
            "--json",
        ],
    )
    assert rerun.exit_code == 0, rerun.output
    assert json.loads(rerun.output[rerun.output.index("{") :])["sequences"] == {"done": 0, "skipped": 2, "failed": 0}
    result = CliRunner().invoke(
        cli,
        [
            "precompute",
            str(searched["inputs"]),
            "--cache",
            str(cache),
            "--config",
            str(searched["config"]),
            "--executor",
            "inline",
            "--no-progress",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output[result.output.index("{") :])
    assert summary["stages"]["search"] == {"done": 0, "skipped": 2, "failed": 0}
    assert summary["stages"]["featurize"]["done"] == 3
    # A search into the finished cache keeps its features, sampling table and fingerprints.
    before = read_manifest(cache)
    again = CliRunner().invoke(
        cli,
        [
            "search",
            str(searched["inputs"]),
            "--config",
            str(searched["config"]),
            "--out",
            str(searched["out"]),
            "--executor",
            "inline",
            "--no-progress",
        ],
    )
    assert again.exit_code == 0, again.output
    after = read_manifest(cache)
    assert after.fingerprints == before.fingerprints and after.targets == before.targets
    assert after.index["sampling"] == before.index["sampling"] and len(after.targets) == 3
    assert verify_cache(cache).ok


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["{inputs}", "--config", "{root}/missing.toml", "--out", "{root}/o"], "--config"),
        (["{root}/no-such-input", "--config", "{config}", "--out", "{root}/o"], "no-such-input"),
        (["{inputs}", "--config", "{config}", "--out", "{root}/o", "--max-templates", "-1"], "--max-templates"),
        (["{inputs}", "--out", "{root}/o"], "--config"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(searched, arguments, message):
    values = {"inputs": searched["inputs"], "root": searched["root"], "config": searched["config"]}
    result = CliRunner().invoke(cli, ["search", *[argument.format(**values) for argument in arguments]])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert len([line for line in result.output.splitlines() if line.startswith("Error")]) == 1


def test_a_failing_search_fails_its_target_only(tmp_path, test_databases, ras_sequence):
    """A corrupt nucleotide database: the DNA target fails (exit 1), the protein one is written."""
    broken = tmp_path / "broken-nucleotides.fasta"
    broken.write_bytes(b"\x00\x01 not a sequence database \xff\n" * 50)
    config = write_pipeline_config(test_databases, tmp_path / "pipeline.toml", threads=1)
    config.write_text(config.read_text().replace(str(test_databases.nucleotide_fasta), str(broken)))
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    (inputs / "dna.fasta").write_text(">a mol:dna\nCGCGAATTCGCG\n")
    (inputs / "ras.fasta").write_text(f">a mol:protein\n{ras_sequence}\n")
    out = tmp_path / "out"
    result = CliRunner().invoke(
        cli,
        [
            "search",
            str(inputs),
            "--config",
            str(config),
            "--out",
            str(out),
            "--executor",
            "inline",
            "--no-progress",
            "--json",
        ],
    )
    assert result.exit_code == 1, result.output
    summary = json.loads(result.output)
    assert summary["sequences"] == {"done": 1, "skipped": 0, "failed": 1} and summary["written"] == 1
    assert {(failure["stage"], failure["key"]) for failure in summary["failures"]} >= {("target", "dna")}
    assert [path.name for path in (out / "af3").iterdir()] == ["ras.json"]


def test_msas_and_templates_an_af3_json_gives_are_kept(searched, tmp_path, shared_data, template_query):
    """As precompute does: a chain whose MSA the JSON gives is not searched, and templates the
    JSON gives (inline or by mmcifPath) replace searched ones."""
    mmcif = (shared_data / "templates" / "mmcif" / "1psm.cif").read_text()
    (tmp_path / "t.cif").write_text(mmcif)
    short = template_query[:30]
    given_msa = f">query\n{short}\n>hit\n{short[:29]}-\n"
    document = {
        "name": "kept",
        "modelSeeds": [3],
        "dialect": "alphafold3",
        "version": 2,
        "sequences": [
            {
                "protein": {
                    "id": "A",
                    "sequence": template_query,
                    "templates": [{"mmcifPath": "t.cif", "queryIndices": [0, 1], "templateIndices": [2, 3]}],
                }
            },
            {
                "protein": {
                    "id": "B",
                    "sequence": short,
                    "unpairedMsa": given_msa,
                    "pairedMsa": "",
                    "templates": [{"mmcif": mmcif, "queryIndices": [5], "templateIndices": [6]}],
                }
            },
        ],
    }
    (tmp_path / "kept.json").write_text(json.dumps(document))
    out = tmp_path / "out"
    result = CliRunner().invoke(
        cli,
        [
            "search",
            str(tmp_path / "kept.json"),
            "--config",
            str(searched["config"]),
            "--out",
            str(out),
            "--cache",
            str(searched["out"] / "cache"),
            "--executor",
            "inline",
            "--no-progress",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["sequences"]["done"] == 0  # A was searched before, B is not searched
    written = json.loads((out / "af3" / "kept.json").read_text())
    check_af3_input(written)
    first, second = (entry["protein"] for entry in written["sequences"])
    assert [(t["queryIndices"], t["templateIndices"]) for t in first["templates"]] == [([0, 1], [2, 3])]
    assert first["templates"][0]["mmcif"] == mmcif and first["unpairedMsa"].count(">") > 10
    assert parse_a3m(second["unpairedMsa"], "B").depth == 2 and second["pairedMsa"] == ""
    assert [(t["queryIndices"], t["templateIndices"]) for t in second["templates"]] == [([5], [6])]


def test_every_template_has_the_release_date_af3_requires(searched):
    templates = [
        template
        for path in (searched["out"] / "af3").glob("*.json")
        for entry in json.loads(path.read_text())["sequences"]
        for template in entry.get("protein", {}).get("templates", [])
    ]
    assert templates
    for template in templates:
        assert af3_template_release_date(template["mmcif"]) is not None


def test_protenix_and_boltz_read_the_search_outputs(searched, tmp_path):
    """Each target's Protenix JSON through Protenix's own parser and MSA featurizer (which opens
    every MSA file it names), its Boltz YAML and MSA CSVs through Boltz's: the chains and residues
    of the AF3 JSON. 721p's Ras MSA names no species: its pairing.a3m holds the query (the README's
    Protenix example names that file)."""
    out = searched["out"]
    for target in ("721p-assembly1", "pair", "given"):
        af3 = json.loads((out / "af3" / f"{target}.json").read_text())
        chains = {}  # AF3 chain id -> (kind, residue codes)
        for entry in af3["sequences"]:
            ((kind, body),) = entry.items()
            codes = body.get("ccdCodes") or _af3_residues(kind, body)
            chains.update(
                {chain_id: (kind, codes) for chain_id in (body["id"] if isinstance(body["id"], list) else [body["id"]])}
            )
        (job,) = json.loads((out / "protenix" / f"{target}.json").read_text())
        for entry in job["sequences"]:
            body = entry.get("proteinChain", {})
            assert all(Path(body[key]).is_file() for key in ("pairedMsaPath", "unpairedMsaPath") if key in body)
        features, atom_array = protenix_features(job, tmp_path)
        assert sorted(set(atom_array.chain_id)) == sorted(chains)
        for chain_id, (_, codes) in chains.items():
            assert residue_names(atom_array, chain_id) == codes
        assert features["msa"].shape[0] > 1  # the searched rows arrived
        boltz = parse_boltz_input(out / "boltz" / f"{target}.yaml", tmp_path)
        assert sorted(str(chain["name"]) for chain in boltz.structure.chains) == sorted(chains)
        for chain in boltz.record.chains:
            if chain.msa_id != -1:
                assert len(parse_boltz_msa(Path(chain.msa_id)).sequences) > 1
    index = json.loads((out / "index.json").read_text())
    ras_pairing = (out / index["721p-assembly1"]["A"] / "pairing.a3m").read_text()
    assert ras_pairing.count(">") == 1 and ras_pairing.splitlines()[1] == chains_of(searched, "721p-assembly1")


def test_af3_protenix_and_boltz_pair_the_rows_featurecache_pairs(searched, template_query, ras_sequence):
    """The two-protein target: AF3's pairing code on the AF3 JSON's pairedMsa and Protenix's on
    its pairing files pair exactly the rows precompute pairs from the same searches (none in the
    test databases, where Ras's rows name no species; tests/precompute/test_search_outputs.py
    pairs hundreds of real rows)."""
    out = searched["out"]
    with StoreReader(out / "cache") as reader:
        stored = {
            key.split("-")[0]: decode_msa_record(reader.get("msa", key), where=key)[0]
            for key in reader.keys("msa")
            if "-db-" not in key
        }
    msas = [stored[sequence_key("protein", query)] for query in (template_query, ras_sequence)]
    expected = Counter(featurecache_paired_rows(msas))
    document = json.loads((out / "af3" / "pair.json").read_text())
    paired = [entry["protein"]["pairedMsa"] for entry in document["sequences"]]
    if expected:
        assert Counter(af3_paired_rows(paired)) == expected
        (job,) = json.loads((out / "protenix" / "pair.json").read_text())
        texts = [Path(entry["proteinChain"]["pairedMsaPath"]).read_text() for entry in job["sequences"]]
        assert Counter(protenix_paired_rows(texts)) == expected
    else:
        assert paired == ["", ""]  # nothing for AF3 to pair either


def chains_of(searched, target: str) -> str:
    """The first protein sequence of a target's AF3 JSON."""
    document = json.loads((searched["out"] / "af3" / f"{target}.json").read_text())
    return next(entry["protein"]["sequence"] for entry in document["sequences"] if "protein" in entry)


def _af3_residues(kind: str, body: dict) -> list[str]:
    """An AF3 polymer's residues as CCD codes: its letters, then its modifications."""
    codes = list(read_sequence(body["sequence"], kind).residues)
    type_key, position_key = MODIFICATION_FIELDS[kind]
    for modification in body.get("modifications", []):
        codes[modification[position_key] - 1] = modification[type_key]
    return codes
