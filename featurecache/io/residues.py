"""Residue names and one-letter codes: standard residues per molecule type, the standard parent
of a modified residue, and the letters an input sequence may use.

Input sequences (FASTA, or any one-letter sequence given for a chain) are read strictly, as
AlphaFold 3 and the PDB do:

- protein: the 20 standard letters and X (unknown). The other IUPAC codes are read but never
  silently: B (Asx), Z (Glx) and J (Xle) become X; U (selenocysteine) becomes its parent
  class, C, and O (pyrrolysine) X, as AF3's MSA encoding has them. A letter is a residue class
  here, one token, not a chemistry: a selenocysteine with its atoms needs a structure file
  (SEC). Each substitution is counted in a warning for the chain.
- DNA: A C G T and N; RNA: A C G U and N. The IUPAC ambiguity codes (R Y S W K M B D H V)
  become N, counted in a warning likewise.
- Lower case is read as upper case. Anything else (digits, '*', gaps, T in RNA, U in DNA) is
  a `SequenceError` naming the letter and its position.
"""

from __future__ import annotations

from dataclasses import dataclass

import gemmi

PROTEIN_3TO1 = {
    "ALA": "A",
    "ARG": "R",
    "ASN": "N",
    "ASP": "D",
    "CYS": "C",
    "GLN": "Q",
    "GLU": "E",
    "GLY": "G",
    "HIS": "H",
    "ILE": "I",
    "LEU": "L",
    "LYS": "K",
    "MET": "M",
    "PHE": "F",
    "PRO": "P",
    "SER": "S",
    "THR": "T",
    "TRP": "W",
    "TYR": "Y",
    "VAL": "V",
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
UNKNOWN_RESIDUE = {"protein": "UNK", "dna": "DN", "rna": "N"}
UNKNOWN_LETTER = {"protein": "X", "dna": "N", "rna": "N"}
POLYMER_TYPES = ("protein", "dna", "rna")

# Common modified residues and their standard parents, used when a file has no
# _pdbx_struct_mod_residue row for them (assembly files often drop that category).
MODIFIED_PARENTS = {
    "MSE": "MET",
    "SEP": "SER",
    "TPO": "THR",
    "PTR": "TYR",
    "CSO": "CYS",
    "CSD": "CYS",
    "CME": "CYS",
    "CSS": "CYS",
    "OCS": "CYS",
    "CAS": "CYS",
    "KCX": "LYS",
    "MLY": "LYS",
    "M3L": "LYS",
    "ALY": "LYS",
    "LLP": "LYS",
    "HYP": "PRO",
    "PCA": "GLN",
    "MLE": "LEU",
    "MVA": "VAL",
    "DVA": "VAL",
    "SAR": "GLY",
    "NLE": "LEU",
    "FME": "MET",
    "HIC": "HIS",
    "NEP": "HIS",
    "AGM": "ARG",
    "CGU": "GLU",
    "TYS": "TYR",
    "SCY": "CYS",
    "CSX": "CYS",
    "SEC": "CYS",  # AF3 encodes selenocysteine (U) as cysteine
    "PSU": "U",
    "5MU": "U",
    "H2U": "U",
    "OMU": "U",
    "4SU": "U",
    "5MC": "C",
    "OMC": "C",
    "1MG": "G",
    "2MG": "G",
    "7MG": "G",
    "M2G": "G",
    "OMG": "G",
    "YG": "G",
    "1MA": "A",
    "6MA": "A",
    "5IU": "DU",
    "CBR": "DC",
    "5CM": "DC",
    "5BU": "U",
    "BRU": "DU",
}

# --- input sequence letters -------------------------------------------------------------------

_SEQUENCE_LETTERS = {
    "protein": {**PROTEIN_1TO3, "X": "UNK"},
    "dna": {**{letter: name for name, letter in DNA_STANDARD.items()}, "N": "DN"},
    "rna": {**RNA_STANDARD, "N": "N"},
}
_IUPAC_NUCLEOTIDE_AMBIGUITY = "RYSWKMBDHV"
# Accepted ambiguity letters: the residue each becomes, and how a warning says so.
_AMBIGUOUS_LETTERS = {
    "protein": {
        "B": ("UNK", "X (Asx: D or N)"),
        "Z": ("UNK", "X (Glx: E or Q)"),
        "J": ("UNK", "X (Xle: I or L)"),
        "U": ("CYS", "C (selenocysteine, class of its parent)"),
        "O": ("UNK", "X (pyrrolysine)"),
    },
    "dna": {letter: ("DN", "N (IUPAC ambiguity code)") for letter in _IUPAC_NUCLEOTIDE_AMBIGUITY},
    "rna": {letter: ("N", "N (IUPAC ambiguity code)") for letter in _IUPAC_NUCLEOTIDE_AMBIGUITY},
}


_ALPHABET_NAMES = {
    "protein": "protein letters: the 20 amino acids, X and the codes B Z J U O",
    "dna": "DNA letters: A C G T, N and the IUPAC codes R Y S W K M B D H V",
    "rna": "RNA letters: A C G U, N and the IUPAC codes R Y S W K M B D H V",
}


class SequenceError(ValueError):
    """A letter that no residue of the molecule type has (position is 1-based)."""

    def __init__(self, letter: str, position: int, molecule_type: str, chain_id: str = ""):
        self.letter = letter
        self.position = position
        self.molecule_type = molecule_type
        self.chain_id = chain_id
        self.detail = (
            f"invalid character {letter!r} at position {position} (not one of the {_ALPHABET_NAMES[molecule_type]})"
        )
        super().__init__(f"chain {chain_id}: {self.detail}" if chain_id else self.detail)


@dataclass(frozen=True)
class SequenceReading:
    residues: tuple[str, ...]  # CCD code per position
    substitutions: dict[str, int]  # ambiguity letter -> count, for the warning

    def warning(self, molecule_type: str) -> str | None:
        """'2 B read as X (Asx: D or N), 1 U read as C (selenocysteine, ...)', or None."""
        if not self.substitutions:
            return None
        meaning = _AMBIGUOUS_LETTERS[molecule_type]
        return ", ".join(
            f"{count} {letter} read as {meaning[letter][1]}" for letter, count in self.substitutions.items()
        )


def read_sequence(sequence: str, molecule_type: str) -> SequenceReading:
    """Residue names of a one-letter sequence (see the module docstring); SequenceError if invalid."""
    if molecule_type not in _SEQUENCE_LETTERS:
        raise ValueError(f"molecule type {molecule_type!r} is not protein, dna or rna")
    letters, ambiguous = _SEQUENCE_LETTERS[molecule_type], _AMBIGUOUS_LETTERS[molecule_type]
    residues: list[str] = []
    substitutions: dict[str, int] = {}
    for position, letter in enumerate(sequence.upper(), start=1):
        name = letters.get(letter)
        if name is None:
            if letter not in ambiguous:
                raise SequenceError(sequence[position - 1], position, molecule_type)
            name = ambiguous[letter][0]
            substitutions[letter] = substitutions.get(letter, 0) + 1
        residues.append(name)
    return SequenceReading(tuple(residues), substitutions)


# --- residue names ----------------------------------------------------------------------------


def residue_letter(parent: str, molecule_type: str, unknown: str) -> str:
    if molecule_type == "protein":
        return PROTEIN_3TO1.get(parent, unknown)
    if molecule_type == "dna":
        return DNA_STANDARD.get(parent, unknown)
    return RNA_STANDARD.get(parent, unknown)


def is_standard_name(comp: str) -> bool:
    return comp in PROTEIN_3TO1 or comp in DNA_STANDARD or comp in RNA_STANDARD


def parent_of(comp: str) -> str:
    """Standard parent of a residue: itself if standard, the table, gemmi's one-letter code, then
    the CCD's parent (GTP -> G); "" when none is known."""
    if is_standard_name(comp):
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
    if comp in ("UNK", "DN", "N", ""):
        return ""
    from featurecache.chem import load_ccd  # here: the CCD loads in seconds, only when needed

    ccd = load_ccd()
    if comp not in ccd:
        return ""
    parent = (ccd.component(comp).parent_code or "").split(",")[0].strip()
    return parent if is_standard_name(parent) else ""


def residue_kind(comp: str, chem_types: dict[str, str]) -> str | None:
    """'protein' / 'dna' / 'rna' by a residue's chemistry (the file's _chem_comp.type first)."""
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


def is_non_polymer(comp: str, chem_types: dict[str, str]) -> bool:
    """A component that does not link into a polymer (by the file's _chem_comp.type, else gemmi)."""
    kind = chem_types.get(comp)
    if kind is not None:
        return kind == "non-polymer"
    info = gemmi.find_tabulated_residue(comp)
    return info is None or not (info.is_amino_acid() or info.is_nucleic_acid())
