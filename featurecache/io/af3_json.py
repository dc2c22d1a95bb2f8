"""AlphaFold 3 input JSON (dialect "alphafold3", versions 1-4) as a target: a Structure with no
coordinates plus the MSAs and templates the file gives.

The format is AF3's docs/input.md: `sequences` of protein / rna / dna chains (`id`: one chain id
or a list of them, one chain per copy; `sequence`; `modifications`; MSAs and templates) and
ligands (`ccdCodes`, one residue per code, or `smiles`), `bondedAtomPairs` between named atoms,
`modelSeeds`. Every problem is a ParseError naming the file and the JSON field path, e.g.
``sequences[2].ligand.smiles: cannot parse SMILES 'C1CC': ...``.

- A SMILES ligand is one residue named "UNL" carrying the canonical SMILES (`Residue.smiles`);
  its atoms and names (C1, C2, O1, ...) come from its conformer at featurization. AF3 gives
  SMILES atoms no names to bond to, so `bondedAtomPairs` naming one is refused, as in AF3.
- MSAs (`unpairedMsa` / `pairedMsa` A3M text or `...Path` files, relative to the JSON): a
  chain with them is not searched; "" for both means query-only. Paired rows come first, then
  unpaired rows (pairing by species happens at featurization, as for searched MSAs).
- `templates` (mmCIF text or `mmcifPath` with one protein chain, query / template index lists)
  are the chain's templates, used as given (no filters, as AF3 does), instead of any found by a
  search; `[]` means none. A chain whose MSA the JSON gives has no other templates either.
- `userCCD` / `userCCDPath` are refused: give a components.cif with ``--ccd`` instead.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from featurecache.chem import SmilesError, UnknownComponentError, canonical_smiles, load_ccd
from featurecache.io.common import ParseError, decode_text, read_bytes
from featurecache.io.hits import TemplateHit
from featurecache.io.mmcif import parse_mmcif
from featurecache.io.msa import Msa, parse_a3m
from featurecache.io.residues import SequenceError, parent_of, read_sequence
from featurecache.io.structure import AtomRef, Bond, Chain, Residue, Structure, unresolved_residue

DIALECT = "alphafold3"
VERSIONS = (1, 2, 3, 4)
SMILES_RESIDUE = "UNL"  # the residue name of a SMILES ligand (its chemistry is Residue.smiles)
_CHAIN_ID = re.compile(r"^[A-Za-z0-9]+$")

# Allowed keys per place, with the version that introduced each (AF3 docs/input.md "Versions").
_TOP_KEYS = {
    "name": 1,
    "modelSeeds": 1,
    "sequences": 1,
    "bondedAtomPairs": 1,
    "userCCD": 1,
    "dialect": 1,
    "version": 1,
    "userCCDPath": 3,
}
_ENTITY_KEYS = {
    "protein": {
        "id": 1,
        "sequence": 1,
        "modifications": 1,
        "unpairedMsa": 1,
        "pairedMsa": 1,
        "templates": 1,
        "unpairedMsaPath": 2,
        "pairedMsaPath": 2,
        "description": 4,
    },
    "rna": {"id": 1, "sequence": 1, "modifications": 1, "unpairedMsa": 1, "unpairedMsaPath": 2, "description": 4},
    "dna": {"id": 1, "sequence": 1, "modifications": 1, "description": 4},
    "ligand": {"id": 1, "ccdCodes": 1, "smiles": 1, "description": 4},
}
_MODIFICATION_KEYS = {
    "protein": ("ptmType", "ptmPosition"),
    "rna": ("modificationType", "basePosition"),
    "dna": ("modificationType", "basePosition"),
}
_TEMPLATE_KEYS = {"mmcif": 1, "mmcifPath": 2, "queryIndices": 1, "templateIndices": 1}
_PATH_FIELDS = ("unpairedMsaPath", "pairedMsaPath", "mmcifPath", "userCCDPath")


@dataclass(frozen=True, eq=False)
class GivenMsa:
    """A chain's MSA from the JSON and where it came from (for the record's metadata)."""

    msa: Msa | None  # None: "" given, the query alone
    origin: str  # e.g. "input JSON unpairedMsa (120 rows)"


@dataclass(frozen=True, eq=False)
class GivenTemplate:
    """A template from the JSON: its one protein chain and the alignment as a TemplateHit
    (query_indices / hit_indices: 0-based chain and template residue positions)."""

    hit: TemplateHit
    chain: Chain
    release_date: str | None = None  # the mmCIF's (_pdbx_audit_revision_history), which AF3 requires


@dataclass(frozen=True, eq=False)
class Af3Input:
    structure: Structure
    name: str
    model_seeds: tuple[int, ...]
    msas: dict[str, GivenMsa] = field(default_factory=dict)  # chain id -> MSA (every copy)
    templates: dict[str, tuple[GivenTemplate, ...]] = field(default_factory=dict)  # chain id -> templates


class _Fail(Exception):
    """A problem at one JSON field path; read_af3_json turns it into a ParseError."""

    def __init__(self, where: str, message: str):
        super().__init__(f"{where}: {message}")


def read_af3_json(path: str | os.PathLike, target_id: str, ccd_path: str | None = None) -> Af3Input:
    """Parse an AF3 input JSON file; raises ParseError naming the file and the field.

    CCD codes (ligands, modifications) and bonded atom names are checked against the CCD at
    `ccd_path` (None: biotite's bundled copy)."""
    source = str(path)
    text = decode_text(read_bytes(path), source)
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise ParseError(source, f"malformed JSON at line {error.lineno}, column {error.colno}: {error.msg}") from None
    try:
        return _Reader(Path(path), target_id, ccd_path).read(document)
    except _Fail as error:
        raise ParseError(source, str(error)) from None


def referenced_files(path: str | os.PathLike) -> list[Path]:
    """The files an AF3 JSON names in its ...Path fields (MSAs, template mmCIFs), resolved
    against its folder, in document order; [] when the file is not readable JSON."""
    try:
        document = json.loads(decode_text(read_bytes(path), str(path)))
    except (OSError, ValueError):
        return []
    found: list[Path] = []

    def walk(node) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in _PATH_FIELDS and isinstance(value, str):
                    found.append(Path(value) if Path(value).is_absolute() else Path(path).parent / value)
                else:
                    walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(document)
    return found


def _type_name(value) -> str:
    return {
        dict: "an object",
        list: "a list",
        str: "a string",
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        type(None): "null",
    }.get(type(value), type(value).__name__)


def _expect(value, kind, where: str, what: str):
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise _Fail(where, f"must be {what}, got {_type_name(value)}")
    return value


def _check_keys(obj: dict, allowed: dict[str, int], version: int, where: str) -> None:
    for key in obj:
        if key not in allowed:
            raise _Fail(f"{where}.{key}" if where else key, f"unknown field (allowed: {', '.join(sorted(allowed))})")
        if allowed[key] > version:
            raise _Fail(
                f"{where}.{key}" if where else key, f'needs "version": {allowed[key]} or later, the file says {version}'
            )


class _Reader:
    def __init__(self, path: Path, target_id: str, ccd_path: str | None):
        self.path = path
        self.target_id = target_id
        self.ccd = load_ccd(ccd_path)
        self.version = 1
        self.chains: list[Chain] = []
        self.chain_where: dict[str, str] = {}  # chain id -> the field that defined it
        self.msas: dict[str, GivenMsa] = {}
        self.templates: dict[str, tuple[GivenTemplate, ...]] = {}
        self.warnings: list[str] = []  # what reading the sequences changed (ambiguity codes)

    def read(self, document) -> Af3Input:
        if isinstance(document, list):
            raise _Fail(
                "(top level)",
                'a list is the AlphaFold Server dialect; this reads dialect "alphafold3" (one object per file)',
            )
        _expect(document, dict, "(top level)", "an object")
        dialect = document.get("dialect")
        if dialect != DIALECT:
            raise _Fail("dialect", f"must be {DIALECT!r}, got {dialect!r}")
        version = document.get("version")
        if not isinstance(version, int) or isinstance(version, bool) or version not in VERSIONS:
            raise _Fail("version", f"must be one of {', '.join(map(str, VERSIONS))}, got {version!r}")
        self.version = version
        _check_keys(document, _TOP_KEYS, version, "")
        for key in ("userCCD", "userCCDPath"):
            if document.get(key) is not None:
                raise _Fail(
                    key,
                    "a user-provided CCD is not supported; put its components in a components.cif "
                    "and pass it with --ccd (or [chem] ccd_path)",
                )
        name = _expect(document.get("name"), str, "name", "a string")
        seeds = _expect(document.get("modelSeeds"), list, "modelSeeds", "a list of integers")
        if not seeds:
            raise _Fail("modelSeeds", "needs at least one seed")
        for index, seed in enumerate(seeds):
            _expect(seed, int, f"modelSeeds[{index}]", "an integer")
        sequences = _expect(document.get("sequences"), list, "sequences", "a list")
        if not sequences:
            raise _Fail("sequences", "is empty: nothing to featurize")
        for index, entry in enumerate(sequences):
            self._entity(entry, index)
        bonds = self._bonds(document.get("bondedAtomPairs"))
        structure = Structure(
            self.target_id, str(self.path), None, None, None, tuple(self.chains), tuple(self.warnings), bonds
        )
        return Af3Input(structure, name, tuple(seeds), self.msas, self.templates)

    # --- sequences ---

    def _entity(self, entry, index: int) -> None:
        where = f"sequences[{index}]"
        _expect(entry, dict, where, "an object with one of protein, rna, dna, ligand")
        if len(entry) != 1 or next(iter(entry)) not in _ENTITY_KEYS:
            raise _Fail(where, f"must have exactly one of protein, rna, dna, ligand; has {sorted(entry) or 'none'}")
        kind, body = next(iter(entry.items()))
        where = f"{where}.{kind}"
        _expect(body, dict, where, "an object")
        _check_keys(body, _ENTITY_KEYS[kind], self.version, where)
        chain_ids = self._chain_ids(body.get("id"), f"{where}.id")
        if kind == "ligand":
            residues = self._ligand(body, where)
        else:
            residues = self._polymer(body, kind, where)
        for chain_id in chain_ids:
            self.chains.append(Chain(chain_id, chain_id, str(index + 1), kind, residues))
        if kind in ("protein", "rna"):
            given = self._msa(body, kind, residues, where)
            if given is not None:
                self.msas.update({chain_id: given for chain_id in chain_ids})
        if kind == "protein" and body.get("templates") is not None:  # [] too: template-free, as in AF3
            templates = self._templates(body["templates"], len(residues), f"{where}.templates")
            self.templates.update({chain_id: templates for chain_id in chain_ids})

    def _chain_ids(self, value, where: str) -> list[str]:
        ids = value if isinstance(value, list) else [value]
        if not ids:
            raise _Fail(where, "is an empty list")
        for chain_id in ids:
            if not isinstance(chain_id, str) or not _CHAIN_ID.match(chain_id):
                raise _Fail(where, f'chain id {chain_id!r} must be letters (and digits), e.g. "A"')
            if chain_id in self.chain_where:
                raise _Fail(where, f"chain id {chain_id!r} is already used by {self.chain_where[chain_id]}")
            self.chain_where[chain_id] = where
        return ids

    def _polymer(self, body: dict, kind: str, where: str) -> tuple[Residue, ...]:
        sequence = _expect(body.get("sequence"), str, f"{where}.sequence", "a string")
        if not sequence:
            raise _Fail(f"{where}.sequence", "is empty")
        try:
            reading = read_sequence(sequence, kind)
        except SequenceError as error:
            raise _Fail(f"{where}.sequence", error.detail) from None
        substituted = reading.warning(kind)
        if substituted:
            self.warnings.append(f"{where}.sequence: {substituted}")
        names = list(reading.residues)
        type_key, position_key = _MODIFICATION_KEYS[kind]
        modifications = body.get("modifications") or []
        _expect(modifications, list, f"{where}.modifications", "a list")
        modified: dict[int, str] = {}
        for number, modification in enumerate(modifications):
            at = f"{where}.modifications[{number}]"
            _expect(modification, dict, at, "an object")
            _check_keys(modification, {type_key: 1, position_key: 1}, self.version, at)
            code = self._ccd_code(modification.get(type_key), f"{at}.{type_key}")
            position = _expect(modification.get(position_key), int, f"{at}.{position_key}", "an integer")
            if not 1 <= position <= len(names):
                raise _Fail(f"{at}.{position_key}", f"position {position} is outside the sequence (1-{len(names)})")
            if position in modified:
                raise _Fail(f"{at}.{position_key}", f"position {position} is already modified ({modified[position]})")
            modified[position] = code
        residues = []
        for position, name in enumerate(names, start=1):
            if position in modified:
                code = modified[position]
                # the code alone says what the residue is (AF3 reads the code, not the letter)
                residues.append(unresolved_residue(code, parent_of(code), position))
            else:
                residues.append(unresolved_residue(name, parent_of(name), position))
        return tuple(residues)

    def _ccd_code(self, code, where: str) -> str:
        _expect(code, str, where, "a CCD code (a string)")
        if code not in self.ccd:
            raise _Fail(where, f"unknown CCD code {code!r} (not in {self.ccd.location})")
        return code

    def _ligand(self, body: dict, where: str) -> tuple[Residue, ...]:
        codes, smiles = body.get("ccdCodes"), body.get("smiles")
        if (codes is None) == (smiles is None):
            raise _Fail(where, "needs exactly one of ccdCodes and smiles")
        if smiles is not None:
            _expect(smiles, str, f"{where}.smiles", "a string")
            try:
                canonical = canonical_smiles(smiles)
            except SmilesError as error:
                raise _Fail(f"{where}.smiles", str(error)) from None
            return (dataclasses.replace(unresolved_residue(SMILES_RESIDUE, "", 1), smiles=canonical),)
        _expect(codes, list, f"{where}.ccdCodes", "a list of CCD codes")
        if not codes:
            raise _Fail(f"{where}.ccdCodes", "is an empty list")
        return tuple(
            unresolved_residue(self._ccd_code(code, f"{where}.ccdCodes[{number - 1}]"), "", number)
            for number, code in enumerate(codes, start=1)
        )

    # --- MSAs and templates ---

    def _text_or_file(self, body: dict, key: str, where: str) -> tuple[str | None, str]:
        """(text of `key` or of the file `key`Path names, its description); None when neither is set."""
        inline, file_name = body.get(key), body.get(f"{key}Path")
        if inline is not None and file_name is not None:
            raise _Fail(f"{where}.{key}", f"give {key} or {key}Path, not both")
        if file_name is not None:
            _expect(file_name, str, f"{where}.{key}Path", "a path (a string)")
            file_path = Path(file_name) if Path(file_name).is_absolute() else self.path.parent / file_name
            try:
                return decode_text(read_bytes(file_path), str(file_path)), f"{key}Path {file_name}"
            except OSError as error:
                raise _Fail(f"{where}.{key}Path", f"cannot read {file_path}: {error.strerror}") from None
            except ParseError as error:
                raise _Fail(f"{where}.{key}Path", str(error)) from None
        if inline is not None:
            _expect(inline, str, f"{where}.{key}", "A3M text (a string)")
        return inline, key

    def _msa(self, body: dict, kind: str, residues, where: str) -> GivenMsa | None:
        """The chain's MSA from the JSON; None when the JSON leaves it to the search."""
        unpaired, unpaired_origin = self._text_or_file(body, "unpairedMsa", where)
        paired, paired_origin = (
            self._text_or_file(body, "pairedMsa", where) if kind == "protein" else (None, "pairedMsa")
        )
        if unpaired is None and paired is None:
            return None
        if kind == "protein" and (unpaired is None or paired is None):
            missing = "pairedMsa" if paired is None else "unpairedMsa"
            raise _Fail(
                f"{where}.{missing}",
                'must be set too ("" for none): AF3 takes unpairedMsa and pairedMsa both set or both unset',
            )
        query = body["sequence"].upper()
        parts = [
            (text, origin)
            for text, origin in ((paired, paired_origin), (unpaired, unpaired_origin))
            if text and text.strip()
        ]
        msas = [self._a3m(text, origin, query, where) for text, origin in parts]
        if not msas:
            return GivenMsa(None, 'input JSON: MSA set to "" (query only)')
        if len(msas) == 1:
            combined = msas[0]
        else:  # paired rows first, then the unpaired ones without their query
            combined = Msa(
                np.concatenate([msas[0].aligned, msas[1].aligned[1:]]),
                np.concatenate([msas[0].deletion_matrix, msas[1].deletion_matrix[1:]]),
                msas[0].descriptions + msas[1].descriptions[1:],
                "+".join(m.source for m in msas),
            )
        names = " + ".join(origin for _, origin in parts)
        return GivenMsa(combined, f"input JSON {names} ({combined.depth} rows)")

    def _a3m(self, text: str, origin: str, query: str, where: str) -> Msa:
        field_name = origin.split()[0]
        try:
            msa = parse_a3m(text, f"{self.path.name} {field_name}")
        except ParseError as error:
            line = f" (line {error.line})" if error.line is not None else ""
            raise _Fail(f"{where}.{field_name}", f"not A3M{line}: {error.detail}") from None
        if msa.query.replace("-", "") != query:
            raise _Fail(
                f"{where}.{field_name}",
                f"the first sequence must be the query ({len(query)} residues "
                f"{query[:20]}{'...' if len(query) > 20 else ''}), got {msa.query[:20]!r}",
            )
        if msa.length != len(query):
            raise _Fail(
                f"{where}.{field_name}", f"the query row has gaps: {msa.length} columns for {len(query)} residues"
            )
        return msa

    def _templates(self, templates, length: int, where: str) -> tuple[GivenTemplate, ...]:
        _expect(templates, list, where, "a list")
        given = []
        for number, template in enumerate(templates):
            at = f"{where}[{number}]"
            _expect(template, dict, at, "an object")
            _check_keys(template, _TEMPLATE_KEYS, self.version, at)
            mmcif, origin = self._text_or_file(template, "mmcif", at)
            if not mmcif:
                raise _Fail(f"{at}.mmcif", "needs the template's mmCIF (mmcif or mmcifPath)")
            chain, release_date = self._template_chain(mmcif, f"{at}.{origin.split()[0]}")
            indices = []
            for key in ("queryIndices", "templateIndices"):
                values = _expect(template.get(key), list, f"{at}.{key}", "a list of integers")
                for value in values:
                    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                        raise _Fail(f"{at}.{key}", f"must hold 0-based indices, got {value!r}")
                indices.append(np.asarray(values, np.int32))
            if len(indices[0]) != len(indices[1]):
                raise _Fail(
                    f"{at}.templateIndices", f"has {len(indices[1])} entries, queryIndices has {len(indices[0])}"
                )
            bounds = (
                ("queryIndices", indices[0], length, "the sequence"),
                ("templateIndices", indices[1], len(chain.residues), "the template chain"),
            )
            for key, values, size, what in bounds:
                if len(values) and values.max() >= size:
                    raise _Fail(f"{at}.{key}", f"index {int(values.max())} is outside {what} (0-{size - 1})")
            given.append(GivenTemplate(self._template_hit(number, chain, *indices), chain, release_date))
        return tuple(given)

    def _template_chain(self, mmcif: str, where: str) -> tuple[Chain, str | None]:
        try:
            structure = parse_mmcif(mmcif, f"{self.path.name} {where}")
        except ParseError as error:
            raise _Fail(where, f"not a readable mmCIF: {error.detail}") from None
        proteins = [chain for chain in structure.chains if chain.molecule_type == "protein"]
        if len(proteins) != 1:
            raise _Fail(where, f"must hold exactly one protein chain (as AF3 requires), has {len(proteins)}")
        return proteins[0], structure.release_date

    def _template_hit(self, number: int, chain: Chain, query: np.ndarray, template: np.ndarray) -> TemplateHit:
        first, last = (int(query.min()) + 1, int(query.max()) + 1) if len(query) else (0, 0)
        hit_first, hit_last = (int(template.min()) + 1, int(template.max()) + 1) if len(template) else (0, 0)
        return TemplateHit(
            name=f"input_json_{number}_{chain.auth_chain_id}",
            index=number,
            aligned_cols=len(query),
            sum_probs=None,
            e_value=None,
            identity=None,
            query_start=first,
            query_end=last,
            hit_start=hit_first,
            hit_end=hit_last,
            query_indices=query,
            hit_indices=template,
            hit_sequence="",
            hit_length=len(chain.residues),
            description="template given in the input JSON",
            source="input JSON",
        )

    # --- bonds ---

    def _bonds(self, pairs) -> tuple[Bond, ...]:
        if pairs is None:
            return ()
        _expect(pairs, list, "bondedAtomPairs", "a list of atom pairs")
        chains = {chain.chain_id: chain for chain in self.chains}
        bonds = []
        for number, pair in enumerate(pairs):
            where = f"bondedAtomPairs[{number}]"
            if not isinstance(pair, list) or len(pair) != 2:
                raise _Fail(where, "must be a pair [[chain, residue, atom], [chain, residue, atom]]")
            ends = [self._atom(end, chains, f"{where}[{side}]") for side, end in enumerate(pair)]
            if ends[0] == ends[1]:
                raise _Fail(where, "bonds an atom to itself")
            bonds.append(Bond(ends[0], ends[1], "covale"))
        return tuple(bonds)

    def _atom(self, end, chains: dict[str, Chain], where: str) -> AtomRef:
        if (
            not isinstance(end, list)
            or len(end) != 3
            or not isinstance(end[0], str)
            or isinstance(end[1], bool)
            or not isinstance(end[1], int)
            or not isinstance(end[2], str)
        ):
            raise _Fail(where, f"must be [chain id, residue number, atom name], got {json.dumps(end)}")
        chain_id, number, atom = end
        chain = chains.get(chain_id)
        if chain is None:
            raise _Fail(where, f"no chain {chain_id!r} (chains: {', '.join(chains)})")
        if not 1 <= number <= len(chain.residues):
            raise _Fail(where, f"chain {chain_id} has no residue {number} (1-{len(chain.residues)})")
        residue = chain.residues[number - 1]
        if residue.smiles:
            raise _Fail(
                where,
                f"chain {chain_id} is a SMILES ligand, whose atoms have no names to bond (as in AF3); "
                "define it by ccdCodes instead",
            )
        try:
            component = self.ccd.component(residue.name).heavy_atoms()
        except UnknownComponentError:
            raise _Fail(
                where,
                f"residue {number} of chain {chain_id} ({residue.name}) is not in the CCD: its atoms have no names",
            ) from None
        if atom not in component.atom_names:
            raise _Fail(where, f"residue {number} of chain {chain_id} ({residue.name}) has no atom {atom!r}")
        return AtomRef(chain_id, number - 1, atom)
