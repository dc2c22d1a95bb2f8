"""Legacy PDB-format input, converted by gemmi into an mmCIF block that `io.mmcif` then reads.

A file is PDB format by its content (its first record is HEADER, ATOM, CRYST1, REMARK, ...),
whatever it is named. What the conversion keeps:

- Entities and full sequences from SEQRES (gemmi aligns them to the model, so residues missing
  from the model stay in the sequence, unresolved); a chain without SEQRES has its modelled
  residues as its sequence, with a warning (missing residues cannot be known).
- MODRES (modified residues and their parents), resolution (REMARK 2), method (EXPDTA) and
  the first release date (the earliest REVDAT).
- Chain ids: a polymer is named by its PDB chain (A), a ligand by its chain, CCD code and
  residue number (A:GTP401), as the mmCIF parser names ligands written into a polymer chain.
"""

from __future__ import annotations

import re

import gemmi

from featurecache.io.common import ParseError

# Records that start a PDB-format file (and never an mmCIF one).
_PDB_FIRST_RECORD = re.compile(
    r"^(HEADER|OBSLTE|TITLE |SPLIT |CAVEAT|COMPND|SOURCE|KEYWDS|EXPDTA|NUMMDL|MDLTYP|AUTHOR|REVDAT|"
    r"SPRSDE|JRNL  |REMARK|DBREF|SEQADV|SEQRES|MODRES|HET   |HETNAM|HETSYN|FORMUL|HELIX |SHEET |"
    r"SSBOND|LINK  |CISPEP|SITE  |CRYST1|ORIGX[123]|SCALE[123]|MTRIX[123]|MODEL |ATOM  |HETATM)"
)


def looks_like_pdb(text: str) -> bool:
    """True when the first non-blank line is a PDB-format record."""
    for line in text.splitlines():
        if line.strip():
            return bool(_PDB_FIRST_RECORD.match(line.ljust(6)))
    return False


def pdb_to_mmcif_block(text: str, source: str, warnings: list[str]) -> gemmi.cif.Block:
    """The mmCIF block of a PDB-format text; notes about missing SEQRES go to `warnings`."""
    try:
        structure = gemmi.read_pdb_string(text)
    except (RuntimeError, ValueError) as error:
        message = " ".join(str(error).split())  # gemmi quotes the bad line on a line of its own
        line = re.search(r"line (\d+)", message)
        raise ParseError(source, f"invalid PDB format: {message}", int(line.group(1)) if line else None) from error
    if len(structure) == 0 or structure[0].count_atom_sites() == 0:
        raise ParseError(source, "PDB format without ATOM / HETATM records")
    _name_blank_chains(structure, warnings)
    structure.setup_entities()
    model = structure[0]
    for entity in structure.entities:
        if entity.entity_type != gemmi.EntityType.Polymer or len(entity.full_sequence) > 0 or not entity.subchains:
            continue
        modelled = model.get_subchain(entity.subchains[0])
        entity.full_sequence = [residue.name for residue in modelled]
        chains = sorted(
            {residue.subchain for chain in model for residue in chain if residue.subchain in entity.subchains}
        )
        warnings.append(
            f"{', '.join(_polymer_names(model, chains))}: no SEQRES in the PDB file; "
            "the modelled residues are the sequence (missing residues unknown)"
        )
    structure.assign_label_seq_id(False)
    _rename_subchains(structure)
    block = structure.make_mmcif_document()[0]
    if structure.resolution > 0 and block.find_value("_refine.ls_d_res_high") is None:
        block.set_pair("_refine.ls_d_res_high", f"{structure.resolution:.2f}")
    released = _first_release(text)
    if released:
        block.set_pair("_pdbx_audit_revision_history.revision_date", released)
    return block


_REVDAT = re.compile(r"^REVDAT +\d+ +(\d{2})-([A-Z]{3})-(\d{2})", re.MULTILINE)
_MONTHS = ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC")


def _first_release(text: str) -> str | None:
    """Earliest REVDAT date as ISO; two-digit years from 70 are 19xx (the PDB began in 1971)."""
    dates = []
    for day, month, year in _REVDAT.findall(text):
        if month in _MONTHS:
            century = 1900 if int(year) >= 70 else 2000
            dates.append(f"{century + int(year):04d}-{_MONTHS.index(month) + 1:02d}-{day}")
    return min(dates) if dates else None


_CHAIN_NAMES = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"


def _name_blank_chains(structure: gemmi.Structure, warnings: list[str]) -> None:
    """Chains with a blank id (modelling and MD tools write them) get the first free letters."""
    used = {chain.name for model in structure for chain in model}
    free = [name for name in _CHAIN_NAMES if name not in used]
    for index, model in enumerate(structure):
        blank = [chain for chain in model if not chain.name.strip()]
        for chain, name in zip(blank, free):
            chain.name = name
            if index == 0:
                warnings.append(f"chain {name}: no chain id in the PDB file; named {name}")


def _polymer_names(model: gemmi.Model, subchains: list[str]) -> list[str]:
    return [f"chain {chain.name}" for chain in model if any(r.subchain in subchains for r in chain)]


def _rename_subchains(structure: gemmi.Structure) -> None:
    """gemmi names subchains 'Axp' (polymer), 'Ax1' (a ligand): name them 'A' and 'A:GTP401'."""
    renamed: dict[str, str] = {}
    for chain in structure[0]:
        for residue in chain:
            if residue.subchain in renamed:
                continue
            if residue.entity_type == gemmi.EntityType.Polymer:
                renamed[residue.subchain] = chain.name
            elif residue.entity_type != gemmi.EntityType.Water:
                renamed[residue.subchain] = (
                    f"{chain.name}:{residue.name}{residue.seqid.num}{residue.seqid.icode.strip()}"
                )
    for model in structure:
        for chain in model:
            for residue in chain:
                residue.subchain = renamed.get(residue.subchain, residue.subchain)
    for entity in structure.entities:
        entity.subchains = [renamed.get(name, name) for name in entity.subchains]
