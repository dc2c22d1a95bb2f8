"""AF3's sampling weights (SI 2.5.1, eq. 1) on a hand-built set of clusters, checked by hand.

w = beta_r / N_clust * (alpha_prot n_prot + alpha_nuc n_nuc + alpha_ligand n_ligand)
beta_chain = 0.5, beta_interface = 1, alpha_prot = alpha_nuc = 3, alpha_ligand = 1
"""

from __future__ import annotations

import pytest

from featurecache.config import ClusteringConfig
from featurecache.precompute.clustering import TargetChains
from featurecache.precompute.weights import chain_weight, interface_weight, molecule_alpha, sampling_table

AF3 = ClusteringConfig()

# Three targets. Chain clusters: P (protein) 3 members, L (ligand) 2, D (DNA) 1, R (RNA) 1.
# Interface clusters, one member each: P|P, L|P, D|P, L|R.
TARGETS = [
    # t1: protein A, protein B, ligand C; interfaces A-B (P|P) and A-C (L|P)
    TargetChains("t1", ("A", "B", "C"), ("protein", "protein", "ligand"), ("MKV", "MKV", "(ATP)"), ((1, 2), (1, 3))),
    # t2: protein A, DNA B; interfaces A-B (D|P)
    TargetChains("t2", ("A", "B"), ("protein", "dna"), ("MKV", "ACGT"), ((1, 2),)),
    # t3: RNA A, ligand B; interface A-B (L|R)
    TargetChains("t3", ("A", "B"), ("rna", "ligand"), ("ACGU", "(ATP)"), ((1, 2),)),
]
CLUSTERS = {
    ("t1", 1): "P",
    ("t1", 2): "P",
    ("t1", 3): "L",
    ("t2", 1): "P",
    ("t2", 2): "D",
    ("t3", 1): "R",
    ("t3", 2): "L",
}

# By hand:
#   chains:      P: 0.5 / 3 * 3 = 0.5     L: 0.5 / 2 * 1 = 0.25     D, R: 0.5 / 1 * 3 = 1.5
#   interfaces:  P|P: 1 / 1 * (3 + 3) = 6   L|P: 1 / 1 * (1 + 3) = 4   D|P: 1 * (3 + 3) = 6   L|R: 1 * (1 + 3) = 4
#   targets:     t1 = 0.5 + 0.5 + 0.25 + 6 + 4 = 11.25    t2 = 0.5 + 1.5 + 6 = 8.0    t3 = 1.5 + 0.25 + 4 = 5.75
EXPECTED = {
    "t1": ([0.5, 0.5, 0.25], [6.0, 4.0], 11.25),
    "t2": ([0.5, 1.5], [6.0], 8.0),
    "t3": ([1.5, 0.25], [4.0], 5.75),
}


def test_weights_match_af3_equation_1_by_hand():
    table = sampling_table(TARGETS, CLUSTERS, AF3)
    for target_id, (chains, interfaces, total) in EXPECTED.items():
        entry = table[target_id]
        assert [item["weight"] for item in entry["chains"]] == pytest.approx(chains), target_id
        assert [item["weight"] for item in entry["interfaces"]] == pytest.approx(interfaces), target_id
        assert entry["weight"] == pytest.approx(total), target_id


def test_table_lists_every_chain_and_interface_with_its_cluster():
    table = sampling_table(TARGETS, CLUSTERS, AF3)
    assert table["t1"]["chains"] == [
        {"chain_id": "A", "asym_id": 1, "molecule_type": "protein", "cluster": "P", "weight": 0.5},
        {"chain_id": "B", "asym_id": 2, "molecule_type": "protein", "cluster": "P", "weight": 0.5},
        {"chain_id": "C", "asym_id": 3, "molecule_type": "ligand", "cluster": "L", "weight": 0.25},
    ]
    assert table["t1"]["interfaces"] == [
        {"chains": [1, 2], "cluster": "P|P", "weight": 6.0},
        {"chains": [1, 3], "cluster": "L|P", "weight": 4.0},
    ]


def test_interface_cluster_sizes_count_across_targets():
    # a second copy of t1: every cluster of t1 doubles in size, so every weight of t1 halves,
    # and t2's protein chain (cluster P: now 5 members) drops to 0.5 * 3 / 5 = 0.3
    copy = TargetChains(
        "t1b", *[getattr(TARGETS[0], name) for name in ("chain_ids", "molecule_types", "sequences", "interfaces")]
    )
    clusters = {**CLUSTERS, ("t1b", 1): "P", ("t1b", 2): "P", ("t1b", 3): "L"}
    table = sampling_table(TARGETS + [copy], clusters, AF3)
    assert [item["weight"] for item in table["t1b"]["interfaces"]] == pytest.approx([3.0, 2.0])
    assert [item["weight"] for item in table["t1b"]["chains"]] == pytest.approx([0.3, 0.3, 1 / 6])
    assert table["t2"]["chains"][0]["weight"] == pytest.approx(0.3)
    assert table["t3"]["interfaces"][0]["weight"] == pytest.approx(4.0)  # L|R still has one member


def test_alphas_and_betas_are_settings():
    assert molecule_alpha("rna", AF3) == molecule_alpha("dna", AF3) == molecule_alpha("protein", AF3) == 3.0
    assert molecule_alpha("ligand", AF3) == 1.0
    assert chain_weight("protein", 4, AF3) == pytest.approx(0.5 * 3 / 4)
    assert interface_weight("protein", "ligand", 2, AF3) == pytest.approx((3 + 1) / 2)
    doubled = ClusteringConfig(beta_interface=2.0, alpha_ligand=0.0)
    assert interface_weight("protein", "ligand", 2, doubled) == pytest.approx(2.0 * 3 / 2)
    with pytest.raises(ValueError, match="molecule type"):
        molecule_alpha("water", AF3)
    with pytest.raises(ValueError, match="beta_chain"):
        ClusteringConfig(beta_chain=-1.0)
