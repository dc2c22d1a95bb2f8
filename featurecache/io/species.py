"""Species of MSA rows, read from their headers, for pairing rows across chains.

One table-driven parser: `HEADER_FORMATS` lists the header layouts of the search pipelines
people use, each with a real example and the pattern that reads it; the first layout that
matches a header decides what it carries. A row's species is one of two forms:

- a taxid (NCBI taxonomy id of the sequence's organism): UniProtKB ``OX=``, a UniRef cluster
  of one sequence (``n=1 ... TaxID=``), Protenix's ``UniRef100_<accession>_<taxid>``;
- a UniProt organism mnemonic (``HUMAN``, ``9BACT``) from an entry name (``tr|Q9XXX|Q9XXX_MOUSE``,
  ``RepID=P12345_HUMAN``), which AlphaFold-Multimer and AF3 pair on.

Species ids (`SpeciesResolver.key`): ``"tax:<taxid>"`` whenever the taxid is known, else
``"mnemonic:<CODE>"``; "" when the header says nothing (ColabFold and MMseqs2 headers carry only
an accession and scores: ColabFold pairs on its server, by row order; MGnify and metagenomic
ids have no organism). So the same organism gets the same id whichever layout each chain's MSA
uses, as long as a mnemonic can be turned into a taxid by a real mapping:

- UniProt's own pairs: `KNOWN_MNEMONICS` (model organisms, each checked against UniProt
  headers in the sample alignments by the tests), and the pairs the target's headers themselves
  state (a UniProtKB header with both the entry name and ``OX=``; a one-sequence UniRef
  cluster with ``RepID`` and ``TaxID``). A mnemonic seen with two taxids (``9BACT`` and the other
  virtual codes name groups of species) is not mapped.
- Without a mapping the mnemonic stays its own key: ``mnemonic:HUMAN`` in one chain pairs with
  ``mnemonic:HUMAN`` in another, not with a bare ``tax:9606``.

A UniRef cluster of several sequences is not read for its ``TaxID``: that is the members' common
ancestor (``Euarchontoglires``), not the aligned sequence's organism; its representative's entry
name (``RepID``) is.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class SpeciesTag:
    """What a header says about its sequence's organism ("" = not said)."""

    taxid: str = ""
    mnemonic: str = ""


@dataclass(frozen=True)
class HeaderFormat:
    """One header layout: `layout` recognizes it (matched at the start); `fields` are searched in
    the header for what the layout carries. Named groups: taxid, mnemonic, members."""

    name: str
    example: str
    layout: re.Pattern
    fields: tuple[re.Pattern, ...] = ()


# An entry name: accession-like prefix, '_', the organism mnemonic (1-5 upper-case letters or
# digits, at least one letter; virtual codes for groups of species start with 9); small BFD
# appends '_<n>'. The name ends at whitespace (a space before DE text, a tab before ColabFold /
# Protenix scores) or the line's end, after an optional '/start-end' range (Stockholm, A3M from
# jackhmmer) or a bare '/' (Protenix writes '>UniRef100_<accession>_<taxid>/<TAB>scores').
_MNEMONIC = r"(?P<mnemonic>(?=[A-Z0-9]{0,4}[A-Z])[A-Z0-9]{1,5})"
_ENTRY = rf"[A-Za-z0-9]+_{_MNEMONIC}(?:_\d+)?"
_END = r"(?:/(?:\d+-\d+)?)?(?=\s|$)"
# Database names are matched case-insensitively (tools that lower-case ids write 'uniref100_').
_UNIREF = r"(?i:uniref)(?:100|90|50)_"
HEADER_FORMATS: tuple[HeaderFormat, ...] = (
    HeaderFormat(
        "UniProtKB (FASTA, jackhmmer Stockholm names, AF3 JSON MSAs)",
        "tr|A0A2A6NXF8|A0A2A6NXF8_9BRAD Uncharacterized protein OS=Bradyrhizobium sp. C9 OX=142585 GN=x",
        re.compile(rf"^(?i:sp|tr)\|[A-Za-z0-9]{{6,10}}(?:[-_]\d+)?\|{_ENTRY}{_END}"),
        (re.compile(r"\bOX=(?P<taxid>\d+)\b"),),
    ),
    HeaderFormat(
        "Protenix UniRef100 with taxid",
        "UniRef100_A0A0M5M6Q1_2562661/\t123\t0.45",
        re.compile(rf"^{_UNIREF}[A-Za-z0-9]+_(?P<taxid>\d+){_END}"),
    ),
    HeaderFormat(
        "UniRef cluster (FASTA header, jackhmmer / hhblits description)",
        "UniRef90_D7BIZ4/1-73 [subseq from] Uncharacterized protein n=1 Tax=Meiothermus silvanus TaxID=526227 "
        "RepID=D7BIZ4_MEISD",
        re.compile(rf"^{_UNIREF}\S+\s"),
        (
            re.compile(r"\bn=(?P<members>\d+)\b"),
            re.compile(r"\bTaxID=(?P<taxid>\d+)\b"),
            re.compile(rf"\bRepID={_ENTRY}(?=\s|$)"),
        ),
    ),
    HeaderFormat(
        "UniProt entry name alone (Stockholm names, hhblits uniclust)",
        "A0A0Q9XW80_9STAP/12-60",
        re.compile(rf"^(?!{_UNIREF})[A-Za-z0-9]+_{_MNEMONIC}(?:_\d+)?{_END}"),
    ),
    HeaderFormat(
        "any other header with a UniProt-style taxid field (custom pipelines)",
        "seq17 OX=9606",
        re.compile(r"^(?=.*\b(?:OX|TaxID)=\d)"),
        (re.compile(r"\b(?:OX|TaxID)=(?P<taxid>\d+)\b"),),
    ),
)

