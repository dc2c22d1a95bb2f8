"""Featurization: tokenize, MSA assembly, templates, crops. `schema` is the record contract.

The entry points are imported lazily so that `featurecache.schema` (used by the store
and the loader) does not pull in gemmi and the parsers.
"""

_EXPORTS = {
    "featurize_target": "featurecache.features.featurize",
    "featurize_from_files": "featurecache.features.featurize",
    "contiguous_crop": "featurecache.features.crop",
    "spatial_crop": "featurecache.features.crop",
    "crop_arrays": "featurecache.features.crop",
    "msa_sample_rows": "featurecache.features.crop",
    "expand_msa": "featurecache.features.msa",
}

__all__ = list(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'featurecache.features' has no attribute {name!r}")
