"""Chemistry: CCD components (biotite's bundled CCD or a user's file), leaving atoms, RDKit
molecules and reference conformers, and conformers as cache records.

Bottom layer: uses numpy, biotite, RDKit and featurecache.schema only.

Each name below is imported from its module on first use: a process that needs only the light
modules (the loader's chem.symmetry) does not import biotite and RDKit (~100 MB of a training
process's memory, and their import time).
"""

__all__ = [
    "BOND_ORDERS",
    "CHAIN_KINDS",
    "CONFORMER_ARRAYS",
    "CONFORMER_METADATA",
    "Ccd",
    "Component",
    "Conformer",
    "ConformerSettings",
    "FALLBACK_REASONS",
    "SOURCES",
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


def __getattr__(name: str):
    """Each name imported from its module on first use."""
    if name in ("BOND_ORDERS", "Ccd", "Component", "UnknownComponentError", "atomic_number", "load_ccd"):
        from featurecache.chem import ccd as module
    elif name in (
        "FALLBACK_REASONS",
        "SOURCES",
        "Conformer",
        "ConformerSettings",
        "component_conformer",
        "smiles_conformer",
    ):
        from featurecache.chem import conformer as module
    elif name in (
        "CONFORMER_ARRAYS",
        "CONFORMER_METADATA",
        "conformer_from_arrays",
        "conformer_key",
        "conformer_to_arrays",
        "decode_atom_names",
        "encode_atom_names",
    ):
        from featurecache.chem import conformer_record as module
    elif name in ("CHAIN_KINDS", "is_saccharide", "leaving_atoms_bonded_to", "link_drop_atoms"):
        from featurecache.chem import linking as module
    elif name in ("SmilesError", "canonical_smiles"):
        from featurecache.chem import molecule as module
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(module, name)
