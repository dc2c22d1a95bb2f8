"""The Chemical Component Dictionary in the forms Protenix's and Boltz's input parsers read, for
the CCD codes a test uses, built from the CCD featurecache reads (biotite's bundled copy).

Both tools download their own CCD files at first use (Protenix: ``components.cif`` and a pickle of
RDKit molecules, some GB; Boltz: a folder of one pickled RDKit molecule per code). Nothing can be
downloaded here, so the tests write the entries they need in the same layouts:

- `write_components_cif`: the codes' CCD blocks as mmCIF text (every column of `chem_comp`,
  `chem_comp_atom`, `chem_comp_bond`, as the CCD has them);
- `component_molecule`: the code's RDKit molecule with every atom in CCD order (hydrogens
  included), each atom's CCD name in its ``name`` property and ``leaving_atom`` flag (what Boltz
  reads), and one conformer named "Ideal" from the CCD's ideal coordinates (model coordinates
  where an ideal one is missing).
"""

from __future__ import annotations

import numpy as np
from biotite.structure import info as biotite_info
from biotite.structure.io import pdbx
from rdkit import Chem
from rdkit.Geometry import Point3D

from featurecache.chem import load_ccd
from featurecache.chem.molecule import molecule_from_component

CCD_CATEGORIES = ("chem_comp", "chem_comp_atom", "chem_comp_bond")
# BinaryCIF mask codes: 0 present, 1 inapplicable ('.'), 2 missing ('?').
_MASKED_TEXT = {1: ".", 2: "?"}


def _cif_category(category) -> pdbx.CIFCategory:
    columns = {}
    for name in category.keys():
        column = category[name]
        values = column.as_array(str).astype(object)
        if column.mask is not None:
            mask = column.mask.array
            for code, text in _MASKED_TEXT.items():
                values[mask == code] = text
        columns[name] = values.astype(str)
    return pdbx.CIFCategory(columns)


def write_components_cif(codes, path) -> None:
    """A components.cif holding the CCD entries of `codes` (KeyError for a code not in the CCD)."""
    cif = pdbx.CIFFile()
    for code in sorted(set(codes)):
        categories = {name: biotite_info.get_from_ccd(name, code) for name in CCD_CATEGORIES}
        if categories["chem_comp"] is None:
            raise KeyError(f"{code} is not in biotite's bundled CCD")
        cif[code] = pdbx.CIFBlock(
            {name: _cif_category(category) for name, category in categories.items() if category is not None}
        )
    cif.write(str(path))


def component_molecule(code: str) -> Chem.Mol:
    """The RDKit molecule of a CCD code in the layout described above."""
    component = load_ccd().component(code)
    molecule, _ = molecule_from_component(component)
    positions = np.where(component.ideal_missing[:, None], component.model_pos, component.ideal_pos)
    conformer = Chem.Conformer(component.num_atoms)
    for index, (x, y, z) in enumerate(positions.astype(float)):
        conformer.SetAtomPosition(index, Point3D(x, y, z))
    conformer.SetProp("name", "Ideal")
    molecule.RemoveAllConformers()
    molecule.AddConformer(conformer, assignId=True)
    for atom, name, leaving in zip(molecule.GetAtoms(), component.atom_names, component.leaving):
        atom.SetProp("name", str(name))
        atom.SetProp("leaving_atom", str(int(leaving)))
    return molecule


def component_mask(code: str) -> np.ndarray:
    """[atoms] True where the CCD gives the atom a position (ideal or model)."""
    component = load_ccd().component(code)
    return ~(component.ideal_missing & component.model_missing)
