import numpy as np
import pytest
import torch

from featurecache.config import FeatureConfig
from featurecache import schema
from featurecache.features.msa import build_msa_features, expand_msa
from featurecache.features.tokenize import tokenize
from featurecache.io.alignments import AlignmentIndex
from featurecache.io.mmcif import read_mmcif
from featurecache.io.structure import structure_from_sequences
from featurecache.io.msa import parse_a3m
from featurecache.testing.compare import summation_tolerance

P = {letter: index for index, letter in enumerate(schema.PROTEIN_LETTERS)}


def _features(structure, chain_msas, **config):
    """The stored MSA arrays plus the dense msa / deletion_matrix of all rows (expand_msa)."""
    warnings: list[str] = []
    tokens = tokenize(structure)
    features = build_msa_features(structure, tokens, chain_msas, FeatureConfig(**config), warnings)
    stored = {spec.name for spec in schema.MSA_STORAGE} | {
        "msa_species",
        "msa_is_paired",
        "msa_profile",
        "deletion_mean",
    }
    assert set(features) == stored
    features["msa"], features["deletion_matrix"] = expand_msa({**features, "restype": tokens.arrays["restype"]})
    return tokens, features, warnings


def _row(features, row, columns):
    return "".join(schema.PROTEIN_LETTERS[c] if c < 20 else "-" for c in features["msa"][row, columns])


@pytest.fixture
def heteromer():
    structure = structure_from_sequences(
        "het", [("A", "protein", "ACDE"), ("B", "protein", "FGHIK"), ("C", "protein", "ACDE")]
    )
    msa_a = parse_a3m(
        ">q\nACDE\n>a1 OX=1\nACDD\n>a2 OX=2\nAC-E\n>a3 OX=1\nWCDE\n>a4 nospecies\nACDW\n>dup\nACDE\n", "a.a3m"
    )
    msa_b = parse_a3m(">q\nFGHIK\n>b1 OX=3\nFGHIW\n>b2 OX=1\nFGHWW\n>b3 OX=2\nFGWWk\nK\n", "b.a3m")
    return structure, {"A": msa_a, "B": msa_b}


def test_species_pairing_block_diagonal_and_homomer_sharing(heteromer):
    structure, msas = heteromer
    tokens, features, warnings = _features(structure, msas)
    assert warnings == []
    a, b, c = (np.flatnonzero(tokens.arrays["asym_id"] == k) for k in (1, 2, 3))
    # Query row, then species 1 and 2 (in both entities), each with the best-ranked row per entity.
    assert _row(features, 0, a) + _row(features, 0, b) == "ACDEFGHIK"
    assert (_row(features, 1, a), _row(features, 1, b)) == ("ACDD", "FGHWW"[:5])
    assert (_row(features, 2, a), _row(features, 2, b)) == ("AC-E", "FGWWK")
    assert features["msa_is_paired"].tolist()[:3] == [True, True, True]
    assert not features["msa_is_paired"][3:].any()
    species = features["msa_species"]
    assert species[0] == 0 and species[1] != species[2] and species[1] > 0
    # Chain C is a copy of A: it shares A's rows in every row.
    np.testing.assert_array_equal(features["msa"][:, a], features["msa"][:, c])
    # Unpaired rows: A's a3 and a4 (a1, a2 already paired, dup equals the query), then B's b1.
    unpaired = [(_row(features, r, a), _row(features, r, b)) for r in range(3, features["msa"].shape[0])]
    assert unpaired == [("WCDE", "-----"), ("ACDW", "-----"), ("----", "FGHIW")]
    # The deletion before the last column of b3 (lower-case k) travels with the paired row.
    assert features["deletion_matrix"][2, b].tolist() == [0, 0, 0, 0, 1]


def test_row_caps(heteromer):
    structure, msas = heteromer
    _, features, _ = _features(structure, msas, msa_rows_stored=4, max_paired_rows=2)
    assert features["msa"].shape[0] == 4
    assert features["msa_is_paired"].tolist() == [True, True, False, False]


def test_chain_without_msa_gets_query_row_and_warning(heteromer):
    structure, msas = heteromer
    tokens, features, warnings = _features(structure, {"A": msas["A"]})
    assert any("chain B: no alignment" in warning for warning in warnings)
    b = np.flatnonzero(tokens.arrays["asym_id"] == 2)
    assert _row(features, 0, b) == "FGHIK"
    assert (features["msa"][1:, b] == schema.GAP).all()
    assert not features["msa_is_paired"][1:].any()  # nothing to pair with


