"""AlphaFold 3's and Protenix's own MSA pairing code run on A3M texts, one per chain: the rows each
pairs across the chains, to compare with featurecache's pairing.

AF3's modules are the unmodified excerpt in tests/third_party/alphafold3 (its README says why AF3
itself is not installed); Protenix's come from its package. Both get the chains' paired MSAs
(`pairedMsa` / pairing.a3m) as their pipelines featurize them, with AF3's defaults: at most 600
rows per species and 8,192 paired rows.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np

from featurecache.io.msa import parse_a3m

AF3_SOURCE = Path(__file__).resolve().parent / "third_party" / "alphafold3"
MAX_PER_SPECIES, MAX_PAIRED = 600, 8192
_STANDARD = set("ACDEFGHIKLMNPQRSTVWY-")


def _rows(text: str) -> list[str]:
    """Each record's aligned row (insertions dropped), non-standard letters as X (featurecache's
    residue classes, so rows compare across the tools' encodings)."""
    return [
        "".join(letter if letter in _STANDARD else "X" for letter in re.sub("[a-z]", "", sequence))
        for sequence in text.splitlines()[1::2]
    ]


def _paired_rows(chains: list[dict], paired: list[dict], texts: list[str]) -> list[tuple[str, ...]]:
    """Back from the tools' integer rows to the texts' rows (all gaps where a chain has none)."""
    columns = []
    for chain, out, text in zip(chains, paired, texts):
        lookup = {row.tobytes(): sequence for row, sequence in zip(chain["msa_all_seq"], _rows(text))}
        gaps = "-" * out["msa_all_seq"].shape[1]
        columns.append([lookup.get(row.tobytes(), gaps) for row in out["msa_all_seq"]])
    return [tuple(column[row] for column in columns) for row in range(1, len(columns[0]))]  # the query left out


def af3_paired_rows(texts: list[str]) -> list[tuple[str, ...]]:
    """The rows AF3's msa_pairing.create_paired_features pairs (species from msa_features)."""
    if str(AF3_SOURCE) not in sys.path:
        sys.path.insert(0, str(AF3_SOURCE))
    from alphafold3.data import msa_features
    from alphafold3.model import msa_pairing

    chains = []
    for number, text in enumerate(texts):
        msa, deletions = msa_features.extract_msa_features(text.splitlines()[1::2], "polypeptide(L)")
        species = msa_features.extract_species_ids(parse_a3m(text, f"chain {number}").descriptions)
        chains.append(
            {
                "chain_id": str(number),
                "msa_all_seq": msa,
                "deletion_matrix_all_seq": deletions,
                "msa_species_identifiers_all_seq": np.array(species, dtype=object),
                "msa": msa[:1],
                "deletion_matrix": deletions[:1],
                "msa_species_identifiers": np.array([""], dtype=object),
            }
        )
    paired = msa_pairing.create_paired_features(
        chains, MAX_PAIRED, {chain["chain_id"] for chain in chains}, MAX_PER_SPECIES
    )
    return _paired_rows(chains, paired, texts)


def protenix_paired_rows(texts: list[str]) -> list[tuple[str, ...]]:
    """The rows Protenix's MSAPairingEngine.pair_chains_by_species pairs (its own species reader)."""
    from protenix.data.constants import PROTEIN_CHAIN
    from protenix.data.msa.msa_utils import MSAPairingEngine, RawMsa

    chains = []
    for number, text in enumerate(texts):
        features = RawMsa.from_a3m(text.splitlines()[1], PROTEIN_CHAIN, text, dedup=False).featurize()
        chains.append(
            {
                "chain_id": str(number),
                "msa_all_seq": features["msa"],
                "deletion_matrix_all_seq": features["deletion_matrix"],
                "msa_species_identifiers_all_seq": np.asarray(features["msa_species_identifiers"]).astype(str),
            }
        )
    paired = MSAPairingEngine.pair_chains_by_species(
        chains, MAX_PAIRED, {chain["chain_id"] for chain in chains}, MAX_PER_SPECIES
    )
    return _paired_rows(chains, paired, texts)
