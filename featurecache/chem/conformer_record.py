"""Conformers as cache records: a key, named numpy arrays and plain metadata.

A conformer is computed once per CCD code (or canonical SMILES) and shared by every target
that uses it. Its key names what it is and everything that produced it:

    ccd:<code>:<fingerprint>          fingerprint of the CCD version and the generator settings
    smiles:<sha256 of canonical SMILES, 24 hex>:<fingerprint of the generator settings>

The arrays (CONFORMER_ARRAYS) use AF3's reference-feature names and encodings, so the
featurizer can gather them per atom without conversion; the metadata says where the
positions came from.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping

import numpy as np
import rdkit

from featurecache.chem.ccd import Ccd
from featurecache.chem.conformer import Conformer, ConformerSettings
from featurecache.chem.molecule import canonical_smiles
from featurecache.schema import ArraySpec

# Bump when a code change alters generated conformers: every key changes with it.
# 2: RDKit conformers with bonds off the CCD's by more than max_bond_deviation give way to the CCD's.
CONFORMER_FORMAT = 2
ATOM_NAME_LENGTH = 4

_ARRAYS = (
    ("ref_pos", np.float32, ("atom", 3), "reference conformer position, Angstrom (0 where ref_mask is False)"),
    ("ref_mask", np.bool_, ("atom",), "reference position known"),
    ("ref_element", np.int8, ("atom",), "atomic number (0 = unknown)"),
    ("ref_charge", np.int8, ("atom",), "formal charge"),
    ("ref_atom_name_chars", np.uint8, ("atom", ATOM_NAME_LENGTH), "atom name, ord(c) - 32 per character, 0-padded"),
    ("bonds", np.int32, ("bond", 2), "bonded atom pairs (atom indices)"),
    ("bond_order", np.int8, ("bond",), "bond order: 1, 2, 3, 4; 0 other"),
)
CONFORMER_ARRAYS: tuple[ArraySpec, ...] = tuple(
    ArraySpec(name, np.dtype(dtype), axes, meaning) for name, dtype, axes, meaning in _ARRAYS
)

# Metadata stored beside the arrays.
CONFORMER_METADATA = {
    "name": "CCD code, or canonical SMILES",
    "kind": "'ccd' or 'smiles'",
    "source": "where ref_pos came from: 'rdkit', 'ccd_ideal', 'ccd_model' or 'none'",
    "sanitization": "how far RDKit sanitized the molecule: 'full', 'no_valence_check' or 'none'",
    "fallback": "why ref_pos is not RDKit's: 'not_sanitized', 'embedding_failed', 'bond_lengths'; None if it is",
}


def encode_atom_names(names) -> np.ndarray:
    """AF3's atom-name encoding: [A, 4] uint8, ord(c) - 32 per character, 0-padded."""
    encoded = np.zeros((len(names), ATOM_NAME_LENGTH), np.uint8)
    for row, name in enumerate(names):
        codes = [ord(char) - 32 for char in name]
        # AF3 one-hot encodes each character into 64 classes: printable ASCII up to '_'.
        if len(codes) > ATOM_NAME_LENGTH or any(not 0 <= code < 64 for code in codes):
            raise ValueError(f"atom name {name!r} does not fit AF3's encoding (4 characters, ASCII ' ' to '_')")
        encoded[row, : len(codes)] = codes
    return encoded


def decode_atom_names(chars: np.ndarray) -> np.ndarray:
    """Inverse of encode_atom_names: [A] str."""
    return np.array(
        ["".join(chr(code + 32) for code in row).rstrip() for row in np.asarray(chars).tolist()], dtype=str
    ).reshape(len(chars))


def settings_fingerprint(settings: ConformerSettings) -> str:
    """16 hex characters over the settings, the RDKit version and CONFORMER_FORMAT."""
    parts = [dataclasses.asdict(settings), rdkit.__version__, CONFORMER_FORMAT]
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def conformer_key(code_or_smiles: str, settings: ConformerSettings, ccd: Ccd | None = None) -> str:
    """Cache key of a conformer: pass the Ccd for a CCD code, leave it out for a SMILES.

    The two are never guessed from the string ("CO" is both cobalt's CCD code and a SMILES).
    A SMILES is canonicalized first (SmilesError if unreadable), so any spelling of one
    molecule gives one key.
    """
    if ccd is not None:
        combined = hashlib.sha256(f"{ccd.version}|{settings_fingerprint(settings)}".encode()).hexdigest()[:16]
        return f"ccd:{code_or_smiles}:{combined}"
    digest = hashlib.sha256(canonical_smiles(code_or_smiles).encode()).hexdigest()[:24]
    return f"smiles:{digest}:{settings_fingerprint(settings)}"


def conformer_to_arrays(conformer: Conformer) -> tuple[dict[str, np.ndarray], dict]:
    """(arrays named as CONFORMER_ARRAYS, metadata as CONFORMER_METADATA) for the record codec."""
    arrays = {
        "ref_pos": conformer.positions.astype(np.float32),
        "ref_mask": conformer.mask.astype(np.bool_),
        "ref_element": conformer.elements.astype(np.int8),
        "ref_charge": conformer.charges.astype(np.int8),
        "ref_atom_name_chars": encode_atom_names(conformer.atom_names.tolist()),
        "bonds": conformer.bonds.astype(np.int32).reshape(-1, 2),
        "bond_order": conformer.bond_orders.astype(np.int8),
    }
    meta = {
        "name": conformer.name,
        "kind": conformer.kind,
        "source": conformer.source,
        "sanitization": conformer.sanitization,
        "fallback": conformer.fallback,
    }
    return arrays, meta


def conformer_from_arrays(arrays: Mapping[str, np.ndarray], meta: Mapping) -> Conformer:
    """Inverse of conformer_to_arrays; raises ValueError naming a missing or mistyped array."""
    where = f"conformer {meta.get('name')!r}"
    for spec in CONFORMER_ARRAYS:
        if spec.name not in arrays:
            raise ValueError(f"{where}: missing array {spec.name!r}")
        if arrays[spec.name].dtype != spec.dtype:
            raise ValueError(f"{where}: {spec.name} has dtype {arrays[spec.name].dtype}, expected {spec.dtype}")
    for field in CONFORMER_METADATA:
        if field not in meta:
            raise ValueError(f"{where}: missing metadata {field!r}")
    return Conformer(
        name=meta["name"],
        kind=meta["kind"],
        atom_names=decode_atom_names(arrays["ref_atom_name_chars"]),
        elements=np.array(arrays["ref_element"]),
        charges=np.array(arrays["ref_charge"]),
        positions=np.array(arrays["ref_pos"]),
        mask=np.array(arrays["ref_mask"]),
        bonds=np.array(arrays["bonds"]).reshape(-1, 2),
        bond_orders=np.array(arrays["bond_order"]),
        source=meta["source"],
        sanitization=meta["sanitization"],
        fallback=meta["fallback"],
    )