def test_mismatched_msa_query_is_a_warning_not_a_crash(heteromer):
    structure, msas = heteromer
    _, features, warnings = _features(structure, {"A": msas["B"]})
    assert any("does not match the chain sequence" in warning for warning in warnings)
    assert features["msa"].shape[0] == 1


def test_721p_homodimer_ligands_are_gaps(shared_data):
    structure = read_mmcif(shared_data / "structures" / "721p-assembly1.cif")
    found, _ = AlignmentIndex(shared_data / "alignments" / "pdb").for_structure(structure)
    tokens, features, warnings = _features(structure, {c: found[c].msa for c in found}, msa_rows_stored=512)
    assert warnings == []
    msa = features["msa"]
    assert msa.shape == (512, tokens.num_tokens)
    np.testing.assert_array_equal(msa[0], tokens.arrays["restype"])
    ligand = tokens.arrays["is_ligand"]
    assert (msa[1:, ligand] == schema.GAP).all()
    a, b = tokens.arrays["asym_id"] == 1, tokens.arrays["asym_id"] == 4
    np.testing.assert_array_equal(msa[:, a], msa[:, b])
    assert not features["msa_is_paired"][1:].any()  # one entity: no pairing
    # No duplicate rows survive.
    assert len({row.tobytes() for row in msa}) == msa.shape[0]
    assert features["deletion_matrix"].dtype == np.uint8 and features["deletion_matrix"].max() > 0


def test_profile_and_deletion_mean(heteromer):
    structure, msas = heteromer
    _, features, _ = _features(structure, msas)
    profile = features["msa_profile"]
    # numpy adds the 32 float32 classes in an order that depends on the CPU's vector width
    np.testing.assert_allclose(profile.sum(axis=1), 1.0, rtol=summation_tolerance(torch.float32, schema.NUM_RESTYPES))
    # each value is an exact count ratio rounded once to float32 (half an ulp)
    expected = np.stack([(features["msa"] == k).mean(axis=0) for k in range(schema.NUM_RESTYPES)], axis=1)
    np.testing.assert_allclose(profile, expected, rtol=1e-6)
    np.testing.assert_allclose(features["deletion_mean"], features["deletion_matrix"].mean(axis=0), rtol=1e-6)


def test_rows_are_stored_once_per_entity(shared_data):
    """721p: two copies of one chain; each stored row once, in the chain's residue columns, each
    assembled row shows one stored row; deletions sparse; the profile equals the dense one exactly."""
    structure = read_mmcif(shared_data / "structures" / "721p-assembly1.cif")
    found, _ = AlignmentIndex(shared_data / "alignments" / "pdb").for_structure(structure)
    tokens, features, _ = _features(structure, {c: found[c].msa for c in found}, msa_rows_stored=300)
    chain_length = len(structure.chains[0].sequence)
    assert features["msa_block"].shape == (299, chain_length)  # every row but the query, once
    assert features["msa_row_source"].shape == (300, 1)
    assert features["msa_row_source"][0, 0] == -1 and sorted(features["msa_row_source"][1:, 0]) == list(range(299))
    polymer = ~tokens.arrays["is_ligand"]
    assert (features["msa_token_entity"][polymer] == 0).all() and (features["msa_token_entity"][~polymer] == -1).all()
    counts = features["msa_block_deletion_count"]
    assert (
        counts.sum() == features["msa_block_deletion_value"].size > 0
        and (features["msa_block_deletion_value"] > 0).all()
    )
    msa = features["msa"]
    expected = np.stack([(msa == k).mean(axis=0, dtype=np.float64) for k in range(schema.NUM_RESTYPES)], axis=1)
    np.testing.assert_array_equal(features["msa_profile"], expected.astype(np.float32))
    rows = np.array([0, 7, 150, 299])
    partial = expand_msa({**features, "restype": tokens.arrays["restype"]}, rows)
    np.testing.assert_array_equal(partial[0], msa[rows])
    np.testing.assert_array_equal(partial[1], features["deletion_matrix"][rows])


