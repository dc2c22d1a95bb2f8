"""Species from MSA headers: one test per header layout on real headers from the sample data, one
id per organism across layouts (where a real mapping links them), and a heterodimer whose two
MSAs use different layouts pairing many rows."""

import re
from pathlib import Path

import numpy as np
import pytest

from featurecache import schema
from featurecache.config import FeatureConfig
from featurecache.features.msa import build_msa_features, expand_msa
from featurecache.features.tokenize import tokenize
from featurecache.io.msa import parse_a3m, parse_stockholm, read_msa
from featurecache.io.species import (
    HEADER_FORMATS,
    KNOWN_MNEMONICS,
    SpeciesResolver,
    SpeciesTag,
    species_from_description,
    species_tag,
)
from featurecache.io.structure import structure_from_sequences

AFDB = "alignments/afdb"
HEADER_DATA = Path(__file__).resolve().parents[1] / "data" / "msa_headers"
PROTENIX_SCORES = "\t123\t0.45\t1.2E-30\t0\t100\t101\t1\t100\t110"


@pytest.mark.parametrize("header_format", HEADER_FORMATS, ids=lambda f: f.name.split(" (")[0])
def test_every_layout_reads_its_own_example(header_format):
    assert species_tag(header_format.example) != SpeciesTag()


@pytest.mark.parametrize(
    ("header", "species"),
    [
        # UniProtKB FASTA (hhblits on BFD / UniClust): OX= is the organism; older headers lack it.
        (
            "tr|A0A2A6NXF8|A0A2A6NXF8_9BRAD Uncharacterized protein OS=Bradyrhizobium sp. C9 OX=142585 "
            "GN=CO675_03465 PE=4 SV=1",
            "tax:142585",
        ),
        ("tr|A0A1K0GGD5|A0A1K0GGD5_RAT Globin d1 OS=Rattus norvegicus GN=Glnd1 PE=3 SV=1", "tax:10116"),
        (
            "tr|A0A0F8AH84|A0A0F8AH84_LARCR Ig mu chain C region membrane-bound form OS=Larimichthys crocea "
            "GN=EH28_05626 PE=4 SV=1",
            "mnemonic:LARCR",
        ),
        (
            "tr|A0A0Q9XW80|A0A0Q9XW80_9STAP Uncharacterized protein OS=Staphylococcus sp. NAM3COL9 GN=x PE=4 SV=1",
            "mnemonic:9STAP",
        ),
        ("sp|P01112|RASH_HUMAN GTPase HRas", "tax:9606"),
        # OpenFold / AF2 jackhmmer Stockholm: names with a range, DE text after them.
        (
            "tr|A0A0K0ME10|A0A0K0ME10_9STAP/1-51 [subseq from] Plasmid segregation protein ParR OS=Staphylococcus "
            "schleiferi OX=1295 GN=NP71_p00120 PE=4 SV=1",
            "tax:1295",
        ),
        ("tr|Q9XXX1|Q9XXX1_MOUSE/2-8", "tax:10090"),
        # AF3 JSON MSAs (A3M text inside the JSON): UniProt names, small BFD's '_<n>' suffix.
        ("tr|A0A146SKV9|A0A146SKV9_FUNHE_1/3-99", "mnemonic:FUNHE"),
        ("sp|P0C2L1|A3X1_LOXLA", "mnemonic:LOXLA"),
        # UniRef (jackhmmer on UniRef90, hhblits on UniRef30): one member -> its taxid; a cluster ->
        # its representative's organism (the TaxID is the members' common ancestor).
        (
            "UniRef90_D7BIZ4/1-73 [subseq from] Uncharacterized protein n=1 Tax=Meiothermus silvanus (strain ATCC "
            "700542 / DSM 9946 / VI-R2) TaxID=526227 RepID=D7BIZ4_MEISD",
            "tax:526227",
        ),
        (
            "UniRef90_UPI000A061283/1-51 [subseq from] plasmid segregation protein ParR n=1 Tax=Mammaliicoccus "
            "sciuri TaxID=1296 RepID=UPI000A061283",
            "tax:1296",
        ),
        (
            "UniRef90_A0A087WY62/113-146 [subseq from] Neuroblastoma breakpoint family member 26 n=3 Tax=Homo "
            "sapiens TaxID=9606 RepID=A0A087WY62_HUMAN",
            "tax:9606",
        ),
        (
            "UniRef90_A0A141BHY3/1-51 [subseq from] DNA-binding protein n=37 Tax=Staphylococcaceae TaxID=90964 "
            "RepID=A0A141BHY3_STAXY",
            "mnemonic:STAXY",
        ),
        (
            "UniRef90_UPI0009DA3672/5-71 [subseq from] hypothetical protein n=2 Tax=Verrucomicrobia TaxID=74201 "
            "RepID=UPI0009DA3672",
            "",
        ),
        (
            "UniRef100_C1BLX7 Hemoglobin subunit alpha-D n=1 Tax=Osmerus mordax TaxID=8014 RepID=C1BLX7_OSMMO",
            "tax:8014",
        ),
        # Protenix (ColabFold search + taxonomy): UniRef100_<accession>_<taxid>.
        ("UniRef100_A0A0B4J2F2_9606/1-100", "tax:9606"),
        ("UniRef100_UPI0008FD4ACD_1287720", "tax:1287720"),
        # ColabFold / MMseqs2 and metagenomic sources carry no organism.
        ("A0A8C9R134\t213\t0.963\t1.414E-59\t0\t165\t166\t14\t179\t203", ""),
        ("ERR1711976_37436\t183\t0.746\t2.938E-49", ""),
        ("UniRef100_A0A6I8Q5C6", ""),
        ("MGYP000048211747/1-51 [subseq from] PL=00 UP=0 BIOMES=0000000011000", ""),
        ("SRR6202048_823629 ", ""),
        ("GraSoiStandDraft_57_1057295.scaffolds.fasta_scaffold4480651_1 # 3 # 239 # 1 # ID=4480651_1;partial=11", ""),
        # A custom pipeline's header with a UniProt-style field.
        ("seq17 OX=9606", "tax:9606"),
    ],
)
def test_species_from_real_headers(header, species):
    assert species_from_description(header) == species


