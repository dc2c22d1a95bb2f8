"""Chemical components from the wwPDB Chemical Component Dictionary (CCD).

The CCD defines every residue, nucleotide, ligand and ion the PDB uses: its atoms (names,
elements, formal charges, which atoms leave when the component links to another), its bonds
(with orders) and two sets of coordinates, "ideal" (computed) and "model" (taken from one PDB
entry), either of which may be missing.

`load_ccd()` reads the CCD that biotite ships (the whole dictionary as BinaryCIF, updated with
each biotite release); `load_ccd(path)` reads a user's newer ``components.cif`` (or ``.cif.gz``)
from wwPDB instead. `Ccd.component(code)` returns one entry as a `Component`: numpy arrays in
the CCD's atom order, hydrogens included, because conformer generation needs them.
`Component.heavy_atoms()` and `Component.without(names)` give the atoms AF3 keeps.
"""

from __future__ import annotations

import dataclasses
import functools
import gzip
import hashlib
import io
import re
import threading
from dataclasses import dataclass
from pathlib import Path

import biotite
import biotite.structure.info as biotite_info
import numpy as np
from biotite.structure.io import pdbx
from rdkit import Chem

# _chem_comp_bond.value_order -> bond order code (0: any order the CCD spells otherwise).
BOND_ORDERS = {"SING": 1, "DOUB": 2, "TRIP": 3, "QUAD": 4}
HYDROGEN = 1  # atomic number; the CCD's deuterium ("D") is stored as hydrogen too

_PERIODIC_TABLE = Chem.GetPeriodicTable()
# CCD type symbols are upper case ("FE"); "X" is an unknown atom (atomic number 0).
_ATOMIC_NUMBERS = {_PERIODIC_TABLE.GetElementSymbol(z).upper(): z for z in range(1, 119)}
_ATOMIC_NUMBERS.update({"D": HYDROGEN, "X": 0})


class UnknownComponentError(LookupError):
    """A CCD code that the CCD in use does not define."""

    def __init__(self, code: str, where: str):
        self.code = code
        super().__init__(f"CCD code {code!r} is not in {where}")


@dataclass(frozen=True, eq=False)
class Component:
    """One CCD entry. Atom arrays are [A] in CCD order; bonds index into them. Read-only."""

    code: str
    name: str  # _chem_comp.name, e.g. "ADENOSINE-5'-TRIPHOSPHATE"
    type: str  # _chem_comp.type in upper case, e.g. "L-PEPTIDE LINKING"
    parent_code: str | None  # standard parent of a modified residue (MSE -> MET)
    one_letter_code: str | None
    modified_date: str  # ISO date of the entry's last change
    atom_names: np.ndarray  # [A] str
    elements: np.ndarray  # [A] int8 atomic number (0: unknown "X")
    charges: np.ndarray  # [A] int8 formal charge
    leaving: np.ndarray  # [A] bool: atom leaves when the component links to another
    aromatic: np.ndarray  # [A] bool
    bonds: np.ndarray  # [B, 2] int32 atom indices, in CCD order
    bond_orders: np.ndarray  # [B] int8, BOND_ORDERS codes
    bond_aromatic: np.ndarray  # [B] bool
    ideal_pos: np.ndarray  # [A, 3] float32, 0 where missing
    ideal_missing: np.ndarray  # [A] bool
    model_pos: np.ndarray  # [A, 3] float32, 0 where missing
    model_missing: np.ndarray  # [A] bool
    # True only for the entry exactly as the CCD gives it; atom subsets set it False
    # (a conformer needs every atom, hydrogens included).
    is_complete: bool = True

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, np.ndarray):
                value.flags.writeable = False

    @property
    def num_atoms(self) -> int:
        return len(self.atom_names)

    @property
    def is_hydrogen(self) -> np.ndarray:
        return self.elements == HYDROGEN

    def atom_index(self, name: str) -> int:
        matches = np.flatnonzero(self.atom_names == name)
        if len(matches) == 0:
            raise KeyError(f"CCD {self.code}: no atom named {name!r}")
        return int(matches[0])

    def heavy_atoms(self) -> Component:
        """The component without hydrogens (AF3 models heavy atoms only)."""
        return self.subset(~self.is_hydrogen)

    def without(self, names) -> Component:
        """The component without the named atoms (names it does not have are ignored)."""
        return self.subset(~np.isin(self.atom_names, list(names)))

    def subset(self, keep: np.ndarray) -> Component:
        """The atoms where `keep` [A] is True, in the same order, with the bonds among them."""
        keep = np.asarray(keep, dtype=bool)
        bonds, bond_kept = bonds_among(self.bonds, keep)
        return dataclasses.replace(
            self,
            atom_names=self.atom_names[keep],
            elements=self.elements[keep],
            charges=self.charges[keep],
            leaving=self.leaving[keep],
            aromatic=self.aromatic[keep],
            bonds=bonds,
            bond_orders=self.bond_orders[bond_kept],
            bond_aromatic=self.bond_aromatic[bond_kept],
            ideal_pos=self.ideal_pos[keep],
            ideal_missing=self.ideal_missing[keep],
            model_pos=self.model_pos[keep],
            model_missing=self.model_missing[keep],
            is_complete=self.is_complete and bool(keep.all()),
        )


