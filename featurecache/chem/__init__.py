"""Chemistry: CCD components (biotite's bundled CCD or a user's file) and leaving atoms.

Bottom layer: uses numpy, biotite, RDKit and featurecache.schema only.
"""

from featurecache.chem.ccd import BOND_ORDERS, Ccd, Component, UnknownComponentError, atomic_number, load_ccd
from featurecache.chem.linking import CHAIN_KINDS, is_saccharide, leaving_atoms_bonded_to, link_drop_atoms

__all__ = [
    "BOND_ORDERS", "CHAIN_KINDS", "Ccd", "Component", "UnknownComponentError",
    "atomic_number", "is_saccharide", "leaving_atoms_bonded_to", "link_drop_atoms", "load_ccd",
]