def test_file_formats_end_to_end(shared_data):
    """Each tool's real file: the species its rows carry."""
    openfold = shared_data / "alignments" / "openfold"
    uniprot = read_msa(openfold / "2q2k_A" / "uniprot_hits.sto")  # jackhmmer on UniProt (AF-Multimer)
    assert uniprot.species[0] == "" and uniprot.species[1] == "tax:1295"
    assert all(uniprot.species[1:])
    uniref = read_msa(openfold / "uniref90_hits.sto")  # jackhmmer on UniRef90
    assert uniref.species[1] == "tax:526227"
    colabfold = read_msa(shared_data / "alignments" / "pdb" / "721p-assembly1A_protein.a3m")
    assert not any(colabfold.species)  # accession and scores only: nothing to pair on
    mgnify = read_msa(openfold / "2q2k_A" / "mgnify_hits.sto")
    assert not any(mgnify.species)


def _uniprot_pairs(shared_data):
    """(mnemonic, taxid) pairs that real UniProtKB headers with OX= state, over all sample MSAs."""
    pairs: dict[str, set[str]] = {}
    for path in sorted((shared_data / "alignments").rglob("*")):
        if path.suffix not in (".a3m", ".sto"):
            continue
        for description in read_msa(path).descriptions[1:]:
            if re.match(r"(?:sp|tr)\|", description):
                tag = species_tag(description)
                if tag.taxid and tag.mnemonic:
                    pairs.setdefault(tag.mnemonic, set()).add(tag.taxid)
    return pairs


def test_known_mnemonics_agree_with_real_uniprot_headers(shared_data):
    pairs = _uniprot_pairs(shared_data)
    for mnemonic, taxid in KNOWN_MNEMONICS.items():
        assert pairs.get(mnemonic) == {taxid}, mnemonic
    assert len(pairs["9TELE"]) > 1  # virtual codes name groups: never mapped


