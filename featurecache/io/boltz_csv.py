"""Boltz's MSA CSV: what `boltz predict` reads as a protein's `msa:` when rows are to be paired
across chains (Boltz's docs/prediction.md).

Two columns, `key` and `sequence`. `sequence` is an A3M row (upper-case matched residues,
lower-case insertions, '-' gaps), the query first. `key` is an integer (Boltz reads it as int32):
rows of different chains with the same key are paired, -1 pairs with nothing. Boltz always puts
the chains' queries side by side, so the query's key is -1; it also drops a row whose residues
repeat an earlier row's.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

from featurecache.io.msa import Msa, format_a3m

UNPAIRED = -1
# A species known only by its UniProt mnemonic gets a key at or above 2^30, past every NCBI taxid.
_MNEMONIC_KEYS = 1 << 30


def format_boltz_csv(msa: Msa, keys: Sequence[int], rows: Sequence[int] | None = None) -> str:
    """The CSV of `msa`'s rows (all when None; the query's row 0 first), `keys[i]` for the i-th."""
    sequences = format_a3m(msa, rows, "protein").splitlines()[1::2]  # a record is two lines
    if len(keys) != len(sequences):
        raise ValueError(f"{msa.source}: {len(keys)} Boltz keys for {len(sequences)} rows")
    return "".join(f"{key},{sequence}\n" for key, sequence in zip(["key", *keys], ["sequence", *sequences]))


def species_key(species: str) -> int:
    """The Boltz key of a species id (io/species.py): its NCBI taxid, a fixed number from a
    UniProt mnemonic, UNPAIRED for "" (unknown)."""
    kind, _, value = species.partition(":")
    if not species:
        return UNPAIRED
    if kind == "tax":
        return int(value)
    return _MNEMONIC_KEYS + zlib.crc32(value.encode("ascii")) % _MNEMONIC_KEYS
