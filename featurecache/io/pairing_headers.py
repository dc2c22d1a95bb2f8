"""Headers for the MSA rows other predictors pair across chains: UniProt-style names that AlphaFold 3
and Protenix read their species from, with featurecache's own species id kept beside them.

AF3 (data/msa_features.py) pairs rows by the organism mnemonic of a UniProtKB name at the start
of the header: ``tr|<accession>|<name>_<SPECIES>`` or ``sp|...``, SPECIES being 1-5 upper-case
letters or digits. Protenix (data/msa/msa_utils.py) reads the same names and also
``UniRef100_<accession>_<taxid>``. Neither reads a UniRef90 header (``UniRef90_X/3-139 ...
TaxID=40151 RepID=X_MONMO``), the form jackhmmer writes for UniRef90 hits, so such rows pair for
featurecache (io/species.py reads them) but for neither of them.

`pairing_header` writes one row's header as ``tr|<accession>|<accession>_<CODE> OX=<taxid>
<original header>``. CODE stands for featurecache's species id of the row, one code per id, so
AF3 and Protenix group the rows by species as featurecache does (species as the rows' own MSA
resolves them: a mnemonic that only another chain's headers link to a taxid keeps its own code);
``OX=`` (which only featurecache reads) keeps the taxid, and the original header follows.

- A species known by its NCBI taxid ("tax:N") is coded ``<N // 36^4><N mod 36^4 in base 36, 4
  characters>``: five characters starting with a digit 0-8. UniProt's own mnemonics never start
  with 0-8 (real codes start with a letter, virtual codes for groups of species with 9), so such a
  code never names a real organism code. Taxids up to 9 x 36^4 - 1 (15,116,543; NCBI's reach
  ~3.5 million) have one.
- A species known only by its mnemonic ("mnemonic:HUMAN") keeps the mnemonic: those are the
  codes AF3 itself pairs on.

Which rows of a species AF3 and Protenix pair with which is their choice (the first rows of each
chain in their sort of the codes). Where featurecache has already chosen the pairs,
`row_pairing_header` gives every paired row a code of its own instead, so they pair exactly those.
"""

from __future__ import annotations

import re

_BASE36 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"
_LOW_DIGITS = 36**4
MAX_CODED_TAXID = 9 * _LOW_DIGITS - 1
# A UniProt accession as both readers accept it (AF3 allows lower case, Protenix does not).
_ACCESSION = re.compile(r"^[A-Z0-9]{6,10}$")
# A UniProtKB name both read a species code from.
_UNIPROT_NAME = re.compile(r"(?:sp|tr)\|[A-Z0-9]{6,10}\|[A-Z0-9]+_[A-Z0-9]{1,5}")
# The accession inside the headers featurecache reads: UniProtKB, UniRef, a bare entry name.
_HEADER_ACCESSION = re.compile(
    r"^(?:(?:sp|tr)\|(?P<uniprot>[^|]+)\||(?i:uniref)\d+_(?P<uniref>[A-Za-z0-9]+)"
    r"|(?P<entry>[A-Za-z0-9]+)_)"
)


def _base36(number: int) -> str:
    """Four base-36 characters for 0 <= number < 36^4."""
    letters = ""
    for _ in range(4):
        number, digit = divmod(number, 36)
        letters = _BASE36[digit] + letters
    return letters


def species_code(species_id: str) -> str:
    """The 1-5 character code that stands for featurecache's species id `species_id`
    ("tax:<taxid>" or "mnemonic:<CODE>"); "" when there is none (no species, a taxid too large)."""
    kind, _, value = species_id.partition(":")
    if kind == "mnemonic":
        return value
    if kind != "tax" or not value.isdigit() or int(value) > MAX_CODED_TAXID:
        return ""
    high, low = divmod(int(value), _LOW_DIGITS)
    return str(high) + _base36(low)


def row_pairing_header(row: int, description: str = "", species_id: str = "") -> str:
    """The header of row `row` of an MSA already paired across chains (featurecache's own pairing:
    an exported record's assembled rows, or the rows `search` pairs for one target): the row's own
    code in every chain that shows it, so AF3 and Protenix pair that row with itself and nothing
    else. The code is R and the row number in four base-36 characters (a file of such rows holds
    no other codes to collide with); the row's taxid (``OX=``, which only featurecache reads) and
    its original `description` follow."""
    if not 0 <= row < _LOW_DIGITS:
        raise ValueError(f"row {row} has no pairing code (0-{_LOW_DIGITS - 1})")
    accession = f"FC{row:08d}"
    taxid = f" OX={species_id.partition(':')[2]}" if species_id.startswith("tax:") else ""
    return f"tr|{accession}|{accession}_R{_base36(row)}{taxid} {description or f'row{row}'}"


def row_accession(description: str, row: int) -> str:
    """The row's UniProt accession where its header names one in a form AF3 and Protenix accept;
    otherwise one made from the row number (`FC` + 8 digits), which neither reads for anything."""
    match = _HEADER_ACCESSION.match(description)
    if match:
        accession = next(value for value in match.groups() if value)
        if _ACCESSION.match(accession):
            return accession
    return f"FC{row:08d}"


def pairing_header(description: str, species_id: str, row: int) -> str:
    """The header AF3 and Protenix pair `row` by (module docstring); the original description when
    the species has no code (the row then pairs for neither, as before)."""
    code = species_code(species_id)
    if not code:
        return description
    words = description.split(maxsplit=1)
    if (
        words
        and _UNIPROT_NAME.fullmatch(words[0].partition("/")[0])
        and words[0].partition("/")[0].endswith(f"_{code}")
    ):
        return description  # a UniProtKB name that already says the species' code
    accession = row_accession(description, row)
    taxid = f" OX={species_id.partition(':')[2]}" if species_id.startswith("tax:") else ""
    return f"tr|{accession}|{accession}_{code}{taxid} {description}".rstrip()