def test_one_organism_one_id_across_layouts():
    human_protenix = species_tag("UniRef100_P01133_9606/1-45")
    human_uniprot = species_tag("tr|G3V289|G3V289_HUMAN Proto-oncogene c-Fos OS=Homo sapiens GN=FOS PE=1 SV=1")
    guppy_old = species_tag("tr|A0A087XXX0|A0A087XXX0_POEFO Uncharacterized protein OS=Poecilia formosa PE=4 SV=1")
    guppy_new = species_tag("tr|A0A087YAB1|A0A087YAB1_POEFO Globin OS=Poecilia formosa OX=48698 GN=x PE=3 SV=1")
    guppy_protenix = species_tag("UniRef100_A0A087YAB1_48698")
    fish_a = species_tag("tr|A0A3B3QXX1|A0A3B3QXX1_9TELE Uncharacterized OS=Paramormyrops kingsleyae OX=1676925")
    fish_b = species_tag("tr|A0A3P8XX12|A0A3P8XX12_9TELE Uncharacterized OS=Esox lucius OX=8010")
    fish_no_taxid = species_tag("tr|A0A3Q2XX99|A0A3Q2XX99_9TELE Uncharacterized protein")

    alone = SpeciesResolver([[guppy_old], [guppy_protenix]])
    assert alone.key(guppy_old) == "mnemonic:POEFO"  # no real mapping known: keyed by its own form
    resolver = SpeciesResolver([[human_uniprot, guppy_old, fish_a, fish_b, fish_no_taxid], [guppy_new, human_protenix]])
    assert resolver.key(human_uniprot) == resolver.key(human_protenix) == "tax:9606"
    # The target's own headers state POEFO = 48698, so the old header pairs with the Protenix one.
    assert resolver.key(guppy_old) == resolver.key(guppy_protenix) == "tax:48698"
    assert resolver.key(fish_no_taxid) == "mnemonic:9TELE"  # 9TELE is seen with two taxids: not mapped
    assert resolver.key(fish_a) != resolver.key(fish_b)


def _protenix_layout(msa_text: str) -> str:
    """A jackhmmer UniRef90 A3M rewritten as Protenix writes its MSAs (tests/data/msa_headers/protenix.txt):
    UniRef100_<acc>_<taxid>/<TAB>scores where a sequence's organism is known (one-member clusters), the accession alone otherwise."""
    lines = []
    for line in msa_text.splitlines():
        match = re.match(r">UniRef90_(\S+?)(/\d+-\d+)? .*?\bn=(\d+)\b.*?\bTaxID=(\d+)", line)
        if match:
            accession, span, members, taxid = match.groups()
            # As Protenix's server writes them: name, a bare '/', then tab-separated ColabFold scores.
            line = f">UniRef100_{accession}" + (f"_{taxid}/" if members == "1" else "") + PROTENIX_SCORES
        lines.append(line)
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    ("first_file", "paired_by_mnemonic"),
    [("bfd_uniclust_hits.a3m", 0), ("uniref90_hits.a3m", 1)],
    ids=["uniprot-fasta", "uniref90"],
)
def test_heterodimer_pairs_rows_across_header_layouts(shared_data, first_file, paired_by_mnemonic):
    """Hemoglobin alpha (1a00 A) with its hhblits BFD/UniClust MSA (UniProt headers, with or
    without OX=) or its jackhmmer UniRef90 MSA, and EGF (1a3p A) with a UniRef90 MSA in
    Protenix's layout: rows pair across layouts."""
    first = read_msa(shared_data / AFDB / "1a00_A" / first_file)
    text = (shared_data / AFDB / "1a3p_A" / "uniref90_hits.a3m").read_text()
    second = parse_a3m(_protenix_layout(text), "1a3p_A_protenix.a3m")
    assert second.descriptions[1].startswith("UniRef100_") and any(second.species)
    structure = structure_from_sequences(
        "heterodimer", [("A", "protein", first.query.replace("-", "")), ("B", "protein", second.query.replace("-", ""))]
    )
    tokens = tokenize(structure)
    warnings: list[str] = []
    features = build_msa_features(structure, tokens, {"A": first, "B": second}, FeatureConfig(), warnings)
    assert warnings == []
    paired = int(features["msa_is_paired"].sum()) - 1  # the query row counts as paired
    resolver = SpeciesResolver([first.species_tags, second.species_tags])
    first_keys, second_keys = (
        set(resolver.keys(first.species_tags)) - {""},
        set(resolver.keys(second.species_tags)) - {""},
    )
    # Every shared species pairs, with as many rows as the chain with fewer rows of it has (AF3).
    paired_species = np.unique(features["msa_species"][1 : paired + 1])
    assert len(paired_species) == len(first_keys & second_keys) > 50
    assert paired >= len(paired_species)
    # Species that pair only because a mnemonic maps to a taxid: macaque rows of UniRef90 clusters
    # carry only their representative's entry name (RepID=..._MACMU).
    by_taxid = {resolver.key(tag) for tag in first.species_tags if tag.taxid} & second_keys
    assert len(paired_species) - len(by_taxid) == paired_by_mnemonic
    # Each paired row holds, per chain, a real row of that chain's MSA (no gap-only halves).
    a, b = (tokens.arrays["asym_id"] == k for k in (1, 2))
    rows, _ = expand_msa({**features, **tokens.arrays}, np.arange(1, paired + 1))
    assert (rows[:, a] != schema.GAP).any(axis=1).all() and (rows[:, b] != schema.GAP).any(axis=1).all()


