"""Pure parsers: mmCIF and legacy PDB (gemmi), A3M / A2M / Stockholm MSAs, HHR / m8 template
hits, FASTA, and the alignment-folder index. Every parse error is a `ParseError` naming the file and line.

Names are imported lazily: `featurecache.io.msa` and the other text parsers work where gemmi
is not installed (only `io.mmcif` and `io.alignments` need it).
"""

_EXPORTS = {
    "AlignmentIndex": "featurecache.io.alignments",
    "map_query_to_chain": "featurecache.io.alignments",
    "ParseError": "featurecache.io.common",
    "FastaRecord": "featurecache.io.fasta",
    "parse_fasta": "featurecache.io.fasta",
    "read_fasta": "featurecache.io.fasta",
    "TemplateHit": "featurecache.io.hits",
    "parse_hhr": "featurecache.io.hits",
    "parse_m8": "featurecache.io.hits",
    "read_hits": "featurecache.io.hits",
    "Chain": "featurecache.io.structure",
    "Residue": "featurecache.io.structure",
    "Structure": "featurecache.io.structure",
    "parse_mmcif": "featurecache.io.mmcif",
    "read_mmcif": "featurecache.io.mmcif",
    "structure_from_sequences": "featurecache.io.structure",
    "Msa": "featurecache.io.msa",
    "parse_a3m": "featurecache.io.msa",
    "parse_stockholm": "featurecache.io.msa",
    "read_msa": "featurecache.io.msa",
}

__all__ = list(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'featurecache.io' has no attribute {name!r}")
