"""mmCIF parsing (via gemmi) into a frozen `Structure` of chains and residues. Legacy PDB-format
files are read too: gemmi converts them (entities and full sequences from SEQRES) first.

What the parser decides, so that featurization never has to look at mmCIF again:

- First model only (NMR ensembles); hydrogens and waters dropped.
- Alternate locations resolved per residue to one label: the highest mean occupancy, the first
  label on ties. Microheterogeneity (two residues at one sequence position) keeps the first.
- Polymer chains get their full sequence from ``_pdbx_poly_seq_scheme`` (or ``_entity_poly_seq``);
  residues in the sequence but absent from the model are kept with no atoms (unresolved).
- The molecule type of a chain is decided by its residues' chemistry (``_chem_comp.type``, then
  gemmi's residue table), because processed assembly files carry inconsistent entity tables.
- A modelled residue belongs to its polymer when the sequence table lists it at its position
  (by ``label_seq_id``, or by author number when a file leaves ``label_seq_id`` empty, even in a
  non-polymer asym of the same author chain), whatever its chemistry: a 5' GTP of an RNA,
  ACE / NH2 caps and PXA in actinomycin (209d) are polymer residues, held once. Only a
  component the sequence does not list there (a ligand written into a polymer chain, e.g. GNP
  and MG after the last residue in 721p assembly files) becomes its own ligand chain with id
  ``"<chain>:<CCD><auth number>"``.
- Modified residues keep their CCD code and get a standard parent (``_pdbx_struct_mod_residue``,
  then `residues.parent_of`: a table of common modifications, gemmi, the CCD) used for
  sequences and residue classes. Selenomethionine is converted to methionine (SE -> SD), as
  AlphaFold 3 does.
- Covalent bonds between residues (``_struct_conn``: glycans, covalent ligands, disulfides) are
  read by `io.connections` into `Structure.bonds`, naming atoms by chain, residue and name.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import gemmi
import numpy as np

from featurecache.io.common import ParseError, decode_text, read_bytes
from featurecache.io.connections import read_bonds, residue_locator
from featurecache.io.pdb import looks_like_pdb, pdb_to_mmcif_block
from featurecache.io.residues import is_non_polymer, parent_of, residue_kind
from featurecache.io.structure import Chain, Residue, Structure, unresolved_residue
from featurecache.schema import CUT_SHORT

WATER_NAMES = {"HOH", "DOD", "WAT", "H2O"}
HYDROGEN_ELEMENTS = {"H", "D"}
DATE_PATTERN = re.compile(r"^\d{4}-\d{2}-\d{2}$")


def target_id_from_path(path: str | os.PathLike) -> str:
    """Target id used for records: the file name without .gz / .cif / .mmcif / .pdb / .ent, lower case."""
    name = os.path.basename(str(path)).lower()
    for suffix in (".gz", ".cif", ".mmcif", ".pdb", ".ent"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return name


def read_mmcif(path: str | os.PathLike) -> Structure:
    """Parse an mmCIF (or legacy PDB-format) file, plain or gzipped."""
    return parse_mmcif(read_bytes(path), str(path))


def parse_mmcif(data: str | bytes, source: str) -> Structure:
    """Parse mmCIF text into a Structure; every problem is a ParseError naming `source`.

    PDB-format text (ATOM / HETATM / HEADER records, whatever the file is named) is converted
    by gemmi first: `io.pdb` says what that keeps."""
    text = decode_text(data, source)
    notes: list[str] = []
    if looks_like_pdb(text):
        block = pdb_to_mmcif_block(text, source, notes)
    else:
        block = _first_block(text, source)
        category = _category_cut_short(text)
        if category is not None:
            raise ParseError(
                source,
                f"ends inside {category} without the '#' that closes every category in this layout ({CUT_SHORT}?)",
                len(text.rstrip().splitlines()),
            )
    try:
        chains, located = _parse_chains(block, source)
        auth_of = {chain.chain_id: chain.auth_chain_id for chain in chains}
        asym_auth = {key[0]: auth_of[chain_id] for key, (chain_id, _) in located.items()}
        bonds, skipped = read_bonds(block, residue_locator(located, asym_auth), {"MSE": {"SE": "SD"}})
    except ParseError:
        raise
    except (RuntimeError, ValueError, KeyError, IndexError) as error:
        raise ParseError(source, f"inconsistent mmCIF tables: {error}") from error
    return Structure(
        id=target_id_from_path(source),
        source=source,
        resolution=_resolution(block),
        release_date=_release_date(block),
        method=_method(block),
        chains=tuple(chains),
        warnings=tuple(notes)
        + (
            (
                f"{skipped} covalent _struct_conn rows name atoms outside the model "
                "(symmetry mates, renamed residues): not read",
            )
            if skipped
            else ()
        ),
        bonds=bonds,
    )


def _category_cut_short(text: str) -> str | None:
    """The category a wwPDB-layout file ends in when it was cut short, else None.

    wwPDB, RCSB, PDBe, AFDB and gemmi write a '#' line after every category; a file in that
    layout (a '#' line before every loop_) whose last line is not '#' was cut, and gemmi reads a
    loop cut at a line boundary as a whole one: chains would silently lose their last atoms.
    Files not in that layout (hand-written, minimal) carry no such mark and are not checked."""
    lines = text.rstrip().splitlines()
    loops = [number for number, line in enumerate(lines) if line.strip() == "loop_"]
    if not loops or any(number == 0 or lines[number - 1].strip() != "#" for number in loops):
        return None
    if lines[-1].strip() == "#":
        return None
    return next((line.split(".", 1)[0] for line in reversed(lines) if line.startswith("_")), "?")


def _first_block(text: str, source: str) -> gemmi.cif.Block:
    try:
        document = gemmi.cif.read_string(text)
    except (RuntimeError, ValueError) as error:
        detail = re.sub(r"^string:\d+:\S*\s*", "", str(error))
        if _category_cut_short(text) is not None:
            detail += f" ({CUT_SHORT}?)"
        raise ParseError(source, f"invalid mmCIF: {detail}", _gemmi_error_line(str(error))) from error
    if len(document) == 0:
        raise ParseError(source, "no data block (empty file?)")
    return document[0]


# --- metadata -------------------------------------------------------------------------------


def _gemmi_error_line(message: str) -> int | None:
    match = re.match(r"^[^:]*:(\d+)", message)
    return int(match.group(1)) if match else None


def _values(block: gemmi.cif.Block, tag: str) -> list[str]:
    """Non-null values of one tag ('?' and '.' dropped), unquoted."""
    column = block.find_values(tag)
    values = []
    for raw in column:
        if raw in ("?", "."):
            continue
        values.append(gemmi.cif.as_string(raw).strip())
    return values


def _resolution(block: gemmi.cif.Block) -> float | None:
    for tag in ("_refine.ls_d_res_high", "_reflns.d_resolution_high", "_em_3d_reconstruction.resolution"):
        for value in _values(block, tag):
            try:
                resolution = float(value)
            except ValueError:
                continue
            if resolution > 0:
                return resolution
    return None


def read_release_date(path: str | os.PathLike) -> str | None:
    """The first release date (ISO) of an mmCIF file, plain or gzipped; None when it has none."""
    return _release_date(gemmi.cif.read(str(path))[0])


def _release_date(block: gemmi.cif.Block) -> str | None:
    """First release: the earliest revision date (PDB and AlphaFold DB files both carry it)."""
    for tag in ("_pdbx_audit_revision_history.revision_date", "_database_PDB_rev.date"):
        dates = sorted(value for value in _values(block, tag) if DATE_PATTERN.match(value))
        if dates:
            return dates[0]
    return None


def _method(block: gemmi.cif.Block) -> str | None:
    methods = _values(block, "_exptl.method")
    return ", ".join(methods) if methods else None


# --- atoms and chains ----------------------------------------------------------------------

_REQUIRED_ATOM_TAGS = ("label_comp_id", "label_asym_id", "Cartn_x", "Cartn_y", "Cartn_z")


def _category(block: gemmi.cif.Block, name: str) -> dict[str, list]:
    return block.get_mmcif_category(name)


def _text(value) -> str:
    """A value from get_mmcif_category: None ('?') and False ('.') become ''."""
    if value is None or value is False:
        return ""
    return str(value)


@dataclass(frozen=True, eq=False)
class _AtomSite:
    """The _atom_site columns the parser reads, one entry per row; '?' / '.' read as ''."""

    names: list
    comps: list
    asyms: list
    seq_ids: list
    auth_seq_ids: list
    ins_codes: list
    alt_ids: list
    auth_asyms: list
    models: list
    entities: list
    symbols: list
    charges: list
    xyz: np.ndarray  # [rows, 3] float32
    occupancy: np.ndarray  # [rows] float32
    b_factor: np.ndarray  # [rows] float32


def _read_atom_site(block: gemmi.cif.Block, source: str) -> _AtomSite:
    atoms = _category(block, "_atom_site.")
    if not atoms:
        raise ParseError(source, "no _atom_site records")
    missing = [tag for tag in _REQUIRED_ATOM_TAGS if tag not in atoms]
    if "label_atom_id" not in atoms and "auth_atom_id" not in atoms:
        missing.append("label_atom_id")
    if missing:
        raise ParseError(source, f"_atom_site lacks {missing}")
    count = len(atoms["label_asym_id"])

    def column(tag: str) -> list:
        return atoms[tag] if tag in atoms else [None] * count

    try:
        xyz = np.stack(
            [np.asarray(atoms[tag], dtype=np.float64) for tag in ("Cartn_x", "Cartn_y", "Cartn_z")], axis=1
        ).astype(np.float32)
        occupancy = np.asarray(
            [1.0 if value in (None, False) else value for value in column("occupancy")], dtype=np.float32
        )
        b_factor = np.asarray(
            [0.0 if value in (None, False) else value for value in column("B_iso_or_equiv")], dtype=np.float32
        )
    except (TypeError, ValueError) as error:
        raise ParseError(source, f"non-numeric coordinate, occupancy or B-factor in _atom_site: {error}") from error
    if not np.isfinite(xyz).all():
        row = int(np.flatnonzero(~np.isfinite(xyz).all(axis=1))[0])
        raise ParseError(source, f"_atom_site row {row + 1} has a non-finite coordinate {xyz[row].tolist()}")
    return _AtomSite(
        names=[_text(v) for v in (atoms.get("label_atom_id") or atoms["auth_atom_id"])],
        comps=[_text(v) for v in atoms["label_comp_id"]],
        asyms=[_text(v) for v in atoms["label_asym_id"]],
        seq_ids=[_text(v) for v in column("label_seq_id")],
        auth_seq_ids=[_text(v) for v in column("auth_seq_id")],
        ins_codes=[_text(v) for v in column("pdbx_PDB_ins_code")],
        alt_ids=[_text(v) for v in column("label_alt_id")],
        auth_asyms=[_text(v) for v in column("auth_asym_id")],
        models=[_text(v) for v in column("pdbx_PDB_model_num")],
        entities=[_text(v) for v in column("label_entity_id")],
        symbols=[_text(v).upper() for v in column("type_symbol")],
        charges=[_text(v) for v in column("pdbx_formal_charge")],
        xyz=xyz,
        occupancy=occupancy,
        b_factor=b_factor,
    )


def _group_residues(atoms: _AtomSite) -> dict[tuple, list[int]]:
    """Heavy-atom rows of the first model by residue key (asym, label_seq, auth_seq, ins), in file order."""
    first_model = next((model for model in atoms.models if model), "")
    groups: dict[tuple, list[int]] = {}
    for row, comp in enumerate(atoms.comps):
        if atoms.models[row] != first_model or comp in WATER_NAMES:
            continue
        element = atoms.symbols[row] or _element_from_name(atoms.names[row])
        if element in HYDROGEN_ELEMENTS:
            continue
        key = (atoms.asyms[row], atoms.seq_ids[row], atoms.auth_seq_ids[row], atoms.ins_codes[row])
        groups.setdefault(key, []).append(row)
    return groups


def _build_residue(atoms: _AtomSite, rows: list[int], seq_id: int, parent: str | None, source: str) -> Residue:
    """One residue from its atom rows; `parent` None means look it up (polymer residues only)."""
    rows = _resolve_alternates(rows, atoms.alt_ids, atoms.occupancy, atoms.comps)
    comp = atoms.comps[rows[0]]
    seen: set[str] = set()
    kept = []
    for row in rows:
        if atoms.names[row] not in seen:
            seen.add(atoms.names[row])
            kept.append(row)
    atom_names = [atoms.names[row] for row in kept]
    elements = [atoms.symbols[row] or _element_from_name(atoms.names[row]) for row in kept]
    if comp == "MSE":
        comp = "MET"
        atom_names = ["SD" if name == "SE" else name for name in atom_names]
        elements = ["S" if element == "SE" else element for element in elements]
    charges = []
    for row in kept:
        value = atoms.charges[row]
        try:
            charge = int(float(value)) if value else 0
        except (ValueError, OverflowError) as error:
            raise ParseError(
                source, f"atom {atoms.names[row]} of {comp}: formal charge {value!r} is not a number"
            ) from error
        if not -16 <= charge <= 16:
            raise ParseError(source, f"atom {atoms.names[row]} of {comp}: formal charge {charge} is out of range")
        charges.append(charge)
    return Residue(
        name=comp,
        parent=parent_of(comp) if parent is None else parent,
        seq_id=seq_id,
        auth_seq_id=atoms.auth_seq_ids[kept[0]],
        atom_names=tuple(atom_names),
        elements=np.asarray([_atomic_number(e, n) for e, n in zip(elements, atom_names)], dtype=np.int8),
        charges=np.asarray(charges, dtype=np.int8),
        positions=atoms.xyz[kept],
        occupancies=atoms.occupancy[kept],
        b_factors=atoms.b_factor[kept],
    )


def _parse_chains(block: gemmi.cif.Block, source: str) -> tuple[list[Chain], dict[tuple, tuple[str, int]]]:
    """The chains in file order, and where each modelled residue (group key) went: (chain id, index)."""
    atoms = _read_atom_site(block, source)
    groups = _group_residues(atoms)
    chem_types = _chem_comp_types(block)
    scheme = _polymer_scheme(block, groups, atoms, chem_types, source)
    mod_parents = _mod_residue_parents(block)

    # Each chain is keyed by the first atom row that belongs to it, which orders chains as the file does.
    chains: list[tuple[int, Chain]] = []
    used: set[tuple] = set()
    located: dict[tuple, tuple[str, int]] = {}
    asym_first_row: dict[str, int] = {}
    for key, rows in groups.items():
        asym_first_row.setdefault(key[0], rows[0])
    asym_auth = {asym: atoms.auth_asyms[row] or asym for asym, row in asym_first_row.items()}
    asym_entity = {asym: atoms.entities[row] for asym, row in asym_first_row.items()}
    keys_by_asym: dict[str, list[tuple]] = {}
    unlabelled_ligands: dict[str, dict[tuple[str, str], tuple]] = {}  # author chain -> author number -> key
    for key in groups:
        keys_by_asym.setdefault(key[0], []).append(key)
        if key[0] not in scheme and not key[1]:
            unlabelled_ligands.setdefault(asym_auth[key[0]], {}).setdefault((key[2], key[3]), key)

    for asym, positions in scheme.items():
        residues = []
        placed = _polymer_keys(
            positions,
            keys_by_asym.get(asym, []),
            unlabelled_ligands.get(asym_auth.get(asym), {}),
            groups,
            atoms,
            chem_types,
        )
        for (seq_id, mon_id, _), key in zip(positions, placed):
            parent_hint = mod_parents.get((asym, seq_id))
            if key is not None:
                located[key] = (asym, len(residues))
                residues.append(_build_residue(atoms, groups[key], seq_id, parent_hint, source))
                used.add(key)
            else:
                name = "MET" if mon_id == "MSE" else mon_id
                residues.append(unresolved_residue(name, parent_hint or parent_of(name), seq_id))
        molecule_type = _molecule_type(
            [r.parent or r.name for r in residues], chem_types, block, asym_entity.get(asym, "")
        )
        first_row = asym_first_row.get(asym, len(atoms.comps))
        chain = Chain(asym, asym_auth.get(asym, asym), asym_entity.get(asym, ""), molecule_type, tuple(residues))
        chains.append((first_row, chain))

    # Everything not placed in a polymer: ligands. Whole non-polymer asyms stay one chain;
    # ligand residues written inside a polymer asym become chains of their own.
    ligand_groups: dict[str, list[tuple]] = {}
    for key, rows in groups.items():
        if key in used:
            continue
        asym = key[0]
        chain_id = f"{asym}:{atoms.comps[rows[0]]}{key[2] or key[1]}" if asym in scheme else asym
        ligand_groups.setdefault(chain_id, []).append(key)
    for chain_id, keys in ligand_groups.items():
        residues = tuple(_build_residue(atoms, groups[key], index + 1, "", source) for index, key in enumerate(keys))
        located.update({key: (chain_id, index) for index, key in enumerate(keys)})
        asym = keys[0][0]
        chain = Chain(chain_id, asym_auth.get(asym, asym), asym_entity.get(asym, ""), "ligand", residues)
        chains.append((groups[keys[0]][0], chain))

    chains.sort(key=lambda item: item[0])
    if not chains:
        raise ParseError(source, "no chains left after dropping waters and hydrogens")
    return [chain for _, chain in chains], located


_UNNAMED_RESIDUES = {"UNK", "N", "DN"}  # a sequence table's placeholder for a residue it does not name


def _polymer_keys(positions, asym_keys, unlabelled_ligands, groups, atoms: _AtomSite, chem_types) -> list[tuple | None]:
    """The modelled residue (group key) at each sequence position of a polymer asym, or None.

    A residue is found by label_seq_id among the asym's residues (`asym_keys`), or, when the
    file leaves its label_seq_id empty, by author number (pdb_seq_num): in the asym, or among
    the unlabelled residues of non-polymer asyms of the same author chain (`unlabelled_ligands`)
    if it is the very component the sequence lists (a 5' GTP deposited as its own entity). It
    fills the position when the sequence names it (or a residue with the same standard parent,
    or no residue: UNK / N / DN), or when its chemistry links into polymers; whatever its
    _chem_comp.type says, so a 5' GTP or an ACE cap that the sequence lists is a polymer
    residue. Anything else stays for the ligands.
    """
    by_label: dict[str, list[tuple]] = {}
    by_author: dict[tuple[str, str], tuple] = {}
    for key in asym_keys:
        if key[1]:
            by_label.setdefault(key[1], []).append(key)
        else:
            by_author.setdefault((key[2], key[3]), key)
    found = []
    for seq_id, mon_id, auth_number in positions:
        candidates = by_label.get(str(seq_id), [])
        if not candidates and auth_number in by_author:
            candidates = [by_author[auth_number]]
        elsewhere = unlabelled_ligands.get(auth_number)
        if not candidates and elsewhere is not None and atoms.comps[groups[elsewhere][0]] == mon_id:
            candidates = [elsewhere]
        found.append(
            next((key for key in candidates if _fills_position(atoms.comps[groups[key][0]], mon_id, chem_types)), None)
        )
    return found


def _fills_position(comp: str, mon_id: str, chem_types: dict[str, str]) -> bool:
    if comp == mon_id or mon_id in _UNNAMED_RESIDUES or not is_non_polymer(comp, chem_types):
        return True
    parent = parent_of(comp)
    return bool(parent) and parent == parent_of(mon_id)


def _resolve_alternates(rows: list[int], alt_ids: list, occupancy: np.ndarray, comps: list) -> list[int]:
    """Keep one alternate location: highest mean occupancy, first label on ties; then one component."""
    labels: dict[str, list[float]] = {}
    for row in rows:
        label = _text(alt_ids[row])
        if label:
            labels.setdefault(label, []).append(float(occupancy[row]))
    if labels:
        best = max(labels, key=lambda label: (np.mean(labels[label]), -list(labels).index(label)))
        rows = [row for row in rows if _text(alt_ids[row]) in ("", best)]
    first_comp = comps[rows[0]]
    return [row for row in rows if comps[row] == first_comp]


def _chem_comp_types(block: gemmi.cif.Block) -> dict[str, str]:
    table = _category(block, "_chem_comp.")
    if not table or "id" not in table or "type" not in table:
        return {}
    return {_text(comp): _text(kind).lower() for comp, kind in zip(table["id"], table["type"])}


def _as_int(value, what: str, source: str) -> int:
    try:
        return int(_text(value))
    except ValueError:
        raise ParseError(source, f"{what} {_text(value) or '?'!r} is not an integer") from None


def _polymer_scheme(
    block, groups, atoms: _AtomSite, chem_types, source
) -> dict[str, list[tuple[int, str, tuple | None]]]:
    """Full sequence per polymer asym, in seq_id order: (seq_id, CCD code, author number or None),
    the author number being (pdb_seq_num, insertion code) where _pdbx_poly_seq_scheme gives it."""
    scheme: dict[str, dict[int, tuple[str, tuple | None]]] = {}
    table = _category(block, "_pdbx_poly_seq_scheme.")
    if table and {"asym_id", "seq_id", "mon_id"} <= table.keys():
        count = len(table["asym_id"])
        numbers = table.get("pdb_seq_num") or [None] * count
        insertions = table.get("pdb_ins_code") or [None] * count
        for asym, seq_id, mon_id, number, insertion in zip(
            table["asym_id"], table["seq_id"], table["mon_id"], numbers, insertions
        ):
            seq = _as_int(seq_id, f"_pdbx_poly_seq_scheme.seq_id of chain {_text(asym)}", source)
            author = (_text(number), _text(insertion)) if _text(number) else None
            scheme.setdefault(_text(asym), {}).setdefault(seq, (_text(mon_id), author))
    else:
        entity_seq = _category(block, "_entity_poly_seq.")
        by_entity: dict[str, dict[int, tuple[str, None]]] = {}
        if entity_seq and {"entity_id", "num", "mon_id"} <= entity_seq.keys():
            for entity, num, mon_id in zip(entity_seq["entity_id"], entity_seq["num"], entity_seq["mon_id"]):
                position = _as_int(num, f"_entity_poly_seq.num of entity {_text(entity)}", source)
                by_entity.setdefault(_text(entity), {}).setdefault(position, (_text(mon_id), None))
        for key, rows in groups.items():
            asym, seq_id = key[0], key[1]
            if not seq_id:
                continue
            entity = atoms.entities[rows[0]]
            if entity in by_entity:
                scheme.setdefault(asym, dict(by_entity[entity]))
            elif not is_non_polymer(atoms.comps[rows[0]], chem_types):
                # No sequence tables at all: the modelled residues are the sequence.
                position = _as_int(seq_id, f"_atom_site.label_seq_id of chain {asym}", source)
                scheme.setdefault(asym, {}).setdefault(position, (atoms.comps[rows[0]], None))
    return {asym: [(seq, *named) for seq, named in sorted(positions.items())] for asym, positions in scheme.items()}


def _mod_residue_parents(block: gemmi.cif.Block) -> dict[tuple[str, int], str]:
    table = _category(block, "_pdbx_struct_mod_residue.")
    if not table or not {"label_asym_id", "label_seq_id", "parent_comp_id"} <= table.keys():
        return {}
    parents = {}
    for asym, seq_id, parent in zip(table["label_asym_id"], table["label_seq_id"], table["parent_comp_id"]):
        if _text(seq_id).isdigit() and _text(parent):
            parents[(_text(asym), int(seq_id))] = _text(parent)
    return parents


_ENTITY_POLY_TYPES = {
    "polypeptide(l)": "protein",
    "polypeptide(d)": "protein",
    "polydeoxyribonucleotide": "dna",
    "polyribonucleotide": "rna",
    "polydeoxyribonucleotide/polyribonucleotide hybrid": "dna",
}


def _molecule_type(comps: list[str], chem_types: dict[str, str], block: gemmi.cif.Block, entity: str) -> str:
    """Majority vote of the residues' chemistry; the entity_poly type only breaks a no-vote."""
    votes: dict[str, int] = {}
    for comp in comps:
        kind = residue_kind(comp, chem_types)
        if kind is not None:
            votes[kind] = votes.get(kind, 0) + 1
    if votes:
        return max(votes, key=lambda kind: votes[kind])
    table = _category(block, "_entity_poly.")
    if table and "entity_id" in table and "type" in table:
        for entity_id, kind in zip(table["entity_id"], table["type"]):
            if _text(entity_id) == entity:
                return _ENTITY_POLY_TYPES.get(_text(kind).lower(), "protein")
    return "protein"


def _element_from_name(atom_name: str) -> str:
    letters = "".join(c for c in atom_name if c.isalpha())
    return letters[:1].upper()


def _atomic_number(symbol: str, atom_name: str) -> int:
    """Atomic number of type_symbol; a symbol that is no element (processed files write 'M' for
    magnesium) falls back to the atom name when that is an element (ions are named by element)."""
    number = gemmi.Element(symbol).atomic_number if symbol else 0
    if number == 0:
        letters = "".join(c for c in atom_name if c.isalpha())
        if letters and letters.upper().startswith(symbol.upper()):
            number = gemmi.Element(letters).atomic_number
    return number
