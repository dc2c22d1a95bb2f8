"""Small, exact edits of real sample mmCIF files with gemmi's CIF layer, for curation tests.

Rows of _atom_site and _pdbx_poly_seq_scheme are copied, moved or renamed; everything else in
the file (resolution, dates, method, other chains) stays as the PDB wrote it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import gemmi

ATOM_SITE = "_atom_site."
POLY_SEQ = "_pdbx_poly_seq_scheme."


def edited(source: Path, target: Path, *edits: Callable[[gemmi.cif.Block], None]) -> Path:
    """A copy of `source` at `target` with each edit applied to its data block."""
    document = gemmi.cif.read(str(source))
    block = document.sole_block()
    for edit in edits:
        edit(block)
    document.write_file(str(target))
    return target


def _rows(category: dict, column: str, value: str) -> list[int]:
    return [row for row, found in enumerate(category[column]) if found == value]


def duplicate_chain(asym: str, new_asym: str, shift: tuple[float, float, float]):
    """Copy every atom of chain `asym` (label_asym_id) as chain `new_asym`, moved by `shift`."""

    def edit(block: gemmi.cif.Block) -> None:
        atoms = block.get_mmcif_category(ATOM_SITE)
        rows = _rows(atoms, "label_asym_id", asym)
        next_id = max(int(value) for value in atoms["id"]) + 1
        for offset, row in enumerate(rows):
            for _column, values in atoms.items():
                values.append(values[row])
            atoms["id"][-1] = str(next_id + offset)
            atoms["label_asym_id"][-1] = atoms["auth_asym_id"][-1] = new_asym
            for axis, delta in zip("xyz", shift):
                atoms[f"Cartn_{axis}"][-1] = f"{float(atoms[f'Cartn_{axis}'][row]) + delta:.3f}"
        block.set_mmcif_category(ATOM_SITE, atoms)
        scheme = block.get_mmcif_category(POLY_SEQ)
        for row in _rows(scheme, "asym_id", asym):
            for _column, values in scheme.items():
                values.append(values[row])
            scheme["asym_id"][-1] = new_asym
            if "pdb_strand_id" in scheme:
                scheme["pdb_strand_id"][-1] = new_asym
        block.set_mmcif_category(POLY_SEQ, scheme)

    return edit


def move_residues(asym: str, first_seq_id: int, shift: tuple[float, float, float]):
    """Move the residues of chain `asym` from label_seq_id `first_seq_id` on by `shift`."""

    def edit(block: gemmi.cif.Block) -> None:
        atoms = block.get_mmcif_category(ATOM_SITE)
        for row in _rows(atoms, "label_asym_id", asym):
            if atoms["label_seq_id"][row] and int(atoms["label_seq_id"][row]) >= first_seq_id:
                for axis, delta in zip("xyz", shift):
                    atoms[f"Cartn_{axis}"][row] = f"{float(atoms[f'Cartn_{axis}'][row]) + delta:.3f}"
        block.set_mmcif_category(ATOM_SITE, atoms)

    return edit


def rename_residues(asym: str, name: str):
    """Every residue of polymer chain `asym` becomes `name` (model and sequence table)."""

    def edit(block: gemmi.cif.Block) -> None:
        atoms = block.get_mmcif_category(ATOM_SITE)
        for row in _rows(atoms, "label_asym_id", asym):
            atoms["label_comp_id"][row] = atoms["auth_comp_id"][row] = name
        block.set_mmcif_category(ATOM_SITE, atoms)
        scheme = block.get_mmcif_category(POLY_SEQ)
        for row in _rows(scheme, "asym_id", asym):
            for column in ("mon_id", "auth_mon_id", "pdb_mon_id"):
                if column in scheme:
                    scheme[column][row] = name
        block.set_mmcif_category(POLY_SEQ, scheme)

    return edit


def keep_resolved(asym: str, seq_ids: set[int]):
    """Drop the atoms of chain `asym` outside `seq_ids`; its sequence stays (unresolved residues)."""

    def edit(block: gemmi.cif.Block) -> None:
        atoms = block.get_mmcif_category(ATOM_SITE)
        keep = [
            row
            for row in range(len(atoms["id"]))
            if atoms["label_asym_id"][row] != asym or int(atoms["label_seq_id"][row]) in seq_ids
        ]
        block.set_mmcif_category(ATOM_SITE, {column: [values[row] for row in keep] for column, values in atoms.items()})

    return edit


def set_method(method: str):
    def edit(block: gemmi.cif.Block) -> None:
        block.set_pair("_exptl.method", gemmi.cif.quote(method))

    return edit
