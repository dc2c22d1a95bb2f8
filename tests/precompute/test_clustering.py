"""Chain and interface clusters with the real MMseqs2 (easy-cluster), on sequences from
../shared/data: identical and near-identical chains share a cluster, unrelated ones do not."""

from __future__ import annotations

import gzip

import pytest

from featurecache.config import ClusteringConfig
from featurecache.io.mmcif import read_mmcif
from featurecache.precompute.clustering import TargetChains, chain_kind, cluster_chains, interface_cluster
from featurecache.precompute.contacts import StructureAtoms, interface_pairs
from featurecache.precompute.tools import MmseqsCluster, ToolNotFoundError, ToolSettings

pytestmark = [pytest.mark.tools, pytest.mark.slow]  # each easy-cluster run takes a few seconds here

AF3 = ClusteringConfig()


def _a3m_segment(path, accession: str) -> str:
    """The residues of one A3M hit (its aligned segment: gaps out, insertions in)."""
    text = gzip.open(path, "rt").read() if path.suffix == ".gz" else path.read_text()
    for entry in text.split(">")[1:]:
        header, *lines = entry.splitlines()
        if header.split("\t")[0] == accession:
            return "".join(lines).replace("-", "").upper()
    raise LookupError(f"{accession} not in {path}")


def _target(target_id: str, chains: list[tuple[str, str]], interfaces=()) -> TargetChains:
    return TargetChains(
        target_id,
        tuple(chr(ord("A") + i) for i in range(len(chains))),
        tuple(kind for kind, _ in chains),
        tuple(sequence for _, sequence in chains),
        tuple(interfaces),
    )


@pytest.fixture(scope="module")
def mmseqs() -> MmseqsCluster:
    return MmseqsCluster(ToolSettings(threads=2))


def test_protein_chains_at_40_percent_identity(shared_data, ras_sequence, mmseqs):
    structures = shared_data / "structures"
    predicted = read_mmcif(structures / "AF-P01112-F1-model_v4.cif.gz").chains[0].sequence  # H-Ras, 189 residues
    antibody = read_mmcif(structures / "7a4d-assembly1.cif")
    a3m = shared_data / "alignments" / "pdb" / "721p-assembly1A_protein.a3m"
    half_identical = _a3m_segment(a3m, "A0A6G0UN35")  # a small GTPase, 52 % identical to H-Ras over 98 %
    distant = _a3m_segment(a3m, "UPI00193986BF")  # 23 % identical over 98 %
    mutant = ras_sequence[:11] + "V" + ras_sequence[12:60] + "L" + ras_sequence[61:]  # G12V, Q61L
    targets = [
        _target("721p", [("protein", ras_sequence), ("protein", ras_sequence)]),
        _target("af", [("protein", predicted)]),
        _target("mutant", [("protein", mutant), ("protein", half_identical), ("protein", distant)]),
        _target("7a4d", [("protein", antibody.chain("A").sequence), ("protein", antibody.chain("E").sequence)]),
    ]
    clusters = cluster_chains(targets, AF3, mmseqs)
    ras = clusters["721p", 1]
    assert clusters["721p", 2] == ras  # identical chains
    assert clusters["af", 1] == ras  # the full-length model: identical where they overlap
    assert clusters["mutant", 1] == ras and clusters["mutant", 2] == ras  # 98 % and 52 % identical
    assert clusters["mutant", 3] != ras  # 23 %: below the 40 % threshold
    assert len({clusters["7a4d", 1], clusters["7a4d", 2], ras, clusters["mutant", 3]}) == 4  # unrelated
    assert all(cluster.startswith("protein:") for cluster in clusters.values())
    # at 60 % identity, the 52 % homologue gets a cluster of its own
    strict = cluster_chains(targets, ClusteringConfig(protein_min_seq_id=0.6), mmseqs)
    assert strict["mutant", 1] == strict["721p", 1] and strict["mutant", 2] != strict["721p", 1]


