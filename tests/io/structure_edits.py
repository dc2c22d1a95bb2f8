"""Minimal edits of the real sample structures, made with gemmi's CIF document API, for input
variants the sample data lacks (an RNA with a 5' GTP, a cap listed in the sequence, a residue
whose label_seq_id a processing tool dropped). Each returns mmCIF text."""

from __future__ import annotations

import pathlib

import gemmi

_DNA_TO_RNA = {"DA": "A", "DC": "C", "DG": "G", "DT": "U"}


def _document(path: pathlib.Path) -> gemmi.cif.Document:
    return gemmi.cif.read(str(path))


def _text(document: gemmi.cif.Document) -> str:
    return document.as_string()


def _add_chem_comp(block: gemmi.cif.Block, code: str, kind: str) -> None:
    table = block.find("_chem_comp.", ["id", "type"])
    for row in table:
        if row.str(0) == code:
            row[1] = gemmi.cif.quote(kind)
            return
    columns = list(block.find_mmcif_category("_chem_comp.").tags)
    block.find_mmcif_category("_chem_comp.").append_row(
        [
            code if tag == "_chem_comp.id" else gemmi.cif.quote(kind) if tag == "_chem_comp.type" else "?"
            for tag in columns
        ]
    )


def rna_with_5prime_gtp(shared_data: pathlib.Path) -> str:
    """209d's DNA duplex made RNA (DT's C7 removed), strand A's first nucleotide a GTP written
    as HETATM and listed as GTP in the sequence tables, as PDB entries of transcribed RNAs have
    it. The model has no phosphates on that residue (the DNA 5' end has none): GTP's triphosphate
    atoms are unmodelled."""
    document = _document(shared_data / "structures" / "209d-assembly1.cif")
    block = document[0]
    atoms = block.find(
        "_atom_site.",
        [
            "label_comp_id",
            "auth_comp_id",
            "label_asym_id",
            "label_seq_id",
            "label_atom_id",
            "auth_atom_id",
            "group_PDB",
        ],
    )
    for index in reversed(range(len(atoms))):
        row = atoms[index]
        if row.str(0) == "DT" and row.str(4) == "C7":
            atoms.remove_row(index)
    for row in atoms:
        if row.str(0) in _DNA_TO_RNA:
            name = "GTP" if (row.str(2), row.str(3)) == ("A", "1") else _DNA_TO_RNA[row.str(0)]
            row[0] = row[1] = name
            if name == "GTP":
                row[6] = "HETATM"
    scheme = block.find("_pdbx_poly_seq_scheme.", ["asym_id", "seq_id", "mon_id", "pdb_mon_id", "auth_mon_id"])
    for row in scheme:
        for column in (2, 3, 4):
            if row.str(column) in _DNA_TO_RNA:
                row[column] = "GTP" if (row.str(0), row.str(1)) == ("A", "1") else _DNA_TO_RNA[row.str(column)]
    for code in "ACGU":
        _add_chem_comp(block, code, "RNA linking")
    _add_chem_comp(block, "GTP", "non-polymer")
    for row in block.find("_entity_poly.", ["type"]):
        if row.str(0) == "polydeoxyribonucleotide":
            row[0] = "polyribonucleotide"
    return _text(document)


def with_sequence_extended(path: pathlib.Path, asym: str, comp: str, seq_id: int) -> str:
    """`path` with one more _pdbx_poly_seq_scheme row: `comp` at `seq_id` of chain `asym` (the
    C-terminal NH2 cap of 7a4d's peptide E, which the assembly file's sequence leaves out)."""
    document = _document(path)
    block = document[0]
    category = block.find_mmcif_category("_pdbx_poly_seq_scheme.")
    tags = list(category.tags)
    template = next(row for row in category if row.str(tags.index("_pdbx_poly_seq_scheme.asym_id")) == asym)
    values = [template.str(i) for i in range(len(tags))]
    for tag in ("seq_id", "auth_seq_num", "pdb_seq_num"):
        values[tags.index(f"_pdbx_poly_seq_scheme.{tag}")] = str(seq_id)
    for tag in ("mon_id", "auth_mon_id", "pdb_mon_id"):
        values[tags.index(f"_pdbx_poly_seq_scheme.{tag}")] = comp
    category.append_row([value if value else "?" for value in values])
    return _text(document)


