"""Facts about a chemical component from the Chemical Component Dictionary (biotite's copy).

Used where a structure file does not say enough: the standard parent of a modified residue
(a 5' GTP is a G) and the full heavy-atom list of a non-standard polymer residue, so that
atoms a model lacks are kept and masked instead of dropped. The dictionary loads in a few
seconds, once per process, and only when a non-standard component is looked up.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import gemmi

_HYDROGENS = {"H", "D"}


@dataclass(frozen=True)
class Component:
    code: str
    type: str  # _chem_comp.type, lower case: "l-peptide linking", "rna linking", "non-polymer", ...
    parent: str  # mon_nstd_parent_comp_id; "" when the dictionary names none
    atom_names: tuple[str, ...]  # heavy atoms in dictionary order, leaving atoms (OXT, OP3) left out
    elements: tuple[int, ...]  # atomic numbers
    charges: tuple[int, ...]


@lru_cache(maxsize=None)
def component(code: str) -> Component | None:
    """The dictionary's entry for a CCD code, or None when the code is not in it."""
    from biotite.structure import info  # imported here: loading biotite costs a second

    kind = info.get_from_ccd("chem_comp", code, "type")
    if kind is None:
        return None
    parent = str(info.get_from_ccd("chem_comp", code, "mon_nstd_parent_comp_id").as_array()[0])
    columns = {
        column: info.get_from_ccd("chem_comp_atom", code, column)
        for column in ("atom_id", "type_symbol", "charge", "pdbx_leaving_atom_flag")
    }
    names, elements, charges = [], [], []
    if columns["atom_id"] is not None:
        rows = zip(*(columns[c].as_array().tolist() for c in columns))
        for name, symbol, charge, leaving in rows:
            if symbol.upper() in _HYDROGENS or leaving == "Y":
                continue
            names.append(name)
            elements.append(gemmi.Element(symbol).atomic_number)
            charges.append(int(charge))
    return Component(
        code=code,
        type=str(kind.as_array()[0]).lower(),
        parent="" if parent in ("?", ".") else parent.split(",")[0].strip(),
        atom_names=tuple(names),
        elements=tuple(elements),
        charges=tuple(charges),
    )
