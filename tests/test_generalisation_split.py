"""benchmarks/generalisation.py: the committed entries (provenance and split) and the split rule,
on clusters written by hand (the real cache needs the repositories' snapshots: device_plan.sh
general_prepare builds it and `generalisation.py check` checks the split on it)."""

from __future__ import annotations

import pathlib
import re
import sys

import pytest

BENCHMARKS = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def generalisation():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import generalisation
    finally:
        sys.path.remove(str(BENCHMARKS))
    return generalisation


def test_committed_entries_name_their_source_and_split(generalisation):
    entries = generalisation.read_entries()
    assert list(entries[0]) == list(generalisation.COLUMNS)
    ids = [entry["pdb_id"] for entry in entries]
    assert len(ids) == len(set(ids))
    for entry in entries:
        assert re.fullmatch(r"\d[a-z0-9]{3}", entry["pdb_id"]), entry
        assert re.fullmatch(r"[\w.-]+/[\w.-]+", entry["repository"]) and entry["path"], entry
        assert re.fullmatch(r"[0-9a-f]{40}", entry["commit"]) and re.fullmatch(r"[0-9a-f]{64}", entry["sha256"]), entry
        assert generalisation.ENTRY_FILE.match(entry["path"].rsplit("/", 1)[-1]).group(1).lower() == entry["pdb_id"]
        assert entry["method"] == generalisation.METHOD and float(entry["resolution"]) <= generalisation.MAX_RESOLUTION
        low, high = generalisation.POLYMER_RESIDUES
        assert low <= int(entry["polymer_residues"]) <= high, entry
        assert entry["split"] in ("train", "validation", "excluded") and entry["split_reason"], entry
    splits = [entry["split"] for entry in entries]
    assert (
        splits.count("train") >= generalisation.MIN_TRAIN
        and splits.count("validation") >= generalisation.MIN_VALIDATION
    )
    # a validation entry's reason names its clusters; no cluster it names is named by another
    named = {
        entry["pdb_id"]: set(re.findall(r"\w+:[0-9a-f]+", entry["split_reason"]))
        for entry in entries
        if entry["split"] == "validation"
    }
    assert all(named.values())
    assert all(not clusters & other for key, clusters in named.items() for k, other in named.items() if k != key)


def test_split_keeps_linked_entries_together_and_mixes_the_held_out_kinds(generalisation, monkeypatch):
    monkeypatch.setattr(generalisation, "VALIDATION_TARGET", 3)
    monkeypatch.setattr(generalisation, "MIN_TRAIN", 2)
    monkeypatch.setattr(generalisation, "MIN_VALIDATION", 3)
    clusters = {  # a-b-c linked through shared clusters (c only through b), d..g alone; h not cached
        "1aaa": {"protein:1"},
        "1bbb": {"protein:1", "protein:2"},
        "1ccc": {"protein:2"},
        "1ddd": {"protein:4"},
        "1eee": {"protein:5", "protein:6"},
        "1fff": {"protein:7"},
        "1ggg": {"dna:8"},
    }
    assert sorted(map(sorted, generalisation.linked_groups(clusters))) == [
        ["1aaa", "1bbb", "1ccc"],
        ["1ddd"],
        ["1eee"],
        ["1fff"],
        ["1ggg"],
    ]

    def entry(pdb_id: str, chains: int, ligands: str) -> dict:
        return {"pdb_id": pdb_id, "polymer_chains": str(chains), "ligands": ligands, "split": "", "split_reason": ""}

    entries = [
        entry("1aaa", 1, ""),
        entry("1bbb", 1, ""),
        entry("1ccc", 2, "HEM"),
        entry("1ddd", 1, ""),
        entry("1eee", 2, ""),
        entry("1fff", 1, "ATP MG"),
        entry("1ggg", 2, "MG"),
        entry("1hhh", 1, ""),
    ]
    split = {item["pdb_id"]: item["split"] for item in generalisation.split(entries, clusters)}
    assert split["1hhh"] == "excluded"
    assert all(split[key] == "train" for key in ("1aaa", "1bbb", "1ccc"))  # linked: never held out in part
    held_out = sorted(key for key, value in split.items() if value == "validation")
    assert len(held_out) == 3
    # one of each kind first: single chain, several chains, with and without ligands
    kinds = {(int(e["polymer_chains"]) > 1, bool(e["ligands"])) for e in entries if e["pdb_id"] in held_out}
    assert len(kinds) == 3
    generalisation.check(entries, clusters)
    # a validation entry that shares a cluster with a training one is refused, naming it
    leaked = {**clusters, held_out[0]: clusters[held_out[0]] | {"protein:1"}}
    with pytest.raises(SystemExit, match=f"{held_out[0]}.*protein:1"):
        generalisation.check(entries, leaked)


def test_the_ccd_cut_holds_the_entries_components_as_biotite_reads_them(generalisation, shared_data, tmp_path):
    """`generalisation.py ccd`: the components an entry uses (ligands, ions, residues) and the
    standard residues, in a file biotite takes as its CCD, each with the full dictionary's atoms."""
    import shutil

    import biotite.structure.info as info
    import gemmi

    inputs = tmp_path / "inputs"
    inputs.mkdir()
    shutil.copy(shared_data / "structures" / "721p-assembly1.cif", inputs / "721p.cif")
    used = {residue.name for chain in gemmi.read_structure(str(inputs / "721p.cif"))[0] for residue in chain}
    out = tmp_path / "components.bcif"
    count = generalisation.ccd_subset(inputs, ["721p"], out)
    full = info.get_ccd()
    expected = {*used, *generalisation.STANDARD_RESIDUES} & set(full["chem_comp"]["id"].as_array(str).tolist())
    assert count == len(expected) and {"GNP", "MG"} <= expected
    atoms = {code: info.get_from_ccd("chem_comp_atom", code, "atom_id").as_array(str).tolist() for code in expected}
    try:
        info.set_ccd_path(out)
        cut = info.get_ccd()
        assert set(cut["chem_comp"]["id"].as_array(str).tolist()) == expected
        for code in expected:
            assert info.get_from_ccd("chem_comp_atom", code, "atom_id").as_array(str).tolist() == atoms[code], code
    finally:
        info.set_ccd_path(pathlib.Path(info.__file__).parent / "components.bcif")
