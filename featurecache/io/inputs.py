"""Input files of a precompute or an online training run: which files are targets, their ids,
and a sequence-only Structure from a FASTA file.

Structures are mmCIF or legacy PDB format (gemmi reads both: `io.mmcif`, `io.pdb`), plain or
gzipped. An AlphaFold 3 input JSON (`io.af3_json`) is a sequence-only target that may bring its
chains' MSAs and templates; `read_input` reads any input type. A FASTA record becomes one chain;
its letters are checked against its molecule type's alphabet (`io.residues`), and a bad letter
is a ParseError naming the file, the record, the letter and its position.

Shared by the precompute pipeline and `OnlineDataset`, so training never imports precompute.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from pathlib import Path

from featurecache.config import file_sha256
from featurecache.io.af3_json import Af3Input, GivenMsa, GivenTemplate, read_af3_json, referenced_files
from featurecache.io.common import ParseError
from featurecache.io.fasta import read_fasta
from featurecache.io.mmcif import read_mmcif, target_id_from_path
from featurecache.io.residues import POLYMER_TYPES, SequenceError
from featurecache.io.structure import Structure, structure_from_sequences

MMCIF_SUFFIXES = (".cif", ".mmcif", ".cif.gz", ".mmcif.gz")
PDB_SUFFIXES = (".pdb", ".ent", ".pdb.gz", ".ent.gz")
STRUCTURE_SUFFIXES = MMCIF_SUFFIXES + PDB_SUFFIXES
FASTA_SUFFIXES = (".fasta", ".fa", ".faa", ".fna", ".fasta.gz", ".fa.gz")
AF3_JSON_SUFFIXES = (".json",)
INPUT_SUFFIXES = STRUCTURE_SUFFIXES + FASTA_SUFFIXES + AF3_JSON_SUFFIXES


class InputError(ValueError):
    """An input path that does not exist, or two inputs with the same target id."""


def is_input_file(path: Path) -> bool:
    return path.name.lower().endswith(INPUT_SUFFIXES)


def target_id_for(path: str | os.PathLike) -> str:
    """Record key of an input file: the file name without its suffixes, lower case."""
    name = os.path.basename(str(path)).lower()
    for suffix in sorted(FASTA_SUFFIXES + AF3_JSON_SUFFIXES, key=len, reverse=True):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return target_id_from_path(path)


def _fasta_molecule_type(description: str, sequence: str) -> str:
    """'mol:protein' / 'mol:na' (PDB seqres style) or '|dna' / '|rna' hints, else by letters."""
    lowered = description.lower()
    for molecule_type in POLYMER_TYPES:
        if f"mol:{molecule_type}" in lowered or f"|{molecule_type}" in lowered:
            return molecule_type
    letters = set(sequence.upper())
    if letters and letters <= set("ACGTUN"):  # nucleotides only: a header can still say mol:protein
        return "rna" if "U" in letters else "dna"
    return "protein"


def structure_from_fasta(path: str | os.PathLike) -> Structure:
    """A sequence-only target: one chain per FASTA record, every residue unresolved. Ambiguity
    codes are kept as the structure's warnings (one per chain, counted)."""
    records = read_fasta(path)
    chains = [
        (_chain_label(number), _fasta_molecule_type(record.description, record.sequence), record.sequence)
        for number, record in enumerate(records)
    ]
    try:
        structure = structure_from_sequences(target_id_for(path), chains)
    except SequenceError as error:
        record = records[[label for label, _, _ in chains].index(error.chain_id)]
        raise ParseError(str(path), f"record {record.id!r}: {error.detail}", record.line) from None
    return dataclasses.replace(structure, source=str(path))


@dataclasses.dataclass(frozen=True, eq=False)
class ParsedInput:
    structure: Structure
    msas: dict[str, GivenMsa]  # chain id -> the MSA the input gives (AF3 JSON only)
    templates: dict[str, tuple[GivenTemplate, ...]] = dataclasses.field(default_factory=dict)  # likewise


def read_input(path: str | os.PathLike, ccd_path: str | None = None) -> ParsedInput:
    """Parse any input file by its name (mmCIF / PDB, FASTA, AF3 JSON); ParseError or ValueError
    naming the file. `ccd_path`: the CCD an AF3 JSON's codes are checked against (None: bundled)."""
    name = os.path.basename(str(path)).lower()
    if name.endswith(FASTA_SUFFIXES):
        return ParsedInput(structure_from_fasta(path), {})
    if name.endswith(AF3_JSON_SUFFIXES):
        parsed = structure_from_af3_json(path, ccd_path)
        return ParsedInput(parsed.structure, parsed.msas, parsed.templates)
    return ParsedInput(read_mmcif(path), {})


def input_sha256(path: str | os.PathLike) -> str:
    """The input's hash for records (a rerun recomputes a record whose input changed): the
    file's sha256; for an AF3 JSON, over it and the MSA / template files it names, so editing
    one of those makes the record stale too. OSError if the input itself cannot be read."""
    digest = file_sha256(path)
    if not str(path).lower().endswith(AF3_JSON_SUFFIXES):
        return digest
    parts = [digest]
    for named in referenced_files(path):
        try:
            parts.append(file_sha256(named))
        except OSError:
            parts.append(f"unreadable {named}")  # parsing names the field and the problem
    return digest if len(parts) == 1 else hashlib.sha256("|".join(parts).encode()).hexdigest()


def structure_from_af3_json(path: str | os.PathLike, ccd_path: str | None = None) -> Af3Input:
    """An AlphaFold 3 input JSON as a target (io.af3_json), its id from the file name."""
    return read_af3_json(path, target_id_for(path), ccd_path)


def _chain_label(number: int) -> str:
    """0 -> 'A', 25 -> 'Z', 26 -> 'AA': mmCIF-style chain labels."""
    label = ""
    number += 1
    while number:
        number, remainder = divmod(number - 1, 26)
        label = chr(ord("A") + remainder) + label
    return label


def discover_inputs(paths: list[Path]) -> list[Path]:
    """Input files from files and folders (searched recursively), sorted and deduplicated."""
    found: dict[str, Path] = {}
    for path in paths:
        path = Path(path)
        if path.is_dir():
            for candidate in sorted(path.rglob("*")):
                if candidate.is_file() and is_input_file(candidate):
                    found.setdefault(str(candidate.resolve()), candidate)
        elif path.is_file():
            found.setdefault(str(path.resolve()), path)
        else:
            raise InputError(f"input {path} does not exist")
    by_target: dict[str, list[Path]] = {}
    for path in found.values():
        by_target.setdefault(target_id_for(path), []).append(path)
    clashes = {target: paths for target, paths in by_target.items() if len(paths) > 1}
    if clashes:
        listed = "; ".join(
            f"{target!r}: {', '.join(map(str, sorted(paths)))}" for target, paths in sorted(clashes.items())
        )
        raise InputError(f"inputs with the same target id (rename or remove one of each): {listed}")
    return sorted(found.values(), key=lambda p: target_id_for(p))