class Ccd:
    """A Chemical Component Dictionary: biotite's bundled copy (path None) or a user's file.

    `version` identifies the dictionary's content for fingerprints: biotite's version and the
    newest entry date for the bundled copy, the file's sha256 and newest entry date for a file.
    """

    def __init__(self, path: str | Path | None = None):
        self.path = None if path is None else Path(path)
        if self.path is not None and not self.path.is_file():
            raise FileNotFoundError(f"CCD file {self.path} does not exist")
        self._components: dict[str, Component] = {}
        self._lock = threading.Lock()

    def __reduce__(self):
        # Workers (Ray, DataLoader) get the path and load their own copy once per process.
        return (load_ccd, (self.path,))

    @property
    def location(self) -> str:
        if self.path is None:
            return f"biotite {biotite.__version__}'s bundled CCD"
        return f"CCD file {self.path}"

    @functools.cached_property
    def release_date(self) -> str:
        """ISO date of the newest entry change: the dictionary's effective release date."""
        if self.path is None:
            dates = biotite_info.get_ccd()["chem_comp"]["pdbx_modified_date"].as_array(str)
            return str(max(dates))
        return self._file_contents[1]

    @functools.cached_property
    def version(self) -> str:
        if self.path is None:
            return f"biotite-{biotite.__version__}:ccd-{self.release_date}"
        return f"sha256-{self._file_contents[2][:16]}:ccd-{self.release_date}"

    def __contains__(self, code: str) -> bool:
        try:
            self.component(code)
        except UnknownComponentError:
            return False
        return True

    def component(self, code: str) -> Component:
        """The entry for `code`, hydrogens and leaving atoms included; cached."""
        with self._lock:
            cached = self._components.get(code)
        if cached is not None:
            return cached
        # A file's categories and values are parsed here, on first use.
        try:
            categories = self._categories(code)
            if categories is None:
                raise UnknownComponentError(code, self.location)
            component = _component_from_categories(code, *categories, where=self.location)
        except (biotite.DeserializationError, biotite.InvalidFileError, ValueError) as error:
            raise ValueError(f"{self.location}: entry {code!r} is malformed: {error}") from None
        with self._lock:
            self._components[code] = component
        return component

    def _categories(self, code: str):
        """(chem_comp, chem_comp_atom, chem_comp_bond or None) categories, or None if absent."""
        if self.path is None:
            chem_comp = biotite_info.get_from_ccd("chem_comp", code)
            if chem_comp is None:
                return None
            return (
                chem_comp,
                biotite_info.get_from_ccd("chem_comp_atom", code),
                biotite_info.get_from_ccd("chem_comp_bond", code),
            )
        blocks = self._file_contents[0]
        if code not in blocks:
            return None
        block = blocks[code]
        if "chem_comp" not in block:
            return None
        return tuple(block.get(name) for name in ("chem_comp", "chem_comp_atom", "chem_comp_bond"))

    @functools.cached_property
    def _file_contents(self) -> tuple[pdbx.CIFFile, str, str]:
        """(parsed file, newest _chem_comp.pdbx_modified_date, sha256 of the file's bytes)."""
        raw = self.path.read_bytes()
        digest = hashlib.sha256(raw).hexdigest()
        text = (gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw).decode()
        try:
            blocks = pdbx.CIFFile.read(io.StringIO(text))
        except (biotite.DeserializationError, biotite.InvalidFileError, ValueError) as error:
            raise ValueError(f"CCD file {self.path} is not readable CIF: {error}") from None
        if not blocks:
            raise ValueError(f"CCD file {self.path} has no data blocks: not a components.cif")
        dates = re.findall(r"^_chem_comp\.pdbx_modified_date\s+(\S+)", text, flags=re.MULTILINE)
        return blocks, max(dates, default="unknown"), digest


