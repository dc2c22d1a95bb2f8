"""Curation (AF3 SI 2.5.4): each filter removes what it names, on real sample structures
(some edited minimally with gemmi's CIF layer: a duplicated chain, moved residues, ...)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from featurecache.config import CRYSTALLIZATION_AIDS, CurationConfig
from featurecache.io.mmcif import read_mmcif
from featurecache.precompute.contacts import close_pairs
from featurecache.precompute.curation import (
    INTERFACE_TOKEN_DISTANCE,
    REASONS,
    token_centres,
    curate,
    is_crystallography,
)
from tests.precompute._mmcif_edits import (
    duplicate_chain,
    edited,
    keep_resolved,
    move_residues,
    rename_residues,
    set_method,
)

AF3 = CurationConfig()


def _chain_ids(structure) -> list[str]:
    return [chain.chain_id for chain in structure.chains]


@pytest.fixture
def structures(shared_data):
    return shared_data / "structures"


def test_defaults_are_af3s():
    assert AF3.max_resolution == 9.0 and AF3.max_release_date is None and AF3.max_chains == 20
    assert AF3.clash_distance == 1.7 and AF3.clash_fraction == 0.3 and AF3.interface_distance == 5.0
    assert set(CRYSTALLIZATION_AIDS) == {
        "SO4",
        "GOL",
        "EDO",
        "PO4",
        "ACT",
        "PEG",
        "DMS",
        "TRS",
        "PGE",
        "PG4",
        "FMT",
        "EPE",
        "MPD",
        "MES",
        "CD",
        "IOD",
    }
    with pytest.raises(ValueError, match="max_release_date"):
        CurationConfig(max_release_date="2021-13-01")
    with pytest.raises(ValueError, match="clash_fraction"):
        CurationConfig(clash_fraction=1.5)


def test_crystallization_aids_leave_crystal_structures_only(shared_data, structures, tmp_path):
    drug = read_mmcif(shared_data / "bonded" / "5h73.cif")  # DHODH + 7L7, FMN, ORO, 2 SO4, 4 ACT
    curated = curate(drug, AF3)
    removed = sorted(removal.residue.split()[0] for removal in curated.removals)
    assert removed == ["ACT"] * 4 + ["SO4"] * 2
    assert {removal.reason for removal in curated.removals} == {"crystallization_aid"}
    kept = {chain.sequence for chain in curated.structure.chains if not chain.is_polymer}
    assert kept == {"(7L7)", "(FMN)", "(ORO)"}
    assert curated.removed_counts() == {"crystallization_aid": 6}

    hepes = curate(read_mmcif(structures / "2q2k.cif"), AF3)  # HEPES (EPE) beside a protein-DNA complex
    assert [(removal.chain_id, removal.residue, removal.atoms) for removal in hepes.removals] == [("D", "EPE 1", 15)]
    assert _chain_ids(hepes.structure) == ["A", "B", "C"]

    nmr = read_mmcif(edited(structures / "2q2k.cif", tmp_path / "2q2k_nmr.cif", set_method("SOLUTION NMR")))
    assert not is_crystallography(nmr.method) and curate(nmr, AF3).removals == ()
    assert curate(read_mmcif(structures / "2q2k.cif"), dataclasses.replace(AF3, crystallization_aids=())).removals == ()


def test_resolution_and_release_date_leave_the_whole_target_out(structures):
    structure = read_mmcif(structures / "2q2k.cif")  # 3.0 A, released 2008-02-05
    assert structure.resolution == 3.0 and structure.release_date == "2008-02-05"
    assert curate(structure, AF3).exclusion is None
    worse = curate(structure, dataclasses.replace(AF3, max_resolution=2.5))
    assert worse.structure is None and worse.exclusion.reason == "resolution" and "3 A" in worse.exclusion.message
    for window in ({"max_release_date": "2007-12-31"}, {"min_release_date": "2008-02-06"}):
        late = curate(structure, dataclasses.replace(AF3, **window))
        assert late.structure is None and late.exclusion.reason == "release_date", window
    inside = dataclasses.replace(AF3, min_release_date="2008-02-05", max_release_date="2008-02-05")
    assert curate(structure, inside).exclusion is None
    predicted = read_mmcif(structures / "AF-P01112-F1-model_v4.cif.gz")  # no resolution, released 2021-07-01
    assert curate(predicted, dataclasses.replace(AF3, max_resolution=0.5)).exclusion is None
    assert curate(predicted, dataclasses.replace(AF3, max_release_date="2021-06-30")).exclusion.reason == "release_date"


def test_too_many_polymer_chains_leave_the_target_out(shared_data):
    structure = read_mmcif(shared_data / "templates" / "mmcif" / "5kc1.cif")  # 12 protein chains
    assert curate(structure, dataclasses.replace(AF3, max_polymer_chains=12)).exclusion is None
    assert curate(structure, dataclasses.replace(AF3, max_polymer_chains=11)).exclusion.reason == "polymer_chains"


def test_clashing_copy_of_a_chain_is_removed(structures, tmp_path):
    # H-Ras chain A copied 0.5 A away as chain C (with its MG and GNP): every atom of the copy
    # and of the original lies within 1.7 A of the other; equal fractions and atom counts, so
    # the later chain (the copy) goes, and only it.
    path = edited(
        structures / "721p-assembly1.cif", tmp_path / "721p_clash.cif", duplicate_chain("A", "C", (0.5, 0, 0))
    )
    structure = read_mmcif(path)
    assert "C" in _chain_ids(structure)
    curated = curate(structure, AF3)
    assert [(removal.reason, removal.chain_id) for removal in curated.removals] == [
        ("clash", "C"),
        ("clash", "C:MG167"),
        ("clash", "C:GNP168"),
    ]
    assert _chain_ids(curated.structure) == ["A", "A:MG167", "A:GNP168", "B", "B:MG167", "B:GNP168"]
    assert "100% of its atoms within 1.7 A of chain A" in curated.removals[0].detail
    # 1.0 turns the filter off; the unedited file has no clash
    assert curate(structure, dataclasses.replace(AF3, clash_fraction=1.0)).removals == ()
    assert curate(read_mmcif(structures / "721p-assembly1.cif"), AF3).removals == ()


def test_bonded_cap_and_glycans_are_not_clashes(structures, shared_data):
    # 7A4D's C-terminal NH2 cap is its own ligand chain, 1.3 A from chain E's last carbon; the
    # glycans of 1IGY are bonded to asparagines. Bonds are not clashes.
    capped = curate(read_mmcif(structures / "7a4d-assembly1.cif"), AF3)
    assert "E:NH242" in _chain_ids(capped.structure) and capped.removals == ()
    assert curate(read_mmcif(shared_data / "bonded" / "1igy.cif"), AF3).removals == ()
    # a calcium 1.6 A from a backbone oxygen (1NCB) is a clash: metals are never bonded that close
    calcium = curate(read_mmcif(shared_data / "bonded" / "1ncb.cif"), AF3)
    assert [(removal.reason, removal.chain_id) for removal in calcium.removals] == [("clash", "G")]


def test_protein_chain_with_a_ca_gap_is_removed(structures, tmp_path):
    path = edited(structures / "721p-assembly1.cif", tmp_path / "721p_gap.cif", move_residues("A", 100, (0, 0, 15.0)))
    curated = curate(read_mmcif(path), AF3)
    assert [(removal.reason, removal.chain_id) for removal in curated.removals] == [("ca_gap", "A")]
    assert "residue 100" in curated.removals[0].detail
    assert curate(read_mmcif(path), dataclasses.replace(AF3, max_ca_gap=20.0)).removals == ()


def test_unknown_and_barely_resolved_polymers_are_removed(structures, tmp_path):
    unknown = edited(structures / "7a4d-assembly1.cif", tmp_path / "7a4d_unk.cif", rename_residues("B", "UNK"))
    curated = curate(read_mmcif(unknown), AF3)
    assert [(removal.reason, removal.chain_id) for removal in curated.removals] == [("unknown_polymer", "B")]
    few = edited(structures / "7a4d-assembly1.cif", tmp_path / "7a4d_few.cif", keep_resolved("B", {5, 6, 7}))
    curated = curate(read_mmcif(few), AF3)
    assert [(removal.reason, removal.chain_id) for removal in curated.removals] == [("few_resolved_residues", "B")]
    assert curate(read_mmcif(few), dataclasses.replace(AF3, min_resolved_residues=3)).removals == ()


def test_chain_limit_keeps_the_nearest_chains_around_an_interface_token(shared_data):
    structure = read_mmcif(shared_data / "templates" / "mmcif" / "5kc1.cif")  # 63 chains, 11 of them aids
    curated = curate(structure, AF3)
    counts = curated.removed_counts()
    assert counts == {"crystallization_aid": 11, "chain_limit": 63 - 11 - 20}
    assert len(curated.structure.chains) == 20
    # the same seed and target draw the same chains
    assert _chain_ids(curate(structure, AF3).structure) == _chain_ids(curated.structure)
    # the kept chains are the 20 nearest (by token centre) to one interface token of the
    # structure without its aids: check against every interface token
    without_aids = curate(structure, dataclasses.replace(AF3, max_chains=1000)).structure
    centres, chain_of = token_centres(without_aids)
    first, second = close_pairs(centres, INTERFACE_TOKEN_DISTANCE, groups=chain_of, strict=True)
    nearest_sets = set()
    for token in np.unique(np.concatenate([first, second])):
        distance = np.full(len(without_aids.chains), np.inf)
        np.minimum.at(distance, chain_of, np.linalg.norm(centres - centres[token], axis=1))
        nearest_sets.add(frozenset(without_aids.chains[i].chain_id for i in np.argsort(distance, kind="stable")[:20]))
    assert frozenset(_chain_ids(curated.structure)) in nearest_sets
    draws = {tuple(_chain_ids(curate(structure, dataclasses.replace(AF3, seed=seed)).structure)) for seed in range(6)}
    assert all(frozenset(kept) in nearest_sets for kept in draws) and len(draws) > 1


def test_every_reason_is_described_and_sequence_only_targets_keep_their_chains(shared_data, tmp_path):
    fasta = tmp_path / "query.fasta"
    fasta.write_text(">A protein\nMTEYKLVVVGAGGVGKSALTIQLIQ\n>B protein\nXXXXXXXX\n")
    from featurecache.io.inputs import structure_from_fasta

    curated = curate(structure_from_fasta(fasta), AF3)
    # no coordinates: no resolved-residue, clash or gap filter; the all-unknown chain still goes
    assert _chain_ids(curated.structure) == ["A"]
    assert [removal.reason for removal in curated.removals] == ["unknown_polymer"]
    assert set(REASONS) >= {removal.reason for removal in curated.removals}
    only_unknown = tmp_path / "unknown.fasta"
    only_unknown.write_text(">A protein\nXXXXXXXX\n")
    assert curate(structure_from_fasta(only_unknown), AF3).exclusion.reason == "no_chains"
    # no release date: outside any release-date window
    undated = curate(structure_from_fasta(fasta), dataclasses.replace(AF3, max_release_date="2030-01-01"))
    assert undated.exclusion.reason == "release_date" and "unknown" in undated.exclusion.message


def test_close_pairs_match_brute_force():
    rng = np.random.default_rng(7)
    for count, cutoff in ((1, 1.7), (60, 1.7), (400, 5.0), (900, 3.3)):
        points = rng.uniform(0, 25, size=(count, 3))
        groups = rng.integers(0, 5, count)
        first, second = close_pairs(points, cutoff, groups)
        distance = np.linalg.norm(points[:, None] - points[None], axis=-1)
        upper_i, upper_j = np.triu_indices(count, 1)
        near = (distance[upper_i, upper_j] <= cutoff) & (groups[upper_i] != groups[upper_j])
        assert set(zip(first.tolist(), second.tolist())) == set(zip(upper_i[near].tolist(), upper_j[near].tolist()))
