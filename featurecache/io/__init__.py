"""Pure parsers: mmCIF and legacy PDB (gemmi), A3M / A2M / Stockholm MSAs, HHR / m8 template
hits, FASTA, and the alignment-folder index. Every parse error is a `ParseError` naming the file and line.

Names are imported lazily: `featurecache.io.msa` and the other text parsers work where gemmi
is not installed (only `io.mmcif` and `io.alignments` need it).
"""

__all__ = [
    "AlignmentIndex",
    "map_query_to_chain",
    "ParseError",
    "FastaRecord",
    "parse_fasta",
    "read_fasta",
    "TemplateHit",
    "parse_hhr",
    "parse_m8",
    "read_hits",
    "Chain",
    "Residue",
    "Structure",
    "parse_mmcif",
    "read_mmcif",
    "structure_from_sequences",
    "Msa",
    "parse_a3m",
    "parse_stockholm",
    "read_msa",
]


def __getattr__(name):
    if name in ("AlignmentIndex", "map_query_to_chain"):
        from featurecache.io import alignments as module
    elif name == "ParseError":
        from featurecache.io import common as module
    elif name in ("FastaRecord", "parse_fasta", "read_fasta"):
        from featurecache.io import fasta as module
    elif name in ("TemplateHit", "parse_hhr", "parse_m8", "read_hits"):
        from featurecache.io import hits as module
    elif name in ("Chain", "Residue", "Structure", "structure_from_sequences"):
        from featurecache.io import structure as module
    elif name in ("parse_mmcif", "read_mmcif"):
        from featurecache.io import mmcif as module
    elif name in ("Msa", "parse_a3m", "parse_stockholm", "read_msa"):
        from featurecache.io import msa as module
    else:
        raise AttributeError(f"module 'featurecache.io' has no attribute {name!r}")
    return getattr(module, name)