@functools.cache
def _load_ccd(path: str | None) -> Ccd:
    return Ccd(path)


def load_ccd(path: str | Path | None = None) -> Ccd:
    """The CCD to use: biotite's bundled copy, or the ``components.cif[.gz]`` at `path`.

    One `Ccd` per path and process, so components are parsed once.
    """
    return _load_ccd(None if path is None else str(Path(path).resolve()))


def bonds_among(bonds: np.ndarray, keep: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Bonds [B, 2] between kept atoms, renumbered to the kept atoms, and which bonds [B] stayed."""
    bond_kept = keep[bonds].all(axis=1) if len(bonds) else np.zeros(0, bool)
    new_index = np.cumsum(keep) - 1
    return new_index[bonds[bond_kept]].astype(np.int32).reshape(-1, 2), bond_kept


def atomic_number(symbol: str) -> int:
    """Atomic number of a CCD type symbol ("FE", "Se", "D" -> 1); 0 for unknown ("X")."""
    return _ATOMIC_NUMBERS.get(symbol.strip().upper(), 0)


def _strings(category, column: str, rows: int, default: str = "") -> np.ndarray:
    if category is None or column not in category:
        return np.array([default] * rows, dtype=str)
    # a copy: the arrays become read-only, and biotite caches the ones it returns
    return np.array(category[column].as_array(str, masked_value=default), dtype=str)


def _single(category, column: str) -> str | None:
    if column not in category:
        return None
    value = str(category[column].as_array(str, masked_value="?")[0])
    return None if value in ("?", ".") else value


def _positions(category, prefix: str, suffix: str, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """[A, 3] float32 positions (0 where missing) and the [A] missing mask."""
    columns = [f"{prefix}{axis}{suffix}" for axis in "xyz"]
    if category is None or any(column not in category for column in columns):
        return np.zeros((rows, 3), np.float32), np.ones(rows, bool)
    xyz = np.stack([category[c].as_array(np.float64, masked_value=np.nan) for c in columns], -1)
    missing = np.isnan(xyz).any(axis=1)
    xyz[missing] = 0.0
    return xyz.astype(np.float32), missing


def _component_from_categories(code, chem_comp, atoms, bonds, where: str) -> Component:
    rows = 0 if atoms is None else atoms.row_count
    names = _strings(atoms, "atom_id", rows)
    elements = np.array([atomic_number(s) for s in _strings(atoms, "type_symbol", rows)], np.int8)
    charges = (
        np.zeros(rows, np.int8)
        if atoms is None or "charge" not in atoms
        else atoms["charge"].as_array(np.int64, masked_value=0).astype(np.int8)
    )
    index = {name: i for i, name in enumerate(names)}
    bond_rows = 0 if bonds is None else bonds.row_count
    pairs = np.zeros((bond_rows, 2), np.int32)
    for row, ends in enumerate(zip(_strings(bonds, "atom_id_1", bond_rows), _strings(bonds, "atom_id_2", bond_rows))):
        for side, atom in enumerate(ends):
            if atom not in index:
                raise ValueError(f"{where}: {code} has a bond to atom {atom!r}, which it does not list")
            pairs[row, side] = index[atom]
    orders = np.array(
        [BOND_ORDERS.get(order.upper(), 0) for order in _strings(bonds, "value_order", bond_rows)], np.int8
    )
    ideal_pos, ideal_missing = _positions(atoms, "pdbx_model_Cartn_", "_ideal", rows)
    model_pos, model_missing = _positions(atoms, "model_Cartn_", "", rows)
    return Component(
        code=code,
        name=_single(chem_comp, "name") or "",
        type=(_single(chem_comp, "type") or "").upper(),
        parent_code=_single(chem_comp, "mon_nstd_parent_comp_id"),
        one_letter_code=_single(chem_comp, "one_letter_code"),
        modified_date=_single(chem_comp, "pdbx_modified_date") or "",
        atom_names=names,
        elements=elements,
        charges=charges,
        leaving=_strings(atoms, "pdbx_leaving_atom_flag", rows, "N") == "Y",
        aromatic=_strings(atoms, "pdbx_aromatic_flag", rows, "N") == "Y",
        bonds=pairs,
        bond_orders=orders,
        bond_aromatic=_strings(bonds, "pdbx_aromatic_flag", bond_rows, "N") == "Y",
        ideal_pos=ideal_pos,
        ideal_missing=ideal_missing,
        model_pos=model_pos,
        model_missing=model_missing,
    )
