"""Featurization: tokenize, MSA assembly, templates, crops. `schema` is the record contract.

The entry points are imported lazily so that `featurecache.schema` (used by the store
and the loader) does not pull in gemmi and the parsers.
"""

__all__ = [
    "featurize_target",
    "featurize_from_files",
    "contiguous_crop",
    "spatial_crop",
    "crop_arrays",
    "msa_sample_rows",
    "expand_msa",
]


def __getattr__(name):
    if name in ("featurize_target", "featurize_from_files"):
        from featurecache.features import featurize as module
    elif name in ("contiguous_crop", "spatial_crop", "crop_arrays", "msa_sample_rows"):
        from featurecache.features import crop as module
    elif name == "expand_msa":
        from featurecache.features import msa as module
    else:
        raise AttributeError(f"module 'featurecache.features' has no attribute {name!r}")
    return getattr(module, name)
