"""Chemistry: CCD components (biotite's bundled CCD or a user's file), leaving atoms, RDKit
molecules and reference conformers, and conformers as cache records.

Bottom layer: uses numpy, biotite, RDKit and featurecache.schema only.
"""

from featurecache.chem.ccd import (
    BOND_ORDERS,
    Ccd,
    Component,
    UnknownComponentError,
    atomic_number,
    load_ccd,
)
from featurecache.chem.conformer import (
    FALLBACK_REASONS,
    SOURCES,
    Conformer,
    ConformerSettings,
    component_conformer,
    smiles_conformer,
)
from featurecache.chem.conformer_record import (
    CONFORMER_ARRAYS,
    CONFORMER_METADATA,
    conformer_from_arrays,
    conformer_key,
    conformer_to_arrays,
    decode_atom_names,
    encode_atom_names,
)
from featurecache.chem.linking import (
    CHAIN_KINDS,
    is_saccharide,
    leaving_atoms_bonded_to,
    link_drop_atoms,
)
from featurecache.chem.molecule import SmilesError, canonical_smiles

__all__ = [
    "BOND_ORDERS",
    "CHAIN_KINDS",
    "CONFORMER_ARRAYS",
    "CONFORMER_METADATA",
    "FALLBACK_REASONS",
    "SOURCES",
    "Ccd",
    "Component",
    "Conformer",
    "ConformerSettings",
    "SmilesError",
    "UnknownComponentError",
    "atomic_number",
    "canonical_smiles",
    "component_conformer",
    "conformer_from_arrays",
    "conformer_key",
    "conformer_to_arrays",
    "decode_atom_names",
    "encode_atom_names",
    "is_saccharide",
    "leaving_atoms_bonded_to",
    "link_drop_atoms",
    "load_ccd",
    "smiles_conformer",
]
