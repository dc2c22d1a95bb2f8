"""A user components.cif for tests, written from real entries of the bundled CCD."""

import gzip
import io

import biotite.structure.info as biotite_info
from biotite.structure.io import pdbx


def write_components_cif(path, codes):
    """A components.cif with the given entries, in wwPDB's layout (from the bundled CCD)."""
    cif = pdbx.CIFFile()
    for code in codes:
        block = pdbx.CIFBlock()
        for category_name in ("chem_comp", "chem_comp_atom", "chem_comp_bond"):
            category = biotite_info.get_from_ccd(category_name, code)
            if category is None:
                continue
            block[category_name] = pdbx.CIFCategory(
                {
                    name: pdbx.CIFColumn(
                        pdbx.CIFData(column.as_array(str)),
                        None if column.mask is None else pdbx.CIFData(column.mask.array),
                    )
                    for name, column in category.items()
                }
            )
        cif[code] = block
    text = io.StringIO()
    cif.write(text)
    data = text.getvalue().encode()
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