def without_label_seq_id(text: str, asym: str, seq_id: int) -> str:
    """mmCIF text with one residue's label_seq_id emptied ('.'), as some tools write HETATM rows."""
    document = gemmi.cif.read_string(text)
    atoms = document[0].find("_atom_site.", ["label_asym_id", "label_seq_id"])
    for row in atoms:
        if (row.str(0), row.str(1)) == (asym, str(seq_id)):
            row[1] = "."
    return _text(document)


def as_separate_entity(text: str, asym: str, seq_id: int, new_asym: str) -> str:
    """mmCIF text with one residue's atoms moved to a non-polymer asym of their own (label_seq_id
    emptied), while the sequence still lists the residue: a 5' GTP deposited as a ligand entity."""
    document = gemmi.cif.read_string(text)
    atoms = document[0].find("_atom_site.", ["label_asym_id", "label_seq_id", "label_entity_id"])
    for row in atoms:
        if (row.str(0), row.str(1)) == (asym, str(seq_id)):
            row[0], row[1], row[2] = new_asym, ".", "99"
    return _text(document)


def without_residue_atoms(text: str, asym: str, seq_id: int) -> str:
    """mmCIF text with one residue's atom rows removed (the residue stays in the sequence: unresolved)."""
    document = gemmi.cif.read_string(text)
    atoms = document[0].find("_atom_site.", ["label_asym_id", "label_seq_id"])
    for index in reversed(range(len(atoms))):
        if (atoms[index].str(0), atoms[index].str(1)) == (asym, str(seq_id)):
            atoms.remove_row(index)
    return _text(document)


def with_residue_renamed(text: str, asym: str, seq_id: int, comp: str, kind: str) -> str:
    """mmCIF text where one residue (its atoms and its sequence entry) becomes `comp`, a
    component of _chem_comp.type `kind` (HETATM rows, as for modified residues)."""
    document = gemmi.cif.read_string(text)
    block = document[0]
    atoms = block.find("_atom_site.", ["label_asym_id", "label_seq_id", "label_comp_id", "auth_comp_id", "group_PDB"])
    for row in atoms:
        if (row.str(0), row.str(1)) == (asym, str(seq_id)):
            row[2] = row[3] = comp
            row[4] = "HETATM"
    scheme = block.find("_pdbx_poly_seq_scheme.", ["asym_id", "seq_id", "mon_id", "pdb_mon_id", "auth_mon_id"])
    for row in scheme:
        if (row.str(0), row.str(1)) == (asym, str(seq_id)):
            row[2] = row[3] = row[4] = comp
    _add_chem_comp(block, comp, kind)
    return _text(document)


def with_chem_comp_type(path: pathlib.Path, code: str, kind: str) -> str:
    document = _document(path)
    _add_chem_comp(document[0], code, kind)
    return _text(document)


def as_pdb(text: str, seqres: bool = True) -> str:
    """PDB-format text of an mmCIF text, written by gemmi; SEQRES (optional) from the file's
    sequence tables (_pdbx_poly_seq_scheme where _entity_poly_seq is missing, as in assembly files)."""
    block = gemmi.cif.read_string(text)[0]
    structure = gemmi.make_structure_from_block(block)
    structure.setup_entities()
    scheme = block.find("_pdbx_poly_seq_scheme.", ["asym_id", "mon_id"])
    sequences: dict[str, list[str]] = {}
    for row in scheme:
        sequences.setdefault(row.str(0), []).append(row.str(1))
    for entity in structure.entities:
        if entity.entity_type == gemmi.EntityType.Polymer and not len(entity.full_sequence) and entity.subchains:
            entity.full_sequence = sequences.get(entity.subchains[0], [])
    options = gemmi.PdbWriteOptions()
    options.seqres_records = seqres
    return structure.make_pdb_string(options)
