"""The MSA files `featurecache search` writes for other predictors, read by their own code: AF3's
and Protenix's pairing pair exactly the rows featurecache pairs, on targets of two and three
chains from the sample alignments (hemoglobin alpha, EGF, and a bZIP chain: UniRef90 headers,
which neither tool reads by itself); Boltz's keys pair the same rows; a chain without species
rows still gets its pairing.a3m."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from featurecache.config import FeatureConfig
from featurecache.features.featurize import featurize_target
from featurecache.features.msa import expand_msa
from featurecache.io.msa import Msa, parse_a3m, read_msa
from featurecache.io.structure import structure_from_sequences
from featurecache.precompute.search_outputs import pairing_a3m, target_pairing
from tests.peer_pairing import af3_paired_rows, protenix_paired_rows

_LETTERS = np.frombuffer(b"ARNDCQEGHILKMFPSTWYVX" + b"AGCUN" + b"AGCTN" + b"-", dtype=np.uint8)


def _uniref90(shared_data, name: str) -> Msa:
    return read_msa(shared_data / "alignments" / "afdb" / name / "uniref90_hits.a3m")


def featurecache_paired_rows(msas: list[Msa]) -> list[tuple[str, ...]]:
    """The rows precompute pairs for a target of these chains (the record's paired rows, query
    left out), each as one aligned row per chain."""
    structure = structure_from_sequences("target", [(chr(65 + n), "protein", msa.query) for n, msa in enumerate(msas)])
    arrays, _ = featurize_target(structure, {chr(65 + n): msa for n, msa in enumerate(msas)}, {}, FeatureConfig())
    rows, _ = expand_msa(arrays)
    ends = np.cumsum([0] + [msa.length for msa in msas])
    letters = _LETTERS[rows]
    return [
        tuple(letters[row, start:end].tobytes().decode() for start, end in zip(ends[:-1], ends[1:]))
        for row in np.flatnonzero(arrays["msa_is_paired"])[1:]
    ]


@pytest.mark.parametrize("names", [("1a00_A", "1a3p_A"), ("1a00_A", "1a02_F", "1a3p_A")])
def test_af3_and_protenix_pair_the_rows_featurecache_pairs(shared_data, names):
    msas = [_uniref90(shared_data, name) for name in names]
    expected = Counter(featurecache_paired_rows(msas))
    assert sum(expected.values()) > 500
    a3m, _ = target_pairing(dict(enumerate(msas)), FeatureConfig().max_paired_rows - 1)
    texts = [a3m[index] for index in range(len(msas))]
    assert Counter(af3_paired_rows(texts)) == expected
    assert Counter(protenix_paired_rows(texts)) == expected


def test_boltz_keys_pair_the_rows_featurecache_pairs(shared_data):
    msas = [_uniref90(shared_data, name) for name in ("1a00_A", "1a3p_A")]
    expected = Counter(featurecache_paired_rows(msas))
    _, csvs = target_pairing(dict(enumerate(msas)), FeatureConfig().max_paired_rows - 1)
    keyed = []
    for index, msa in enumerate(msas):
        lines = csvs[index].splitlines()
        assert lines[0] == "key,sequence" and len(lines) == msa.depth + 1  # every row, the query first
        keys = [int(line.split(",")[0]) for line in lines[1:]]
        assert keys[0] == -1
        keyed.append({key: row for row, key in enumerate(keys) if key != -1})
    assert keyed[0].keys() == keyed[1].keys()  # Boltz pairs rows of equal keys
    pairs = Counter()
    for key in keyed[0]:
        pairs[tuple(_class_row(msa, keyed[place][key]) for place, msa in enumerate(msas))] += 1
    assert pairs == expected


def _class_row(msa: Msa, row: int) -> str:
    """A row as featurecache's residue classes read it (non-standard letters as X)."""
    return "".join(letter if letter in "ACDEFGHIKLMNPQRSTVWY-" else "X" for letter in msa.sequences[row])


def test_pairing_a3m_rows_keep_their_species_for_every_reader(shared_data):
    """The per-sequence pairing.a3m: every row whose header names a species, under a header AF3 and
    Protenix read a species code from, one code per featurecache species (and featurecache reads
    the same species back)."""
    import sys

    from tests.peer_pairing import AF3_SOURCE

    sys.path.insert(0, str(AF3_SOURCE))
    from alphafold3.data.msa_features import extract_species_ids
    from protenix.data.msa.msa_utils import MSAPairingEngine

    for name in ("1a00_A", "1a3p_A"):
        msa = _uniref90(shared_data, name)
        written = parse_a3m(pairing_a3m(msa), name)
        species_rows = [row for row in range(1, msa.depth) if msa.species[row]]
        assert written.depth == len(species_rows) + 1 and written.query == msa.query
        # featurecache reads the same species back from the rewritten headers
        assert Counter(written.species[1:]) == Counter(msa.species[row] for row in species_rows)
        af3 = extract_species_ids(written.descriptions[1:])
        protenix = MSAPairingEngine.get_species_ids(written.descriptions[1:])
        assert af3 == protenix and all(af3)
        code_of = {}
        for code, species in zip(af3, written.species[1:]):
            assert code_of.setdefault(species, code) == code
        assert len(set(code_of.values())) == len(code_of)  # one code per species, no two share one


def test_pairing_a3m_without_species_rows_is_the_query_alone(shared_data):
    """721p's ColabFold-style MSA names no species: the file is still written (Protenix opens every
    pairedMsaPath it is given), holding the query."""
    msa = read_msa(shared_data / "alignments" / "pdb" / "721p-assembly1A_protein.a3m")
    assert msa.depth > 100 and not any(msa.species)
    text = pairing_a3m(msa)
    assert text == f">{msa.descriptions[0]}\n{msa.query}\n"
