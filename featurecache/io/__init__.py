"""Pure parsers: mmCIF (gemmi), A3M / A2M / Stockholm MSAs, HHR / m8 template hits, FASTA, and
the alignment-folder index. Every parse error is a `ParseError` naming the file and line."""

from featurecache.io.alignments import AlignmentIndex, map_query_to_chain
from featurecache.io.common import ParseError
from featurecache.io.fasta import FastaRecord, parse_fasta, read_fasta
from featurecache.io.hits import TemplateHit, parse_hhr, parse_m8, read_hits
from featurecache.io.mmcif import Chain, Residue, Structure, parse_mmcif, read_mmcif, structure_from_sequences
from featurecache.io.msa import Msa, parse_a3m, parse_stockholm, read_msa

__all__ = [
    "AlignmentIndex", "Chain", "FastaRecord", "Msa", "ParseError", "Residue", "Structure", "TemplateHit",
    "map_query_to_chain", "parse_a3m", "parse_fasta", "parse_hhr", "parse_m8", "parse_mmcif", "parse_stockholm",
    "read_fasta", "read_hits", "read_mmcif", "read_msa", "structure_from_sequences",
]
