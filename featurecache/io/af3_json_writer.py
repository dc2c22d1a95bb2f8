"""Writing AlphaFold 3 input JSON (dialect "alphafold3"), the format `io/af3_json.py` reads.

Field names and types follow AF3's docs/input.md: per entity `id` (upper-case letters, a list for
several copies), `sequence` (standard letters only) and `modifications` (protein: ptmType /
ptmPosition; RNA and DNA: modificationType / basePosition, 1-based; every non-standard residue,
unknown ones included: `documented_sequence`), protein `unpairedMsa` / `pairedMsa` (A3M text, both
set: "" means none) and `templates` (`mmcif` text of one protein chain, 0-based `queryIndices`
/ `templateIndices`), RNA `unpairedMsa` only, ligands `ccdCodes` or `smiles`; `bondedAtomPairs`
as [chain id, 1-based residue, atom name] pairs.

AF3 accepts only upper-case letters as chain ids. Chain ids that are such are kept; any other
(a split-off ligand's "A:MG167", a digit) gets the first free id in AF3's own order (A, B, ...,
Z, AA, BA, ...), and the entity's `description` names the original chains (a field of version 4).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import gemmi

from featurecache.io.af3_json import DIALECT
from featurecache.io.mmcif import DATE_PATTERN, read_release_date
from featurecache.io.residues import UNKNOWN_RESIDUE
from featurecache.io.structure import Structure

_MODIFICATION_KEYS = {
    "protein": ("ptmType", "ptmPosition"),
    "rna": ("modificationType", "basePosition"),
    "dna": ("modificationType", "basePosition"),
}
# The letters AF3's docs/input.md allows in a sequence ("the 1-letter standard amino acid codes";
# "only the letters A, C, G, U" / "A, C, G, T"): unknown residues (X, N) are not among them.
DOCUMENTED_LETTERS = {"protein": frozenset("ACDEFGHIKLMNPQRSTVWY"), "rna": frozenset("ACGU"), "dna": frozenset("ACGT")}
# The letter written where a modification's CCD code stands and no standard parent's letter can:
# AF3 (and featurecache's reader, io/af3_json.py) take the residue from the code, never the letter.
PLACEHOLDER_LETTER = "A"
_SKIPPED_LIGANDS = {"HOH", "DOD", "WAT"}  # waters are no entity in AF3


@dataclass(frozen=True)
class Af3Template:
    """One template of a protein entity: a single-chain mmCIF and its 0-based residue mapping."""

    mmcif: str
    query_indices: tuple[int, ...]
    template_indices: tuple[int, ...]

    def to_json(self) -> dict:
        return {
            "mmcif": self.mmcif,
            "queryIndices": list(self.query_indices),
            "templateIndices": list(self.template_indices),
        }


@dataclass(frozen=True)
class Af3Entity:
    """One `sequences` entry: a chain and its copies (chains with the same residues)."""

    kind: str  # "protein" | "rna" | "dna" | "ligand"
    ids: tuple[str, ...]  # AF3 chain ids
    source_chains: tuple[str, ...]  # the structure's chain ids, in the same order
    sequence: str = ""  # polymers: one-letter codes of the standard parents
    modifications: tuple[tuple[str, int], ...] = ()  # (CCD code, 1-based position)
    ccd_codes: tuple[str, ...] = ()  # ligands defined by CCD codes
    smiles: str = ""  # a ligand defined by SMILES
    description: str = ""
    unpaired_msa: str | None = None  # A3M text (protein, RNA); None leaves the field out
    paired_msa: str | None = None  # A3M text (protein)
    templates: tuple[Af3Template, ...] | None = None  # protein; None leaves the field out

    def to_json(self) -> dict:
        body: dict = {"id": self.ids[0] if len(self.ids) == 1 else list(self.ids)}
        if self.kind == "ligand":
            if self.smiles:
                body["smiles"] = self.smiles
            else:
                body["ccdCodes"] = list(self.ccd_codes)
        else:
            body["sequence"] = self.sequence
            if self.modifications:
                type_key, position_key = _MODIFICATION_KEYS[self.kind]
                body["modifications"] = [
                    {type_key: code, position_key: position} for code, position in self.modifications
                ]
        if self.description:
            body["description"] = self.description
        if self.kind in ("protein", "rna") and self.unpaired_msa is not None:
            body["unpairedMsa"] = self.unpaired_msa
            if self.kind == "protein":  # AF3 wants both set or both unset
                body["pairedMsa"] = self.paired_msa if self.paired_msa is not None else ""
        if self.kind == "protein" and self.templates is not None:
            body["templates"] = [template.to_json() for template in self.templates]
        return {self.kind: body}


def documented_sequence(
    kind: str, sequence: str, modifications: tuple[tuple[str, int], ...]
) -> tuple[str, tuple[tuple[str, int], ...]]:
    """(sequence, modifications) of a polymer in AF3's documented alphabet: every residue that is no
    standard residue of a letter is a modification by its CCD code (those given in `modifications`,
    1-based; an unknown residue's letter X / N by UNK, N or DN), at a letter of the alphabet (its
    parent's where the letter already is one, else PLACEHOLDER_LETTER)."""
    letters = list(sequence)
    modified = dict((position, code) for code, position in modifications)
    for position, letter in enumerate(sequence, start=1):
        if letter not in DOCUMENTED_LETTERS[kind]:
            modified.setdefault(position, UNKNOWN_RESIDUE[kind])
            letters[position - 1] = PLACEHOLDER_LETTER
    return "".join(letters), tuple((code, position) for position, code in sorted(modified.items()))


def msa_with_query(text: str, sequence: str) -> str:
    """A3M text whose first record (the query, one line) reads `sequence`: AF3 wants the query
    exactly as the entity's sequence, which documented_sequence may have changed."""
    header, _, rest = text.partition("\n")
    query, _, rows = rest.partition("\n")
    if not text or query == sequence:
        return text
    if len(query) != len(sequence):
        raise ValueError(f"MSA query {query[:20]}... has {len(query)} residues, the sequence {len(sequence)}")
    return f"{header}\n{sequence}\n{rows}"


def af3_chain_ids(count: int) -> list[str]:
    """AF3's ids for `count` chains: A..Z, then AA, BA, ..., ZA, AB, ... ("reverse spreadsheet")."""
    ids = []
    for number in range(count):
        letters = ""
        number_left = number
        while True:
            letters += chr(ord("A") + number_left % 26)
            number_left = number_left // 26 - 1
            if number_left < 0:
                break
        ids.append(letters)
    return ids


def _valid_id(chain_id: str) -> bool:
    return chain_id.isascii() and chain_id.isalpha() and chain_id.isupper()


def renamed_chains(chain_ids: list[str]) -> dict[str, str]:
    """New ids for the chain ids AF3 refuses: the first of AF3's ids no chain uses."""
    taken = {chain_id for chain_id in chain_ids if _valid_id(chain_id)}
    refused = [chain_id for chain_id in chain_ids if not _valid_id(chain_id)]
    free = (chain_id for chain_id in af3_chain_ids(len(chain_ids) + len(taken)) if chain_id not in taken)
    return {chain_id: next(free) for chain_id in refused}


@dataclass(frozen=True)
class EntityChains:
    """Chains that are copies of one entity: their places in the list given to group_copies, their
    AF3 ids, their own ids, and a description naming the source chains where any was renamed."""

    members: tuple[int, ...]
    ids: tuple[str, ...]
    source_chains: tuple[str, ...]
    description: str


def group_copies(chain_ids: list[str], copy_keys: list, name: str) -> list[EntityChains]:
    """Chains with equal copy_keys as one entity each, in order of first appearance; the ids AF3
    refuses renamed (renamed_chains), and such an entity's description says "chain A, B of <name>"."""
    new_ids = renamed_chains(chain_ids)
    groups: dict = {}
    for place, key in enumerate(copy_keys):
        groups.setdefault(key, []).append(place)
    entities = []
    for members in groups.values():
        source = tuple(chain_ids[place] for place in members)
        renamed = any(chain_id in new_ids for chain_id in source)
        entities.append(
            EntityChains(
                tuple(members),
                tuple(new_ids.get(chain_id, chain_id) for chain_id in source),
                source,
                f"chain {', '.join(source)} of {name}" if renamed else "",
            )
        )
    return entities


def af3_entities(structure: Structure) -> list[Af3Entity]:
    """The structure's chains grouped into AF3 entities (same type and residues = copies), in
    order of first appearance; waters are left out. MSAs and templates are left unset."""
    chains = [
        chain
        for chain in structure.chains
        if not (chain.molecule_type == "ligand" and all(r.name in _SKIPPED_LIGANDS for r in chain.residues))
    ]
    copy_keys = [
        (chain.molecule_type, tuple((residue.name, residue.smiles) for residue in chain.residues)) for chain in chains
    ]
    entities = []
    for group in group_copies([chain.chain_id for chain in chains], copy_keys, structure.id):
        first = chains[group.members[0]]
        kind, ids, source, description = first.molecule_type, group.ids, group.source_chains, group.description
        if kind == "ligand":
            smiles = first.residues[0].smiles if len(first.residues) == 1 else ""
            codes = () if smiles else tuple(residue.name for residue in first.residues)
            entities.append(Af3Entity(kind, ids, source, ccd_codes=codes, smiles=smiles, description=description))
            continue
        modifications = tuple(
            (residue.name, position)
            for position, residue in enumerate(first.residues, start=1)
            if residue.parent != residue.name
        )
        sequence, modifications = documented_sequence(kind, first.sequence, modifications)
        entities.append(
            Af3Entity(kind, ids, source, sequence=sequence, modifications=modifications, description=description)
        )
    return entities


def af3_bonds(structure: Structure, entities: list[Af3Entity]) -> list[list[list]]:
    """`bondedAtomPairs` for the structure's bonds that touch a ligand (AF3 models no bonds
    between or within polymers), in AF3 chain ids and 1-based residue numbers."""
    new_id = {source: new for entity in entities for source, new in zip(entity.source_chains, entity.ids)}
    kinds = {chain.chain_id: chain.molecule_type for chain in structure.chains}
    pairs = []
    for bond in structure.bonds:
        ends = (bond.first, bond.second)
        if not all(end.chain_id in new_id for end in ends):
            continue
        if all(kinds[end.chain_id] != "ligand" for end in ends):
            continue
        pairs.append([[new_id[end.chain_id], end.residue + 1, end.atom] for end in ends])
    return pairs


def af3_document(
    name: str, entities: list[Af3Entity], model_seeds: tuple[int, ...] = (1,), bonds: list[list[list]] | None = None
) -> dict:
    """The whole input as a JSON-ready dict; the version is the lowest that has every field used
    (a `description` needs 4)."""
    document = {"name": name, "modelSeeds": list(model_seeds), "sequences": [entity.to_json() for entity in entities]}
    if bonds:
        document["bondedAtomPairs"] = bonds
    document["dialect"] = DIALECT
    document["version"] = 4 if any(entity.description for entity in entities) else 1
    return document


def af3_json_text(document: dict) -> str:
    """The document as the text of an AF3 input file (callers write it with
    store/files.write_text_atomic: io/ only converts)."""
    return json.dumps(document, indent=1) + "\n"


def _with_release_date(document: gemmi.cif.Document, release_date: str, where: str) -> str:
    """The document's text with `release_date` as its first release
    (`_pdbx_audit_revision_history.revision_date`): AF3 refuses a template mmCIF without one
    ("Template structure ... must have a release date"). gemmi writes no such category, so every
    template mmCIF written here passes through this."""
    if not DATE_PATTERN.match(release_date or ""):
        raise ValueError(
            f"{where}: no release date (_pdbx_audit_revision_history.revision_date, ISO "
            f"YYYY-MM-DD), which AlphaFold 3 requires of a template; got {release_date!r}"
        )
    block = document.sole_block()
    history = block.init_loop(
        "_pdbx_audit_revision_history.",
        ["ordinal", "data_content_type", "major_revision", "minor_revision", "revision_date"],
    )
    history.add_row(["1", "'Structure model'", "1", "0", release_date])
    return document.as_string()


def single_chain_mmcif(path: str | os.PathLike, auth_chain_id: str) -> str:
    """mmCIF text of one protein chain of a structure file (first model, no ligands or waters),
    with its full sequence (`_entity_poly_seq`), so a template's residue indices count unresolved
    residues as AF3 requires, and the file's first release date. Raises ValueError when the chain
    is not in the file or the file has no release date."""
    release_date = read_release_date(path)
    structure = gemmi.read_structure(str(path))
    structure.setup_entities()
    while len(structure) > 1:
        del structure[len(structure) - 1]
    model = structure[0]
    if model.find_chain(auth_chain_id) is None:
        raise ValueError(f"{path}: no chain {auth_chain_id!r}")
    for name in sorted({chain.name for chain in model} - {auth_chain_id}):
        model.remove_chain(name)
    structure.remove_ligands_and_waters()
    structure.remove_empty_chains()
    present = {residue_span.subchain_id() for residue_span in model[auth_chain_id].subchains()}
    for index in reversed(range(len(structure.entities))):
        if not set(structure.entities[index].subchains) & present:
            del structure.entities[index]
    return _with_release_date(structure.make_mmcif_document(), release_date, f"{path} chain {auth_chain_id}")


_BACKBONE_ATOMS = (("N", "N"), ("CA", "C"), ("C", "C"))


def backbone_template_mmcif(
    name: str, residue_names: list[str], backbone, backbone_mask, beta, beta_mask, release_date: str
) -> str:
    """mmCIF text of a one-chain protein template from backbone coordinates only: N, CA, C
    (`backbone` [n, 3, 3], `backbone_mask` [n, 3]) and CB (`beta` [n, 3]; glycine has none), first
    released on `release_date` (ISO; ValueError without one). Every residue given is in the
    chain's sequence, so template index i is residue i."""
    structure = gemmi.Structure()
    structure.name = name
    chain = gemmi.Chain("A")
    for number, residue_name in enumerate(residue_names):
        residue = gemmi.Residue()
        residue.name = residue_name
        residue.seqid = gemmi.SeqId(number + 1, " ")
        residue.label_seq = number + 1
        residue.entity_type = gemmi.EntityType.Polymer
        residue.subchain = "A"
        atoms = [
            (atom, element, backbone[number][slot])
            for slot, (atom, element) in enumerate(_BACKBONE_ATOMS)
            if backbone_mask[number][slot]
        ]
        if beta_mask[number] and residue_name != "GLY":
            atoms.append(("CB", "C", beta[number]))
        for atom_name, element, position in atoms:
            atom = gemmi.Atom()
            atom.name = atom_name
            atom.element = gemmi.Element(element)
            atom.pos = gemmi.Position(*(float(value) for value in position))
            atom.occ = 1.0
            residue.add_atom(atom)
        chain.add_residue(residue)
    model = gemmi.Model(1)
    model.add_chain(chain)
    structure.add_model(model)
    structure.setup_entities()
    entity = structure.entities[0]
    entity.entity_type = gemmi.EntityType.Polymer
    entity.polymer_type = gemmi.PolymerType.PeptideL
    entity.full_sequence = list(residue_names)
    return _with_release_date(structure.make_mmcif_document(), release_date, f"template {name}")
