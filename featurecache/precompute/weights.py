"""AlphaFold 3's sampling weights (SI 2.5.1, eq. 1) and the manifest table that carries them.

Every chain and every interface of the cache is a sampling item with weight

    w = beta_r / N_clust * (alpha_prot * n_prot + alpha_nuc * n_nuc + alpha_ligand * n_ligand)

where r is "chain" or "interface", N_clust the number of items in the item's cluster over the
whole cache, and n_* the item's chains of each type (a chain: one; an interface: its two, so
its alpha is the sum of its chains' alphas). DNA and RNA are both "nuc"; peptides are protein.

`sampling_table` gives, per target, its chain and interface items and their sum: the target's
weight. Drawing targets by that weight and then an item within the target by the items'
weights draws every item with probability proportional to its own weight, which is what AF3
does. The format is documented in featurecache.store.manifest.
"""

from __future__ import annotations

from collections import Counter

from featurecache.config import ClusteringConfig
from featurecache.precompute.clustering import ChainKey, TargetChains, interface_cluster


def molecule_alpha(molecule_type: str, config: ClusteringConfig) -> float:
    """alpha of one chain by molecule type (AF3: protein 3, DNA / RNA 3, ligand 1)."""
    if molecule_type == "protein":
        return config.alpha_protein
    if molecule_type in ("dna", "rna"):
        return config.alpha_nucleic
    if molecule_type == "ligand":
        return config.alpha_ligand
    raise ValueError(f"unknown molecule type {molecule_type!r}")


def chain_weight(molecule_type: str, cluster_size: int, config: ClusteringConfig) -> float:
    """Eq. 1 for a chain: beta_chain / N_clust * alpha(type)."""
    return config.beta_chain / cluster_size * molecule_alpha(molecule_type, config)


def interface_weight(first_type: str, second_type: str, cluster_size: int, config: ClusteringConfig) -> float:
    """Eq. 1 for an interface: beta_interface / N_clust * (alpha(first) + alpha(second))."""
    return (
        config.beta_interface
        / cluster_size
        * (molecule_alpha(first_type, config) + molecule_alpha(second_type, config))
    )


def sampling_table(
    targets: list[TargetChains], chain_clusters: dict[ChainKey, str], config: ClusteringConfig
) -> dict[str, dict]:
    """Per target id: {"weight", "chains": [...], "interfaces": [...]} (manifest "sampling" table)."""
    interface_clusters = {
        (target.target_id, pair): interface_cluster(
            chain_clusters[target.target_id, pair[0]], chain_clusters[target.target_id, pair[1]]
        )
        for target in targets
        for pair in target.interfaces
    }
    chain_sizes = Counter(chain_clusters.values())
    interface_sizes = Counter(interface_clusters.values())
    table = {}
    for target in targets:
        chains = []
        for asym_id, (chain_id, molecule_type) in enumerate(zip(target.chain_ids, target.molecule_types), start=1):
            cluster = chain_clusters[target.target_id, asym_id]
            chains.append(
                {
                    "chain_id": chain_id,
                    "asym_id": asym_id,
                    "molecule_type": molecule_type,
                    "cluster": cluster,
                    "weight": chain_weight(molecule_type, chain_sizes[cluster], config),
                }
            )
        interfaces = []
        for first, second in target.interfaces:
            cluster = interface_clusters[target.target_id, (first, second)]
            interfaces.append(
                {
                    "chains": [first, second],
                    "cluster": cluster,
                    "weight": interface_weight(
                        target.molecule_types[first - 1],
                        target.molecule_types[second - 1],
                        interface_sizes[cluster],
                        config,
                    ),
                }
            )
        total = sum(item["weight"] for item in chains) + sum(item["weight"] for item in interfaces)
        table[target.target_id] = {"weight": total, "chains": chains, "interfaces": interfaces}
    return table
