"""mmCIF parsing (via gemmi) into a frozen `Structure` of chains and residues.

What the parser decides, so that featurization never has to look at mmCIF again:

- First model only (NMR ensembles); hydrogens and waters dropped.
- Alternate locations resolved per residue to one label: the highest mean occupancy, the first
  label on ties. Microheterogeneity (two residues at one sequence position) keeps the first.
- Polymer chains get their full sequence from ``_pdbx_poly_seq_scheme`` (or ``_entity_poly_seq``);
  residues in the sequence but absent from the model are kept with no atoms (unresolved).
- The molecule type of a chain is decided by its residues' chemistry (``_chem_comp.type``, then
  gemmi's residue table), because processed assembly files carry inconsistent entity tables.
- A residue of a polymer chain whose chemical component is a non-polymer (a ligand written into
  a polymer chain, e.g. GNP and MG in 721p assembly files, ACE/NH2 caps, PXA in 209d) becomes its
  own ligand chain with id ``"<chain>:<CCD><auth number>"``.
- Modified residues keep their CCD code and get a standard parent (``_pdbx_struct_mod_residue``,
  then a table of common modifications, then gemmi's one-letter code) used for sequences and
  residue classes. Selenomethionine is converted to methionine (SE -> SD), as AlphaFold 3 does.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

import gemmi
import numpy as np

from featurecache.io.common import ParseError, decode_text, read_bytes

PROTEIN_3TO1 = {
    "ALA": "A", "ARG": "R", "ASN": "N", "ASP": "D", "CYS": "C", "GLN": "Q", "GLU": "E",
    "GLY": "G", "HIS": "H", "ILE": "I", "LEU": "L", "LYS": "K", "MET": "M", "PHE": "F",
    "PRO": "P", "SER": "S", "THR": "T", "TRP": "W", "TYR": "Y", "VAL": "V",
}
PROTEIN_1TO3 = {letter: name for name, letter in PROTEIN_3TO1.items()}
DNA_STANDARD = {"DA": "A", "DC": "C", "DG": "G", "DT": "T"}
RNA_STANDARD = {"A": "A", "C": "C", "G": "G", "U": "U"}
# Residues that are one token each (everything else in a polymer is tokenized per atom).
STANDARD_RESIDUES = {
    "protein": set(PROTEIN_3TO1) | {"UNK"},
    "dna": set(DNA_STANDARD) | {"DN"},
    "rna": set(RNA_STANDARD) | {"N"},
}
UNKNOWN_LETTER = {"protein": "X", "dna": "N", "rna": "N"}

# Common modified residues and their standard parents, used when a file has no
# _pdbx_struct_mod_residue row for them (assembly files often drop that category).
MODIFIED_PARENTS = {
    "MSE": "MET", "SEP": "SER", "TPO": "THR", "PTR": "TYR", "CSO": "CYS", "CSD": "CYS",
    "CME": "CYS", "CSS": "CYS", "OCS": "CYS", "CAS": "CYS", "KCX": "LYS", "MLY": "LYS",
    "M3L": "LYS", "ALY": "LYS", "LLP": "LYS", "HYP": "PRO", "PCA": "GLN", "MLE": "LEU",
    "MVA": "VAL", "DVA": "VAL", "SAR": "GLY", "NLE": "LEU", "FME": "MET", "HIC": "HIS",
    "NEP": "HIS", "AGM": "ARG", "CGU": "GLU", "TYS": "TYR", "SCY": "CYS", "CSX": "CYS",
    "PSU": "U", "5MU": "U", "H2U": "U", "OMU": "U", "4SU": "U", "5MC": "C", "OMC": "C",
    "1MG": "G", "2MG": "G", "7MG": "G", "M2G": "G", "OMG": "G", "YG": "G", "1MA": "A",
    "6MA": "A", "5IU": "DU", "CBR": "DC", "5CM": "DC", "5BU": "U", "BRU": "DU",
}
WATER_NAMES = {"HOH", "DOD", "WAT", "H2O"}
HYDROGEN_ELEMENTS = {"H", "D"}
DATE_PATTERN = re.compile(r"^\d{4}-\d{2}-\d{2}$")


@dataclass(frozen=True, eq=False)
class Residue:
    """One residue (or one ligand component) with its heavy atoms; no atoms when unresolved."""

    name: str  # CCD code as modelled (MSE already converted to MET)
    parent: str  # standard parent CCD code ("" when unknown); equal to name for standard residues
    seq_id: int  # label_seq_id for polymers (1-based), position within the ligand chain otherwise
    auth_seq_id: str
    atom_names: tuple[str, ...]
    elements: np.ndarray  # [n] int8 atomic numbers (0 = unknown)
    charges: np.ndarray  # [n] int8
    positions: np.ndarray  # [n, 3] float32
    occupancies: np.ndarray  # [n] float32
    b_factors: np.ndarray  # [n] float32 (pLDDT for predicted models)

    @property
    def is_resolved(self) -> bool:
        return len(self.atom_names) > 0


@dataclass(frozen=True, eq=False)
class Chain:
    chain_id: str  # label_asym_id, or "<label_asym_id>:<CCD><auth number>" for split-off ligands
    auth_chain_id: str
    entity_id: str  # as written in the file (may be unreliable in processed files)
    molecule_type: str  # "protein" | "dna" | "rna" | "ligand"
    residues: tuple[Residue, ...]

    @property
    def is_polymer(self) -> bool:
        return self.molecule_type != "ligand"

    @property
    def sequence(self) -> str:
        """One-letter sequence for polymers (X / N for unknown), CCD codes in brackets for ligands."""
        if not self.is_polymer:
            return "".join(f"({residue.name})" for residue in self.residues)
        unknown = UNKNOWN_LETTER[self.molecule_type]
        return "".join(residue_letter(residue.parent, self.molecule_type, unknown) for residue in self.residues)


@dataclass(frozen=True, eq=False)
class Structure:
    id: str
    source: str
    resolution: float | None
    release_date: str | None  # ISO date
    method: str | None
    chains: tuple[Chain, ...] = field(default_factory=tuple)

    def chain(self, chain_id: str) -> Chain:
        for chain in self.chains:
            if chain.chain_id == chain_id:
                return chain
        raise KeyError(f"{self.source}: no chain {chain_id!r}; chains are {[c.chain_id for c in self.chains]}")


_LETTER_TO_PARENT = {
    "protein": {letter: name for name, letter in PROTEIN_3TO1.items()},
    "dna": {letter: name for name, letter in DNA_STANDARD.items()},
    "rna": {letter: name for name, letter in RNA_STANDARD.items()},
}
_UNKNOWN_RESIDUE = {"protein": "UNK", "dna": "DN", "rna": "N"}


def structure_from_sequences(
    target_id: str, chains: list[tuple[str, str, str]], release_date: str | None = None
) -> Structure:
    """A structure with no coordinates from (chain id, molecule type, one-letter sequence) triples,
    for targets known only by sequence (FASTA inputs): every residue is unresolved."""
    built = []
    for chain_id, molecule_type, sequence in chains:
        if molecule_type not in _LETTER_TO_PARENT:
            raise ValueError(f"chain {chain_id}: molecule type {molecule_type!r} is not protein, dna or rna")
        letters = _LETTER_TO_PARENT[molecule_type]
        residues = []
        for position, letter in enumerate(sequence.upper(), start=1):
            name = letters.get(letter, _UNKNOWN_RESIDUE[molecule_type])
            residues.append(_unresolved_residue(name, name, position))
        built.append(Chain(chain_id, chain_id, "", molecule_type, tuple(residues)))
    return Structure(target_id, target_id, None, release_date, None, tuple(built))


def residue_letter(parent: str, molecule_type: str, unknown: str) -> str:
    if molecule_type == "protein":
        return PROTEIN_3TO1.get(parent, unknown)
    if molecule_type == "dna":
        return DNA_STANDARD.get(parent, unknown)
    return RNA_STANDARD.get(parent, unknown)


def target_id_from_path(path: str | os.PathLike) -> str:
    """Target id used for records: the file name without .gz / .cif / .mmcif, lower case."""
    name = os.path.basename(str(path)).lower()
    for suffix in (".gz", ".cif", ".mmcif"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return name


def read_mmcif(path: str | os.PathLike) -> Structure:
    """Parse an mmCIF file, plain or gzipped."""
    return parse_mmcif(read_bytes(path), str(path))


def parse_mmcif(data: str | bytes, source: str) -> Structure:
    """Parse mmCIF text into a Structure; every problem is a ParseError naming `source`."""
    text = decode_text(data, source)
    try:
        document = gemmi.cif.read_string(text)
    except (RuntimeError, ValueError) as error:
        detail = re.sub(r"^string:\d+:\S*\s*", "", str(error))
        raise ParseError(source, f"invalid mmCIF: {detail}", _gemmi_error_line(str(error))) from error
    if len(document) == 0:
        raise ParseError(source, "no data block (empty file?)")
    block = document[0]
    try:
        chains = _parse_chains(block, source)
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
    )


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


def _parse_chains(block: gemmi.cif.Block, source: str) -> list[Chain]:
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

    names = atoms.get("label_atom_id") or atoms["auth_atom_id"]
    comps = atoms["label_comp_id"]
    asyms = atoms["label_asym_id"]
    seq_ids = column("label_seq_id")
    auth_seq_ids = column("auth_seq_id")
    ins_codes = column("pdbx_PDB_ins_code")
    alt_ids = column("label_alt_id")
    auth_asyms = column("auth_asym_id")
    models = column("pdbx_PDB_model_num")
    entities = column("label_entity_id")
    symbols = column("type_symbol")
    charges_raw = column("pdbx_formal_charge")
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

    first_model = next((_text(m) for m in models if _text(m)), "")
    chem_types = _chem_comp_types(block)

    # Group atom rows into residues: key (asym, label_seq, auth_seq, ins), in file order.
    groups: dict[tuple, list[int]] = {}
    for row in range(count):
        if _text(models[row]) != first_model:
            continue
        comp = _text(comps[row])
        if comp in WATER_NAMES:
            continue
        element = _text(symbols[row]).upper() or _element_from_name(_text(names[row]))
        if element in HYDROGEN_ELEMENTS:
            continue
        key = (_text(asyms[row]), _text(seq_ids[row]), _text(auth_seq_ids[row]), _text(ins_codes[row]))
        groups.setdefault(key, []).append(row)

    def build_residue(rows: list[int], seq_id: int, parent_hint: str) -> Residue:
        rows = _resolve_alternates(rows, alt_ids, occupancy, comps)
        comp = _text(comps[rows[0]])
        seen: set[str] = set()
        kept = []
        for row in rows:
            name = _text(names[row])
            if name not in seen:
                seen.add(name)
                kept.append(row)
        atom_names = [_text(names[row]) for row in kept]
        elements = [_text(symbols[row]).upper() or _element_from_name(_text(names[row])) for row in kept]
        if comp == "MSE":
            comp = "MET"
            atom_names = ["SD" if name == "SE" else name for name in atom_names]
            elements = ["S" if element == "SE" else element for element in elements]
        charges = []
        for row in kept:
            value = _text(charges_raw[row])
            try:
                charge = int(float(value)) if value else 0
            except (ValueError, OverflowError) as error:
                raise ParseError(
                    source, f"atom {_text(names[row])} of {comp}: formal charge {value!r} is not a number"
                ) from error
            if not -16 <= charge <= 16:
                raise ParseError(source, f"atom {_text(names[row])} of {comp}: formal charge {charge} is out of range")
            charges.append(charge)
        parent = parent_hint or _parent(comp)
        return Residue(
            name=comp,
            parent=parent,
            seq_id=seq_id,
            auth_seq_id=_text(auth_seq_ids[kept[0]]),
            atom_names=tuple(atom_names),
            elements=np.asarray([_atomic_number(e, n) for e, n in zip(elements, atom_names)], dtype=np.int8),
            charges=np.asarray(charges, dtype=np.int8),
            positions=xyz[kept],
            occupancies=occupancy[kept],
            b_factors=b_factor[kept],
        )

    scheme = _polymer_scheme(block, groups, entities, comps, chem_types, source)
    mod_parents = _mod_residue_parents(block)

    # Each chain is keyed by the first atom row that belongs to it, which orders chains as the file does.
    chains: list[tuple[int, Chain]] = []
    used: set[tuple] = set()
    asym_first_row: dict[str, int] = {}
    asym_auth: dict[str, str] = {}
    asym_entity: dict[str, str] = {}
    for key, rows in groups.items():
        asym_first_row.setdefault(key[0], rows[0])
        asym_auth.setdefault(key[0], _text(auth_asyms[rows[0]]) or key[0])
        asym_entity.setdefault(key[0], _text(entities[rows[0]]))

    for asym, positions in scheme.items():
        by_seq = {key[1]: key for key in groups if key[0] == asym and key[1]}
        residues = []
        for seq_id, mon_id in positions:
            key = by_seq.get(str(seq_id))
            parent_hint = mod_parents.get((asym, seq_id), "")
            if key is not None and not _is_non_polymer(_text(comps[groups[key][0]]), chem_types):
                residues.append(build_residue(groups[key], seq_id, parent_hint))
                used.add(key)
            else:
                name = "MET" if mon_id == "MSE" else mon_id
                residues.append(_unresolved_residue(name, parent_hint or _parent(name), seq_id))
        molecule_type = _molecule_type([r.parent or r.name for r in residues], chem_types, block, asym_entity.get(asym, ""))
        first_row = asym_first_row.get(asym, count)
        chain = Chain(asym, asym_auth.get(asym, asym), asym_entity.get(asym, ""), molecule_type, tuple(residues))
        chains.append((first_row, chain))

    # Everything not placed in a polymer: ligands. Whole non-polymer asyms stay one chain;
    # ligand residues written inside a polymer asym become chains of their own.
    ligand_groups: dict[str, list[tuple]] = {}
    for key, rows in groups.items():
        if key in used:
            continue
        asym = key[0]
        if asym in scheme:
            comp = _text(comps[rows[0]])
            chain_id = f"{asym}:{comp}{key[2] or key[1]}"
        else:
            chain_id = asym
        ligand_groups.setdefault(chain_id, []).append(key)
    for chain_id, keys in ligand_groups.items():
        residues = tuple(build_residue(groups[key], index + 1, "") for index, key in enumerate(keys))
        asym = keys[0][0]
        chain = Chain(chain_id, asym_auth.get(asym, asym), asym_entity.get(asym, ""), "ligand", residues)
        chains.append((groups[keys[0]][0], chain))

    chains.sort(key=lambda item: item[0])
    if not chains:
        raise ParseError(source, "no chains left after dropping waters and hydrogens")
    return [chain for _, chain in chains]


def _unresolved_residue(name: str, parent: str, seq_id: int) -> Residue:
    return Residue(
        name=name,
        parent=parent,
        seq_id=seq_id,
        auth_seq_id="",
        atom_names=(),
        elements=np.zeros(0, np.int8),
        charges=np.zeros(0, np.int8),
        positions=np.zeros((0, 3), np.float32),
        occupancies=np.zeros(0, np.float32),
        b_factors=np.zeros(0, np.float32),
    )


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


def _is_non_polymer(comp: str, chem_types: dict[str, str]) -> bool:
    kind = chem_types.get(comp)
    if kind is not None:
        return kind == "non-polymer"
    info = gemmi.find_tabulated_residue(comp)
    return info is None or not (info.is_amino_acid() or info.is_nucleic_acid())


def _as_int(value, what: str, source: str) -> int:
    try:
        return int(_text(value))
    except ValueError:
        raise ParseError(source, f"{what} {_text(value) or '?'!r} is not an integer") from None


def _polymer_scheme(block, groups, entities, comps, chem_types, source) -> dict[str, list[tuple[int, str]]]:
    """Full sequence (seq_id, CCD code) per polymer asym, in seq_id order."""
    scheme: dict[str, dict[int, str]] = {}
    table = _category(block, "_pdbx_poly_seq_scheme.")
    if table and {"asym_id", "seq_id", "mon_id"} <= table.keys():
        for asym, seq_id, mon_id in zip(table["asym_id"], table["seq_id"], table["mon_id"]):
            seq = _as_int(seq_id, f"_pdbx_poly_seq_scheme.seq_id of chain {_text(asym)}", source)
            scheme.setdefault(_text(asym), {}).setdefault(seq, _text(mon_id))
    else:
        entity_seq = _category(block, "_entity_poly_seq.")
        by_entity: dict[str, dict[int, str]] = {}
        if entity_seq and {"entity_id", "num", "mon_id"} <= entity_seq.keys():
            for entity, num, mon_id in zip(entity_seq["entity_id"], entity_seq["num"], entity_seq["mon_id"]):
                position = _as_int(num, f"_entity_poly_seq.num of entity {_text(entity)}", source)
                by_entity.setdefault(_text(entity), {}).setdefault(position, _text(mon_id))
        for key, rows in groups.items():
            asym, seq_id = key[0], key[1]
            if not seq_id:
                continue
            entity = _text(entities[rows[0]])
            if entity in by_entity:
                scheme.setdefault(asym, dict(by_entity[entity]))
            elif not _is_non_polymer(_text(comps[rows[0]]), chem_types):
                # No sequence tables at all: the modelled residues are the sequence.
                position = _as_int(seq_id, f"_atom_site.label_seq_id of chain {asym}", source)
                scheme.setdefault(asym, {}).setdefault(position, _text(comps[rows[0]]))
    return {asym: sorted(positions.items()) for asym, positions in scheme.items()}


def _mod_residue_parents(block: gemmi.cif.Block) -> dict[tuple[str, int], str]:
    table = _category(block, "_pdbx_struct_mod_residue.")
    if not table or not {"label_asym_id", "label_seq_id", "parent_comp_id"} <= table.keys():
        return {}
    parents = {}
    for asym, seq_id, parent in zip(table["label_asym_id"], table["label_seq_id"], table["parent_comp_id"]):
        if _text(seq_id).isdigit() and _text(parent):
            parents[(_text(asym), int(seq_id))] = _text(parent)
    return parents


def _parent(comp: str) -> str:
    """Standard parent of a residue: itself if standard, the table, then gemmi's one-letter code."""
    if comp in PROTEIN_3TO1 or comp in DNA_STANDARD or comp in RNA_STANDARD:
        return comp
    if comp in MODIFIED_PARENTS:
        return MODIFIED_PARENTS[comp]
    info = gemmi.find_tabulated_residue(comp)
    if info is not None and info.one_letter_code.strip():
        letter = info.one_letter_code.strip().upper()
        if info.is_amino_acid() and letter in PROTEIN_1TO3:
            return PROTEIN_1TO3[letter]
        if info.kind == gemmi.ResidueKind.DNA and f"D{letter}" in DNA_STANDARD:
            return f"D{letter}"
        if info.kind == gemmi.ResidueKind.RNA and letter in RNA_STANDARD:
            return letter
    return ""


def _residue_kind(comp: str, chem_types: dict[str, str]) -> str | None:
    kind = chem_types.get(comp, "")
    if "peptide" in kind:
        return "protein"
    if "dna" in kind:
        return "dna"
    if "rna" in kind:
        return "rna"
    if comp in PROTEIN_3TO1 or comp == "UNK":
        return "protein"
    if comp in DNA_STANDARD or comp == "DN":
        return "dna"
    if comp in RNA_STANDARD or comp == "N":
        return "rna"
    info = gemmi.find_tabulated_residue(comp)
    if info is not None:
        if info.is_amino_acid():
            return "protein"
        if info.kind == gemmi.ResidueKind.DNA:
            return "dna"
        if info.kind == gemmi.ResidueKind.RNA:
            return "rna"
    return None


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
        kind = _residue_kind(comp, chem_types)
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
