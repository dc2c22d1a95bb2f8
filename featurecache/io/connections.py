"""Covalent bonds between residues from mmCIF ``_struct_conn``: N- and O-linked glycans (NAG to
ASN, sugar to sugar), covalent ligands, links of modified residues, disulfides.

Each row names its two atoms by label_asym_id, label_seq_id (polymers; '.' for other
residues), auth_seq_id and insertion code, and atom name. Only covalent kinds are read:
``covale`` (and the PDB's older ``covale_base`` / ``covale_phosphate`` / ``covale_sugar``) and
``disulf``; metal coordination (``metalc``) and hydrogen bonds (``hydrog``) are not bonds a
structure model builds. A row is skipped when an atom lies in a symmetry mate (its symmetry
operator differs from its partner's), or when either residue is not in the parsed model (a
row of another model, a water, a residue an assembly file renamed); `read_bonds` counts those.
"""

from __future__ import annotations

from collections.abc import Callable

import gemmi

from featurecache.io.structure import AtomRef, Bond

COVALENT_KINDS = {
    "covale": "covale",
    "covale_base": "covale",
    "covale_phosphate": "covale",
    "covale_sugar": "covale",
    "disulf": "disulf",
}

# (label_asym_id, label_seq_id, auth_seq_id, insertion code, auth_asym_id), "" where a file
# leaves one out -> (chain id, residue index)
ResidueLocator = Callable[[tuple[str, str, str, str, str]], "tuple[str, int] | None"]


def _text(value) -> str:
    if value is None or value is False:
        return ""
    return str(value)


def read_bonds(
    block: gemmi.cif.Block, locate: ResidueLocator, renamed_atoms: dict[str, dict[str, str]]
) -> tuple[tuple[Bond, ...], int]:
    """(covalent bonds of `block`'s _struct_conn in row order, each pair once; rows skipped).

    `renamed_atoms`: per CCD code as the file writes it, atom renames the parser applied
    (MSE's SE read as SD)."""
    table = block.get_mmcif_category("_struct_conn.")
    if not table or "conn_type_id" not in table:
        return (), 0
    rows = len(table["conn_type_id"])

    def column(name: str) -> list[str]:
        return [_text(value) for value in table.get(name, [None] * rows)]

    sides = []
    for side in ("1", "2"):
        sides.append(
            {
                "asym": column(f"ptnr{side}_label_asym_id"),
                "comp": column(f"ptnr{side}_label_comp_id"),
                "seq": column(f"ptnr{side}_label_seq_id"),
                "auth": column(f"ptnr{side}_auth_seq_id"),
                "ins": column(f"pdbx_ptnr{side}_PDB_ins_code"),
                "auth_asym": column(f"ptnr{side}_auth_asym_id"),
                "atom": column(f"ptnr{side}_label_atom_id")
                if f"ptnr{side}_label_atom_id" in table
                else column(f"ptnr{side}_auth_atom_id"),
                "symmetry": column(f"ptnr{side}_symmetry"),
            }
        )
    bonds: list[Bond] = []
    seen: set[frozenset] = set()
    skipped = 0
    for row, kind in enumerate(column("conn_type_id")):
        kind = COVALENT_KINDS.get(kind.lower())
        if kind is None:
            continue
        if (sides[0]["symmetry"][row] or "1_555") != (sides[1]["symmetry"][row] or "1_555"):
            skipped += 1
            continue
        ends = [_atom_ref(side, row, locate, renamed_atoms) for side in sides]
        if ends[0] is None or ends[1] is None:
            skipped += 1
            continue
        pair = frozenset(ends)
        if len(pair) == 2 and pair not in seen:
            seen.add(pair)
            bonds.append(Bond(ends[0], ends[1], kind))
    return tuple(bonds), skipped


def _atom_ref(side: dict, row: int, locate: ResidueLocator, renamed_atoms) -> AtomRef | None:
    key = (side["asym"][row], side["seq"][row], side["auth"][row], side["ins"][row], side["auth_asym"][row])
    found = locate(key)
    if found is None or not side["atom"][row]:
        return None
    atom = renamed_atoms.get(side["comp"][row], {}).get(side["atom"][row], side["atom"][row])
    return AtomRef(found[0], found[1], atom)


def residue_locator(
    located: dict[tuple[str, str, str, str], tuple[str, int]], asym_auth: dict[str, str]
) -> ResidueLocator:
    """A ResidueLocator over the parser's residue keys (label_asym_id, label_seq_id, auth_seq_id,
    insertion code): the exact key first, then by label_seq_id (polymer residues), by author
    number and insertion code (ligands, glycans), and, for files whose _struct_conn has author
    columns only, by author chain and number. `asym_auth`: label_asym_id -> auth_asym_id."""
    by_label = {(key[0], key[1]): place for key, place in located.items() if key[1]}
    by_author = {(key[0], key[2], key[3]): place for key, place in located.items()}
    by_author_chain = {(asym_auth.get(key[0], key[0]), key[2], key[3]): place for key, place in located.items()}

    def locate(key: tuple[str, str, str, str, str]):
        asym, seq, auth, ins, auth_asym = key
        if not asym:
            return by_author_chain.get((auth_asym, auth, ins))
        found = located.get((asym, seq, auth, ins))
        if found is None and seq:
            found = by_label.get((asym, seq))
        if found is None:
            found = by_author.get((asym, auth, ins))
        return found

    return locate