# --- real header lines, as each tool writes them (tests/data/msa_headers/<source>.txt) ----------

# Expected species per file, one per header line in file order.
REAL_HEADER_SPECIES = {
    "jackhmmer_uniref90.txt": ["tax:526227", "tax:2219696", "tax:1797188", "tax:47281", "tax:47281", "tax:47281"],
    "uniprot.txt": [
        "tax:1295",
        "tax:1280",
        "tax:1282",
        "tax:9913",
        "mnemonic:DROWI",
        "tax:284812",
        "tax:10090",
        "tax:9606",
    ],
    "hhblits.txt": ["tax:142585", "tax:1797188", "", "tax:240159", "tax:9880"],
    # ColabFold's headers name only an accession: it pairs on its server, not by species.
    "colabfold_mmseqs2.txt": ["", "", "", "", ""],
    "protenix.txt": ["tax:9606", "tax:9606", "tax:2562661"],
}


def _header_lines(name: str) -> list[str]:
    text = (HEADER_DATA / name).read_text()
    return [line for line in text.split("\n") if line and not line.startswith("# ")]


def _msa_of_headers(lines: list[str], source: str):
    """The lines' MSA, read by the parser the tool's output goes through: A3M records ('>') or
    Stockholm '#=GS <name> DE <text>' lines, each given a one-residue row."""
    if lines[0].startswith("#=GS"):
        names = [line.split()[1] for line in lines]
        text = "# STOCKHOLM 1.0\n" + "".join(line + "\n" for line in lines)
        text += "query A\n" + "".join(f"{name} A\n" for name in names) + "//\n"
        return parse_stockholm(text, source + ".sto")
    return parse_a3m(">query\nA\n" + "".join(f"{line}\nA\n" for line in lines), source + ".a3m")


@pytest.mark.parametrize("name", sorted(REAL_HEADER_SPECIES))
def test_real_header_lines_of_each_source(name):
    """Every kept line is read, through the MSA parser, to the species its tool wrote into it."""
    lines = _header_lines(name)
    stockholm = [line for line in lines if line.startswith("#=GS")]
    a3m = [line for line in lines if line.startswith(">")]
    assert lines == stockholm + a3m  # each file keeps its Stockholm lines first
    species = []
    for group in (stockholm, a3m):
        if group:
            species += _msa_of_headers(group, name).species[1:]
    assert species == REAL_HEADER_SPECIES[name]


def test_protenix_example_msas_pair_across_chains():
    """Protenix's own example MSAs (chain_a.a3m, chain_b.a3m: each a query, one UniRef100 row of
    taxid 9606 named '>UniRef100_<acc>_9606/' and an environmental row) pair their 9606 rows
    through the feature builder's pairing."""
    chain_a = parse_a3m(
        ">query\nACDEFGHIK\n>UniRef100_CHAINA_9606/\nACDEFGHIK\n>environmental_hit_a\nACD-FGHIK\n", "chain_a.a3m"
    )
    chain_b = parse_a3m(
        ">query\nLMNPQRSTV\n>UniRef100_CHAINB_9606/\nLMNPQRSTV\n>environmental_hit_b\nLMN-QRSTV\n", "chain_b.a3m"
    )
    assert [line[1:] for line in _header_lines("protenix.txt")[:2]] == [
        chain_a.descriptions[1],
        chain_b.descriptions[1],
    ]
    structure = structure_from_sequences(
        "protenix_example", [("A", "protein", "ACDEFGHIK"), ("B", "protein", "LMNPQRSTV")]
    )
    tokens = tokenize(structure)
    warnings: list[str] = []
    features = build_msa_features(structure, tokens, {"A": chain_a, "B": chain_b}, FeatureConfig(), warnings)
    assert int(features["msa_is_paired"].sum()) == 2  # the query and the 9606 pair