def test_nucleic_acids_at_100_percent_and_short_chains_by_identity(shared_data, rna_sequence, mmseqs):
    dna = read_mmcif(shared_data / "structures" / "2q2k.cif").chain("A").sequence  # 20 nt
    one_change = ("C" if dna[5] != "C" else "G").join((dna[:5], dna[6:]))
    rna_copy_longer = rna_sequence + "GC"  # contains the first: 100 % identical over > 80 % of it
    targets = [
        _target("dna", [("dna", dna), ("dna", dna), ("dna", one_change), ("dna", rna_sequence.replace("U", "T"))]),
        _target("rna", [("rna", rna_sequence), ("rna", rna_copy_longer)]),
        _target(
            "short",
            [
                ("dna", "GAAGCTTC"),
                ("dna", "GAAGCTTC"),
                ("dna", "GAAGCTTA"),
                ("protein", "TVPGVXTV"),
                ("protein", "TVPGVXTV"),
                ("protein", "TVPGVXTA"),
            ],
        ),
    ]
    clusters = cluster_chains(targets, AF3, mmseqs)
    assert clusters["dna", 1] == clusters["dna", 2] != clusters["dna", 3]  # one substitution: not 100 %
    assert clusters["rna", 1] == clusters["rna", 2]
    assert clusters["dna", 4].startswith("dna:")  # DNA and RNA never share a cluster, whatever the letters
    assert clusters["dna", 1].startswith("dna:") and clusters["rna", 1].startswith("rna:")
    # 8-mers: identical strands and peptides share a cluster, a one-letter change does not
    assert clusters["short", 1] == clusters["short", 2] != clusters["short", 3]
    assert clusters["short", 4] == clusters["short", 5] != clusters["short", 6]
    assert chain_kind("protein", "TVPGVXTV", AF3) == "peptide" and clusters["short", 4].startswith("peptide:")
    assert chain_kind("dna", "GAAGCTTC", AF3) == "short-dna"


def test_ligands_by_ccd_code_and_interfaces_by_their_chains_clusters(shared_data, mmseqs):
    structure = read_mmcif(shared_data / "structures" / "721p-assembly1.cif")  # H-Ras dimer, MG + GNP each
    interfaces = interface_pairs(structure, 5.0)
    target = TargetChains(
        structure.id,
        tuple(c.chain_id for c in structure.chains),
        tuple(c.molecule_type for c in structure.chains),
        tuple(c.sequence for c in structure.chains),
        tuple(map(tuple, interfaces)),
    )
    glycan = _target("glycan", [("ligand", "(NAG)(NAG)(BMA)"), ("ligand", "(GNP)")])
    clusters = cluster_chains([target, glycan], AF3, mmseqs)
    assert clusters[structure.id, 2] == clusters[structure.id, 5] == "ligand:MG"
    assert clusters[structure.id, 3] == clusters["glycan", 2] == "ligand:GNP"
    assert clusters["glycan", 1] == "ligand:NAG-NAG-BMA"
    assert interface_cluster("ligand:MG", "protein:x") == interface_cluster("protein:x", "ligand:MG")
    assert interface_cluster("ligand:MG", "protein:x") != interface_cluster("ligand:GNP", "protein:x")


def test_interfaces_of_a_real_dimer(shared_data):
    # 721P assembly 1: chains A and B (H-Ras) touch; each MG / GNP touches its own chain only
    structure = read_mmcif(shared_data / "structures" / "721p-assembly1.cif")
    assert [c.chain_id for c in structure.chains] == ["A", "A:MG167", "A:GNP168", "B", "B:MG167", "B:GNP168"]
    pairs = interface_pairs(structure, 5.0)
    assert pairs == [[1, 2], [1, 3], [1, 4], [2, 3], [4, 5], [4, 6], [5, 6]]
    # the same from every atom pair, the slow way
    atoms = StructureAtoms.of(structure)
    import numpy as np

    expected = set()
    for a in range(len(structure.chains)):
        for b in range(a + 1, len(structure.chains)):
            first, second = atoms.positions[atoms.chain == a], atoms.positions[atoms.chain == b]
            if np.min(np.linalg.norm(first[:, None] - second[None], axis=-1)) < 5.0:
                expected.add((a + 1, b + 1))
    assert {tuple(pair) for pair in pairs} == expected
    assert interface_pairs(structure, 2.0) != pairs  # a tighter cutoff finds fewer


def test_missing_mmseqs_is_named():
    with pytest.raises(ToolNotFoundError, match="mmseqs"):
        MmseqsCluster(ToolSettings(binary="/nonexistent/mmseqs"))
