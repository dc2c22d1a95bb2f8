"""UniProt-style pairing headers: over every header of the sample alignments that names a species,
AF3's and Protenix's own species readers get one code per featurecache species id, codes of
different species never coincide (nor with a real organism mnemonic), and featurecache reads the
same species back."""

from __future__ import annotations

import sys

import pytest

from featurecache.io.msa import read_msa
from featurecache.io.pairing_headers import MAX_CODED_TAXID, pairing_header, row_pairing_header, species_code
from featurecache.io.species import species_from_description, species_tag
from tests.peer_pairing import AF3_SOURCE

ALIGNMENTS = (
    "afdb/1a00_A/uniref90_hits.a3m",
    "afdb/1a00_A/bfd_uniclust_hits.a3m",
    "afdb/1a3p_A/uniref90_hits.a3m",
    "afdb/1a02_F/bfd_uniclust_hits.a3m",
    "openfold/uniref90_hits.sto",
    "openfold/2q2k_A/uniprot_hits.sto",
    "openfold/2q2k_A/uniref90_hits.sto",
)


def _readers():
    if str(AF3_SOURCE) not in sys.path:
        sys.path.insert(0, str(AF3_SOURCE))
    from alphafold3.data.msa_features import extract_species_ids
    from protenix.data.msa.msa_utils import MSAPairingEngine

    return extract_species_ids, MSAPairingEngine.get_species_ids


@pytest.fixture(scope="module")
def headers(shared_data):
    """(header, its species id as one MSA's rows resolve it) of every row naming a species."""
    found = []
    for name in ALIGNMENTS:
        msa = read_msa(shared_data / "alignments" / name)
        found += [
            (description, species) for description, species in zip(msa.descriptions[1:], msa.species[1:]) if species
        ]
    assert len(found) > 5000 and any(s.startswith("mnemonic:") for _, s in found)
    return found


def test_af3_and_protenix_read_one_code_per_species(headers):
    af3, protenix = _readers()
    written = [pairing_header(description, species, row) for row, (description, species) in enumerate(headers)]
    af3_codes, protenix_codes = af3(written), protenix(written)
    assert af3_codes == protenix_codes and all(af3_codes)
    code_of = {}
    for (_, species), code in zip(headers, af3_codes):
        assert code_of.setdefault(species, code) == code, species
    assert len(set(code_of.values())) == len(code_of)  # different species, different codes


def test_featurecache_reads_the_same_species_back(headers):
    for row, (description, species) in enumerate(headers):
        assert species_from_description(pairing_header(description, species, row)) == species


def test_taxid_codes_never_look_like_an_organism_mnemonic(headers):
    """UniProt's mnemonics start with a letter, or 9 for groups of species; taxid codes with 0-8."""
    mnemonics = {species_tag(description).mnemonic for description, _ in headers} - {""}
    assert mnemonics and all(m[0].isalpha() or m[0] == "9" for m in mnemonics)
    codes = [species_code(f"tax:{taxid}") for taxid in (1, 9606, 40151, 2478892, MAX_CODED_TAXID)]
    assert all(len(code) == 5 and code[0] in "012345678" for code in codes)
    assert len(set(codes)) == len(codes) and not set(codes) & mnemonics
    assert species_code(f"tax:{MAX_CODED_TAXID + 1}") == "" and species_code("") == ""


def test_row_codes_pair_each_row_with_itself_only():
    af3, protenix = _readers()
    written = [row_pairing_header(row, "UniRef90_X/1-9 n=1 TaxID=9606", "tax:9606") for row in range(1, 3000)]
    codes = af3(written)
    assert codes == protenix(written) and len(set(codes)) == len(codes)
    assert species_from_description(written[0]) == "tax:9606"  # featurecache keeps the row's own species