# UniProt organism mnemonics of model organisms and their NCBI taxids (UniProt's controlled
# vocabulary of species, speclist.txt); each pair is checked against real UniProtKB headers.
KNOWN_MNEMONICS = {
    "HUMAN": "9606",
    "MOUSE": "10090",
    "RAT": "10116",
    "BOVIN": "9913",
    "CHICK": "9031",
    "DANRE": "7955",
    "XENLA": "8355",
    "XENTR": "8364",
    "DROME": "7227",
    "SCHPO": "284812",
    "MACMU": "9544",
    "PANTR": "9598",
    "CANLF": "9615",
    "HORSE": "9796",
    "RABIT": "9986",
    "SHEEP": "9940",
    "FELCA": "9685",
}


def species_tag(description: str) -> SpeciesTag:
    """What one header (without '>') says about its organism, by the first matching layout."""
    for header_format in HEADER_FORMATS:
        match = header_format.layout.match(description)
        if match is None:
            continue
        fields = {name: value for name, value in match.groupdict().items() if value}
        for pattern in header_format.fields:
            found = pattern.search(description)
            if found:
                fields.update({name: value for name, value in found.groupdict().items() if value})
        taxid = fields.get("taxid", "")
        if fields.get("members", "1") != "1":
            taxid = ""  # a cluster's common ancestor, not the representative's organism
        return SpeciesTag(taxid, fields.get("mnemonic", ""))
    return SpeciesTag()


class SpeciesResolver:
    """Species ids of rows, consistent over every MSA whose tags it was built from."""

    def __init__(self, tag_lists: Iterable[Sequence[SpeciesTag]]):
        seen: dict[str, set[str]] = {}
        for tags in tag_lists:
            for tag in tags:
                if tag.taxid and tag.mnemonic:
                    seen.setdefault(tag.mnemonic, set()).add(tag.taxid)
        self.mnemonic_taxids = dict(KNOWN_MNEMONICS)
        for mnemonic, taxids in seen.items():
            known = KNOWN_MNEMONICS.get(mnemonic)
            if known is None and len(taxids) == 1:
                self.mnemonic_taxids[mnemonic] = next(iter(taxids))
            elif known is not None and taxids - {known}:
                del self.mnemonic_taxids[mnemonic]  # the headers disagree with the table: trust neither

    def key(self, tag: SpeciesTag) -> str:
        if tag.taxid:
            return f"tax:{tag.taxid}"
        if tag.mnemonic:
            taxid = self.mnemonic_taxids.get(tag.mnemonic)
            return f"tax:{taxid}" if taxid else f"mnemonic:{tag.mnemonic}"
        return ""

    def keys(self, tags: Sequence[SpeciesTag]) -> list[str]:
        return [self.key(tag) for tag in tags]


def species_from_description(description: str) -> str:
    """The species id of one header on its own (see the module docstring)."""
    tag = species_tag(description)
    return SpeciesResolver([[tag]]).key(tag)