def test_pairing_keeps_several_rows_per_shared_species(shared_data):
    """A heterodimer of two real chains with their UniRef90 MSAs (UniRef headers carry species):
    every species in both gets as many paired rows as the chain with fewer rows of it has, each
    chain's rows of the species taken most similar to its query first (AF-Multimer / AF3 2.3)."""
    from collections import Counter

    from featurecache.io.msa import read_msa
    from featurecache.io.species import SpeciesResolver

    folder = shared_data / "alignments" / "afdb"
    msas = {chain: read_msa(folder / name / "uniref90_hits.a3m") for chain, name in (("A", "1a00_A"), ("B", "1a02_F"))}
    sequences = [(chain, "protein", msa.query.replace("-", "")) for chain, msa in msas.items()]
    tokens, features, warnings = _features(structure_from_sequences("het", sequences), msas)
    assert warnings == []
    resolver = SpeciesResolver(msa.species_tags for msa in msas.values())
    keys = {chain: resolver.keys(msa.species_tags) for chain, msa in msas.items()}
    counts = {chain: Counter(key for key in chain_keys[1:] if key) for chain, chain_keys in keys.items()}
    shared = set(counts["A"]) & set(counts["B"])
    expected = {species: min(counts["A"][species], counts["B"][species]) for species in shared}
    paired = features["msa_is_paired"]
    assert paired[0] and paired[: 1 + sum(expected.values())].all() and not paired[1 + sum(expected.values()) :].any()
    # species ids are numbered per record: map them back through the paired rows' content
    rows_per_species = Counter(features["msa_species"][1:][paired[1:]].tolist())
    assert sorted(rows_per_species.values()) == sorted(expected.values())
    assert max(rows_per_species.values()) > 1 and sum(1 for n in rows_per_species.values() if n > 1) > 50
    # a species' paired rows in chain A's columns are its rows in A's MSA most similar to the query
    from featurecache.features.msa import _LETTER_TABLES

    raw = msas["A"].aligned
    raw_a = _LETTER_TABLES["protein"][raw[:, raw[0] != ord("-")]]  # A's MSA as classes on the chain
    raw_identity = (raw_a == raw_a[0]).mean(axis=1)
    msa_a = features["msa"][:, np.flatnonzero(tokens.arrays["asym_id"] == 1)]
    np.testing.assert_array_equal(msa_a[0], raw_a[0])
    checked = 0
    for species_id in [s for s, n in rows_per_species.items() if n > 1][:20]:
        rows = np.flatnonzero((features["msa_species"] == species_id) & paired)
        # the species' name: the one every paired row's content has in A's MSA
        names = set.intersection(
            *({keys["A"][r] for r in np.flatnonzero((raw_a == msa_a[row]).all(axis=1))} for row in rows)
        )
        (name,) = names
        of_species = [r for r, key in enumerate(keys["A"]) if key == name and r > 0]
        best = np.sort(raw_identity[of_species])[::-1][: rows.size]
        np.testing.assert_allclose(np.sort((msa_a[rows] == msa_a[0]).mean(axis=1))[::-1], best)
        checked += 1
    assert checked == 20
    # one row per species (the old pairing) would have given fewer
    assert sum(expected.values()) > 2 * len(shared) > 400


def test_drawn_rows_read_from_row_frames_equal_the_dense_rows(shared_data):
    """The heterodimer of two real UniRef90 MSAs (paired and unpaired rows, deletions) stored as a
    record: rows drawn as the loader draws them, read from the record's row frames, equal those
    rows of the dense MSA."""
    from featurecache.features.crop import msa_sample_rows
    from featurecache.io.msa import read_msa
    from featurecache.store.codec import RowFrames, decode_record, encode_record

    folder = shared_data / "alignments" / "afdb"
    msas = {chain: read_msa(folder / name / "uniref90_hits.a3m") for chain, name in (("A", "1a00_A"), ("B", "1a02_F"))}
    sequences = [(chain, "protein", msa.query.replace("-", "")) for chain, msa in msas.items()]
    structure = structure_from_sequences("het", sequences + [("C", "protein", sequences[0][2])])
    tokens, features, _ = _features(structure, msas)
    stored = {name: value for name, value in features.items() if name not in schema.DENSE_MSA}
    record = decode_record(encode_record("het", stored, {}, "", "", schema.SCHEMA_VERSION), lazy_rows=True)
    assert isinstance(record.arrays["msa_block"], RowFrames)
    lazy = {**record.arrays, "restype": tokens.arrays["restype"]}
    for seed in range(3):
        rows = msa_sample_rows(features["msa"].shape[0], 200, np.random.default_rng(seed))
        msa, deletions = expand_msa(lazy, rows)
        np.testing.assert_array_equal(msa, features["msa"][rows])
        np.testing.assert_array_equal(deletions, features["deletion_matrix"][rows])
        assert features["msa_is_paired"][rows[1:]].any() and (deletions > 0).any()
    a, c = tokens.arrays["asym_id"] == 1, tokens.arrays["asym_id"] == 3  # chains A and C: one entity
    np.testing.assert_array_equal(features["msa"][:, a], features["msa"][:, c])
