"""Chain and interface clusters over a whole cache, as AlphaFold 3 defines them (SI 2.5.3).

- Protein chains: MMseqs2 ``easy-cluster`` at 40 % identity; peptides (fewer than
  `min_protein_length` residues, AF3: 10) by identical sequence.
- DNA and RNA chains: ``easy-cluster`` at 100 % identity, DNA and RNA apart; chains shorter than
  `min_nucleic_length` by identical sequence (MMseqs2 finds no k-mers, or no significant
  alignment, in a few nucleotides, and would leave identical short strands apart).
- Ligand chains: by their CCD codes (a glycan by its codes in chain order).
- Interfaces: by the unordered pair of their two chains' clusters.

Modified residues count as their standard parents (the chain sequence already reads them
so); unknown ones as X / N. Identical sequences are clustered once, so they always share a
cluster. Cluster ids are "<kind>:<digest of the representative sequence>" for polymers and
"ligand:<CCD codes>" for ligands; an interface's id joins its chains' ids, sorted, with "|".
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from featurecache.config import ClusteringConfig
from featurecache.precompute.tools.mmseqs import MmseqsCluster

POLYMER_KINDS = ("protein", "dna", "rna")
_CCD_CODES = re.compile(r"\(([^()]*)\)")


@dataclass(frozen=True)
class TargetChains:
    """One target as clustering sees it: its chains in asym_id order and its interfaces."""

    target_id: str
    chain_ids: tuple[str, ...]
    molecule_types: tuple[str, ...]  # "protein" | "dna" | "rna" | "ligand" per chain
    sequences: tuple[str, ...]  # one-letter sequences; "(CCD)(CCD)" for ligands
    interfaces: tuple[tuple[int, int], ...]  # (asym_a, asym_b), 1-based, a < b

    @classmethod
    def from_meta(cls, target_id: str, meta: dict) -> TargetChains | None:
        """From a feature record's metadata; None for a record written before curation recorded
        chain types and interfaces (such a record is stale and recomputed by the next run)."""
        if "chain_types" not in meta or "interfaces" not in meta:
            return None
        return cls(
            target_id,
            tuple(meta["chain_ids"]),
            tuple(meta["chain_types"]),
            tuple(meta["sequences"]),
            tuple((int(a), int(b)) for a, b in meta["interfaces"]),
        )

    def __post_init__(self) -> None:
        if not len(self.chain_ids) == len(self.molecule_types) == len(self.sequences):
            raise ValueError(f"{self.target_id}: chain ids, types and sequences differ in number")
        for a, b in self.interfaces:
            if not 1 <= a < b <= len(self.chain_ids):
                raise ValueError(f"{self.target_id}: interface ({a}, {b}) names no pair of its chains")

    def to_json(self) -> list:
        """A plain, order-stable form (for fingerprints)."""
        return [
            self.target_id,
            list(self.chain_ids),
            list(self.molecule_types),
            list(self.sequences),
            [list(pair) for pair in self.interfaces],
        ]


ChainKey = tuple[str, int]  # (target id, asym_id)


def chain_kind(molecule_type: str, sequence: str, config: ClusteringConfig) -> str:
    """The clustering family of a chain: protein, peptide, dna, rna, short-dna, short-rna, ligand."""
    if molecule_type == "ligand":
        return "ligand"
    if molecule_type == "protein":
        return "protein" if len(sequence) >= config.min_protein_length else "peptide"
    if molecule_type in ("dna", "rna"):
        return molecule_type if len(sequence) >= config.min_nucleic_length else f"short-{molecule_type}"
    raise ValueError(f"unknown molecule type {molecule_type!r}")


def cluster_chains(
    targets: list[TargetChains], config: ClusteringConfig, mmseqs: MmseqsCluster | None
) -> dict[ChainKey, str]:
    """Every chain's cluster id, keyed by (target id, asym_id). `mmseqs` may be None only when
    no kind has two distinct sequences long enough to need it."""
    kinds: dict[str, set[str]] = {}
    for target in targets:
        for molecule_type, sequence in zip(target.molecule_types, target.sequences):
            kinds.setdefault(chain_kind(molecule_type, sequence, config), set()).add(sequence)
    cluster_of: dict[tuple[str, str], str] = {}  # (kind, sequence) -> cluster id
    for kind, sequences in sorted(kinds.items()):
        for sequence, representative in _representatives(kind, sorted(sequences), config, mmseqs).items():
            cluster_of[kind, sequence] = _cluster_id(kind, representative)
    return {
        (target.target_id, asym_id): cluster_of[chain_kind(molecule_type, sequence, config), sequence]
        for target in targets
        for asym_id, (molecule_type, sequence) in enumerate(zip(target.molecule_types, target.sequences), 1)
    }


def interface_cluster(first: str, second: str) -> str:
    """AF3: interfaces share a cluster when their chains' cluster pairs are the same, unordered."""
    return "|".join(sorted((first, second)))


def _representatives(
    kind: str, sequences: list[str], config: ClusteringConfig, mmseqs: MmseqsCluster | None
) -> dict[str, str]:
    """Each distinct sequence of one kind -> its cluster representative's sequence."""
    if kind not in POLYMER_KINDS or len(sequences) < 2:
        return {sequence: sequence for sequence in sequences}
    if mmseqs is None:
        raise ValueError(f"{len(sequences)} distinct {kind} sequences need MMseqs2 to cluster them")
    names = {f"s{index}": sequence for index, sequence in enumerate(sequences)}
    nucleotide = kind != "protein"
    # MMseqs2 reads nucleotides as DNA; RNA is clustered on its own, so U can be read as T.
    queried = {name: sequence.replace("U", "T") if kind == "rna" else sequence for name, sequence in names.items()}
    min_seq_id = config.nucleic_min_seq_id if nucleotide else config.protein_min_seq_id
    representative = mmseqs.cluster(queried, min_seq_id, config.min_coverage, nucleotide)
    return {names[name]: names[rep] for name, rep in representative.items()}


def _cluster_id(kind: str, representative: str) -> str:
    if kind == "ligand":
        return "ligand:" + "-".join(_CCD_CODES.findall(representative) or [representative])
    digest = hashlib.sha256(f"{kind}:{representative}".encode()).hexdigest()[:12]
    return f"{kind}:{digest}"
